// torch_cachepolicy._C.KeyBuilder: torch's FakeTensor dispatch cache key,
// built without a Python call per tensor property (torch_cachepolicy._key).
//
// Note [What the key builder reproduces]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// FakeTensorMode._cache_key flattens the arguments with _prep_args_for_hash:
// a container becomes (type, "length_<n>", items...), a dict its keys then its
// values, a FakeTensor the fields of extract_tensor_metadata() in declaration
// order, any other value (type(value), value); each read is a Python call, and
// each int of a shape goes through about ten isinstance tests. build() makes
// the very same tuple (the same objects where torch puts an object: dtype,
// device, layout, memory format, types, the argument values; equal ints and
// strings elsewhere) from the TensorImpl, for the common case only: exact
// FakeTensors of this mode, strided, not quantized, no constant, no
// dispatch_keys of their own (torch 2.15 describes a fake mkldnn tensor by
// them, and bypasses it); list, tuple and dict containers (or list/tuple
// subclasses iterating like their base); scalars of the exact types in
// `plain_types` (for those in `torch_keyed_types`, whose keys torch
// transforms, the value `torch_key_of(value)` gives: torch 2.15 keys an
// index-less device by its resolved index, and torch's own code says which).
// Anything else returns a short string, the reason, and the caller falls
// back to torch's _cache_key. The
// caller supplies the key's prefix (op, default dtype, ...). The memory format
// is torch._prims_common.suggest_memory_format's (not c10's, which differs for
// some degenerate strides), kept only if the tensor is contiguous in it.
// test_opinfo_crosscheck.py and test_keybuilder.py hold the two equal.
//
// Note [Symbolic keys]
// ~~~~~~~~~~~~~~~~~~~~
// Given the call's _CacheKeyState, build() also handles SymInt arguments and
// a FakeTensor's symbolic sizes, strides, offset and storage size, as
// _CacheKeyState.convert_sym_int does: _PySymInputStub(symint) the first time
// a SymNode is seen, _InputBackref(index of that stub) afterwards. torch
// mutates the state as it goes; build() collects the same facts and writes
// them only once the whole key is built, so a fall back leaves the state fresh
// for torch. extract_tensor_metadata drops a symbolic tensor's memory format,
// and torch 2.13 computes it first (for 4 and 5 dimensions
// suggest_memory_format may guard), so build() calls that function there and
// discards the result (2.14 computes nothing: the caller passes None;
// _compat.SYMBOLIC_MEMORY_FORMAT_GUARDS reads which). Without a state symbolic
// values fall back.

#include "module.h"

#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include <pybind11/pybind11.h>

#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace torch_cachepolicy {
namespace {

namespace py = pybind11;

// Owned references, released unless handed over to a tuple.
class Values {
 public:
  Values() {
    items_.reserve(64);
  }
  ~Values() {
    for (PyObject* o : items_) {
      Py_DECREF(o);
    }
  }
  Values(const Values&) = delete;
  Values& operator=(const Values&) = delete;

  // Takes a new reference; false if it is null (a Python error is set).
  bool steal(PyObject* o) {
    if (o == nullptr) {
      return false;
    }
    items_.push_back(o);
    return true;
  }
  void borrow(PyObject* o) {
    Py_INCREF(o);
    items_.push_back(o);
  }
  Py_ssize_t size() const {
    return static_cast<Py_ssize_t>(items_.size());
  }
  PyObject* to_tuple() {
    PyObject* out = PyTuple_New(static_cast<Py_ssize_t>(items_.size()));
    if (out == nullptr) {
      return nullptr;
    }
    for (size_t i = 0; i < items_.size(); ++i) {
      PyTuple_SET_ITEM(out, static_cast<Py_ssize_t>(i), items_[i]);
    }
    items_.clear();
    return out;
  }

