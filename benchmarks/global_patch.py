"""BASELINE ONLY: the process-global ``is_builtin`` swap of ExecuTorch PR 21700, reimplemented.

This module is the only place in the repository allowed to write torch's
global state, and it exists only so the benchmarks can compare the policy mode
with the approach it replaces. It lives outside the installed package: the
``torch_cachepolicy`` wheel does not ship it and no library module imports it
(``test/test_packaging.py`` checks both); the benchmarks and their tests do.

What the prior approach does while its scope is active:

* replaces ``torch._library.utils.is_builtin`` with a predicate that also
  accepts the backend namespaces. fake_tensor.py reads that function through
  the module attribute (``torch._library.utils.is_builtin(func)`` and
  ``library_utils.is_builtin(func)``, the same module object), so assigning
  the attribute reaches every caller;
* evicts the backend ops' negative entries (``_DispatchCacheBypassEntry``,
  stored by stock modes as "non-builtin") from ``FakeTensorMode.cache`` and
  from the given ShapeEnvs' caches, before and after, because torch never
  revalidates a negative entry. (The PR matches the "non-builtin" reason;
  this evicts every negative entry of those namespaces, a superset.);
* restores the original predicate in ``finally``, under a reentrant lock.

One deliberate difference, for the benchmark's hygiene: PR 21700 keeps its
*positive* backend entries in the class-global cache after the scope ends (the
next pass reuses them). torch looks entries up before it validates anything,
so those entries would then answer stock modes in the same process, which
would no longer measure stock. By default this reimplementation therefore
also evicts the positive backend entries on exit; ``keep_positive_entries=True``
keeps them, as the PR does (the memory measurement uses that).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Iterator, MutableMapping
from typing import Any

import torch._library.utils as _library_utils
from torch._ops import OpOverload
from torch._subclasses.fake_tensor import FakeTensorMode, _DispatchCacheBypassEntry
from torch.fx.experimental.symbolic_shapes import ShapeEnv

__all__ = ["backend_entries", "evict_backend_entries", "global_patch", "positive_backend_entries"]

# Serializes patch scopes across threads and lets them nest in one thread.
_LOCK = threading.RLock()


def _key_namespace(key: Any) -> str | None:
    # _DispatchCacheKey.key[0] is the dispatched op (OpOverload or HOP).
    parts = getattr(key, "key", ())
    return getattr(parts[0], "namespace", None) if parts else None


def backend_entries(
    cache: MutableMapping[Any, Any], namespaces: Iterable[str], *, negative_only: bool = False
) -> list[Any]:
    """The keys of ``cache`` whose op belongs to ``namespaces``.

    Args:
        cache: ``FakeTensorMode.cache`` or a ``ShapeEnv.fake_tensor_cache``.
        namespaces: backend namespaces.
        negative_only: only keys whose entry is a ``_DispatchCacheBypassEntry``.
    """
    wanted = frozenset(namespaces)
    return [
        key
        for key, entry in list(cache.items())
        if _key_namespace(key) in wanted and (not negative_only or isinstance(entry, _DispatchCacheBypassEntry))
    ]


def positive_backend_entries(namespaces: Iterable[str]) -> int:
    """How many entries of ``FakeTensorMode.cache`` would serve a backend op
    (read only). Outside a patch scope this must be 0: any such entry answers
    every mode in the process, stock ones included."""
    cache = FakeTensorMode.cache
    return sum(
        1 for key in backend_entries(cache, namespaces) if not isinstance(cache.get(key), _DispatchCacheBypassEntry)
    )


def evict_backend_entries(
    namespaces: Iterable[str],
    *,
    shape_envs: Iterable[ShapeEnv | None] = (),
    negative_only: bool = False,
) -> int:
    """Removes backend entries from torch's class-global cache and the given
    ShapeEnv caches; returns how many were removed."""
    wanted = frozenset(namespaces)
    caches: list[MutableMapping[Any, Any]] = [FakeTensorMode.cache]
    caches += [env.fake_tensor_cache for env in shape_envs if env is not None]
    removed = 0
    for cache in caches:
        for key in backend_entries(cache, wanted, negative_only=negative_only):
            if cache.pop(key, None) is not None:
                removed += 1
    return removed


def _extended(original: Callable[[OpOverload], bool], namespaces: frozenset[str]) -> Callable[[OpOverload], bool]:
    def is_builtin(op: OpOverload) -> bool:
        return original(op) or op.namespace in namespaces

    is_builtin.__doc__ = f"torch's is_builtin, extended to {sorted(namespaces)} by the global-patch baseline"
    return is_builtin


@contextlib.contextmanager
def global_patch(
    namespaces: Iterable[str],
    *,
    shape_envs: Iterable[ShapeEnv | None] = (),
    keep_positive_entries: bool = False,
) -> Iterator[None]:
    """Makes every FakeTensorMode in the process cache ``namespaces`` while active.

    Args:
        namespaces: backend namespaces to treat as builtin.
        shape_envs: ShapeEnvs of the active modes, whose caches hold the
            entries of symbolic keys; evicted like the class-global cache.
        keep_positive_entries: leave positive backend entries behind on exit,
            as PR 21700 does (see the module docstring).
    """
    wanted = frozenset(namespaces)
    envs = list(shape_envs)
    with _LOCK:
        original = _library_utils.is_builtin
        evict_backend_entries(wanted, shape_envs=envs, negative_only=True)
        # The swap is the point of this baseline; mypy sees a def being replaced.
        _library_utils.is_builtin = _extended(original, wanted)  # type: ignore[assignment]
        try:
            yield
        finally:
            _library_utils.is_builtin = original
            evict_backend_entries(wanted, shape_envs=envs, negative_only=keep_positive_entries)
