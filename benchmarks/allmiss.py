"""The cost of a first pass and of the replays after it: stock, the global patch and a policy mode.

Run ``python -m benchmarks.allmiss [--rounds N] [--layers N] [--shape distinct|exporter|interpreter] [--shape-env]
[--passes K] [--json PATH]`` from the repository root.

The program is ``--layers`` linear layers of distinct widths, each input passed through a
``quantized_decomposed`` quantize/dequantize pair, so the first pass's keys are all new. ``--shape distinct`` (the
default) dispatches ``aten.linear``/``aten.relu`` directly on tensors made inside the mode, each Q/DQ pair with a
scale of its own. ``--shape exporter`` is an ``fx.Interpreter`` over the traced module (``F.linear``, whose composite
kernel dispatches ``t`` and ``addmm``), its input and parameters made with ``from_tensor`` before the pass, Q/DQ at
one scale. ``--shape interpreter`` is the same pass over an exported graph's ops: ``aten.linear``/``aten.relu``
nodes and a Q/DQ scale per layer. ``--shape-env`` gives every mode a ShapeEnv, as an exported program's mode has:
``from_tensor`` then makes every size symbolic. ``--passes K`` runs K passes per mode: the first pass (every key
new), then replays (the second meets every key a second time, later ones are warm).

Each round runs every configuration once, in a fresh mode, after ``FakeTensorMode.cache_clear()`` (a policy mode
writes aten entries into torch's storage, as stock does, so they would otherwise hit):

* ``stock``: torch's ``FakeTensorMode`` (it caches the aten ops and runs the Q/DQ ops uncached);
* ``global-patch``: stock inside ExecuTorch PR 21700's process-global ``is_builtin`` swap for ``quantized_decomposed``
  (:mod:`benchmarks.global_patch`);
* ``policy``: ``torch_cachepolicy.FakeTensorMode`` with ``CachePolicy()`` (aten only, as stock);
* ``policy+qdq``: with ``CachePolicy(namespaces=["quantized_decomposed"])``.

Configurations alternate within a round, in a rotating order, and each figure is the median over rounds of each
round's process-CPU ratio, per pass, to ``stock`` and to ``global-patch``. With ``--shape distinct`` every first
pass's dispatches must all miss (or bypass): a hit fails the run.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import statistics
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import torch
from torch._subclasses import fake_tensor as _ft
from torch.fx.experimental.symbolic_shapes import ShapeEnv

import torch_cachepolicy as tcp
from benchmarks.timing import timed

__all__ = ["CONFIGS", "main", "run"]

CONFIGS: tuple[str, ...] = ("stock", "global-patch", "policy", "policy+qdq")
"""The configurations; ratios are to the first."""

SHAPES: tuple[str, ...] = ("distinct", "exporter", "interpreter")
"""The shapes of the pass (``--shape``)."""

def _ops() -> tuple[Callable[..., torch.Tensor], Callable[..., torch.Tensor]]:
    import torch.ao.quantization.fx._decomposed  # noqa: F401  (registers quantized_decomposed)

    ns = torch.ops.quantized_decomposed
    return ns.quantize_per_tensor.default, ns.dequantize_per_tensor.default


def _widths(layers: int) -> list[int]:
    return [16 + 3 * i for i in range(layers + 1)]


def _program(layers: int) -> Callable[[_ft.FakeTensorMode], None]:
    """One pass over the program in ``mode``: every op's first dispatch with its arguments."""
    quantize, dequantize = _ops()
    widths = _widths(layers)

    def run(mode: _ft.FakeTensorMode) -> None:
        with mode:
            x = torch.empty(8, widths[0])
            for i in range(layers):
                scale = 0.01 + i / 1000
                w = torch.empty(widths[i + 1], widths[i])
                b = torch.empty(widths[i + 1])
                q = quantize(x, scale, 0, -128, 127, torch.int8)
                x = dequantize(q, scale, 0, -128, 127, torch.int8)
                x = torch.ops.aten.relu.default(torch.ops.aten.linear.default(x, w, b))

    return run


class _Layers(torch.nn.Module):
    def __init__(self, widths: list[int], aten: bool = False) -> None:
        super().__init__()
        self.linears = torch.nn.ModuleList(torch.nn.Linear(a, b) for a, b in zip(widths, widths[1:], strict=False))
        self.aten = aten

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        quantize, dequantize = _ops()
        for i, linear in enumerate(self.linears):
            # aten: an exported graph's ops (aten.linear, aten.relu), a Q/DQ scale per layer; else the module's calls.
            scale = 0.01 + i / 1000 if self.aten else 0.02
            x = dequantize(quantize(x, scale, 0, -128, 127, torch.int8), scale, 0, -128, 127, torch.int8)
            if self.aten:
                x = torch.ops.aten.relu.default(torch.ops.aten.linear.default(x, linear.weight, linear.bias))
            else:
                x = torch.relu(linear(x))
        return x


class _Inlining(torch.fx.Tracer):
    def is_leaf_module(self, m: torch.nn.Module, module_qualified_name: str) -> bool:
        return False  # trace into Linear: its parameters become get_attr nodes


class _Replay(torch.fx.Interpreter):
    """Runs a traced module with its parameters taken from ``params`` (FakeTensors of the mode)."""

    def __init__(self, gm: torch.fx.GraphModule, params: Mapping[str, torch.Tensor]) -> None:
        super().__init__(gm)
        self.params = params

    def fetch_attr(self, target: str) -> object:
        return self.params[target]


