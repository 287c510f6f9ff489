"""How a policy mode treats each operator: its route, and what its entries depend on.

A mode computes one :class:`Route` per operator (and policy identity) with
:func:`route_for`: which storage its dispatches use, and, for operators
outside aten/prim/prims, the registries whose kernels its entries belong to
(:func:`kernel_sub`, Note [Entries belong to a fake kernel]).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any

import torch
import torch._decomp
from torch._higher_order_ops.utils import registered_hop_fake_fns
from torch._library import custom_ops as _custom_ops
from torch._ops import OpOverload
from torch._subclasses import fake_tensor as _ft

from torch_cachepolicy import keyset
from torch_cachepolicy.keyparts import GENERIC_SLOTS, ArgSlots
from torch_cachepolicy.policy import BUILTIN_NAMESPACES, CachePolicy, decide_memoized, unhashable_part

__all__ = [
    "BYPASS",
    "EXCLUDED_BY_RULE",
    "HOP",
    "HOP_SUB",
    "NO_RULES",
    "POLICY",
    "STOCK",
    "STOCK_SUB",
    "Route",
    "context_value",
    "kernel_sub",
    "python_dispatcher_enabled",
    "redirects_to_mode",
    "returns_undeclared_view",
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

EXCLUDED_BY_RULE = frozenset({"denied by policy"})
"""Decision labels of ops an enclosing entry must never replay (Note [Entries cover inner ops])."""

NO_RULES: Mapping[object, Any] = {}
"""Stands for an operator's ``python_key_table`` when it has none."""

_StockMode = _ft.FakeTensorMode
_fake_registry = torch._library.simple_registry.singleton
_CIA = torch._C.DispatchKey.CompositeImplicitAutograd
_META = torch._C.DispatchKey.Meta
_decomposition_table = torch._decomp.decomposition_table
_meta_table = torch._decomp.meta_table


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
            context, func.python_key_table, func.py_kernels)``
            (Note [Entries belong to a fake kernel]).
    """

    __slots__ = ("backend", "explicit", "func", "kind", "label", "private", "slots", "taints")

    def __init__(self, kind: int, func: object, label: str = "", *, explicit: bool = False) -> None:
        self.kind = kind
        self.func = func
        self.label = label
        self.explicit = explicit
        self.private = False
        self.taints = False
        self.slots: ArgSlots | None = None
        self.backend: tuple[Any, ...] | None = None


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
        route = Route(HOP, func)
        route.private = True
        route.slots = GENERIC_SLOTS
        return route, True
    decision, memoized = decide_memoized(policy, func)
    if not decision.cacheable:
        route = Route(BYPASS, func, decision.label)
        route.taints = decision.label in EXCLUDED_BY_RULE
    elif func.namespace in BUILTIN_NAMESPACES:
        route = Route(STOCK, func, decision.label, explicit=decision.explicit)
        route.private = returns_undeclared_view(func)
    else:
        route = Route(POLICY, func, decision.label, explicit=decision.explicit)
        route.private = True
        route.slots = ArgSlots(func)
    if func.namespace not in BUILTIN_NAMESPACES:
        # find() creates the registry entry if missing, as torch's own
        # _dispatch_impl does for every op, so a fake impl registered
        # later lands in the holder we keep.
        route.backend = (
            _fake_registry.find(func.name()).fake_impl,
            _custom_ops.OPDEFS.get(func._schema.name),
            keyset.kernel_watch(func).fingerprint,
            policy.uses_context(func),
            func.python_key_table,
            func.py_kernels,
        )
    return route, memoized


def kernel_sub(route: Route, policy: CachePolicy) -> Hashable:
    """What a backend op's entries depend on beyond the key, now.

    Note [Entries belong to a fake kernel]
    A backend may re-register the kernel fake dispatch runs (a newer
    library version, a test that swaps it): a register_fake impl, a
    custom_op's register_fake (which swaps the function behind one fixed
    registered wrapper), a dispatcher kernel (Meta, composite) through
    Library.impl, a py_impl rule, a decomposition. Entries computed by the
    old kernel must not answer for the new one, so all of them select the
    sub-table, next to the policy's context (Note [Sub-tables]). Holding
    the functions keeps them alive only as long as the store.
    """
    holder, opdef, fingerprint, uses_context, python_key_table, py_kernels = route.backend  # type: ignore[misc]
    kernel = holder.kernel
    return (
        context_value(policy, route.func) if uses_context else None,
        None if kernel is None else kernel.func,
        None if opdef is None else opdef._abstract_fn,
        fingerprint(),
        # Python-level kernels fake dispatch prefers to the dispatcher's:
        # py_impl rules (a FakeTensorMode rule, a CIA or Meta kernel), a
        # Python meta, and (for symbolic inputs, see symbolic_sub) a
        # decomposition. py_kernels is tested first: DispatchKey hashes slowly.
        python_key_table.get(_StockMode),
        (py_kernels.get(_CIA), py_kernels.get(_META)) if py_kernels else None,
        _meta_table.get(route.func),  # type: ignore[call-overload]
    )


def symbolic_sub(route: Route, sub: Hashable, shape_env: Any) -> Hashable:
    """:func:`kernel_sub` for a key holding symbols.

    See Note [What the ShapeEnv knows]. With symbolic inputs, fake dispatch
    also prefers a Python decomposition of the op.
    """
    return (sub, shape_env._version_counter, _decomposition_table.get(route.func))  # type: ignore[call-overload]


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
    return torch._C._dispatch_tls_is_dispatch_key_included(torch._C.DispatchKey.PythonDispatcher)


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
