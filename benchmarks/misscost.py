"""What one backend-op miss costs, and where its time goes: stock's bypass against each kind of policy dispatch.

Run ``python -m benchmarks.misscost [--calls N] [--rounds N] [--shape-env] [--profile] [--json PATH]`` from the
repository root.

Each round dispatches ``quantized_decomposed.quantize_per_tensor`` on ``--calls`` inputs of distinct shapes (every
key new), four times over, in a fresh mode per configuration, interleaved in a rotating order:

* ``stock``: torch's ``FakeTensorMode``; every call runs the kernel (``"non-builtin"``: the first sight of a key
  makes a negative entry, later ones find it);
* ``policy``: ``torch_cachepolicy.FakeTensorMode`` admitting ``quantized_decomposed``: a key's first sight only
  runs the kernel and marks the key (Note [An entry on a key's second sight] in ``_driver.py``), its second makes
  and verifies the entry, later ones hit.

The figures are medians over rounds of the process-CPU microseconds per call of each sight (1st, 2nd, 3rd, 4th),
and their ratios to stock's same sight. ``--profile`` adds, for the policy's first and second sights, the functions
of the package and of torch's cache taking the most cumulative time (``cProfile``; its own overhead inflates every
figure, so read it as shares).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from torch._subclasses import fake_tensor as _ft
from torch.fx.experimental.symbolic_shapes import ShapeEnv

import torch_cachepolicy as tcp

__all__ = ["CONFIGS", "SIGHTS", "main", "run"]

CONFIGS: tuple[str, ...] = ("stock", "policy")
SIGHTS = 4


def _make(config: str, shape_env: bool) -> _ft.FakeTensorMode:
    env = ShapeEnv() if shape_env else None
    if config == "stock":
        return _ft.FakeTensorMode(shape_env=env)
    return tcp.FakeTensorMode(cache_policy=tcp.CachePolicy(namespaces=["quantized_decomposed"]), shape_env=env)


def _inputs(mode: _ft.FakeTensorMode, calls: int, base: int) -> list[torch.Tensor]:
    return [mode.from_tensor(torch.empty(8, base + i)) for i in range(calls)]


def _sights(mode: _ft.FakeTensorMode, xs: list[torch.Tensor], profiler: cProfile.Profile | None = None) -> list[float]:
    """Microseconds of CPU per call for each of the four sights of every key."""
    import torch.ao.quantization.fx._decomposed  # noqa: F401  (defines quantized_decomposed)

    quantize = torch.ops.quantized_decomposed.quantize_per_tensor.default
    out = []
    with mode:
        for sight in range(SIGHTS):
            if profiler is not None and sight < 2:
                profiler.enable()
            start = time.process_time()
            for x in xs:
                quantize(x, 0.1, 0, -128, 127, torch.int8)
            out.append((time.process_time() - start) / len(xs) * 1e6)
            if profiler is not None:
                profiler.disable()
    return out


def run(rounds: int, calls: int, shape_env: bool) -> dict[str, object]:
    """Interleaved rounds; per configuration and sight, the median microseconds per call and the ratio to stock."""
    us: dict[str, list[list[float]]] = {c: [[] for _ in range(SIGHTS)] for c in CONFIGS}
    for r in range(rounds + 1):  # round 0 warms up and is discarded
        for config in CONFIGS[r % 2 :] + CONFIGS[: r % 2]:
            _ft.FakeTensorMode.cache_clear()
            mode = _make(config, shape_env)
            per_sight = _sights(mode, _inputs(mode, calls, 16 + 1000 * r))
            if r:
                for k, v in enumerate(per_sight):
                    us[config][k].append(v)
    return {
        "rounds": rounds,
        "calls": calls,
        "shape_env": shape_env,
        "us_per_call_median": {c: [statistics.median(v) for v in per] for c, per in us.items()},
        "policy_over_stock_median": [
            statistics.median(p / s for p, s in zip(us["policy"][k], us["stock"][k], strict=True))
            for k in range(SIGHTS)
        ],
    }


def profile(calls: int, shape_env: bool) -> str:
    """The policy's first two sights under cProfile: the package's and torch's cache functions by cumulative time."""
    _ft.FakeTensorMode.cache_clear()
    mode = _make("policy", shape_env)
    profiler = cProfile.Profile()
    _sights(mode, _inputs(mode, calls, 50_000), profiler)
    stream = io.StringIO()
    stats = pstats.Stats(profiler, stream=stream).sort_stats("cumulative")
    stats.print_stats(r"torch_cachepolicy|fake_tensor.py.*(_dispatch_impl|_make_cache_entry|_output_from)", 20)
    return stream.getvalue()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.misscost", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--shape-env", action="store_true", help="modes with a ShapeEnv (inputs then symbolic)")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.calls < 1:
        parser.error("--rounds and --calls must be at least 1")
    result = run(args.rounds, args.calls, args.shape_env)
    us: dict[str, list[float]] = result["us_per_call_median"]  # type: ignore[assignment]
    ratios: list[float] = result["policy_over_stock_median"]  # type: ignore[assignment]
    print("| sight | stock us/call | policy us/call | policy / stock |\n| --- | --- | --- | --- |")
    for k in range(SIGHTS):
        print(f"| {k + 1} | {us['stock'][k]:.1f} | {us['policy'][k]:.1f} | {ratios[k]:.3f} |")
    if args.profile:
        print()
        print(profile(args.calls, args.shape_env))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
