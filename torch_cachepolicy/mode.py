"""``torch_cachepolicy.FakeTensorMode``: stock FakeTensorMode plus a cache policy.

The mode owns its state (one :class:`~._state.CacheState`) and its public API;
every step of a dispatch is a function that takes the mode: the rules for
stock's class (:mod:`._rules`), then the cache (:mod:`._driver`).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from torch._ops import OpOverload
from torch._subclasses import fake_tensor as _ft
from torch._subclasses._fake_tensor_utils import _CacheKeyState
from torch._subclasses.fake_tensor import (
    DispatchCacheInfo,
    _BypassDispatchCache,
    _DispatchCacheKey,
    _DispatchCacheValidEntry,
)
from torch.utils._python_dispatch import TorchDispatchMode
from typing_extensions import override

from torch_cachepolicy import _driver, _reasons, _rules
from torch_cachepolicy._arguments import check_cache_arguments, check_policy
from torch_cachepolicy._class_api import ClassCounter, also_on_the_class, class_cache_clear, class_cache_info, track
from torch_cachepolicy._compat import Feature, off
from torch_cachepolicy._routes import POLICY
from torch_cachepolicy._state import CacheState
from torch_cachepolicy._verify import CrosscheckError
from torch_cachepolicy.policy import CachePolicy
from torch_cachepolicy.report import CacheReport, KeyStats
from torch_cachepolicy.store import CacheStore

__all__ = ["CrosscheckError", "FakeTensorMode"]

_StockMode = _ft.FakeTensorMode
_NO_KWARGS: Mapping[str, object] = {}
# Why this torch gets stock's cache rather than the policy's (a changed internal: Note [Checking torch's
# internals]), or None.
_CACHE_OFF = off(Feature.CACHE)


class FakeTensorMode(_StockMode):
    """A ``FakeTensorMode`` whose dispatch cache follows a :class:`CachePolicy`.

    Backend operators the policy admits are cached in this mode's
    :class:`CacheStore`; nothing global in torch is changed (aten entries are
    shared with torch's storage as a stock mode shares them, unless the store
    is isolated).

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
    # ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    # HigherOrderOperator.dispatch looks up `python_key_table[type(mode)]` by
    # exact type, so rules registered for torch's FakeTensorMode (cond,
    # while_loop, ...) are invisible to a subclass. With this flag the HOP calls
    # our dispatch, which forwards to the stock class's rule (_rules.dispatch).
    supports_higher_order_operators = True
    # torch's tests read the class counters (FakeTensorMode.cache_hits) as cache_info() (Note [The cache API on the
    # class]); torch's code increments its own class's.
    cache_hits = ClassCounter("hits")  # type: ignore[assignment]
    cache_misses = ClassCounter("misses")  # type: ignore[assignment]
    cache_bypasses = ClassCounter("bypasses")  # type: ignore[assignment]

    def __init__(
        self,
        *,
        cache_policy: CachePolicy | None = None,
        cache_store: CacheStore | None = None,
        cache_crosscheck: bool | None = None,
        **kwargs: Any,
    ) -> None:
        check_cache_arguments("torch_cachepolicy.FakeTensorMode", cache_policy, cache_store, cache_crosscheck)
        super().__init__(**kwargs)
        self._cache = CacheState(
            CachePolicy() if cache_policy is None else cache_policy,
            cache_store,
            own_synthesis=FakeTensorMode._output_from_cache_entry,
        )
        if cache_crosscheck is not None:
            self.cache_crosscheck_enabled = cache_crosscheck
        track(self)

    # Copies: attribute by attribute, as stock's; see Note [Copying a policy mode].

    def __copy__(self) -> FakeTensorMode:
        clone = type(self).__new__(type(self))
        clone.__setstate__({**self.__dict__, "_cache": copy.copy(self._cache)})
        return clone

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        track(self)

    # ------------------------------------------------------------ public API

    @property
    def cache_policy(self) -> CachePolicy:
        """The policy consulted on every dispatch; may be replaced."""
        return self._cache.policy

    @cache_policy.setter
    def cache_policy(self, policy: CachePolicy | None) -> None:
        policy = check_policy("torch_cachepolicy.FakeTensorMode.cache_policy = ...", policy)
        self._cache.policy = CachePolicy() if policy is None else policy
        self._cache.synced_identity = None

    @property
    def cache_store(self) -> CacheStore:
        """The store holding this mode's policy-dependent entries."""
        return self._cache.store

    @override
    @also_on_the_class(class_cache_info)
    def cache_info(self) -> DispatchCacheInfo:  # type: ignore[override]
        """Hits, misses and bypasses of this instance; ``size`` counts every entry of its store, which other modes
        may share. On the class, as torch's: torch's class-wide counters plus every live policy mode's."""
        # list()/dict() copy in C, so another thread may read while this mode
        # dispatches without "dictionary changed size during iteration".
        all_stats = list(self._cache.stats.values())
        bypasses: dict[str, int] = {}
        for stats in all_stats:
            for reason, n in dict(stats.bypasses).items():
                bypasses[reason] = bypasses.get(reason, 0) + n
        return DispatchCacheInfo(
            sum(s.hits for s in all_stats), sum(s.misses for s in all_stats), bypasses, len(self._cache.store)
        )

    def cache_report(self) -> CacheReport:
        """Per-operator hits, misses and bypass reasons of this instance."""
        return CacheReport.from_stats(self._cache.stats)

    def cache_key_stats(self) -> KeyStats:
        """How many cache keys of this instance the C++ key builder produced, and why the
        others were left to torch's ``_cache_key`` (a copy; those cost what a stock key costs)."""
        stats = self._cache.key_stats
        out = KeyStats()
        out.built = stats.built
        out.fallbacks = dict(sorted(dict(stats.fallbacks).items()))
        return out

    @override
    @also_on_the_class(class_cache_clear)
    def cache_clear(self) -> None:  # type: ignore[override]
        """Resets this instance's counters and empties its policy's partition (shared by modes with equal policies
        on the same store), leaving torch's storage alone. On the class, as torch's: clears torch's class-wide
        cache and counters, and every live policy mode (Note [The cache API on the class])."""
        self._cache.clear()

    # ------------------------------------------------------------- dispatch

    @override
    def dispatch(
        self,
        func: Any,
        types: Sequence[type],
        args: Sequence[object] = (),
        kwargs: Mapping[str, object] = _NO_KWARGS,
    ) -> object:
        # `dispatch`, not `__torch_dispatch__`: torch wraps every override of
        # the latter in a dynamo-disabling shim, which would run twice per op.
        return _rules.dispatch(self, self._cache, func, types, args, kwargs)

    @override
    def _cached_dispatch_impl(
        self,
        func: OpOverload,
        types: Sequence[type],
        args: Sequence[object],
        kwargs: Mapping[str, object],
    ) -> object:
        if _CACHE_OFF is not None:
            _driver.log.debug("stock cache for %s: %s", func, _CACHE_OFF)
            return super()._cached_dispatch_impl(func, types, args, kwargs)
        return _driver.cached_dispatch(self, self._cache, func, types, args, kwargs)

    @override
    def _output_from_cache_entry(  # type: ignore[override]
        self,
        state: _CacheKeyState,
        entry: _DispatchCacheValidEntry,
        key: _DispatchCacheKey,
        *func_args: Any,
    ) -> Any:
        # torch 2.13 and 2.14 pass (func, args), 2.15 passes (args) (_compat.SYNTHESIS_TAKES_FUNC); the func is
        # the key's first item either way. See Note [One synthesis for hits and their verification].
        if _CACHE_OFF is not None:
            return super()._output_from_cache_entry(state, entry, key, *func_args)
        return self._cache.synth.output(self, state, entry, key, func_args[-1])

    @override
    def _validate_cache_key(
        self, func: OpOverload, args: Sequence[object], kwargs: Mapping[str, object]
    ) -> None:
        # Stock validation ends with "non-builtin" (is_builtin), then the
        # CompositeImplicitAutograd-view check, part of the policy's decision
        # (Note [Structural checks]). For an op the policy admits we accept that
        # one reason only: every earlier check (the tags an op's owner declares,
        # lift ops, ...) still keeps a backend op out of the cache.
        try:
            super()._validate_cache_key(func, args, kwargs)
        except _BypassDispatchCache as e:
            route = None if _CACHE_OFF is not None else self._cache.routes.get(func)
            if e.reason != _reasons.NON_BUILTIN or route is None or route.kind is not POLICY:
                raise


# Keep mypy honest about the base class we extend.
_: type[TorchDispatchMode] = FakeTensorMode
