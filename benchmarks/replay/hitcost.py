"""What one cache hit costs, next to the floor of building its output.

Two tables: backend ops (``hit_cost``: the policy's hit against the floor,
the global patch's hit and stock's uncached dispatch) and aten ops
(``aten_hit_cost``: the policy's hit against stock's own hit, since stock
caches aten).
"""

from __future__ import annotations

import statistics
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
from benchmarks.timing import timed

__all__ = [
    "ATEN_VARIANTS",
    "HitCase",
    "VARIANTS",
    "aten_hit_cases",
    "hit_cases",
    "measure_aten_hit_costs",
    "measure_hit_costs",
]

VARIANTS: tuple[str, ...] = ("policy_hit", "floor", "global_patch_hit", "stock_uncached")
"""policy_hit: a hit in the policy mode; floor: ``FakeTensor(mode,
torch.empty_strided(..., device="meta"), device)`` under
``in_kernel_invocation_manager``, the least a hit can do; global_patch_hit:
torch's own hit path for the op under the baseline patch; stock_uncached: the
stock dispatch (never cached), i.e. what a hit saves."""

ATEN_VARIANTS: tuple[str, ...] = ("policy_hit", "floor", "stock_hit")
"""For aten ops: policy_hit and floor as in :data:`VARIANTS`; stock_hit: a hit
of a stock ``FakeTensorMode`` (torch's own hit path, torch's key)."""


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
    # No collection first: a batch is short and there are many of them.
    with timed(collect=False) as timing:
        fn()
    return timing.seconds, timing.cpu_seconds


def _floor(mode: _ft.FakeTensorMode, sample: FakeTensor, calls: int) -> Callable[[], None]:
    """``calls`` outputs like ``sample`` built as torch builds a hit's output, and nothing else."""
    shape, stride, dtype, device = tuple(sample.shape), sample.stride(), sample.dtype, sample.device

    def floor() -> None:
        for _ in range(calls):
            with in_kernel_invocation_manager(mode):
                meta = torch.empty_strided(shape, stride, dtype=dtype, device="meta")
            FakeTensor(mode, meta, device)

    return floor


def _all_hits(
    fn: Callable[[], None], hits: Callable[[], int], calls: int, what: str, problems: list[str]
) -> Callable[[int], tuple[float, float]]:
    """Times ``fn`` in batch ``b``, recording a problem unless it made exactly ``calls`` hits."""

    def run(b: int) -> tuple[float, float]:
        before = hits()
        seconds = _timed(fn)
        if hits() - before != calls:
            problems.append(f"{what} in batch {b} was not a hit")
        return seconds

    return run


def _interleaved(
    runs: dict[str, Callable[[int], tuple[float, float]]], batches: int, calls: int
) -> dict[str, tuple[float, float]]:
    """Median per-call wall and CPU seconds of each run, batch by batch, the starting run rotating."""
    names = list(runs)
    samples: dict[str, list[tuple[float, float]]] = {v: [] for v in names}
    for b in range(batches):
        for i in range(len(names)):
            variant = names[(b + i) % len(names)]
            wall, cpu = runs[variant](b)
            samples[variant].append((wall / calls, cpu / calls))
    return {v: (statistics.median(w for w, _ in s), statistics.median(c for _, c in s)) for v, s in samples.items()}


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
        case.op(*policy_args)  # the key's first sight (Note [An entry on a key's second sight])
        sample = case.op(*policy_args)  # the miss that fills the entry
    assert isinstance(sample, FakeTensor)
    stock_mode = _ft.FakeTensorMode(allow_non_fake_inputs=True)
    stock_args = case.make_args(stock_mode)

    def policy_hit() -> None:
        with policy_mode, enable_python_dispatcher():
            for _ in range(calls):
                case.op(*policy_args)

    def stock_uncached() -> None:
        with stock_mode, enable_python_dispatcher():
            for _ in range(calls):
                case.op(*stock_args)

    def global_patch_hit(b: int) -> tuple[float, float]:
        # The same calls as stock_uncached, now hits under the patch.
        with global_patch(namespaces):
            with stock_mode, enable_python_dispatcher():
                case.op(*stock_args)  # the miss that fills the entry
            return _all_hits(
                stock_uncached, lambda: _ft.FakeTensorMode.cache_hits, calls, f"{case.label}: a global-patch call", problems
            )(b)

    runs = {
        "policy_hit": _all_hits(
            policy_hit, lambda: policy_mode.cache_report()[case.op].hits, calls, f"{case.label}: a policy call", problems
        ),
        "floor": lambda b: _timed(_floor(policy_mode, sample, calls)),
        "global_patch_hit": global_patch_hit,
        "stock_uncached": lambda b: _timed(stock_uncached),
    }
    assert tuple(runs) == VARIANTS
    return _interleaved(runs, batches, calls), problems


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


