"""The private torch internals this package builds on, checked once at import, and what a change switches off.

A leaf: it imports nothing of the package but the import-free ``version``; other modules ask it what this torch is
like (:func:`off`, and the gates at the end).
"""

# Note [Checking torch's internals]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# The mode calls, overrides and reads private parts of FakeTensorMode (_cache_key, the entry dataclasses, ...);
# a torch release may rename them or change their parameters or results, failing deep in a dispatch. So each
# internal in _INTERNALS is checked at import: that it exists, the parameter names of what we call or override
# (exactly for overrides: torch calls them with its own arguments), the fields of dataclasses we read or build,
# and, where cheap and side-effect free, its behaviour (_DispatchCacheKey equality, ...). Each internal belongs to
# one Feature. A changed internal switches its feature off (and the features that rest on it), with one
# TorchDriftWarning naming the internal and what runs instead: the mode then is a correct FakeTensorMode that
# caches less (stock's dispatch, torch's key, torch's synthesis, backend ops bypassing with the reason). Only a
# change to what the subclass needs to be a FakeTensorMode at all (Feature.RULES) raises ImportError. A torch newer
# than every tested release imports with an UntestedTorchWarning (the checks cannot see every behaviour).
# test/test_compat.py checks that every private torch name in the package's source is listed here, and every
# attribute name csrc/ reads (under Feature.NATIVE): C++ would fail each dispatch on a renamed one.
#
# Where the package does a torch function's work more cheaply, that function's behaviour (or, where behaviour
# cannot be probed, its code) is read once here and the copy is used only while it is the known one: the gates at
# the end of this file, booleans the copy tests.

from __future__ import annotations

import dataclasses
import dis
import enum
import importlib
import inspect
import logging
import re
import types
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch._subclasses import fake_tensor as _ft

from torch_cachepolicy.version import TESTED_TORCH

log = logging.getLogger(__name__)

ADVICE = (
    f"torch_cachepolicy is tested on torch {', '.join(TESTED_TORCH)}; please report this with your torch version "
    f'(pip install "torch=={TESTED_TORCH[-1]}" gives a tested release)'
)
"""What every message about an untested or changed torch ends with."""


class UntestedTorchWarning(UserWarning):
    """The installed torch is newer (or older) than every release the package is tested on."""


class TorchDriftWarning(UserWarning):
    """A private torch internal the package builds on changed; the package switched off what depends on it."""


class UnlistedKernelSourceWarning(TorchDriftWarning):
    """This torch's fake dispatch consults a source the package does not list; backend ops go uncached."""


class Feature(enum.Enum):
    """A part of the package that a changed torch internal switches off; the value says what runs instead."""

    RULES = "applying the rules registered for torch's FakeTensorMode to the subclass"
    CACHE = (
        "the policy cache (the mode dispatches as torch's FakeTensorMode: aten ops cached as stock caches them, "
        "backend ops uncached)"
    )
    BACKEND = "caching of backend and higher-order operators (they bypass; aten ops stay cached)"
    NATIVE = "the C++ helper torch_cachepolicy._C (as with USE_CPP=0: torch's key and synthesis, a weaker kernel watch)"
    EXPORT = "torch_cachepolicy.export and adopt (they raise; torch.export.export works)"


# What switching a feature off also switches off: the parts of the cache rest on the cache.
_IMPLIED = {
    Feature.CACHE: (Feature.BACKEND, Feature.NATIVE),
}


# ------------------------------------------------------------------ checks


@dataclass(frozen=True)
class _Internal:
    """One private torch internal and what the package relies on about it.

    Attributes:
        module: the module that defines it.
        path: the attribute path inside ``module`` (``"Class.method"``).
        feature: what a change to it switches off.
        params: leading parameter names of a function we call (a class: its constructor); later ones need defaults.
        overridden: ``params`` (or one of ``alternatives``) must match exactly: torch calls our override with its
            own arguments.
        alternatives: other exact parameter lists of an overridden function that the package handles (releases
            differ).
        keywords: parameter names we pass by keyword, anywhere in the signature.
        fields: the dataclass fields we read or construct, in order (construction is positional).
        refers_to: attribute names the function's bytecode must use: those an ``__init__`` assigns and we read,
            or storage torch's code reads where ours does too.
        check: behaviour; returns what is wrong, or None.
    """

    module: str
    path: str
    feature: Feature = Feature.CACHE
    params: tuple[str, ...] | None = None
    overridden: bool = False
    alternatives: tuple[tuple[str, ...], ...] = ()
    keywords: tuple[str, ...] = ()
    fields: tuple[str, ...] | None = None
    refers_to: tuple[str, ...] = ()
    check: Callable[[Any], str | None] | None = None

    @property
    def name(self) -> str:
        return f"{self.module}.{self.path}"


