"""A real client: ExecuTorch lowering flows, stock vs PR 21700's patch vs a policy mode.

Run ``python -m benchmarks.executorch_flow [--flow F] [--model M] [--repeats N]
[--json PATH] [--census]`` from the repository root with ExecuTorch 1.5.1
installed (``pip install --no-deps -r requirements-executorch.txt``). This
module imports without ExecuTorch: every ExecuTorch import happens inside the
functions that need it.

Three flows (:data:`FLOWS`), each a :class:`Flow`: a quantizer, and a lowering
from a quantized ``ExportedProgram`` to the final one.

* ``ethos-u55``: ``EthosUQuantizer`` for ``ethos-u55-128``, then
  ``to_edge_transform_and_lower(ep, partitioner=[EthosUPartitioner(spec)])``
  (TOSA dialect passes, Vela; one delegate);
* ``cortex-m``: ``CortexMQuantizer`` (CMSIS-NN), then ``to_edge(ep,
  compile_config=cortex_m_edge_compile_config())`` and
  ``CortexMPassManager(edge.exported_program()).transform()``, as
  ExecuTorch's Cortex-M tester drives it (no delegate: ops are rewritten to
  ``cortex_m`` ops in place);
* ``xnnpack``: ``XNNPACKQuantizer`` with its symmetric config, then
  ``to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()])``
  (one delegate, XNNPACK's flatbuffer).

A model (:data:`MODELS`: ``tiny``, a two-convolution net, or ``large``, a
MobileNet-style stack of depthwise-separable blocks; seeded random weights) is
quantized once per flow (prepare, calibrate on one seeded batch, convert),
exported afresh for every lowering (a lowering consumes its program), and
lowered under each configuration:

* ``stock``: torch as shipped;
* ``global-patch``: ExecuTorch PR 21700's process-global ``is_builtin`` swap
  (:mod:`benchmarks.global_patch`) around the lowering;
* ``policy``: :func:`torch_cachepolicy.adopt.adopt` moves the exported
  program onto a policy mode before the lowering, with the library's
  ExecuTorch recipe (:func:`torch_cachepolicy.recipes.executorch.executorch_policy`);
* ``policy-isolated``: the same with ``CacheStore(isolated=True)`` (aten
  entries not shared with torch's class-global cache either).

Configurations run interleaved (stock, global-patch, policy, policy-isolated,
stock, ...) after one discarded warm-up round. Only the lowering call is
timed; ``adopt`` and the patch's enter/exit are timed separately
(``setup_ms``). Every lowering of a flow must produce the same delegate
payloads, the same graph code and the same constants (a digest of the final
program's state dict and constants).

``--census`` additionally runs each flow's whole pipeline (quantize, export,
lower) once per configuration under :mod:`benchmarks.dispatch_recorder` and
reports which fake dispatches went to modes the policy does not reach, and the
share of the stock lowering spent in fake dispatch of backend ops.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
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
from benchmarks.timing import timed
from torch_cachepolicy.recipes.executorch import EXECUTORCH_NAMESPACES, executorch_policy

__all__ = [
    "CONFIGS",
    "ETHOS_U_TARGET",
    "EXECUTORCH_VERSION",
    "FLOWS",
    "MODELS",
    "Flow",
    "Lowering",
    "MobileNetStyle",
    "TinyConvNet",
    "build_model",
    "census",
    "executorch_version",
    "get_flow",
    "lower",
    "main",
    "program_mode",
    "quantized_program_factory",
    "render_markdown",
    "run",
]

ETHOS_U_TARGET = "ethos-u55-128"
"""The Ethos-U compile target: an Ethos-U55 with 128 MACs per cycle."""

CONFIGS: tuple[str, ...] = ("stock", "global-patch", "policy", "policy-isolated")
"""The configurations, in the order each round runs them."""

EXECUTORCH_VERSION = "1.5.1"
"""The ExecuTorch release these flows were written against."""

MODELS: tuple[str, ...] = ("tiny", "large")
"""The models :func:`build_model` builds."""

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


# ----------------------------------------------------------------- models


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


class MobileNetStyle(torch.nn.Module):
    """A MobileNet-style stack: a strided 3x3 stem, depthwise-separable blocks
    (3x3 depthwise + 1x1 pointwise, each followed by ReLU; a residual add
    where shape allows), global average pooling and a linear head.

    Args:
        widths: output channels of the blocks, in order.
        strides: stride of each block's depthwise convolution.
        classes: outputs of the head.
    """

    def __init__(self, widths: Sequence[int], strides: Sequence[int], classes: int = 10) -> None:
        super().__init__()
        if len(widths) != len(strides):
            raise ValueError("MobileNetStyle: widths and strides must have the same length")
        self.stem = torch.nn.Conv2d(3, widths[0], 3, stride=2, padding=1)
        blocks: list[torch.nn.Module] = []
        channels = widths[0]
        for width, stride in zip(widths, strides, strict=True):
            blocks.append(_SeparableBlock(channels, width, stride))
            channels = width
        self.blocks = torch.nn.ModuleList(blocks)
        self.pool = torch.nn.AdaptiveAvgPool2d(1)
        self.fc = torch.nn.Linear(channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.stem(x))
        for block in self.blocks:
            y = block(y)
        return self.fc(self.pool(y).flatten(1))


class _SeparableBlock(torch.nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.depthwise = torch.nn.Conv2d(cin, cin, 3, stride=stride, padding=1, groups=cin)
        self.pointwise = torch.nn.Conv2d(cin, cout, 1)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.pointwise(torch.relu(self.depthwise(x))))
        return y + x if self.residual else y


# The large model: 14 separable blocks (29 convolutions, 10 residual adds),
# 1x3x64x64 input. Sized so that fake dispatch of backend ops is a large part
# of the stock Ethos-U55 lowering (docs/executorch.md has the measured share).
_LARGE_WIDTHS = (16, 24, 24, 32, 32, 32, 64, 64, 64, 64, 96, 96, 96, 128)
_LARGE_STRIDES = (1, 2, 1, 2, 1, 1, 2, 1, 1, 1, 1, 1, 1, 2)


def build_model(name: str, seed: int = 0) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...], str]:
    """A model of :data:`MODELS`, with seeded weights, its example input and a description.

    Raises:
        ValueError: unknown ``name``.
    """
    torch.manual_seed(seed)
    if name == "tiny":
        return (
            TinyConvNet().eval(),
            (torch.randn(1, 3, 8, 8),),
            "TinyConvNet (conv3x3 3->8, conv3x3 8->8, residual add, linear 512->10), input 1x3x8x8",
        )
    if name == "large":
        model = MobileNetStyle(_LARGE_WIDTHS, _LARGE_STRIDES).eval()
        return (
            model,
            (torch.randn(1, 3, 64, 64),),
            f"MobileNetStyle (stem conv3x3/2 + {len(_LARGE_WIDTHS)} depthwise-separable blocks, widths "
            f"{'/'.join(map(str, _LARGE_WIDTHS))}, avgpool, linear), input 1x3x64x64",
        )
    raise ValueError(f"build_model(...): model must be one of {MODELS}, got {name!r}")


# ------------------------------------------------------------------ flows


@dataclass(frozen=True)
class Flow:
    """One ExecuTorch backend flow.

    Attributes:
        name: the ``--flow`` name.
        title: a human-readable name.
        backend_namespaces: the backend namespaces whose ops the flow
            dispatches (the tests require hits on each under the policy).
        has_delegates: whether the lowered program calls delegates.
        channels_last: the example input must be channels-last (the Cortex-M
            quantizer only quantizes convolutions on channels-last inputs).
        make_quantizer: builds the flow's pt2e quantizer.
        lower_program: lowers a quantized exported program; returns the final
            ``ExportedProgram``.
    """

    name: str
    title: str
    backend_namespaces: tuple[str, ...]
    has_delegates: bool
    channels_last: bool
    make_quantizer: Callable[[], Any] = field(repr=False)
    lower_program: Callable[[ExportedProgram], ExportedProgram] = field(repr=False)


def _ethos_u_spec() -> Any:
    from executorch.backends.arm.ethosu import EthosUCompileSpec

    return EthosUCompileSpec(ETHOS_U_TARGET)


def _compile_spec() -> Any:
    # Kept for callers of the single-flow version of this module.
    return _ethos_u_spec()


def _ethos_u_quantizer() -> Any:
    from executorch.backends.arm.quantizer import EthosUQuantizer, get_symmetric_quantization_config

    quantizer = EthosUQuantizer(_ethos_u_spec())
    quantizer.set_global(get_symmetric_quantization_config())
    return quantizer


def _ethos_u_lower(ep: ExportedProgram) -> ExportedProgram:
    from executorch.backends.arm.ethosu import EthosUPartitioner
    from executorch.exir import to_edge_transform_and_lower

    return to_edge_transform_and_lower(ep, partitioner=[EthosUPartitioner(_ethos_u_spec())]).exported_program()


def _cortex_m_quantizer() -> Any:
    from executorch.backends.cortex_m.quantizer.quantizer import CortexMQuantizer

    return CortexMQuantizer()


def _cortex_m_lower(ep: ExportedProgram) -> ExportedProgram:
    from executorch.backends.cortex_m.edge_compile_config import cortex_m_edge_compile_config
    from executorch.backends.cortex_m.passes.cortex_m_pass_manager import CortexMPassManager
    from executorch.exir import to_edge

    edge = to_edge(ep, compile_config=cortex_m_edge_compile_config())
    return CortexMPassManager(edge.exported_program()).transform()  # type: ignore[no-any-return]


def _xnnpack_quantizer() -> Any:
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )

    quantizer = XNNPACKQuantizer()
    quantizer.set_global(get_symmetric_quantization_config())
    return quantizer


def _xnnpack_lower(ep: ExportedProgram) -> ExportedProgram:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    return to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).exported_program()


FLOWS: dict[str, Flow] = {
    flow.name: flow
    for flow in (
        Flow(
            "ethos-u55",
            f"Arm Ethos-U55 ({ETHOS_U_TARGET}, TOSA + Vela)",
            ("quantized_decomposed", "tosa"),
            has_delegates=True,
            channels_last=False,
            make_quantizer=_ethos_u_quantizer,
            lower_program=_ethos_u_lower,
        ),
        Flow(
            "cortex-m",
            "Arm Cortex-M (CMSIS-NN, CortexMPassManager)",
            ("quantized_decomposed", "cortex_m"),
            has_delegates=False,
            channels_last=True,
            make_quantizer=_cortex_m_quantizer,
            lower_program=_cortex_m_lower,
        ),
        Flow(
            "xnnpack",
            "XNNPACK (XnnpackPartitioner)",
            ("quantized_decomposed",),
            has_delegates=True,
            channels_last=False,
            make_quantizer=_xnnpack_quantizer,
            lower_program=_xnnpack_lower,
        ),
    )
}
"""The flows, by ``--flow`` name."""


def get_flow(name: str | Flow) -> Flow:
    """The :class:`Flow` named ``name`` (a ``Flow`` is returned as is).

    Raises:
        ValueError: unknown name.
    """
    if isinstance(name, Flow):
        return name
    try:
        return FLOWS[name]
    except KeyError:
        raise ValueError(f"unknown flow {name!r}; expected one of {sorted(FLOWS)}") from None


def quantized_program_factory(
    seed: int = 0,
    *,
    flow: str | Flow = "ethos-u55",
    model: str = "tiny",
    policy: tcp.CachePolicy | None = None,
) -> Callable[[], ExportedProgram]:
    """Quantizes a model for ``flow`` once; returns a function exporting it.

    Every lowering needs a freshly exported program (the lowering consumes
    it); quantization (prepare, calibrate on one seeded batch, convert) is
    deterministic and done once.

    Args:
        seed: seeds the weights and the calibration batch.
        flow: a name of :data:`FLOWS`.
        model: a name of :data:`MODELS`.
        policy: if given, the graph module handed to the quantizer is adopted
            onto a policy mode first, so the ExportPasses a quantizer runs in
            ``transform_for_annotation`` (Cortex-M) dispatch through it.

    Returns:
        A function returning a new ``ExportedProgram`` of the quantized model
        on each call.
    """
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    from torch_cachepolicy.adopt import adopt

    spec = get_flow(flow)
    module, example, _ = build_model(model, seed)
    if spec.channels_last:
        example = tuple(t.to(memory_format=torch.channels_last) for t in example)
    # check_guards=False: with guards, torch 2.13 adds a `_guards_fn`
    # call_module node that ExportPass (the Cortex-M quantizer's
    # transform_for_annotation) rejects.
    graph_module = torch.export.export(module, example).module(check_guards=False)
    if policy is not None:
        adopt(graph_module, cache_policy=policy)
    prepared = prepare_pt2e(graph_module, spec.make_quantizer())
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
    """One lowering call and what it produced.

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
        edge: the lowered ``ExportedProgram``.
        constants: a SHA-256 digest of the lowered program's state dict and
            constants (names, dtypes, shapes, bytes).
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
    constants: str = ""


