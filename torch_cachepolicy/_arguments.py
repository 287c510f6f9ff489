"""The checks of ``cache_policy``, ``cache_store`` and ``cache_crosscheck``, and of what this torch lets an entry
point do, shared by every entry point.

Apart from :mod:`._names` because it needs the classes it checks for, whose modules import :mod:`._names`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeVar

import torch

from torch_cachepolicy._compat import ADVICE, Feature, off
from torch_cachepolicy._names import describe_value
from torch_cachepolicy.policy import CachePolicy
from torch_cachepolicy.store import CacheStore

_T = TypeVar("_T")


def check_cache_arguments(api: str, cache_policy: object, cache_store: object, cache_crosscheck: object = None) -> None:
    """Raises a TypeError naming ``api`` (``"torch_cachepolicy.FakeTensorMode"``) for an argument of the wrong type."""
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
    """``value`` if a ``cls`` or None, else a TypeError naming ``where`` (``other``: the other argument's class and name)."""
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


def check_feature(api: str, feature: Feature) -> None:
    """Raises a RuntimeError naming ``api`` if this torch changed an internal ``feature`` needs."""
    why = off(feature)
    if why is not None:
        raise RuntimeError(
            f"{api}: unavailable on this torch: {why}. Use torch.export.export (the program's fake values stay on "
            f"torch's FakeTensorMode); {ADVICE}"
        )