def _is_type(*types: type) -> Callable[[object], str | None]:
    def check(obj: object) -> str | None:
        return None if isinstance(obj, types) else f"is a {type(obj).__name__}"

    return check


def _check_cache_key(cls: Any) -> str | None:
    # Our plain dicts are keyed by these, and _key_extension.extend_key rebuilds a key from `.key`.
    a, b, c = cls((1, "x")), cls((1, "x")), cls((2, "x"))
    if not (a == b and hash(a) == hash(b) and a != c and a.key == (1, "x")):
        return "keys of equal tuples are not equal (or hash differently), or .key is not the tuple"
    a.strip_shape_env()
    return None


def _check_reason(cls: Any) -> str | None:
    if cls("why").reason != "why":
        return "does not keep .reason"
    return None


def _check_bypass_exception(cls: Any) -> str | None:
    if not issubclass(cls, Exception):
        return "is not an Exception"
    return _check_reason(cls)


def _check_key_state(cls: Any) -> str | None:
    state = cls(None)
    if state.shape_env is not None or state.cache_on_shape_env() or state.known_symbols != set():
        return "a fresh state has a ShapeEnv, symbols, or caches on a ShapeEnv"
    return None


def _check_opoverload(_: object) -> str | None:
    add, view = torch.ops.aten.add.Tensor, torch.ops.aten.view.default
    facts = (
        add.namespace == "aten",
        add._overloadname == "Tensor",
        add._schema.name == "aten::add",
        add.name() == "aten::add.Tensor",
        torch.ops.aten.add._qualified_op_name == "aten::add",
        not add.is_view and view.is_view,
        view._schema.returns[0].alias_info is not None,
        not add._schema.is_mutable and torch.ops.aten.add_.Tensor._schema.is_mutable,
    )
    return None if all(facts) else "aten.add.Tensor / aten.view.default are described differently"


def _check_dispatch_dump(fn: Any) -> str | None:
    # _keyset's Python fallback fingerprints an op's fake kernels by the dump's "<Key>: registered at ..." lines.
    lines = fn("aten::add.Tensor").splitlines()
    if not any(line.startswith("Meta: registered at ") for line in lines):
        return "no longer lists aten::add.Tensor's kernels as 'Meta: registered at ...'"
    return None


def _check_fake_impl_holder(cls: Any) -> str | None:
    # _routes keeps an op's holder and _kernels reads `.kernel.func` on each dispatch.
    if cls("tcp_compat::probe").kernel is not None:
        return "a new holder already has a kernel"
    return None


def _check_redirect_to_mode(fn: Any) -> str | None:
    # _rules.redirects_to_mode recognizes the rules it makes by their qualname.
    names = [getattr(c, "co_qualname", None) for c in fn.__code__.co_consts if inspect.iscode(c)]
    if "redirect_to_mode.<locals>.impl" not in names:
        return "no longer defines redirect_to_mode.<locals>.impl"
    return None


def _returns_mapping(fn: Any) -> str | None:
    return _is_type(Mapping)(fn())


def _has_entries(*names: str) -> Callable[[Any], str | None]:
    # Configs read with config_reader.
    def check(config: Any) -> str | None:
        missing = [name for name in names if name not in config]
        return f"has no entries {_render(missing)}" if missing else None

    return check


# What _verify.shape_env_state reads of a ShapeEnv: sized containers, then counters.
_SHAPE_ENV_SIZED = ("var_to_range", "guards", "replacements", "divisible")
_SHAPE_ENV_COUNTERS = (
    "unbacked_symint_counter", "unbacked_symfloat_counter", "num_deferred_runtime_asserts", "_version_counter"
)


def _check_shape_env_counters(cls: Any) -> str | None:
    env = cls()
    try:
        sizes = [len(getattr(env, name)) for name in _SHAPE_ENV_SIZED]
        counters = [getattr(env, name) for name in _SHAPE_ENV_COUNTERS]
    except (AttributeError, TypeError) as e:
        return f"instances lack an attribute _verify.shape_env_state reads ({e})"
    if not all(isinstance(v, int) for v in (*sizes, *counters)):
        return "has a non-int counter"
    # What _symbols.knowledge reads of whether the ShapeEnv records guards.
    if not (isinstance(getattr(env, "frozen", None), bool) and isinstance(getattr(env, "_error_on_new_guards", None), bool)):
        return "instances lack the bools frozen and _error_on_new_guards"
    return None


