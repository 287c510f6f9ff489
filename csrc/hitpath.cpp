// torch_cachepolicy._C.HitPath: the common case of a cache hit in one call
// (torch_cachepolicy.hitpath).
//
// Note [The hit in one native call]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Once mode.py knows an op's route and the sub-table its entries live in, a
// hit of a static key is four steps: torch's key (keybuilder.cpp), the
// common case of the key extension (keyparts.cpp), the lookup, and the
// output (synth.cpp's meta tensor, wrapped as synth.FakeTensors wraps it);
// then the op's hit counter and the key builder's. In Python each step is a
// few frames; HitPath.hit does them in one call, calling into Python only
// where the Python path calls torch (the key prefix's getters, the proxy
// mode, Tensor._make_subclass, the data-pointer guard, FakeTensor.__init__,
// and the key's __eq__ on a hash match).
//
// It does what the Python path does for the calls it takes, and for every
// other call returns DECLINED having changed nothing (no counter, no
// entry, no plan), so that the Python path handles the call from its start:
// a key the builder leaves to torch or that holds symbols; arguments the key
// extension must look at; no entry; an entry that is not a plain valid one
// (a bypass verdict, an entry with dependencies); an entry without a
// memoized plan (its first hit goes the Python way, which memoizes the
// plan); a plan with a symbolic step; an aliased argument that is not a
// FakeTensor; a device whose FakeTensor attributes synth.FakeTensors has not
// learned. Whatever hitpath.ready() refuses (the canaries of the key
// builder and of synth still running, FakeTensorConfig.debug, a torch whose
// FakeTensor constructor is not the known one) never reaches this call. The
// Python path stays the reference and the fallback:
// hitpath.checking_parity() has every native hit compared with it.

#include "module.h"

#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include <pybind11/pybind11.h>

#include <vector>

namespace torch_cachepolicy {
namespace {

namespace py = pybind11;

// synth.py's step kinds (_NEW, _VIEW, _INPLACE, _CONSTANT); the symbolic
// ones are declined.
constexpr long kNew = 0;
constexpr long kView = 1;
constexpr long kInplace = 2;
constexpr long kConstant = 3;

void throw_if_error() {
  if (PyErr_Occurred()) {
    throw py::error_already_set();
  }
}

class HitPath {
 public:
  HitPath(
      py::object key_builder,
      py::object key_type,
      bool key_slots,
      py::object entry_type,
      py::object fake_type,
      py::object make_subclass,
      py::object throw_on_data_ptr,
      py::object warn_on_data_ptr,
      py::object fake_init,
      py::object fake_config,
      py::object default_dtype,
      py::object default_device,
      py::object inference_mode,
      py::object proxy_mode,
      py::object pre_dispatch_owner,
      py::object declined)
      : key_builder_(std::move(key_builder)),
        key_type_(std::move(key_type)),
        key_slots_(key_slots),
        entry_type_(std::move(entry_type)),
        fake_type_(std::move(fake_type)),
        make_subclass_(std::move(make_subclass)),
        throw_on_data_ptr_(std::move(throw_on_data_ptr)),
        warn_on_data_ptr_(std::move(warn_on_data_ptr)),
        fake_init_(std::move(fake_init)),
        fake_config_(std::move(fake_config)),
        default_dtype_(std::move(default_dtype)),
        default_device_(std::move(default_device)),
        inference_mode_(std::move(inference_mode)),
        proxy_mode_(std::move(proxy_mode)),
        pre_dispatch_owner_(std::move(pre_dispatch_owner)),
        declined_(std::move(declined)) {
    TORCH_CHECK(
        PyType_Check(key_type_.ptr()) && PyType_Check(entry_type_.ptr()) && PyType_Check(fake_type_.ptr()),
        "torch_cachepolicy._C.HitPath: key_type, entry_type and fake_type must be types");
  }

