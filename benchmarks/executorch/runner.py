"""The timed run: every flow's lowering under every configuration, interleaved.

Configurations run interleaved (stock, global-patch, policy, policy-isolated,
stock, ...) after one discarded warm-up round, each on a freshly exported
program of the same quantized model. Every lowering of a flow must produce the
same delegate payloads, the same graph code and the same constants.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch_cachepolicy as tcp
from benchmarks.executorch.environment import check_runnable, environment
from benchmarks.executorch.flows import ETHOS_U_TARGET, Flow, get_flow
from benchmarks.executorch.lowering import CONFIGS, Lowering, lower, quantized_program_factory
from benchmarks.executorch.models import model_case
from benchmarks.progress import Rounds
from torch_cachepolicy.recipes.executorch import EXECUTORCH_NAMESPACES, executorch_policy

__all__ = ["RATIOS", "SCHEMA", "run"]

# The schema keeps the name of the module that first wrote it, so that
# results written before the package split still compare.
SCHEMA = "benchmarks.executorch_flow/2"
"""The ``schema`` of :func:`run`'s result."""

# (name, numerator, denominator): ratios of lowering time; < 1 means the
# numerator configuration is faster.
RATIOS: tuple[tuple[str, str, str], ...] = (
    ("global-patch/stock", "global-patch", "stock"),
    ("policy/stock", "policy", "stock"),
    ("policy/global-patch", "policy", "global-patch"),
    ("policy-isolated/policy", "policy-isolated", "policy"),
)


def _median_ratio(num: Sequence[float], den: Sequence[float]) -> dict[str, Any]:
    per_round = [n / d for n, d in zip(num, den, strict=True)]
    return {
        "per_round": per_round,
        "median": statistics.median(per_round),
        "of_medians": statistics.median(num) / statistics.median(den),
    }


def _run_flow(
    flow: Flow,
    model: str,
    repeats: int,
    policy: tcp.CachePolicy,
    rounds: Rounds,
    order: Sequence[str] = CONFIGS,
) -> dict[str, Any]:
    fresh_program = quantized_program_factory(flow=flow, model=model)
    series: dict[str, list[Lowering]] = {c: [] for c in order}
    reference: Lowering | None = None
    identical = {"delegate_payloads": True, "graph_code": True, "constants": True}
    policy_cache: dict[str, list[int]] = {}
    for round_ in range(-1, repeats):
        line: list[str] = []
        for config in order:
            start = time.perf_counter()
            program = fresh_program()
            export_seconds = time.perf_counter() - start
            result = lower(program, config, flow=flow, policy=policy)
            result.export_seconds = export_seconds
            if reference is None:
                reference = result
            identical["delegate_payloads"] &= result.payloads == reference.payloads
            identical["graph_code"] &= result.graph_code == reference.graph_code
            identical["constants"] &= result.constants == reference.constants
            if config == "policy" and result.mode is not None:
                report = result.mode.cache_report().by_namespace()
                policy_cache = {ns: list(counts) for ns, counts in report.items()}
            line.append(f"{config} {result.seconds:.2f}/{result.cpu_seconds:.2f}")
            if round_ >= 0:
                # Only the figures are kept: programs and modes would pile up.
                result.edge = result.mode = None
                series[config].append(result)
        tag = "warm-up" if round_ < 0 else f"round {round_ + 1}/{repeats}"
        rounds.done(f"{flow.name} {tag}, s wall/CPU: {', '.join(line)}")
    assert reference is not None
    configs: dict[str, Any] = {}
    for config, runs in series.items():
        configs[config] = {
            "seconds": [r.seconds for r in runs],
            "cpu_seconds": [r.cpu_seconds for r in runs],
            "setup_ms": [r.setup_seconds * 1e3 for r in runs],
            "export_ms": [r.export_seconds * 1e3 for r in runs],
            # The export stage as a pipeline sees it: stock's torch.export.export, then this config's setup (adopt).
            "median_export_stage_ratio": statistics.median(
                (r.export_seconds + r.setup_seconds) / r.export_seconds for r in runs
            ),
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
        "model_description": model_case(model, family=flow.model_family).description,
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
        flows: names of :data:`~benchmarks.executorch.flows.FLOWS`.
        model: a name of :data:`~benchmarks.executorch.models.MODELS`.
        configs: the configurations to run (a subset of :data:`CONFIGS`);
            ratios are reported for the pairs both present.
        progress: called with a line per round (e.g. a
            :class:`~benchmarks.progress.StderrProgress`): each
            configuration's wall and CPU seconds, and an estimate of the time
            left.

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
    check_runnable(repeats)
    unknown = set(configs) - set(CONFIGS)
    if unknown or not configs:
        raise ValueError(f"run(configs=...): expected a non-empty subset of {CONFIGS}, got {list(configs)}")
    order = [c for c in CONFIGS if c in configs]
    specs = [get_flow(name) for name in flows]
    descriptions = {spec.model_family: model_case(model, family=spec.model_family).description for spec in specs}
    policy = executorch_policy()
    rounds = Rounds(len(specs) * (repeats + 1), progress)
    return {
        "schema": SCHEMA,
        "environment": environment(),
        "settings": {
            "repeats": repeats,
            "warmup_rounds": 1,
            "order": order,
            "ethos_u_target": ETHOS_U_TARGET,
            "namespaces": list(EXECUTORCH_NAMESPACES),
            "model": model,
            # The first flow's model; every flow's is in flows[name]["model_description"].
            "model_description": descriptions[specs[0].model_family],
            "model_descriptions": descriptions,
            "flows": [f.name for f in specs],
        },
        "flows": {spec.name: _run_flow(spec, model, repeats, policy, rounds, order) for spec in specs},
    }
