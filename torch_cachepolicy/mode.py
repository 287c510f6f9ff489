"""``torch_cachepolicy.FakeTensorMode``: stock FakeTensorMode plus a cache policy.

This module holds the mode itself: its constructor, its public API and the
dispatch overrides. What it consults lives beside it: the route of each
operator and what its entries depend on (:mod:`~torch_cachepolicy.routes`),
the frames of misses being computed (:mod:`~torch_cachepolicy.deps`), the
checks on a miss and the crosscheck (:mod:`~torch_cachepolicy.safety`), the
key (:mod:`~torch_cachepolicy.keybuilder`, :mod:`~torch_cachepolicy.keyparts`),
the storage (:mod:`~torch_cachepolicy.store`) and a hit's output
(:mod:`~torch_cachepolicy.synth`).
"""

from __future__ import annotations

import copy
import functools
import logging
import weakref
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, TypeVar, cast

import torch.utils._pytree as pytree
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
from torch.utils._python_dispatch import TorchDispatchMode
from typing_extensions import override

from torch_cachepolicy import hitpath, routes
from torch_cachepolicy.arguments import check_cache_arguments, check_policy
from torch_cachepolicy.deps import RUNS_EXCLUDED, Dependent, Frames
from torch_cachepolicy.keybuilder import KeyStats, cache_key
from torch_cachepolicy.keyparts import check_visible, extend_key
from torch_cachepolicy.policy import CachePolicy
from torch_cachepolicy.report import CacheReport, OpStats
from torch_cachepolicy.routes import BYPASS, HOP, HOP_SUB, NO_RULES, POLICY, STOCK, STOCK_SUB, Route
from torch_cachepolicy.safety import (
    CrosscheckError,
    InputSnapshot,
    check_backend_op,
    check_backend_output,
    crosscheck,
    describe,
    first_difference,
    shape_env_state,
    verify_entry,
)
from torch_cachepolicy.store import CacheStore, Partition, Table, evict_when_collected, id_hashed_owner, partition
from torch_cachepolicy.symbols import check_own_symbols, knowledge
from torch_cachepolicy.synth import Synthesizer, stub_symint_output

_NATIVE_HITS = hitpath.native_hits
_DECLINED = hitpath.DECLINED

__all__ = ["CrosscheckError", "FakeTensorMode"]

_StockMode = _ft.FakeTensorMode
_NO_KWARGS: Mapping[str, object] = {}
_F = TypeVar("_F", bound=Callable[..., Any])

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

# Bypass reasons (Note [The kernel in effect]).
REAL_TENSORS = "propagate_real_tensors"
PROFILED = "a custom-ops profile replaces its fake kernel"
BACKEND_FALLBACK = "no fake kernel for static inputs (the Meta backend fallback ran)"


# Every live policy mode, for the class-level cache_info() and cache_clear()
# (Note [The cache API on the class]).
_LIVE_MODES: weakref.WeakSet[FakeTensorMode] = weakref.WeakSet()


class _AlsoOnTheClass:
    """A method that, called on the class instead of an instance, runs ``on_class(cls)``.

    Note [The cache API on the class]
    torch's ``cache_info()`` and ``cache_clear()`` are classmethods over its
    class-wide cache and counters; a policy mode's are per instance. Code
    written for stock calls them on the class (``FakeTensorMode.cache_clear()``
    in torch's own tests), so on the class they keep stock's meaning for
    everything a FakeTensorMode caches: ``cache_info()`` adds up torch's
    class-wide counters (stock modes) and every live policy mode's, and
    ``cache_clear()`` does what torch's does (the caller asked for it by
    name: torch's class-wide cache and counters) and clears every live policy
    mode. Nothing else of the package touches torch's class-wide state.
    """

    def __init__(self, on_instance: Callable[..., Any], on_class: Callable[..., Any]) -> None:
        self.__wrapped__ = on_instance
        self.__doc__ = on_instance.__doc__
        self._on_class = on_class

    def __get__(self, obj: object, objtype: type | None = None) -> Callable[..., Any]:
        if obj is None:
            return functools.partial(self._on_class, objtype)
        return self.__wrapped__.__get__(obj, objtype)  # type: ignore[no-any-return]