 private:
  std::vector<PyObject*> items_;
};

// A reason to fall back; nullptr means "handled". A static string, turned
// into a Python str only when returned.
using Reason = const char*;

// The SymNodes of one key, by first position (Note [Symbolic keys]): what
// convert_sym_int writes into the state, kept until the key is built.
class SymNodes {
 public:
  ~SymNodes() {
    for (auto& node : order_) {
      Py_DECREF(node.first);
    }
    for (PyObject* symbols : symbols_) {
      Py_XDECREF(symbols);
    }
  }
  // The first position of this node, or -1 (then it is recorded at `at`,
  // with a new reference).
  Py_ssize_t seen_or_add(PyObject* node, Py_ssize_t at) {
    auto it = index_.find(node);
    if (it != index_.end()) {
      return it->second;
    }
    Py_INCREF(node);
    index_.emplace(node, at);
    order_.emplace_back(node, at);
    return -1;
  }
  const std::vector<std::pair<PyObject*, Py_ssize_t>>& order() const {
    return order_;
  }
  // The free symbols of the last node added, read when it was reached (a
  // stolen reference): convert_sym_int reads them then, and a later tensor's
  // memory-format guard may replace a symbol of an earlier node.
  void set_symbols(PyObject* symbols) {
    symbols_.push_back(symbols);
  }
  const std::vector<PyObject*>& symbols() const {
    return symbols_;
  }

 private:
  std::unordered_map<PyObject*, Py_ssize_t> index_;
  std::vector<std::pair<PyObject*, Py_ssize_t>> order_;
  std::vector<PyObject*> symbols_;
};

// One of the objects the caller names (a dict: named fields, not positions).
py::object ref(const py::dict& refs, const char* name) {
  TORCH_CHECK(refs.contains(name), "torch_cachepolicy._C.KeyBuilder: refs has no '", name, "'");
  return refs[name];
}

class KeyBuilder {
 public:
  explicit KeyBuilder(const py::dict& refs)
      : fake_type_(ref(refs, "fake_type")),
        size_type_(ref(refs, "size_type")),
        plain_types_(ref(refs, "plain_types")),
        torch_keyed_types_(ref(refs, "torch_keyed_types")),
        torch_key_of_(ref(refs, "torch_key_of")),
        sym_types_(ref(refs, "sym_types")),
        strided_(ref(refs, "strided")),
        contiguous_format_(ref(refs, "contiguous_format")),
        channels_last_(ref(refs, "channels_last")),
        channels_last_3d_(ref(refs, "channels_last_3d")),
        symint_type_(ref(refs, "symint_type")),
        stub_type_(ref(refs, "stub_type")),
        backref_type_(ref(refs, "backref_type")),
        suggest_memory_format_(ref(refs, "suggest_memory_format")),
        // What it reads by name: each is listed in _compat._INTERNALS under
        // Feature.NATIVE, so that a rename switches _C off at import.
        fake_mode_name_(py::str("fake_mode")),
        constant_name_(py::str("constant")),
        dispatch_keys_name_(py::str("dispatch_keys")),
        fake_device_name_(py::str("_fake_device")),
        in_kernel_name_(py::str("in_kernel_invocation")),
        node_name_(py::str("node")),
        expr_name_(py::str("expr")),
        free_symbols_name_(py::str("free_symbols")),
        shape_env_name_(py::str("shape_env")),
        lookup_name_(py::str("sym_node_lookup")),
        known_symbols_name_(py::str("known_symbols")) {
    TORCH_CHECK(
        PyType_Check(fake_type_.ptr()) && PyType_Check(size_type_.ptr()),
        "torch_cachepolicy._C.KeyBuilder: fake_type and size_type must be types");
    TORCH_CHECK(
        PyFrozenSet_Check(plain_types_.ptr()) && PyFrozenSet_Check(torch_keyed_types_.ptr()),
        "torch_cachepolicy._C.KeyBuilder: plain_types and torch_keyed_types must be frozensets of types");
    TORCH_CHECK(
        PyTuple_Check(sym_types_.ptr()),
        "torch_cachepolicy._C.KeyBuilder: sym_types must be a tuple of types");
    TORCH_CHECK(
        PyType_Check(symint_type_.ptr()) && PyType_Check(stub_type_.ptr()) && PyType_Check(backref_type_.ptr()),
        "torch_cachepolicy._C.KeyBuilder: symint_type, stub_type and backref_type must be types");
    TORCH_CHECK(
        suggest_memory_format_.is_none() || PyCallable_Check(suggest_memory_format_.ptr()),
        "torch_cachepolicy._C.KeyBuilder: suggest_memory_format must be callable or None");
    for (int n = 0; n < kCachedLengths; ++n) {
      lengths_.push_back(py::str("length_" + std::to_string(n)));
    }
  }