  py::object hit(
      py::handle mode,
      py::handle func,
      py::handle args,
      py::handle kwargs,
      py::handle table,
      py::handle plans,
      py::handle bases,
      py::handle stats,
      py::handle key_stats,
      bool plain_check) {
    if (!PyDict_Check(table.ptr()) || !PyDict_Check(plans.ptr()) || !PyDict_Check(bases.ptr())) {
      throw py::type_error("torch_cachepolicy._C.HitPath.hit(...): table, plans and bases must be dicts");
    }
    if (!PyTuple_CheckExact(args.ptr())) {
      return declined_;
    }

    // keybuilder.key_prefix, then the arguments (keybuilder.cache_key).
    py::object shape_env = mode.attr(shape_env_name_);
    const int has_env = PyObject_IsTrue(shape_env.ptr());
    if (has_env < 0) {
      throw py::error_already_set();
    }
    py::object settings = py::none();
    if (has_env) {
      settings = shape_env.attr(settings_name_);
    }
    const bool proxy = proxy_active();
    py::tuple prefix = py::make_tuple(
        func, default_dtype_(), default_device_(), inference_mode_(), settings, py::bool_(proxy));
    py::object built = build_static_key(key_builder_, mode, prefix, args, kwargs);
    if (!PyTuple_CheckExact(built.ptr())) {
      return declined_; // the reason is the Python path's to count
    }
    // keyparts.extend_key's common case: nothing to add.
    if (plain_check && !plain_args(args, kwargs)) {
      return declined_;
    }
    const Py_hash_t hash = PyObject_Hash(built.ptr());
    if (hash == -1) {
      throw py::error_already_set();
    }
    py::object key = new_key(built, hash);

    // The lookup: the hash is known, so only a match calls the key's
    // __eq__ (CPython's _PyDict_GetItem_KnownHash; the public lookup, which
    // also calls the key's __hash__, where a CPython hides it).
#if PY_VERSION_HEX < 0x030D0000
    PyObject* found = _PyDict_GetItem_KnownHash(table.ptr(), key.ptr(), hash);
#else
    PyObject* found = PyDict_GetItemWithError(table.ptr(), key.ptr());
#endif
    if (found == nullptr) {
      throw_if_error();
      return declined_;
    }
    // Held: building the output runs Python code, which may drop the entry.
    py::object entry = py::reinterpret_borrow<py::object>(found);
    if (Py_TYPE(found) != reinterpret_cast<PyTypeObject*>(entry_type_.ptr())) {
      return declined_;
    }

    // The plan synth.Synthesizer memoized for this entry (by id, the entry
    // held beside it).
    py::object id = py::reinterpret_steal<py::object>(PyLong_FromVoidPtr(found));
    if (!id) {
      throw py::error_already_set();
    }
    PyObject* planned = PyDict_GetItemWithError(plans.ptr(), id.ptr());
    if (planned == nullptr) {
      throw_if_error();
      return declined_;
    }
    if (!PyTuple_CheckExact(planned) || PyTuple_GET_SIZE(planned) != 2 || PyTuple_GET_ITEM(planned, 0) != found) {
      return declined_;
    }
    py::object plan = py::reinterpret_borrow<py::object>(PyTuple_GET_ITEM(planned, 1));
    if (!PyTuple_CheckExact(plan.ptr()) || PyTuple_GET_SIZE(plan.ptr()) != 2) {
      return declined_; // None: torch's path
    }
    const bool is_tuple = PyTuple_GET_ITEM(plan.ptr(), 0) == Py_True;
    PyObject* steps = PyTuple_GET_ITEM(plan.ptr(), 1);
    if (!PyTuple_CheckExact(steps)) {
      return declined_;
    }
    const Py_ssize_t n = PyTuple_GET_SIZE(steps);

    // Everything that could decline is decided before anything is made.
    std::vector<PyObject*> sources(static_cast<size_t>(n), nullptr); // borrowed
    // Held: FakeTensor.__init__ (Python) runs between outputs, and a
    // cache_clear() from another thread may empty `bases` meanwhile; what
    // the Python path would then read for the next output is torch's
    // constructor's attributes again, these very ones.
    std::vector<py::object> base_of(static_cast<size_t>(n));
    for (Py_ssize_t i = 0; i < n; ++i) {
      PyObject* step = PyTuple_GET_ITEM(steps, i);
      const long kind = step_kind(step);
      if (kind == kNew || kind == kView) {
        const Py_ssize_t device_at = kind == kNew ? 4 : 6;
        PyObject* base = PyDict_GetItemWithError(bases.ptr(), PyTuple_GET_ITEM(step, device_at));
        if (base == nullptr) {
          throw_if_error();
          return declined_;
        }
        if (!PyDict_Check(base)) {
          return declined_; // None: this device keeps torch's constructor
        }
        base_of[static_cast<size_t>(i)] = py::reinterpret_borrow<py::object>(base);
      }
      if (kind == kView || kind == kInplace) {
        PyObject* arg = arg_at(args.ptr(), PyTuple_GET_ITEM(step, 1));
        if (arg == nullptr) {
          return declined_;
        }
        sources[static_cast<size_t>(i)] = arg;
      } else if (kind != kNew && kind != kConstant) {
        return declined_;
      }
    }

    py::tuple outputs(n);
    try {
      build_outputs(mode, steps, sources, base_of, outputs);
    } catch (...) {
      // The Python path counts its key before it builds the output: an
      // error raised while building (user code run by FakeTensor.__init__)
      // leaves the key counted and the hit not, there as here.
      PyObject *type, *value, *trace;
      PyErr_Fetch(&type, &value, &trace);
      try {
        increment(key_stats, built_name_);
      } catch (...) {
        PyErr_Clear();
      }
      PyErr_Restore(type, value, trace);
      throw;
    }
    increment(key_stats, built_name_);
    increment(stats, hits_name_);
    if (is_tuple) {
      return std::move(outputs);
    }
    return py::reinterpret_borrow<py::object>(PyTuple_GET_ITEM(outputs.ptr(), 0));
  }

