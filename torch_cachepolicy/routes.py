"""How a policy mode treats each operator: its route, and what its entries depend on.

A mode computes one :class:`Route` per operator (and policy identity) with
:func:`route_for`: which storage its dispatches use, and, for operators
outside aten/prim/prims, the registries whose kernels its entries belong to
(:func:`kernel_sub`, Note [Entries belong to a fake kernel]).
"""

from __future__ import annotations

import contextvars
from collections.abc import Hashable, Iterable, Mapping
from typing import Any

import torch
import torch._decomp
from torch._higher_order_ops.utils import registered_hop_fake_fns
from torch._library import custom_ops as _custom_ops
from torch._ops import OpOverload
from torch._subclasses import fake_impls as _fake_impls
from torch._subclasses import fake_tensor as _ft
from torch.utils import _config_module

from torch_cachepolicy import kernels, keyset
from torch_cachepolicy.keyparts import GENERIC_SLOTS, ArgSlots
from torch_cachepolicy.policy import BUILTIN_NAMESPACES, CachePolicy, decide_memoized, unhashable_part
from torch_cachepolicy.symbols import knowledge

__all__ = [
    "BYPASS",
    "EXCLUDED_BY_RULE",
    "HOP",
    "HOP_SUB",
    "NO_RULES",
    "POLICY",
    "STOCK",
    "STOCK_SUB",
    "SUB_PROFILE",
    "Route",
    "context_value",
    "custom_ops_profile",
    "kernel_sub",
    "profile_covering",
    "python_dispatcher_enabled",
    "torch_dispatch_rule",
    "redirects_to_mode",
    "returns_undeclared_view",
    "runs_backend_fallback",
    "route_for",
    "symbolic_sub",
    "unhashable_context",
]

# Routes: which storage a dispatch of an operator uses.
STOCK = 0  # policy-independent: torch's own storage (or the store when private)
POLICY = 1  # admitted only by the policy: the store, with the extra safety checks
BYPASS = 2  # the policy does not admit it: never looked up anywhere
HOP = 3  # a higher-order operator: torch's rules, keyed by the policy's context

# Sub-tables of a partition for entries that do not depend on a fake kernel.
STOCK_SUB = ("stock",)
HOP_SUB = "hop"

SUB_PROFILE = 12
"""Where :func:`kernel_sub` puts the custom-ops profile covering the op (None if none)."""

EXCLUDED_BY_RULE = frozenset({"denied by policy"})
"""Decision labels of ops an enclosing entry must never replay (Note [Entries cover inner ops])."""

NO_RULES: Mapping[object, Any] = {}
"""Stands for an operator's ``python_key_table`` when it has none."""

_StockMode = _ft.FakeTensorMode
_fake_registry = torch._library.simple_registry.singleton
_decomposition_table = torch._decomp.decomposition_table
_meta_table = torch._decomp.meta_table
_op_implementations = _fake_impls.op_implementations_checks
_op_implementation_of = _fake_impls.op_implementations_dict
# Read on every hit of a backend op: bound once (see python_dispatcher_enabled).
_tls_key_included = torch._C._dispatch_tls_is_dispatch_key_included
_PYTHON_DISPATCHER = torch._C.DispatchKey.PythonDispatcher


