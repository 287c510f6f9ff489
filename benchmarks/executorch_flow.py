"""A real client: ExecuTorch's Ethos-U55 lowering, stock vs PR 21700's patch vs a policy mode.

Run ``python -m benchmarks.executorch_flow [--repeats N] [--json PATH]`` from
the repository root with ExecuTorch 1.5.1 installed (``pip install --no-deps -r
requirements-executorch.txt``). This module imports without ExecuTorch: every
ExecuTorch import happens inside the functions that need it.

A tiny convolutional network is quantized for ``ethos-u55-128`` with
``EthosUQuantizer`` and torchao's pt2e flow (once), exported afresh for every
lowering, and lowered with ``to_edge_transform_and_lower(ep,
partitioner=[EthosUPartitioner(spec)])`` under each configuration:

* ``stock``: torch as shipped;
* ``global-patch``: ExecuTorch PR 21700's process-global ``is_builtin`` swap
  (:mod:`benchmarks.global_patch`) around the lowering;
* ``policy``: :func:`torch_cachepolicy.adopt.adopt` moves the exported
  program onto a policy mode before the lowering, with the library's
  ExecuTorch recipe (:func:`torch_cachepolicy.recipes.executorch.executorch_policy`:
  the namespaces of PR 21700, context key = the active TOSA spec);
* ``policy-isolated``: the same with ``CacheStore(isolated=True)``: aten
  entries are not shared with torch's class-global cache either, which is
  what isolation costs.

Configurations run interleaved (stock, global-patch, policy, policy-isolated,
stock, ...) after one discarded warm-up round. Only the
``to_edge_transform_and_lower`` call is timed; ``adopt`` and the patch's
enter/exit are timed separately (``setup_ms``). Every lowering must produce the
same delegate payload (Vela's command stream) and the same graph code.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.metadata
import io
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch._subclasses import fake_tensor as _ft
from torch.export import ExportedProgram

import torch_cachepolicy as tcp
from torch_cachepolicy.recipes.executorch import EXECUTORCH_NAMESPACES, executorch_policy

__all__ = [
    "CONFIGS",
    "ETHOS_U_TARGET",
    "EXECUTORCH_VERSION",
    "Lowering",
    "TinyConvNet",
    "executorch_version",
    "lower",
    "main",
    "program_mode",
    "quantized_program_factory",
    "render_markdown",
    "run",
]

ETHOS_U_TARGET = "ethos-u55-128"
"""The compile target: an Ethos-U55 with 128 MACs per cycle."""

CONFIGS: tuple[str, ...] = ("stock", "global-patch", "policy", "policy-isolated")
"""The configurations, in the order each round runs them."""

EXECUTORCH_VERSION = "1.5.1"
"""The ExecuTorch release this flow was written against."""

_INSTALL_HINT = "pip install --no-deps -r requirements-executorch.txt (or: make test-executorch)"

# (name, numerator, denominator): ratios of lowering time; < 1 means the
# numerator configuration is faster.
RATIOS: tuple[tuple[str, str, str], ...] = (
    ("global-patch/stock", "global-patch", "stock"),
    ("policy/stock", "policy", "stock"),
    ("policy/global-patch", "policy", "global-patch"),
    ("policy-isolated/policy", "policy-isolated", "policy"),
)


def executorch_version() -> str | None:
    """The installed ExecuTorch version, or ``None`` when it is not installed."""
    try:
        return importlib.metadata.version("executorch")
    except importlib.metadata.PackageNotFoundError:
        return None


class TinyConvNet(torch.nn.Module):
    """Two 3x3 convolutions with a residual add and a linear head; 8x8 RGB input."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.fc = torch.nn.Linear(8 * 8 * 8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.conv1(x))
        y = torch.relu(self.conv2(y)) + y
        return self.fc(y.flatten(1))


def _compile_spec() -> Any:
    from executorch.backends.arm.ethosu import EthosUCompileSpec

    return EthosUCompileSpec(ETHOS_U_TARGET)


