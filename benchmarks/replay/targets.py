"""The performance, cache-outcome and retention targets, evaluated from the results document.

Note [Which targets a run may judge]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Counts (hits, misses, bypasses), correctness and memory retention are exact:
one round measures them as well as a hundred, so every run judges them. Time
ratios are not. On a shared 2-core machine the quick run's ratios (6 rounds of
5 replays) swing by tens of percent between runs, enough to land on either
side of a 2-3% threshold, so a quick-run verdict on them would be a coin toss
that the full run contradicts. A run therefore judges the timing targets only
when it measured at least :data:`TIMING_VERDICT_MIN_ROUNDS` rounds of
:data:`TIMING_VERDICT_MIN_REPLAYS` replays (the full run's settings); below
that their figures are reported with status ``INDICATIVE``, never PASS or FAIL.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

__all__ = [
    "KINDS",
    "STATUSES",
    "TIMING_VERDICT_MIN_REPLAYS",
    "TIMING_VERDICT_MIN_ROUNDS",
    "Target",
    "evaluate_targets",
    "judges_timings",
]

TIMING_VERDICT_MIN_ROUNDS = 18
"""Measured rounds a run needs before it judges timing targets (the full run's)."""
TIMING_VERDICT_MIN_REPLAYS = 20
"""Replays per series a run needs before it judges timing targets (the full run's)."""

KINDS: tuple[str, ...] = ("timing", "counts", "memory")
"""What a target measures: a time ratio, cache outcomes, or entries retained."""
STATUSES: tuple[str, ...] = ("PASS", "FAIL", "SKIP", "INDICATIVE")
"""``SKIP``: not measured in this run; ``INDICATIVE``: a timing figure the run
measured with too few rounds to judge (see Note [Which targets a run may judge])."""


@dataclass(frozen=True)
class Target:
    """One target and how the measurement fared.

    Attributes:
        name: what is promised, in words.
        kind: one of :data:`KINDS`.
        metric: where the value comes from in the results document.
        comparison: ``">="``, ``"<="`` or ``"=="``.
        threshold: the promised bound.
        value: the measured value, or None when it was not measured.
        status: one of :data:`STATUSES`.
    """

    name: str
    kind: str
    metric: str
    comparison: str
    threshold: float
    value: float | None
    status: str

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "line": self.line()}

    def line(self) -> str:
        shown = "not measured" if self.value is None else f"{self.value:.4g}"
        return f"{self.status}  {self.name}: {shown} (target {self.comparison} {self.threshold:g}; {self.metric})"


def judges_timings(settings: Mapping[str, Any]) -> bool:
    """Whether a run with these settings (``results["settings"]``) judges timing targets."""
    return (
        int(settings.get("rounds", 0)) >= TIMING_VERDICT_MIN_ROUNDS
        and int(settings.get("replays", 0)) >= TIMING_VERDICT_MIN_REPLAYS
    )


def _check(
    name: str, kind: str, metric: str, comparison: str, threshold: float, value: float | None, *, judge: bool = True
) -> Target:
    if value is None:
        return Target(name, kind, metric, comparison, threshold, None, "SKIP")
    if not judge:
        return Target(name, kind, metric, comparison, threshold, value, "INDICATIVE")
    ok = {
        ">=": value >= threshold,
        "<=": value <= threshold,
        "==": value == threshold,
    }[comparison]
    return Target(name, kind, metric, comparison, threshold, value, "PASS" if ok else "FAIL")


def _ratio(workloads: Mapping[str, Any], workload: str, ratio: str) -> float | None:
    entry = workloads.get(workload, {}).get("ratios", {}).get(ratio)
    return None if entry is None else float(entry["median"])


def _second_sights(policy: Mapping[str, int], patch: Mapping[str, int]) -> int:
    """The misses the policy makes where the patch hits: a backend key's entry is made on its second sight (Note [An
    entry on a key's second sight]), the patch's on its first."""
    return policy["misses"] - patch["misses"]


def _second_sight_difference(workload: Mapping[str, Any]) -> float | None:
    """Sum over rounds of how far the policy's outcomes are from the patch's but for second sights: the same
    bypasses; ``k`` more misses, each after a first sight that missed too (so at most half the policy's); and no
    hit lost but those ``k`` (a second sight's kernel may dispatch inner ops that hit)."""
    configs = workload.get("configs", {})
    if not {"policy", "global-patch"} <= configs.keys():
        return None
    diff = 0
    for p, g in zip(configs["policy"]["counts_per_round"], configs["global-patch"]["counts_per_round"], strict=True):
        k = _second_sights(p, g)
        diff += abs(p["bypasses"] - g["bypasses"]) + max(0, -k) + max(0, 2 * k - p["misses"])
        diff += max(0, g["hits"] - p["hits"] - k)
    return float(diff)


def _audited(workload: Mapping[str, Any], config: str, field: str) -> int | None:
    entry = workload.get("audit", {}).get(config)
    return None if entry is None else int(entry[field])


def _served_shortfall(workload: Mapping[str, Any]) -> float | None:
    """Calls global-patch served right that the policy neither served nor re-verified after new ShapeEnv knowledge."""
    patch = _audited(workload, "global-patch", "correct")
    served = _audited(workload, "policy", "correct")
    relearnt = _audited(workload, "policy", "relearnt")
    configs = workload.get("configs", {})
    if patch is None or served is None or relearnt is None or not {"policy", "global-patch"} <= configs.keys():
        return None
    # The audit replays one series, as a timed round does: a round's second sights are its allowance.
    second = max(0, _second_sights(configs["policy"]["counts_per_round"][0], configs["global-patch"]["counts_per_round"][0]))
    return float(max(0, patch - served - relearnt - second))


