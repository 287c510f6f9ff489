"""How a policy mode treats each operator: its :class:`Route`."""

from __future__ import annotations

import enum
import logging
from typing import Any

import torch
from torch._ops import OpOverload
from torch._subclasses import fake_tensor as _ft

from torch_cachepolicy import _kernels, _reasons
from torch_cachepolicy._key_extension import GENERIC_SLOTS, ArgSlots
from torch_cachepolicy.policy import BUILTIN_NAMESPACES, CacheDecision, CachePolicy
from torch_cachepolicy.report import OpStats

log = logging.getLogger(__name__)

_StockMode = _ft.FakeTensorMode
_fake_registry = torch._library.simple_registry.singleton


class Kind(enum.IntEnum):
    """Which storage a dispatch of an operator uses."""

    STOCK = 0  # policy-independent: torch's own storage (or the store, when private)
    POLICY = 1  # admitted only by the policy: the store, with the backend checks
    BYPASS = 2  # the policy does not admit it: never looked up anywhere
    HOP = 3  # a higher-order operator: torch's rules, in the store, keyed by the policy's context


STOCK, POLICY, BYPASS, HOP = Kind.STOCK, Kind.POLICY, Kind.BYPASS, Kind.HOP


class Route:
    """How one mode treats one operator under one policy identity; made by :func:`route_for`.

    Attributes:
        kind, func, stats, label: the :class:`Kind`, the op, the mode's counters, a bypass reason.
        explicit: allowed by name, so it may mutate its arguments.
        private: entries stay out of torch's storage (Note [Entries that must reproduce aliasing]).
        taints: denied by the policy (Note [Entries cover inner ops]).
        slots: the arguments the key extension looks at (``POLICY``, ``HOP``).
        deps: for ops outside aten/prim/prims, where their kernels come from.
        rules: the registry's ``register_torch_dispatch`` rules by class, changed in place (None for HOPs).
        immutable: the argument types the policy declared immutable.
    """

    __slots__ = ("contexts", "deps", "direct", "explicit", "func", "immutable", "kind", "label", "private", "rules",
                 "slots", "stats", "taints")  # fmt: skip

    def __init__(self, kind: Kind, func: object, stats: OpStats, label: str = "", *, explicit: bool = False) -> None:
        self.kind = kind
        self.func = func
        self.stats = stats
        self.label = label
        self.explicit = explicit
        self.private = False
        self.taints = False
        self.slots: ArgSlots | None = None
        self.deps: _kernels.KernelDeps | None = None
        self.rules: Any = None
        self.immutable: frozenset[type] = frozenset()
        self.contexts: set[object] = set()  # the context values this route has met (_driver._check_context)

    def keep_private(self) -> None:
        """From now on the op's entries stay in the store (Note [Entries that must reproduce aliasing])."""
        self.private = True

    def __repr__(self) -> str:
        return f"Route({self.kind.name}, {self.func}, private={self.private})"


def route_for(policy: CachePolicy, func: object, stats: OpStats, private: bool) -> tuple[Route, bool]:
    """``func``'s route under ``policy`` (``private``: a failed verification made the op private), and
    whether to memoize it: not for "no fake kernel", which a fake impl registered later changes."""
    if not isinstance(func, OpOverload):
        # A HOP's entry replays its subgraph, so it carries the subgraph's dependencies, which only our store
        # holds (Note [Entries cover inner ops]); torch's storage may hold one older than a kernel inside.
        if not _kernels.trusted():
            return Route(BYPASS, func, stats, _kernels.distrusted_reason()), True
        route = Route(HOP, func, stats)
        route.private = True
        route.slots = GENERIC_SLOTS
        return route, True
    builtin = func.namespace in BUILTIN_NAMESPACES
    # Note [Who decides about builtins]
    # ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    # decide() is the policy's word on backend ops; aten/prim/prims follow CachePolicy's own static rules (deny,
    # include_builtins, the structural checks) even where a subclass overrides decide(), as the upstream hook asks
    # nothing about them (a C++ FakeTensor cannot call Python per aten dispatch). Either answer is asked once per
    # op and policy identity: a route memoizes it.
    decision = CachePolicy.decide(policy, func) if builtin else policy.decide(func)
    if type(decision) is not CacheDecision:
        raise TypeError(f"torch_cachepolicy.CachePolicy.decide(...): {type(policy).__name__}.decide({func}) returned {decision!r}; return a CacheDecision")
    if not decision.cacheable:
        route = Route(BYPASS, func, stats, decision.label)
        route.taints = decision.label == _reasons.DENIED
    elif not builtin and not _kernels.trusted():
        # See Note [The kernel in effect].
        route = Route(BYPASS, func, stats, _kernels.distrusted_reason())
    elif builtin:
        route = Route(STOCK, func, stats, decision.label, explicit=decision.explicit)
        route.private = private or _returns_undeclared_view(func)
    else:
        route = Route(POLICY, func, stats, decision.label, explicit=decision.explicit)
        route.private = True
        route.slots = ArgSlots(func)
        route.immutable = policy.immutable_types
    # find() creates a missing registry entry (see KernelDeps): later rules land in the dict we keep.
    route.rules = _fake_registry.find(func.name()).torch_dispatch_rules._data
    if not builtin:
        fallback_capable = _StockMode.can_run_unsafe_fallback(_FALLBACK_PROBE, func)  # type: ignore[arg-type]
        route.deps = _kernels.KernelDeps(func, route.rules, policy.uses_context(func), fallback_capable)
    log.debug("route %s: %s (%s)", func, route.kind.name, decision.label)
    return route, decision.label != _reasons.NO_FAKE_KERNEL


class _FallbackProbe:
    """A mode allowing fallback kernels, to ask stock's ``can_run_unsafe_fallback`` if an op could fall back."""

    allow_fallback_kernels = True
    _can_run_unsafe_fallback_allowed_namespaces = _StockMode._can_run_unsafe_fallback_allowed_namespaces


_FALLBACK_PROBE = _FallbackProbe()


def _returns_undeclared_view(func: OpOverload) -> bool:
    """Whether ``func`` returns an alias (``Tensor(a)``/``Tensor(a!)``) without being a view op."""
    # Note [Entries that must reproduce aliasing]
    # ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    # torch's entry reproduces aliasing only as an in-place output (the input) or a view op's output (on its
    # argument's storage), so stock replays non-view ops returning an alias (prims.as_strided: Tensor(a!))
    # unaliased. We reject such entries, but a stock mode may have put one into torch's storage: those ops, and any
    # op whose entry once failed our verification, keep their entries in our store; our verdicts never enter torch's.
    return not func.is_view and any(r.alias_info is not None for r in func._schema.returns)
