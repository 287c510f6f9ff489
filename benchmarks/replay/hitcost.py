"""What one cache hit on a backend op costs, next to the floor of building its output."""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch._dispatch.python import enable_python_dispatcher
from torch._ops import OpOverload
from torch._subclasses import fake_tensor as _ft
from torch._subclasses.fake_tensor import FakeTensor, in_kernel_invocation_manager

import torch_cachepolicy as tcp
from benchmarks.global_patch import global_patch
from benchmarks.replay import dialect

__all__ = ["HitCase", "VARIANTS", "hit_cases", "measure_hit_costs"]

VARIANTS: tuple[str, ...] = ("policy_hit", "floor", "global_patch_hit", "stock_uncached")
"""policy_hit: a hit in the policy mode; floor: ``FakeTensor(mode,
torch.empty_strided(..., device="meta"), device)`` under
``in_kernel_invocation_manager``, the least a hit can do; global_patch_hit:
torch's own hit path for the op under the baseline patch; stock_uncached: the
stock dispatch (never cached), i.e. what a hit saves."""


@dataclass(frozen=True)
class HitCase:
    """A backend op and a way to build its (fake) arguments in a mode."""

    label: str
    op: OpOverload
    make_args: Callable[[_ft.FakeTensorMode], tuple[Any, ...]]


def hit_cases() -> list[HitCase]:
    """The measured ops: the dialect's conv2d and quantized_decomposed's quantize."""

    def conv_args(mode: _ft.FakeTensorMode) -> tuple[Any, ...]:
        x = mode.from_tensor(torch.zeros(2, 16, 16, 16, dtype=torch.int8))
        w = mode.from_tensor(torch.zeros(16, 16, 3, 3, dtype=torch.int8))
        b = mode.from_tensor(torch.zeros(16, dtype=torch.int32))
        return (x, w, b, [1, 1], [1, 1, 1, 1], [1, 1])

    def quantize_args(mode: _ft.FakeTensorMode) -> tuple[Any, ...]:
        x = mode.from_tensor(torch.zeros(2, 16, 16, 16))
        return (x, 0.02, 0, -128, 127, torch.int8)

    return [
        HitCase(f"{dialect.NAMESPACE}::conv2d", dialect.ops.conv2d, conv_args),
        HitCase(
            "quantized_decomposed::quantize_per_tensor",
            torch.ops.quantized_decomposed.quantize_per_tensor.default,
            quantize_args,
        ),
    ]


def _timed(fn: Callable[[], None]) -> tuple[float, float]:
    """Wall and process-CPU seconds of ``fn()``, with the cyclic GC off."""
    gc.disable()
    try:
        start, cpu_start = time.perf_counter(), time.process_time()
        fn()
        return time.perf_counter() - start, time.process_time() - cpu_start
    finally:
        gc.enable()


def _measure_case(
    case: HitCase, namespaces: tuple[str, ...], batches: int, calls: int
) -> tuple[dict[str, tuple[float, float]], list[str]]:
    """Median per-call wall and CPU seconds of each variant; problems found on the way."""
    problems: list[str] = []
    policy_mode = tcp.FakeTensorMode(
        cache_policy=tcp.CachePolicy(namespaces=list(namespaces)), allow_non_fake_inputs=True
    )
    policy_args = case.make_args(policy_mode)
    with policy_mode, enable_python_dispatcher():
        sample = case.op(*policy_args)  # the miss that fills the entry
    assert isinstance(sample, FakeTensor)
    shape, stride, dtype, device = tuple(sample.shape), sample.stride(), sample.dtype, sample.device
    stock_mode = _ft.FakeTensorMode(allow_non_fake_inputs=True)
    stock_args = case.make_args(stock_mode)

    def policy_hit() -> None:
        with policy_mode, enable_python_dispatcher():
            for _ in range(calls):
                case.op(*policy_args)

    def floor() -> None:
        for _ in range(calls):
            with in_kernel_invocation_manager(policy_mode):
                meta = torch.empty_strided(shape, stride, dtype=dtype, device="meta")
            FakeTensor(policy_mode, meta, device)

    def stock_uncached() -> None:
        with stock_mode, enable_python_dispatcher():
            for _ in range(calls):
                case.op(*stock_args)

    samples: dict[str, list[tuple[float, float]]] = {v: [] for v in VARIANTS}
    for b in range(batches):
        order = [VARIANTS[(b + i) % len(VARIANTS)] for i in range(len(VARIANTS))]
        for variant in order:
            if variant == "policy_hit":
                hits = policy_mode.cache_report()[case.op].hits
                seconds = _timed(policy_hit)
                if policy_mode.cache_report()[case.op].hits - hits != calls:
                    problems.append(f"{case.label}: a policy call in batch {b} was not a hit")
            elif variant == "floor":
                seconds = _timed(floor)
            elif variant == "stock_uncached":
                seconds = _timed(stock_uncached)
            else:
                # The same calls as stock_uncached, now hits under the patch.
                with global_patch(namespaces):
                    with stock_mode, enable_python_dispatcher():
                        case.op(*stock_args)  # the miss that fills the entry
                    hits = _ft.FakeTensorMode.cache_hits
                    seconds = _timed(stock_uncached)
                    if _ft.FakeTensorMode.cache_hits - hits != calls:
                        problems.append(f"{case.label}: a global-patch call in batch {b} was not a hit")
            samples[variant].append((seconds[0] / calls, seconds[1] / calls))
    medians = {v: (statistics.median(w for w, _ in s), statistics.median(c for _, c in s)) for v, s in samples.items()}
    return medians, problems


def measure_hit_costs(
    namespaces: tuple[str, ...], *, batches: int, calls: int
) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Per op: median microseconds per call of every variant (wall time, and
    process CPU time, which other processes on the machine do not inflate)
    and the wall-time ratios.

    Variants are interleaved batch by batch, the starting one rotating;
    each batch times ``calls`` back-to-back calls and yields one per-call sample.
    """
    results: dict[str, dict[str, Any]] = {}
    problems: list[str] = []
    for case in hit_cases():
        medians, found = _measure_case(case, namespaces, batches, calls)
        problems += found
        us = {v: medians[v][0] * 1e6 for v in VARIANTS}
        cpu_us = {v: medians[v][1] * 1e6 for v in VARIANTS}
        results[case.label] = {
            "median_us": us,
            "median_cpu_us": cpu_us,
            "policy_hit_over_floor": us["policy_hit"] / us["floor"],
            "policy_hit_over_floor_cpu": cpu_us["policy_hit"] / cpu_us["floor"],
            "policy_hit_over_global_patch_hit": us["policy_hit"] / us["global_patch_hit"],
            "stock_uncached_over_policy_hit": us["stock_uncached"] / us["policy_hit"],
            "batches": batches,
            "calls_per_batch": calls,
        }
    return results, problems