def evaluate_targets(results: Mapping[str, Any]) -> list[Target]:
    """The targets of the tracker issue, each computed from the measurements.

    Timing targets are judged only when :func:`judges_timings` holds for the
    run's settings, and are ``INDICATIVE`` otherwise.
    """
    workloads = results.get("workloads", {})
    judge = judges_timings(results.get("settings", {}))
    targets = [
        _check(
            "policy at least 2x faster than stock on dialect",
            "timing",
            "workloads.dialect.ratios['stock/policy'].median",
            ">=",
            2.0,
            _ratio(workloads, "dialect", "stock/policy"),
            judge=judge,
        ),
        _check(
            "policy at least 1.5x faster than stock on qdq",
            "timing",
            "workloads.qdq.ratios['stock/policy'].median",
            ">=",
            1.5,
            _ratio(workloads, "qdq", "stock/policy"),
            judge=judge,
        ),
    ]
    for name in workloads:
        targets.append(
            _check(
                f"policy no slower than global-patch on {name}",
                "timing",
                f"workloads.{name}.ratios['policy/global-patch'].median",
                "<=",
                1.02,
                _ratio(workloads, name, "policy/global-patch"),
                judge=judge,
            )
        )
    targets.append(
        _check(
            "policy within 3% of stock on aten-only (no more than 3% slower)",
            "timing",
            "workloads['aten-only'].ratios['policy/stock'].median",
            "<=",
            1.03,
            _ratio(workloads, "aten-only", "policy/stock"),
            judge=judge,
        )
    )
    # The hit path (issue #11): CPU-time ratios, which other processes on the
    # machine inflate less than wall time.
    for op, h in (results.get("hit_cost") or {}).items():
        targets.append(
            _check(
                f"policy hit at most 2x the floor on {op}",
                "timing",
                f"hit_cost['{op}'].policy_hit_over_floor_cpu",
                "<=",
                2.0,
                float(h["policy_hit_over_floor_cpu"]),
                judge=judge,
            )
        )
    if "symbolic" in workloads:
        # Issue #20: symbolic keys and hits at static speed.
        targets.append(
            _check(
                "policy at most 0.75x global-patch on symbolic",
                "timing",
                "workloads.symbolic.ratios['policy/global-patch'].median",
                "<=",
                0.75,
                _ratio(workloads, "symbolic", "policy/global-patch"),
                judge=judge,
            )
        )
    for op, h in (results.get("aten_hit_cost") or {}).items():
        targets.append(
            _check(
                f"policy hit at most 0.4x stock's hit on {op}",
                "timing",
                f"aten_hit_cost['{op}'].policy_hit_over_stock_hit_cpu",
                "<=",
                0.4,
                float(h["policy_hit_over_stock_hit_cpu"]),
                judge=judge,
            )
        )
    for name, workload in workloads.items():
        stale = _audited(workload, "policy", "stale")
        targets.append(
            _check(
                f"every call the policy's cache served equals an uncached dispatch on {name}",
                "counts",
                f"workloads.{name}.audit.policy.stale (served calls re-run uncached that differ)",
                "==",
                0,
                None if stale is None else float(stale),
            )
        )
        if name == "symbolic":
            # A symbolic entry of a backend op is filed under what the ShapeEnv
            # knows about its symbols (Note [What the ShapeEnv knows]), which the
            # baseline ignores: the policy misses once where the baseline reuses
            # an entry made under other knowledge. Counted as what is right: every
            # call the baseline served correctly, the policy served too, or it
            # was the node's first call after the ShapeEnv learnt something.
            targets.append(
                _check(
                    "policy serves every call global-patch serves right on symbolic, "
                    "but a node's first call after new ShapeEnv knowledge and a key's second sight",
                    "counts",
                    "max(0, audit['global-patch'].correct - audit.policy.correct - audit.policy.relearnt "
                    "- a round's second sights) in workloads.symbolic",
                    "==",
                    0,
                    _served_shortfall(workload),
                )
            )
            continue
        # The baseline caches every backend op; equal outcomes (but for each key's second sight) mean the policy
        # caches exactly what it does, without touching torch's globals.
        targets.append(
            _check(
                f"policy's hits, misses and bypasses equal global-patch's on {name}, one hit per backend key a miss",
                "counts",
                f"sum over rounds of the differences but for second sights in workloads.{name}"
                ".configs[*].counts_per_round",
                "==",
                0,
                _second_sight_difference(workload),
            )
        )
    memory = results.get("memory") or {}
    retained: float | None = None
    stores_alive: float | None = None
    if memory.get("workloads"):
        policies = [per_config["policy"] for per_config in memory["workloads"].values()]
        retained = float(sum(p["retained_backend_entries"] + p["entries_in_live_stores"] for p in policies))
        stores_alive = float(sum(p["stores_alive"] for p in policies))
    targets.append(
        _check(
            "every dropped policy mode's CacheStore collected (weak references dead)",
            "memory",
            "sum of memory.workloads.*.policy.stores_alive",
            "==",
            0,
            stores_alive,
        )
    )
    targets.append(
        _check(
            "zero backend entries retained by policy modes in the memory test",
            "memory",
            "sum of memory.workloads.*.policy retained_backend_entries + entries_in_live_stores",
            "==",
            0,
            retained,
        )
    )
    return targets