def _check_python_key_table(cls: Any) -> str | None:
    # Every operator, HOPs included, has one (read by _rules.dispatch).
    return _is_type(dict)(cls().python_key_table)


_FT = "torch._subclasses.fake_tensor"
_MODE = "FakeTensorMode"
_DISPATCH = ("self", "func", "types", "args", "kwargs")

_RULES, _BACKEND, _NATIVE, _EXPORT = Feature.RULES, Feature.BACKEND, Feature.NATIVE, Feature.EXPORT
_UTILS = "torch._subclasses._fake_tensor_utils"
_REGISTRY = "torch._library.simple_registry"

_INTERNALS: tuple[_Internal, ...] = (
    # FakeTensorMode: what the subclass overrides, calls and reads. Without the cache (Feature.CACHE, the default)
    # the mode dispatches as stock's.
    _Internal(
        _FT,
        f"{_MODE}.__init__",
        params=("self",),
        keywords=("allow_fallback_kernels", "allow_non_fake_inputs", "shape_env", "static_shapes", "export"),
        # export.py sets _allow_unsafe_data_ptr_access as torch.export's make_fake_inputs does.
        refers_to=("allow_fallback_kernels", "propagate_real_tensors", "cache_enabled", "cache_crosscheck_enabled",
                   "fake_tensor_converter", "shape_env", "_allow_unsafe_data_ptr_access"),
    ),
    _Internal(_FT, f"{_MODE}.dispatch", _RULES, params=_DISPATCH, overridden=True),
    # An OpOverload's FakeTensorMode rule applies only under the Python dispatcher (_rules.dispatch).
    _Internal("torch._C", "_dispatch_tls_is_dispatch_key_included", _RULES),
    # Entries for stock ops go where stock's do: the class-global `cache`, or `shape_env.fake_tensor_cache`.
    _Internal(
        _FT, f"{_MODE}._cached_dispatch_impl", params=_DISPATCH, overridden=True,
        refers_to=("cache", "fake_tensor_cache"),
    ),
    _Internal(_FT, f"{_MODE}._validate_cache_key", params=("self", "func", "args", "kwargs"), overridden=True),
    _Internal(_FT, f"{_MODE}.cache_info", params=(), overridden=True),
    _Internal(_FT, f"{_MODE}.cache_clear", params=(), overridden=True),
    _Internal(_FT, f"{_MODE}._dispatch_impl", params=_DISPATCH),
    _Internal(_FT, f"{_MODE}._cache_key", params=("self", "state", "func", "args", "kwargs")),
    _Internal(_FT, f"{_MODE}._make_cache_entry", params=("self", "state", "key", "func", "args", "kwargs", "output")),
    # torch 2.15 dropped `func` (a view output is one whose entry has a view_idx); both are handled
    # (SYNTHESIS_TAKES_FUNC).
    _Internal(
        _FT, f"{_MODE}._output_from_cache_entry", params=("self", "state", "entry", "key", "func", "args"),
        overridden=True, alternatives=(("self", "state", "entry", "key", "args"),),
    ),
    # Hashes a GraphModule (and callables wrapping one) by id; _driver.py evicts such keys when the object dies.
    # _key.py hands it the arguments whose key torch may transform (a device: torch 2.15 pins its index).
    _Internal(_FT, f"{_MODE}._prep_args_for_hash", params=("self", "result", "args", "state", "id_hashed_objects")),
    # adopt() moves a value by setting the attribute FakeTensor.__new__ assigns (Note [Moving values rather than
    # copying them]).
    _Internal(_FT, "FakeTensor.__new__", _EXPORT, refers_to=("fake_mode",)),
    _Internal(_FT, f"{_MODE}.cache", check=_is_type(dict)),
    _Internal(_FT, "FakeTensorConverter.__init__", _EXPORT, keywords=("export",), refers_to=("export",)),
    # adopt() drops moved values from the old mode's memo of converted tensors.
    _Internal(_FT, "FakeTensorConverter._get_memo", _EXPORT, refers_to=("tensor_memo",)),
    # The cache's data types.
    _Internal(_FT, "_DispatchCacheKey", params=("tup",), check=_check_cache_key),
    _Internal(_FT, "_DispatchCacheKey.strip_shape_env", params=("self",)),
    _Internal(_FT, "FakeTensor"),
    _Internal(_FT, "_DispatchCacheValidEntry", fields=("output_infos", "is_output_tuple")),
    _Internal(_FT, "_DispatchCacheEntryOutputInfo", fields=("inplace_idx", "metadata", "view_idx", "constant_value")),
    _Internal(_FT, "_DispatchCacheBypassEntry", fields=("reason",), check=_check_reason),
    _Internal(_FT, "_BypassDispatchCache", fields=("reason",), check=_check_bypass_exception),
    _Internal(_FT, "DispatchCacheInfo", fields=("hits", "misses", "bypasses", "size")),
    _Internal(_UTILS, "_CacheKeyState", params=("shape_env",), check=_check_key_state),
    _Internal(_UTILS, "_CacheKeyState.cache_on_shape_env", params=("self",)),
    # _key builds symbolic keys as convert_sym_int and extract_tensor_metadata do (Note [Symbolic keys] in
    # csrc/keybuilder.cpp); SYMBOLIC_KEYS reads whether the latter computes a symbolic tensor's memory format.
    _Internal(
        _UTILS,
        "_CacheKeyState.convert_sym_int",
        _NATIVE,
        params=("self", "result", "arg"),
        refers_to=("sym_node_lookup", "known_symbols", "shape_env", "free_symbols", "_InputBackref", "_PySymInputStub"),
    ),
    _Internal(_UTILS, "_PySymInputStub", fields=("value",)),
    # _synth.stub_symint_output keeps a bare SymInt output as torch keeps a tensor output's sizes.
    _Internal(_UTILS, "_SymIntOutputStub.__init__", params=("self", "value", "key_path")),
    _Internal(_UTILS, "_SymIntOutputStub.extract", params=("self", "key", "shape_env")),
    _Internal(_UTILS, "_InputBackref", _NATIVE, fields=("value",)),
    _Internal(_FT, "suggest_memory_format", _NATIVE, params=("x",)),
    # Functions.
    _Internal(_FT, "disable_fake_tensor_cache", params=("fake_mode",)),
    _Internal(_FT, "unset_fake_temporarily", _EXPORT, params=()),
    _Internal(_FT, "maybe_get_fake_mode", _EXPORT, params=("t",)),
    _Internal("torch._subclasses.meta_utils", "assert_metadata_eq", params=("assert_eq", "m1", "m2")),
    _Internal("torch._subclasses.meta_utils", "assert_eq", params=("a", "b")),
    # Operators and the registries of their fake kernels.
    _Internal("torch._ops", "OpOverload", _RULES, check=_check_opoverload),
    _Internal("torch._ops", "OperatorBase", _RULES, check=_check_python_key_table),
    _Internal("torch._ops", "HigherOrderOperator", _RULES),
    _Internal("torch._ops", "_OpNamespace", _RULES),
    _Internal(_REGISTRY, "singleton", _RULES),
    _Internal(_REGISTRY, "SimpleLibraryRegistry.find", _RULES, params=("self", "qualname")),
    _Internal(_REGISTRY, "SimpleLibraryRegistry.get", _RULES, params=("self", "qualname")),
    _Internal(_REGISTRY, "SimpleOperatorEntry.__init__", _RULES, refers_to=("fake_impl", "torch_dispatch_rules")),
    # Rules for the FakeTensorMode class (Note [Rules for the FakeTensorMode class]).
    _Internal(
        _REGISTRY, "GenericTorchDispatchRuleHolder.find", _RULES,
        params=("self", "torch_dispatch_class"), refers_to=("_data",),
    ),
    # Routes keep the holder's dict: register and deregister change it in place.
    _Internal(
        _REGISTRY, "GenericTorchDispatchRuleHolder.register", _RULES,
        params=("self", "torch_dispatch_class", "func"), refers_to=("_data",),
    ),
    _Internal(
        _REGISTRY, "find_torch_dispatch_rule", _RULES, params=("op", "torch_dispatch_class"),
        refers_to=("torch_dispatch_rules", "__qualname__"),
    ),
    # Sources _kernels.KernelDeps watches (Note [The kernel in effect]).
    _Internal("torch._subclasses.fake_impls", "op_implementations_checks", _BACKEND, check=_is_type(list)),
    _Internal("torch._subclasses.fake_impls", "op_implementations_dict", _BACKEND, check=_is_type(dict)),
    _Internal("torch._subclasses.fake_impls", "get_fast_op_impls", _BACKEND, params=(), check=_returns_mapping),
    _Internal(_FT, f"{_MODE}.can_run_unsafe_fallback", _BACKEND, params=("self", "func")),
    _Internal(_FT, f"{_MODE}._can_run_unsafe_fallback_allowed_namespaces", _BACKEND),
    # _kernels.custom_ops_profile reads the config entry as the config module does.
    _Internal("torch._dynamo.config", "_config", _BACKEND, check=_has_entries("_custom_ops_profile")),
    # _symbols.knowledge: the configs that change how backed symbols are reasoned about.
    _Internal(
        "torch.fx.experimental._config", "_config", _BACKEND,
        check=_has_entries("backed_size_oblivious", "aggressive_guard_free_semantics"),
    ),
    _Internal(
        "torch.utils._config_module", "ConfigModule.__getattr__", _BACKEND,
        refers_to=("env_value_force", "user_override", "env_value_default", "justknob", "hide"),
    ),
    _Internal("torch.utils._config_module", "_UNSET_SENTINEL", _BACKEND),
    # _synth.FakeTensors makes a hit's FakeTensor as FakeTensor.__new__ does (FAKE_TENSOR_CONSTRUCTOR_KNOWN
    # below; Note [A hit's FakeTensor]).
    _Internal("torch", "Tensor._make_subclass", _NATIVE),
    _Internal("torch._C", "_set_throw_on_mutable_data_ptr", _NATIVE),
    _Internal("torch._C", "_set_warn_deprecated_on_mutable_data_ptr", _NATIVE),
    _Internal("torch._C", "_dispatch_keys", _NATIVE),  # _synth's self-check compares hits' dispatch keys
    _Internal(_FT, "FakeTensorConfig.debug", _NATIVE, check=_is_type(bool)),
    # _verify.shape_env_state: what a backend kernel may teach the ShapeEnv.
    _Internal("torch.fx.experimental.symbolic_shapes", "ShapeEnv", _BACKEND, check=_check_shape_env_counters),
    _Internal("torch._library.fake_impl", "FakeImplHolder", _BACKEND, params=("qualname",), check=_check_fake_impl_holder),
    _Internal("torch._library.utils", "Kernel", _BACKEND, fields=("func",)),
    _Internal("torch._library.utils", "is_builtin", params=("op",)),
    _Internal("torch._library.custom_ops", "CustomOpDef", _RULES),
    _Internal("torch._library.custom_ops", "OPDEFS", _BACKEND, check=_is_type(Mapping)),
    _Internal("torch._decomp", "decomposition_table", _BACKEND, check=_is_type(dict)),
    # Python-level kernels that fake dispatch prefers; _kernels.table_key watches them.
    _Internal("torch._decomp", "meta_table", _BACKEND, check=_is_type(dict)),
    _Internal("torch._ops", "OperatorBase.__init__", _RULES, refers_to=("py_kernels", "python_key_table")),
    _Internal("torch._library.custom_ops", "CustomOpDef.register_fake", _BACKEND, refers_to=("_abstract_fn",)),
    # Whether the ShapeEnv records guards (Note [What the ShapeEnv knows]).
    _Internal("torch.fx.experimental.symbolic_shapes", "ShapeEnv._suppress_guards_tls", _BACKEND, params=()),
    # Bumped whenever the ShapeEnv learns something (Note [What the ShapeEnv knows]).
    _Internal(
        "torch.fx.experimental.symbolic_shapes", "ShapeEnv._update_version_counter", _BACKEND, params=("self",),
        refers_to=("_version_counter",),
    ),
    _Internal("torch._C", "_dispatch_has_kernel_for_dispatch_key", _RULES),
    _Internal("torch._C", "_dispatch_find_schema_or_throw", _BACKEND),
    _Internal("torch._C", "_dispatch_dump", _BACKEND, check=_check_dispatch_dump),
    _Internal("torch._C", "DispatchKey", _RULES),
    # The key builder (_key.py, csrc/keybuilder.cpp) reproduces _cache_key's key from these: its prefix, and each
    # tensor's metadata fields in this order (Note [What the key builder reproduces]).
    _Internal("torch._C", "_get_default_device", _NATIVE),
    # What keybuilder.cpp reads by name (test_compat checks that every name csrc/ reads is listed): the mode's
    # in_kernel_invocation; a FakeTensor's fake_mode, constant, dispatch_keys and _fake_device (what fake_device
    # returns); a SymInt's node; a SymNode's expr and shape_env; a key state's fields (convert_sym_int's above).
    _Internal(_FT, f"{_MODE}.__init__", _NATIVE, refers_to=("in_kernel_invocation",)),
    _Internal(_FT, "FakeTensor.__new__", _NATIVE, refers_to=("fake_mode", "constant", "dispatch_keys")),
    _Internal(_FT, "FakeTensor.fake_device.fget", _NATIVE, refers_to=("_fake_device",)),
    _Internal("torch", "SymInt.__init__", _NATIVE, refers_to=("node",)),
    _Internal("torch.fx.experimental.sym_node", "SymNode.__init__", _NATIVE, refers_to=("shape_env",)),
    _Internal("torch.fx.experimental.sym_node", "SymNode.expr", _NATIVE, check=_is_type(property)),
    _Internal("torch.fx.experimental.proxy_tensor", "get_proxy_mode", params=()),
    _Internal(
        _FT,
        "TensorMetadata",
        _NATIVE,
        fields=("dtype", "shape", "stride", "device", "layout", "memory_format", "storage_offset", "storage_bytes",
                "requires_grad", "is_quantized", "is_conj", "is_neg", "is_inference", "is_sparse", "is_coalesced",
                "dense_dim", "sparse_dim"),
    ),
    _Internal(_FT, "extract_tensor_metadata", _NATIVE, params=("t",)),
    # export.py: torch.export.export traces under an active TracingContext's fake mode (make_fake_inputs); its
    # check of lifted fake constants is re-run on the result (Note [Exporting under a TracingContext]).
    _Internal("torch._guards", "TracingContext", _EXPORT, params=("fake_mode",)),
    _Internal("torch._guards", "TracingContext.try_get", _EXPORT, params=()),
    _Internal("torch._guards", "tracing", _EXPORT, params=("context",)),
    _Internal("torch._guards", "detect_fake_mode", _EXPORT, params=("inputs",)),
    _Internal("torch.export._trace", "_is_bogus_const_name", _EXPORT, params=("name",)),
    _Internal("torch._export.config", "error_on_lifted_constant_tensors", _EXPORT, check=_is_type(bool)),
    # Higher-order operators.
    _Internal("torch._higher_order_ops.utils", "registered_hop_fake_fns", _RULES, check=_is_type(Mapping)),
    _Internal(
        "torch._higher_order_ops.utils", "redirect_to_mode", _RULES, params=("hop", "mode"),
        check=_check_redirect_to_mode,
    ),
)