  // The key tuple (prefix + flattened args, kwargs), or the reason (a str)
  // to fall back to torch's _cache_key. With a state, symbolic values are
  // handled and the state updated as convert_sym_int would.
  py::object build(
      py::handle mode,
      py::tuple prefix,
      py::handle args,
      py::handle kwargs,
      py::handle state) {
    SymNodes nodes;
    SymNodes* syms = state.is_none() ? nullptr : &nodes;
    Values out;
    for (py::handle v : prefix) {
      out.borrow(v.ptr());
    }
    // FakeTensor.device is meta while the mode runs a kernel: rare on the
    // cache path, left to torch.
    const int in_kernel = truthy_attr(mode.ptr(), in_kernel_name_.ptr());
    if (in_kernel < 0) {
      throw py::error_already_set();
    }
    if (in_kernel != 0) {
      return py::str("in kernel invocation");
    }
    Reason reason = nullptr;
    // _cache_key: `if args:` / `if kwargs:`, so empty ones add nothing.
    if (PyObject_IsTrue(args.ptr()) == 1) {
      reason = container(mode.ptr(), args.ptr(), out, syms);
    }
    if (reason == nullptr && !kwargs.is_none() &&
        PyObject_IsTrue(kwargs.ptr()) == 1) {
      reason = container(mode.ptr(), kwargs.ptr(), out, syms);
    }
    if (PyErr_Occurred()) {
      throw py::error_already_set();
    }
    if (reason != nullptr) {
      return py::str(reason);
    }
    PyObject* tup = out.to_tuple();
    if (tup == nullptr) {
      throw py::error_already_set();
    }
    py::object key = py::reinterpret_steal<py::object>(tup);
    if (syms != nullptr && !syms->order().empty()) {
      commit(state, *syms);
    }
    return key;
  }

 private:
  static constexpr int kCachedLengths = 64;

  static int truthy_attr(PyObject* obj, PyObject* name) {
    PyObject* v = PyObject_GetAttr(obj, name);
    if (v == nullptr) {
      return -1;
    }
    const int r = PyObject_IsTrue(v);
    Py_DECREF(v);
    return r;
  }

  bool push_length(Py_ssize_t n, Values& out) {
    if (n < kCachedLengths) {
      out.borrow(lengths_[static_cast<size_t>(n)].ptr());
      return true;
    }
    return out.steal(PyUnicode_FromFormat("length_%zd", n));
  }

  bool push_int(int64_t v, Values& out) {
    out.borrow(reinterpret_cast<PyObject*>(&PyLong_Type));
    return out.steal(PyLong_FromLongLong(v));
  }

  // What convert_sym_int writes into the state for each new SymNode, in key
  // order: its index by id(node), its expression's free symbols, and the
  // first node's ShapeEnv if the state has none.
  void commit(py::handle state, const SymNodes& syms) {
    py::object lookup = state.attr(lookup_name_);
    py::object known = state.attr(known_symbols_name_);
    const auto& symbols = syms.symbols();
    size_t i = 0;
    for (const auto& [node, index] : syms.order()) {
      lookup[py::reinterpret_steal<py::object>(PyLong_FromVoidPtr(node))] = py::int_(index);
      known.attr("update")(py::handle(symbols[i++]));
    }
    if (state.attr(shape_env_name_).is_none()) {
      state.attr(shape_env_name_) = py::handle(syms.order().front().first).attr(shape_env_name_);
    }
  }

