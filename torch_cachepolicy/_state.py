"""A policy mode's cache state: what its dispatches read and write, and how it copies."""

from __future__ import annotations

import copy
from typing import Any

from torch._subclasses.fake_tensor import _BypassDispatchCache

from torch_cachepolicy import _reasons
from torch_cachepolicy._frames import Frames
from torch_cachepolicy._routes import Route, route_for
from torch_cachepolicy._synth import Synthesizer
from torch_cachepolicy.policy import CachePolicy
from torch_cachepolicy.report import KeyStats, OpStats
from torch_cachepolicy.store import CacheStore, Partition, partition

_MAX_CONTEXTS = 64


class CacheState:
    """Everything one policy mode keeps about its cache; the mode passes it to ``_driver``.

    Attributes:
        policy, store: the mode's; ``owns_store`` if the mode made the store,
            ``isolated`` its isolation (read on every aten hit).
        stats, key_stats: per-op counters, and the key builder's.
        private_ops: ops whose entries failed verification once (Note
            [Entries that must reproduce aliasing]), kept for the mode's life.
        synced_identity, partition, routes: the policy identity the routes were
            made for, its partition of the store, the route per op.
        contexts: the context values each op has met (:meth:`check_context`).
        frames: the misses being computed; ``synth`` builds hits' outputs.
        own_synthesis: the package's ``_output_from_cache_entry``, which builds hits with ``synth`` alone: while the
            mode's is this one, a miss verifies with the outputs torch's entry builder had it build.
    """

    __slots__ = ("contexts", "frames", "isolated", "key_stats", "own_synthesis", "owns_store", "partition", "policy",
                 "private_ops", "routes", "stats", "store", "synced_identity", "synth")  # fmt: skip

    def __init__(self, policy: CachePolicy, store: CacheStore | None, own_synthesis: object = None) -> None:
        self.policy = policy
        self.own_synthesis = own_synthesis
        # A store the mode made is private to it; one passed in is shared
        # (Note [Copying a policy mode]).
        self.owns_store = store is None
        self.store = CacheStore() if store is None else store
        self.isolated = self.store.isolated
        self.stats: dict[object, OpStats] = {}
        self.key_stats = KeyStats()
        self.private_ops: set[object] = set()
        self._start_transient()

    def _start_transient(self) -> None:
        self.synced_identity: object = None
        self.partition = Partition()  # replaced by the policy's partition on first dispatch
        self.routes: dict[object, Route] = {}
        self.contexts: dict[object, set[object]] = {}
        self.frames = Frames()
        self.synth = Synthesizer()

    def sync(self) -> None:
        """Moves to the partition of the policy's current identity; routes are made afresh."""
        identity = self.policy.identity
        self.partition = partition(self.store, identity)
        self.routes = {}
        self.contexts = {}
        self.synced_identity = identity

    def route(self, func: object) -> Route:
        """``func``'s route under the current policy, memoized when the policy's decision is."""
        if self.policy.identity is not self.synced_identity:
            self.sync()
        route = self.routes.get(func)
        if route is not None:
            return route
        stats = self.stats.get(func)
        if stats is None:
            stats = self.stats[func] = OpStats()
        route, memoized = route_for(self.policy, func, stats, func in self.private_ops)
        if memoized:
            self.routes[func] = route
        return route

    def keep_private(self, func: object) -> None:
        """Keeps ``func``'s entries in the store from now on, for this mode's life (its next route says so)."""
        self.private_ops.add(func)
        self.routes.pop(func, None)

    def rule_ran(self, func: object) -> None:
        """A rule for the FakeTensorMode class answered ``func``, never reaching the cache: an open miss depends on
        its run all the same (Note [Entries cover inner ops])."""
        if self.route(func).taints:
            self.frames.taint()

    def check_context(self, route: Route, context: object) -> None:
        """Bypasses once an op has met more context values than a lowering plausibly has: they never repeat."""
        # A context that never equals itself (a fresh object compared by identity, a new NaN) would open one
        # sub-table and one entry per dispatch, never hit, and grow the store for the mode's life; a bounded set tells.
        seen = self.contexts.get(route.func)
        if seen is None:
            seen = self.contexts.setdefault(route.func, set())
        if context not in seen:
            if len(seen) >= _MAX_CONTEXTS:
                raise _BypassDispatchCache(_reasons.CONTEXT_NEVER_REPEATS)
            seen.add(context)

    def clear(self) -> None:
        """Drops the counters, the routes that hold them and the output plans, and empties the partition."""
        self.stats = {}
        self.key_stats = KeyStats()
        self.synth.clear()
        self.routes = {}
        self.contexts = {}
        self.synced_identity = None
        partition(self.store, self.policy.identity).clear()

    # Note [Copying a policy mode]
    # ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    # Stock modes (so their FakeTensors, and graphs holding those) copy with
    # copy.deepcopy attribute by attribute, and a policy mode copies the same
    # way. Its cache state: what is bound to the instance starts afresh
    # (frames, routes, partition, plans); the policy is copied as a policy
    # copies (Note [Copying a policy]), the counters are copied; a store the
    # mode made becomes a new empty store of the same isolation, one the user
    # passed is shared (entries are keyed by metadata, never by mode).
    # copy.copy shares policy and store. Pickled: policy, counters, an empty store.

    def _copy(self, policy: CachePolicy, store: CacheStore, memo: dict[int, Any] | None) -> CacheState:
        clone = CacheState.__new__(CacheState)
        clone.policy = policy
        clone.own_synthesis = self.own_synthesis
        clone.owns_store = self.owns_store
        clone.store = store
        clone.isolated = self.isolated
        clone.stats = copy.deepcopy(self.stats, memo)
        clone.key_stats = copy.deepcopy(self.key_stats, memo)
        clone.private_ops = set(self.private_ops)
        clone._start_transient()
        return clone

    def __copy__(self) -> CacheState:
        return self._copy(self.policy, self.store, None)

    def __deepcopy__(self, memo: dict[int, Any]) -> CacheState:
        store = CacheStore(isolated=self.isolated) if self.owns_store else self.store
        return self._copy(copy.deepcopy(self.policy, memo), store, memo)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_unpickle, (self.policy, self.owns_store, self.isolated, self.stats, self.key_stats, self.private_ops))


def _unpickle(
    policy: CachePolicy,
    owns_store: bool,
    isolated: bool,
    stats: dict[object, OpStats],
    key_stats: KeyStats,
    private_ops: set[object],
) -> CacheState:
    state = CacheState(policy, CacheStore(isolated=isolated))
    state.owns_store = owns_store
    state.stats, state.key_stats, state.private_ops = stats, key_stats, private_ops
    return state
