"""``CachePolicy``: which operators a FakeTensorMode may serve from its cache."""

from __future__ import annotations

import copy
import functools
import pickle
import sys
import threading
import types
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Any, SupportsIndex, TypeVar, Union

import torch
import torch._decomp
from torch._ops import OpOverload, OpOverloadPacket

from torch_cachepolicy import _keyset, _reasons
from torch_cachepolicy._names import (
    ALLOW_NAMESPACE_FIX,
    DENY_NAMESPACE_FIX,
    callable_hook,
    describe_value,
    namespace_list,
    op_list,
    op_rule,
    overload_name,
    parse_namespace,
    require_overload,
    type_list,
    type_name,
)

__all__ = ["BUILTIN_NAMESPACES", "CacheDecision", "CachePolicy", "OpLike"]

BUILTIN_NAMESPACES: frozenset[str] = frozenset({"aten", "prim", "prims"})
"""The namespaces stock ``FakeTensorMode`` caches (``torch._library.utils.is_builtin``)."""

OpLike = Union[OpOverload, OpOverloadPacket, str, "torch._library.custom_ops.CustomOpDef"]
_T = TypeVar("_T")

# Attributes that a copy makes afresh (Note [Copying a policy]).
_NOT_COPIED = frozenset({"_lock", "_identity", "_decisions"})
_RULE_SETS = ("_namespaces", "_allowed", "_denied", "_immutable")
_HOOKS = ("_predicate", "_context_hook")


@dataclass(frozen=True)
class CacheDecision:
    """What a :class:`CachePolicy` says about one operator.

    Attributes:
        cacheable: whether the mode may cache the op's fake dispatch (per-call safety checks still apply).
        reason: a sentence for people (``policy.explain(op)``).
        label: a short reason for cache statistics; ``"non-builtin"`` (stock's reason) for ops outside the policy.
        explicit: allowed by name (``allow=`` or ``register_op``), the only way an op that mutates its arguments is cached.
    """

    cacheable: bool
    reason: str
    label: str
    explicit: bool = False

    def __post_init__(self) -> None:
        if type(self.cacheable) is not bool or type(self.explicit) is not bool:  # a truthy np.bool_ must not admit
            raise TypeError(f"torch_cachepolicy.CacheDecision(...): cacheable and explicit must be bool, got {self!r}")


class _Registrar:
    """Returned by ``register_*``: registration is done; used as a decorator it returns the object unchanged."""

    __slots__ = ()

    def __call__(self, obj: _T) -> _T:
        return obj