def _resolve(internal: _Internal) -> object:
    obj: object = importlib.import_module(internal.module)
    for part in internal.path.split("."):
        obj = getattr(obj, part)
    return obj


def _render(names: tuple[str, ...] | list[str]) -> str:
    return "(" + ", ".join(names) + ")"


def _signature_drift(internal: _Internal, obj: Any) -> str | None:
    params = list(inspect.signature(obj).parameters.values())
    names = [p.name for p in params]
    expected = internal.params
    if expected is not None:
        if internal.overridden:
            if tuple(names) != expected and tuple(names) not in internal.alternatives:
                known = " or ".join(_render(e) for e in (expected, *internal.alternatives))
                return f"takes {_render(names)}, expected exactly {known} (the package overrides it)"
        elif tuple(names[: len(expected)]) != expected or any(
            p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params[len(expected) :]
        ):
            return f"takes {_render(names)}, expected {_render([*expected, '...'])}"
    missing = [k for k in internal.keywords if k not in names]
    return f"takes {_render(names)}, without the keyword arguments {_render(missing)}" if missing else None


def _drift(internal: _Internal, obj: Any) -> str | None:
    """What about ``obj`` no longer matches ``internal``, or None."""
    if internal.params is not None or internal.keywords:
        problem = _signature_drift(internal, obj)
        if problem is not None:
            return problem
    if internal.fields is not None:
        if not dataclasses.is_dataclass(obj):
            return "is no longer a dataclass"
        fields = tuple(f.name for f in dataclasses.fields(obj))
        if fields[: len(internal.fields)] != internal.fields:
            return f"has the fields {_render(fields)}, expected {_render([*internal.fields, '...'])}"
    if internal.refers_to:
        missing = [a for a in internal.refers_to if a not in obj.__code__.co_names]
        if missing:
            return f"no longer uses the attributes {_render(missing)}"
    if internal.check is not None:
        return internal.check(obj)
    return None