def quantized_program_factory(seed: int = 0) -> Callable[[], ExportedProgram]:
    """Quantizes :class:`TinyConvNet` for Ethos-U55 once; returns a function exporting it.

    ``to_edge_transform_and_lower`` consumes its program, so every lowering
    needs a freshly exported one; quantization (prepare, calibrate on one
    seeded batch, convert) is deterministic and done once.

    Args:
        seed: seeds the weights and the calibration batch.

    Returns:
        A function returning a new ``ExportedProgram`` of the quantized model
        on each call.
    """
    from executorch.backends.arm.quantizer import EthosUQuantizer, get_symmetric_quantization_config
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    torch.manual_seed(seed)
    model = TinyConvNet().eval()
    example = (torch.randn(1, 3, 8, 8),)
    quantizer = EthosUQuantizer(_compile_spec())
    quantizer.set_global(get_symmetric_quantization_config())
    prepared = prepare_pt2e(torch.export.export(model, example).module(), quantizer)
    prepared(*example)  # calibration
    converted = convert_pt2e(prepared)

    def export() -> ExportedProgram:
        return torch.export.export(converted, example)

    return export


def program_mode(ep: ExportedProgram) -> _ft.FakeTensorMode:
    """The fake mode of the program's placeholders, the one ExportPass reuses."""
    for node in ep.graph.nodes:
        val = node.meta.get("val")
        if isinstance(val, _ft.FakeTensor):
            return val.fake_mode
    raise ValueError("the exported program holds no FakeTensor in its placeholders' meta['val']")


@dataclass
class Lowering:
    """One ``to_edge_transform_and_lower`` call and what it produced.

    Attributes:
        config: one of :data:`CONFIGS`.
        seconds: wall time of the lowering call.
        cpu_seconds: process CPU time of the lowering call.
        setup_seconds: wall time of ``adopt`` or of the patch's enter and
            exit; 0 for stock.
        payloads: ``processed_bytes`` of every delegate, by submodule name.
        graph_code: the lowered top-level graph's Python code.
        hits: cache hits during the lowering (the mode's own counters for
            the policy configurations, torch's class counters otherwise).
        misses: cache misses, counted likewise.
        mode: the policy mode (policy configurations only).
        edge: the ``EdgeProgramManager`` returned by the lowering.
    """

    config: str
    seconds: float
    cpu_seconds: float
    setup_seconds: float
    payloads: dict[str, bytes]
    graph_code: str
    hits: int
    misses: int
    mode: tcp.FakeTensorMode | None = None
    edge: Any = field(default=None, repr=False)


def _payloads(graph_module: torch.fx.GraphModule) -> dict[str, bytes]:
    from executorch.exir.lowered_backend_module import LoweredBackendModule

    return {
        name: bytes(module.processed_bytes)
        for name, module in graph_module.named_modules()
        if isinstance(module, LoweredBackendModule)
    }


@contextlib.contextmanager
def _timed_gc_off() -> Iterator[list[float]]:
    """Yields a list that receives wall and CPU seconds; the cyclic GC stays
    off meanwhile so a collection triggered by earlier garbage does not land
    in one configuration's figure."""
    out: list[float] = []
    gc.collect()
    gc.disable()
    start, cpu_start = time.perf_counter(), time.process_time()
    try:
        yield out
    finally:
        out += [time.perf_counter() - start, time.process_time() - cpu_start]
        gc.enable()


