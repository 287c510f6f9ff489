"""The kernel in effect: the sources stock's fake dispatch consults, and what an entry belongs to.

:data:`SOURCES` lists them with how an entry accounts for each, held to torch's code at import
(:func:`check_sources`). :class:`KernelDeps` reads the ``Coverage.SUB`` sources on every backend-op
dispatch: the key of the sub-table the op's entries live in.
"""

# Note [The kernel in effect]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~
# An entry answers for "the kernel stock's fake dispatch would run for this call, and what it returns". Stock
# picks it from many places: rules for the FakeTensorMode class, its handler tables, the register_fake registry,
# a config, Python decompositions and metas, py_impl kernels (per dispatch key, under the Python dispatcher), the
# dispatcher's kernels, the mode's settings. SOURCES lists them in stock's order (read from the torch 2.13-2.15
# functions in CONSULTED), each with its Coverage: applied before the cache where stock applies it, watched by
# the sub-table (a change starts afresh), in the key, a bypass, fixed per operator, or off every entry's path.
#
# unlisted_names() returns each name a CONSULTED function's bytecode uses that is neither a source's nor in
# PLUMBING (logging, pytree, builtins, ...). check_sources() runs it at import: on a torch consulting an unlisted
# name, no backend or higher-order op is cached (with a warning) rather than risk stale entries. test_fidelity.py
# holds the list to the supported torches and shows that removing any source is noticed.
#
# What the kernel itself reads beyond its arguments is its business: ambient state declared through
# CachePolicy.context_key, and what the miss-time verification compares
# (Note [Verify every entry on the miss that creates it] in _verify.py).

from __future__ import annotations

import enum
import functools
import importlib
import inspect
import logging
import warnings
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
import torch._decomp
from torch._library import custom_ops as _custom_ops
from torch._ops import OpOverload
from torch._subclasses import fake_impls as _fake_impls
from torch._subclasses import fake_tensor as _ft

from torch_cachepolicy import _keyset, _reasons
from torch_cachepolicy._compat import ADVICE, Feature, UnlistedKernelSourceWarning, code_names, config_reader, off
from torch_cachepolicy._symbols import knowledge

if TYPE_CHECKING:
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    from torch_cachepolicy.policy import CachePolicy

log = logging.getLogger(__name__)
_StockMode = _ft.FakeTensorMode
# Why backend and higher-order ops are not cached on this torch (a changed internal), or None.
_BACKEND_OFF = off(Feature.BACKEND)


class Coverage(enum.Enum):
    """How a policy mode's cache entry accounts for one source."""

    APPLIED = "applied before the cache, where stock applies it"
    SUB = "watched by the entry's sub-table: a change selects another, empty one"
    KEY = "in the cache key, or a bypass decided by it"
    BYPASS = "the dispatch bypasses the cache while it is in effect"
    FIXED = "fixed per operator (schema, tags, namespace): decided once, in the route"
    UNCACHED = "read only on paths that never make an entry (constants, real tensors)"
    UNREACHED = "belongs to a dispatch key fake dispatch never resolves"
    CACHE = "stock's cache machinery, replaced by the mode's own"


@dataclass(frozen=True)
class Source:
    """One thing stock's fake dispatch consults on its way to (or instead of) the fake kernel.

    Attributes:
        what: what it is, for people.
        names: the names torch's bytecode reads it by.
        coverage: how an entry accounts for it.
        how: where the package does so.
    """

    what: str
    names: tuple[str, ...]
    coverage: Coverage
    how: str


CONSULTED: tuple[tuple[str, str], ...] = (
    # Called by the dispatcher (C++) before the mode's __torch_dispatch__.
    ("torch._library.simple_registry", "find_torch_dispatch_rule"),
    ("torch._ops", "HigherOrderOperator.dispatch"),
    ("torch._subclasses.fake_tensor", "FakeTensorMode.__torch_dispatch__"),
    ("torch._subclasses.fake_tensor", "FakeTensorMode.dispatch"),
    ("torch._subclasses.fake_tensor", "FakeTensorMode._cached_dispatch_impl"),
    ("torch._subclasses.fake_tensor", "FakeTensorMode._dispatch_impl"),
    ("torch._subclasses.fake_tensor", "FakeTensorMode.cpp_meta_supports_symint"),
    ("torch._subclasses.fake_tensor", "FakeTensorMode.can_run_unsafe_fallback"),
    ("torch._subclasses.fake_impls", "has_meta"),
    ("torch._library.utils", "can_generate_trivial_fake_impl"),
    ("torch._ops", "OpOverload.decompose"),
    # The Python dispatcher's choice of kernel for a dispatch key.
    ("torch._ops", "OpOverload._get_dispatch"),
    ("torch._ops", "resolve_key"),
)
"""The functions of stock's fake dispatch whose names :func:`unlisted_names` reads."""