 private:
  void build_outputs(
      py::handle mode,
      PyObject* steps,
      const std::vector<PyObject*>& sources,
      const std::vector<py::object>& base_of,
      py::tuple& outputs) const {
    const Py_ssize_t n = PyTuple_GET_SIZE(steps);
    for (Py_ssize_t i = 0; i < n; ++i) {
      PyObject* step = PyTuple_GET_ITEM(steps, i);
      py::object out;
      switch (step_kind(step)) {
        case kNew: {
          const int requires_grad = PyObject_IsTrue(PyTuple_GET_ITEM(step, 5));
          if (requires_grad < 0) {
            throw py::error_already_set();
          }
          py::object meta = meta_empty_strided(
              py::handle(PyTuple_GET_ITEM(step, 1)),
              py::handle(PyTuple_GET_ITEM(step, 2)),
              py::handle(PyTuple_GET_ITEM(step, 3)),
              requires_grad != 0);
          out = make_fake(mode, meta, PyTuple_GET_ITEM(step, 4), base_of[static_cast<size_t>(i)]);
          break;
        }
        case kView: {
          const long long offset = PyLong_AsLongLong(PyTuple_GET_ITEM(step, 4));
          throw_if_error();
          py::object meta = meta_view_of(
              sources[static_cast<size_t>(i)],
              py::handle(PyTuple_GET_ITEM(step, 2)),
              py::handle(PyTuple_GET_ITEM(step, 3)),
              offset,
              py::handle(PyTuple_GET_ITEM(step, 5)));
          out = make_fake(mode, meta, PyTuple_GET_ITEM(step, 6), base_of[static_cast<size_t>(i)]);
          break;
        }
        case kInplace:
          out = py::reinterpret_borrow<py::object>(sources[static_cast<size_t>(i)]);
          break;
        default: // kConstant
          out = py::reinterpret_borrow<py::object>(PyTuple_GET_ITEM(step, 1));
          break;
      }
      PyTuple_SET_ITEM(outputs.ptr(), i, out.release().ptr());
    }
  }

