"""The private torch internals this package builds on, checked once at import.

Note [Checking torch's internals]
The mode subclasses torch's ``FakeTensorMode`` and calls, overrides and reads
private parts of it (``_cache_key``, ``_make_cache_entry``, the entry
dataclasses, ...). A torch release may rename them, reorder their
parameters or change what they return, and the failure would then surface
deep inside a dispatch, far from its cause. So at import we check each
internal in :data:`_INTERNALS`: that it exists, the parameter names of every
function we call or override (exactly, for overrides: torch calls those with
its own arguments), the fields of every dataclass we read or build, and,
where it costs microseconds and changes nothing in torch, its behaviour
(``_DispatchCacheKey`` equality and hashing, ``_CacheKeyState``'s fresh
state, ...). An internal that drifted raises ImportError naming it and the
supported torch range. A torch outside that range whose internals all check
out imports with an :class:`UntestedTorchWarning`: the check cannot see
every behaviour, so untested means untested.

``test/test_compat.py`` checks that every private torch name the package's
source refers to is listed here; add an entry with each new one.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import logging
import re
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard

import torch
from torch._subclasses import fake_tensor as _ft

__all__ = [
    "SUPPORTED_TORCH",
    "TESTED_TORCH",
    "UnlistedKernelSourceWarning",
    "UntestedTorchWarning",
    "check_torch_internals",
    "is_fake_tensor",
]

SUPPORTED_TORCH = ">=2.13,<2.15"
"""The torch releases the package supports, as a pip version specifier."""

TESTED_TORCH = ("2.13.0", "2.14.1")
"""The torch releases CI runs the tests on."""

# SUPPORTED_TORCH as (major, minor) bounds: lower inclusive, upper exclusive.
_LOWER, _UPPER = (2, 13), (2, 15)

_ADVICE = (
    f"torch_cachepolicy supports torch{SUPPORTED_TORCH} (tested on {' and '.join(TESTED_TORCH)}); "
    f'install one of those, e.g. pip install "torch{SUPPORTED_TORCH}"'
)


class UntestedTorchWarning(UserWarning):
    """The installed torch is outside the range the package is tested on."""


# ------------------------------------------------------------------ checks


@dataclass(frozen=True)
class _Internal:
    """One private torch internal and what the package relies on about it.

    Attributes:
        module: the module that defines it.
        path: the attribute path inside ``module`` (``"Class.method"``).
        params: the leading parameter names of a function we call (of its
            constructor, for a class); later parameters must have defaults,
            so torch may add optional ones.
        overridden: ``params`` must match exactly, because we override the
            function and torch calls our version with its own arguments.
        keywords: parameter names we pass by keyword, anywhere in the signature.
        fields: the dataclass fields we read or construct, in order
            (construction is positional).
        refers_to: attribute names the function at ``path`` must use (checked
            in its bytecode): those an ``__init__`` assigns and we read from
            instances, or storage torch's code reads where ours does too.
        check: behaviour; returns what is wrong, or None.
    """

    module: str
    path: str
    params: tuple[str, ...] | None = None
    overridden: bool = False
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
    # Entries are looked up in plain dicts of ours by these keys, and
    # keyparts.extend_key rebuilds a key from `.key`.
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
    # keyset's Python fallback fingerprints an op's fake kernels by the
    # "<Key>: registered at ..." lines of this dump.
    lines = fn("aten::add.Tensor").splitlines()
    if not any(line.startswith("Meta: registered at ") for line in lines):
        return "no longer lists aten::add.Tensor's kernels as 'Meta: registered at ...'"
    return None


def _check_fake_impl_holder(cls: Any) -> str | None:
    # mode.py keeps an op's holder and reads `.kernel.func` on each route.
    if cls("tcp_compat::probe").kernel is not None:
        return "a new holder already has a kernel"
    return None


def _check_redirect_to_mode(fn: Any) -> str | None:
    # mode._redirects_to_mode recognizes the rules it makes by their qualname.
    names = [getattr(c, "co_qualname", None) for c in fn.__code__.co_consts if inspect.iscode(c)]
    if "redirect_to_mode.<locals>.impl" not in names:
        return "no longer defines redirect_to_mode.<locals>.impl"
    return None


def _returns_mapping(fn: Any) -> str | None:
    return _is_type(Mapping)(fn())


def _check_profile_entry(config: Any) -> str | None:
    # routes.custom_ops_profile reads this entry's env override, user
    # override, env default and default, in the config module's order; an
    # alias, a justknob or hiding would add steps it does not take.
    entry = config.get("_custom_ops_profile")
    if entry is None:
        return "has no _custom_ops_profile entry"
    if entry.alias is not None or entry.justknob is not None or entry.hide:
        return "reads _custom_ops_profile through an alias, a justknob or hides it"
    if not callable(getattr(entry.user_override, "get", None)):
        return "keeps the user override of _custom_ops_profile otherwise than in a ContextVar"
    return None


def _check_shape_env_state(cls: Any) -> str | None:
    from torch_cachepolicy.safety import shape_env_state

    try:
        before = shape_env_state(cls())
    except AttributeError as e:
        return f"instances lack an attribute safety.shape_env_state reads ({e})"
    return None if all(isinstance(v, int) for v in before) else "has a non-int counter or size"


def _check_python_key_table(cls: Any) -> str | None:
    # Every operator, HOPs included, has one (read by mode.dispatch).
    return _is_type(dict)(cls().python_key_table)


_FT = "torch._subclasses.fake_tensor"
_MODE = "FakeTensorMode"
_DISPATCH = ("self", "func", "types", "args", "kwargs")

_INTERNALS: tuple[_Internal, ...] = (
    # FakeTensorMode: what the subclass overrides, calls and reads.
    _Internal(
        _FT,
        f"{_MODE}.__init__",
        params=("self",),
        keywords=("allow_fallback_kernels", "allow_non_fake_inputs", "shape_env", "static_shapes", "export"),
        refers_to=(
            "allow_fallback_kernels",
            "propagate_real_tensors",
            "cache_enabled",
            "cache_crosscheck_enabled",
            "fake_tensor_converter",
            "shape_env",
            # export.py sets it as torch.export's make_fake_inputs has it set.
            "_allow_unsafe_data_ptr_access",
        ),
    ),
    _Internal(_FT, f"{_MODE}.dispatch", params=_DISPATCH, overridden=True),
    # Note [Entering the hit path directly] (mode.py) reads stock dispatch's
    # tables and logger; it compares dispatch's code names itself.
    _Internal(_FT, "_DISPATCH_META_HANDLERS", check=_is_type(dict)),
    _Internal(_FT, "_DISPATCH_HANDLE_DIRECTLY", check=_is_type(Mapping)),
    _Internal(_FT, "log", check=_is_type(logging.Logger)),
    # An OpOverload's FakeTensorMode rule applies only under the Python
    # dispatcher (mode.py, dispatch).
    _Internal("torch._C", "_dispatch_tls_is_dispatch_key_included"),
    # Our entries for stock ops go where stock puts them: the class-global
    # `cache`, or `shape_env.fake_tensor_cache` for keys holding symbols.
    _Internal(
        _FT,
        f"{_MODE}._cached_dispatch_impl",
        params=_DISPATCH,
        overridden=True,
        refers_to=("cache", "fake_tensor_cache"),
    ),
    _Internal(_FT, f"{_MODE}._validate_cache_key", params=("self", "func", "args", "kwargs"), overridden=True),
    _Internal(_FT, f"{_MODE}.cache_info", params=(), overridden=True),
    _Internal(_FT, f"{_MODE}.cache_clear", params=(), overridden=True),
    _Internal(_FT, f"{_MODE}._dispatch_impl", params=_DISPATCH),
    _Internal(_FT, f"{_MODE}._cache_key", params=("self", "state", "func", "args", "kwargs")),
    _Internal(_FT, f"{_MODE}._make_cache_entry", params=("self", "state", "key", "func", "args", "kwargs", "output")),
    _Internal(_FT, f"{_MODE}._output_from_cache_entry", params=("self", "state", "entry", "key", "func", "args")),
    # Hashes a GraphModule (and the callables wrapping one) by id; mode.py
    # evicts such keys when the object dies.
    _Internal(_FT, f"{_MODE}._prep_args_for_hash", params=("self", "result", "args", "state", "id_hashed_objects")),
    _Internal(_FT, f"{_MODE}.from_tensor", params=("self", "tensor")),
    _Internal(_FT, f"{_MODE}.cache", check=_is_type(dict)),
    _Internal(_FT, "FakeTensorConverter.__init__", keywords=("export",), refers_to=("export",)),
    # The cache's data types.
    _Internal(_FT, "_DispatchCacheKey", params=("tup",), check=_check_cache_key),
    _Internal(_FT, "_DispatchCacheKey.strip_shape_env", params=("self",)),
    _Internal(_FT, "FakeTensor"),
    _Internal(_FT, "_DispatchCacheValidEntry", fields=("output_infos", "is_output_tuple")),
    _Internal(_FT, "_DispatchCacheEntryOutputInfo", fields=("inplace_idx", "metadata", "view_idx", "constant_value")),
    _Internal(_FT, "_DispatchCacheBypassEntry", fields=("reason",), check=_check_reason),
    _Internal(_FT, "_BypassDispatchCache", fields=("reason",), check=_check_bypass_exception),
    _Internal(_FT, "DispatchCacheInfo", fields=("hits", "misses", "bypasses", "size")),
    _Internal(
        "torch._subclasses._fake_tensor_utils",
        "_CacheKeyState",
        params=("shape_env",),
        check=_check_key_state,
    ),
    _Internal("torch._subclasses._fake_tensor_utils", "_CacheKeyState.cache_on_shape_env", params=("self",)),
    # keybuilder builds symbolic keys as convert_sym_int and
    # extract_tensor_metadata do (Note [Symbolic keys] in csrc/keybuilder.cpp);
    # it reads from extract_tensor_metadata's code whether it computes the
    # memory format of a tensor with symbolic sizes.
    _Internal(
        "torch._subclasses._fake_tensor_utils",
        "_CacheKeyState.convert_sym_int",
        params=("self", "result", "arg"),
        refers_to=("sym_node_lookup", "known_symbols", "shape_env", "free_symbols", "_InputBackref", "_PySymInputStub"),
    ),
    _Internal("torch._subclasses._fake_tensor_utils", "_PySymInputStub", fields=("value",)),
    # synth.stub_symint_output keeps a bare SymInt output as torch keeps a tensor output's sizes.
    _Internal("torch._subclasses._fake_tensor_utils", "_SymIntOutputStub.__init__", params=("self", "value", "key_path")),
    _Internal("torch._subclasses._fake_tensor_utils", "_SymIntOutputStub.extract", params=("self", "key", "shape_env")),
    _Internal("torch._subclasses._fake_tensor_utils", "_InputBackref", fields=("value",)),
    _Internal(_FT, "extract_tensor_metadata", params=("t",)),
    _Internal(_FT, "suggest_memory_format", params=("x",)),
    # Functions.
    _Internal(_FT, "disable_fake_tensor_cache", params=("fake_mode",)),
    _Internal(_FT, "unset_fake_temporarily", params=()),
    _Internal(_FT, "maybe_get_fake_mode", params=("t",)),
    _Internal("torch._subclasses.meta_utils", "assert_metadata_eq", params=("assert_eq", "m1", "m2")),
    _Internal("torch._subclasses.meta_utils", "assert_eq", params=("a", "b")),
    # Operators and the registries of their fake kernels.
    _Internal("torch._ops", "OpOverload", check=_check_opoverload),
    _Internal("torch._ops", "OperatorBase", check=_check_python_key_table),
    _Internal("torch._ops", "HigherOrderOperator"),
    _Internal("torch._ops", "_OpNamespace"),
    _Internal("torch._library.simple_registry", "singleton"),
    _Internal("torch._library.simple_registry", "SimpleLibraryRegistry.find", params=("self", "qualname")),
    _Internal("torch._library.simple_registry", "SimpleLibraryRegistry.get", params=("self", "qualname")),
    _Internal(
        "torch._library.simple_registry",
        "SimpleOperatorEntry.__init__",
        refers_to=("fake_impl", "torch_dispatch_rules"),
    ),
    # Rules for the FakeTensorMode class (Note [Rules for the FakeTensorMode class]).
    _Internal(
        "torch._library.simple_registry",
        "GenericTorchDispatchRuleHolder.find",
        params=("self", "torch_dispatch_class"),
        refers_to=("_data",),
    ),
    # routes keep the holder's dict: register and deregister change it in place.
    _Internal(
        "torch._library.simple_registry",
        "GenericTorchDispatchRuleHolder.register",
        params=("self", "torch_dispatch_class", "func"),
        refers_to=("_data",),
    ),
    _Internal(
        "torch._library.simple_registry",
        "find_torch_dispatch_rule",
        params=("op", "torch_dispatch_class"),
        refers_to=("torch_dispatch_rules", "__qualname__"),
    ),
    # Sources routes.kernel_sub watches (Note [The kernel in effect]).
    _Internal("torch._subclasses.fake_impls", "op_implementations_checks", check=_is_type(list)),
    _Internal("torch._subclasses.fake_impls", "op_implementations_dict", check=_is_type(dict)),
    _Internal("torch._subclasses.fake_impls", "get_fast_op_impls", params=(), check=_returns_mapping),
    _Internal(_FT, f"{_MODE}.can_run_unsafe_fallback", params=("self", "func")),
    _Internal(_FT, f"{_MODE}._can_run_unsafe_fallback_allowed_namespaces"),
    # routes.custom_ops_profile reads the config entry as the config module does.
    _Internal("torch._dynamo.config", "_config", check=_check_profile_entry),
    _Internal(
        "torch.utils._config_module",
        "ConfigModule.__getattr__",
        refers_to=("env_value_force", "user_override", "env_value_default", "justknob", "hide"),
    ),
    _Internal("torch.utils._config_module", "_UNSET_SENTINEL"),
    # synth.FakeTensors makes a hit's FakeTensor as FakeTensor.__new__ does
    # (it also compares that constructor's names, Note [A hit's FakeTensor]).
    _Internal("torch", "Tensor._make_subclass"),
    _Internal("torch._C", "_set_throw_on_mutable_data_ptr"),
    _Internal("torch._C", "_set_warn_deprecated_on_mutable_data_ptr"),
    _Internal(_FT, "FakeTensorConfig.debug", check=_is_type(bool)),
    # hitpath / csrc/hitpath.cpp (Note [The hit in one native call]): a key
    # made by filling _DispatchCacheKey's two slots (hitpath.key_slots reads
    # its __init__ too), and get_proxy_mode's state read where get_proxy_mode
    # reads it (hitpath.proxy_mode_readable compares the code's names).
    _Internal(_FT, "_DispatchCacheKey.__init__", params=("self", "tup"), refers_to=("key", "hashvalue")),
    _Internal("torch.fx.experimental.proxy_tensor", "get_proxy_mode", params=()),
    _Internal("torch._ops", "_get_dispatch_mode_pre_dispatch", params=("mode_key",)),
    _Internal("torch._ops", "mode_stack_state_for_pre_dispatch", params=()),
    _Internal("torch._ops", "_ModeStackStateForPreDispatch.get", params=("self", "index")),
    _Internal("torch._ops", "_mode_stack_state_for_pre_dispatch"),
    # hitpath.compare: the dispatch keys of two outputs.
    _Internal("torch._C", "_dispatch_keys"),
    _Internal(_FT, f"{_MODE}.__init__", refers_to=("_allow_unsafe_data_ptr_access", "allow_meta")),
    # safety.shape_env_state.
    _Internal("torch.fx.experimental.symbolic_shapes", "ShapeEnv", check=_check_shape_env_state),
    _Internal("torch._library.fake_impl", "FakeImplHolder", params=("qualname",), check=_check_fake_impl_holder),
    _Internal("torch._library.utils", "Kernel", fields=("func",)),
    _Internal("torch._library.utils", "is_builtin", params=("op",)),
    _Internal("torch._library.custom_ops", "CustomOpDef"),
    _Internal("torch._library.custom_ops", "OPDEFS", check=_is_type(Mapping)),
    _Internal("torch._decomp", "decomposition_table", check=_is_type(dict)),
    # Python-level kernels that fake dispatch prefers; mode._sub watches them.
    _Internal("torch._decomp", "meta_table", check=_is_type(dict)),
    _Internal("torch._ops", "OperatorBase.__init__", refers_to=("py_kernels", "python_key_table")),
    _Internal("torch._library.custom_ops", "CustomOpDef.register_fake", refers_to=("_abstract_fn",)),
    # Bumped whenever the ShapeEnv learns something (Note [What the ShapeEnv knows]).
    _Internal(
        "torch.fx.experimental.symbolic_shapes",
        "ShapeEnv._update_version_counter",
        params=("self",),
        refers_to=("_version_counter",),
    ),
    _Internal("torch._C", "_dispatch_has_kernel_for_dispatch_key"),
    _Internal("torch._C", "_dispatch_find_schema_or_throw"),
    _Internal("torch._C", "_dispatch_dump", check=_check_dispatch_dump),
    _Internal("torch._C", "DispatchKey"),
    # The key builder (keybuilder.py, csrc/keybuilder.cpp) reproduces the key
    # _cache_key builds from these: its prefix, and each tensor's metadata
    # fields in this order (Note [What the key builder reproduces]).
    _Internal("torch._C", "_get_default_device"),
    _Internal(
        _FT,
        "TensorMetadata",
        fields=(
            "dtype",
            "shape",
            "stride",
            "device",
            "layout",
            "memory_format",
            "storage_offset",
            "storage_bytes",
            "requires_grad",
            "is_quantized",
            "is_conj",
            "is_neg",
            "is_inference",
            "is_sparse",
            "is_coalesced",
            "dense_dim",
            "sparse_dim",
        ),
    ),
    _Internal(_FT, "extract_tensor_metadata", params=("t",)),
    # export.py: torch.export.export traces under the fake mode of an active
    # TracingContext (make_fake_inputs); its check of lifted fake constants
    # is re-run on the result (Note [Exporting under a TracingContext]).
    _Internal("torch._guards", "TracingContext", params=("fake_mode",)),
    _Internal("torch._guards", "TracingContext.try_get", params=()),
    _Internal("torch._guards", "tracing", params=("context",)),
    _Internal("torch._guards", "detect_fake_mode", params=("inputs",)),
    _Internal("torch.export._trace", "_is_bogus_const_name", params=("name",)),
    _Internal("torch._export.config", "error_on_lifted_constant_tensors", check=_is_type(bool)),
    # Higher-order operators.
    _Internal("torch._higher_order_ops.utils", "registered_hop_fake_fns", check=_is_type(Mapping)),
    _Internal("torch._higher_order_ops.utils", "redirect_to_mode", params=("hop", "mode"), check=_check_redirect_to_mode),
    _Internal("torch._higher_order_ops.utils", "SubgraphCallableWrapper.__init__", refers_to=("subgraph",)),
    _Internal(
        "torch._higher_order_ops.auto_functionalize",
        "FunctionalCallableWithEpilogue.__init__",
        refers_to=("orig_callable",),
    ),
)


def _resolve(internal: _Internal) -> object:
    obj: object = importlib.import_module(internal.module)
    for part in internal.path.split("."):
        obj = getattr(obj, part)
    return obj


def _render(names: tuple[str, ...] | list[str]) -> str:
    return "(" + ", ".join(names) + ")"


def _drift(internal: _Internal, obj: Any) -> str | None:
    """What about ``obj`` no longer matches ``internal``, or None."""
    if internal.params is not None or internal.keywords:
        params = list(inspect.signature(obj).parameters.values())
        names = [p.name for p in params]
        if internal.params is not None:
            expected = internal.params
            if internal.overridden:
                if tuple(names) != expected:
                    return f"takes {_render(names)}, expected exactly {_render(expected)} (the package overrides it)"
            elif tuple(names[: len(expected)]) != expected or any(
                p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params[len(expected) :]
            ):
                return f"takes {_render(names)}, expected {_render([*expected, '...'])}"
        missing = [k for k in internal.keywords if k not in names]
        if missing:
            return f"takes {_render(names)}, without the keyword arguments {_render(missing)}"
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


def _torch_minor(version: str) -> tuple[int, int] | None:
    match = re.match(r"(\d+)\.(\d+)", version)
    return None if match is None else (int(match[1]), int(match[2]))


def check_torch_internals(version: str | None = None) -> None:
    """Checks the private internals of the installed torch, then its version.

    See Note [Checking torch's internals].

    Args:
        version: the torch version to judge; ``torch.__version__`` if None.

    Raises:
        ImportError: an internal is missing or changed; the message names it
            and the supported range.

    Warns:
        UntestedTorchWarning: every internal checks out but ``version`` is
            outside :data:`SUPPORTED_TORCH`.
    """
    version = str(torch.__version__) if version is None else version
    for internal in _INTERNALS:
        try:
            problem = _drift(internal, _resolve(internal))
        except Exception as e:  # a missing attribute, or a behaviour check that raised
            problem = f"cannot be used ({e!r})"
        if problem is not None:
            raise ImportError(
                f"torch_cachepolicy: torch {version} changed a private internal this package builds on: "
                f"{internal.name} {problem}. {_ADVICE}"
            )
    _check_kernel_sources(version)
    minor = _torch_minor(version)
    if minor is None or not _LOWER <= minor < _UPPER:
        warnings.warn(
            f"torch_cachepolicy: torch {version} is outside the tested range torch{SUPPORTED_TORCH} "
            f"(tested on {' and '.join(TESTED_TORCH)}). The private internals the package uses check "
            "out, but their behaviour is untested on this version; run the package's tests before "
            "relying on it.",
            UntestedTorchWarning,
            stacklevel=3,
        )


class UnlistedKernelSourceWarning(UserWarning):
    """This torch's fake dispatch consults a source the package does not list; backend ops go uncached."""


def _check_kernel_sources(version: str) -> None:
    # See Note [The kernel in effect] (kernels.py).
    from torch_cachepolicy import kernels

    unlisted = kernels.unlisted_names()
    kernels.distrust(unlisted)
    if unlisted:
        where = "; ".join(f"{name}: {', '.join(found)}" for name, found in sorted(unlisted.items()))
        warnings.warn(
            f"torch_cachepolicy: the fake dispatch of torch {version} consults names this package's list of "
            f"kernel sources does not know ({where}). Backend and higher-order operators are not cached "
            f"(each bypass says why) until the package knows them. {_ADVICE}",
            UnlistedKernelSourceWarning,
            stacklevel=4,
        )


# --------------------------------------------------------------- FakeTensor


def _is_python_fake_tensor(x: object) -> TypeGuard[torch.Tensor]:
    return isinstance(x, _ft.FakeTensor)


# Note [Which fake tensors]
# torch 2.14 adds fake tensors implemented in C++, which are not instances of
# the Python FakeTensor class, and `fake_tensor.is_fake_tensor` to ask about
# both. Where the package asks "is this a fake tensor" (storages, aliasing),
# it uses torch's predicate when present; on 2.13 only the Python class exists.
# Sites that read attributes only the Python class has (`.fake_mode`,
# `.constant`) keep isinstance(x, FakeTensor), as torch's own code does.
is_fake_tensor: Callable[[object], TypeGuard[torch.Tensor]] = getattr(
    _ft, "is_fake_tensor", _is_python_fake_tensor
)