SOURCES: tuple[Source, ...] = (
    Source(
        "a rule registered for the FakeTensorMode class (torch.library.register_torch_dispatch), which the "
        "dispatcher calls instead of __torch_dispatch__, looked up by the mode's exact type",
        ("torch_dispatch_rules",), Coverage.APPLIED,
        "_rules.dispatch calls the rule registered for stock's class first, never cached (stock never caches it "
        "either); KernelDeps.table_key watches it for enclosing entries",
    ),
    Source(
        "a higher-order operator's rule for the FakeTensorMode class (py_impl(FakeTensorMode), register_fake for "
        "HOPs), looked up by the mode's exact type",
        ("python_key_table", "supports_higher_order_operators", "dispatch_functorch",
         "FuncTorchDynamicLayerFrontMode"), Coverage.APPLIED,
        "_rules.dispatch forwards to the rule of stock's class (Note [HOPs under a subclass])",
    ),
    Source(
        "stock dispatch's own tables: ops answered from metadata, ops run directly",
        ("_DISPATCH_META_HANDLERS", "_DISPATCH_HANDLE_DIRECTLY"), Coverage.APPLIED,
        "every op goes through stock's dispatch, which serves them before the cache",
    ),
    Source(
        "the mode's cache switch (torch._dynamo.config.fake_tensor_cache_enabled at construction)",
        ("cache_enabled",), Coverage.APPLIED,
        "read as stock reads it; off means no lookup at all",
    ),
    Source(
        "unrecognized tensor subclasses and non-fake tensors among the arguments",
        ("_check_for_subclass", "_check_for_subclass_arg", "validate_and_convert_non_fake_tensors"), Coverage.KEY,
        "torch's key bypasses non-fake tensors, fakes of other modes and subclasses",
    ),
    Source(
        "the sparse-invariants switch (torch.sparse.check_sparse_tensor_invariants), turned off around the kernel "
        "when an argument is sparse (torch 2.15)",
        ("sparse", "check_sparse_tensor_invariants", "is_enabled"), Coverage.KEY,
        "torch's key bypasses sparse arguments",
    ),
    Source(
        "lift ops (torch.tensor's lift_fresh)",
        ("lift_fns",), Coverage.KEY,
        "torch's validation bypasses them ('lift')",
    ),
    Source(
        "constant propagation: FakeTensors with constants, ops allowing numbers as tensors, ops that move devices "
        "under avoid_device_init, and the constants a write invalidates",
        ("constant", "should_allow_numbers_as_tensors", "may_turn_const", "from_real_tensor",
         "fake_tensor_converter", "invalidate_constant_aliases", "invalidate_written_to_constants",
         "avoid_device_init", "_to_copy", "device_put", "nondeterministic_seeded", "inplace_view", "detach_",
         "_nested_tensor_from_tensor_list"), Coverage.UNCACHED,
        "arguments and outputs with constants bypass (torch's key and output validation)",
    ),
    Source(
        "fake functions registered for higher-order operators (register_fake on a HOP)",
        ("registered_hop_fake_fns", "ignore_fresh_unbacked_symbols"), Coverage.APPLIED,
        "higher-order ops bypass a policy mode's cache (Note [Higher-order ops bypass]); torch's rule is called",
    ),
    Source(
        "propagate_real_tensors: the real kernel runs beside the fake one, its outputs can replace the fake ones, a "
        "fake kernel may be inferred from them, unbacked values are recorded",
        ("propagate_real_tensors", "real_tensor", "real_obj", "MutationChecker", "check",
         "check_aliasing_constraint", "backed_var_to_val", "real_tensor_prop_unbacked_vals",
         "set_real_tensor_prop_unbacked_vals", "compute_unbacked_bindings",
         "_maybe_infer_fake_kernel_from_pytree_out", "generate_fake_kernels_from_real_mismatches",
         "has_fake_kernel", "inferred_fake_kernel_from_real_out", "dtrace_structured",
         # torch 2.15 propagates strides and offsets of strided tensors only (t.layout == torch.strided).
         "layout", "strided"), Coverage.BYPASS,
        "backend ops bypass while mode.propagate_real_tensors is set; builtin ops behave as stock",
    ),
    Source(
        "fast implementations of aten ops for symbolic inputs (fake_impls.get_fast_op_impls)",
        ("get_fast_op_impls",), Coverage.SUB,
        "symbolic_table_key",
    ),
    Source(
        "a Python meta function (torch._decomp.meta_table)",
        ("meta_table",), Coverage.SUB,
        "KernelDeps.table_key",
    ),
    Source(
        "the C++ meta kernels that support symbolic shapes (a set of aten ops: on the mode class before torch 2.15, "
        "in torch._meta_registrations since), and ops with special unbacked handling",
        ("cpp_meta_supports_symint", "_cpp_meta_supports_symint", "cpp_meta_supports_symint_ops",
         "torch._meta_registrations", "view_copy", "_unbacked_special_fake_handling_ops"), Coverage.FIXED,
        "a set of aten ops and the op's tags: fixed per operator",
    ),
    Source(
        "a Python decomposition (torch._decomp.decomposition_table), preferred for symbolic inputs and for torch's "
        "own decompositions",
        ("decomposition_table", "torch_decomp_decompositions", "is_sparse_any"), Coverage.SUB,
        "KernelDeps.table_key",
    ),
    Source(
        "the CompositeImplicitAutograd decomposition (OpOverload.decompose): a py_impl(CIA) kernel, else the "
        "dispatcher's CIA kernel",
        ("decompose",), Coverage.SUB,
        "KernelDeps.table_key: py_kernels, and _keyset.kernel_watch (which watches CIA)",
    ),
    Source(
        "a prim's meta implementation",
        ("prim_meta_impl", "stride_incorrect_op"), Coverage.FIXED,
        "prims only (a builtin namespace): cached as stock caches it",
    ),
    Source(
        "a custom-ops profile (torch._dynamo.config._custom_ops_profile), whose generic kernel replaces an op's "
        "fake kernel",
        ("_custom_ops_profile", "generic_fake_kernel", "MissingOpProfile"), Coverage.BYPASS,
        "a backend op the active profile covers bypasses (profiled)",
    ),
    Source(
        "the fake kernel registered with torch.library.register_fake (or a custom_op's register_fake)",
        ("fake_impl", "kernel"), Coverage.SUB,
        "KernelDeps.table_key: the registered function, and a custom_op's current fake function",
    ),
    Source(
        "fake implementations registered with fake_impls.register_op_impl: by a check (a list), or for an "
        "OpOverload (a dict, reached through the first check of the list)",
        ("op_implementations_checks",), Coverage.SUB,
        "KernelDeps.table_key: the implementations whose check accepts the op, and the op's entry in the dict",
    ),
    Source(
        "a trivial fake kernel for ops returning nothing or only out= arguments",
        ("can_generate_trivial_fake_impl", "generate_trivial_fake_impl"), Coverage.FIXED,
        "decided by the schema and namespace",
    ),
    Source(
        "whether the dispatcher has a Meta kernel for the op (fake_impls.has_meta)",
        ("has_meta", "_dispatch_has_computed_kernel_for_dispatch_key"), Coverage.SUB,
        "_keyset.kernel_watch: the op's Meta and composite kernels",
    ),
    Source(
        "the unsafe fallback to a real kernel (allow_fallback_kernels, a few namespaces)",
        ("can_run_unsafe_fallback", "run_fallback_kernel", "allow_fallback_kernels",
         "_can_run_unsafe_fallback_allowed_namespaces"), Coverage.SUB,
        "for ops of those namespaces the mode's allow_fallback_kernels joins the sub-table (table_key)",
    ),
    Source(
        "the dispatcher's kernels for the fake tensor's keys (Meta, composite), and the Python dispatcher's choice "
        "among py_impl kernels and the dispatcher's for each dispatch key",
        ("py_kernels", "resolve_key", "has_kernel_for_dispatch_key", "has_kernel_for_any_dispatch_key",
         "_dispatch_has_kernel_for_dispatch_key", "_dispatch_cache"), Coverage.SUB,
        "KernelDeps.table_key: every py_impl kernel of the op, whether the Python dispatcher is on (for an op with "
        "py_impl kernels: the dispatcher's choice for one without is the same either way), and _keyset.kernel_watch",
    ),
    Source(
        "the backend fallback kernel of the Meta key (the one torch registers, which raises)",
        ("_dispatch_has_backend_fallback",), Coverage.BYPASS,
        "reached only by backend ops with no Meta, composite or fake kernel: their static-shape misses bypass "
        "(KernelDeps.runs_backend_fallback)",
    ),
    Source(
        "dispatch keys above the Python key: PreDispatch modes, the functionalization crossref",
        ("PreDispatch", "_len_torch_dispatch_stack_pre_dispatch", "_pop_mode_from_pre_dispatch",
         "_set_mode_pre_dispatch", "_get_current_dispatch_mode_pre_dispatch", "handle_dispatch_mode",
         "Functionalize", "CROSSREF_FUNCTIONALIZE", "make_crossref_functionalize"), Coverage.UNREACHED,
        "resolved before the mode is reached, never inside its dispatch",
    ),
    Source(
        "operators taking torchbind objects (TorchBindOpOverload), dispatched in Python",
        ("TorchBindOpOverload", "FakeScriptObject"), Coverage.KEY,
        "an argument whose content the key cannot see bypasses unless its type is declared immutable "
        "(_key_extension.check_visible, Note [Arguments the key cannot see])",
    ),
    Source(
        "mkldnn tensors converted to dense (torch 2.14, 2.15)",
        ("maybe_to_dense_mkldnn", "to_dense"), Coverage.FIXED,
        "aten.to_dense only (fake mkldnn arguments bypass in torch's key, and in the C++ key builder's)",
    ),
    Source(
        "stock's cache: key, validation, entries, storage, counters, crosscheck",
        ("_cached_dispatch_impl", "_cache_key", "_make_cache_entry", "_output_from_cache_entry",
         "_crosscheck_cache_output", "cache", "fake_tensor_cache", "cache_hits", "cache_misses", "cache_bypasses",
         "_set_cache_key", "_set_cache_key_for_shape_env", "_CacheKeyState", "cache_on_shape_env",
         "_DispatchCacheBypassEntry", "_BypassDispatchCache", "reason", "disable_fake_tensor_cache",
         "cache_crosscheck_enabled", "hc_log",
         # torch 2.15 crosschecks a hit with proxy tracing off.
         "fx", "experimental", "proxy_tensor", "disable_proxy_modes_tracing"), Coverage.CACHE,
        "the mode overrides _cached_dispatch_impl (_driver.cached_dispatch) and reuses the rest; its crosscheck, "
        "too, runs with proxy tracing off",
    ),
)
"""Every source, in the order stock's dispatch consults them."""