  // get_proxy_mode() is not None. With pre_dispatch_owner (torch._ops, whose
  // code hitpath.py has checked), read as get_proxy_mode reads it: the
  // dispatch mode TLS's PROXY slot (torch._C._get_dispatch_mode) and slot 0
  // of the pre-dispatch mode stack; else by calling get_proxy_mode.
  bool proxy_active() const {
    if (pre_dispatch_owner_.is_none()) {
      return !proxy_mode_().is_none();
    }
    if (c10::impl::TorchDispatchModeTLS::get_mode(c10::impl::TorchDispatchModeKey::PROXY).has_value()) {
      return true;
    }
    py::object state = pre_dispatch_owner_.attr(pre_dispatch_state_name_);
    py::object modes = state.attr(infra_modes_name_);
    if (!PyList_CheckExact(modes.ptr()) || PyList_GET_SIZE(modes.ptr()) < 1) {
      return !proxy_mode_().is_none();
    }
    const int set = PyObject_IsTrue(PyList_GET_ITEM(modes.ptr(), 0));
    if (set < 0) {
      throw py::error_already_set();
    }
    return set != 0;
  }

  static long step_kind(PyObject* step) {
    if (!PyTuple_CheckExact(step) || PyTuple_GET_SIZE(step) < 2) {
      return -1;
    }
    const long kind = PyLong_AsLong(PyTuple_GET_ITEM(step, 0));
    if (kind == -1 && PyErr_Occurred()) {
      PyErr_Clear();
      return -1;
    }
    const Py_ssize_t size = PyTuple_GET_SIZE(step);
    if ((kind == kNew && size != 6) || (kind == kView && size != 7) || (kind == kInplace && size != 2) ||
        (kind == kConstant && size != 2)) {
      return -1;
    }
    return kind;
  }

  // The argument at `index` if it is a FakeTensor (synth.build: an aliased
  // argument that is not one takes torch's path), else nullptr.
  PyObject* arg_at(PyObject* args, PyObject* index) const {
    if (!PyLong_CheckExact(index)) {
      return nullptr;
    }
    const Py_ssize_t i = PyLong_AsSsize_t(index);
    if (i < 0 || i >= PyTuple_GET_SIZE(args)) {
      PyErr_Clear();
      return nullptr;
    }
    PyObject* arg = PyTuple_GET_ITEM(args, i);
    const int is_fake = PyObject_IsInstance(arg, fake_type_.ptr());
    if (is_fake < 0) {
      throw py::error_already_set();
    }
    return is_fake ? arg : nullptr;
  }

  // _DispatchCacheKey(built): its __init__ sets the two slots to the tuple
  // and its hash (hitpath.py checks that it still does, else key_slots is
  // false and the class is called).
  py::object new_key(const py::object& built, Py_hash_t hash) const {
    if (!key_slots_) {
      return key_type_(built);
    }
    auto* type = reinterpret_cast<PyTypeObject*>(key_type_.ptr());
    py::object key = py::reinterpret_steal<py::object>(type->tp_alloc(type, 0));
    if (!key) {
      throw py::error_already_set();
    }
    py::object h = py::reinterpret_steal<py::object>(PyLong_FromSsize_t(hash));
    if (!h || PyObject_SetAttr(key.ptr(), key_name_.ptr(), built.ptr()) < 0 ||
        PyObject_SetAttr(key.ptr(), hashvalue_name_.ptr(), h.ptr()) < 0) {
      throw py::error_already_set();
    }
    return key;
  }

  // synth.FakeTensors.make for a device whose attributes it has learned.
  // The mode's data-pointer setting and FakeTensorConfig.debug are read for
  // each output, as FakeTensors.make reads them (with debug on, torch's
  // constructor makes the tensor, with its trace).
  py::object make_fake(py::handle mode, const py::object& meta, PyObject* device, const py::object& base) const {
    if (truthy_attr(fake_config_, debug_name_)) {
      return fake_type_(mode, meta, py::handle(device));
    }
    const bool requires_grad = THPVariable_Unpack(meta.ptr()).requires_grad();
    py::object t = make_subclass_(
        fake_type_,
        meta,
        requires_grad,
        py::arg("dispatch_device") = true,
        py::arg("device_for_backend_keys") = py::handle(device));
    (truthy_attr(mode, unsafe_name_) ? warn_on_data_ptr_ : throw_on_data_ptr_)(t);
    py::object attrs = t.attr(dict_name_);
    if (PyDict_Update(attrs.ptr(), base.ptr()) < 0) {
      throw py::error_already_set();
    }
    fake_init_(t);
    return t;
  }

