"""The dispatch census: which fake dispatches the policy does not reach, and how far the policy is from the limit.

Two modes, both under :mod:`benchmarks.dispatch_recorder`:

* :func:`census` (``--census``) runs each flow's whole pipeline (quantize,
  export, lower) once per configuration and reports which fake dispatches went
  to modes the policy does not reach, and the share of the stock lowering
  spent in fake dispatch of backend ops;
* :func:`split_lowering` (``--split``) splits one lowering's time into fake
  dispatch (hits, misses, bypasses, uncached; on the policy mode or on stock
  modes) and the rest, for stock, the global patch and the policy, and
  reports how far each is from a lowering whose fake dispatches were all free
  (Note [The split of a lowering]).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import statistics
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch_cachepolicy as tcp
from benchmarks.executorch.environment import check_runnable, environment
from benchmarks.executorch.flows import FLOWS, Flow, get_flow
from benchmarks.executorch.lowering import (
    Lowering,
    constants_digest,
    delegate_payloads,
    lower,
    quantized_program_factory,
)
from benchmarks.executorch.models import model_case
from benchmarks.progress import Rounds
from benchmarks.timing import timed
from torch_cachepolicy.recipes.executorch import EXECUTORCH_NAMESPACES, executorch_policy

__all__ = [
    "CENSUS_CONFIGS",
    "CENSUS_PHASES",
    "CENSUS_SCHEMA",
    "SPLIT_CONFIGS",
    "SPLIT_SCHEMA",
    "census",
    "census_pipeline",
    "split_lowering",
]

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
    rounds = Rounds(len(flows) * (1 + len(CENSUS_CONFIGS)), progress)
    for name in flows:
        spec = get_flow(name)
        census_pipeline(spec, "stock", model=model, policy=policy)  # warm-up, discarded
        rounds.done(f"census {spec.name} warm-up pipeline")
        runs: dict[str, Any] = {}
        for config in CENSUS_CONFIGS:
            runs[config] = census_pipeline(spec, config, model=model, policy=policy)
            phases = ", ".join(f"{ph} {t:.2f}" for ph, t in runs[config]["phase_seconds"].items())
            rounds.done(f"census {spec.name} {config} pipeline, s: {phases}")
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


SPLIT_SCHEMA = "benchmarks.executorch.split/1"
"""The ``schema`` of :func:`split_lowering`'s result."""

SPLIT_CONFIGS: tuple[str, ...] = ("stock", "global-patch", "policy")
"""The configurations :func:`split_lowering` runs."""

# Note [The split of a lowering]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# Each round lowers the same quantized program six times, each on a fresh
# export: under every configuration plain (timed exactly as the timed run
# times it: `lower`, GC off, collection first) and under the dispatch
# recorder with outcomes on (`lower(..., record=True)`); plain first in even
# rounds, recorded first in odd ones. In a recorded lowering of total time T
# (wall or CPU):
#
# * F, the time inside fake dispatch: the inclusive time of the outermost
#   fake dispatches (a dispatch inside another one's kernel is inside its
#   parent's time and not counted again). It splits exactly into the
#   dispatches' exclusive times (each one's own time, its nested
#   dispatches' taken out), by mode (the policy mode, or stock modes: those
#   the policy does not reach) and by each dispatch's own cache outcome (hit,
#   miss, bypass, uncached);
# * R = T - F, the rest: the passes' own Python, FX, serialization, Vela.
#
# The recorder's bookkeeping runs inside the recorded dispatch times (its
# clocks start first and stop last), so F includes it: calibrated in the same
# round (`overhead_per_dispatch`: recorded minus plain batches of aten hits,
# per mode kind) and subtracted per dispatch, F' = F - sum(calls x overhead),
# and likewise from each part. R needs no correction (the recorder adds a
# function call and a few hundred nanoseconds of bookkeeping per outermost
# dispatch outside the clocks: well under 0.1% of a lowering).
#
# The distance to the limit, "time / time with every fake dispatch free", is
# (R + F') / R from the recorded lowering alone (both terms from one run, so
# no cross-run noise); `plain / rest` is T_plain / R, the plain lowering of
# the same round over the recorded one's rest, and `check` is
# (R + F') / T_plain, which is 1 when the calibration holds (the run-to-run
# noise of one lowering shows in it too). The configuration ratios
# (policy/stock, ...) are medians of per-round ratios of the plain
# lowerings, as in the timed run.