def _payloads(graph_module: torch.fx.GraphModule) -> dict[str, bytes]:
    from executorch.exir.lowered_backend_module import LoweredBackendModule

    return {
        name: bytes(module.processed_bytes)
        for name, module in graph_module.named_modules()
        if isinstance(module, LoweredBackendModule)
    }


def _constants_digest(ep: ExportedProgram) -> str:
    digest = hashlib.sha256()
    named = {**ep.state_dict, **ep.constants}
    for name in sorted(named):
        value = named[name]
        digest.update(name.encode())
        if isinstance(value, torch.Tensor):
            t = value.detach().contiguous().cpu()
            digest.update(f"{t.dtype}{tuple(t.shape)}".encode())
            digest.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        else:
            digest.update(repr(value).encode())
    return digest.hexdigest()


def lower(
    ep: ExportedProgram,
    config: str,
    *,
    flow: str | Flow = "ethos-u55",
    policy: tcp.CachePolicy | None = None,
    quiet: bool = True,
) -> Lowering:
    """Lowers ``ep`` with ``flow``'s lowering under ``config``.

    Args:
        ep: a freshly exported program (the lowering consumes it).
        config: one of :data:`CONFIGS`.
        flow: a name of :data:`FLOWS`.
        policy: the policy of the policy configurations; ``None`` means
            :func:`executorch_policy`. Reuse one across calls: its identity
            names the cache partition.
        quiet: swallow what the lowering prints to stdout (Vela's summary).

    Returns:
        The timings and outputs of the lowering.
    """
    from benchmarks.global_patch import global_patch
    from torch_cachepolicy.adopt import adopt

    spec = get_flow(flow)
    if config not in CONFIGS:
        raise ValueError(f"lower(...): config must be one of {CONFIGS}, got {config!r}")
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
            # A collection triggered by earlier garbage must not land in one
            # configuration's figure: collect first, GC off meanwhile.
            with timed() as timing:
                lowered = spec.lower_program(ep)
            exit_start = time.perf_counter()
        setup += time.perf_counter() - exit_start
    if mode is not None:
        info = mode.cache_info()
        hits, misses = info.hits, info.misses
    else:
        hits, misses = _ft.FakeTensorMode.cache_hits - hits0, _ft.FakeTensorMode.cache_misses - misses0
    gm = lowered.graph_module
    return Lowering(
        config,
        timing.seconds,
        timing.cpu_seconds,
        setup,
        _payloads(gm),
        gm.code,
        hits,
        misses,
        mode,
        lowered,
        _constants_digest(lowered),
    )


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