  // A SymInt (exact type): a stub, or a back reference to the stub of the
  // same SymNode earlier in the key.
  Reason sym_int(PyObject* value, Values& out, SymNodes& syms) {
    PyObject* node = PyObject_GetAttr(value, node_name_.ptr());
    if (node == nullptr) {
      return "error";
    }
    const Py_ssize_t first = syms.seen_or_add(node, out.size());
    if (first < 0) {
      PyObject* expr = PyObject_GetAttr(node, expr_name_.ptr());
      PyObject* symbols = expr == nullptr ? nullptr : PyObject_GetAttr(expr, free_symbols_name_.ptr());
      Py_XDECREF(expr);
      syms.set_symbols(symbols);
      if (symbols == nullptr) {
        Py_DECREF(node);
        return "error";
      }
    }
    Py_DECREF(node); // syms holds its own reference
    PyObject* item = nullptr;
    if (first >= 0) {
      PyObject* index = PyLong_FromSsize_t(first);
      if (index == nullptr) {
        return "error";
      }
      item = PyObject_CallOneArg(backref_type_.ptr(), index);
      Py_DECREF(index);
    } else {
      item = PyObject_CallOneArg(stub_type_.ptr(), value);
    }
    return out.steal(item) ? nullptr : "error";
  }

  // One c10::SymInt of a tensor: as Python sees it (an int, or a SymInt
  // through torch's caster), then as _prep_args_for_hash (typed: sizes and
  // strides) or _flatten_into (bare: offset and storage size) adds it.
  Reason sym_value(const c10::SymInt& v, bool typed, Values& out, SymNodes* syms) {
    if (!v.is_heap_allocated()) {
      const int64_t i = v.as_int_unchecked();
      if (typed) {
        return push_int(i, out) ? nullptr : "error";
      }
      return out.steal(PyLong_FromLongLong(i)) ? nullptr : "error";
    }
    if (syms == nullptr) {
      return "symbolic sizes";
    }
    py::object value = py::cast(v);
    if (PyLong_CheckExact(value.ptr())) {
      if (typed) {
        out.borrow(reinterpret_cast<PyObject*>(&PyLong_Type));
      }
      out.borrow(value.ptr());
      return nullptr;
    }
    if (Py_TYPE(value.ptr()) != reinterpret_cast<PyTypeObject*>(symint_type_.ptr())) {
      return "symbolic size of another type";
    }
    return sym_int(value.ptr(), out, *syms);
  }

  // A list, tuple or dict (isinstance): (type, "length_n", items...).
  // Returns a reason for containers whose iteration could differ from
  // the base type's.
  Reason container(PyObject* mode, PyObject* c, Values& out, SymNodes* syms) {
    PyTypeObject* tp = Py_TYPE(c);
    if (PyDict_Check(c)) {
      if (!PyDict_CheckExact(c)) {
        return "dict subclass argument";
      }
      out.borrow(reinterpret_cast<PyObject*>(tp));
      if (!push_length(PyDict_GET_SIZE(c), out)) {
        return "error";
      }
      // keys(), then values(): dict_keys is not a container to
      // _prep_args_for_hash, so no (type, length) before them. Taken first,
      // with references: see items().
      std::vector<py::object> keys;
      std::vector<py::object> values;
      keys.reserve(static_cast<size_t>(PyDict_GET_SIZE(c)));
      values.reserve(static_cast<size_t>(PyDict_GET_SIZE(c)));
      Py_ssize_t pos = 0;
      PyObject* k = nullptr;
      PyObject* v = nullptr;
      while (PyDict_Next(c, &pos, &k, &v)) {
        keys.push_back(py::reinterpret_borrow<py::object>(k));
        values.push_back(py::reinterpret_borrow<py::object>(v));
      }
      if (Reason r = items(mode, keys, out, syms)) {
        return r;
      }
      return items(mode, values, out, syms);
    }
    const bool is_list = PyList_Check(c);
    if (is_list ? tp->tp_iter != PyList_Type.tp_iter
                : tp->tp_iter != PyTuple_Type.tp_iter) {
      return "container subclass argument";
    }
    out.borrow(reinterpret_cast<PyObject*>(tp));
    const Py_ssize_t n = is_list ? PyList_GET_SIZE(c) : PyTuple_GET_SIZE(c);
    if (!push_length(n, out)) {
      return "error";
    }
    if (!is_list) {
      // A tuple cannot change, and holds its items.
      for (Py_ssize_t i = 0; i < n; ++i) {
        if (Reason r = arg(mode, PyTuple_GET_ITEM(c, i), out, syms)) {
          return r;
        }
      }
      return nullptr;
    }
    std::vector<py::object> elements;
    elements.reserve(static_cast<size_t>(n));
    for (Py_ssize_t i = 0; i < n; ++i) {
      elements.push_back(py::reinterpret_borrow<py::object>(PyList_GET_ITEM(c, i)));
    }
    return items(mode, elements, out, syms);
  }

