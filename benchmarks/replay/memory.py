"""Which cache entries outlive 1,000 short-lived modes.

Each configuration replays its own copy of the graph (same ops, its own image
size), so the class-cache entries it adds are its own and can be counted by
namespace. Per configuration: N modes are created, each replays the graph
once and is dropped; then ``gc.collect()`` runs and we count

* ``class_cache_growth``: entries added to torch's class-global
  ``FakeTensorMode.cache``, split into backend-namespace and builtin (aten,
  prim, prims) entries. Builtin entries of the policy mode go there exactly
  as stock's do; that is by design, not a leak, and is reported apart;
* ``backend_keys_outside_class_cache``: live ``_DispatchCacheKey`` objects of
  backend ops anywhere else in the heap (a scan of ``gc.get_objects()``),
  after minus before; this is where entries of a private store that failed
  to die would show up;
* ``modes_alive`` / ``stores_alive``: weak references to the dropped modes and
  (policy) their CacheStores that still resolve, and the entries still
  reachable through live stores.

``retained_backend_entries`` = backend class-cache growth + backend keys
outside the class cache. The global-patch baseline runs exactly as PR 21700
does here (positive entries kept after each scope); its backend entries are
purged once its measurement is taken.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Sequence
from typing import Any

from torch._subclasses.fake_tensor import FakeTensorMode, _DispatchCacheKey

import torch_cachepolicy as tcp
from benchmarks.global_patch import evict_backend_entries
from benchmarks.replay.configs import Configuration, GlobalPatch, Policy, Stock
from benchmarks.replay.exportpass import fake_inputs, replay
from benchmarks.replay.runner import Progress
from benchmarks.replay.workloads import build_workload

__all__ = ["measure_memory"]

_FIRST_SIZE = 20  # timing workloads use 16; every configuration gets its own size


def _namespace(key: Any) -> str | None:
    return getattr(key.key[0], "namespace", None) if key.key else None


def _backend_keys_outside_class_cache(namespaces: frozenset[str], ignore: set[Any]) -> int:
    """Live backend keys that torch's class cache does not hold. Keys in
    ``ignore`` (our own snapshot of the cache, which keeps keys that were
    evicted since alive) are not counted."""
    skip = {id(k) for k in FakeTensorMode.cache} | {id(k) for k in ignore}
    # type() rather than isinstance(): isinstance reads __class__, which some
    # lazily deprecated torch objects answer with a warning.
    return sum(
        1
        for obj in gc.get_objects()
        if type(obj) is _DispatchCacheKey and id(obj) not in skip and _namespace(obj) in namespaces
    )


def _one_configuration(
    config: Configuration, workload_name: str, size: int, modes: int, namespaces: frozenset[str]
) -> dict[str, Any]:
    workload = build_workload(workload_name, size=size)
    gc.collect()
    before = set(FakeTensorMode.cache)
    outside_before = _backend_keys_outside_class_cache(namespaces, before)
    mode_refs: list[weakref.ref[FakeTensorMode]] = []
    store_refs: list[weakref.ref[tcp.CacheStore]] = []
    private_entries = 0
    for _ in range(modes):
        mode = config.make_mode(None)
        inputs = fake_inputs(mode, workload)
        with config.scope(mode):
            envs = replay(workload.graph, mode, inputs, 1)
        mode_refs.append(weakref.ref(mode))
        if isinstance(mode, tcp.FakeTensorMode):
            store_refs.append(weakref.ref(mode.cache_store))
            private_entries += len(mode.cache_store)
        del mode, inputs, envs
    gc.collect()
    added = [k for k in FakeTensorMode.cache if k not in before]
    backend_growth = sum(1 for k in added if _namespace(k) in namespaces)
    outside = _backend_keys_outside_class_cache(namespaces, before) - outside_before
    live_stores = [s for s in (r() for r in store_refs) if s is not None]
    return {
        "workload": workload_name,
        "image_size": size,
        "modes": modes,
        "modes_alive": sum(1 for r in mode_refs if r() is not None),
        "stores_alive": len(live_stores) if store_refs else None,
        "entries_in_live_stores": sum(len(s) for s in live_stores) if store_refs else None,
        "private_entries_before_drop": private_entries if store_refs else None,
        "class_cache_growth": {"backend": backend_growth, "builtin": len(added) - backend_growth},
        "backend_keys_outside_class_cache": outside,
        "retained_backend_entries": backend_growth + max(outside, 0),
    }


def _calibrate(namespaces: tuple[str, ...], size: int) -> dict[str, int]:
    """Checks that the heap scan can see a private store's keys at all: a
    policy mode kept alive must show its store's backend keys outside the
    class cache. A scan that cannot see them would report 0 for any leak."""
    wanted = frozenset(namespaces)
    workload = build_workload("dialect", size=size)
    gc.collect()
    before = set(FakeTensorMode.cache)
    baseline = _backend_keys_outside_class_cache(wanted, before)
    mode = Policy(namespaces).make_mode(None)
    assert isinstance(mode, tcp.FakeTensorMode)
    replay(workload.graph, mode, fake_inputs(mode, workload), 1)
    gc.collect()
    seen = _backend_keys_outside_class_cache(wanted, before) - baseline
    return {"live_store_entries": len(mode.cache_store), "backend_keys_seen_by_scan": seen}


def measure_memory(
    namespaces: tuple[str, ...],
    *,
    modes: int,
    workloads: Sequence[str] = ("qdq", "dialect"),
    progress: Progress | None = None,
) -> dict[str, Any]:
    """The ``memory`` entry of the results; see the module docstring.

    Returns:
        ``{"modes", "definition", "scan_calibration", "workloads": {workload:
        {configuration: figures}}}``.
    """
    wanted = frozenset(namespaces)
    configs: list[Configuration] = [
        Stock(namespaces),
        GlobalPatch(namespaces, keep_positive_entries=True),
        Policy(namespaces),
    ]
    results: dict[str, dict[str, dict[str, Any]]] = {}
    calibration = _calibrate(namespaces, _FIRST_SIZE - 1)
    size = _FIRST_SIZE
    for name in workloads:
        results[name] = {}
        for config in configs:
            results[name][config.name] = _one_configuration(config, name, size, modes, wanted)
            size += 1
            if isinstance(config, GlobalPatch):
                # Hygiene: the kept positive entries would answer later stock modes.
                evict_backend_entries(namespaces)
            if progress is not None:
                progress(f"memory: {name}/{config.name} ({modes} modes)")
    return {
        "modes": modes,
        "definition": (
            "after N modes each replayed the graph once and were dropped, then gc.collect(): "
            "retained_backend_entries = backend-namespace entries added to FakeTensorMode.cache "
            "+ live backend _DispatchCacheKey objects outside it (heap scan, after - before); "
            "builtin (aten/prim/prims) entries added to FakeTensorMode.cache are reported "
            "separately as class_cache_growth.builtin; global-patch runs as PR 21700 does "
            "(positive entries kept) and is purged afterwards"
        ),
        "scan_calibration": calibration,
        "workloads": results,
    }
