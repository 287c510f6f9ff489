"""The whole benchmark: timing, hit cost, memory, targets and correctness checks."""

from __future__ import annotations

import dataclasses
import gc
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch._library.utils as library_utils

from benchmarks.global_patch import positive_backend_entries
from benchmarks.progress import Rounds
from benchmarks.replay.audit import audit_configuration
from benchmarks.replay.configs import make_configurations
from benchmarks.replay.hitcost import measure_aten_hit_costs, measure_hit_costs
from benchmarks.replay.memory import measure_memory
from benchmarks.replay.results import SCHEMA, environment, summarize_workload
from benchmarks.replay.runner import Progress, run_workload
from benchmarks.replay.targets import evaluate_targets
from benchmarks.replay.workloads import BACKEND_NAMESPACES, WORKLOAD_NAMES, build_workload

__all__ = ["FULL", "QUICK", "Settings", "run_benchmark"]


@dataclass(frozen=True)
class Settings:
    """How much to measure.

    Attributes:
        rounds: measured rounds per workload.
        warmup_rounds: discarded rounds first.
        replays: K, replays per series (one mode per series).
        memory_modes: short-lived modes per configuration in the memory
            test; 0 skips it.
        hit_batches: interleaved batches of the hit-cost measurement; 0 skips it.
        hit_calls: calls per hit-cost batch.
        workloads: which workloads to time.
    """

    rounds: int
    warmup_rounds: int
    replays: int
    memory_modes: int
    hit_batches: int
    hit_calls: int
    workloads: tuple[str, ...] = WORKLOAD_NAMES


# Rounds are multiples of 6 so every order of the three configurations runs
# equally often (see run_workload). QUICK is too short to judge timings, FULL
# is long enough (Note [Which targets a run may judge] in targets.py).
QUICK = Settings(rounds=6, warmup_rounds=1, replays=5, memory_modes=50, hit_batches=9, hit_calls=50)
FULL = Settings(rounds=18, warmup_rounds=2, replays=20, memory_modes=1000, hit_batches=31, hit_calls=200)


def run_benchmark(settings: Settings, *, argv: Sequence[str] = (), progress: Progress | None = None) -> dict[str, Any]:
    """Runs every measurement of ``settings``; returns the results document."""
    # Importing torch leaves hundreds of thousands of objects for the cyclic collector;
    # every gc.collect() between series (and in the memory test) would scan
    # them all (~0.3 s each). Frozen, they are skipped until we unfreeze
    # (unless the caller had frozen objects itself: then that is its call).
    caller_froze = gc.get_freeze_count() > 0
    gc.collect()
    gc.freeze()
    try:
        return _run_benchmark(settings, argv, progress)
    finally:
        if not caller_froze:
            gc.unfreeze()


def _run_benchmark(settings: Settings, argv: Sequence[str], progress: Progress | None) -> dict[str, Any]:
    namespaces = BACKEND_NAMESPACES
    predicate_before = library_utils.is_builtin
    failures: list[str] = []
    checks: list[str] = []
    configs = make_configurations(namespaces)

    workloads: dict[str, Any] = {}
    replays_checked = 0
    # One line per round, with an estimate of what the replay rounds have left.
    rounds = Rounds(len(settings.workloads) * (settings.warmup_rounds + settings.rounds), progress)
    for name in settings.workloads:
        workload = build_workload(name)
        run = run_workload(
            workload,
            configs,
            rounds=settings.rounds,
            warmup_rounds=settings.warmup_rounds,
            replays=settings.replays,
            progress=rounds.done,
            after_series=lambda config: _leak_check(config, namespaces),
        )
        workloads[name] = summarize_workload(run)
        # Untimed, after the timed rounds: which of each caching configuration's hits were right.
        workloads[name]["audit"] = {
            c.name: audit_configuration(c, workload, settings.replays).to_json() for c in configs if c.name != "stock"
        }
        failures += run.mismatches + run.problems
        if run.mismatch_count > len(run.mismatches):
            failures.append(f"{name}: {run.mismatch_count - len(run.mismatches)} more replays differed")
        replays_checked += run.replays_checked
    checks.append(f"output metadata of {replays_checked} replays identical across configurations")
    checks.append("no positive backend entry in FakeTensorMode.cache after any series")

    hit_cost: dict[str, Any] = {}
    aten_hit_cost: dict[str, Any] = {}
    if settings.hit_batches > 0:
        hit_cost, problems = measure_hit_costs(namespaces, batches=settings.hit_batches, calls=settings.hit_calls)
        failures += problems
        aten_hit_cost, problems = measure_aten_hit_costs(batches=settings.hit_batches, calls=settings.hit_calls)
        failures += problems
        checks.append("every timed hit-cost call was a hit")
        if progress is not None:
            progress("hit cost measured")

    memory: dict[str, Any] = {}
    if settings.memory_modes > 0:
        memory = measure_memory(namespaces, modes=settings.memory_modes, progress=progress)
        cal = memory["scan_calibration"]
        if cal["backend_keys_seen_by_scan"] < cal["live_store_entries"]:
            failures.append(f"memory: the heap scan cannot see a live store's keys ({cal})")
        checks.append("the memory heap scan sees a live store's keys")

    if library_utils.is_builtin is not predicate_before:
        failures.append("torch._library.utils.is_builtin was not restored")
    checks.append("torch._library.utils.is_builtin restored")

    results: dict[str, Any] = {
        "schema": SCHEMA,
        "environment": environment(argv),
        "settings": {
            **dataclasses.asdict(settings),
            "backend_namespaces": list(namespaces),
            "configurations": {c.name: c.summary for c in configs},
        },
        "workloads": workloads,
        "hit_cost": hit_cost,
        "aten_hit_cost": aten_hit_cost,
        "memory": memory,
        "targets": [],
        "correctness": {"ok": not failures, "failures": failures, "checks": checks},
    }
    results["targets"] = [t.to_json() for t in evaluate_targets(results)]
    return results


def _leak_check(config: str, namespaces: tuple[str, ...]) -> str | None:
    leaked = positive_backend_entries(namespaces)
    if leaked:
        return f"{leaked} positive backend entries in FakeTensorMode.cache after a {config} series"
    return None