def _exporter_program(layers: int, aten: bool = False) -> Callable[[_ft.FakeTensorMode], Callable[[], None]]:
    """One pass of an fx.Interpreter over the traced module, inputs and parameters made with from_tensor first."""
    module = _Layers(_widths(layers), aten)
    gm = torch.fx.GraphModule(module, _Inlining().trace(module))
    params = dict(gm.named_parameters())
    x = torch.randn(8, _widths(layers)[0])

    def setup(mode: _ft.FakeTensorMode) -> Callable[[], None]:
        fakes = {name: mode.from_tensor(p) for name, p in params.items()}
        fake_x = mode.from_tensor(x)

        def run() -> None:
            with mode:
                _Replay(gm, fakes).run(fake_x)

        return run

    return setup


def _make(config: str, shape_env: bool) -> _ft.FakeTensorMode:
    # An exported program's mode always has a ShapeEnv (static shapes too).
    env = ShapeEnv() if shape_env else None
    if config in ("stock", "global-patch"):
        return _ft.FakeTensorMode(shape_env=env)
    namespaces = ["quantized_decomposed"] if config == "policy+qdq" else []
    return tcp.FakeTensorMode(cache_policy=tcp.CachePolicy(namespaces=namespaces), shape_env=env)


def _scope(config: str, mode: _ft.FakeTensorMode) -> contextlib.AbstractContextManager[object]:
    if config != "global-patch":
        return contextlib.nullcontext()
    from benchmarks.global_patch import global_patch

    return global_patch(["quantized_decomposed"], shape_envs=[mode.shape_env] if mode.shape_env else [])


def _hits(mode: _ft.FakeTensorMode) -> int:
    if isinstance(mode, tcp.FakeTensorMode):
        return mode.cache_info().hits
    return 0  # stock's counters are class-global; its hits are counted by the caller


def run(
    rounds: int, layers: int, shape: str = "distinct", shape_env: bool = False, passes: int = 1
) -> dict[str, object]:
    """Times ``rounds`` rounds of ``passes`` passes per configuration; returns the CPU seconds per pass and the
    median ratios to stock and to the global patch, per pass."""
    program = _program(layers)
    exporter = _exporter_program(layers, aten=shape == "interpreter") if shape != "distinct" else None
    times: dict[str, list[list[float]]] = {c: [[] for _ in range(passes)] for c in CONFIGS}
    for r in range(rounds + 1):  # round 0 warms up and is discarded
        order = CONFIGS[r % len(CONFIGS):] + CONFIGS[: r % len(CONFIGS)]
        for config in order:
            _ft.FakeTensorMode.cache_clear()
            mode = _make(config, shape_env)
            one_pass = exporter(mode) if exporter is not None else functools.partial(program, mode)
            with _scope(config, mode):
                for k in range(passes):
                    stock_hits = _ft.FakeTensorMode.cache_hits
                    with timed() as t:
                        one_pass()
                    hits = _hits(mode) + (_ft.FakeTensorMode.cache_hits - stock_hits)
                    if k == 0 and hits and exporter is None:
                        raise RuntimeError(f"benchmarks.allmiss: {config} hit {hits} times; every dispatch must miss")
                    if r:
                        times[config][k].append(t.cpu_seconds)

    def ratio(num: str, den: str, k: int) -> float:
        return statistics.median(a / b for a, b in zip(times[num][k], times[den][k], strict=True))

    return {
        "rounds": rounds,
        "layers": layers,
        "shape": shape,
        "shape_env": shape_env,
        "passes": passes,
        "cpu_seconds_median": {c: [statistics.median(v) for v in per_pass] for c, per_pass in times.items()},
        "ratio_to_stock_median": {c: [ratio(c, "stock", k) for k in range(passes)] for c in CONFIGS[1:]},
        "ratio_to_global_patch_median": {
            c: [ratio(c, "global-patch", k) for k in range(passes)] for c in CONFIGS if c.startswith("policy")
        },
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.allmiss", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--layers", type=int, default=96)
    parser.add_argument("--shape", choices=SHAPES, default="distinct")
    parser.add_argument("--shape-env", action="store_true", help="modes with a ShapeEnv, as an exported program's")
    parser.add_argument("--passes", type=int, default=1, help="passes per mode: the first, then replays (default 1)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.layers < 1 or args.passes < 1:
        parser.error("--rounds, --layers and --passes must be at least 1")
    result = run(args.rounds, args.layers, args.shape, args.shape_env, args.passes)
    to_stock: dict[str, list[float]] = result["ratio_to_stock_median"]  # type: ignore[assignment]
    to_patch: dict[str, list[float]] = result["ratio_to_global_patch_median"]  # type: ignore[assignment]
    seconds: dict[str, list[float]] = result["cpu_seconds_median"]  # type: ignore[assignment]
    print("| configuration | pass | CPU s (median) | / stock | / global patch |\n| --- | --- | --- | --- | --- |")
    for c in CONFIGS:
        for k in range(args.passes):
            stock = f"{to_stock[c][k]:.3f}" if c in to_stock else "1"
            patch = f"{to_patch[c][k]:.3f}" if c in to_patch else "-"
            print(f"| {c} | {k + 1} | {seconds[c][k]:.4f} | {stock} | {patch} |")
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
