"""``torch_cachepolicy.FakeTensorMode``: stock FakeTensorMode plus a cache policy."""

from __future__ import annotations

import logging
import threading
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import torch
import torch._decomp
import torch.utils._pytree as pytree
from torch._higher_order_ops.utils import registered_hop_fake_fns
from torch._library import custom_ops as _custom_ops
from torch._ops import OpOverload
from torch._subclasses import fake_tensor as _ft
from torch._subclasses._fake_tensor_utils import _CacheKeyState
from torch._subclasses.fake_tensor import (
    DispatchCacheInfo,
    _BypassDispatchCache,
    _DispatchCacheBypassEntry,
    _DispatchCacheKey,
    _DispatchCacheValidEntry,
)
from torch._subclasses.meta_utils import assert_eq, assert_metadata_eq
from torch.utils._python_dispatch import TorchDispatchMode
from typing_extensions import override

from torch_cachepolicy import keyset, synth
from torch_cachepolicy.keybuilder import KeyStats, cache_key
from torch_cachepolicy.keyparts import GENERIC_SLOTS, ArgSlots, extend_key
from torch_cachepolicy.policy import BUILTIN_NAMESPACES, CachePolicy
from torch_cachepolicy.report import CacheReport, OpStats
from torch_cachepolicy.safety import (
    InputSnapshot,
    check_backend_op,
    check_backend_output,
    describe,
    first_difference,
    verify_entry,
)
from torch_cachepolicy.store import CacheStore, _Partition, _Table, evict_when_collected

__all__ = ["CrosscheckError", "FakeTensorMode"]

_StockMode = _ft.FakeTensorMode
_fake_registry = torch._library.simple_registry.singleton

# Routes: which storage a dispatch of an operator uses.
_STOCK = 0  # policy-independent: torch's own storage (or the store when private)
_POLICY = 1  # admitted only by the policy: the store, with the extra safety checks
_BYPASS = 2  # the policy does not admit it: never looked up anywhere
_HOP = 3  # a higher-order operator: torch's rules, keyed by the policy's context

# Sub-tables of a partition for entries that do not depend on a fake kernel.
_STOCK_SUB = ("stock",)

_RUNS_EXCLUDED = "its kernel dispatches an op the policy denies"
_NO_RULES: Mapping[object, Any] = {}
_NO_KWARGS: Mapping[str, object] = {}

# Note [Entering the hit path directly]
# Stock FakeTensorMode.dispatch, before it calls _cached_dispatch_impl, logs
# the call at DEBUG (formatting it under no_dispatch(), which costs a context
# manager even when nothing is logged) and serves the ops of two tables
# (_DISPATCH_META_HANDLERS, _DISPATCH_HANDLE_DIRECTLY) itself. For an op this
# mode has routed before (so it reached _cached_dispatch_impl once), with the
# two tables still not holding it and DEBUG logging off, our dispatch calls
# _cached_dispatch_impl itself: exactly what stock's would do, minus a no-op.
# Only while stock's dispatch uses these names and no others (read from its
# code, so a torch that adds a step to it turns the shortcut off).
_STOCK_DISPATCH_NAMES = frozenset(
    {
        "DEBUG",
        "IncrementRecursionCount",
        "RECURSION_COUNT",
        "_DISPATCH_HANDLE_DIRECTLY",
        "_DISPATCH_META_HANDLERS",
        "_cached_dispatch_impl",
        "_dispatch_impl",
        "cache_enabled",
        "debug",
        "getEffectiveLevel",
        "in_kernel_invocation_manager",
        "log",
        "logging",
        "no_dispatch",
    }
)
_DIRECT_HIT_PATH = frozenset(_StockMode.dispatch.__code__.co_names) == _STOCK_DISPATCH_NAMES
_META_HANDLERS = _ft._DISPATCH_META_HANDLERS
_HANDLE_DIRECTLY = _ft._DISPATCH_HANDLE_DIRECTLY
_FT_LOG = _ft.log
# Output plans a mode keeps (see _output_from_cache_entry).
_MAX_PLANS = 4096