  // The elements of a container, taken (with references) before any of them
  // is looked at: a type's __hash__ or __instancecheck__ is Python code that
  // could change a list or dict argument under a borrowed iteration.
  Reason items(
      PyObject* mode,
      const std::vector<py::object>& elements,
      Values& out,
      SymNodes* syms) {
    for (const py::object& item : elements) {
      if (Reason r = arg(mode, item.ptr(), out, syms)) {
        return r;
      }
    }
    return nullptr;
  }

  // One element, in _prep_args_for_hash's order of isinstance tests.
  Reason arg(PyObject* mode, PyObject* a, Values& out, SymNodes* syms) {
    PyTypeObject* tp = Py_TYPE(a);
    if (tp == reinterpret_cast<PyTypeObject*>(fake_type_.ptr())) {
      return fake_tensor(mode, a, out, syms);
    }
    if (syms != nullptr && tp == reinterpret_cast<PyTypeObject*>(symint_type_.ptr())) {
      return sym_int(a, out, *syms);
    }
    if (THPVariable_Check(a)) {
      return PyObject_TypeCheck(a, reinterpret_cast<PyTypeObject*>(fake_type_.ptr()))
          ? "FakeTensor subclass argument"
          : "non-fake tensor argument";
    }
    if (PySet_Contains(plain_types_.ptr(), reinterpret_cast<PyObject*>(tp)) ==
        1) {
      out.borrow(reinterpret_cast<PyObject*>(tp));
      if (PySet_Contains(torch_keyed_types_.ptr(), reinterpret_cast<PyObject*>(tp)) == 1) {
        PyObject* keyed = PyObject_CallOneArg(torch_key_of_.ptr(), a);
        if (keyed == nullptr) {
          return "error";
        }
        if (keyed == Py_None) {
          Py_DECREF(keyed);
          return "argument torch keys otherwise";
        }
        return out.steal(keyed) ? nullptr : "error";
      }
      out.borrow(a);
      return nullptr;
    }
    if (PyList_Check(a) || PyTuple_Check(a) || PyDict_Check(a)) {
      return container(mode, a, out, syms);
    }
    const int sym = PyObject_IsInstance(a, sym_types_.ptr());
    if (sym < 0) {
      return "error";
    }
    return sym ? "symbolic argument" : "argument of another type";
  }