def _check_runnable(repeats: int = 1) -> None:
    if executorch_version() is None:
        raise ImportError(f"ExecuTorch is not installed: {_INSTALL_HINT}")
    if repeats < 1:
        raise ValueError(f"expected a positive number of repeats, got {repeats}")


def _run_flow(
    flow: Flow,
    model: str,
    repeats: int,
    policy: tcp.CachePolicy,
    progress: Callable[[str], None] | None,
    order: Sequence[str] = CONFIGS,
) -> dict[str, Any]:
    fresh_program = quantized_program_factory(flow=flow, model=model)
    series: dict[str, list[Lowering]] = {c: [] for c in order}
    reference: Lowering | None = None
    identical = {"delegate_payloads": True, "graph_code": True, "constants": True}
    policy_cache: dict[str, list[int]] = {}
    for round_ in range(-1, repeats):
        for config in order:
            result = lower(fresh_program(), config, flow=flow, policy=policy)
            if reference is None:
                reference = result
            identical["delegate_payloads"] &= result.payloads == reference.payloads
            identical["graph_code"] &= result.graph_code == reference.graph_code
            identical["constants"] &= result.constants == reference.constants
            if config == "policy" and result.mode is not None:
                report = result.mode.cache_report().by_namespace()
                policy_cache = {ns: list(counts) for ns, counts in report.items()}
            if progress is not None:
                tag = "warm-up" if round_ < 0 else f"round {round_ + 1}/{repeats}"
                progress(f"{flow.name} {tag} {config}: {result.seconds:.3f} s wall, {result.cpu_seconds:.3f} s cpu")
            if round_ >= 0:
                # Only the figures are kept: programs and modes would pile up.
                result.edge = result.mode = None
                series[config].append(result)
    assert reference is not None
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
        if num in configs and den in configs
    }
    return {
        "title": flow.title,
        "delegates": len(reference.payloads),
        "configs": configs,
        "ratios": ratios,
        "identical": identical,
        "policy_cache": policy_cache,
    }