class CachePolicy:
    """Decides, per ``OpOverload``, whether a fake dispatch may be cached.

    Rules, strongest first: ``deny`` (single ops, even aten ones); ``allow`` (single ops); namespaces (the
    builtins unless ``include_builtins=False``, plus ``namespaces``); ``predicate``. The mode still applies
    torch's checks and the backend-op safety checks on every call.

    Example::

        policy = CachePolicy(namespaces=["quantized_decomposed"])

        @policy.register_namespace("tosa")
        def define_tosa_ops(lib): ...

    Args:
        namespaces: extra operator namespaces to cache (``"tosa"``).
        include_builtins: cache ``aten``, ``prim`` and ``prims`` as stock does.
        allow: single operators to cache (see :meth:`register_op`).
        deny: single operators never to cache, even from a builtin namespace.
        predicate: ``f(op) -> bool`` consulted for ops no rule above decides.
        context_key: ``f() -> Hashable`` joining the cache key of every backend (non-builtin) op, for fake
            kernels that read ambient state; subclasses may override :meth:`context_key` instead.
        context_namespaces: the backend namespaces whose kernels read that state (``["tosa"]``); other ops
            ignore the context. ``None``: every backend op depends on it.
        immutable_types: backend-op argument types vouched immutable, keyed by hash and equality (see
            :meth:`register_immutable_type`).
    """

    def __init__(
        self,
        namespaces: Iterable[str | torch.library.Library] = (),
        *,
        include_builtins: bool = True,
        allow: Iterable[OpLike] = (),
        deny: Iterable[OpLike] = (),
        predicate: Callable[[OpOverload], bool] | None = None,
        context_key: Callable[[], Hashable] | None = None,
        context_namespaces: Iterable[str] | None = None,
        immutable_types: Iterable[type] = (),
    ) -> None:
        # Every argument is read and checked before anything is stored: a bad one leaves no half-built policy.
        if not isinstance(include_builtins, bool):
            raise TypeError(
                "torch_cachepolicy.CachePolicy(include_builtins=...): expected True or False, "
                f"got {describe_value(include_builtins)}"
            )
        namespace_items = namespace_list("namespaces", namespaces)
        allow_items = op_list("allow", allow, ALLOW_NAMESPACE_FIX)
        deny_items = op_list("deny", deny, DENY_NAMESPACE_FIX)
        predicate = callable_hook("predicate", predicate, "f(op) -> bool")
        context_key = callable_hook("context_key", context_key, "f() -> Hashable")
        context_items = None if context_namespaces is None else namespace_list("context_namespaces", context_namespaces)
        immutable_items = type_list("immutable_types", immutable_types)
        self._lock = threading.RLock()
        self._include_builtins = include_builtins
        self._namespaces: set[str] = {
            parse_namespace(f"torch_cachepolicy.CachePolicy(namespaces=...): element [{i}]", ns, "namespaces")
            for i, ns in enumerate(namespace_items)
        }
        self._allowed: set[str] = {
            op_rule(f"torch_cachepolicy.CachePolicy(allow=...): element [{i}]", op, ALLOW_NAMESPACE_FIX)
            for i, op in enumerate(allow_items)
        }
        self._denied: set[str] = {
            op_rule(f"torch_cachepolicy.CachePolicy(deny=...): element [{i}]", op, DENY_NAMESPACE_FIX)
            for i, op in enumerate(deny_items)
        }
        self._predicate = predicate
        self._context_hook = context_key
        self._context_namespaces: frozenset[str] | None = None if context_items is None else frozenset(
            parse_namespace(f"torch_cachepolicy.CachePolicy(context_namespaces=...): element [{i}]", ns, "context_namespaces")
            for i, ns in enumerate(context_items)
        )
        self._immutable: set[type] = set(immutable_items)
        # Note [Policy identity]
        # ~~~~~~~~~~~~~~~~~~~~~~
        # The identity names a cache partition and is rebuilt (a new object) on every rule change, so a mode
        # notices with one `is` on its hit path and moves to the new rules' partition: old entries (negative ones
        # too) are never consulted again, and nothing needs evicting.
        self._identity: Hashable = ()
        self._decisions: dict[OpOverload, CacheDecision] = {}
        self._rebuild()

    # ----------------------------------------------------------------- rules

    def register_namespace(self, ns: str | torch.library.Library) -> _Registrar:
        """Caches every operator of namespace ``ns`` (a string or ``Library``) from now on; works as a decorator."""
        ns = parse_namespace("torch_cachepolicy.CachePolicy.register_namespace(...)", ns, "register_namespace")
        with self._lock:
            self._namespaces.add(ns)
            self._rebuild()
        return _Registrar()

    def register_op(self, op: OpLike) -> _Registrar:
        """Caches ``op`` (an overload, a packet = all overloads, a name, a custom_op).

        Allowing an op by name is also how an op that mutates its arguments opts in. Works as a decorator too.
        """
        rule = op_rule(
            "torch_cachepolicy.CachePolicy.register_op(...)",
            op,
            "to cache every operator of {ns} use register_namespace({ns})",
            "call register_op once per operator",
        )
        with self._lock:
            self._allowed.add(rule)
            self._rebuild()
        return _Registrar()

    def deny(self, op: OpLike) -> _Registrar:
        """Never caches ``op``; beats every other rule. Works as a decorator too."""
        rule = op_rule("torch_cachepolicy.CachePolicy.deny(...)", op, DENY_NAMESPACE_FIX, "call deny once per operator")
        with self._lock:
            self._denied.add(rule)
            self._rebuild()
        return _Registrar()

    def register_immutable_type(self, cls: type[_T]) -> type[_T]:
        """Vouches that objects of ``cls`` (and its subclasses) are immutable.

        A backend-op argument the key holds as an object, not by content (an ``Any``, a torchbind class, ...),
        bypasses the cache: a fake kernel could read state the key does not see
        (Note [Arguments the key cannot see]). A registered type is keyed by hash and equality instead, which
        must reflect all a fake kernel reads from it. Works as a class decorator; returns ``cls``.
        """
        if not isinstance(cls, type):
            raise TypeError(
                f"torch_cachepolicy.CachePolicy.register_immutable_type(...): expected a class, got {describe_value(cls)}"
            )
        with self._lock:
            self._immutable.add(cls)
            self._rebuild()
        return cls

    def _rebuild(self) -> None:
        self._identity = (
            type(self), self._include_builtins, frozenset(self._namespaces), frozenset(self._allowed),
            frozenset(self._denied), self._predicate, self._context_hook, self._context_namespaces,
            frozenset(self._immutable),
        )
        # A fresh dict, not clear(): a reader holding the old one keeps a consistent (old) view.
        self._decisions = {}

    # ------------------------------------------------------------- queries

    @property
    def identity(self) -> Hashable:
        """Hashable, equal for equal rules (hooks count by object identity); changes whenever a rule changes."""
        return self._identity

    @property
    def immutable_types(self) -> frozenset[type]:
        """The argument types declared immutable (:meth:`register_immutable_type`)."""
        return frozenset(self._immutable)

    @property
    def namespaces(self) -> frozenset[str]:
        """The namespaces this policy caches, builtins included when enabled."""
        extra = BUILTIN_NAMESPACES if self._include_builtins else frozenset()
        return frozenset(self._namespaces) | extra

    @property
    def is_stock_equivalent(self) -> bool:
        """Whether the rules cache exactly what stock caches (``CachePolicy()``): builtins only, no deny, no context."""
        return (self._include_builtins and not (self._namespaces or self._allowed or self._denied)
                and self._predicate is None and not self.has_context)

    @property
    def has_context(self) -> bool:
        """Whether :meth:`context_key` adds anything to cache keys."""
        return self._context_hook is not None or type(self).context_key is not CachePolicy.context_key

    def uses_context(self, op: OpOverload) -> bool:
        """Whether :meth:`context_key` is consulted for ``op``: a backend op of a context namespace, if any context."""
        if op.namespace in BUILTIN_NAMESPACES or not self.has_context:
            return False
        return self._context_namespaces is None or op.namespace in self._context_namespaces

    def context_key(self) -> Hashable:
        """The ambient context that cached backend results depend on.

        Called once per dispatch, hit or miss, of an op that uses it (:meth:`uses_context`), and never for other ops;
        entries are served only under an equal value (it selects a sub-table).
        Default: the constructor's ``context_key`` callable, or ``None``.
        """
        return None if self._context_hook is None else self._context_hook()

    def decide(self, op: OpOverload) -> CacheDecision:
        """Whether ``op`` may be cached, and why. Memoized per OpOverload.

        A policy mode asks it once per op and policy identity, and only about ops outside aten/prim/prims: those
        follow this class's own rules (``deny``, ``include_builtins``) even where a subclass overrides ``decide``.
        An override must give the same answer for the same op while the rules are unchanged."""
        return self._decide("torch_cachepolicy.CachePolicy.decide(...)", op)

    def is_cacheable(self, op: OpOverload) -> bool:
        """Shorthand for ``decide(op).cacheable``."""
        return self._decide("torch_cachepolicy.CachePolicy.is_cacheable(...)", op).cacheable

    def explain(self, op: OpOverload) -> str:
        """One line per fact the decision rests on, for people."""
        decision = self._decide("torch_cachepolicy.CachePolicy.explain(...)", op)
        verdict = "cacheable" if decision.cacheable else "not cacheable"
        keys = sorted(k.name for k in _keyset.kernel_keys(op))
        lines = [
            f"{overload_name(op)}: {verdict}: {decision.reason}",
            f"  kernels registered for: {', '.join(keys) if keys else '(none)'}",
        ]
        if op.namespace not in BUILTIN_NAMESPACES and decision.cacheable:
            lines.append(
                "  per call, the mode still bypasses unbacked scalar outputs, NaN arguments, "
                + ("" if decision.explicit else "argument mutation, ")
                + "and any output or input metadata a hit would not reproduce (docs/guide.md)"
            )
        return "\n".join(lines)

    def _decide(self, api: str, op: object) -> CacheDecision:
        # Before the memo lookup, where an unhashable argument would fail with a bare "unhashable type"; the mode
        # calls this only for an op without a route, so the check is off its hit path.
        op = require_overload(api, op)
        # Capture the memo first: a rule changing meanwhile leaves our old-rules decision in the old memo.
        memo = self._decisions
        decision = memo.get(op)
        if decision is None:
            decision = self._decide_uncached(op)
            # "No fake kernel" stands until a fake impl is registered (Note [Structural checks]).
            if decision.label != _reasons.NO_FAKE_KERNEL:
                memo[op] = decision
        return decision

    def _decide_uncached(self, op: OpOverload) -> CacheDecision:
        overload = overload_name(op)
        packet = op._schema.name
        ns = op.namespace
        builtin = ns in BUILTIN_NAMESPACES
        if overload in self._denied or packet in self._denied:
            return CacheDecision(False, f"denied by rule {_which(overload, packet, self._denied)!r}", _reasons.DENIED)
        explicit = overload in self._allowed or packet in self._allowed
        if explicit:
            reason = f"allowed by rule {_which(overload, packet, self._allowed)!r}"
        elif builtin and self._include_builtins:
            reason = f"builtin namespace {ns!r}"
        elif ns in self._namespaces:
            reason = f"namespace {ns!r} is registered"
        elif self._predicate is not None and self._call_predicate(op):
            reason = "predicate accepted it"
        else:
            if builtin:
                return CacheDecision(
                    False, "builtin namespaces are excluded (include_builtins=False)", _reasons.BUILTIN_EXCLUDED
                )
            return CacheDecision(False, f"namespace {ns!r} is not registered", _reasons.NON_BUILTIN)
        return self._structural(op, reason, explicit)

    def _structural(self, op: OpOverload, reason: str, explicit: bool) -> CacheDecision:
        # Note [Structural checks]
        # ~~~~~~~~~~~~~~~~~~~~~~~~
        # A view with a CompositeImplicitAutograd kernel may or may not alias its input, so a hit could not know
        # whether to share storage; torch bypasses it for aten, we for every namespace. An op with no Meta kernel,
        # fake impl or CIA decomposition has no fake dispatch to cache; not memoized: a fake impl may come later.
        keys = _keyset.kernel_keys(op)
        cia = torch._C.DispatchKey.CompositeImplicitAutograd in keys
        if op.is_view and cia:
            return CacheDecision(False, "view op with a CompositeImplicitAutograd kernel", _reasons.CIA_VIEW)
        if op.namespace not in BUILTIN_NAMESPACES and keys.isdisjoint(_keyset.FAKE_KERNEL_KEYS):
            holder = torch._library.simple_registry.singleton.get(op.name())
            no_fake = holder is None or holder.fake_impl.kernel is None
            if no_fake and op not in torch._decomp.decomposition_table:
                why = f"{reason}, but it has no Meta or composite kernel, no fake impl and no decomposition"
                return CacheDecision(False, why, _reasons.NO_FAKE_KERNEL)
        return CacheDecision(True, reason, "cacheable", explicit)

    def _call_predicate(self, op: OpOverload) -> bool:
        assert self._predicate is not None
        try:
            result: Any = self._predicate(op)
        except Exception as e:
            raise RuntimeError(
                f"torch_cachepolicy.CachePolicy(predicate=...): the predicate {self._predicate!r} raised "
                f"for {op}: {e!r}; make it return True or False for every operator"
            ) from e
        if not isinstance(result, bool):
            raise TypeError(
                f"torch_cachepolicy.CachePolicy(predicate=...): the predicate {self._predicate!r} returned "
                f"{type_name(result)} for {op}; make it return a Python bool"
            )
        return result

    # --------------------------------------------------------------- copying

    # Note [Copying a policy]
    # ~~~~~~~~~~~~~~~~~~~~~~~
    # copy.copy, copy.deepcopy and pickle give an independent policy: its own lock, rule sets and an empty memo.
    # Its identity is rebuilt, equal to the original's while the rules are (Note [Policy identity]): modes of
    # either share store partitions until a rule changes, and no old-rules decision answers for the copy. The
    # hooks count in the identity by object, so a deep copy shares them (as deepcopy shares plain functions)
    # rather than give a callable object or bound method a new identity. pickle restores a module-level function
    # as the same object; a lambda, a local function or a subclass defined in a function cannot be pickled
    # (__reduce_ex__ says so in our words). Other attributes, a subclass's included, copy the usual way; a
    # subclass overriding __getstate__ extends the dict the base returns.

    def __getstate__(self) -> object:
        # Under the lock, so no rule changes a set mid-copy. The (dict, slots) pair is object.__getstate__'s layout
        # on Python 3.11+, built here so that 3.10 copies a subclass's slots too.
        with self._lock:
            attrs = {k: v for k, v in self.__dict__.items() if k not in _NOT_COPIED}
            for name in _RULE_SETS:
                attrs[name] = set(attrs[name])
            slots = {name: getattr(self, name) for name in _slot_names(type(self)) if hasattr(self, name)}
        return (attrs, slots) if slots else attrs

    def __setstate__(self, state: object) -> None:
        attrs, slots = _split_state(state)
        self.__dict__.update(attrs)
        for name, value in (slots or {}).items():
            object.__setattr__(self, name, value)
        self._lock = threading.RLock()
        self._rebuild()

    def __copy__(self) -> CachePolicy:
        clone = type(self).__new__(type(self))
        clone.__setstate__(self.__getstate__())
        return clone

    def __deepcopy__(self, memo: dict[int, Any]) -> CachePolicy:
        clone = type(self).__new__(type(self))
        memo[id(self)] = clone
        attrs, slots = _split_state(self.__getstate__())
        hooks = {name: attrs.pop(name) for name in _HOOKS if name in attrs}
        attrs = copy.deepcopy(attrs, memo)
        attrs.update(hooks)
        slots = copy.deepcopy(slots, memo)
        clone.__setstate__(attrs if slots is None else (attrs, slots))
        return clone

    def __reduce_ex__(self, protocol: SupportsIndex) -> str | tuple[Any, ...]:
        # copy.copy / copy.deepcopy never get here, so only pickling is refused and a lambda hook still copies.
        problem = _unpicklable_by_name(type(self))
        if problem is not None:
            raise pickle.PicklingError(
                f"pickle.dumps(torch_cachepolicy.CachePolicy(...)): cannot pickle a {type(self).__name__}, "
                f"{problem}; define the subclass at module level"
            )
        for role, hook in (("predicate", self._predicate), ("context_key", self._context_hook)):
            problem = _unpicklable_by_name(hook)
            if problem is not None:
                raise pickle.PicklingError(
                    f"pickle.dumps(torch_cachepolicy.CachePolicy(...)): cannot pickle the {role} {_hook_name(hook)}, "
                    f"{problem}; pass a module-level function"
                )
        return super().__reduce_ex__(protocol)

    def __repr__(self) -> str:
        parts = [f"namespaces={sorted(self._namespaces)}"]
        if not self._include_builtins:
            parts.append("include_builtins=False")
        if self._allowed:
            parts.append(f"allow={sorted(self._allowed)}")
        if self._denied:
            parts.append(f"deny={sorted(self._denied)}")
        if self._predicate is not None:
            parts.append(f"predicate={self._predicate!r}")
        if self._context_hook is not None:
            parts.append(f"context_key={self._context_hook!r}")
        if self._context_namespaces is not None:
            parts.append(f"context_namespaces={sorted(self._context_namespaces)}")
        if self._immutable:
            parts.append(f"immutable_types=[{', '.join(sorted(t.__qualname__ for t in self._immutable))}]")
        return f"{type(self).__name__}({', '.join(parts)})"