@dataclass(frozen=True)
class Drift:
    """One internal that no longer matches what the package relies on.

    Attributes:
        internal: its dotted name.
        problem: what changed, in words.
        feature: what it switches off.
    """

    internal: str
    problem: str
    feature: Feature

    def __str__(self) -> str:
        return f"{self.internal} {self.problem}"


def find_drift(internals: tuple[_Internal, ...] | None = None) -> tuple[Drift, ...]:
    """The internals of :data:`_INTERNALS` (or ``internals``) that changed on the installed torch."""
    found = []
    for internal in _INTERNALS if internals is None else internals:
        try:
            problem = _drift(internal, _resolve(internal))
        except Exception as e:  # a missing attribute, or a behaviour check that raised
            problem = f"cannot be used ({e!r})"
        if problem is not None:
            found.append(Drift(internal.name, problem, internal.feature))
    return tuple(found)


def switched_off(drift: tuple[Drift, ...]) -> dict[Feature, Drift]:
    """Each feature ``drift`` switches off, with the (first) change that does: its own, or one it rests on."""
    off: dict[Feature, Drift] = {}
    for d in drift:
        for feature in (d.feature, *_IMPLIED.get(d.feature, ())):
            off.setdefault(feature, d)
    return off


def torch_minor(version: str) -> tuple[int, int] | None:
    """``(major, minor)`` of a torch version string, or None if it has none."""
    match = re.match(r"(\d+)\.(\d+)", version)
    return None if match is None else (int(match[1]), int(match[2]))