class Route:
    """How a mode treats one operator; computed once per op and policy.

    Attributes:
        kind: ``STOCK``, ``POLICY``, ``BYPASS`` or ``HOP``.
        func: the operator.
        label: the bypass reason of a ``BYPASS`` route.
        explicit: allowed by name, so it may mutate its arguments.
        private: entries stay out of torch's storage (Note [Entries that must
            reproduce aliasing]; a failed verification; HOPs).
        taints: denied by the policy; an enclosing entry must not replay
            it (Note [Entries cover inner ops]).
        slots: the arguments the key extension looks at (``POLICY``, ``HOP``).
        backend: for ops outside aten/prim/prims, what their entries depend
            on beyond the key, read by :func:`kernel_sub`: ``(FakeImplHolder,
            CustomOpDef or None, KernelWatch.fingerprint, uses the policy's
            context, func.python_key_table, func.py_kernels, the op's
            torch_dispatch rules)`` (Note [Entries belong to a fake kernel]).
        rules: the op's rules registered with ``register_torch_dispatch``,
            by class: the dict of its registry entry's rule holder, which
            registration and deregistration change in place (None for HOPs).
            Held directly because the hit path reads it on every dispatch.
        fallback_capable: stock may run a real kernel for the op when it
            has no meta kernel, if the mode allows fallback kernels.
        op_impls: ``(len(op_implementations_checks), the op's kernel
            fingerprint, the implementations whose check accepts the op)``,
            refreshed when either changes.
        immutable: the argument types the policy declared immutable.
        stats: the routing mode's counters for the op.
        direct: the mode may enter its hit path directly for the op (Note
            [Entering the hit path directly]).
        native: its static-key hits may take ``_C.HitPath`` (``hitpath``):
            a ``POLICY`` or ``STOCK`` route whose key extension, if any, has
            a common case.
        static: the op's last key built by the Python path held no symbols;
            while it is False the mode does not offer calls to ``_C.HitPath``,
            which declines symbolic keys.
    """

    __slots__ = (
        "backend",
        "direct",
        "explicit",
        "fallback_capable",
        "func",
        "immutable",
        "kind",
        "label",
        "native",
        "op_impls",
        "private",
        "rules",
        "slots",
        "static",
        "stats",
        "taints",
    )

    def __init__(self, kind: int, func: object, label: str = "", *, explicit: bool = False) -> None:
        self.kind = kind
        self.func = func
        self.label = label
        self.explicit = explicit
        self.private = False
        self.taints = False
        self.slots: ArgSlots | None = None
        self.backend: tuple[Any, ...] | None = None
        self.rules: Any = None
        self.fallback_capable = False
        self.op_impls: tuple[int, object, tuple[Any, ...]] = (-1, None, ())
        self.immutable: frozenset[type] = frozenset()
        # Filled in by the mode that routes the op.
        self.stats: Any = None
        self.native = False
        self.static = True
        self.direct = False


def route_for(policy: CachePolicy, func: object) -> tuple[Route, bool]:
    """The route of ``func`` under ``policy``, and whether it may be memoized.

    A route is memoized only when the policy memoized its decision (a "no
    fake kernel" verdict is not: a fake impl may be registered later).
    """
    if not isinstance(func, OpOverload):
        # A HOP. Note [Entries cover inner ops]: an invoke_subgraph entry
        # replays the whole subgraph, so it must carry the subgraph's
        # dependencies, which only our store can hold. Even under a
        # stock-equivalent policy: an entry a stock mode wrote into
        # torch's storage may predate a re-registered kernel inside.
        if not kernels.trusted():
            return Route(BYPASS, func, kernels.distrusted_reason()), True
        route = Route(HOP, func)
        route.private = True
        route.slots = GENERIC_SLOTS
        return route, True
    decision, memoized = decide_memoized(policy, func)
    if not decision.cacheable:
        route = Route(BYPASS, func, decision.label)
        route.taints = decision.label in EXCLUDED_BY_RULE
    elif not kernels.trusted() and func.namespace not in BUILTIN_NAMESPACES:
        # See Note [The kernel in effect].
        route = Route(BYPASS, func, kernels.distrusted_reason())
    elif func.namespace in BUILTIN_NAMESPACES:
        route = Route(STOCK, func, decision.label, explicit=decision.explicit)
        route.private = returns_undeclared_view(func)
    else:
        route = Route(POLICY, func, decision.label, explicit=decision.explicit)
        route.private = True
        route.slots = ArgSlots(func)
        route.immutable = policy.immutable_types
    # find() creates the registry entry if missing, as torch's own
    # _dispatch_impl does for every op it runs a fake kernel for, so a fake
    # impl or a rule registered later lands in the entry we keep (entries
    # are never removed from the registry).
    entry = _fake_registry.find(func.name())
    route.rules = entry.torch_dispatch_rules._data
    route.fallback_capable = _StockMode.can_run_unsafe_fallback(_FALLBACK_PROBE, func)  # type: ignore[arg-type]
    if func.namespace not in BUILTIN_NAMESPACES:
        route.backend = (
            entry.fake_impl,
            _custom_ops.OPDEFS.get(func._schema.name),
            keyset.kernel_watch(func).fingerprint,
            policy.uses_context(func),
            func.python_key_table,
            func.py_kernels,
            route.rules,
        )
    return route, memoized


class _FallbackProbe:
    """Stands in for a mode allowing fallback kernels, to ask stock's
    ``can_run_unsafe_fallback`` whether an op could fall back at all."""

    allow_fallback_kernels = True
    _can_run_unsafe_fallback_allowed_namespaces = _StockMode._can_run_unsafe_fallback_allowed_namespaces


_FALLBACK_PROBE = _FallbackProbe()


