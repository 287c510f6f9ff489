"""The dispatch census: which fake dispatches of a whole pipeline the policy does not reach.

Runs each flow's whole pipeline (quantize, export, lower) once per
configuration under :mod:`benchmarks.dispatch_recorder` and reports which fake
dispatches went to modes the policy does not reach, and the share of the stock
lowering spent in fake dispatch of backend ops.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch_cachepolicy as tcp
from benchmarks.executorch.environment import check_runnable, environment
from benchmarks.executorch.flows import FLOWS, Flow, get_flow
from benchmarks.executorch.lowering import constants_digest, delegate_payloads, quantized_program_factory
from benchmarks.timing import timed
from torch_cachepolicy.recipes.executorch import EXECUTORCH_NAMESPACES, executorch_policy

__all__ = ["CENSUS_CONFIGS", "CENSUS_PHASES", "CENSUS_SCHEMA", "census", "census_pipeline"]

# The schema keeps the name of the module that first wrote it, so that
# results written before the package split still compare.
CENSUS_SCHEMA = "benchmarks.executorch_flow.census/1"
"""The ``schema`` of :func:`census`'s result."""

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
        flow: a name of :data:`~benchmarks.executorch.flows.FLOWS`.
        config: one of :data:`CENSUS_CONFIGS`.
        model: a name of :data:`~benchmarks.executorch.models.MODELS`.
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
            "payloads": {k: hashlib.sha256(v).hexdigest() for k, v in delegate_payloads(gm).items()},
            "graph_code": hashlib.sha256(gm.code.encode()).hexdigest(),
            "constants": constants_digest(lowered),
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
    check_runnable()
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
        "schema": CENSUS_SCHEMA,
        "environment": environment(),
        "settings": {"model": model, "flows": list(flows), "configs": list(CENSUS_CONFIGS)},
        "flows": out,
    }
