"""``cache_info()`` and ``cache_clear()`` called on the class rather than on a mode."""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar, cast

from torch._subclasses import fake_tensor as _ft
from torch._subclasses.fake_tensor import DispatchCacheInfo

_F = TypeVar("_F", bound=Callable[..., Any])
_StockMode = _ft.FakeTensorMode


# Note [The cache API on the class]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# torch's cache_info() and cache_clear() are classmethods over its class-wide
# cache and counters; a policy mode's are per instance. Called on the class
# (as torch's own tests do), they keep stock's meaning for everything a
# FakeTensorMode caches: cache_info() adds torch's class-wide counters and
# every live policy mode's; cache_clear() does what torch's does (the caller
# asked for it by name) and clears every live policy mode. Nothing else of the
# package touches torch's class-wide state.
_LIVE_MODES: weakref.WeakSet[Any] = weakref.WeakSet()
# Modes are made in any thread: a WeakSet another thread adds to cannot be iterated.
_LIVE_MODES_LOCK = threading.RLock()


def track(mode: object) -> None:
    """Counts ``mode`` among the live policy modes the class-level calls reach."""
    with _LIVE_MODES_LOCK:
        _LIVE_MODES.add(mode)


class _AlsoOnTheClass:
    """A method that, called on the class instead of an instance, runs ``on_class(cls)``."""

    def __init__(self, on_instance: Callable[..., Any], on_class: Callable[..., Any]) -> None:
        self.__wrapped__ = on_instance
        self.__doc__ = on_instance.__doc__
        self._on_class = on_class

    def __get__(self, obj: object, objtype: type | None = None) -> Callable[..., Any]:
        if obj is None:
            return functools.partial(self._on_class, objtype)
        return self.__wrapped__.__get__(obj, objtype)  # type: ignore[no-any-return]


def also_on_the_class(on_class: Callable[..., Any]) -> Callable[[_F], _F]:
    """Decorates a method so that calling it on the class runs ``on_class(cls)`` instead."""

    def wrap(on_instance: _F) -> _F:
        return cast(_F, _AlsoOnTheClass(on_instance, on_class))

    return wrap


def _live(cls: type) -> list[Any]:
    with _LIVE_MODES_LOCK:
        modes = list(_LIVE_MODES)
    return [m for m in modes if isinstance(m, cls)]


def class_cache_info(cls: type) -> DispatchCacheInfo:
    """torch's class-wide counters plus every live policy mode's (``size``: each store once)."""
    stock = _StockMode.cache_info()
    modes = _live(cls)
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


class ClassCounter:
    """torch's class-wide counter (``cache_hits``, ``cache_misses``, ``cache_bypasses``) as read on the policy class:
    torch's plus every live policy mode's, as ``cache_info()``; read on a mode, the mode's own."""

    def __init__(self, field: str) -> None:
        self.field = field

    def __get__(self, obj: object, objtype: type | None = None) -> Any:
        info = class_cache_info(objtype or type(obj)) if obj is None else obj.cache_info()  # type: ignore[attr-defined]
        return getattr(info, self.field)


def class_cache_clear(cls: type) -> None:
    """torch's ``FakeTensorMode.cache_clear()``, then every live policy mode's."""
    _StockMode.cache_clear()
    for mode in _live(cls):
        mode.cache_clear()
