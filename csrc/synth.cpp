// torch_cachepolicy._C's meta tensors of cache hits (torch_cachepolicy._synth).
//
// Note [Building a hit's meta tensor without dispatch]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// torch builds a hit's output as torch.empty_strided(shape, stride, ...,
// device="meta") inside in_kernel_invocation_manager, then FakeTensor(mode,
// meta, device); the context manager and the dispatch cost more than the
// tensor. For a static, strided, non-conj/neg output, meta_empty_strided calls
// what the Meta kernel of empty_strided calls (at::detail::empty_strided_meta):
// the same sizes, strides, dtype, a fresh storage of the same size, the same
// dispatch keys. For a view op's output torch then calls set_(input storage,
// offset, shape, stride); meta_view_of builds that directly on the input's
// StorageImpl. No dispatch happens, so no mode is consulted. Every entry is
// checked against these functions' output on the miss that creates it
// (_verify.verify_entry), and test_synth.py compares them with torch's synthesis.

#include "module.h"

#include <ATen/EmptyTensor.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include <pybind11/pybind11.h>

#include <string>
#include <vector>

namespace torch_cachepolicy {
namespace {

namespace py = pybind11;

std::vector<int64_t> as_ints(const py::handle& seq, const std::string& api, const char* what) {
  const std::string message = api + ": " + what + " must be a tuple of ints";
  if (!PyTuple_Check(seq.ptr())) {
    throw py::type_error(message);
  }
  const Py_ssize_t n = PyTuple_GET_SIZE(seq.ptr());
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* item = PyTuple_GET_ITEM(seq.ptr(), i);
    // Exact ints only: a SymInt, a bool or an int subclass is the caller's
    // mistake (its plan should have sent the entry to torch's path).
    if (!PyLong_CheckExact(item)) {
      throw py::type_error(message);
    }
    const long long v = PyLong_AsLongLong(item);
    if (v == -1 && PyErr_Occurred()) {
      throw py::error_already_set();
    }
    out.push_back(static_cast<int64_t>(v));
  }
  return out;
}

// The arguments both functions share, checked alike.
struct Layout {
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  c10::ScalarType dtype;
};

Layout as_layout(
    const std::string& api,
    const py::handle& shape,
    const py::handle& stride,
    const py::handle& dtype) {
  if (!THPDtype_Check(dtype.ptr())) {
    throw py::type_error(api + ": dtype must be a torch.dtype");
  }
  Layout out{
      as_ints(shape, api, "shape"),
      as_ints(stride, api, "stride"),
      reinterpret_cast<THPDtype*>(dtype.ptr())->scalar_type};
  if (out.sizes.size() != out.strides.size()) {
    throw py::value_error(api + ": shape and stride differ in length");
  }
  return out;
}

py::object meta_empty_strided(
    const py::handle& shape,
    const py::handle& stride,
    const py::handle& dtype,
    bool requires_grad) {
  const Layout layout = as_layout("meta_empty_strided(...)", shape, stride, dtype);
  at::Tensor t(at::detail::empty_strided_meta(layout.sizes, layout.strides, layout.dtype));
  if (requires_grad) {
    t.set_requires_grad(true);
  }
  return py::reinterpret_steal<py::object>(THPVariable_Wrap(std::move(t)));
}

py::object meta_view_of(
    const py::handle& base,
    const py::handle& shape,
    const py::handle& stride,
    int64_t storage_offset,
    const py::handle& dtype) {
  const std::string api = "meta_view_of(...)";
  if (!THPVariable_Check(base.ptr())) {
    throw py::type_error(api + ": base must be a Tensor");
  }
  const at::Tensor& source = THPVariable_Unpack(base.ptr());
  // The storage's device, not the tensor's: a FakeTensor reports its fake
  // device (through Python) while its storage is meta.
  if (!source.has_storage() || source.storage().device_type() != c10::DeviceType::Meta) {
    throw py::value_error(api + ": base must have a meta storage (a FakeTensor)");
  }
  const Layout layout = as_layout(api, shape, stride, dtype);
  // What empty_strided_meta + set_(storage, offset, shape, stride) leave:
  // a plain meta tensor on the base's storage (the same StorageImpl).
  at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(
      c10::Storage(source.storage()),
      c10::DispatchKeySet(c10::DispatchKey::Meta),
      c10::scalarTypeToTypeMeta(layout.dtype));
  t.unsafeGetTensorImpl()->set_sizes_and_strides(layout.sizes, layout.strides, storage_offset);
  return py::reinterpret_steal<py::object>(THPVariable_Wrap(std::move(t)));
}

// Note [Symbolic hits from a template]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A hit of a symbolic entry costs torch a symbolic empty_strided: the storage
// size (and later the contiguity flags) in SymInt arithmetic, each operation a
// sympy expression built in Python. For equal keys the output's expressions
// are equal, so the storage size of torch's first synthesis of the entry
// (meta_template) serves the rest: meta_fresh_like puts this call's SymInts,
// taken from this call's key as torch takes them (_SymIntOutputStub.extract),
// on a fresh storage of the template's size, so the output holds this call's
// SymNodes (a tracer maps proxies by SymNode). A symbolic view stays torch's (its
// set_ compares SymInts, which a tracer records). Derived fields (numel,
// contiguity) stay uncomputed, as on torch's output: computing one may guard.
// The template's storage size belongs to its ShapeEnv: _synth.py uses it only
// for calls whose SymInts belong to that ShapeEnv.

at::Tensor checked_meta(const py::handle& obj, const std::string& api) {
  if (!THPVariable_Check(obj.ptr())) {
    throw py::type_error(api + ": expected a Tensor");
  }
  const at::Tensor& t = THPVariable_Unpack(obj.ptr());
  if (!t.has_storage() || t.storage().device_type() != c10::DeviceType::Meta || t.layout() != c10::kStrided) {
    throw py::value_error(api + ": expected a strided tensor with a meta storage (a FakeTensor)");
  }
  return t;
}

c10::Storage fresh_meta_storage(const c10::SymInt& nbytes) {
  return c10::Storage(
      c10::Storage::use_byte_size_t(), nbytes, c10::GetAllocator(c10::kMeta), /*resizable=*/true);
}

void check_rank(c10::SymIntArrayRef sizes, c10::SymIntArrayRef strides, const std::string& api) {
  if (sizes.size() != strides.size()) {
    throw py::value_error(api + ": sizes and strides differ in length");
  }
}

// A meta tensor on `storage` with these sizes, strides and offset. The
// derived fields (numel, contiguity) of symbolic sizes stay uncomputed, as on
// the tensor torch's synthesis makes: computing one may guard (a size
// compared with 1), and the guard belongs to whoever asks first, as under
// stock.
py::object meta_on(
    c10::Storage storage,
    caffe2::TypeMeta dtype,
    c10::SymIntArrayRef sizes,
    c10::SymIntArrayRef strides,
    const c10::SymInt& storage_offset) {
  at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(
      std::move(storage), c10::DispatchKeySet(c10::DispatchKey::Meta), dtype);
  t.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides, storage_offset);
  return py::reinterpret_steal<py::object>(THPVariable_Wrap(std::move(t)));
}