PLUMBING: frozenset[str] = frozenset(
    {
        # Python builtins and exceptions.
        *("AssertionError", "Exception", "NotImplemented", "NotImplementedError", "RuntimeError", "TypeError"),
        *("ZeroDivisionError", "all", "any", "hasattr", "id", "isinstance", "len", "object", "str", "tuple"),
        *("type", "zip", "cast", "__name__", "__qualname__", "__torch_dispatch__"),
        # Modules and namespaces the code walks through to reach a name listed above.
        *("torch", "_C", "_ops", "ops", "aten", "prims", "default", "utils", "library_utils", "_library"),
        *("simple_registry", "_dynamo", "_functorch", "config", "_subclasses", "fake_tensor", "python"),
        *("_python_dispatch", "contextlib", "sympy", "pytree"),
        *("torch._decomp", "torch._dispatch.python", "torch._higher_order_ops.utils"),
        *("torch.fx.experimental.symbolic_shapes", "torch.utils._python_dispatch"),
        # Lookups whose result is a registry entry or a field listed above.
        *("singleton", "find", "get", "name", "namespace", "_name", "_schema", "returns", "tags", "Tag"),
        *("is_builtin", "is_inplace", "is_mutable", "is_out", "DispatchKey", "Python", "Undefined"),
        *("Autograd", "AutogradOther", "CompositeExplicitAutograd", "CompositeExplicitAutogradNonFunctional"),
        *("CompositeImplicitAutograd", "CompositeImplicitAutogradNestedTensor", "FuncTorchBatchedDecomposition"),
        *("_dispatch_autogradother_backends", "_dispatch_get_backend_keyset_from_autograd", "is_included_in_alias"),
        *("_to_functionality_key", "_dispatch_tls_is_dispatch_key_excluded", "_get_overloaded_args"),
        # Calling the chosen kernel, and the mode and context it runs in.
        *("dispatch", "_dispatch_impl", "_op_dk", "_dispatch", "add_cached_op", "in_kernel_invocation_manager"),
        *("no_dispatch", "FakeImplCtx", "set_ctx_getter", "nullcontext", "contextmanager", "_pop_mode_temporarily"),
        *("_get_current_dispatch_mode", "_get_dispatch_mode", "_TorchDispatchModeKey", "FAKE", "fake_mode"),
        *("_disabled_torch_dispatch_impl", "is_our_fake", "shape_env", "args", "kwargs", "_P", "_T"),
        # What the kernel's output is checked and wrapped with (the device logic reads only the arguments).
        *("wrap_meta_outputs_with_default_device_logic", "UnsupportedOperatorException", "device", "clone"),
        # Types and symbolic values the code tests arguments for.
        *("FakeTensor", "FakeTensorMode", "Tensor", "OpOverload", "HigherOrderOperator", "SymInt"),
        *("py_sym_types", "_has_symbolic_sizes_strides", "free_unbacked_symbols", "node", "expr", "pytype"),
        *("xreplace", "Eq", "Symbol", "lhs", "rhs", "size", "stride", "storage_offset", "data"),
        # pytree.
        *("tree_flatten", "tree_unflatten", "tree_leaves", "tree_map_", "tree_map_only"),
        # Logging.
        *("log", "debug", "exception", "not_implemented_log", "logging", "DEBUG", "getEffectiveLevel"),
        *("IncrementRecursionCount", "RECURSION_COUNT"),
    }
)
"""Names in :data:`CONSULTED` that choose no kernel: plumbing around the sources."""


