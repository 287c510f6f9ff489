"""Interleaved measurement of replay series, with every replay's output checked."""

from __future__ import annotations

import gc
import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from torch.fx.experimental.symbolic_shapes import ShapeEnv

from benchmarks.replay.configs import Configuration, Counts
from benchmarks.replay.exportpass import fake_inputs, replay
from benchmarks.replay.metadata import GraphMetadata, capture, first_difference
from benchmarks.replay.workloads import Workload
from benchmarks.timing import timed

__all__ = ["Progress", "Series", "WorkloadRun", "run_series", "run_workload"]

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Series:
    """One mode's K replays under one configuration.

    Attributes:
        seconds: wall time (``time.perf_counter``) of the K replays only (mode
            creation, fake input creation and the configuration's scope are
            outside it).
        cpu_seconds: process CPU time (``time.process_time``) of the same
            span, which time stolen by other processes on the machine does
            not inflate; reported next to the wall-time figures as a check.
        counts: cache outcomes during the K replays.
        scope_enter: seconds spent entering the configuration's scope.
        scope_exit: seconds spent leaving it.
    """

    seconds: float
    cpu_seconds: float
    counts: Counts
    scope_enter: float
    scope_exit: float


@dataclass
class WorkloadRun:
    """Everything measured for one workload.

    Attributes:
        series: per configuration, the measured (not warm-up) series in round order.
        mismatches: one sentence per replay whose metadata differed from the
            reference replay; empty when every replay agreed.
        mismatch_count: how many replays differed (``mismatches`` keeps the
            first 20 sentences).
        replays_checked: how many replays were compared with the reference.
        problems: what ``after_series`` reported.
    """

    workload: Workload
    replays: int
    warmup_rounds: int
    series: dict[str, list[Series]] = field(default_factory=dict)
    mismatches: list[str] = field(default_factory=list)
    mismatch_count: int = 0
    replays_checked: int = 0
    problems: list[str] = field(default_factory=list)


def run_series(config: Configuration, workload: Workload, replays: int) -> tuple[Series, list[GraphMetadata]]:
    """Creates a mode as ExportPass finds it, replays the graph ``replays``
    times and returns the timing plus each replay's output metadata."""
    mode = config.make_mode(ShapeEnv() if workload.dynamic_batch else None)
    inputs = fake_inputs(mode, workload)
    gc.collect()
    t0 = time.perf_counter()
    with config.scope(mode):
        t1 = time.perf_counter()
        before = config.counts(mode)
        # No collection inside the timed span (as timeit does): a cyclic GC
        # pass lands on whichever configuration happens to trigger it. The
        # collection before it ran above, outside the scope's timed entry.
        with timed(collect=False) as timing:
            envs = replay(workload.graph, mode, inputs, replays)
        counts = config.counts(mode) - before
        t2 = time.perf_counter()
    t3 = time.perf_counter()
    metadata = [capture(workload.graph, env) for env in envs]
    return Series(timing.seconds, timing.cpu_seconds, counts, t1 - t0, t3 - t2), metadata


def run_workload(
    workload: Workload,
    configs: Sequence[Configuration],
    *,
    rounds: int,
    warmup_rounds: int,
    replays: int,
    progress: Progress | None = None,
    after_series: Callable[[str], str | None] | None = None,
) -> WorkloadRun:
    """Runs ``warmup_rounds + rounds`` rounds; each round runs one series per
    configuration, back to back. Rounds cycle through every order of the
    configurations (A B C, A C B, B A C, ...), so over a multiple of 6 rounds
    each configuration runs first, second and third, and after each of the
    others, equally often.

    Every replay of every series, warm-up included, is checked against the
    first replay of the first series. ``after_series(config_name)`` runs after
    each series and may return a problem to record.
    """
    run = WorkloadRun(workload, replays, warmup_rounds, {c.name: [] for c in configs})
    reference: GraphMetadata | None = None
    reference_of = ""
    orders = list(itertools.permutations(configs))
    for r in range(warmup_rounds + rounds):
        # Warm-up rounds do not consume an order: measured round i runs orders[i % 6].
        order = orders[max(r - warmup_rounds, 0) % len(orders)]
        for config in order:
            series, metadata = run_series(config, workload, replays)
            for i, meta in enumerate(metadata):
                if reference is None:
                    reference, reference_of = meta, f"{config.name} round 0 replay 0"
                    continue
                run.replays_checked += 1
                diff = first_difference(reference, meta)
                if diff is None:
                    continue
                run.mismatch_count += 1
                if len(run.mismatches) < 20:
                    run.mismatches.append(
                        f"{workload.name}: {config.name} round {r} replay {i} differs from {reference_of}: {diff}"
                    )
            if r >= warmup_rounds:
                run.series[config.name].append(series)
            problem = after_series(config.name) if after_series is not None else None
            if problem is not None:
                run.problems.append(f"{workload.name}: round {r}: {problem}")
        if progress is not None:
            label = "warm-up" if r < warmup_rounds else f"round {r - warmup_rounds + 1}/{rounds}"
            progress(f"{workload.name}: {label}")
    return run
