"""How a policy mode treats each operator: its :class:`Route`."""

from __future__ import annotations

import enum
import logging
from typing import Any

import torch
from torch._ops import OpOverload
from torch._subclasses import fake_tensor as _ft

from torch_cachepolicy import _kernels, _reasons
from torch_cachepolicy._key_extension import ArgSlots
from torch_cachepolicy.policy import BUILTIN_NAMESPACES, CacheDecision, CachePolicy
from torch_cachepolicy.report import OpStats

log = logging.getLogger(__name__)

_StockMode = _ft.FakeTensorMode
_fake_registry = torch._library.simple_registry.singleton


class Kind(enum.IntEnum):
    """Which storage a dispatch of an operator uses."""

    STOCK = 0  # policy-independent: torch's own storage (or the store, when private)
    POLICY = 1  # admitted only by the policy: the store, with the backend checks
    BYPASS = 2  # the policy does not admit it, or a higher-order op: never looked up anywhere


STOCK, POLICY, BYPASS = Kind.STOCK, Kind.POLICY, Kind.BYPASS


class Route:
    """How one mode treats one operator under one policy identity; made once by :func:`route_for`, never changed.

    Attributes:
        kind, func, stats, label: the :class:`Kind`, the op, the mode's counters, a bypass reason.
        explicit: allowed by name, so it may mutate its arguments.
        private: entries stay out of torch's storage (Note [Entries that must reproduce aliasing]).
        taints: a hit of an enclosing entry would not run it (Note [Entries cover inner ops]).
        slots: the arguments the key extension looks at (``POLICY``).
        opaque: the arguments whose content a key may hold by identity (Note [Arguments the key cannot see]).
        deps: for ops outside aten/prim/prims, where their kernels come from.
        rules: the registry's ``register_torch_dispatch`` rules by class, changed in place by torch.
        immutable: the argument types the policy declared immutable.
    """

    __slots__ = ("deps", "explicit", "func", "immutable", "kind", "label", "opaque", "private", "rules", "slots",
                 "stats", "taints")  # fmt: skip

    def __init__(
        self,
        kind: Kind,
        func: object,
        stats: OpStats,
        label: str = "",
        *,
        explicit: bool = False,
        private: bool = False,
        taints: bool = False,
        slots: ArgSlots | None = None,
        opaque: tuple[tuple[int, str], ...] = (),
        deps: _kernels.KernelDeps | None = None,
        rules: Any = None,
        immutable: frozenset[type] = frozenset(),
    ) -> None:
        self.kind = kind
        self.func = func
        self.stats = stats
        self.label = label
        self.explicit = explicit
        self.private = private
        self.taints = taints
        self.slots = slots
        self.opaque = opaque
        self.deps = deps
        self.rules = rules
        self.immutable = immutable

    def __repr__(self) -> str:
        return f"Route({self.kind.name}, {self.func}, private={self.private})"


def route_for(policy: CachePolicy, func: object, stats: OpStats, private: bool) -> tuple[Route, bool]:
    """``func``'s route under ``policy`` (``private``: a failed verification made the op private), and
    whether to memoize it: not for "no fake kernel", which a fake impl registered later changes."""
    if not isinstance(func, OpOverload):
        # Note [Higher-order ops bypass]
        # ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
        # A HOP's entry would replay its subgraph: torch keys the subgraph (and script objects) by identity, so a
        # graph rewritten in place or an object whose state changed would be replayed stale, and the subgraph's
        # backend ops would go unchecked. The census found no lowering that hits a HOP entry, so a policy mode
        # dispatches HOPs uncached; the ops of their subgraphs are cached one by one. decide() is never asked.
        return Route(BYPASS, func, stats, _reasons.HIGHER_ORDER), True
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
    # find() creates a missing registry entry (see KernelDeps): later rules land in the dict we keep.
    rules = _fake_registry.find(func.name()).torch_dispatch_rules._data
    deps = None
    if not builtin:
        fallback_capable = _StockMode.can_run_unsafe_fallback(_FALLBACK_PROBE, func)  # type: ignore[arg-type]
        deps = _kernels.KernelDeps(func, rules, policy.uses_context(func), fallback_capable)
    # A hit of an enclosing entry would skip this op's run: fine for a builtin kernel, not for a backend op's
    # (its kernel or context may change unseen) nor for an op the policy wants run every time.
    taints = not builtin or decision.label == _reasons.DENIED

    def make(kind: Kind, label: str, private: bool = False, slots: ArgSlots | None = None) -> Route:
        return Route(
            kind, func, stats, label, explicit=decision.explicit, private=private, taints=taints, slots=slots,
            opaque=ArgSlots(func).opaque if slots is None else slots.opaque, deps=deps, rules=rules,
            immutable=policy.immutable_types,
        )

    if not decision.cacheable:
        route = make(BYPASS, decision.label)
    elif not builtin and not _kernels.trusted():
        # See Note [The kernel in effect].
        route = make(BYPASS, _kernels.distrusted_reason())
    elif builtin:
        route = make(STOCK, decision.label, private=private or _returns_undeclared_view(func))
    else:
        route = make(POLICY, decision.label, private=True, slots=ArgSlots(func))
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