def run(
    repeats: int,
    *,
    flows: Sequence[str] = ("ethos-u55",),
    model: str = "tiny",
    configs: Sequence[str] = CONFIGS,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Times each flow's lowering under every configuration, interleaved.

    Flows run one after the other; within a flow, rounds run every
    configuration once, in the order of :data:`CONFIGS`, after one discarded
    warm-up round.

    Args:
        repeats: measured rounds per flow.
        flows: names of :data:`FLOWS`.
        model: a name of :data:`MODELS`.
        configs: the configurations to run (a subset of :data:`CONFIGS`);
            ratios are reported for the pairs both present.
        progress: called with a line per lowering (e.g. ``print``).

    Returns:
        ``{"schema", "environment", "settings", "flows"}``;
        ``flows[name]`` has ``configs[config]`` (per-round ``seconds`` /
        ``cpu_seconds`` / ``setup_ms``, their medians, per-round ``hits`` /
        ``misses``), ``ratios[name]`` (see :data:`RATIOS`; ``wall`` and
        ``cpu``, each with ``per_round``, ``median`` and ``of_medians``),
        ``identical`` (delegate payloads, graph code and constants of every
        lowering equal), ``delegates`` and ``policy_cache`` (the last policy
        lowering's hits, misses and bypasses per namespace).

    Raises:
        ImportError: ExecuTorch is not installed.
        ValueError: ``repeats`` is not positive, or an unknown flow or model.
    """
    _check_runnable(repeats)
    unknown = set(configs) - set(CONFIGS)
    if unknown or not configs:
        raise ValueError(f"run(configs=...): expected a non-empty subset of {CONFIGS}, got {list(configs)}")
    order = [c for c in CONFIGS if c in configs]
    specs = [get_flow(name) for name in flows]
    _, _, description = build_model(model)
    policy = executorch_policy()
    return {
        "schema": "benchmarks.executorch_flow/2",
        "environment": _environment(),
        "settings": {
            "repeats": repeats,
            "warmup_rounds": 1,
            "order": order,
            "ethos_u_target": ETHOS_U_TARGET,
            "namespaces": list(EXECUTORCH_NAMESPACES),
            "model": model,
            "model_description": description,
            "flows": [f.name for f in specs],
        },
        "flows": {spec.name: _run_flow(spec, model, repeats, policy, progress, order) for spec in specs},
    }


# ----------------------------------------------------------------- census

CENSUS_CONFIGS: tuple[str, ...] = ("stock", "global-patch", "policy")
"""The configurations :func:`census` runs."""

CENSUS_PHASES: tuple[str, ...] = ("quantize", "export", "adopt", "lower")
"""The phases of one pipeline, in order (``adopt``: the policy configuration only)."""


def census_pipeline(
    flow: str | Flow, config: str, *, model: str = "tiny", policy: tcp.CachePolicy | None = None
) -> dict[str, Any]:
    """Runs one whole pipeline (quantize, export, adopt, lower) under the dispatch recorder.

    Under ``global-patch`` the patch covers the whole pipeline; under
    ``policy`` the quantizer's graph module and the exported program are both
    adopted (the two public hooks: :func:`quantized_program_factory`'s
    ``policy`` and :func:`torch_cachepolicy.adopt.adopt`).

    Args:
        flow: a name of :data:`FLOWS`.
        config: one of :data:`CENSUS_CONFIGS`.
        model: a name of :data:`MODELS`.
        policy: the policy; ``None`` means :func:`executorch_policy`.

    Returns:
        ``{"phase_seconds", "phase_cpu_seconds", "rows", "modes",
        "adopted_report", "adopted_non_builtin", "lowering"}``: wall and CPU
        seconds per phase (with the recorder's overhead), the recorder's
        cells (:meth:`benchmarks.dispatch_recorder.DispatchCensus.rows`), the
        modes constructed (kind, creation site, phase, dispatches), the adopted
        mode's hits / misses / bypasses per namespace and its backend
        "non-builtin" bypasses (policy only), and digests of the lowering's
        outputs (payloads, graph code, constants).
    """
    from benchmarks.dispatch_recorder import recording
    from benchmarks.global_patch import global_patch
    from torch_cachepolicy.adopt import adopt

    spec = get_flow(flow)
    if config not in CENSUS_CONFIGS:
        raise ValueError(f"census_pipeline(...): config must be one of {CENSUS_CONFIGS}, got {config!r}")
    policy = policy or executorch_policy()
    seconds: dict[str, float] = {}
    cpu_seconds: dict[str, float] = {}
    scope: contextlib.AbstractContextManager[Any] = (
        global_patch(EXECUTORCH_NAMESPACES) if config == "global-patch" else contextlib.nullcontext()
    )
    mode: tcp.FakeTensorMode | None = None
    with recording() as rec, scope, contextlib.redirect_stdout(io.StringIO()):

        @contextlib.contextmanager
        def phase(name: str) -> Iterator[None]:
            # Timed as the step runs (no collection first, GC on): the census
            # reports shares within one pipeline, not one configuration's
            # figure against another's.
            with timed(collect=False, gc_off=False) as timing, rec.in_phase(name):
                yield
            seconds[name], cpu_seconds[name] = timing.seconds, timing.cpu_seconds

        with phase("quantize"):
            factory = quantized_program_factory(flow=spec, model=model, policy=policy if config == "policy" else None)
        with phase("export"):
            ep = factory()
        if config == "policy":
            with phase("adopt"):
                mode = adopt(ep, cache_policy=policy)
        with phase("lower"):
            lowered = spec.lower_program(ep)
    gm = lowered.graph_module
    return {
        "phase_seconds": seconds,
        "phase_cpu_seconds": cpu_seconds,
        "rows": rec.rows(),
        "modes": [vars(m) for m in rec.modes],
        "adopted_report": (
            {} if mode is None else {ns: list(c) for ns, c in mode.cache_report().by_namespace().items()}
        ),
        "adopted_non_builtin": (
            0
            if mode is None
            else sum(
                row.bypasses.get("non-builtin", 0)
                for row in mode.cache_report().ops
                if row.namespace in EXECUTORCH_NAMESPACES
            )
        ),
        "lowering": {
            "payloads": {k: hashlib.sha256(v).hexdigest() for k, v in _payloads(gm).items()},
            "graph_code": hashlib.sha256(gm.code.encode()).hexdigest(),
            "constants": _constants_digest(lowered),
        },
    }


def _sum_rows(rows: Sequence[dict[str, Any]], **match: Any) -> dict[str, float]:
    keys = ("calls", "outer_calls", "outer_seconds", "outer_cpu_seconds", "non_builtin")
    out = dict.fromkeys(keys, 0.0)
    for row in rows:
        if all(
            (row[k] in v) if isinstance(v, (set, frozenset, tuple, list)) else row[k] == v for k, v in match.items()
        ):
            for k in keys:
                out[k] += row[k]
    return out


def census(
    flows: Sequence[str] = tuple(FLOWS),
    *,
    model: str = "tiny",
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """For each flow, :func:`census_pipeline` under every configuration of
    :data:`CENSUS_CONFIGS` (after one discarded stock pipeline, which pays
    first-use costs such as XNNPACK's pattern tracing), and a summary:

    * ``backend_share``: under stock, the outermost fake dispatches of
      backend ops (:data:`EXECUTORCH_NAMESPACES`) during the lowering, as a
      share of the lowering's wall and CPU time (both measured with the
      recorder on);
    * ``unreached``: under policy, per phase, the dispatches served by stock
      modes (count, outermost seconds, their share of the whole pipeline's
      wall time, backend "non-builtin" bypasses) and the stock modes
      constructed (site, dispatches);
    * ``non_builtin``: backend "non-builtin" bypasses during the lowering,
      per configuration (stock modes: the recorder; policy: the adopted mode's
      report plus any stock mode's);
    * ``identical``: whether the three pipelines lowered to the same payloads,
      graph code and constants.
    """
    _check_runnable()
    backend = frozenset(EXECUTORCH_NAMESPACES)
    policy = executorch_policy()
    out: dict[str, Any] = {}
    for name in flows:
        spec = get_flow(name)
        census_pipeline(spec, "stock", model=model, policy=policy)  # warm-up, discarded
        runs: dict[str, Any] = {}
        for config in CENSUS_CONFIGS:
            runs[config] = census_pipeline(spec, config, model=model, policy=policy)
            if progress is not None:
                progress(f"census {spec.name} {config}: {runs[config]['phase_seconds']}")
        stock = runs["stock"]
        lower_s = stock["phase_seconds"]["lower"]
        lower_rows = [r for r in stock["rows"] if r["phase"] == "lower"]
        backend_disp = _sum_rows(lower_rows, namespace=backend)
        all_disp = _sum_rows(lower_rows)
        pol = runs["policy"]
        total_s = sum(pol["phase_seconds"].values())
        unreached = {}
        for ph in CENSUS_PHASES:
            if ph not in pol["phase_seconds"]:
                continue
            s = _sum_rows(pol["rows"], phase=ph, kind="stock")
            s_backend = _sum_rows(pol["rows"], phase=ph, kind="stock", namespace=backend)
            reached = _sum_rows(pol["rows"], phase=ph, kind="policy")
            unreached[ph] = {
                "phase_seconds": pol["phase_seconds"][ph],
                "stock_calls": int(s["calls"]),
                "stock_backend_calls": int(s_backend["calls"]),
                "stock_outer_seconds": s["outer_seconds"],
                "stock_share_of_pipeline": s["outer_seconds"] / total_s,
                "stock_backend_non_builtin": int(s_backend["non_builtin"]),
                "policy_calls": int(reached["calls"]),
                "stock_modes": [m for m in pol["modes"] if m["phase"] == ph and m["kind"] == "stock"],
            }
        non_builtin = {
            config: int(_sum_rows(run["rows"], phase="lower", kind="stock", namespace=backend)["non_builtin"])
            + (run["adopted_non_builtin"] if config == "policy" else 0)
            for config, run in runs.items()
        }
        ref = stock["lowering"]
        out[spec.name] = {
            "runs": runs,
            "backend_share": {
                "lower_seconds": lower_s,
                "lower_cpu_seconds": stock["phase_cpu_seconds"]["lower"],
                "backend_outer_seconds": backend_disp["outer_seconds"],
                "backend_share_wall": backend_disp["outer_seconds"] / lower_s,
                "backend_share_cpu": backend_disp["outer_cpu_seconds"] / stock["phase_cpu_seconds"]["lower"],
                "all_fake_dispatch_share_wall": all_disp["outer_seconds"] / lower_s,
                "backend_outer_calls": int(backend_disp["outer_calls"]),
            },
            "unreached": unreached,
            "non_builtin": non_builtin,
            "identical": all(run["lowering"] == ref for run in runs.values()),
        }
    return {
        "schema": "benchmarks.executorch_flow.census/1",
        "environment": _environment(),
        "settings": {"model": model, "flows": list(flows), "configs": list(CENSUS_CONFIGS)},
        "flows": out,
    }


# ------------------------------------------------------------------ output


def render_markdown(results: dict[str, Any]) -> str:
    """The result of :func:`run` as Markdown tables, one section per flow."""
    env, settings = results["environment"], results["settings"]
    lines = [
        f"ExecuTorch {env['executorch']}, torch {env['torch']}, model `{settings['model']}` "
        f"({settings['model_description']}); {settings['repeats']} interleaved rounds after 1 warm-up, "
        f"{env['cpu_count']} CPUs",
    ]
    for name, flow in results["flows"].items():
        configs = flow["configs"]
        lines += [
            "",
            f"### {name}: {flow['title']}, {flow['delegates']} delegate(s)",
            "",
            "| config | median wall s | median CPU s | setup ms | hits | misses |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        for config in configs:
            c = configs[config]
            lines.append(
                f"| {config} | {c['median_seconds']:.3f} | {c['median_cpu_seconds']:.3f} | "
                f"{c['median_setup_ms']:.1f} | {statistics.median(c['hits']):.0f} | "
                f"{statistics.median(c['misses']):.0f} |"
            )
        lines += [
            "",
            "| ratio | wall (median of rounds) | CPU (median of rounds) | wall (of medians) | CPU (of medians) |",
            "| --- | --- | --- | --- | --- |",
        ]
        for ratio, r in flow["ratios"].items():
            lines.append(
                f"| {ratio} | {r['wall']['median']:.3f} | {r['cpu']['median']:.3f} | "
                f"{r['wall']['of_medians']:.3f} | {r['cpu']['of_medians']:.3f} |"
            )
        same = flow["identical"]
        lines += [
            "",
            "identical across all lowerings: " + ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in same.items()),
        ]
        if flow["policy_cache"]:
            lines += ["", "| namespace (policy) | hits | misses | bypasses |", "| --- | --- | --- | --- |"]
            lines += [f"| {ns} | {h} | {m} | {b} |" for ns, (h, m, b) in flow["policy_cache"].items()]
    return "\n".join(lines)


def render_census(results: dict[str, Any]) -> str:
    """The result of :func:`census` as Markdown tables."""
    lines = [f"Dispatch census, model `{results['settings']['model']}` (recorder on: times include its overhead)"]
    for name, flow in results["flows"].items():
        share = flow["backend_share"]
        lines += [
            "",
            f"### {name}",
            "",
            f"stock lowering: {share['lower_seconds']:.3f} s wall; outermost fake dispatch of backend ops "
            f"{share['backend_outer_seconds']:.3f} s ({share['backend_share_wall']:.1%} of wall, "
            f"{share['backend_share_cpu']:.1%} of CPU; {share['backend_outer_calls']} calls), "
            f"all fake dispatch {share['all_fake_dispatch_share_wall']:.1%} of wall",
            "",
            "backend non-builtin bypasses in the lowering: "
            + ", ".join(f"{c} {n}" for c, n in flow["non_builtin"].items())
            + f"; outputs identical: {'yes' if flow['identical'] else 'NO'}",
            "",
            "| phase (policy run) | phase s | dispatches on policy modes | on stock modes | of them backend | "
            "stock outermost s | share of pipeline | backend non-builtin | stock modes created |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for ph, u in flow["unreached"].items():
            sites = "; ".join(f"{m['site']} ({m['calls']} dispatches)" for m in u["stock_modes"]) or "-"
            lines.append(
                f"| {ph} | {u['phase_seconds']:.3f} | {u['policy_calls']} | {u['stock_calls']} | "
                f"{u['stock_backend_calls']} | {u['stock_outer_seconds']:.3f} | {u['stock_share_of_pipeline']:.1%} | "
                f"{u['stock_backend_non_builtin']} | {sites} |"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: runs :func:`run` (and :func:`census`), prints Markdown; 1 if outputs differed."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.executorch_flow",
        description="Times ExecuTorch lowerings (Ethos-U55, Cortex-M, XNNPACK): stock vs global patch vs policy.",
    )
    parser.add_argument("--flow", choices=[*FLOWS, "all"], default="ethos-u55", help="default ethos-u55")
    parser.add_argument("--model", choices=MODELS, default="tiny", help="default tiny")
    parser.add_argument("--repeats", type=int, default=5, help="measured rounds per flow (default 5; 0: no timing)")
    parser.add_argument(
        "--configs",
        default=",".join(CONFIGS),
        help=f"comma-separated subset of {','.join(CONFIGS)} (default: all)",
    )
    parser.add_argument("--census", action="store_true", help="also count dispatches on unreached modes")
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    args = parser.parse_args(argv)
    flows = list(FLOWS) if args.flow == "all" else [args.flow]
    progress = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    results: dict[str, Any] = {}
    ok = True
    if args.repeats:
        configs = [c for c in args.configs.split(",") if c]
        results = run(args.repeats, flows=flows, model=args.model, configs=configs, progress=progress)
        print(render_markdown(results))
        ok = all(all(f["identical"].values()) for f in results["flows"].values())
    if args.census:
        results["census"] = census(flows, model=args.model, progress=progress)
        print()
        print(render_census(results["census"]))
        ok &= all(f["identical"] for f in results["census"]["flows"].values())
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2, default=str) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