_TESTED_MINORS = {torch_minor(v) for v in TESTED_TORCH}


def check_torch_internals(version: str | None = None, drift: tuple[Drift, ...] | None = None) -> tuple[Drift, ...]:
    """Judges the installed torch (Note [Checking torch's internals]); the package runs it once, at import.

    Args:
        version: the torch version to judge; ``torch.__version__`` if None.
        drift: :func:`find_drift`'s answer; the installed torch's (as found at import: :data:`DRIFT`) if None.

    Returns:
        The internals that changed (each switched its feature off).

    Raises:
        ImportError: an internal the subclass needs to be a FakeTensorMode at all changed (``Feature.RULES``).

    Warns:
        TorchDriftWarning: other internals changed; names each and what the package switched off.
        UntestedTorchWarning: ``version``'s major.minor is none of :data:`TESTED_TORCH`'s.
    """
    version = str(torch.__version__) if version is None else version
    drift = DRIFT if drift is None else drift
    fatal = [d for d in drift if d.feature is Feature.RULES]
    if fatal:
        raise ImportError(
            f"torch_cachepolicy: torch {version} changed a private internal this package builds on: {fatal[0]}. "
            f"Without it the package cannot apply the rules registered for torch's FakeTensorMode. {ADVICE}"
        )
    if drift:
        off = switched_off(drift)
        changes = "; ".join(str(d) for d in drift)
        what = "; ".join(feature.value for feature in Feature if feature in off)
        warnings.warn(
            f"torch_cachepolicy: torch {version} changed private internals this package builds on ({changes}). "
            f"Switched off: {what}. Everything else works as stock FakeTensorMode does. {ADVICE}",
            TorchDriftWarning,
            stacklevel=3,
        )
    if torch_minor(version) not in _TESTED_MINORS:
        warnings.warn(
            f"torch_cachepolicy: torch {version} is none of the releases the package is tested on "
            f"({', '.join(TESTED_TORCH)}). The private internals it uses were checked at import, but their behaviour "
            "is untested on this version; run the package's tests before relying on it.",
            UntestedTorchWarning,
            stacklevel=3,
        )
    return drift


