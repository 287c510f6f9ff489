"""The performance and retention targets, evaluated from the results document."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["Target", "evaluate_targets"]


@dataclass(frozen=True)
class Target:
    """One target and how the measurement fared.

    Attributes:
        name: what is promised, in words.
        metric: where the value comes from in the results document.
        comparison: ``">="``, ``"<="`` or ``"=="``.
        threshold: the promised bound.
        value: the measured value, or None when it was not measured.
        status: ``"PASS"``, ``"FAIL"`` or ``"SKIP"`` (not measured in this run).
    """

    name: str
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


def _check(name: str, metric: str, comparison: str, threshold: float, value: float | None) -> Target:
    if value is None:
        return Target(name, metric, comparison, threshold, None, "SKIP")
    ok = {
        ">=": value >= threshold,
        "<=": value <= threshold,
        "==": value == threshold,
    }[comparison]
    return Target(name, metric, comparison, threshold, value, "PASS" if ok else "FAIL")


def _ratio(workloads: Mapping[str, Any], workload: str, ratio: str) -> float | None:
    entry = workloads.get(workload, {}).get("ratios", {}).get(ratio)
    return None if entry is None else float(entry["median"])


def evaluate_targets(results: Mapping[str, Any]) -> list[Target]:
    """The targets of the tracker issue, each computed from the measurements."""
    workloads = results.get("workloads", {})
    targets = [
        _check(
            "policy at least 2x faster than stock on dialect",
            "workloads.dialect.ratios['stock/policy'].median",
            ">=",
            2.0,
            _ratio(workloads, "dialect", "stock/policy"),
        ),
        _check(
            "policy at least 1.5x faster than stock on qdq",
            "workloads.qdq.ratios['stock/policy'].median",
            ">=",
            1.5,
            _ratio(workloads, "qdq", "stock/policy"),
        ),
    ]
    for name in workloads:
        targets.append(
            _check(
                f"policy no slower than global-patch on {name}",
                f"workloads.{name}.ratios['policy/global-patch'].median",
                "<=",
                1.02,
                _ratio(workloads, name, "policy/global-patch"),
            )
        )
    targets.append(
        _check(
            "policy within 3% of stock on aten-only (no more than 3% slower)",
            "workloads['aten-only'].ratios['policy/stock'].median",
            "<=",
            1.03,
            _ratio(workloads, "aten-only", "policy/stock"),
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
            "sum of memory.workloads.*.policy.stores_alive",
            "==",
            0,
            stores_alive,
        )
    )
    targets.append(
        _check(
            "zero backend entries retained by policy modes in the memory test",
            "sum of memory.workloads.*.policy retained_backend_entries + entries_in_live_stores",
            "==",
            0,
            retained,
        )
    )
    return targets