def _which(overload: str, packet: str, rules: set[str]) -> str:
    return overload if overload in rules else packet


def _slot_names(cls: type) -> list[str]:
    """The ``__slots__`` attributes of ``cls`` and its bases, mangled as Python stores them."""
    names = []
    for klass in cls.__mro__:
        slots = klass.__dict__.get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name in ("__dict__", "__weakref__"):
                continue
            if name.startswith("__") and not name.endswith("__"):
                name = f"_{klass.__name__.lstrip('_')}{name}"
            names.append(name)
    return names


def _split_state(state: object) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """A ``__getstate__`` result (a dict, or a (dict, slots) pair) as (attributes, slot values or None)."""
    if isinstance(state, tuple):
        attrs, slots = state
        return dict(attrs or {}), slots
    assert isinstance(state, dict), f"CachePolicy.__getstate__ must return a dict, got {type(state).__name__}"
    return state, None


def _unpicklable_by_name(obj: object) -> str | None:
    """Why pickle cannot find function or class ``obj`` by module and qualname (``"a lambda in f"``), or None.

    Looks only at functions (also inside ``functools.partial``) and classes; anything else fails in pickle's words.
    """
    while isinstance(obj, functools.partial):
        obj = obj.func
    if not isinstance(obj, (types.FunctionType, type)):
        return None
    kind = "class" if isinstance(obj, type) else "function"
    scope, _, name = obj.__qualname__.rpartition(".")
    scope = scope.removesuffix(".<locals>")
    if name == "<lambda>":
        return f"a lambda in {scope}" if scope else "a lambda"
    if "<locals>" in obj.__qualname__.split("."):
        return f"a {kind} defined inside {scope}"
    found: Any = sys.modules.get(obj.__module__)
    for part in obj.__qualname__.split("."):
        found = getattr(found, part, None)
    if found is not obj:
        return f"a {kind} that pickle cannot find as {obj.__module__}.{obj.__qualname__}"
    return None


def _hook_name(hook: object) -> str:
    while isinstance(hook, functools.partial):
        hook = hook.func
    return getattr(hook, "__name__", None) or repr(hook)