def consulted_names(consulted: Iterable[tuple[str, str]] = CONSULTED) -> dict[str, frozenset[str]]:
    """``{"module.qualname": names its bytecode (and its nested functions') refer to}``."""
    out = {}
    for module, path in consulted:
        obj: object = importlib.import_module(module)
        for part in path.split("."):
            obj = getattr(obj, part)
        function = inspect.unwrap(obj)  # type: ignore[arg-type]
        out[f"{module}.{path}"] = code_names(function)
    return out


def unlisted_names(
    sources: Iterable[Source] | None = None,
    plumbing: frozenset[str] | None = None,
    consulted: Mapping[str, frozenset[str]] | None = None,
) -> dict[str, list[str]]:
    """The names stock's dispatch refers to that no source and no plumbing entry accounts for.

    Args:
        sources: the sources to hold torch's code to; :data:`SOURCES` if None.
        plumbing: the names that choose nothing; :data:`PLUMBING` if None.
        consulted: :func:`consulted_names`'s answer, if already known.

    Returns:
        ``{"module.qualname": sorted names}`` per :data:`CONSULTED` function with any; empty when complete.
    """
    listed = set(PLUMBING if plumbing is None else plumbing)
    for source in SOURCES if sources is None else sources:
        listed.update(source.names)
    names = consulted_names() if consulted is None else consulted
    return {where: sorted(found - listed) for where, found in names.items() if found - listed}