py::object meta_template(const py::handle& source) {
  const at::Tensor src = checked_meta(source, "meta_template(...)");
  const c10::TensorImpl* impl = src.unsafeGetTensorImpl();
  return meta_on(
      fresh_meta_storage(impl->storage().sym_nbytes()),
      src.dtype(),
      impl->sym_sizes(),
      impl->sym_strides(),
      impl->sym_storage_offset());
}

py::object meta_fresh_like(
    const py::handle& templ,
    c10::SymIntArrayRef sizes,
    c10::SymIntArrayRef strides,
    const c10::SymInt& storage_offset,
    bool requires_grad) {
  const at::Tensor src = checked_meta(templ, "meta_fresh_like(...)");
  check_rank(sizes, strides, "meta_fresh_like(...)");
  // The sizes, strides and offset are this call's (the SymInts torch's
  // synthesis would take from this call's key); only the storage size comes
  // from the template, computed once for these expressions.
  py::object out = meta_on(
      fresh_meta_storage(src.unsafeGetTensorImpl()->storage().sym_nbytes()),
      src.dtype(),
      sizes,
      strides,
      storage_offset);
  if (requires_grad) {
    THPVariable_Unpack(out.ptr()).set_requires_grad(true);
  }
  return out;
}

} // namespace

void init_synth(py::module& m) {
  m.def(
      "meta_empty_strided",
      &meta_empty_strided,
      py::arg("shape"),
      py::arg("stride"),
      py::arg("dtype"),
      py::arg("requires_grad"),
      "torch.empty_strided(shape, stride, dtype=dtype, device='meta',\n"
      "requires_grad=requires_grad) without dispatch; shape and stride are\n"
      "tuples of ints. See Note [Building a hit's meta tensor without dispatch].");
  m.def(
      "meta_view_of",
      &meta_view_of,
      py::arg("base"),
      py::arg("shape"),
      py::arg("stride"),
      py::arg("storage_offset"),
      py::arg("dtype"),
      "A meta tensor of dtype on base's storage with this shape, stride and\n"
      "offset, as torch's synthesis of a view op's hit leaves it before\n"
      "FakeTensor wraps it (empty_strided then set_), without dispatch.");
  m.def(
      "meta_template",
      &meta_template,
      py::arg("source"),
      "A plain meta tensor with source's (symbolic) sizes, strides, offset and\n"
      "storage size, its derived fields left uncomputed. See Note [Symbolic\n"
      "hits from a template].");
  m.def(
      "meta_fresh_like",
      &meta_fresh_like,
      py::arg("template"),
      py::arg("sizes"),
      py::arg("strides"),
      py::arg("storage_offset"),
      py::arg("requires_grad"),
      "A new meta tensor with these (symbolic) sizes, strides and offset and\n"
      "template's dtype, on a fresh meta storage of template's storage size,\n"
      "without dispatch. See Note [Symbolic hits from a template].");
}

} // namespace torch_cachepolicy
