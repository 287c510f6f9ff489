"""The kernel in effect: every source stock's fake dispatch consults, and how an entry accounts for it.

Note [The kernel in effect]
~~~~~~~~~~~~~~~~~~~~~~~~~~~
A cache entry answers for "the kernel stock's fake dispatch would run for
this call, and what it returns". Stock does not pick that kernel from one
registry: on its way from the mode's ``__torch_dispatch__`` to the kernel
call it consults rules registered for the ``FakeTensorMode`` class, its
own handler tables, the register_fake registry, a config, Python
decompositions and meta functions, ``py_impl`` kernels (for every dispatch
key, under the Python dispatcher), the dispatcher's kernels, and the mode's
settings. :data:`SOURCES` lists them in the order stock consults them (read
from torch 2.13/2.14: the functions in :data:`CONSULTED`), each with how a
policy mode's entry accounts for it (:class:`Coverage`): applied before the
cache exactly where stock applies it, watched by the entry's sub-table (a
change starts afresh), part of the key, a bypass, fixed per operator, or
read only on paths no entry is made from.

The list is derived from torch's code and checked against it:
:func:`unlisted_names` reads the bytecode of every function in
:data:`CONSULTED` and returns each name it refers to that is neither a
source's nor in :data:`PLUMBING` (names that choose nothing: logging,
pytree, builtins, exceptions). ``_compat.check_torch_internals`` runs it at
import; on a torch whose dispatch consults a name this list lacks, the mode
caches no backend op (and no higher-order op) at all, with a warning, rather
than serving entries a new source could make stale. ``test_compat.py`` holds
the list to the supported torches and shows that removing a source is
noticed.

What the kernel itself reads beyond its arguments is the kernel's business:
ambient state declared through ``CachePolicy.context_key``, and everything
the miss-time verification compares (Note [Verify every entry on the miss
that creates it]).
"""

from __future__ import annotations

import enum
import importlib
import inspect
import types
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