def kernel_sub(route: Route, policy: CachePolicy) -> Hashable:
    """What a backend op's entries depend on beyond the key, now.

    Note [Entries belong to a fake kernel]
    A backend may re-register the kernel fake dispatch runs (a newer
    library version, a test that swaps it), or register one in a registry
    stock consults before it. Entries computed by the old kernel must not
    answer for the new one, so every source Note [The kernel in effect]
    marks Coverage.SUB selects the sub-table, next to the policy's context
    (Note [Sub-tables]): a register_fake impl, a custom_op's register_fake
    (which swaps the function behind one fixed registered wrapper), the
    dispatcher's Meta and composite kernels (Library.impl), a rule for the
    FakeTensorMode class (register_torch_dispatch, py_impl(FakeTensorMode)),
    every py_impl kernel and, for an op that has any, whether the Python
    dispatcher (which prefers them to the dispatcher's) is on, a Python
    meta, a decomposition, an
    implementation registered with fake_impls.register_op_impl, and a
    custom-ops profile covering the op. Holding the functions keeps them
    alive only as long as the store.
    """
    holder, opdef, fingerprint, uses_context, python_key_table, py_kernels, rules = route.backend  # type: ignore[misc]
    kernel = holder.kernel
    func = route.func
    kernels_now = fingerprint()
    count, kernels_then, impls = route.op_impls
    if count != len(_op_implementations) or kernels_then != kernels_now:
        impls = _op_impls(route, kernels_now)
    profile = _PROFILE_OVERRIDE.get()
    if profile is _UNSET:
        profile = _PROFILE_DEFAULT
    return (
        context_value(policy, func) if uses_context else None,
        None if kernel is None else kernel.func,
        None if opdef is None else opdef._abstract_fn,
        kernels_now,
        python_key_table.get(_StockMode),
        rules.get(_StockMode) if rules else None,
        # py_kernels is tested first: DispatchKey hashes slowly.
        tuple(py_kernels.items()) if py_kernels else None,
        # Without py_impl kernels the Python dispatcher runs the kernel the
        # dispatcher would (ops a kernel calls keep their own entries and
        # sub-tables: Note [Entries cover inner ops]); ExportPass turns it on
        # for some passes and not others, so the flag would split entries.
        _tls_key_included(_PYTHON_DISPATCHER) if py_kernels else None,
        _meta_table.get(func),  # type: ignore[call-overload]
        _decomposition_table.get(func),  # type: ignore[call-overload]
        impls,
        _op_implementation_of.get(func),  # type: ignore[call-overload]
        None if profile is None or func not in profile.data else profile,
    )


def runs_backend_fallback(route: Route) -> bool:
    """Whether a backend op's static-shape fake dispatch can reach the Meta backend fallback.

    An op with no Meta or composite kernel and no fake impl (one the policy
    admits for its decomposition, which fake dispatch uses for symbolic
    inputs only) runs the dispatcher's fallback for the Meta key on static
    inputs: a kernel that belongs to the key, not the op, which nothing
    watches (Note [The kernel in effect]).
    """
    holder, _, fingerprint, *_ = route.backend  # type: ignore[misc]
    return holder.kernel is None and fingerprint() == keyset.NO_KERNEL


def _op_impls(route: Route, kernels_now: int) -> tuple[Any, ...]:
    """The fake_impls.register_op_impl implementations whose check accepts ``route.func``, memoized in the route.

    The checks are predicates on the op (its name, tags, schema, and whether
    it has a Meta kernel): their answers hold until the list changes length
    or the op's kernels change.
    """
    impls = tuple(impl for check, impl in list(_op_implementations) if check(route.func))
    route.op_impls = (len(_op_implementations), kernels_now, impls)
    return impls


def symbolic_sub(route: Route, sub: Hashable, shape_env: Any, symbols: Iterable[Any]) -> Hashable:
    """:func:`kernel_sub` for a key holding ``symbols``.

    Adds what the ShapeEnv knows about them (Note [What the ShapeEnv knows]).
    With symbolic inputs, fake dispatch also prefers a fast implementation of
    the op (fake_impls.get_fast_op_impls).
    """
    return (sub, knowledge(shape_env, symbols), _fake_impls.get_fast_op_impls().get(route.func))  # type: ignore[call-overload]


def context_value(policy: CachePolicy, func: object) -> Hashable:
    """``policy.context_key()``, with an exception re-raised naming the op."""
    try:
        return policy.context_key()
    except Exception as e:
        raise RuntimeError(f"{policy!r}.context_key() raised while dispatching {func}: {e!r}") from e