def lower(ep: ExportedProgram, config: str, *, policy: tcp.CachePolicy | None = None, quiet: bool = True) -> Lowering:
    """Lowers ``ep`` for Ethos-U55 under ``config``.

    Args:
        ep: a freshly exported program (the lowering consumes it).
        config: one of :data:`CONFIGS`.
        policy: the policy of the policy configurations; ``None`` means
            :func:`executorch_policy`. Reuse one across calls: its identity
            names the cache partition.
        quiet: swallow what Vela prints to stdout.

    Returns:
        The timings and outputs of the lowering.
    """
    from executorch.backends.arm.ethosu import EthosUPartitioner
    from executorch.exir import to_edge_transform_and_lower

    from benchmarks.global_patch import global_patch
    from torch_cachepolicy.adopt import adopt

    if config not in CONFIGS:
        raise ValueError(f"lower(...): config must be one of {CONFIGS}, got {config!r}")
    partitioner = EthosUPartitioner(_compile_spec())
    mode: tcp.FakeTensorMode | None = None
    setup = 0.0
    scope: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
    if config.startswith("policy"):
        store = tcp.CacheStore(isolated=True) if config == "policy-isolated" else None
        start = time.perf_counter()
        mode = adopt(ep, cache_policy=policy or executorch_policy(), cache_store=store)
        setup = time.perf_counter() - start
    elif config == "global-patch":
        scope = global_patch(EXECUTORCH_NAMESPACES, shape_envs=[program_mode(ep).shape_env])
    hits0, misses0 = _ft.FakeTensorMode.cache_hits, _ft.FakeTensorMode.cache_misses
    out = io.StringIO()
    with contextlib.redirect_stdout(out) if quiet else contextlib.nullcontext():
        start = time.perf_counter()
        with scope:
            setup += time.perf_counter() - start
            with _timed_gc_off() as timing:
                edge = to_edge_transform_and_lower(ep, partitioner=[partitioner])
            exit_start = time.perf_counter()
        setup += time.perf_counter() - exit_start
    if mode is not None:
        info = mode.cache_info()
        hits, misses = info.hits, info.misses
    else:
        hits, misses = _ft.FakeTensorMode.cache_hits - hits0, _ft.FakeTensorMode.cache_misses - misses0
    gm = edge.exported_program().graph_module
    return Lowering(config, timing[0], timing[1], setup, _payloads(gm), gm.code, hits, misses, mode, edge)


def _median_ratio(num: Sequence[float], den: Sequence[float]) -> dict[str, Any]:
    per_round = [n / d for n, d in zip(num, den, strict=True)]
    return {
        "per_round": per_round,
        "median": statistics.median(per_round),
        "of_medians": statistics.median(num) / statistics.median(den),
    }