_unlisted: dict[str, list[str]] = {}


def check_sources(sources: Iterable[Source] | None = None) -> None:
    """Checks :data:`SOURCES` (or ``sources``) against this torch's code; warns if a name is unlisted.

    Run at import (Note [The kernel in effect]); until it passes, backend and higher-order ops bypass the cache.
    """
    unlisted = unlisted_names(sources)
    _unlisted.clear()
    _unlisted.update(unlisted)
    if unlisted:
        where = "; ".join(f"{name}: {', '.join(found)}" for name, found in sorted(unlisted.items()))
        log.debug("unlisted kernel sources: %s", where)
        warnings.warn(
            f"torch_cachepolicy: the fake dispatch of torch {torch.__version__} consults names this package's "
            f"list of kernel sources does not know ({where}). Backend and higher-order operators are not cached "
            f"(each bypass says why) until the package knows them. {ADVICE}",
            UnlistedKernelSourceWarning,
            stacklevel=2,
        )


def trusted() -> bool:
    """Whether backend and higher-order ops may be cached: every source this torch's dispatch consults is listed,
    and no internal their entries rest on changed (``_compat.Feature.BACKEND``)."""
    return not _unlisted and _BACKEND_OFF is None


def distrusted_reason() -> str:
    """The bypass reason while :func:`trusted` is False."""
    if _BACKEND_OFF is not None:
        return _BACKEND_OFF
    return _reasons.distrusted(sorted({name for found in _unlisted.values() for name in found}))