def _python_dispatcher_enabled() -> bool:
    return torch._C._dispatch_tls_is_dispatch_key_included(torch._C.DispatchKey.PythonDispatcher)


class CrosscheckError(RuntimeError):
    """A cache hit differed from an uncached dispatch of the same call."""


class _Route:
    """How this mode treats one operator; computed once per op and policy.

    Attributes:
        kind: ``_STOCK``, ``_POLICY``, ``_BYPASS`` or ``_HOP``.
        func: the operator.
        label: the bypass reason of a ``_BYPASS`` route.
        explicit: allowed by name, so it may mutate its arguments.
        private: entries stay out of torch's storage (Note [Entries that must
            reproduce aliasing]; a failed verification; HOPs under a policy
            that is not stock's).
        taints: denied by the policy; an enclosing entry must not replay
            it (Note [Entries cover inner ops]).
        slots: the arguments the key extension looks at (``_POLICY``, ``_HOP``).
        backend: for ops outside aten/prim/prims, what their entries depend
            on beyond the key, read by ``_sub``: ``(FakeImplHolder, CustomOpDef
            or None, KernelWatch.fingerprint, uses the policy's context,
            func.python_key_table, func.py_kernels)``
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


class _Frame:
    """A miss being computed; see Note [Entries cover inner ops]."""

    __slots__ = ("deps", "tainted")

    def __init__(self) -> None:
        self.tainted = False
        self.deps: dict[_Route, Hashable] = {}


class _Dependent:
    """An entry whose kernel dispatched backend ops: valid while they are unchanged."""

    __slots__ = ("deps", "entry")

    def __init__(self, entry: _DispatchCacheValidEntry, deps: tuple[tuple[_Route, Hashable], ...]) -> None:
        self.entry = entry
        self.deps = deps


class FakeTensorMode(_StockMode):
    """A ``FakeTensorMode`` whose dispatch cache follows a :class:`CachePolicy`.

    Backend operators the policy admits are cached in this mode's
    :class:`CacheStore`, never in torch's class-global cache. Nothing global
    in torch is changed: ``torch._library.utils.is_builtin``,
    ``FakeTensorMode.cache`` and the class counters are left alone (stock
    entries of aten ops are shared with torch's storage, exactly as a stock
    mode shares them, unless the store is isolated).

    Args:
        cache_policy: which operators to cache; ``None`` means
            ``CachePolicy()``, which caches what stock caches.
        cache_store: where policy-dependent entries live; ``None`` gives this
            mode a private store that dies with it. Pass one store to several
            modes to share entries.
        cache_crosscheck: re-run every hit uncached and compare, aliasing
            included. ``None`` follows
            ``torch._dynamo.config.fake_tensor_cache_crosscheck_enabled``.
        **kwargs: every keyword argument of torch's ``FakeTensorMode``.
    """

    # Note [HOPs under a subclass]
    # HigherOrderOperator.dispatch looks up `python_key_table[type(mode)]` by
    # exact type, so rules registered for torch's FakeTensorMode (cond,
    # while_loop, ..., and HOPs defined after we are imported) are invisible
    # to a subclass. With this flag the HOP calls our __torch_dispatch__ (and dispatch),
    # which forwards to the rule registered for the stock class. No HOP's
    # table is modified.
    supports_higher_order_operators = True

    def __init__(
        self,
        *,
        cache_policy: CachePolicy | None = None,
        cache_store: CacheStore | None = None,
        cache_crosscheck: bool | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self._cache_policy = _check_policy("FakeTensorMode(cache_policy=...)", cache_policy)
        if cache_store is None:
            cache_store = CacheStore()
        elif not isinstance(cache_store, CacheStore):
            raise TypeError(
                "FakeTensorMode(cache_store=...): expected a torch_cachepolicy.CacheStore, "
                f"got {type(cache_store).__name__}"
            )
        self._cache_store = cache_store
        if cache_crosscheck is not None:
            if not isinstance(cache_crosscheck, bool):
                raise TypeError("FakeTensorMode(cache_crosscheck=...): expected a bool or None")
            self.cache_crosscheck_enabled = cache_crosscheck
        self._stats: dict[object, OpStats] = {}
        self._key_stats = KeyStats()
        self._synced_identity: object = None
        self._partition = _Partition()  # replaced by the policy's partition on first dispatch
        self._routes: dict[object, _Route] = {}
        # Misses being computed, per thread, and how many are open in all
        # threads (a cheap test on the hit path); Note [Entries cover inner ops].
        self._frames = threading.local()
        self._open_frames = 0
        # `+=` on an attribute is not atomic across threads; a lost update
        # could hide an open frame from the hit path's test.
        self._frames_lock = threading.Lock()
        # id(entry) -> (entry, plan); see _output_from_cache_entry. The entry
        # is held so that its id cannot name another entry while mapped.
        self._plans: dict[int, tuple[object, synth.Plan | None]] = {}

    # ------------------------------------------------------------ public API

    @property
    def cache_policy(self) -> CachePolicy:
        """The policy consulted on every dispatch; may be replaced."""
        return self._cache_policy

    @cache_policy.setter
    def cache_policy(self, policy: CachePolicy | None) -> None:
        self._cache_policy = _check_policy("FakeTensorMode.cache_policy = ...", policy)
        self._synced_identity = None

    @property
    def cache_store(self) -> CacheStore:
        """The store holding this mode's policy-dependent entries."""
        return self._cache_store

    @override
    def cache_info(self) -> DispatchCacheInfo:  # type: ignore[override]
        """Hits, misses and bypasses of this instance; ``size`` counts every entry
        of its store, which other modes may share."""
        # list()/dict() copy in C, so another thread may read while this mode
        # dispatches without "dictionary changed size during iteration".
        all_stats = list(self._stats.values())
        bypasses: dict[str, int] = {}
        for stats in all_stats:
            for reason, n in dict(stats.bypasses).items():
                bypasses[reason] = bypasses.get(reason, 0) + n
        return DispatchCacheInfo(
            sum(s.hits for s in all_stats),
            sum(s.misses for s in all_stats),
            bypasses,
            len(self._cache_store),
        )

    def cache_report(self) -> CacheReport:
        """Per-operator hits, misses and bypass reasons of this instance."""
        return CacheReport.from_stats(self._stats)

    def cache_key_stats(self) -> KeyStats:
        """How many cache keys of this instance the key builder produced, and
        why the others were left to torch's ``_cache_key`` (a copy).

        See :mod:`torch_cachepolicy.keybuilder`: the builder gives the very
        key torch would, only cheaper; its fallbacks (symbolic sizes, tensor
        subclasses, unusual argument types, ...) cost what a stock key costs.
        """
        out = KeyStats()
        out.built = self._key_stats.built
        out.fallbacks = dict(sorted(dict(self._key_stats.fallbacks).items()))
        return out

    @override
    def cache_clear(self) -> None:  # type: ignore[override]
        """Resets this instance's counters and empties its policy's partition
        (shared by modes with equal policies on the same store). torch's
        storage and other partitions are left alone."""
        self._stats = {}
        self._key_stats = KeyStats()
        self._plans = {}
        self._cache_store._partition(self._cache_policy.identity).clear()

    # ------------------------------------------------------------- dispatch

    @override
    def dispatch(
        self,
        func: Any,
        types: Sequence[type],
        args: Sequence[object] = (),
        kwargs: Mapping[str, object] = _NO_KWARGS,
    ) -> object:
        # See Note [HOPs under a subclass]. Ops with a FakeTensorMode rule get
        # that rule, called when stock's dispatcher would call it: always for
        # a HOP, and for an OpOverload (a py_impl(FakeTensorMode) rule) only
        # under the Python dispatcher, the one path that consults an
        # OpOverload's python_key_table. This is `dispatch`, not
        # `__torch_dispatch__`: torch wraps every override of the latter in a
        # dynamo-disabling shim, which would run twice per op.
        handler = getattr(func, "python_key_table", _NO_RULES).get(_StockMode)
        if (
            handler is not None
            and not _redirects_to_mode(func, handler)
            and (not isinstance(func, OpOverload) or _python_dispatcher_enabled())
        ):
            if self._open_frames and isinstance(func, OpOverload):
                # Never reaches _cached_dispatch_impl, but an enclosing miss
                # depends on it all the same (Note [Entries cover inner ops]).
                self._record_rule(func)
            return handler(self, *args, **(kwargs or {}))
        if (
            func in self._routes
            and _DIRECT_HIT_PATH
            and self.cache_enabled
            and func not in _META_HANDLERS
            and func not in _HANDLE_DIRECTLY
            and not _FT_LOG.isEnabledFor(logging.DEBUG)
        ):
            # See Note [Entering the hit path directly].
            return self._cached_dispatch_impl(func, types, args, kwargs or {})
        return super().dispatch(func, types, args, kwargs)

    @override
    def _cached_dispatch_impl(
        self,
        func: OpOverload,
        types: Sequence[type],
        args: Sequence[object],
        kwargs: Mapping[str, object],
    ) -> object:
        if self._cache_policy._identity is not self._synced_identity:
            self._sync_policy()
        route = self._routes.get(func)
        if route is None:
            route = self._route(func)
        kind = route.kind
        stats = self._stats.get(func)
        if stats is None:
            stats = self._stats[func] = OpStats()

        if kind == _BYPASS:
            stats.bypass(route.label)
            if self._open_frames:
                self._record(route)
            return self._dispatch_impl(func, types, args, kwargs)

        state = _CacheKeyState(self.shape_env)
        sub: Hashable = None
        try:
            if kind == _POLICY:
                sub = self._sub(route)
                if self._open_frames:
                    self._record(route, sub)
            # torch's _cache_key, built cheaply when the arguments allow it.
            key = cache_key(self, state, func, args, kwargs, self._key_stats)
            if route.slots is not None:
                key = extend_key(key, route.slots, state, args, kwargs)
        except _BypassDispatchCache as e:
            stats.bypass(e.reason)
            return self._dispatch_impl(func, types, args, kwargs)

        shape_env = state.shape_env if state.cache_on_shape_env() else None
        table: dict[Any, Any]
        if kind == _POLICY:
            try:
                # See Note [What the ShapeEnv knows].
                table = self._partition.table(
                    sub if shape_env is None else self._symbolic_sub(route, sub, shape_env), shape_env
                )
            except TypeError:
                raise self._unhashable_context(func, sub[0]) from None  # type: ignore[index]
        elif route.private or self._cache_store._isolated:
            table = self._private_table(route, shape_env)
        elif shape_env is not None:
            table = shape_env.fake_tensor_cache
        else:
            table = _StockMode.cache

        entry: Any = table.get(key)
        if entry is None:
            return self._miss(route, stats, state, key, table, shape_env, types, args, kwargs)
        if type(entry) is _Dependent:
            if not self._still_valid(entry):
                return self._miss(route, stats, state, key, table, shape_env, types, args, kwargs)
            entry = entry.entry
        elif isinstance(entry, _DispatchCacheBypassEntry):
            stats.bypass(entry.reason)
            if entry.reason == _RUNS_EXCLUDED:
                self._taint_frames()
            return self._dispatch_impl(func, types, args, kwargs)
        output = self._output_from_cache_entry(state, entry, key, func, args)
        stats.hits += 1
        if self.cache_crosscheck_enabled:
            self._crosscheck(output, func, types, args, kwargs)
        return output

    def _miss(
        self,
        route: _Route,
        stats: OpStats,
        state: _CacheKeyState,
        key: _DispatchCacheKey,
        table: dict[Any, Any],
        shape_env: Any,
        types: Sequence[type],
        args: Sequence[object],
        kwargs: Mapping[str, object],
    ) -> object:
        func: Any = route.func
        kind = route.kind
        snapshot = InputSnapshot(args, kwargs)
        frame = self._push_frame()
        try:
            output = self._dispatch_impl(func, types, args, kwargs)
        finally:
            self._pop_frame(frame)

        in_torch_storage = table is _StockMode.cache or (
            shape_env is not None and table is shape_env.fake_tensor_cache
        )
        entry: _DispatchCacheValidEntry | _DispatchCacheBypassEntry | _Dependent
        try:
            if kind == _POLICY:
                check_backend_op(func, args, explicit=route.explicit)
            entry = self._make_cache_entry(state, key, func, args, kwargs, output)  # type: ignore[arg-type]
        except _BypassDispatchCache as e:
            # torch's own verdict (or a schema check of ours on a private
            # table): what a stock mode records, but never in torch's storage.
            stats.bypass(e.reason)
            if in_torch_storage:
                return output
            entry = _DispatchCacheBypassEntry(e.reason)
        else:
            try:
                changed = snapshot.changed()
                if changed is not None:
                    raise _BypassDispatchCache(f"fake kernel changed an input's {changed}")
                if frame.tainted:
                    raise _BypassDispatchCache(_RUNS_EXCLUDED)
                if kind == _POLICY:
                    check_backend_output(state, func, args, output)
                verify_entry(self, state, entry, key, func, args, kwargs, output)
            except _BypassDispatchCache as e:
                stats.bypass(e.reason)
                if e.reason == _RUNS_EXCLUDED:
                    self._taint_frames()
                entry = _DispatchCacheBypassEntry(e.reason)
            else:
                stats.misses += 1
                if frame.deps:
                    entry = _Dependent(entry, tuple(frame.deps.items()))
            if in_torch_storage and not isinstance(entry, _DispatchCacheValidEntry):
                # A stock mode may write (or have written) the entry we just
                # rejected into torch's storage, and torch's storage cannot
                # hold our verdicts or dependencies: from now on this mode
                # keeps the op's entries in its own store. See
                # Note [Entries that must reproduce aliasing].
                route.private = True
                table = self._private_table(route, shape_env)
        if shape_env is not None:
            # Entries must not keep a ShapeEnv alive (torch does the same).
            key.strip_shape_env()
        table[key] = entry
        if isinstance(table, _Table) and kind == _HOP:
            for leaf in pytree.tree_leaves((args, kwargs)):
                owner = _id_hashed_owner(leaf)
                if owner is not None:
                    evict_when_collected(owner, table, key)
        return output

    @override
    def _output_from_cache_entry(
        self,
        state: _CacheKeyState,
        entry: _DispatchCacheValidEntry,
        key: _DispatchCacheKey,
        func: OpOverload,
        args: Sequence[object],
    ) -> Any:
        # Note [One synthesis for hits and their verification]
        # Hits of plain entries are built by synth.build (no dispatch, torch's
        # FakeTensor constructor), everything else by torch. verify_entry and
        # the crosscheck call this method too, so every entry is checked, on
        # the miss that creates it, against the very function its hits use.
        if synth._meta_empty_strided is None:
            return super()._output_from_cache_entry(state, entry, key, func, args)
        planned = self._plans.get(id(entry))
        if planned is None or planned[0] is not entry:
            # Bounded: torch also calls this on entries it builds and drops
            # on every miss (to check each output), and torch's storage may
            # drop entries we still hold. Plans are cheap to rebuild.
            if len(self._plans) >= _MAX_PLANS:
                self._plans = {}
            planned = self._plans[id(entry)] = (entry, synth.output_plan(entry, func))
        plan = planned[1]
        if plan is not None:
            if synth._canary.remaining > 0:
                output = synth.checked_build(
                    self, plan, lambda: super(FakeTensorMode, self)._output_from_cache_entry(state, entry, key, func, args), args
                )
            else:
                output = synth.build(self, plan, args)
            if output is not synth.TORCH_PATH:
                return output
        return super()._output_from_cache_entry(state, entry, key, func, args)

    @override
    def _validate_cache_key(
        self, func: OpOverload, args: Sequence[object], kwargs: Mapping[str, object]
    ) -> None:
        # Note [Reusing torch's validation]
        # Stock validation ends with "non-builtin" (is_builtin) followed by the
        # CompositeImplicitAutograd-view check. For an op the policy admits we
        # accept that one reason and nothing else: every earlier check (tags,
        # lift ops, unsafe view, ...) has already run, and the CIA-view check
        # is part of the policy's structural decision (Note [Structural checks]).
        # So what an op's owner declares through torch's tags
        # (data_dependent_output, dynamic_output_shape, inplace_view) keeps a
        # backend op out of the cache under every policy, even one admitting it
        # by name (test_mode.py, TestOwnerDeclarations).
        try:
            super()._validate_cache_key(func, args, kwargs)
        except _BypassDispatchCache as e:
            route = self._routes.get(func)
            if e.reason != "non-builtin" or route is None or route.kind != _POLICY:
                raise

    # --------------------------------------------------------------- helpers

    def _sync_policy(self) -> None:
        policy = self._cache_policy
        identity = policy._identity
        self._partition = self._cache_store._partition(identity)
        self._routes = {}
        self._synced_identity = identity

    def _route(self, func: object) -> _Route:
        policy = self._cache_policy
        route: _Route
        if not isinstance(func, OpOverload):
            # A HOP. Note [Entries cover inner ops]: an invoke_subgraph entry
            # replays the whole subgraph, so it must carry the subgraph's
            # dependencies, which only our store can hold. Even under a
            # stock-equivalent policy: an entry a stock mode wrote into
            # torch's storage may predate a re-registered kernel inside.
            route = _Route(_HOP, func)
            route.private = True
            route.slots = GENERIC_SLOTS
            self._routes[func] = route
            return route
        decision = policy.decide(func)
        if not decision.cacheable:
            route = _Route(_BYPASS, func, decision.label)
            route.taints = decision.label in _EXCLUDED_BY_RULE
        elif func.namespace in BUILTIN_NAMESPACES:
            route = _Route(_STOCK, func, decision.label, explicit=decision.explicit)
            route.private = _returns_undeclared_view(func)
        else:
            route = _Route(_POLICY, func, decision.label, explicit=decision.explicit)
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
        if func in policy._decisions:
            self._routes[func] = route
        return route

    def _sub(self, route: _Route) -> Hashable:
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
            self._context_value(route) if uses_context else None,
            None if kernel is None else kernel.func,
            None if opdef is None else opdef._abstract_fn,
            fingerprint(),
            # Python-level kernels fake dispatch prefers to the dispatcher's:
            # py_impl rules (a FakeTensorMode rule, a CIA or Meta kernel), a
            # Python meta, and (for symbolic inputs, see _symbolic_sub) a
            # decomposition. py_kernels is tested first: DispatchKey hashes slowly.
            python_key_table.get(_StockMode),
            (py_kernels.get(_CIA), py_kernels.get(_META)) if py_kernels else None,
            _meta_table.get(route.func),  # type: ignore[call-overload]
        )

    def _symbolic_sub(self, route: _Route, sub: Hashable, shape_env: Any) -> Hashable:
        # See Note [What the ShapeEnv knows]. With symbolic inputs, fake
        # dispatch also prefers a Python decomposition of the op.
        return (sub, shape_env._version_counter, _decomposition_table.get(route.func))  # type: ignore[call-overload]

    def _context_value(self, route: _Route) -> Hashable:
        try:
            return self._cache_policy.context_key()
        except Exception as e:
            raise RuntimeError(
                f"{self._cache_policy!r}.context_key() raised while dispatching {route.func}: {e!r}"
            ) from e

    def _private_table(self, route: _Route, shape_env: Any) -> _Table:
        # Note [What the ShapeEnv knows]
        # A backend kernel may ask the ShapeEnv what it can prove
        # (statically_known_true, guard_or_false); the answer changes when the
        # ShapeEnv learns something (torch._check), while the key, which holds
        # the expressions, does not. The ShapeEnv's version counter (what its
        # own lru caches key on) joins the sub-table of symbolic entries that a
        # backend kernel computed: policy ops, and HOPs, which may run them.
        if route.kind != _HOP:
            return self._partition.table(_STOCK_SUB, shape_env)
        context = self._context_value(route) if self._cache_policy.has_context else None
        version = None if shape_env is None else shape_env._version_counter
        try:
            return self._partition.table((_HOP_SUB, context, version), shape_env)
        except TypeError:
            raise self._unhashable_context(route.func, context) from None

    def _unhashable_context(self, func: object, context: object) -> TypeError:
        from torch_cachepolicy.policy import unhashable_part

        where = unhashable_part(context) or f"a {type(context).__name__}"
        return TypeError(
            f"{self._cache_policy!r}.context_key() returned an unhashable {type(context).__name__} "
            f"while dispatching {func}: {where}; return a hashable value such as a tuple or a string"
        )

    # Note [Entries cover inner ops]
    # An entry replays everything its kernel did, including the ops that
    # kernel dispatched: a backend kernel calling another backend op, or
    # invoke_subgraph running a whole subgraph. Those inner ops may read the
    # policy's context, be re-registered, or be denied by the policy, and
    # the outer key sees none of it. So each miss opens a frame; every inner
    # dispatch of a backend op, cached or not, records what its result
    # depends on beyond its arguments (its _sub: kernels and context), and
    # a denied op taints the frame. A tainted miss becomes a negative
    # entry, so the denied kernel runs every time; a miss with
    # dependencies becomes a _Dependent entry, served only while each
    # dependency still has the value it had (else it is a miss again). A hit
    # of a _Dependent entry passes its dependencies on to enclosing frames.

    def _push_frame(self) -> _Frame:
        frames: list[_Frame] | None = getattr(self._frames, "stack", None)
        if frames is None:
            frames = self._frames.stack = []
        frame = _Frame()
        frames.append(frame)
        with self._frames_lock:
            self._open_frames += 1
        return frame

    def _pop_frame(self, frame: _Frame) -> None:
        with self._frames_lock:
            self._open_frames -= 1
        self._frames.stack.remove(frame)

    def _frame_stack(self) -> list[_Frame]:
        return getattr(self._frames, "stack", None) or []

    def _record(self, route: _Route, sub: Hashable = None) -> None:
        frames = self._frame_stack()
        if not frames:
            return
        if route.taints:
            for frame in frames:
                frame.tainted = True
            return
        if route.backend is None:
            return
        if route.kind == _BYPASS:
            # Not cached itself, but what its kernel returns (and so the
            # enclosing entry) depends on the same things as a cached op's.
            sub = self._sub(route)
        for frame in frames:
            seen = frame.deps.setdefault(route, sub)
            if seen != sub:
                # The kernel saw two values of one dependency: no single
                # value can stand for this miss.
                frame.tainted = True

    def _record_rule(self, func: OpOverload) -> None:
        if self._cache_policy._identity is not self._synced_identity:
            self._sync_policy()
        route = self._routes.get(func) or self._route(func)
        if route.taints:
            self._taint_frames()
        elif route.backend is not None:
            self._record(route, self._sub(route))

    def _taint_frames(self) -> None:
        for frame in self._frame_stack():
            frame.tainted = True

    def _still_valid(self, entry: _Dependent) -> bool:
        for route, sub in entry.deps:
            if self._sub(route) != sub:
                return False
        if self._open_frames:
            for route, sub in entry.deps:
                self._record(route, sub)
        return True

    def _crosscheck(
        self,
        output: object,
        func: OpOverload,
        types: Sequence[type],
        args: Sequence[object],
        kwargs: Mapping[str, object],
    ) -> None:
        # Describe the hit before the rerun, which may change the inputs.
        hit = describe(output, args, kwargs)
        snapshot = InputSnapshot(args, kwargs)
        with _ft.disable_fake_tensor_cache(self):
            try:
                expected = self._dispatch_impl(func, types, args, kwargs)
            except Exception as e:
                raise CrosscheckError(
                    f"FakeTensorMode cache crosscheck: {func} raised when dispatched "
                    f"uncached after a hit: {e!r}"
                ) from e
        changed = snapshot.changed()
        if changed is not None:
            raise CrosscheckError(
                f"FakeTensorMode cache crosscheck: an uncached dispatch of {func} changed "
                f"an input's {changed}; the cache hit did not"
            )
        diff = first_difference(hit, describe(expected, args, kwargs))
        if diff is None:
            try:
                _assert_same_tensors(expected, output)
            except AssertionError as e:
                diff = str(e)
        if diff is not None:
            raise CrosscheckError(
                f"FakeTensorMode cache crosscheck: the cached output of {func} differs "
                f"from an uncached dispatch in {diff}"
            )