def unhashable_context(policy: CachePolicy, func: object, context: object) -> TypeError:
    """The error for a ``context_key()`` value that cannot key a table."""
    where = unhashable_part(context) or f"a {type(context).__name__}"
    return TypeError(
        f"{policy!r}.context_key() returned an unhashable {type(context).__name__} "
        f"while dispatching {func}: {where}; return a hashable value such as a tuple or a string"
    )


def python_dispatcher_enabled() -> bool:
    """Whether ``enable_python_dispatcher()`` is in effect on this thread."""
    return _tls_key_included(_PYTHON_DISPATCHER)


def torch_dispatch_rule(route: Route | None, func: object) -> Any:
    """The rule registered for stock's ``FakeTensorMode`` class with
    ``torch.library.register_torch_dispatch`` for ``func``, or None.

    The dispatcher looks such rules up by the mode's exact type, before it
    calls the mode's ``__torch_dispatch__``; a subclass must apply the rule
    for the stock class itself. ``route`` is ``func``'s route when the mode
    has one (its registry entry is kept there); otherwise the registry is
    read without creating an entry.
    """
    if route is not None:
        rules = route.rules
        return rules.get(_StockMode) if rules else None
    if isinstance(func, OpOverload):
        entry = _fake_registry.get(func.__qualname__)
        return None if entry is None else entry.torch_dispatch_rules.find(_StockMode)
    return None


# torch._dynamo.config._custom_ops_profile, read the way the config module
# reads it (Note [Reading a config on the hit path]).
_PROFILE_ENTRY = torch._dynamo.config._config["_custom_ops_profile"]  # type: ignore[attr-defined]
_UNSET = _config_module._UNSET_SENTINEL
# The environment is read once, when the config module is imported; only the
# (context-local) user override changes afterwards.
_PROFILE_OVERRIDE = (
    _PROFILE_ENTRY.user_override
    if _PROFILE_ENTRY.env_value_force is _UNSET
    else contextvars.ContextVar("_custom_ops_profile_forced", default=_PROFILE_ENTRY.env_value_force)
)
_PROFILE_DEFAULT = (
    _PROFILE_ENTRY.default if _PROFILE_ENTRY.env_value_default is _UNSET else _PROFILE_ENTRY.env_value_default
)


def custom_ops_profile() -> Any:
    """``torch._dynamo.config._custom_ops_profile``, cheaply.

    Note [Reading a config on the hit path]
    Reading a config of torch._dynamo costs about 3 us (the config module's
    __getattr__), more than the rest of a hit's own work. The value is the
    config entry's environment override, else its (context-local) user
    override, else its environment default, else its default; the
    environment values are fixed when the config module is imported, so a
    read is one ContextVar.get. ``_compat`` checks at import that the entry
    has no alias or justknob and that its override is a ContextVar;
    ``test_fidelity.py`` compares this with the config module's read, under
    an override too.
    """
    value = _PROFILE_OVERRIDE.get()
    return _PROFILE_DEFAULT if value is _UNSET else value


def profile_covering(func: object) -> Any:
    """The active custom-ops profile if it replaces ``func``'s fake kernel, else None."""
    profile = custom_ops_profile()
    if profile is None or func not in profile.data:
        return None
    return profile


def redirects_to_mode(func: object, handler: object) -> bool:
    """Whether a ``FakeTensorMode`` rule only calls the mode straight back.

    Such rules call ``mode.__torch_dispatch__`` again (the cached path of
    HOPs registered with ``register_fake``); forwarding to one would recurse.
    """
    return func in registered_hop_fake_fns or getattr(handler, "__qualname__", "") == (
        "redirect_to_mode.<locals>.impl"
    )


def returns_undeclared_view(func: OpOverload) -> bool:
    """Whether ``func`` returns an alias (``Tensor(a)``/``Tensor(a!)``) without being a view op.

    Note [Entries that must reproduce aliasing]
    torch's entry reproduces aliasing in two ways only: an in-place output is
    the input object itself, and a view op's output is rebuilt on its single
    tensor argument's storage. Some schemas return an alias without being
    views (prims.as_strided returns ``Tensor(a!)``, a new tensor on its input's
    storage), so stock replays them unaliased. Our entry verification rejects
    such entries (Note [Verify every entry on the miss that creates it]), but
    a stock mode may have put one into torch's storage first, where we would
    read it: ops with such schemas, and any op whose entry failed our
    verification once, keep their entries in our store. A verdict of ours is
    never written into torch's storage, where stock modes would read it.
    """
    return not func.is_view and any(r.alias_info is not None for r in func._schema.returns)