def _recorded_split(low: Lowering, overhead: dict[str, dict[str, float]]) -> dict[str, Any]:
    """A recorded lowering's split (Note [The split of a lowering]), wall and CPU."""
    from benchmarks.dispatch_recorder import OUTCOMES, DispatchCensus

    census: DispatchCensus = low.census
    kinds = ("policy", "stock")
    calls = {k: census.total(kind=k).calls for k in kinds}
    out: dict[str, Any] = {
        "calls": {k: {o: census.exclusive(kind=k, outcome=o).calls for o in OUTCOMES} for k in kinds},
        "outer_calls": census.total().outer_calls,
        "counts": {"hits": low.hits, "misses": low.misses, "bypasses": low.bypasses},
    }
    for clock, attr, outer_attr in (("wall", "seconds", "outer_seconds"), ("cpu", "cpu_seconds", "outer_cpu_seconds")):
        total = low.seconds if clock == "wall" else low.cpu_seconds
        fake = getattr(census.total(), outer_attr)
        o = {k: overhead[k][attr] for k in kinds}
        recorder = sum(calls[k] * o[k] for k in kinds)
        parts = {
            k: {
                outcome: getattr(census.exclusive(kind=k, outcome=outcome), attr)
                - census.exclusive(kind=k, outcome=outcome).calls * o[k]
                for outcome in OUTCOMES
            }
            for k in kinds
        }
        rest = total - fake
        out[clock] = {
            "total": total,
            "fake": fake,
            "recorder": recorder,
            "fake_net": fake - recorder,
            "rest": rest,
            "parts": parts,
            "limit": (rest + fake - recorder) / rest,
        }
    return out