DRIFT: tuple[Drift, ...] = find_drift()
"""The internals that changed on the installed torch, found once at import."""

_OFF = switched_off(DRIFT)


def off(feature: Feature) -> str | None:
    """Why ``feature`` is switched off on the installed torch (the change that did it), or None if it is on."""
    d = _OFF.get(feature)
    return None if d is None else f"torch {torch.__version__} changed {d}"


# ------------------------------------------------------------------ configs

# Note [Reading a config on the hit path]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# A torch config read costs ~3 us (the config module's __getattr__), more than the rest of a hit. Its value is the
# env override, else the (context-local) user override, else the env default, else the default (ConfigModule's
# __getattr__, whose names _INTERNALS holds); env values are fixed at import, so a read is one ContextVar.get. An
# entry read another way (an alias, a justknob, hidden, an override that is no ContextVar) keeps the module's own
# read. test_fidelity.py compares the two.
_UNSET: Any = getattr(importlib.import_module("torch.utils._config_module"), "_UNSET_SENTINEL", object())


def config_reader(module: Any, name: str) -> Callable[[], Any]:
    """A cheap read of the config ``module.name`` (Note [Reading a config on the hit path])."""
    entry: Any = getattr(module, "_config", {}).get(name)
    simple = entry is not None and entry.alias is None and entry.justknob is None and not entry.hide
    if not (simple and callable(getattr(entry.user_override, "get", None))):
        return lambda: getattr(module, name, None)
    if entry.env_value_force is not _UNSET:
        forced = entry.env_value_force
        return lambda: forced
    override, default = entry.user_override, entry.default if entry.env_value_default is _UNSET else entry.env_value_default

    def read() -> Any:
        value = override.get()
        return default if value is _UNSET else value

    return read