_EXCLUDED_BY_RULE = frozenset({"denied by policy"})
_CIA = torch._C.DispatchKey.CompositeImplicitAutograd
_META = torch._C.DispatchKey.Meta
_decomposition_table = torch._decomp.decomposition_table
_meta_table = torch._decomp.meta_table
_HOP_SUB = "hop"


def _check_policy(api: str, policy: object) -> CachePolicy:
    if policy is None:
        return CachePolicy()
    if not isinstance(policy, CachePolicy):
        raise TypeError(
            f"{api}: expected a torch_cachepolicy.CachePolicy, got {type(policy).__name__}"
        )
    return policy


def _redirects_to_mode(func: object, handler: object) -> bool:
    # Such rules call mode.__torch_dispatch__ straight back (the cached
    # path of HOPs registered with register_fake); forwarding would recurse.
    return func in registered_hop_fake_fns or getattr(handler, "__qualname__", "") == (
        "redirect_to_mode.<locals>.impl"
    )


def _id_hashed_owner(leaf: object) -> object | None:
    """The object whose id torch put in a key (see FakeTensorMode._prep_args_for_hash)."""
    from torch._higher_order_ops.auto_functionalize import FunctionalCallableWithEpilogue
    from torch._higher_order_ops.utils import SubgraphCallableWrapper

    if isinstance(leaf, torch.fx.GraphModule):
        return leaf
    if isinstance(leaf, SubgraphCallableWrapper):
        return leaf.subgraph
    if isinstance(leaf, FunctionalCallableWithEpilogue):
        return leaf.orig_callable
    return None


def _returns_undeclared_view(func: OpOverload) -> bool:
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


def _assert_same_tensors(expected: object, actual: object) -> None:
    # torch's own metadata comparison (bases of views, leafness, grads), on
    # top of describe(), as stock's crosscheck does.
    for e, a in zip(pytree.tree_leaves(_plain(expected)), pytree.tree_leaves(_plain(actual)), strict=False):
        if isinstance(e, torch.Tensor) and isinstance(a, torch.Tensor):
            assert_metadata_eq(assert_eq, e, a)


def _plain(value: object) -> object:
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    return value


# Keep mypy honest about the base class we extend.
_: type[TorchDispatchMode] = FakeTensorMode