__all__ = [
    "CONSULTED",
    "PLUMBING",
    "SOURCES",
    "Coverage",
    "Source",
    "consulted_names",
    "distrust",
    "distrusted_reason",
    "render_table",
    "trusted",
    "unlisted_names",
]


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
        names: the names torch's code uses to read it (as its bytecode refers to them).
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
        "a rule registered for the FakeTensorMode class (torch.library.register_torch_dispatch), "
        "which the dispatcher calls instead of __torch_dispatch__, looked up by the mode's exact type",
        ("torch_dispatch_rules",),
        Coverage.APPLIED,
        "FakeTensorMode.dispatch calls the rule registered for stock's class first, never cached "
        "(stock never caches it either); routes.kernel_sub watches it for enclosing entries",
    ),
    Source(
        "a higher-order operator's rule for the FakeTensorMode class (py_impl(FakeTensorMode), "
        "register_fake for HOPs), looked up by the mode's exact type",
        ("python_key_table", "supports_higher_order_operators", "dispatch_functorch", "FuncTorchDynamicLayerFrontMode"),
        Coverage.APPLIED,
        "FakeTensorMode.dispatch forwards to the rule of stock's class (Note [HOPs under a subclass])",
    ),
    Source(
        "stock dispatch's own tables: ops answered from metadata, ops run directly",
        ("_DISPATCH_META_HANDLERS", "_DISPATCH_HANDLE_DIRECTLY"),
        Coverage.APPLIED,
        "stock's dispatch serves them; the direct hit path is taken only for ops in neither table",
    ),
    Source(
        "the mode's cache switch (torch._dynamo.config.fake_tensor_cache_enabled at construction)",
        ("cache_enabled",),
        Coverage.APPLIED,
        "read as stock reads it; off means no lookup at all",
    ),
    Source(
        "unrecognized tensor subclasses and non-fake tensors among the arguments",
        ("_check_for_subclass", "_check_for_subclass_arg", "validate_and_convert_non_fake_tensors"),
        Coverage.KEY,
        "torch's key bypasses non-fake tensors, fakes of other modes and subclasses",
    ),
    Source(
        "lift ops (torch.tensor's lift_fresh)",
        ("lift_fns",),
        Coverage.KEY,
        "torch's validation bypasses them ('lift')",
    ),
    Source(
        "constant propagation: FakeTensors with constants, ops allowing numbers as tensors, "
        "ops that move devices under avoid_device_init, and the constants a write invalidates",
        (
            "constant",
            "should_allow_numbers_as_tensors",
            "may_turn_const",
            "from_real_tensor",
            "fake_tensor_converter",
            "invalidate_constant_aliases",
            "invalidate_written_to_constants",
            "avoid_device_init",
            "_to_copy",
            "device_put",
            "nondeterministic_seeded",
            "inplace_view",
            "detach_",
            "_nested_tensor_from_tensor_list",
        ),
        Coverage.UNCACHED,
        "arguments and outputs with constants bypass (torch's key and output validation)",
    ),
    Source(
        "fake functions registered for higher-order operators (register_fake on a HOP)",
        ("registered_hop_fake_fns", "ignore_fresh_unbacked_symbols"),
        Coverage.APPLIED,
        "the HOP route: torch's rule is called, its entry keyed by the subgraph and checked as torch checks it",
    ),
    Source(
        "propagate_real_tensors: the real kernel runs beside the fake one, its outputs can replace "
        "the fake ones, a fake kernel may be inferred from them, unbacked values are recorded",
        (
            "propagate_real_tensors",
            "real_tensor",
            "real_obj",
            "MutationChecker",
            "check",
            "check_aliasing_constraint",
            "backed_var_to_val",
            "real_tensor_prop_unbacked_vals",
            "set_real_tensor_prop_unbacked_vals",
            "compute_unbacked_bindings",
            "_maybe_infer_fake_kernel_from_pytree_out",
            "generate_fake_kernels_from_real_mismatches",
            "has_fake_kernel",
            "inferred_fake_kernel_from_real_out",
            "dtrace_structured",
        ),
        Coverage.BYPASS,
        "backend and higher-order ops bypass while mode.propagate_real_tensors is set; "
        "builtin ops behave as stock",
    ),
    Source(
        "fast implementations of aten ops for symbolic inputs (fake_impls.get_fast_op_impls)",
        ("get_fast_op_impls",),
        Coverage.SUB,
        "routes.symbolic_sub",
    ),
    Source(
        "a Python meta function (torch._decomp.meta_table)",
        ("meta_table",),
        Coverage.SUB,
        "routes.kernel_sub",
    ),
    Source(
        "the C++ meta kernels that support symbolic shapes, and ops with special unbacked handling",
        ("cpp_meta_supports_symint", "_cpp_meta_supports_symint", "view_copy", "_unbacked_special_fake_handling_ops"),
        Coverage.FIXED,
        "a set of aten ops and the op's tags: fixed per operator",
    ),
    Source(
        "a Python decomposition (torch._decomp.decomposition_table), preferred for symbolic inputs "
        "and for torch's own decompositions",
        ("decomposition_table", "torch_decomp_decompositions", "is_sparse_any"),
        Coverage.SUB,
        "routes.kernel_sub",
    ),
    Source(
        "the CompositeImplicitAutograd decomposition (OpOverload.decompose): a py_impl(CIA) kernel, "
        "else the dispatcher's CIA kernel",
        ("decompose",),
        Coverage.SUB,
        "routes.kernel_sub: py_kernels, and keyset.kernel_watch (which watches CIA)",
    ),
    Source(
        "a prim's meta implementation",
        ("prim_meta_impl", "stride_incorrect_op"),
        Coverage.FIXED,
        "prims only (a builtin namespace): cached as stock caches it",
    ),
    Source(
        "a custom-ops profile (torch._dynamo.config._custom_ops_profile), whose generic kernel "
        "replaces an op's fake kernel",
        ("_custom_ops_profile", "generic_fake_kernel", "MissingOpProfile"),
        Coverage.BYPASS,
        "a backend op the active profile covers bypasses (routes.profiled)",
    ),
    Source(
        "the fake kernel registered with torch.library.register_fake (or a custom_op's register_fake)",
        ("fake_impl", "kernel"),
        Coverage.SUB,
        "routes.kernel_sub: the registered function, and a custom_op's current fake function",
    ),
    Source(
        "fake implementations registered with fake_impls.register_op_impl: by a check (a list), or "
        "for an OpOverload (a dict, reached through the first check of the list)",
        ("op_implementations_checks",),
        Coverage.SUB,
        "routes.kernel_sub: the implementations whose check accepts the op, and the op's entry in the dict",
    ),
    Source(
        "a trivial fake kernel for ops returning nothing or only out= arguments",
        ("can_generate_trivial_fake_impl", "generate_trivial_fake_impl"),
        Coverage.FIXED,
        "decided by the schema and namespace",
    ),
    Source(
        "whether the dispatcher has a Meta kernel for the op (fake_impls.has_meta)",
        ("has_meta", "_dispatch_has_computed_kernel_for_dispatch_key"),
        Coverage.SUB,
        "keyset.kernel_watch: the op's Meta and composite kernels",
    ),
    Source(
        "the unsafe fallback to a real kernel (allow_fallback_kernels, a few namespaces)",
        ("can_run_unsafe_fallback", "run_fallback_kernel", "allow_fallback_kernels", "_can_run_unsafe_fallback_allowed_namespaces"),
        Coverage.SUB,
        "for ops of those namespaces the mode's allow_fallback_kernels joins the sub-table",
    ),
    Source(
        "the dispatcher's kernels for the fake tensor's keys (Meta, composite), and the Python "
        "dispatcher's choice among py_impl kernels and the dispatcher's for each dispatch key",
        (
            "py_kernels",
            "resolve_key",
            "has_kernel_for_dispatch_key",
            "has_kernel_for_any_dispatch_key",
            "_dispatch_has_kernel_for_dispatch_key",
            "_dispatch_cache",
        ),
        Coverage.SUB,
        "routes.kernel_sub: every py_impl kernel of the op, whether the Python dispatcher is on "
        "(for an op with py_impl kernels: the dispatcher's choice for one without is the same either way), "
        "and keyset.kernel_watch",
    ),
    Source(
        "the backend fallback kernel of the Meta key (torch's raises; a Library's fallback() replaces it)",
        ("_dispatch_has_backend_fallback",),
        Coverage.BYPASS,
        "reached only by backend ops with no Meta, composite or fake kernel: their static-shape misses "
        "bypass (routes.runs_backend_fallback)",
    ),
    Source(
        "dispatch keys above the Python key: PreDispatch modes, the functionalization crossref",
        (
            "PreDispatch",
            "_len_torch_dispatch_stack_pre_dispatch",
            "_pop_mode_from_pre_dispatch",
            "_set_mode_pre_dispatch",
            "_get_current_dispatch_mode_pre_dispatch",
            "handle_dispatch_mode",
            "Functionalize",
            "CROSSREF_FUNCTIONALIZE",
            "make_crossref_functionalize",
        ),
        Coverage.UNREACHED,
        "resolved before the mode is reached, never inside its dispatch",
    ),
    Source(
        "operators taking torchbind objects (TorchBindOpOverload), dispatched in Python",
        ("TorchBindOpOverload", "FakeScriptObject"),
        Coverage.KEY,
        "an argument whose content the key cannot see bypasses unless its type is declared "
        "immutable (keyparts, Note [Arguments the key cannot see])",
    ),
    Source(
        "mkldnn tensors converted to dense (torch 2.14)",
        ("maybe_to_dense_mkldnn", "to_dense"),
        Coverage.FIXED,
        "aten.to_dense only",
    ),
    Source(
        "stock's cache: key, validation, entries, storage, counters, crosscheck",
        (
            "_cached_dispatch_impl",
            "_cache_key",
            "_make_cache_entry",
            "_output_from_cache_entry",
            "_crosscheck_cache_output",
            "cache",
            "fake_tensor_cache",
            "cache_hits",
            "cache_misses",
            "cache_bypasses",
            "_set_cache_key",
            "_set_cache_key_for_shape_env",
            "_CacheKeyState",
            "cache_on_shape_env",
            "_DispatchCacheBypassEntry",
            "_BypassDispatchCache",
            "reason",
            "disable_fake_tensor_cache",
            "cache_crosscheck_enabled",
            "hc_log",
        ),
        Coverage.CACHE,
        "the mode overrides _cached_dispatch_impl and reuses the rest (docs/design.md)",
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


def _code_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _code_names(const)
    return names


def consulted_names(consulted: Iterable[tuple[str, str]] = CONSULTED) -> dict[str, frozenset[str]]:
    """``{"module.qualname": names its bytecode (and its nested functions') refer to}``."""
    out = {}
    for module, path in consulted:
        obj: object = importlib.import_module(module)
        for part in path.split("."):
            obj = getattr(obj, part)
        function = inspect.unwrap(obj)  # type: ignore[arg-type]
        out[f"{module}.{path}"] = frozenset(_code_names(function.__code__))
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
        ``{"module.qualname": sorted names}`` for each function of
        :data:`CONSULTED` with such names; empty when the list is complete.
    """
    listed = set(PLUMBING if plumbing is None else plumbing)
    for source in SOURCES if sources is None else sources:
        listed.update(source.names)
    names = consulted_names() if consulted is None else consulted
    return {where: sorted(found - listed) for where, found in names.items() if found - listed}


_distrusted: dict[str, list[str]] = {}


def distrust(unlisted: Mapping[str, list[str]]) -> None:
    """Records that this torch consults sources the list lacks (see :func:`trusted`)."""
    _distrusted.clear()
    _distrusted.update(unlisted)


def trusted() -> bool:
    """Whether every source this torch's dispatch consults is listed.

    When not, routes send every backend and higher-order op around the cache.
    """
    return not _distrusted


def distrusted_reason() -> str:
    """The bypass reason while :func:`trusted` is False."""
    names = sorted({name for found in _distrusted.values() for name in found})
    return f"torch consults kernel sources this package does not list ({', '.join(names)})"


def render_table() -> str:
    """:data:`SOURCES` as a Markdown table (docs/guide.md carries it; a test keeps the two equal)."""
    lines = ["| # | source | how an entry accounts for it |", "| --- | --- | --- |"]
    for i, source in enumerate(SOURCES, 1):
        lines.append(f"| {i} | {source.what} | {source.coverage.value}: {source.how} |")
    return "\n".join(lines)
