"""One lowering: the quantized program it consumes, the configuration it runs under, what it produces.

A model is quantized once per flow (prepare, calibrate on one seeded batch,
convert) and exported afresh for every lowering, since a lowering consumes its
program (:func:`quantized_program_factory`). :func:`lower` then lowers it under
one of :data:`CONFIGS`:

* ``stock``: torch as shipped;
* ``global-patch``: ExecuTorch PR 21700's process-global ``is_builtin`` swap
  (:mod:`benchmarks.global_patch`) around the lowering;
* ``policy``: :func:`torch_cachepolicy.adopt.adopt` moves the exported
  program onto a policy mode before the lowering, with the library's
  ExecuTorch recipe (:func:`torch_cachepolicy.recipes.executorch.executorch_policy`);
* ``policy-isolated``: the same with ``CacheStore(isolated=True)`` (aten
  entries not shared with torch's class-global cache either).

Only the lowering call is timed; ``adopt`` and the patch's enter/exit are
timed separately (``setup_seconds``). ``lower(..., record=True)`` runs the
lowering under :func:`benchmarks.dispatch_recorder.recording` (outcomes on),
entered outside the timed span, for the census's split of the lowering time. What it produced is kept as digests
(:func:`delegate_payloads`, :func:`constants_digest`) so that every lowering
of a flow can be checked to give the same program.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch._subclasses import fake_tensor as _ft
from torch.export import ExportedProgram

import torch_cachepolicy as tcp
from benchmarks.executorch.flows import Flow, get_flow
from benchmarks.executorch.models import model_case
from benchmarks.timing import timed
from torch_cachepolicy.recipes.executorch import EXECUTORCH_NAMESPACES, executorch_policy

__all__ = [
    "CONFIGS",
    "Lowering",
    "constants_digest",
    "delegate_payloads",
    "lower",
    "program_mode",
    "quantized_program_factory",
]

CONFIGS: tuple[str, ...] = ("stock", "global-patch", "policy", "policy-isolated")
"""The configurations, in the order each round runs them."""


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
        flow: a name of :data:`~benchmarks.executorch.flows.FLOWS`.
        model: a name of :data:`~benchmarks.executorch.models.MODELS`, in the
            flow's model family (its dynamic shapes, if any, are exported
            both times: before quantization and for every lowering).
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
    case = model_case(model, seed, family=spec.model_family)
    example, dynamic_shapes = case.example, case.dynamic_shapes
    if spec.channels_last:
        example = tuple(t.to(memory_format=torch.channels_last) for t in example)
    # check_guards=False: with guards, torch 2.13 adds a `_guards_fn`
    # call_module node that ExportPass (the Cortex-M quantizer's
    # transform_for_annotation) rejects.
    graph_module = torch.export.export(case.module, example, dynamic_shapes=dynamic_shapes).module(
        check_guards=False
    )
    if policy is not None:
        adopt(graph_module, cache_policy=policy)
    prepared = prepare_pt2e(graph_module, spec.make_quantizer())
    prepared(*example)  # calibration
    converted = convert_pt2e(prepared)

    def export() -> ExportedProgram:
        return torch.export.export(converted, example, dynamic_shapes=dynamic_shapes)

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
        bypasses: cache bypasses during the lowering, counted like ``hits``.
        census: the dispatch recorder's census of the lowering
            (``record=True`` only).
        export_seconds: wall time of the ``torch.export.export`` that made
            the program, when the caller timed it (the timed runs do).
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
    bypasses: int = 0
    census: Any = field(default=None, repr=False)
    export_seconds: float = 0.0


def delegate_payloads(graph_module: torch.fx.GraphModule) -> dict[str, bytes]:
    """``processed_bytes`` of every delegate (``LoweredBackendModule``) of a lowered graph, by submodule name."""
    from executorch.exir.lowered_backend_module import LoweredBackendModule

    return {
        name: bytes(module.processed_bytes)
        for name, module in graph_module.named_modules()
        if isinstance(module, LoweredBackendModule)
    }


def constants_digest(ep: ExportedProgram) -> str:
    """A SHA-256 hex digest of ``ep``'s state dict and constants (names, dtypes, shapes, bytes)."""
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
    record: bool = False,
) -> Lowering:
    """Lowers ``ep`` with ``flow``'s lowering under ``config``.

    Args:
        ep: a freshly exported program (the lowering consumes it).
        config: one of :data:`CONFIGS`.
        flow: a name of :data:`~benchmarks.executorch.flows.FLOWS`.
        policy: the policy of the policy configurations; ``None`` means
            :func:`executorch_policy`. Reuse one across calls: its identity
            names the cache partition.
        quiet: swallow what the lowering prints to stdout (Vela's summary).
        record: run the lowering under the dispatch recorder (cache outcomes
            and exclusive times recorded; a few microseconds more per
            dispatch, inside the timed span). The recorder is entered and
            left outside the timed span.

    Returns:
        The timings and outputs of the lowering.
    """
    from benchmarks.dispatch_recorder import recording
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
    # Counted around the lowering only (adopt's own dispatches, if any, excluded).
    before = _counts(mode)
    out = io.StringIO()
    census = None
    with contextlib.redirect_stdout(out) if quiet else contextlib.nullcontext():
        start = time.perf_counter()
        with scope:
            setup += time.perf_counter() - start
            with recording(outcomes=True) if record else contextlib.nullcontext() as census:
                # A collection triggered by earlier garbage must not land in one
                # configuration's figure: collect first, GC off meanwhile.
                with timed() as timing:
                    lowered = spec.lower_program(ep)
            exit_start = time.perf_counter()
        setup += time.perf_counter() - exit_start
    hits, misses, bypasses = (a - b for a, b in zip(_counts(mode), before, strict=True))
    gm = lowered.graph_module
    return Lowering(
        config,
        timing.seconds,
        timing.cpu_seconds,
        setup,
        delegate_payloads(gm),
        gm.code,
        hits,
        misses,
        mode,
        lowered,
        constants_digest(lowered),
        bypasses,
        census,
    )


def _counts(mode: tcp.FakeTensorMode | None) -> tuple[int, int, int]:
    """Hits, misses and bypasses so far: the policy mode's own, or torch's class counters."""
    if mode is not None:
        info = mode.cache_info()
        return info.hits, info.misses, sum(info.bypasses.values())
    cls = _ft.FakeTensorMode
    return cls.cache_hits, cls.cache_misses, sum(cls.cache_bypasses.values())
