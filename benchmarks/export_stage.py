"""The export and quantize stages of ExecuTorch's Ethos-U55 flow: stock vs ``torch_cachepolicy.export``.

Run ``python -m benchmarks.export_stage [--repeats N] [--json PATH]`` from the
repository root with ExecuTorch 1.5.1 installed (``pip install --no-deps -r
requirements-executorch.txt``). This module imports without ExecuTorch: every
ExecuTorch import happens inside the functions that need it.

One round runs the pt2e flow on :class:`benchmarks.executorch.TinyConvNet`
for ``ethos-u55-128`` (``EthosUQuantizer`` with
``get_symmetric_quantization_config()``) under each configuration:

* ``stock``: ``torch.export.export``;
* ``policy``: :func:`torch_cachepolicy.export` with the library's ExecuTorch
  recipe (:func:`torch_cachepolicy.recipes.executorch.executorch_policy`).

and times its three stages separately: ``export`` (the float model),
``quantize`` (``prepare_pt2e`` on ``export(...).module()``, one calibration
batch, ``convert_pt2e``) and ``re-export`` (the converted model, full of
``quantized_decomposed`` ops). Configurations alternate (stock, policy, stock,
...) after one discarded warm-up round; the cyclic GC is off while a stage
runs. Every round checks that both configurations give the same graph code.

Beside it, the cost of the alternative, :func:`torch_cachepolicy.adopt` on the
stock re-exported program, per value and as a share of stock's re-export stage
(``(re-export + adopt) / re-export``, the median of rounds), and for comparison
torch's converter (``FakeTensorMode.from_tensor``) copying the same fake values,
which is what adopt did before it moved them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch._subclasses import fake_tensor as _ft
from torch.export import ExportedProgram
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

import torch_cachepolicy as tcp
from benchmarks.executorch import ETHOS_U_TARGET, TinyConvNet, executorch_version, program_mode
from benchmarks.executorch.environment import check_runnable
from benchmarks.timing import timed
from torch_cachepolicy.recipes.executorch import executorch_policy

__all__ = ["CONFIGS", "STAGES", "adopt_cost", "fake_values", "main", "pt2e_flow", "render_markdown", "run"]

CONFIGS: tuple[str, ...] = ("stock", "policy")
"""The configurations, in the order each round runs them."""

STAGES: tuple[str, ...] = ("export", "quantize", "re-export")
"""The timed stages of one flow, in order."""

def _hits(mode: _ft.FakeTensorMode) -> tuple[int, int]:
    if isinstance(mode, tcp.FakeTensorMode):
        info = mode.cache_info()
        return info.hits, info.misses
    return 0, 0


def pt2e_flow(config: str, *, policy: tcp.CachePolicy | None = None, seed: int = 0) -> dict[str, Any]:
    """Runs export, quantize and re-export of TinyConvNet under ``config``.

    Args:
        config: one of :data:`CONFIGS`.
        policy: the policy of ``policy``; ``None`` means :func:`executorch_policy`.
        seed: seeds the weights and the calibration batch.

    Returns:
        ``{"wall", "cpu"}`` (seconds per stage of :data:`STAGES`),
        ``"program"`` (the re-exported program), ``"code"`` (its graph code),
        and for ``policy`` ``"cache"``: the hits and misses of the export's
        mode during each stage (``quantize`` dispatches to it only if a pass
        finds it on the program's values), and ``"re-export namespaces"``:
        the re-export's ``{namespace: (hits, misses, bypasses)}``.
    """
    from executorch.backends.arm.ethosu import EthosUCompileSpec
    from executorch.backends.arm.quantizer import EthosUQuantizer, get_symmetric_quantization_config
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    if config not in CONFIGS:
        raise ValueError(f"pt2e_flow(...): config must be one of {CONFIGS}, got {config!r}")
    policy = policy or executorch_policy()

    def export(module: torch.nn.Module, args: tuple[Any, ...]) -> ExportedProgram:
        if config == "stock":
            return torch.export.export(module, args)
        return tcp.export(module, args, cache_policy=policy)

    torch.manual_seed(seed)
    model = TinyConvNet().eval()
    example = (torch.randn(1, 3, 8, 8),)
    quantizer = EthosUQuantizer(EthosUCompileSpec(ETHOS_U_TARGET))
    quantizer.set_global(get_symmetric_quantization_config())
    wall: dict[str, float] = {}
    cpu: dict[str, float] = {}
    cache: dict[str, tuple[int, int]] = {}
    with timed() as t:
        ep = export(model, example)
    wall["export"], cpu["export"] = t.seconds, t.cpu_seconds
    mode = program_mode(ep)
    cache["export"] = _hits(mode)
    with timed() as t:
        prepared = prepare_pt2e(ep.module(), quantizer)
        prepared(*example)  # calibration
        converted = convert_pt2e(prepared)
    wall["quantize"], cpu["quantize"] = t.seconds, t.cpu_seconds
    after = _hits(mode)
    cache["quantize"] = (after[0] - cache["export"][0], after[1] - cache["export"][1])
    with timed() as t:
        program = export(converted, example)
    wall["re-export"], cpu["re-export"] = t.seconds, t.cpu_seconds
    new_mode = program_mode(program)
    cache["re-export"] = _hits(new_mode)
    result: dict[str, Any] = {"wall": wall, "cpu": cpu, "program": program, "code": program.graph_module.code}
    if config == "policy":
        assert isinstance(new_mode, tcp.FakeTensorMode)
        result["cache"] = cache
        result["re-export namespaces"] = new_mode.cache_report().by_namespace()
    return result


def _is_fake(leaf: object) -> bool:
    """A FakeTensor, or a tensor subclass wrapping FakeTensors."""
    if isinstance(leaf, _ft.FakeTensor):
        return True
    return is_traceable_wrapper_subclass(leaf) and _ft.maybe_get_fake_mode(leaf) is not None


def fake_values(program: ExportedProgram) -> list[torch.Tensor]:
    """The fake values ``adopt`` moves, one per occurrence: the fake pytree leaves of every meta entry
    of the program's graph modules (HOP subgraphs included) and of their nodes.
    """
    fakes: list[torch.Tensor] = []
    for module in program.graph_module.modules():
        if not isinstance(module, torch.fx.GraphModule):
            continue
        metas = [module.meta, *(node.meta for node in module.graph.nodes)]
        for meta in metas:
            for value in meta.values():
                fakes.extend(leaf for leaf in pytree.tree_leaves(value) if _is_fake(leaf))
    return fakes


def adopt_cost(program: ExportedProgram, policy: tcp.CachePolicy) -> dict[str, float]:
    """Times ``adopt`` on ``program``, and torch's converter on the same fake values.

    The program is adopted (changed); the converter runs on its values
    beforehand, into a throw-away stock mode sharing the ShapeEnv.

    Returns:
        ``{"values", "adopt_wall", "adopt_cpu", "floor_wall", "floor_cpu"}``
        (seconds; ``values``: fake values converted).
    """
    fakes = fake_values(program)
    old = program_mode(program)
    scratch = _ft.FakeTensorMode(shape_env=old.shape_env, allow_non_fake_inputs=True, export=True)
    with _ft.unset_fake_temporarily(), timed() as floor:
        copies = [scratch.from_tensor(fake) for fake in fakes]
    del copies
    with timed() as adopted:
        tcp.adopt(program, cache_policy=policy)
    return {
        "values": len(fakes),
        "floor_wall": floor.seconds,
        "floor_cpu": floor.cpu_seconds,
        "adopt_wall": adopted.seconds,
        "adopt_cpu": adopted.cpu_seconds,
    }


def _ratio(num: Sequence[float], den: Sequence[float]) -> float:
    return statistics.median(n / d for n, d in zip(num, den, strict=True))


def run(repeats: int, *, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Times the stages under both configurations, interleaved, and adopt's cost.

    Args:
        repeats: measured rounds, after one discarded warm-up round.
        progress: called with a line per flow (e.g. ``print``).

    Returns:
        ``{"schema", "settings", "stages", "ratios", "identical", "cache",
        "re-export namespaces", "adopt"}``: ``stages[config][stage]`` has per-round ``wall`` and
        ``cpu`` seconds and their medians; ``ratios[stage]`` is the median
        over rounds of policy/stock (``wall``, ``cpu``); ``identical`` says
        whether every re-exported program had stock's graph code; ``cache``
        is the last policy round's hits and misses per stage and
        ``re-export namespaces`` its re-export's counts per namespace; ``adopt`` has
        per-round seconds and medians per value of ``adopt`` and of the
        converter floor on the stock re-exported program.

    Raises:
        ImportError: ExecuTorch is not installed.
        ValueError: ``repeats`` is not positive.
    """
    check_runnable()
    if repeats < 1:
        raise ValueError(f"run(repeats=...): expected a positive number, got {repeats}")
    policy = executorch_policy()
    series: dict[str, dict[str, dict[str, list[float]]]] = {
        c: {s: {"wall": [], "cpu": []} for s in STAGES} for c in CONFIGS
    }
    adopt_rounds: dict[str, list[float]] = {}
    identical = True
    cache: dict[str, tuple[int, int]] = {}
    namespaces: dict[str, tuple[int, int, int]] = {}
    for round_ in range(-1, repeats):
        codes = {}
        for config in CONFIGS:
            flow = pt2e_flow(config, policy=policy)
            codes[config] = flow["code"]
            cache = flow.get("cache", cache)
            namespaces = flow.get("re-export namespaces", namespaces)
            if round_ >= 0:
                for stage in STAGES:
                    series[config][stage]["wall"].append(flow["wall"][stage])
                    series[config][stage]["cpu"].append(flow["cpu"][stage])
            if config == "stock":
                cost = adopt_cost(flow["program"], policy)
                if round_ >= 0:
                    for key, value in cost.items():
                        adopt_rounds.setdefault(key, []).append(value)
            if progress is not None:
                tag = "warm-up" if round_ < 0 else f"round {round_ + 1}/{repeats}"
                line = ", ".join(f"{s} {flow['wall'][s]:.3f}" for s in STAGES)
                progress(f"{tag} {config}: {line} s wall")
        identical &= codes["stock"] == codes["policy"]
    stages = {
        config: {
            stage: {
                **times,
                "median_wall": statistics.median(times["wall"]),
                "median_cpu": statistics.median(times["cpu"]),
            }
            for stage, times in per_stage.items()
        }
        for config, per_stage in series.items()
    }
    ratios = {
        stage: {kind: _ratio(series["policy"][stage][kind], series["stock"][stage][kind]) for kind in ("wall", "cpu")}
        for stage in STAGES
    }
    values = adopt_rounds["values"]
    adopt = {
        **adopt_rounds,
        "median_values": statistics.median(values),
        **{
            f"median_{key}_ms_per_value": statistics.median(
                s / n * 1e3 for s, n in zip(adopt_rounds[key], values, strict=True)
            )
            for key in ("adopt_wall", "adopt_cpu", "floor_wall", "floor_cpu")
        },
        "adopt_over_floor_cpu": _ratio(adopt_rounds["adopt_cpu"], adopt_rounds["floor_cpu"]),
        "reexport_with_adopt_over_reexport_cpu": _ratio(
            [r + a for r, a in zip(series["stock"]["re-export"]["cpu"], adopt_rounds["adopt_cpu"], strict=True)],
            series["stock"]["re-export"]["cpu"],
        ),
    }
    return {
        "schema": "benchmarks.export_stage/1",
        "settings": {
            "repeats": repeats,
            "warmup_rounds": 1,
            "order": list(CONFIGS),
            "torch": torch.__version__,
            "executorch": executorch_version(),
            "target": ETHOS_U_TARGET,
        },
        "stages": stages,
        "ratios": ratios,
        "identical": identical,
        "cache": {stage: list(counts) for stage, counts in cache.items()},
        "re-export namespaces": {ns: list(counts) for ns, counts in namespaces.items()},
        "adopt": adopt,
    }


def render_markdown(results: dict[str, Any]) -> str:
    """The result of :func:`run` as Markdown tables."""
    s = results["settings"]
    lines = [
        f"pt2e flow of TinyConvNet for {s['target']} (torch {s['torch']}, ExecuTorch {s['executorch']}), "
        f"{s['repeats']} interleaved rounds after 1 warm-up",
        "",
        "| stage | stock wall s | policy wall s | stock CPU s | policy CPU s | policy/stock wall | policy/stock CPU "
        "| policy hits / misses |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for stage in STAGES:
        stock, policy = results["stages"]["stock"][stage], results["stages"]["policy"][stage]
        ratio = results["ratios"][stage]
        hits, misses = results["cache"].get(stage, (0, 0))
        lines.append(
            f"| {stage} | {stock['median_wall']:.3f} | {policy['median_wall']:.3f} | {stock['median_cpu']:.3f} | "
            f"{policy['median_cpu']:.3f} | {ratio['wall']:.3f} | {ratio['cpu']:.3f} | {hits} / {misses} |"
        )
    lines += ["", "| namespace (policy re-export) | hits | misses | bypasses |", "| --- | --- | --- | --- |"]
    lines += [f"| {ns} | {h} | {m} | {b} |" for ns, (h, m, b) in results["re-export namespaces"].items()]
    a = results["adopt"]
    lines += [
        "",
        f"re-exported program has stock's graph code in every round: {'yes' if results['identical'] else 'NO'}",
        "",
        f"adopt() on the stock re-exported program ({a['median_values']:.0f} fake values), per value:",
        "",
        "| | wall ms/value | CPU ms/value |",
        "| --- | --- | --- |",
        f"| adopt | {a['median_adopt_wall_ms_per_value']:.3f} | {a['median_adopt_cpu_ms_per_value']:.3f} |",
        f"| torch's converter, a copy of each value | {a['median_floor_wall_ms_per_value']:.3f} | "
        f"{a['median_floor_cpu_ms_per_value']:.3f} |",
        "",
        "stock re-export + adopt / stock re-export (CPU, median of rounds): "
        f"{a['reexport_with_adopt_over_reexport_cpu']:.3f}",
        "",
        f"adopt / converter (CPU, median of rounds): {a['adopt_over_floor_cpu']:.3f}; "
        f"adopt per call: {statistics.median(a['adopt_wall']) * 1e3:.1f} ms wall",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: runs :func:`run`, prints Markdown; 1 if a program differed."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.export_stage",
        description="Times the export and quantize stages of the Ethos-U55 pt2e flow: stock vs torch_cachepolicy.export.",
    )
    parser.add_argument("--repeats", type=int, default=5, help="measured rounds (default 5)")
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    args = parser.parse_args(argv)
    results = run(args.repeats, progress=lambda line: print(line, file=sys.stderr, flush=True))
    print(render_markdown(results))
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0 if results["identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
