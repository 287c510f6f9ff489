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

from torch_cachepolicy import keyset
from torch_cachepolicy.opnames import (
    ANY_OPS,
    HOP_HINT,
    SINGLE_OPS,
    describe_value,
    namespace_of,
    namespace_op_fix,
    op_rule,
    overload_name,
    parse_namespace,
    require_overload,
    source_name,
    type_name,
)

__all__ = ["BUILTIN_NAMESPACES", "CacheDecision", "CachePolicy", "OpLike", "decide_memoized", "unhashable_part"]

BUILTIN_NAMESPACES: frozenset[str] = frozenset({"aten", "prim", "prims"})
"""The namespaces stock ``FakeTensorMode`` caches (``torch._library.utils.is_builtin``)."""

OpLike = Union[OpOverload, OpOverloadPacket, str, "torch._library.custom_ops.CustomOpDef"]
_T = TypeVar("_T")

# Attributes that a copy makes afresh (Note [Copying a policy]).
_NOT_COPIED = frozenset({"_lock", "_identity", "_decisions"})
_RULE_SETS = ("_namespaces", "_allowed", "_denied", "_immutable")
_HOOKS = ("_predicate", "_context_hook")

# Kernels that run on meta tensors, so a fake dispatch can use them.
_FAKE_CAPABLE_KEYS = frozenset(
    {
        torch._C.DispatchKey.Meta,
        torch._C.DispatchKey.CompositeImplicitAutograd,
        torch._C.DispatchKey.CompositeExplicitAutograd,
        torch._C.DispatchKey.CompositeExplicitAutogradNonFunctional,
    }
)


@dataclass(frozen=True)
class CacheDecision:
    """What a :class:`CachePolicy` says about one operator.

    Attributes:
        cacheable: whether the mode may cache the operator's fake dispatch.
            Safety checks still apply per call (see ``docs/design.md``).
        reason: a sentence for people (``policy.explain(op)``).
        label: a short reason for cache statistics; for ops outside the
            policy it is ``"non-builtin"``, the reason stock torch reports.
        explicit: the operator was allowed by name (``register_op``), which
            is the only way an operator that mutates its arguments is cached.
    """

    cacheable: bool
    reason: str
    label: str
    explicit: bool = False




















def _as_list(api: str, value: object, what: str, fix: str | None) -> list[Any]:
    """Reads an iterable argument once (a generator is consumed here).

    ``fix`` is set when ``value`` is a single item (or None) given where a
    list belongs: iterating it would yield characters, overload names or op
    names, each then rejected (or, for namespaces, accepted) for the wrong
    reason, so the caller names the fix instead.
    """
    if fix is not None:
        raise TypeError(f"{api}: expected {what}, got {describe_value(value)}; {fix}")
    if isinstance(value, (bytes, bytearray)) or not isinstance(value, Iterable):
        raise TypeError(f"{api}: expected {what}, got {describe_value(value)}")
    return list(value)


def _namespace_list(param: str, value: object) -> list[Any]:
    """``namespaces=`` / ``context_namespaces=``: a list of names or Libraries."""
    api = f"CachePolicy({param}=...)"
    fix: str | None = None
    if value is None:
        fix = f"pass {param}=[] or leave it out"
    elif isinstance(value, str):
        fix = f"wrap it: {param}=[{value!r}]"
    elif (ns := namespace_of(value)) is not None:
        fix = f"wrap it: {param}=[{ns!r}]"
    elif isinstance(value, ANY_OPS):
        fix = namespace_op_fix(param, value)
    return _as_list(api, value, "a list of namespaces", fix)




_ALLOW_NAMESPACE_FIX = "to cache every operator of {ns} pass namespaces=[{ns}]"
_DENY_NAMESPACE_FIX = (
    "deny takes single operators; to stop caching a namespace leave it out of namespaces=[...] "
    "(include_builtins=False for aten, prim and prims)"
)


def _op_list(param: str, value: object, namespace_fix: str) -> list[Any]:
    """``allow=`` / ``deny=``: a list of op-likes."""
    api = f"CachePolicy({param}=...)"
    fix: str | None = None
    if value is None:
        fix = f"pass {param}=[] or leave it out"
    elif isinstance(value, str):
        fix = f"wrap it: {param}=[{value!r}]"
    elif isinstance(value, SINGLE_OPS):
        fix = f"wrap it: {param}=[{source_name(value)}]"
    elif isinstance(value, torch._ops.HigherOrderOperator):
        fix = HOP_HINT
    elif (ns := namespace_of(value)) is not None:
        fix = namespace_fix.format(ns=repr(ns))
    return _as_list(api, value, "a list of operators", fix)