def aten_hit_cases() -> list[HitCase]:
    """Aten ops whose hits dominate exporter passes: conv, linear with bias, a pointwise op, a view."""

    def x(mode: _ft.FakeTensorMode) -> Any:
        return mode.from_tensor(torch.zeros(2, 16, 16, 16))

    def conv_args(mode: _ft.FakeTensorMode) -> tuple[Any, ...]:
        w = mode.from_tensor(torch.zeros(16, 16, 3, 3))
        b = mode.from_tensor(torch.zeros(16))
        return (x(mode), w, b, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)

    def addmm_args(mode: _ft.FakeTensorMode) -> tuple[Any, ...]:
        b = mode.from_tensor(torch.zeros(24))
        return (b, mode.from_tensor(torch.zeros(8, 32)), mode.from_tensor(torch.zeros(32, 24)))

    aten = torch.ops.aten
    return [
        HitCase("aten::convolution", aten.convolution.default, conv_args),
        HitCase("aten::addmm (linear with bias)", aten.addmm.default, addmm_args),
        HitCase("aten::relu", aten.relu.default, lambda mode: (x(mode),)),
        HitCase("aten::view", aten.view.default, lambda mode: (x(mode), [2, -1])),
    ]


def _measure_aten_case(
    case: HitCase, batches: int, calls: int
) -> tuple[dict[str, tuple[float, float]], list[str]]:
    problems: list[str] = []
    policy_mode = tcp.FakeTensorMode(cache_policy=tcp.CachePolicy(), allow_non_fake_inputs=True)
    stock_mode = _ft.FakeTensorMode(allow_non_fake_inputs=True)
    policy_args, stock_args = case.make_args(policy_mode), case.make_args(stock_mode)
    with policy_mode:
        sample = case.op(*policy_args)
    with stock_mode:
        case.op(*stock_args)
    assert isinstance(sample, FakeTensor)

    def policy_hit() -> None:
        with policy_mode:
            for _ in range(calls):
                case.op(*policy_args)

    def stock_hit() -> None:
        with stock_mode:
            for _ in range(calls):
                case.op(*stock_args)

    runs = {
        "policy_hit": _all_hits(
            policy_hit, lambda: policy_mode.cache_report()[case.op].hits, calls, f"{case.label}: a policy call", problems
        ),
        "floor": lambda b: _timed(_floor(policy_mode, sample, calls)),
        "stock_hit": _all_hits(
            stock_hit, lambda: _ft.FakeTensorMode.cache_hits, calls, f"{case.label}: a stock call", problems
        ),
    }
    assert tuple(runs) == ATEN_VARIANTS
    return _interleaved(runs, batches, calls), problems


def measure_aten_hit_costs(*, batches: int, calls: int) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Per aten op: median microseconds per call of each of :data:`ATEN_VARIANTS`
    (wall and process CPU time), interleaved batch by batch as in
    :func:`measure_hit_costs`, and the policy's hit over stock's hit."""
    results: dict[str, dict[str, Any]] = {}
    problems: list[str] = []
    for case in aten_hit_cases():
        medians, found = _measure_aten_case(case, batches, calls)
        problems += found
        us = {v: medians[v][0] * 1e6 for v in ATEN_VARIANTS}
        cpu_us = {v: medians[v][1] * 1e6 for v in ATEN_VARIANTS}
        results[case.label] = {
            "median_us": us,
            "median_cpu_us": cpu_us,
            "policy_hit_over_stock_hit": us["policy_hit"] / us["stock_hit"],
            "policy_hit_over_stock_hit_cpu": cpu_us["policy_hit"] / cpu_us["stock_hit"],
            "policy_hit_over_floor_cpu": cpu_us["policy_hit"] / cpu_us["floor"],
            "batches": batches,
            "calls_per_batch": calls,
        }
    return results, problems
