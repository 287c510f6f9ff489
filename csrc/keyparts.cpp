// torch_cachepolicy._C.plain_args: whether _key_extension.extend_key has nothing
// to add to torch's key for these arguments.
//
// Note [The common case of the key extension]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// _key_extension.extend_key's full pass adds to torch's key what a backend fake kernel can
// see and torch's key cannot: the sign of a zero float, NaN (a bypass), the
// storage-sharing and identity pattern of tensor arguments, view bases,
// non-leaf tensors and .grad. On almost every hit there is nothing to add,
// yet finding that out in Python costs a few microseconds per call for an op
// with several tensor arguments (untyped_storage() builds a Python object per
// tensor). plain_args answers the question in one walk over *all* arguments
// (a superset of the schema slots the full pass reads): true only if no
// float or complex is a zero with its sign bit set or NaN, and every tensor
// is a leaf without .grad, is not a view, and has a storage no other tensor
// argument has. When it says true the full pass would add nothing; when it
// says false the caller runs the full pass, which decides. Containers are
// list, tuple and dict (values and keys), as in the full pass.

#include "module.h"

#include <torch/csrc/autograd/python_variable.h>

#include <pybind11/pybind11.h>

#include <cmath>
#include <vector>

namespace torch_cachepolicy {
namespace {

namespace py = pybind11;

bool special_float(double v) {
  return std::isnan(v) || (v == 0.0 && std::signbit(v));
}

// Depth guard: a pathological nesting goes to the full pass.
constexpr int kMaxDepth = 32;

bool plain(PyObject* obj, std::vector<const void*>& storages, int depth) {
  if (depth > kMaxDepth) {
    return false;
  }
  if (THPVariable_Check(obj)) {
    const at::Tensor& t = THPVariable_Unpack(obj);
    if (t.is_view() || !t.is_leaf() || t.grad().defined() || !t.has_storage()) {
      return false;
    }
    const void* storage = t.storage().unsafeGetStorageImpl();
    for (const void* seen : storages) {
      if (seen == storage) {
        return false;
      }
    }
    storages.push_back(storage);
    return true;
  }
  if (PyFloat_Check(obj)) {
    return !special_float(PyFloat_AS_DOUBLE(obj));
  }
  if (PyComplex_Check(obj)) {
    return !special_float(PyComplex_RealAsDouble(obj)) && !special_float(PyComplex_ImagAsDouble(obj));
  }
  if (PyList_Check(obj) || PyTuple_Check(obj)) {
    // A borrowed sequence view; the list is not mutated during the walk (no
    // Python code runs in it).
    py::object seq = py::reinterpret_steal<py::object>(PySequence_Fast(obj, ""));
    if (!seq) {
      PyErr_Clear();
      return false;
    }
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq.ptr());
    PyObject** items = PySequence_Fast_ITEMS(seq.ptr());
    for (Py_ssize_t i = 0; i < n; ++i) {
      if (!plain(items[i], storages, depth + 1)) {
        return false;
      }
    }
    return true;
  }
  if (PyDict_Check(obj)) {
    PyObject* key = nullptr;
    PyObject* value = nullptr;
    Py_ssize_t pos = 0;
    while (PyDict_Next(obj, &pos, &key, &value)) {
      if (!plain(key, storages, depth + 1) || !plain(value, storages, depth + 1)) {
        return false;
      }
    }
    return true;
  }
  // Any other value (int, bool, str, None, dtype, device, a SymInt, ...)
  // holds no float and no tensor the full pass would look at.
  return true;
}

bool plain_args(const py::handle& args, const py::handle& kwargs) {
  std::vector<const void*> storages;
  return plain(args.ptr(), storages, 0) && plain(kwargs.ptr(), storages, 0);
}

} // namespace

void init_keyparts(py::module& m) {
  m.def(
      "plain_args",
      &plain_args,
      py::arg("args"),
      py::arg("kwargs"),
      "True if torch_cachepolicy._key_extension has nothing to add to torch's key\n"
      "for these arguments; see Note [The common case of the key extension].");
}

} // namespace torch_cachepolicy