def _also_on_the_class(on_class: Callable[..., Any]) -> Callable[[_F], _F]:
    def wrap(on_instance: _F) -> _F:
        return cast(_F, _AlsoOnTheClass(on_instance, on_class))

    return wrap


def _class_cache_info(cls: type) -> DispatchCacheInfo:
    stock = _StockMode.cache_info()
    modes = [m for m in list(_LIVE_MODES) if isinstance(m, cls)]
    infos = [m.cache_info() for m in modes]
    bypasses = dict(stock.bypasses)
    for info in infos:
        for reason, n in info.bypasses.items():
            bypasses[reason] = bypasses.get(reason, 0) + n
    stores = {id(m.cache_store): m.cache_store for m in modes}
    return DispatchCacheInfo(
        stock.hits + sum(i.hits for i in infos),
        stock.misses + sum(i.misses for i in infos),
        bypasses,
        stock.size + sum(len(store) for store in stores.values()),
    )


def _class_cache_clear(cls: type) -> None:
    _StockMode.cache_clear()
    for mode in list(_LIVE_MODES):
        if isinstance(mode, cls):
            mode.cache_clear()


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
        check_cache_arguments("FakeTensorMode", cache_policy, cache_store, cache_crosscheck)
        super().__init__(**kwargs)
        self._cache_policy = CachePolicy() if cache_policy is None else cache_policy
        # A store the mode made is private to it; one passed in is shared
        # (Note [Copying a policy mode]).
        self._owns_store = cache_store is None
        self._cache_store = CacheStore() if cache_store is None else cache_store
        # Read for every hit of an aten op; a store's isolation never changes.
        self._isolated = self._cache_store.isolated
        if cache_crosscheck is not None:
            self.cache_crosscheck_enabled = cache_crosscheck
        self._stats: dict[object, OpStats] = {}
        self._key_stats = KeyStats()
        self._init_transient()

    def _init_transient(self) -> None:
        """The state a copy of the mode starts afresh (Note [Copying a policy mode])."""
        _LIVE_MODES.add(self)
        self._synced_identity: object = None
        self._partition = Partition()  # replaced by the policy's partition on first dispatch
        self._routes: dict[object, Route] = {}
        # Misses being computed; Note [Entries cover inner ops].
        self._frames = Frames()
        self._synth = Synthesizer()

    # Note [Copying a policy mode]
    # Stock modes (and so their FakeTensors, and GraphModules holding those)
    # copy with copy.deepcopy, attribute by attribute; passes deep-copy
    # graphs whose node.meta["val"] are FakeTensors. A policy mode copies
    # the same way, except for what is bound to this instance: the frames of
    # misses in flight (threads, locks), the route memo and the synced
    # partition (rebuilt on the first dispatch) and the output plans start
    # afresh. The policy is copied as a policy copies (Note [Copying a
    # policy]); the counters are copied. Entries are a cache, so a copy may
    # start without them: a store the mode made itself becomes a new empty
    # store of the same isolation, while a store passed in by the user is
    # shared with the copy (entries are keyed by metadata, never by mode, so
    # the copy reads them as any mode on that store would). copy.copy shares
    # the policy and the store and copies the counters. Pickling behaves as stock's: its
    # state is stock's plus the policy, the counters and an empty store.

    _TRANSIENT = ("_synced_identity", "_partition", "_routes", "_frames", "_synth")

    def __getstate__(self) -> dict[str, object]:
        state = {k: v for k, v in self.__dict__.items() if k not in self._TRANSIENT}
        if self._owns_store:
            state["_cache_store"] = CacheStore(isolated=self._isolated)
        return state

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self._init_transient()

    def __copy__(self) -> FakeTensorMode:
        clone = type(self).__new__(type(self))
        state = self.__getstate__()
        state["_cache_store"] = self._cache_store
        state["_stats"] = copy.deepcopy(self._stats)
        state["_key_stats"] = copy.deepcopy(self._key_stats)
        clone.__setstate__(state)
        return clone

    def __deepcopy__(self, memo: dict[int, Any]) -> FakeTensorMode:
        clone = type(self).__new__(type(self))
        memo[id(self)] = clone
        state = self.__getstate__()
        store = state.pop("_cache_store")
        state = copy.deepcopy(state, memo)
        state["_cache_store"] = store
        clone.__setstate__(state)
        return clone

    # ------------------------------------------------------------ public API

    @property
    def cache_policy(self) -> CachePolicy:
        """The policy consulted on every dispatch; may be replaced."""
        return self._cache_policy

    @cache_policy.setter
    def cache_policy(self, policy: CachePolicy | None) -> None:
        policy = check_policy("FakeTensorMode.cache_policy = ...", policy)
        self._cache_policy = CachePolicy() if policy is None else policy
        self._synced_identity = None

    @property
    def cache_store(self) -> CacheStore:
        """The store holding this mode's policy-dependent entries."""
        return self._cache_store

    @override
    @_also_on_the_class(_class_cache_info)
    def cache_info(self) -> DispatchCacheInfo:  # type: ignore[override]
        """Hits, misses and bypasses of this instance; ``size`` counts every entry
        of its store, which other modes may share. Called on the class, as
        torch's: the totals of torch's class-wide counters and of every live
        policy mode (Note [The cache API on the class])."""
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
    @_also_on_the_class(_class_cache_clear)
    def cache_clear(self) -> None:  # type: ignore[override]
        """Resets this instance's counters and empties its policy's partition
        (shared by modes with equal policies on the same store). torch's
        storage and other partitions are left alone. Called on the class, as
        torch's: clears torch's class-wide cache and counters, and every live
        policy mode (Note [The cache API on the class])."""
        self._stats = {}
        self._key_stats = KeyStats()
        self._synth.clear()
        # Routes hold the counters just dropped; the next dispatch routes afresh.
        self._routes = {}
        self._synced_identity = None
        partition(self._cache_store, self._cache_policy.identity).clear()

    # ------------------------------------------------------------- dispatch

    @override
    def dispatch(
        self,
        func: Any,
        types: Sequence[type],
        args: Sequence[object] = (),
        kwargs: Mapping[str, object] = _NO_KWARGS,
    ) -> object:
        # Note [Rules for the FakeTensorMode class]
        # torch looks up the rules registered for the FakeTensorMode class by
        # the mode's exact type, so none of them reaches a subclass; this
        # method applies each where stock's dispatch would apply it, in
        # stock's order, before the cache (stock never caches their results):
        # 1. under the Python dispatcher, an OpOverload's py_impl(FakeTensorMode)
        #    rule (its python_key_table), which the Python dispatcher calls
        #    instead of the mode; for a HOP, its rule for FakeTensorMode,
        #    always (Note [HOPs under a subclass]);
        # 2. a rule from torch.library.register_torch_dispatch(op,
        #    FakeTensorMode, ...), which the dispatcher calls instead of the
        #    mode's __torch_dispatch__.
        # This is `dispatch`, not `__torch_dispatch__`: torch wraps every
        # override of the latter in a dynamo-disabling shim, which would run
        # twice per op.
        route = self._routes.get(func)
        handler = getattr(func, "python_key_table", NO_RULES).get(_StockMode)
        if handler is None and not isinstance(func, OpOverload):
            # A HOP without a rule for FakeTensorMode: stock's HOP dispatch
            # raises before reaching the mode.
            raise NotImplementedError(
                f"There was no rule registered for HigherOrderOperator {func.name()} and mode {self} "
                "(torch_cachepolicy.FakeTensorMode applies the rules registered for torch's FakeTensorMode; "
                f"register one with {func.name()}.py_impl(FakeTensorMode))"
            )
        if (
            handler is not None
            and not routes.redirects_to_mode(func, handler)
            and (not isinstance(func, OpOverload) or routes.python_dispatcher_enabled())
        ):
            if self._frames.open and isinstance(func, OpOverload):
                # Never reaches _cached_dispatch_impl, but an enclosing miss
                # depends on it all the same (Note [Entries cover inner ops]).
                self._record_rule(func)
            return handler(self, *args, **(kwargs or {}))
        if route is None:
            rule = routes.torch_dispatch_rule(None, func)
        else:
            # A routed op keeps its registry entry's rules by class (Route.rules).
            rules = route.rules
            rule = rules.get(_StockMode) if rules else None
        if rule is not None:
            if self._frames.open:
                self._record_rule(func)
            return rule(self, func, types, args, kwargs or {})
        if (
            route is not None
            and route.direct
            and _DIRECT_HIT_PATH
            and self.cache_enabled
            and self._cache_policy.identity is self._synced_identity
            and not _FT_LOG.isEnabledFor(logging.DEBUG)
        ):
            # See Note [Entering the hit path directly].
            return self._dispatch_routed(route, func, types, args, kwargs or {})
        return super().dispatch(func, types, args, kwargs)

    @override
    def _cached_dispatch_impl(
        self,
        func: OpOverload,
        types: Sequence[type],
        args: Sequence[object],
        kwargs: Mapping[str, object],
    ) -> object:
        if self._cache_policy.identity is not self._synced_identity:
            self._sync_policy()
        route = self._routes.get(func)
        if route is None:
            route = self._route(func)
        return self._dispatch_routed(route, func, types, args, kwargs)

    def _dispatch_routed(
        self,
        route: Route,
        func: OpOverload,
        types: Sequence[type],
        args: Sequence[object],
        kwargs: Mapping[str, object],
    ) -> object:
        """``_cached_dispatch_impl`` for an op whose current route is known.

        An OpOverload's hash is a Python method, so each dict keyed by the op
        costs a call on the hit path: the route is found once per dispatch
        and carries what else is per op (its counters, whether the direct
        hit path applies).
        """
        kind = route.kind
        stats = route.stats

        if kind == BYPASS:
            stats.bypass(route.label)
            if self._frames.open:
                self._record(route)
            return self._dispatch_impl(func, types, args, kwargs)

        sub: Hashable = None
        try:
            if kind != STOCK and self.propagate_real_tensors:
                # See Note [The kernel in effect]: the real kernel's outputs
                # may replace the fake kernel's.
                raise _BypassDispatchCache(REAL_TENSORS)
            if kind == POLICY:
                sub = routes.kernel_sub(route, self._cache_policy)
                if route.fallback_capable:
                    sub = (*sub, self.allow_fallback_kernels)  # type: ignore[misc]
                if self._frames.open:
                    self._record(route, sub)
                if sub[routes.SUB_PROFILE] is not None:  # type: ignore[index]
                    raise _BypassDispatchCache(PROFILED)
                if route.slots.opaque:  # type: ignore[union-attr]
                    check_visible(route.slots, route.immutable, args, kwargs)  # type: ignore[arg-type]
            if (
                route.native
                and route.static
                and _NATIVE_HITS is not None
                # How hits are built, overridden (a subclass) or patched (on
                # the class or this mode), keeps every hit on the Python
                # path, which calls it.
                and type(self)._output_from_cache_entry is _OUTPUT_FROM_CACHE_ENTRY
                and "_output_from_cache_entry" not in self.__dict__
                and not self.cache_crosscheck_enabled
                and hitpath.ready()
            ):
                # Note [The hit in one native call] (csrc/hitpath.cpp).
                native_table: dict[Any, Any] | None = None
                if kind == POLICY:
                    # A sub-table not made yet holds no entry; an unhashable
                    # context is the Python path's to report (after its key).
                    try:
                        native_table = self._partition.tables.get(sub)
                    except TypeError:
                        pass
                else:
                    native_table = self._stock_table(route)
                if native_table is not None:
                    check = hitpath.parity()
                    if check is not None:
                        output = self._checked_native_hit(check, route, native_table, func, args, kwargs)
                    else:
                        synthesizer = self._synth
                        output = _NATIVE_HITS.hit(
                            self,
                            func,
                            args,
                            kwargs,
                            native_table,
                            synthesizer.plans,
                            synthesizer.fakes.bases,
                            stats,
                            self._key_stats,
                            route.slots is not None,
                        )
                    if output is not _DECLINED:
                        return output
            state = _CacheKeyState(self.shape_env)
            # torch's _cache_key, built cheaply when the arguments allow it.
            key = cache_key(self, state, func, args, kwargs, self._key_stats)
            if route.slots is not None:
                key = extend_key(key, route.slots, state, args, kwargs)
            shape_env = state.shape_env if state.cache_on_shape_env() else None
            # Symbolic keys are the Python path's; a static one may be native again.
            route.static = shape_env is None
            if shape_env is not None and kind != STOCK:
                check_own_symbols(key, state)
            # Raises for a key with a symbol shape_env does not know (symbols.UNKNOWN_SYMBOL).
            table = self._table(route, sub, state, shape_env)
        except _BypassDispatchCache as e:
            stats.bypass(e.reason)
            return self._dispatch_impl(func, types, args, kwargs)

        entry: Any = table.get(key)
        if entry is None:
            return self._miss(route, stats, state, key, table, sub, shape_env, types, args, kwargs)
        if type(entry) is Dependent:
            if not self._frames.still_valid(entry, self._sub):
                return self._miss(route, stats, state, key, table, sub, shape_env, types, args, kwargs)
            entry = entry.entry
        elif isinstance(entry, _DispatchCacheBypassEntry):
            stats.bypass(entry.reason)
            if entry.reason == RUNS_EXCLUDED:
                self._frames.taint()
            return self._dispatch_impl(func, types, args, kwargs)
        output = self._output_from_cache_entry(state, entry, key, func, args)
        stats.hits += 1
        if self.cache_crosscheck_enabled:
            crosscheck(self, output, func, types, args, kwargs)
        return output

    def _stock_table(self, route: Route) -> dict[Any, Any]:
        """``_table`` for a ``STOCK`` route's key without symbols (no state needed)."""
        if route.private or self._isolated:
            return self._partition.table(STOCK_SUB, None)
        return _StockMode.cache

    def _table(self, route: Route, sub: Hashable, state: _CacheKeyState, shape_env: Any) -> dict[Any, Any]:
        """Where entries of this call live (Note [Sub-tables]; for keys with symbols, Note [What the ShapeEnv knows])."""
        if route.kind == POLICY:
            try:
                return self._partition.table(
                    sub if shape_env is None else routes.symbolic_sub(route, sub, shape_env, state.known_symbols),
                    shape_env,
                )
            except TypeError:
                raise routes.unhashable_context(self._cache_policy, route.func, sub[0]) from None  # type: ignore[index]
        if route.private or self._isolated:
            return self._private_table(route, shape_env, state)
        if shape_env is not None:
            return shape_env.fake_tensor_cache
        return _StockMode.cache

    def _checked_native_hit(
        self,
        check: hitpath.Parity,
        route: Route,
        table: dict[Any, Any],
        func: OpOverload,
        args: Sequence[object],
        kwargs: Mapping[str, object],
    ) -> object:
        """``_C.HitPath.hit``, compared with the Python path (:func:`hitpath.checking_parity`)."""
        stats = route.stats
        hits, built = stats.hits, self._key_stats.built
        output = _NATIVE_HITS.hit(
            self,
            func,
            args,
            kwargs,
            table,
            self._synth.plans,
            self._synth.fakes.bases,
            stats,
            self._key_stats,
            route.slots is not None,
        )
        if output is _DECLINED:
            check.declined += 1
            return output
        counted = stats.hits == hits + 1 and self._key_stats.built == built + 1

        def python_path() -> object:
            state = _CacheKeyState(self.shape_env)
            key = cache_key(self, state, func, args, kwargs, KeyStats())
            if route.slots is not None:
                key = extend_key(key, route.slots, state, args, kwargs)
            entry = table.get(key)
            if type(entry) is not _DispatchCacheValidEntry:
                raise AssertionError(f"the Python path finds {entry!r}, not the entry the native hit used")
            return self._output_from_cache_entry(state, entry, key, func, args)

        hitpath.compare(check, func, output, python_path, args, kwargs, counted)
        return output

    def _miss(
        self,
        route: Route,
        stats: OpStats,
        state: _CacheKeyState,
        key: _DispatchCacheKey,
        table: dict[Any, Any],
        sub: Hashable,
        shape_env: Any,
        types: Sequence[type],
        args: Sequence[object],
        kwargs: Mapping[str, object],
    ) -> object:
        func: Any = route.func
        kind = route.kind
        snapshot = InputSnapshot(args, kwargs)
        # See shape_env_state: a backend kernel (or subgraph) must not create
        # symbols, nor, if it saw none, teach the ShapeEnv anything (a hit
        # would not).
        env_before = (
            shape_env_state(self.shape_env, symbols_only=shape_env is not None)
            if kind != STOCK and self.shape_env is not None
            else None
        )
        frame = self._frames.push()
        try:
            output = self._dispatch_impl(func, types, args, kwargs)
        finally:
            self._frames.pop(frame)

        in_torch_storage = table is _StockMode.cache or (
            shape_env is not None and table is shape_env.fake_tensor_cache
        )
        entry: _DispatchCacheValidEntry | _DispatchCacheBypassEntry | Dependent
        try:
            if kind == POLICY:
                check_backend_op(func, args, explicit=route.explicit)
                if shape_env is None and routes.runs_backend_fallback(route):
                    raise _BypassDispatchCache(BACKEND_FALLBACK)
            entry = self._make_cache_entry(state, key, func, args, kwargs, output)  # type: ignore[arg-type]
            if not in_torch_storage:
                entry = stub_symint_output(entry, state, key)
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
                    raise _BypassDispatchCache(RUNS_EXCLUDED)
                if kind == POLICY:
                    check_backend_output(state, func, args, output)
                if env_before is not None and (
                    shape_env_state(self.shape_env, symbols_only=shape_env is not None) != env_before
                ):
                    raise _BypassDispatchCache("fake kernel changed the ShapeEnv")
                verify_entry(self, state, entry, key, func, args, kwargs, output)
            except _BypassDispatchCache as e:
                stats.bypass(e.reason)
                if e.reason == RUNS_EXCLUDED:
                    self._frames.taint()
                entry = _DispatchCacheBypassEntry(e.reason)
            else:
                stats.misses += 1
                if frame.deps:
                    entry = Dependent(entry, tuple(frame.deps.items()))
            if in_torch_storage and not isinstance(entry, _DispatchCacheValidEntry):
                # A stock mode may write (or have written) the entry we just
                # rejected into torch's storage, and torch's storage cannot
                # hold our verdicts or dependencies: from now on this mode
                # keeps the op's entries in its own store. See
                # Note [Entries that must reproduce aliasing].
                route.private = True
                table = self._private_table(route, shape_env, state)
        tables = [table]
        if shape_env is not None and kind != STOCK and not isinstance(entry, _DispatchCacheBypassEntry):
            taught = self._table(route, sub, state, shape_env)
            if taught is not table and self._same_when_rerun(route, types, args, kwargs, output, state, sub, taught):
                tables.append(taught)
        if shape_env is not None:
            # Entries must not keep a ShapeEnv alive (torch does the same).
            key.strip_shape_env()
        for table in tables:
            table[key] = entry
            if isinstance(table, Table) and kind == HOP:
                for leaf in pytree.tree_leaves((args, kwargs)):
                    owner = id_hashed_owner(leaf)
                    if owner is not None:
                        evict_when_collected(owner, table, key)
        return output

    def _same_when_rerun(
        self,
        route: Route,
        types: Sequence[type],
        args: Sequence[object],
        kwargs: Mapping[str, object],
        output: object,
        state: _CacheKeyState,
        sub: Hashable,
        taught: dict[Any, Any],
    ) -> bool:
        """Whether the kernel, run again with what its first run taught the ShapeEnv, returns the same and teaches nothing.

        Note [What the kernel taught]
        An entry is filed under what the ShapeEnv knew before its kernel ran
        (Note [What the ShapeEnv knows]). A kernel that guards on its own
        symbols has changed that knowledge, so later calls look up elsewhere
        and would miss once more. Instead the kernel runs once more now: if,
        knowing what it taught, it returns an equal output (the same
        description: metadata, symbols by expression, aliasing) and teaches
        nothing further, the entry stands for calls under the new knowledge
        too. Otherwise later calls miss, as they would without this. Either
        way the kernel runs twice and every hit stands for a run that would
        teach nothing.
        """
        snapshot = InputSnapshot(args, kwargs)
        frame = self._frames.push()
        try:
            again = self._dispatch_impl(route.func, types, args, kwargs)  # type: ignore[arg-type]
        finally:
            self._frames.pop(frame)
        if frame.tainted or snapshot.changed() is not None:
            return False
        if self._table(route, sub, state, state.shape_env) is not taught:
            return False
        return first_difference(describe(again, args, kwargs), describe(output, args, kwargs)) is None

    @override
    def _output_from_cache_entry(
        self,
        state: _CacheKeyState,
        entry: _DispatchCacheValidEntry,
        key: _DispatchCacheKey,
        func: OpOverload,
        args: Sequence[object],
    ) -> Any:
        # See Note [One synthesis for hits and their verification].
        return self._synth.output(self, state, entry, key, func, args)

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
            if e.reason != "non-builtin" or route is None or route.kind != POLICY:
                raise

    # --------------------------------------------------------------- helpers

    def _sync_policy(self) -> None:
        identity = self._cache_policy.identity
        self._partition = partition(self._cache_store, identity)
        self._routes = {}
        self._synced_identity = identity

    def _route(self, func: object) -> Route:
        route, memoized = routes.route_for(self._cache_policy, func)
        stats = self._stats.get(func)
        if stats is None:
            stats = self._stats[func] = OpStats()
        route.stats = stats
        # torch fills stock dispatch's two tables at import.
        route.direct = func not in _META_HANDLERS and func not in _HANDLE_DIRECTLY
        route.native = route.kind in (POLICY, STOCK) and (route.slots is None or not route.slots.generic)
        if memoized:
            self._routes[func] = route
        return route

    def _sub(self, route: Route) -> Hashable:
        """``routes.kernel_sub``, with this mode's allow_fallback_kernels where it matters."""
        sub = routes.kernel_sub(route, self._cache_policy)
        if route.fallback_capable:
            # Stock may run a real kernel for such an op, only if the mode
            # allows it (Note [The kernel in effect]).
            return (*sub, self.allow_fallback_kernels)  # type: ignore[misc]
        return sub

    def _private_table(self, route: Route, shape_env: Any, state: _CacheKeyState) -> Table:
        # A HOP's entry replays the ops of its subgraph, backend ops among
        # them: its sub-table holds the policy's context, whether the Python
        # dispatcher (which prefers py_impl kernels) is on, and, for a key with
        # symbols, what the ShapeEnv knows about them (Note [What the ShapeEnv
        # knows]), as a backend op's does.
        if route.kind != HOP:
            return self._partition.table(STOCK_SUB, shape_env)
        policy = self._cache_policy
        context = routes.context_value(policy, route.func) if policy.has_context else None
        known = None if shape_env is None else knowledge(shape_env, state.known_symbols)
        dispatcher = routes.python_dispatcher_enabled()
        try:
            return self._partition.table((HOP_SUB, context, known, dispatcher), shape_env)
        except TypeError:
            raise routes.unhashable_context(policy, route.func, context) from None

    # See Note [Entries cover inner ops].

    def _record(self, route: Route, sub: Hashable = None) -> None:
        """Records ``route``'s dispatch in this thread's open frames."""
        if not self._frames.stack():
            return
        if not route.taints:
            if route.backend is None:
                return
            if route.kind == BYPASS:
                # Not cached itself, but what its kernel returns (and so the
                # enclosing entry) depends on the same things as a cached op's.
                sub = self._sub(route)
        self._frames.record(route, sub)

    def _record_rule(self, func: OpOverload) -> None:
        if self._cache_policy.identity is not self._synced_identity:
            self._sync_policy()
        route = self._routes.get(func) or self._route(func)
        if route.taints:
            self._frames.taint()
        elif route.backend is not None:
            self._record(route, self._sub(route))


_OUTPUT_FROM_CACHE_ENTRY = FakeTensorMode._output_from_cache_entry

# Keep mypy honest about the base class we extend.
_: type[TorchDispatchMode] = FakeTensorMode
