"""Turns measurements into the results document (``results.json``).

Every timing figure is a median over interleaved rounds; every ratio is the
median of per-round ratios of series run back to back in the same round
(``of_medians`` gives the ratio of the medians too, for comparison).
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
from collections.abc import Sequence
from typing import Any

import torch

import torch_cachepolicy
from benchmarks.replay.configs import Counts
from benchmarks.replay.runner import Series, WorkloadRun

__all__ = [
    "CONFIG_KEYS",
    "RATIOS",
    "SCHEMA",
    "TOP_LEVEL_KEYS",
    "WORKLOAD_KEYS",
    "environment",
    "ratio_summary",
    "summarize_workload",
]

SCHEMA = "benchmarks.replay/1"

TOP_LEVEL_KEYS: tuple[str, ...] = (
    "schema",
    "environment",
    "settings",
    "workloads",
    "hit_cost",
    "aten_hit_cost",
    "memory",
    "targets",
    "correctness",
)
WORKLOAD_KEYS: tuple[str, ...] = (
    "description",
    "call_function_nodes",
    "backend_nodes",
    "replays_per_series",
    "rounds",
    "configs",
    "ratios",
    "ratios_cpu_time",
    "metadata_check",
    "audit",
)
CONFIG_KEYS: tuple[str, ...] = (
    "seconds_per_round",
    "median_seconds",
    "median_ms_per_replay",
    "cpu_seconds_per_round",
    "median_cpu_ms_per_replay",
    "counts",
    "counts_identical_across_rounds",
    "counts_per_round",
    "scope_enter_ms_median",
    "scope_exit_ms_median",
)

# (name, numerator, denominator): a time ratio, so stock/policy > 1 means
# policy is faster and policy/global-patch < 1 means policy is faster.
RATIOS: tuple[tuple[str, str, str], ...] = (
    ("stock/policy", "stock", "policy"),
    ("stock/global-patch", "stock", "global-patch"),
    ("policy/global-patch", "policy", "global-patch"),
    ("policy/stock", "policy", "stock"),
)


def environment(argv: Sequence[str]) -> dict[str, Any]:
    """Where and how the figures were taken."""
    return {
        "torch": torch.__version__,
        "torch_cachepolicy": torch_cachepolicy.__version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "argv": list(argv),
    }


def ratio_summary(numerator: Sequence[Series], denominator: Sequence[Series], *, cpu: bool = False) -> dict[str, Any]:
    """Paired per-round ratios, their median, and the ratio of the medians
    (of wall time, or of process CPU time with ``cpu=True``)."""

    def t(s: Series) -> float:
        return s.cpu_seconds if cpu else s.seconds

    per_round = [t(n) / t(d) for n, d in zip(numerator, denominator, strict=True)]
    return {
        "per_round": per_round,
        "median": statistics.median(per_round),
        "of_medians": statistics.median(t(s) for s in numerator) / statistics.median(t(s) for s in denominator),
    }


def _config_summary(series: Sequence[Series], replays: int) -> dict[str, Any]:
    seconds = [s.seconds for s in series]
    counts: list[Counts] = [s.counts for s in series]
    return {
        "seconds_per_round": seconds,
        "median_seconds": statistics.median(seconds),
        "median_ms_per_replay": statistics.median(seconds) / replays * 1e3,
        "cpu_seconds_per_round": [s.cpu_seconds for s in series],
        "median_cpu_ms_per_replay": statistics.median(s.cpu_seconds for s in series) / replays * 1e3,
        # One series = one mode's K replays; after warm-up every round
        # should count the same, which the next key confirms.
        "counts": counts[0].to_json(),
        "counts_identical_across_rounds": all(c == counts[0] for c in counts),
        "counts_per_round": [c.to_json() for c in counts],
        "scope_enter_ms_median": statistics.median(s.scope_enter for s in series) * 1e3,
        "scope_exit_ms_median": statistics.median(s.scope_exit for s in series) * 1e3,
    }


def summarize_workload(run: WorkloadRun) -> dict[str, Any]:
    """The ``workloads[name]`` entry of the results document."""
    series = run.series
    return {
        "description": run.workload.description,
        "call_function_nodes": run.workload.call_function_nodes,
        "backend_nodes": run.workload.backend_nodes(),
        "dynamic_batch": run.workload.dynamic_batch,
        "replays_per_series": run.replays,
        "rounds": len(next(iter(series.values()))),
        "warmup_rounds": run.warmup_rounds,
        "configs": {name: _config_summary(s, run.replays) for name, s in series.items()},
        "ratios": {
            name: ratio_summary(series[num], series[den])
            for name, num, den in RATIOS
            if num in series and den in series
        },
        "ratios_cpu_time": {
            name: ratio_summary(series[num], series[den], cpu=True)
            for name, num, den in RATIOS
            if num in series and den in series
        },
        "metadata_check": {
            "identical": run.mismatch_count == 0,
            "replays_checked": run.replays_checked,
            "mismatch_count": run.mismatch_count,
            "mismatches": list(run.mismatches),
        },
    }