def _policy_check(low: Lowering) -> dict[str, Any]:
    """The recorder's outcomes on the policy mode against the mode's own counters (policy lowerings)."""
    from benchmarks.dispatch_recorder import DispatchCensus

    census: DispatchCensus = low.census
    seen = {
        "hits": census.exclusive(kind="policy", outcome="hit").calls,
        "misses": census.exclusive(kind="policy", outcome="miss").calls,
        "bypasses": census.exclusive(kind="policy", outcome="bypass").calls,
    }
    mode = {"hits": low.hits, "misses": low.misses, "bypasses": low.bypasses}
    return {"recorder": seen, "mode": mode, "ok": seen == mode}


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def split_lowering(
    flows: Sequence[str] = ("ethos-u55",),
    *,
    model: str = "tiny",
    rounds: int = 3,
    configs: Sequence[str] = SPLIT_CONFIGS,
    top_ops: int = 12,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Splits each flow's lowering time into fake dispatch and the rest (Note [The split of a lowering]).

    Args:
        flows: names of :data:`~benchmarks.executorch.flows.FLOWS`.
        model: a name of :data:`~benchmarks.executorch.models.MODELS`.
        rounds: measured rounds per flow, after one discarded warm-up round
            (every configuration lowered plain once).
        configs: a subset of :data:`SPLIT_CONFIGS`.
        top_ops: how many operators to list per configuration and outcome.
        progress: called with one line per round (and per warm-up round).

    Returns:
        ``{"schema", "environment", "settings", "flows"}``; ``flows[name]``
        has, per configuration, the plain lowerings' ``seconds`` /
        ``cpu_seconds`` and the recorded ones' splits (``splits``: per round
        ``wall`` / ``cpu`` totals, fake dispatch, the recorder's estimated
        share, the rest, ``parts[kind][outcome]``, ``limit``), their
        ``summary`` (medians over rounds), the operators taking the most
        exclusive time per outcome (``ops``, per lowering, mean over
        rounds), the bypass reasons per operator, the stock modes that
        dispatched in a recorded lowering (``stock_modes``), and
        ``ratios`` between configurations (medians of per-round ratios of
        the plain lowerings); ``calibration`` (the recorder's overhead per
        dispatch, per round), ``policy_check`` (the recorder's hits /
        misses / bypasses on the policy mode against the mode's counters)
        and ``identical`` (every lowering's outputs equal).
    """
    check_runnable(rounds)
    unknown = set(configs) - set(SPLIT_CONFIGS)
    if unknown or not configs:
        raise ValueError(f"split_lowering(configs=...): expected a non-empty subset of {SPLIT_CONFIGS}")
    order = [c for c in SPLIT_CONFIGS if c in configs]
    policy = executorch_policy()
    clock = Rounds(len(flows) * (rounds + 1), progress)
    return {
        "schema": SPLIT_SCHEMA,
        "environment": environment(),
        "settings": {"model": model, "flows": list(flows), "configs": order, "rounds": rounds, "warmup_rounds": 1},
        "flows": {
            name: _split_flow(get_flow(name), model, rounds, order, policy, clock, top_ops) for name in flows
        },
    }


def _split_flow(
    spec: Flow,
    model: str,
    rounds: int,
    order: Sequence[str],
    policy: tcp.CachePolicy,
    clock: Rounds,
    top_ops: int,
) -> dict[str, Any]:
    """:func:`split_lowering` for one flow."""
    from benchmarks.dispatch_recorder import overhead_per_dispatch

    fresh_program = quantized_program_factory(flow=spec, model=model)
    reference: list[tuple[Any, ...]] = []
    identical = True

    def run(config: str, record: bool) -> Lowering:
        nonlocal identical
        low = lower(fresh_program(), config, flow=spec, policy=policy, record=record)
        outputs = (low.payloads, low.graph_code, low.constants)
        if not reference:
            reference.append(outputs)
        identical &= outputs == reference[0]
        return low

    for config in order:  # warm-up round, discarded
        run(config, False)
    clock.done(f"split {spec.name} warm-up")
    plain: dict[str, list[tuple[float, float]]] = {c: [] for c in order}
    splits: dict[str, list[dict[str, Any]]] = {c: [] for c in order}
    ops: dict[str, dict[tuple[str, str, str], list[float]]] = {c: {} for c in order}
    reasons: dict[str, dict[tuple[str, str, str], int]] = {c: {} for c in order}
    stock_modes: dict[str, dict[str, int]] = {c: {} for c in order}
    calibration: list[dict[str, dict[str, float]]] = []
    policy_check: list[dict[str, Any]] = []
    for r in range(rounds):
        overhead = overhead_per_dispatch(outcomes=True)
        calibration.append(overhead)
        sequence = [(c, False) for c in order] + [(c, True) for c in order]
        if r % 2:  # recorded first in odd rounds
            sequence = sequence[len(order) :] + sequence[: len(order)]
        line = []
        for config, record in sequence:
            low = run(config, record)
            line.append(f"{config}{' (recorded)' if record else ''} {low.seconds:.1f}/{low.cpu_seconds:.1f}")
            if not record:
                plain[config].append((low.seconds, low.cpu_seconds))
            else:
                splits[config].append(_recorded_split(low, overhead))
                if config == "policy":
                    policy_check.append(_policy_check(low))
                for row in low.census.op_outcome_rows():
                    cell = ops[config].setdefault((row["kind"], row["op"], row["outcome"]), [0, 0.0, 0.0])
                    cell[0] += row["calls"]
                    cell[1] += row["seconds"]
                    cell[2] += row["cpu_seconds"]
                for row in low.census.bypass_reason_rows():
                    key = (row["kind"], row["op"], row["reason"])
                    reasons[config][key] = reasons[config].get(key, 0) + row["calls"]
                for m in low.census.modes:
                    if m.kind == "stock" and m.calls:
                        stock_modes[config][m.site] = stock_modes[config].get(m.site, 0) + m.calls
            # Only the figures are kept: programs, modes and censuses would pile up.
            low.edge = low.mode = low.census = None
        clock.done(f"split {spec.name} round {r + 1}/{rounds}, s wall/CPU: {', '.join(line)}")
    summary = _summarize_split(order, plain, splits, ops, reasons, stock_modes, rounds, top_ops)
    return {
        "title": spec.title,
        "model_description": model_case(model, family=spec.model_family).description,
        **summary,
        "calibration": calibration,
        "policy_check": policy_check,
        "identical": identical,
    }


def _summarize_split(
    order: Sequence[str],
    plain: dict[str, list[tuple[float, float]]],
    splits: dict[str, list[dict[str, Any]]],
    ops: dict[str, dict[tuple[str, str, str], list[float]]],
    reasons: dict[str, dict[tuple[str, str, str], int]],
    stock_modes: dict[str, dict[str, int]],
    rounds: int,
    top_ops: int,
) -> dict[str, Any]:
    from benchmarks.dispatch_recorder import OUTCOMES

    configs: dict[str, Any] = {}
    for config in order:
        per_round = splits[config]
        summary: dict[str, Any] = {}
        for clock in ("wall", "cpu"):
            index = 0 if clock == "wall" else 1
            t_plain = [p[index] for p in plain[config]]
            rest = [s[clock]["rest"] for s in per_round]
            summary[clock] = {
                "plain": _median(t_plain),
                **{k: _median([s[clock][k] for s in per_round]) for k in ("total", "fake", "recorder", "fake_net", "rest")},
                "parts": {
                    kind: {o: _median([s[clock]["parts"][kind][o] for s in per_round]) for o in OUTCOMES}
                    for kind in ("policy", "stock")
                },
                "limit": _median([s[clock]["limit"] for s in per_round]),
                "plain_over_rest": _median([t / r for t, r in zip(t_plain, rest, strict=True)]),
                "check": _median(
                    [(s[clock]["rest"] + s[clock]["fake_net"]) / t for s, t in zip(per_round, t_plain, strict=True)]
                ),
            }
        rows: list[dict[str, Any]] = [
            {"kind": kind, "op": op, "outcome": outcome, "calls": n / rounds, "seconds": w / rounds, "cpu_seconds": c / rounds}
            for (kind, op, outcome), (n, w, c) in ops[config].items()
        ]
        top: dict[str, list[dict[str, Any]]] = {}
        for outcome in OUTCOMES:
            chosen = [row for row in rows if row["outcome"] == outcome]
            chosen.sort(key=lambda row: -row["cpu_seconds"])
            top[outcome] = chosen[:top_ops]
        configs[config] = {
            "seconds": [p[0] for p in plain[config]],
            "cpu_seconds": [p[1] for p in plain[config]],
            "splits": per_round,
            "summary": summary,
            "calls": per_round[0]["calls"] if per_round else {},
            "counts": per_round[0]["counts"] if per_round else {},
            "ops": top,
            "bypass_reasons": [
                {"kind": kind, "op": op, "reason": reason, "calls": n / rounds}
                for (kind, op, reason), n in sorted(reasons[config].items(), key=lambda item: -item[1])
            ],
            "stock_modes": [{"site": site, "calls": n / rounds} for site, n in stock_modes[config].items()],
        }
    ratios: dict[str, Any] = {}
    for name, num, den in (
        ("global-patch/stock", "global-patch", "stock"),
        ("policy/stock", "policy", "stock"),
        ("policy/global-patch", "policy", "global-patch"),
    ):
        if num in plain and den in plain:
            ratios[name] = {
                clock: _median([n[i] / d[i] for n, d in zip(plain[num], plain[den], strict=True)])
                for clock, i in (("wall", 0), ("cpu", 1))
            }
            ratios[f"{name} (rest)"] = {
                clock: _median(
                    [n[clock]["rest"] / d[clock]["rest"] for n, d in zip(splits[num], splits[den], strict=True)]
                )
                for clock in ("wall", "cpu")
            }
    return {"configs": configs, "ratios": ratios}