def _type_list(param: str, value: object) -> list[type]:
    """``immutable_types=``: a list of classes."""
    api = f"CachePolicy({param}=...)"
    fix = f"wrap it: {param}=[{value.__qualname__}]" if isinstance(value, type) else None
    items = _as_list(api, value, "a list of classes", fix)
    for i, item in enumerate(items):
        if not isinstance(item, type):
            raise TypeError(f"{api}: element [{i}]: expected a class, got {describe_value(item)}")
    return items


def _callable_hook(param: str, value: object, signature: str) -> Any:
    """``predicate=`` / ``context_key=``: a callable or None."""
    if value is None:
        return None
    # Operators are callable, but calling one with an op (or with nothing)
    # fails only at the first dispatch, far from the mistake.
    if isinstance(value, ANY_OPS) or not callable(value):
        hint = ""
        if param == "predicate" and isinstance(value, SINGLE_OPS):
            hint = f"; to cache single operators pass allow=[{source_name(value)}]"
        raise TypeError(
            f"CachePolicy({param}=...): expected a function {signature} or None, got {describe_value(value)}{hint}"
        )
    return value


class _Registrar:
    """Returned by ``register_*``: the registration has already happened, so
    calling it as a decorator just hands the decorated object back."""

    __slots__ = ()

    def __call__(self, obj: _T) -> _T:
        return obj