  Reason fake_tensor(PyObject* mode, PyObject* a, Values& out, SymNodes* syms) {
    // is_our_fake(), then `.constant is not None`, as _prep_args_for_hash.
    PyObject* owner = PyObject_GetAttr(a, fake_mode_name_.ptr());
    if (owner == nullptr) {
      return "error";
    }
    Py_DECREF(owner); // identity only
    if (owner != mode) {
      return "fake tensor of another mode";
    }
    PyObject* constant = PyObject_GetAttr(a, constant_name_.ptr());
    if (constant == nullptr) {
      return "error";
    }
    Py_DECREF(constant);
    if (constant != Py_None) {
      return "fake tensor with a constant";
    }
    // FakeTensor's Python properties (layout, is_mkldnn) follow its own
    // dispatch keys where it has them; torch's key reads those properties.
    PyObject* own_keys = PyObject_GetAttr(a, dispatch_keys_name_.ptr());
    if (own_keys == nullptr) {
      return "error";
    }
    Py_DECREF(own_keys); // identity only
    if (own_keys != Py_None) {
      return "fake tensor with its own dispatch keys";
    }
    const at::Tensor& t = THPVariable_Unpack(a);
    c10::TensorImpl* impl = t.unsafeGetTensorImpl();
    const bool symbolic = impl->has_symbolic_sizes_strides();
    if (symbolic && syms == nullptr) {
      return "symbolic sizes";
    }
    if (impl->layout() != c10::kStrided) {
      return "layout other than strided";
    }
    if (impl->is_nested()) {
      return "nested tensor";
    }
    if (impl->is_quantized()) {
      return "quantized tensor";
    }
    if (!impl->has_storage()) {
      return "tensor without storage";
    }
    const c10::Storage& storage = impl->storage();
    if (storage.sym_nbytes().is_heap_allocated() && syms == nullptr) {
      return "symbolic storage size";
    }

    // dtype
    out.borrow(reinterpret_cast<PyObject*>(torch::getTHPDtype(impl->dtype().toScalarType())));
    // shape (torch.Size) and stride (a tuple), flattened
    const c10::SymIntArrayRef sizes = impl->sym_sizes();
    const c10::SymIntArrayRef strides = impl->sym_strides();
    const auto ndim = static_cast<Py_ssize_t>(sizes.size());
    out.borrow(size_type_.ptr());
    if (!push_length(ndim, out)) {
      return "error";
    }
    for (const c10::SymInt& v : sizes) {
      if (Reason r = sym_value(v, /*typed=*/true, out, syms)) {
        return r;
      }
    }
    out.borrow(reinterpret_cast<PyObject*>(&PyTuple_Type));
    if (!push_length(ndim, out)) {
      return "error";
    }
    for (const c10::SymInt& v : strides) {
      if (Reason r = sym_value(v, /*typed=*/true, out, syms)) {
        return r;
      }
    }
    // device: FakeTensor.device is fake_device outside kernel invocation
    if (!out.steal(PyObject_GetAttr(a, fake_device_name_.ptr()))) {
      return "error";
    }
    out.borrow(strided_.ptr());
    // memory_format: torch._prims_common.suggest_memory_format, kept if
    // the tensor is contiguous in it; None for symbolic sizes, computed all
    // the same where it may guard (Note [Symbolic keys]).
    if (symbolic) {
      if ((ndim == 4 || ndim == 5) && !suggest_memory_format_.is_none()) {
        PyObject* ignored = PyObject_CallOneArg(suggest_memory_format_.ptr(), a);
        if (ignored == nullptr) {
          return "error";
        }
        Py_DECREF(ignored);
      }
      out.borrow(Py_None);
    } else {
      const c10::IntArrayRef static_sizes = impl->sizes();
      const c10::IntArrayRef static_strides = impl->strides();
      c10::MemoryFormat format = c10::MemoryFormat::Contiguous;
      PyObject* format_obj = contiguous_format_.ptr();
      if (channels_last_like(static_sizes, static_strides)) {
        if (ndim == 4) {
          format = c10::MemoryFormat::ChannelsLast;
          format_obj = channels_last_.ptr();
        } else {
          format = c10::MemoryFormat::ChannelsLast3d;
          format_obj = channels_last_3d_.ptr();
        }
      }
      out.borrow(t.is_contiguous(format) ? format_obj : Py_None);
    }
    // storage_offset, storage_bytes: not typed (_flatten_into appends them)
    if (Reason r = sym_value(impl->sym_storage_offset(), /*typed=*/false, out, syms)) {
      return r;
    }
    if (Reason r = sym_value(storage.sym_nbytes(), /*typed=*/false, out, syms)) {
      return r;
    }
    out.borrow(t.requires_grad() ? Py_True : Py_False);
    out.borrow(Py_False); // is_quantized
    out.borrow(impl->is_conj() ? Py_True : Py_False);
    out.borrow(impl->is_neg() ? Py_True : Py_False);
    out.borrow(impl->is_inference() ? Py_True : Py_False);
    out.borrow(Py_False); // is_sparse
    out.borrow(Py_None); // is_coalesced
    out.borrow(Py_None); // dense_dim
    out.borrow(Py_None); // sparse_dim
    return nullptr;
  }