  static int truthy_attr(py::handle obj, const py::str& name) {
    py::object v = obj.attr(name);
    const int r = PyObject_IsTrue(v.ptr());
    if (r < 0) {
      throw py::error_already_set();
    }
    return r;
  }

  static void increment(py::handle obj, const py::str& name) {
    py::object v = obj.attr(name);
    py::object one = py::int_(1);
    PyObject* next = PyNumber_Add(v.ptr(), one.ptr());
    if (next == nullptr) {
      throw py::error_already_set();
    }
    const int r = PyObject_SetAttr(obj.ptr(), name.ptr(), next);
    Py_DECREF(next);
    if (r < 0) {
      throw py::error_already_set();
    }
  }

  py::object key_builder_;
  py::object key_type_;
  bool key_slots_;
  py::object entry_type_;
  py::object fake_type_;
  py::object make_subclass_;
  py::object throw_on_data_ptr_;
  py::object warn_on_data_ptr_;
  py::object fake_init_;
  py::object fake_config_;
  py::object default_dtype_;
  py::object default_device_;
  py::object inference_mode_;
  py::object proxy_mode_;
  py::object pre_dispatch_owner_;
  py::object declined_;
  py::str shape_env_name_{"shape_env"};
  py::str pre_dispatch_state_name_{"_mode_stack_state_for_pre_dispatch"};
  py::str infra_modes_name_{"_ModeStackStateForPreDispatch__infra_modes"};
  py::str settings_name_{"settings"};
  py::str unsafe_name_{"_allow_unsafe_data_ptr_access"};
  py::str key_name_{"key"};
  py::str hashvalue_name_{"hashvalue"};
  py::str dict_name_{"__dict__"};
  py::str built_name_{"built"};
  py::str hits_name_{"hits"};
  py::str debug_name_{"debug"};
};

} // namespace

void init_hitpath(py::module& m) {
  py::class_<HitPath>(
      m,
      "HitPath",
      "The common case of a cache hit in one call; see torch_cachepolicy.hitpath\n"
      "and Note [The hit in one native call] in csrc/hitpath.cpp.")
      .def(
          py::init<
              py::object,
              py::object,
              bool,
              py::object,
              py::object,
              py::object,
              py::object,
              py::object,
              py::object,
              py::object,
              py::object,
              py::object,
              py::object,
              py::object,
              py::object,
              py::object>(),
          py::arg("key_builder"),
          py::arg("key_type"),
          py::arg("key_slots"),
          py::arg("entry_type"),
          py::arg("fake_type"),
          py::arg("make_subclass"),
          py::arg("throw_on_data_ptr"),
          py::arg("warn_on_data_ptr"),
          py::arg("fake_init"),
          py::arg("fake_config"),
          py::arg("default_dtype"),
          py::arg("default_device"),
          py::arg("inference_mode"),
          py::arg("proxy_mode"),
          py::arg("pre_dispatch_owner"),
          py::arg("declined"))
      .def(
          "hit",
          &HitPath::hit,
          py::arg("mode"),
          py::arg("func"),
          py::arg("args"),
          py::arg("kwargs"),
          py::arg("table"),
          py::arg("plans"),
          py::arg("bases"),
          py::arg("stats"),
          py::arg("key_stats"),
          py::arg("plain_check"),
          "The output of a hit of this static-key call on `table`, its op's hit\n"
          "counter (`stats.hits`) and `key_stats.built` incremented; or `declined`,\n"
          "nothing changed, for a call the Python path must handle.");
}

} // namespace torch_cachepolicy