def render_table() -> str:
    """:data:`SOURCES` as a Markdown table (docs/guide.md carries it; a test keeps the two equal)."""
    lines = ["| # | source | how an entry accounts for it |", "| --- | --- | --- |"]
    for i, source in enumerate(SOURCES, 1):
        lines.append(f"| {i} | {source.what} | {source.coverage.value}: {source.how} |")
    return "\n".join(lines)


# ------------------------------------------------------------ the reader

_fake_registry = torch._library.simple_registry.singleton
_decomposition_table = torch._decomp.decomposition_table
_meta_table = torch._decomp.meta_table
_op_implementations = _fake_impls.op_implementations_checks
_op_implementation_of = _fake_impls.op_implementations_dict
# Read on every hit of a backend op with py_impl kernels (and by _rules per dispatch): bound once.
tls_key_included = torch._C._dispatch_tls_is_dispatch_key_included
PYTHON_DISPATCHER = torch._C.DispatchKey.PythonDispatcher


class TableKey(NamedTuple):
    """What a backend op's entries depend on beyond the key (:meth:`KernelDeps.table_key`): one sub-table each.

    Attributes:
        context: the policy's ``context_key()`` for an op that uses it, else None.
        fake_impl, custom_op_fake, kernels: the registered fake impl, a custom_op's fake function, the fingerprint
            of the dispatcher's Meta/composite kernels.
        hop_rule, rule: rules for stock's FakeTensorMode class (``python_key_table``, ``register_torch_dispatch``).
        py_kernels, python_dispatcher: the op's py_impl kernels and, for an op with any, whether the Python
            dispatcher is on.
        meta, decomposition, impls, impl_of: a Python meta, a decomposition, the register_op_impl implementations.
        profile: the custom-ops profile covering the op (None if none).
        allow_fallback_kernels: the mode's, for an op stock may run a real kernel for (else None).
    """

    context: Hashable
    fake_impl: object
    custom_op_fake: object
    kernels: object
    hop_rule: object
    rule: object
    py_kernels: object
    python_dispatcher: object
    meta: object
    decomposition: object
    impls: object
    impl_of: object
    profile: object
    allow_fallback_kernels: bool | None


# Made on every backend hit: tuple.__new__ (C) rather than the NamedTuple's keyword constructor (Python).
_table_key = functools.partial(tuple.__new__, TableKey)