# ------------------------------------------------------------------ gates


def code_names(fn: Any) -> frozenset[str]:
    """The names ``fn``'s bytecode refers to, its nested functions' included."""
    names: set[str] = set()
    codes = [fn.__code__]
    while codes:
        code = codes.pop()
        names.update(code.co_names)
        codes.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
    return frozenset(names)


# The names torch 2.13-2.15's FakeTensor.__new__ uses; _synth.FakeTensors does its work for a hit. A torch whose
# constructor uses any other name (a new step) keeps its own constructor for every hit.
_CONSTRUCTOR_NAMES = frozenset(
    {
        "AssertionError", "CapturedTraceback", "FakeTensor", "FakeTensorConfig", "FakeTensorMode", "Tensor",
        "TypeError", "ValueError", "_C", "_FAKE_TENSOR_CONSTRUCTOR_IGNORED_STATE_ATTRS",
        "_allow_unsafe_data_ptr_access", "_debug_trace", "_is_param", "_make_subclass", "_normalize_fake_device",
        "_set_throw_on_mutable_data_ptr", "_set_warn_deprecated_on_mutable_data_ptr", "allow_meta", "cast",
        "constant", "debug", "device", "dict", "dispatch_keys", "extract", "fake_device", "fake_mode",
        "isinstance", "item_memo", "iter", "nested_int_memo", "next", "nonzero_memo", "object", "pop", "pytype",
        "real_tensor", "requires_grad", "str", "torch", "type", "unique_consecutive_memo", "unique_memo",
    }
)  # fmt: skip

FAKE_TENSOR_CONSTRUCTOR_KNOWN: bool = code_names(_ft.FakeTensor.__new__) == _CONSTRUCTOR_NAMES
"""Whether ``FakeTensor.__new__`` is the known one (Note [A hit's FakeTensor] in ``_synth.py``)."""

SYNTHESIS_TAKES_FUNC: bool = "func" in inspect.signature(_ft.FakeTensorMode._output_from_cache_entry).parameters
"""Whether ``_output_from_cache_entry`` takes ``func`` before ``args`` (torch 2.13, 2.14) or not (2.15)."""


def _memory_format_order() -> list[str]:
    # Which of the two names extract_tensor_metadata uses first; see SYMBOLIC_KEYS.
    if off(Feature.NATIVE) is not None:  # extract_tensor_metadata may be gone
        return []
    return [
        ins.argval
        for ins in dis.get_instructions(_ft.extract_tensor_metadata)
        if ins.argval in ("suggest_memory_format", "_has_symbolic_sizes_strides")
    ]


_ORDER = _memory_format_order()

SYMBOLIC_KEYS: bool = "suggest_memory_format" in _ORDER and "_has_symbolic_sizes_strides" in _ORDER
"""Whether the C++ key builder may build keys with symbolic values.

torch's ``extract_tensor_metadata`` drops a symbolic-size tensor's memory format; the builder mirrors it only while
that code reads ``suggest_memory_format`` and ``_has_symbolic_sizes_strides`` (Note [Symbolic keys], keybuilder.cpp)."""

SYMBOLIC_MEMORY_FORMAT_GUARDS: bool = SYMBOLIC_KEYS and _ORDER.index("suggest_memory_format") < _ORDER.index(
    "_has_symbolic_sizes_strides"
)
"""Whether ``extract_tensor_metadata`` computes a symbolic tensor's memory format
before dropping it (torch 2.13: the computation may guard) or not at all (2.14, 2.15)."""

log.debug(
    "torch %s: features off %s; gates FAKE_TENSOR_CONSTRUCTOR_KNOWN=%s SYMBOLIC_KEYS=%s "
    "SYMBOLIC_MEMORY_FORMAT_GUARDS=%s SYNTHESIS_TAKES_FUNC=%s",
    torch.__version__, {f.name: str(d) for f, d in _OFF.items()}, FAKE_TENSOR_CONSTRUCTOR_KNOWN, SYMBOLIC_KEYS,
    SYMBOLIC_MEMORY_FORMAT_GUARDS, SYNTHESIS_TAKES_FUNC,
)