def _environment() -> dict[str, Any]:
    def version(dist: str) -> str | None:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return None

    return {
        "torch": torch.__version__,
        "torch_cachepolicy": tcp.__version__,
        "executorch": version("executorch"),
        "torchao": version("torchao"),
        "ethos-u-vela": version("ethos-u-vela"),
        "tosa-tools": version("tosa-tools"),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


def run(repeats: int, *, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Times the Ethos-U55 lowering under every configuration, interleaved.

    Args:
        repeats: measured rounds; each runs every configuration of
            :data:`CONFIGS` once, in that order, after one discarded warm-up
            round.
        progress: called with a line per lowering (e.g. ``print``).

    Returns:
        ``{"schema", "environment", "settings", "configs", "ratios",
        "identical", "policy_cache"}``: ``configs[name]`` has per-round
        ``seconds`` / ``cpu_seconds`` / ``setup_ms``, their medians, and
        per-round ``hits`` / ``misses``; ``ratios[name]`` (see
        :data:`RATIOS`) has ``wall`` and ``cpu``, each with ``per_round``,
        ``median`` and ``of_medians``; ``identical`` says whether every
        lowering produced the same delegate payloads and graph code;
        ``policy_cache`` is the last policy lowering's hits, misses and
        bypasses per namespace.

    Raises:
        ImportError: ExecuTorch is not installed.
        ValueError: ``repeats`` is not positive.
    """
    if executorch_version() is None:
        raise ImportError(f"ExecuTorch is not installed: {_INSTALL_HINT}")
    if repeats < 1:
        raise ValueError(f"run(repeats=...): expected a positive number, got {repeats}")
    fresh_program = quantized_program_factory()
    policy = executorch_policy()
    series: dict[str, list[Lowering]] = {c: [] for c in CONFIGS}
    reference: Lowering | None = None
    identical = {"delegate_payloads": True, "graph_code": True}
    policy_cache: dict[str, list[int]] = {}
    for round_ in range(-1, repeats):
        for config in CONFIGS:
            result = lower(fresh_program(), config, policy=policy)
            if reference is None:
                reference = result
            identical["delegate_payloads"] &= result.payloads == reference.payloads
            identical["graph_code"] &= result.graph_code == reference.graph_code
            if config == "policy" and result.mode is not None:
                report = result.mode.cache_report().by_namespace()
                policy_cache = {ns: list(counts) for ns, counts in report.items()}
            if progress is not None:
                tag = "warm-up" if round_ < 0 else f"round {round_ + 1}/{repeats}"
                progress(f"{tag} {config}: {result.seconds:.3f} s wall, {result.cpu_seconds:.3f} s cpu")
            if round_ >= 0:
                # Only the figures are kept: programs and modes would pile up.
                result.edge = result.mode = None
                series[config].append(result)
    configs: dict[str, Any] = {}
    for config, runs in series.items():
        configs[config] = {
            "seconds": [r.seconds for r in runs],
            "cpu_seconds": [r.cpu_seconds for r in runs],
            "setup_ms": [r.setup_seconds * 1e3 for r in runs],
            "median_seconds": statistics.median(r.seconds for r in runs),
            "median_cpu_seconds": statistics.median(r.cpu_seconds for r in runs),
            "median_setup_ms": statistics.median(r.setup_seconds * 1e3 for r in runs),
            "hits": [r.hits for r in runs],
            "misses": [r.misses for r in runs],
        }
    ratios = {
        name: {
            "wall": _median_ratio(configs[num]["seconds"], configs[den]["seconds"]),
            "cpu": _median_ratio(configs[num]["cpu_seconds"], configs[den]["cpu_seconds"]),
        }
        for name, num, den in RATIOS
    }
    return {
        "schema": "benchmarks.executorch_flow/1",
        "environment": _environment(),
        "settings": {
            "repeats": repeats,
            "warmup_rounds": 1,
            "order": list(CONFIGS),
            "target": ETHOS_U_TARGET,
            "namespaces": list(EXECUTORCH_NAMESPACES),
            "model": "TinyConvNet (conv3x3 3->8, conv3x3 8->8, residual add, linear 512->10), input 1x3x8x8",
        },
        "configs": configs,
        "ratios": ratios,
        "identical": identical,
        "policy_cache": policy_cache,
    }


def render_markdown(results: dict[str, Any]) -> str:
    """The result of :func:`run` as Markdown tables."""
    configs = results["configs"]
    lines = [
        f"ExecuTorch {results['environment']['executorch']} Ethos-U55 lowering "
        f"(`to_edge_transform_and_lower`), {results['settings']['repeats']} interleaved rounds "
        f"after 1 warm-up, {results['environment']['cpu_count']} CPUs",
        "",
        "| config | median wall s | median CPU s | setup ms | hits | misses |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name in CONFIGS:
        c = configs[name]
        lines.append(
            f"| {name} | {c['median_seconds']:.3f} | {c['median_cpu_seconds']:.3f} | "
            f"{c['median_setup_ms']:.1f} | {statistics.median(c['hits']):.0f} | {statistics.median(c['misses']):.0f} |"
        )
    lines += [
        "",
        "| ratio | wall (median of rounds) | CPU (median of rounds) | wall (of medians) |",
        "| --- | --- | --- | --- |",
    ]
    for name, _, _ in RATIOS:
        r = results["ratios"][name]
        lines.append(
            f"| {name} | {r['wall']['median']:.3f} | {r['cpu']['median']:.3f} | {r['wall']['of_medians']:.3f} |"
        )
    same = results["identical"]
    lines += [
        "",
        "delegate payloads identical: "
        + ("yes" if same["delegate_payloads"] else "NO")
        + "; graph code identical: "
        + ("yes" if same["graph_code"] else "NO"),
    ]
    if results["policy_cache"]:
        lines += ["", "| namespace (policy) | hits | misses | bypasses |", "| --- | --- | --- | --- |"]
        lines += [f"| {ns} | {h} | {m} | {b} |" for ns, (h, m, b) in results["policy_cache"].items()]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: runs :func:`run`, prints Markdown; 1 if outputs differed."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.executorch_flow",
        description="Times ExecuTorch's Ethos-U55 lowering: stock vs global patch vs policy mode.",
    )
    parser.add_argument("--repeats", type=int, default=5, help="measured rounds (default 5)")
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    args = parser.parse_args(argv)
    results = run(args.repeats, progress=lambda line: print(line, file=sys.stderr, flush=True))
    print(render_markdown(results))
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0 if all(results["identical"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