class KernelDeps:
    """What a backend operator's entries depend on beyond the key: where its kernels come from."""

    # Note [Entries belong to a fake kernel]
    # ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    # A backend may re-register the kernel fake dispatch runs (a new library version, a test swapping it), or
    # register one in a registry stock consults first. Old entries must not answer for the new kernel, so every
    # Coverage.SUB source selects the sub-table (Note [Sub-tables] in store.py), next to the policy's context: a
    # register_fake impl, a custom_op's fake (swapped behind one fixed registered wrapper), the dispatcher's Meta
    # and composite kernels, a rule for the FakeTensorMode class, every py_impl kernel and, for an op with any,
    # whether the Python dispatcher (which prefers them) is on, a Python meta, a decomposition, a register_op_impl
    # implementation, a covering custom-ops profile, and, if stock may run a real kernel for the op,
    # allow_fallback_kernels. The functions held live only as long as the store.

    __slots__ = ("_impls", "fallback_capable", "fingerprint", "func", "holder", "opdef", "py_kernels",
                 "python_key_table", "rules", "uses_context")  # fmt: skip

    def __init__(self, func: OpOverload, rules: Any, uses_context: bool, fallback_capable: bool) -> None:
        self.func = func
        # find() creates the entry if missing, as stock's _dispatch_impl does, so a fake impl registered later
        # lands in the holder we keep (registry entries are never removed).
        self.holder = _fake_registry.find(func.name()).fake_impl
        self.opdef = _custom_ops.OPDEFS.get(func._schema.name)
        self.fingerprint = _keyset.kernel_watch(func).fingerprint
        self.uses_context = uses_context
        self.python_key_table = func.python_key_table
        self.py_kernels = func.py_kernels
        self.rules = rules
        self.fallback_capable = fallback_capable
        # (len(op_implementations_checks), kernels' fingerprint, accepted impls); refreshed when either changes.
        self._impls: tuple[int, object, tuple[Any, ...]] = (-1, None, ())

    def table_key(self, policy: CachePolicy, allow_fallback_kernels: bool) -> TableKey:
        """The sources' current values (and ``policy``'s context if the op uses it): the op's sub-table key."""
        kernel = self.holder.kernel
        func = self.func
        kernels_now = self.fingerprint()
        count, kernels_then, impls = self._impls
        if count != len(_op_implementations) or kernels_then != kernels_now:
            impls = self._op_impls(kernels_now)
        profile = custom_ops_profile()
        rules = self.rules
        py_kernels = self.py_kernels
        return _table_key((
            context_value(policy, func) if self.uses_context else None,
            None if kernel is None else kernel.func,
            None if self.opdef is None else self.opdef._abstract_fn,
            kernels_now,
            self.python_key_table.get(_StockMode),
            rules.get(_StockMode) if rules else None,
            # py_kernels is tested first: DispatchKey hashes slowly.
            tuple(py_kernels.items()) if py_kernels else None,
            # Without py_impl kernels the Python dispatcher runs what the dispatcher would (inner ops keep their
            # own entries: Note [Entries cover inner ops]); ExportPass toggles it, so the flag would split entries.
            tls_key_included(PYTHON_DISPATCHER) if py_kernels else None,
            _meta_table.get(func),  # type: ignore[call-overload]
            _decomposition_table.get(func),  # type: ignore[call-overload]
            impls,
            _op_implementation_of.get(func),  # type: ignore[call-overload]
            None if profile is None or func not in profile.data else profile,
            allow_fallback_kernels if self.fallback_capable else None,
        ))

    def _op_impls(self, kernels_now: int) -> tuple[Any, ...]:
        # Checks read only the op (name, tags, schema, Meta kernel): answers hold while list length and kernels do.
        impls = tuple(impl for check, impl in list(_op_implementations) if check(self.func))
        self._impls = (len(_op_implementations), kernels_now, impls)
        return impls

    def runs_backend_fallback(self) -> bool:
        """Whether static-shape fake dispatch of the op can reach the Meta backend fallback.

        An op with no Meta, composite or fake kernel (admitted for a decomposition, used for symbolic inputs only)
        runs the Meta key's fallback on static inputs: a kernel of the key, not the op, that nothing watches.
        """
        return self.holder.kernel is None and self.fingerprint() == _keyset.NO_KERNEL


def context_value(policy: CachePolicy, func: object) -> Hashable:
    """``policy.context_key()``, with an exception re-raised naming the hook and the op."""
    try:
        return policy.context_key()
    except Exception as e:
        raise RuntimeError(
            f"torch_cachepolicy.CachePolicy.context_key(): raised {e!r} while dispatching {func}; "
            "it must return a value in every context the policy's modes dispatch a backend operator in"
        ) from e


def profiled(table_key: TableKey) -> bool:
    """Whether a custom-ops profile replaces the fake kernel of the op of this :meth:`KernelDeps.table_key`."""
    return table_key.profile is not None


def symbolic_table_key(func: object, table_key: Hashable, shape_env: ShapeEnv, symbols: Iterable[Any]) -> Hashable:
    """:meth:`KernelDeps.table_key` for a key holding ``symbols``.

    Adds what the ShapeEnv knows of them (Note [What the ShapeEnv knows]) and the op's fast implementation,
    which fake dispatch prefers for symbolic inputs.
    """
    known = knowledge(shape_env, symbols)
    return (table_key, known, _fake_impls.get_fast_op_impls().get(func))  # type: ignore[call-overload]


# Read on every backend hit (Note [Reading a config on the hit path] in _compat.py).
custom_ops_profile = config_reader(torch._dynamo.config, "_custom_ops_profile")
"""``torch._dynamo.config._custom_ops_profile``, cheaply."""


check_sources()
