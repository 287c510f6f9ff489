"""The checks of the cache arguments every entry point takes.

``FakeTensorMode(...)``, ``adopt(...)`` and ``export(...)`` all take
``cache_policy``, ``cache_store`` and ``cache_crosscheck``; they check them
here, so a wrong argument gets the same message, naming the entry point and
the parameter, wherever it was passed. (Apart from :mod:`._names` because it
needs the classes it checks for, whose module imports :mod:`._names`.)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeVar

import torch

from torch_cachepolicy._names import describe_value
from torch_cachepolicy.policy import CachePolicy
from torch_cachepolicy.store import CacheStore

_T = TypeVar("_T")


def check_cache_arguments(
    api: str,
    cache_policy: object,
    cache_store: object,
    cache_crosscheck: object = None,
) -> None:
    """Raises a TypeError naming ``api`` for an argument of the wrong type.

    Args:
        api: the entry point, as the user calls it (``"torch_cachepolicy.FakeTensorMode"``).
        cache_policy: a ``CachePolicy`` or None.
        cache_store: a ``CacheStore`` or None.
        cache_crosscheck: a bool or None.
    """
    check_policy(f"{api}(cache_policy=...)", cache_policy)
    check_store(f"{api}(cache_store=...)", cache_store)
    check_crosscheck(f"{api}(cache_crosscheck=...)", cache_crosscheck)


def check_policy(where: str, value: object) -> CachePolicy | None:
    """``value`` if it is a ``CachePolicy`` or None, else a TypeError naming ``where``."""
    names_given = isinstance(value, (str, torch.library.Library)) or (
        isinstance(value, Iterable) and not isinstance(value, (bytes, dict, CacheStore))
    )
    hint = "; build one from namespaces: CachePolicy(namespaces=[...])" if names_given else ""
    return _instance_or_none(where, value, CachePolicy, (CacheStore, "cache_store"), hint)


def check_store(where: str, value: object) -> CacheStore | None:
    """``value`` if it is a ``CacheStore`` or None, else a TypeError naming ``where``."""
    return _instance_or_none(where, value, CacheStore, (CachePolicy, "cache_policy"), "")


def _instance_or_none(where: str, value: Any, cls: type[_T], other: tuple[type, str], hint: str) -> _T | None:
    """``value`` if it is a ``cls`` or None, else a TypeError naming ``where``.

    ``other`` is the class of the other cache argument and its parameter: an
    instance of it here was most likely meant for that parameter.
    """
    if value is None or isinstance(value, cls):
        return value
    other_cls, other_param = other
    if isinstance(value, type) and issubclass(value, cls):
        hint = f"; pass an instance: {value.__name__}(...)"
    elif isinstance(value, other_cls):
        hint = f"; pass a {other_cls.__name__} as {other_param}=..."
    raise TypeError(f"{where}: expected a torch_cachepolicy.{cls.__name__} or None, got {describe_value(value)}{hint}")


def check_crosscheck(where: str, value: object) -> bool | None:
    """``value`` if it is a bool or None, else a TypeError naming ``where``."""
    if value is None or isinstance(value, bool):
        return value
    raise TypeError(f"{where}: expected True, False or None, got {describe_value(value)}")