  // torch._prims_common.are_strides_like_channels_last_or_false on static
  // sizes (guard_or_true of a plain bool is the bool).
  static bool channels_last_like(
      c10::IntArrayRef shape,
      c10::IntArrayRef strides) {
    static constexpr int64_t order4[] = {1, 3, 2, 0};
    static constexpr int64_t order5[] = {1, 4, 3, 2, 0};
    const int64_t* order = nullptr;
    size_t n = 0;
    if (shape.size() == 4) {
      order = order4;
      n = 4;
    } else if (shape.size() == 5) {
      order = order5;
      n = 5;
    } else {
      return false;
    }
    if (strides[1] == 0) {
      return false;
    }
    int64_t min = 0;
    for (size_t i = 0; i < n; ++i) {
      const int64_t d = order[i];
      if (shape[d] == 0) {
        return false;
      }
      if (strides[d] < min) {
        return false;
      }
      if (d == 0 && min == strides[1]) {
        return false;
      }
      min = strides[d] * shape[d];
    }
    return true;
  }

  py::object fake_type_;
  py::object size_type_;
  py::object plain_types_;
  py::object torch_keyed_types_;
  py::object torch_key_of_;
  py::object sym_types_;
  py::object strided_;
  py::object contiguous_format_;
  py::object channels_last_;
  py::object channels_last_3d_;
  py::object symint_type_;
  py::object stub_type_;
  py::object backref_type_;
  py::object suggest_memory_format_;
  py::str fake_mode_name_;
  py::str constant_name_;
  py::str dispatch_keys_name_;
  py::str fake_device_name_;
  py::str in_kernel_name_;
  py::str node_name_;
  py::str expr_name_;
  py::str free_symbols_name_;
  py::str shape_env_name_;
  py::str lookup_name_;
  py::str known_symbols_name_;
  std::vector<py::str> lengths_;
};

} // namespace

void init_keybuilder(py::module& m) {
  py::class_<KeyBuilder>(
      m,
      "KeyBuilder",
      "Builds FakeTensorMode._cache_key's key for the common case; see\n"
      "torch_cachepolicy._key. refs names the types and objects it compares\n"
      "with (fake_type, size_type, plain_types, torch_keyed_types, torch_key_of,\n"
      "sym_types, strided,\n"
      "contiguous_format, channels_last, channels_last_3d, symint_type,\n"
      "stub_type, backref_type, suggest_memory_format).")
      .def(py::init<const py::dict&>(), py::arg("refs"))
      .def(
          "build",
          &KeyBuilder::build,
          py::arg("mode"),
          py::arg("prefix"),
          py::arg("args"),
          py::arg("kwargs"),
          py::arg("state") = py::none(),
          "The key tuple (prefix, then args and kwargs flattened as\n"
          "_prep_args_for_hash does), or a str: why it falls back. With a\n"
          "fresh _CacheKeyState, symbolic values too (the state is updated\n"
          "as convert_sym_int would, only when a key is returned).");
}

} // namespace torch_cachepolicy
