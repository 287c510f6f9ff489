"""``CachePolicy``: which operators a FakeTensorMode may serve from its cache."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar, Union

import torch
import torch._decomp
from torch._ops import OpOverload, OpOverloadPacket

from torch_cachepolicy import keyset

__all__ = ["BUILTIN_NAMESPACES", "CacheDecision", "CachePolicy", "OpLike"]

BUILTIN_NAMESPACES: frozenset[str] = frozenset({"aten", "prim", "prims"})
"""The namespaces stock ``FakeTensorMode`` caches (``torch._library.utils.is_builtin``)."""

OpLike = Union[OpOverload, OpOverloadPacket, str, "torch._library.custom_ops.CustomOpDef"]
_T = TypeVar("_T")

# Kernels that run on meta tensors, so a fake dispatch can use them.
_FAKE_CAPABLE_KEYS = frozenset(
    {
        torch._C.DispatchKey.Meta,
        torch._C.DispatchKey.CompositeImplicitAutograd,
        torch._C.DispatchKey.CompositeExplicitAutograd,
        torch._C.DispatchKey.CompositeExplicitAutogradNonFunctional,
    }
)

_NAMESPACE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


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


def _resolve_op_string(api: str, name: str) -> tuple[str, str | None]:
    """Parses ``"ns::name"`` or ``"ns::name.overload"``; the op must exist."""
    ns, sep, rest = name.partition("::")
    if not sep or not _NAMESPACE_RE.match(ns) or not rest:
        raise ValueError(
            f"{api}: {name!r} is not an operator name; pass 'ns::name' or "
            "'ns::name.overload', e.g. 'quantized_decomposed::quantize_per_tensor.default'"
        )
    opname, _, overload = rest.partition(".")
    try:
        packet = getattr(getattr(torch.ops, ns), opname)
    except (AttributeError, RuntimeError):
        packet = None
    if not isinstance(packet, OpOverloadPacket):
        raise ValueError(
            f"{api}: no operator {ns}::{opname} is registered; define it (or import the "
            "module that defines it) before naming it in a policy"
        )
    if overload:
        if overload not in packet.overloads():
            raise ValueError(
                f"{api}: {ns}::{opname} has no overload {overload!r}; "
                f"it has {sorted(packet.overloads())}"
            )
        return f"{ns}::{opname}", overload
    return f"{ns}::{opname}", None


def _op_rule(api: str, op: object) -> str:
    """Normalizes an op-like to a rule string: ``"ns::name"`` (every overload)
    or ``"ns::name.overload"``."""
    if isinstance(op, OpOverload):
        return _overload_rule(op)
    if isinstance(op, OpOverloadPacket):
        return op._qualified_op_name
    if isinstance(op, str):
        packet, overload = _resolve_op_string(api, op)
        return packet if overload is None else f"{packet}.{overload}"
    custom = getattr(op, "_opoverload", None)
    if isinstance(custom, OpOverload):  # torch.library.custom_op objects
        return _op_rule(api, custom)
    raise TypeError(
        f"{api}: expected an OpOverload, OpOverloadPacket, 'ns::name.overload' string "
        f"or torch.library.custom_op, got {type(op).__name__}"
        + (
            "; higher-order operators are cached by torch's own rules, not by a policy"
            if isinstance(op, torch._ops.HigherOrderOperator)
            else ""
        )
    )


def _overload_rule(op: OpOverload) -> str:
    return f"{op._schema.name}.{op._overloadname}"


def _check_namespace(api: str, ns: object) -> str:
    if isinstance(ns, torch.library.Library):
        ns = ns.ns
    if not isinstance(ns, str):
        raise TypeError(
            f"{api}: expected a namespace string or a torch.library.Library, "
            f"got {type(ns).__name__}"
        )
    if not _NAMESPACE_RE.match(ns):
        fix = ns.split("::")[0].strip() if "::" in ns else ""
        hint = f"; pass {fix!r}" if fix and _NAMESPACE_RE.match(fix) else ""
        raise ValueError(f"{api}: {ns!r} is not a namespace{hint}")
    return ns


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
    ) -> None:
        if not isinstance(include_builtins, bool):
            raise TypeError("CachePolicy(include_builtins=...): expected a bool")
        if isinstance(namespaces, (str, bytes, torch.library.Library)):
            raise TypeError(
                f"CachePolicy(namespaces=...): expected a list of namespaces; "
                f"wrap it: namespaces=[{namespaces!r}]"
            )
        if predicate is not None and not callable(predicate):
            raise TypeError("CachePolicy(predicate=...): expected a callable f(op) -> bool")
        if context_key is not None and not callable(context_key):
            raise TypeError("CachePolicy(context_key=...): expected a callable f() -> Hashable")
        if isinstance(context_namespaces, (str, bytes, torch.library.Library)):
            raise TypeError(
                f"CachePolicy(context_namespaces=...): expected a list of namespaces; "
                f"wrap it: context_namespaces=[{context_namespaces!r}]"
            )
        self._lock = threading.RLock()
        self._include_builtins = include_builtins
        self._namespaces: set[str] = {
            _check_namespace("CachePolicy(namespaces=...)", ns) for ns in namespaces
        }
        self._allowed: set[str] = {_op_rule("CachePolicy(allow=...)", op) for op in allow}
        self._denied: set[str] = {_op_rule("CachePolicy(deny=...)", op) for op in deny}
        self._predicate = predicate
        self._context_hook = context_key
        self._context_namespaces: frozenset[str] | None = (
            None
            if context_namespaces is None
            else frozenset(
                _check_namespace("CachePolicy(context_namespaces=...)", ns) for ns in context_namespaces
            )
        )
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
        ns = _check_namespace("CachePolicy.register_namespace(...)", ns)
        with self._lock:
            self._namespaces.add(ns)
            self._rebuild()
        return _Registrar()

    def register_op(self, op: OpLike) -> _Registrar:
        """Caches ``op`` (an overload, a packet = all overloads, a name, a custom_op).

        Allowing an op by name is also how an op that mutates its arguments
        opts in to caching. Works as a plain call and as a decorator.
        """
        rule = _op_rule("CachePolicy.register_op(...)", op)
        with self._lock:
            self._allowed.add(rule)
            self._rebuild()
        return _Registrar()

    def deny(self, op: OpLike) -> _Registrar:
        """Never caches ``op``; beats every other rule. Works as a decorator too."""
        rule = _op_rule("CachePolicy.deny(...)", op)
        with self._lock:
            self._denied.add(rule)
            self._rebuild()
        return _Registrar()

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
    def namespaces(self) -> frozenset[str]:
        """The namespaces this policy caches, builtins included when enabled."""
        extra = BUILTIN_NAMESPACES if self._include_builtins else frozenset()
        return frozenset(self._namespaces) | extra

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
        # Capture the memo first: if a rule changes while we decide, our
        # (old-rules) decision lands in the old memo, never in the new one.
        memo = self._decisions
        decision = memo.get(op)
        if decision is None:
            if not isinstance(op, OpOverload):
                hop = isinstance(op, torch._ops.HigherOrderOperator)
                raise TypeError(
                    f"CachePolicy.decide(...): expected an OpOverload (torch.ops.ns.name.overload), "
                    f"got {_type_name(op)}"
                    + ("; higher-order operators are cached by torch's own rules, not by a policy" if hop else "")
                )
            decision, memoize = self._decide_uncached(op)
            if memoize:
                memo[op] = decision
        return decision

    def is_cacheable(self, op: OpOverload) -> bool:
        """Shorthand for ``decide(op).cacheable``."""
        return self.decide(op).cacheable

    def explain(self, op: OpOverload) -> str:
        """One line per fact the decision rests on, for people."""
        decision = self.decide(op)
        verdict = "cacheable" if decision.cacheable else "not cacheable"
        keys = sorted(k.name for k in keyset.kernel_keys(op))
        lines = [
            f"{_overload_rule(op)}: {verdict}: {decision.reason}",
            f"  kernels registered for: {', '.join(keys) if keys else '(none)'}",
        ]
        if op.namespace not in BUILTIN_NAMESPACES and decision.cacheable:
            lines.append(
                "  per call, the mode still bypasses unbacked scalar outputs, undeclared "
                "aliasing" + ("" if decision.explicit else " and argument mutation")
            )
        return "\n".join(lines)

    def _decide_uncached(self, op: OpOverload) -> tuple[CacheDecision, bool]:
        overload = _overload_rule(op)
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
                f"{_type_name(result)} for {op}; it must return a Python bool"
            )
        return result

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
        return f"{type(self).__name__}({', '.join(parts)})"


def _type_name(obj: object) -> str:
    """``int``, but ``numpy.bool`` for types outside the builtins."""
    cls = type(obj)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def _which(overload: str, packet: str, rules: set[str]) -> str:
    return overload if overload in rules else packet