class CachePolicy:
    """Decides, per ``OpOverload``, whether a fake dispatch may be cached.

    Rules, strongest first: ``deny`` (single ops, beats everything, can
    exclude an aten op); ``allow`` (single ops); namespaces (the builtin ones
    unless ``include_builtins=False``, plus ``namespaces``); ``predicate``.
    Whatever the rules say, the mode still applies torch's own checks and the
    extra safety checks for backend ops on every call.

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
        context_key: ``f() -> Hashable`` whose value joins the cache key of
            every backend (non-builtin) op, for fake kernels that read ambient
            state. Subclasses may override :meth:`context_key` instead.
        context_namespaces: the backend namespaces whose kernels read that
            state (``["tosa"]``); ops of other namespaces then ignore the
            context and are shared across its values. ``None``: every backend
            op depends on the context.
        immutable_types: types of backend-op arguments whose objects the
            cache key may hold by hash and equality, vouched immutable (see
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
        # Every argument is read (a generator consumed) and checked before
        # anything is stored, so a bad argument leaves no half-built policy.
        if not isinstance(include_builtins, bool):
            raise TypeError(
                f"CachePolicy(include_builtins=...): expected True or False, got {describe_value(include_builtins)}"
            )
        namespace_items = _namespace_list("namespaces", namespaces)
        allow_items = _op_list("allow", allow, _ALLOW_NAMESPACE_FIX)
        deny_items = _op_list("deny", deny, _DENY_NAMESPACE_FIX)
        predicate = _callable_hook("predicate", predicate, "f(op) -> bool")
        context_key = _callable_hook("context_key", context_key, "f() -> Hashable")
        context_items = (
            None if context_namespaces is None else _namespace_list("context_namespaces", context_namespaces)
        )
        immutable_items = _type_list("immutable_types", immutable_types)
        self._lock = threading.RLock()
        self._include_builtins = include_builtins
        self._namespaces: set[str] = {
            parse_namespace(f"CachePolicy(namespaces=...): element [{i}]", ns, "namespaces")
            for i, ns in enumerate(namespace_items)
        }
        self._allowed: set[str] = {
            op_rule(f"CachePolicy(allow=...): element [{i}]", op, _ALLOW_NAMESPACE_FIX)
            for i, op in enumerate(allow_items)
        }
        self._denied: set[str] = {
            op_rule(f"CachePolicy(deny=...): element [{i}]", op, _DENY_NAMESPACE_FIX)
            for i, op in enumerate(deny_items)
        }
        self._predicate = predicate
        self._context_hook = context_key
        self._context_namespaces: frozenset[str] | None = (
            None
            if context_items is None
            else frozenset(
                parse_namespace(f"CachePolicy(context_namespaces=...): element [{i}]", ns, "context_namespaces")
                for i, ns in enumerate(context_items)
            )
        )
        self._immutable: set[type] = set(immutable_items)
        # Note [Policy identity]
        # The identity names a cache partition. It is rebuilt (a new object)
        # on every rule change, so a mode notices a change with one `is`
        # comparison on its hit path and moves to the partition of the new
        # rules: entries, negative ones included, made under the old rules are
        # never consulted again, and nothing needs evicting.
        self._identity: Hashable = ()
        self._decisions: dict[OpOverload, CacheDecision] = {}
        self._rebuild()

    # ----------------------------------------------------------------- rules

    def register_namespace(self, ns: str | torch.library.Library) -> _Registrar:
        """Caches every operator of namespace ``ns`` (a string or a ``Library``).

        Works as a plain call and as a decorator; either way the namespace is
        registered when this is called and a decorated object is returned
        unchanged.
        """
        ns = parse_namespace("CachePolicy.register_namespace(...)", ns, "register_namespace")
        with self._lock:
            self._namespaces.add(ns)
            self._rebuild()
        return _Registrar()

    def register_op(self, op: OpLike) -> _Registrar:
        """Caches ``op`` (an overload, a packet = all overloads, a name, a custom_op).

        Allowing an op by name is also how an op that mutates its arguments
        opts in to caching. Works as a plain call and as a decorator.
        """
        rule = op_rule(
            "CachePolicy.register_op(...)",
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
        rule = op_rule("CachePolicy.deny(...)", op, _DENY_NAMESPACE_FIX, "call deny once per operator")
        with self._lock:
            self._denied.add(rule)
            self._rebuild()
        return _Registrar()

    def register_immutable_type(self, cls: type[_T]) -> type[_T]:
        """Vouches that objects of ``cls`` (and its subclasses) are immutable.

        An argument of a backend op that torch's key holds as an object, not
        by its content (anything passed through an ``Any``, a torchbind class
        or another opaque schema type), makes the dispatch bypass the cache:
        a fake kernel could read state the key does not see (Note [Arguments
        the key cannot see]). Objects of a registered type are keyed by their
        hash and equality instead, which must then reflect everything a fake
        kernel reads from them. Works as a class decorator; returns ``cls``.
        """
        if not isinstance(cls, type):
            raise TypeError(
                f"CachePolicy.register_immutable_type(...): expected a class, got {describe_value(cls)}"
            )
        with self._lock:
            self._immutable.add(cls)
            self._rebuild()
        return cls

    def _rebuild(self) -> None:
        self._identity = (
            type(self),
            self._include_builtins,
            frozenset(self._namespaces),
            frozenset(self._allowed),
            frozenset(self._denied),
            self._predicate,
            self._context_hook,
            self._context_namespaces,
            frozenset(self._immutable),
        )
        # A fresh dict rather than clear(): a reader that fetched the old one
        # keeps a consistent (old) view.
        self._decisions = {}

    # ------------------------------------------------------------- queries

    @property
    def identity(self) -> Hashable:
        """Hashable, equal for equal rules; a predicate or context hook counts
        by object identity. Changes whenever a rule changes."""
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
        """Whether the rules cache exactly what stock torch caches (``CachePolicy()``):
        builtins, nothing else, no exclusions, no context."""
        return (
            self._include_builtins
            and not (self._namespaces or self._allowed or self._denied)
            and self._predicate is None
            and not self.has_context
        )

    @property
    def has_context(self) -> bool:
        """Whether :meth:`context_key` adds anything to cache keys."""
        return self._context_hook is not None or type(self).context_key is not CachePolicy.context_key

    def uses_context(self, op: OpOverload) -> bool:
        """Whether :meth:`context_key` is consulted for ``op`` (a backend op of
        a context namespace, when the policy has a context at all)."""
        if op.namespace in BUILTIN_NAMESPACES or not self.has_context:
            return False
        return self._context_namespaces is None or op.namespace in self._context_namespaces

    def context_key(self) -> Hashable:
        """The ambient context that cached backend results depend on.

        Called once per dispatch of a backend op; entries made under one value
        are only served under an equal value (the value selects a sub-table of
        the store, which acts as part of the key). Default: the
        ``context_key`` callable given to the constructor, or ``None``.
        """
        return None if self._context_hook is None else self._context_hook()

    def decide(self, op: OpOverload) -> CacheDecision:
        """Whether ``op`` may be cached, and why. Memoized per OpOverload."""
        return self._decide("CachePolicy.decide(...)", op)

    def is_cacheable(self, op: OpOverload) -> bool:
        """Shorthand for ``decide(op).cacheable``."""
        return self._decide("CachePolicy.is_cacheable(...)", op).cacheable

    def explain(self, op: OpOverload) -> str:
        """One line per fact the decision rests on, for people."""
        decision = self._decide("CachePolicy.explain(...)", op)
        verdict = "cacheable" if decision.cacheable else "not cacheable"
        keys = sorted(k.name for k in keyset.kernel_keys(op))
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
        # Checked before the memo lookup: an unhashable argument would fail
        # there with a bare "unhashable type". The mode calls this only when
        # it has no route for an op yet, so the check is off its hit path.
        op = require_overload(api, op)
        # Capture the memo first: if a rule changes while we decide, our
        # (old-rules) decision lands in the old memo, never in the new one.
        memo = self._decisions
        decision = memo.get(op)
        if decision is None:
            decision, memoize = self._decide_uncached(op)
            if memoize:
                memo[op] = decision
        return decision

    def _decide_uncached(self, op: OpOverload) -> tuple[CacheDecision, bool]:
        overload = overload_name(op)
        packet = op._schema.name
        ns = op.namespace
        builtin = ns in BUILTIN_NAMESPACES
        if overload in self._denied or packet in self._denied:
            return CacheDecision(False, f"denied by rule {_which(overload, packet, self._denied)!r}", "denied by policy"), True
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
                return CacheDecision(False, "builtin namespaces are excluded (include_builtins=False)", "builtin excluded by policy"), True
            return CacheDecision(False, f"namespace {ns!r} is not registered", "non-builtin"), True
        return self._structural(op, reason, explicit)

    def _structural(self, op: OpOverload, reason: str, explicit: bool) -> tuple[CacheDecision, bool]:
        # Note [Structural checks]
        # A view with a CompositeImplicitAutograd kernel may or may not alias
        # its input, so a hit could not know whether to share storage; torch
        # bypasses it for aten and we do so for every namespace. An op with no
        # Meta kernel, no fake impl and no CIA decomposition has no fake
        # dispatch to cache; that verdict is not memoized because a fake impl
        # may be registered later.
        keys = keyset.kernel_keys(op)
        cia = torch._C.DispatchKey.CompositeImplicitAutograd in keys
        if op.is_view and cia:
            return CacheDecision(False, "view op with a CompositeImplicitAutograd kernel", "CompositeImplicitAutograd"), True
        if op.namespace not in BUILTIN_NAMESPACES and not keys & _FAKE_CAPABLE_KEYS:
            if op in torch._decomp.decomposition_table:
                return CacheDecision(True, reason, "cacheable", explicit), True
            holder = torch._library.simple_registry.singleton.get(op.name())
            if holder is None or holder.fake_impl.kernel is None:
                return CacheDecision(False, f"{reason}, but it has no Meta or composite kernel, no fake impl and no decomposition", "no fake kernel"), False
        return CacheDecision(True, reason, "cacheable", explicit), True

    def _call_predicate(self, op: OpOverload) -> bool:
        assert self._predicate is not None
        try:
            result: Any = self._predicate(op)
        except Exception as e:
            raise RuntimeError(
                f"CachePolicy: the predicate {self._predicate!r} raised for {op}: {e!r}"
            ) from e
        if not isinstance(result, bool):
            raise TypeError(
                f"CachePolicy: the predicate {self._predicate!r} returned "
                f"{type_name(result)} for {op}; it must return a Python bool"
            )
        return result

    # --------------------------------------------------------------- copying

    # Note [Copying a policy]
    # copy.copy, copy.deepcopy and pickle give an independent policy: its own
    # lock, its own rule sets and an empty memo, whatever it is a copy of. Its
    # identity is rebuilt, a new object equal to the original's while the
    # rules are equal (Note [Policy identity]): modes using either policy
    # share partitions of one store until either side changes a rule. The
    # memo is never copied, so no decision made under the original's rules
    # can answer for the copy once its rules differ.
    # The predicate and context_key hooks count in the identity by object, so
    # a deep copy shares them (as deepcopy shares plain functions) instead of
    # copying a callable object or a bound method into a new identity. pickle
    # restores a module-level function as the same object; a lambda or a
    # local function cannot be pickled, and neither can a subclass defined
    # inside a function, which __reduce_ex__ reports in our words.
    # Every other attribute, a subclass's included, is copied as copy.copy /
    # copy.deepcopy / pickle copy any attribute. A subclass that overrides
    # __getstate__ extends the dict the base returns.

    def __getstate__(self) -> object:
        # Under the lock: a rule added meanwhile must not change a set while
        # it is copied.
        # The (dict, slots) pair is the layout object.__getstate__ has on
        # Python 3.11+, built here so that 3.10 copies a subclass's slots too.
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
        # copy.copy / copy.deepcopy never get here (__copy__, __deepcopy__),
        # so only pickling is refused, and a lambda hook still copies.
        problem = _unpicklable_by_name(type(self))
        if problem is not None:
            raise pickle.PicklingError(
                f"CachePolicy: cannot pickle a {type(self).__name__}, {problem}; "
                "define the subclass at module level"
            )
        for role, hook in (("predicate", self._predicate), ("context_key", self._context_hook)):
            problem = _unpicklable_by_name(hook)
            if problem is not None:
                raise pickle.PicklingError(
                    f"CachePolicy: cannot pickle the {role} {_hook_name(hook)}, {problem}; "
                    "pass a module-level function"
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
    """A ``__getstate__`` result (a dict, or a (dict, slot values) pair) as
    (attributes, slot values or None)."""
    if isinstance(state, tuple):
        attrs, slots = state
        return dict(attrs or {}), slots
    assert isinstance(state, dict), f"CachePolicy.__getstate__ must return a dict, got {type(state).__name__}"
    return state, None


def _unpicklable_by_name(obj: object) -> str | None:
    """Why pickle cannot find function or class ``obj`` by its module and
    qualified name, which is how it pickles them (``"a lambda in f"``), or None.

    Looks only at functions (also inside ``functools.partial``) and classes;
    whatever else pickle cannot handle fails in pickle's own words.
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


def unhashable_part(value: object) -> str | None:
    """Describes the first part of ``value`` that cannot be hashed, or None if
    ``value`` hashes.

    Looks into tuples element by element, nested tuples included, so the
    answer points at the culprit: ``"element [1] of the tuple is a list"``,
    ``"element [1][0] of the tuple is a dict"``. A value that is not a tuple
    gives ``"the value is a list"``. (A frozenset always hashes: its hash is
    made of the element hashes taken when it was built.) For error messages
    about a ``context_key()`` result.
    """
    if _hash_error(value) is None:
        return None
    path: list[str] = []
    culprit = value
    while isinstance(culprit, tuple):
        # A tuple's hash fails only if an element's does (a tuple subclass
        # with its own __hash__ may fail on its own, then it is the culprit).
        index = next((i for i, item in enumerate(culprit) if _hash_error(item) is not None), None)
        if index is None:
            break
        path.append(f"[{index}]")
        culprit = culprit[index]
    what = _unhashable_what(culprit)
    if not path:
        return f"the value is {what}"
    return f"element {''.join(path)} of the {type_name(value)} is {what}"


def _hash_error(value: object) -> Exception | None:
    try:
        hash(value)
    except Exception as e:  # a user's __hash__ may raise anything
        return e
    return None


def _unhashable_what(value: object) -> str:
    """``a list``; for a type whose ``__hash__`` raised, ``a Spec (hash() raised TypeError: ...)``."""
    name = type(value).__name__
    article = "an" if name[:1].lower() in "aeiou" else "a"
    error = _hash_error(value)
    if type(value).__hash__ is None or error is None:
        return f"{article} {name}"
    return f"{article} {name} (hash() raised {type(error).__name__}: {error})"


def decide_memoized(policy: CachePolicy, op: OpOverload) -> tuple[CacheDecision, bool]:
    """``policy.decide(op)``, and whether the policy memoized that decision.

    A mode memoizes what it derives from a decision (its route for ``op``)
    only when the policy did: an unmemoized decision ("no fake kernel") may
    change without a rule change. A rule change racing this call gives
    False, which only costs a recomputation.
    """
    decision = policy.decide(op)
    return decision, op in policy._decisions
