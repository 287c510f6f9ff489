"""The results document as Markdown."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from benchmarks.replay.targets import TIMING_VERDICT_MIN_REPLAYS, TIMING_VERDICT_MIN_ROUNDS, judges_timings

__all__ = ["render_markdown", "verdict_summary"]

_CONFIGS = ("stock", "global-patch", "policy")


def _row(cells: list[object]) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _table(header: list[str], rows: list[list[object]]) -> list[str]:
    return [_row(list(header)), _row(["---"] * len(header)), *(_row(r) for r in rows)]


def _timing(results: Mapping[str, Any]) -> list[str]:
    rows: list[list[object]] = []
    for name, w in results["workloads"].items():
        ms = [f"{w['configs'][c]['median_ms_per_replay']:.2f}" if c in w["configs"] else "-" for c in _CONFIGS]
        ratios = w["ratios"]
        rows.append(
            [
                name,
                f"{w['call_function_nodes']} ({w['backend_nodes']})",
                *ms,
                f"{ratios['stock/policy']['median']:.2f}x" if "stock/policy" in ratios else "-",
                f"{ratios['stock/global-patch']['median']:.2f}x" if "stock/global-patch" in ratios else "-",
                f"{ratios['policy/global-patch']['median']:.3f}" if "policy/global-patch" in ratios else "-",
                f"{ratios['policy/stock']['median']:.3f}" if "policy/stock" in ratios else "-",
                "identical" if w["metadata_check"]["identical"] else "MISMATCH",
            ]
        )
    return _table(
        [
            "workload",
            "nodes (backend)",
            "stock ms/replay",
            "global-patch ms/replay",
            "policy ms/replay",
            "stock/policy",
            "stock/global-patch",
            "policy/global-patch",
            "policy/stock",
            "output metadata",
        ],
        rows,
    )


def _cpu_ratios(results: Mapping[str, Any]) -> list[str]:
    rows: list[list[object]] = []
    for name, w in results["workloads"].items():
        r = w["ratios_cpu_time"]
        rows.append(
            [name]
            + [
                f"{r[k]['median']:.3f}" if k in r else "-"
                for k in ("stock/policy", "stock/global-patch", "policy/global-patch", "policy/stock")
            ]
        )
    return _table(["workload", "stock/policy", "stock/global-patch", "policy/global-patch", "policy/stock"], rows)


def _counts(results: Mapping[str, Any]) -> list[str]:
    rows: list[list[object]] = []
    for name, w in results["workloads"].items():
        for config, c in w["configs"].items():
            counts = c["counts"]
            reasons = ", ".join(f"{k}: {v}" for k, v in counts["bypass_reasons"].items()) or "-"
            same = "" if c["counts_identical_across_rounds"] else " (varies by round)"
            rows.append([name, config, counts["hits"], counts["misses"], counts["bypasses"], reasons + same])
    return _table(["workload", "configuration", "hits", "misses", "bypasses", "bypass reasons"], rows)


def _hit_cost(results: Mapping[str, Any]) -> list[str]:
    rows: list[list[object]] = []
    for op, h in results["hit_cost"].items():
        us = h["median_us"]
        rows.append(
            [
                op,
                f"{us['policy_hit']:.1f}",
                f"{us['floor']:.1f}",
                f"{h['policy_hit_over_floor']:.2f}x",
                f"{h['policy_hit_over_floor_cpu']:.2f}x",
                f"{us['global_patch_hit']:.1f}",
                f"{h['policy_hit_over_global_patch_hit']:.3f}",
                f"{us['stock_uncached']:.1f}",
                f"{h['stock_uncached_over_policy_hit']:.2f}x",
            ]
        )
    return _table(
        [
            "op",
            "policy hit us",
            "floor us",
            "hit/floor",
            "hit/floor (CPU time)",
            "global-patch hit us",
            "policy hit/global-patch hit",
            "stock (uncached) us",
            "stock/policy hit",
        ],
        rows,
    )


def _aten_hit_cost(results: Mapping[str, Any]) -> list[str]:
    rows: list[list[object]] = []
    for op, h in results["aten_hit_cost"].items():
        us, cpu = h["median_us"], h["median_cpu_us"]
        rows.append(
            [
                op,
                f"{us['policy_hit']:.1f}",
                f"{us['stock_hit']:.1f}",
                f"{h['policy_hit_over_stock_hit']:.3f}",
                f"{h['policy_hit_over_stock_hit_cpu']:.3f}",
                f"{cpu['floor']:.1f}",
                f"{h['policy_hit_over_floor_cpu']:.2f}x",
            ]
        )
    return _table(
        [
            "op",
            "policy hit us",
            "stock hit us",
            "policy hit/stock hit",
            "policy hit/stock hit (CPU time)",
            "floor CPU us",
            "hit/floor (CPU time)",
        ],
        rows,
    )


def _memory(memory: Mapping[str, Any]) -> list[str]:
    rows: list[list[object]] = []
    for name, per_config in memory["workloads"].items():
        for config, m in per_config.items():
            stores = (
                "-" if m["stores_alive"] is None else f"{m['stores_alive']} ({m['entries_in_live_stores']} entries)"
            )
            rows.append(
                [
                    name,
                    config,
                    m["modes"],
                    m["modes_alive"],
                    stores,
                    m["class_cache_growth"]["backend"],
                    m["backend_keys_outside_class_cache"],
                    m["retained_backend_entries"],
                    m["class_cache_growth"]["builtin"],
                ]
            )
    return _table(
        [
            "workload",
            "configuration",
            "modes",
            "modes alive",
            "stores alive",
            "backend entries added to class cache",
            "backend keys elsewhere",
            "backend entries retained",
            "builtin entries added to class cache (shared, as stock)",
        ],
        rows,
    )


def _timing_caveat(settings: Mapping[str, Any]) -> list[str]:
    if judges_timings(settings):
        return []
    return [
        "Indicative figures: this run is too short for timing verdicts (see Targets).",
        "",
    ]


def render_markdown(results: Mapping[str, Any]) -> str:
    """The tables of the results document, then the target lines."""
    s = results["settings"]
    env = results["environment"]
    lines = [
        "# FakeTensor replay: stock vs global-patch (PR 21700 baseline) vs policy",
        "",
        f"torch {env['torch']}, Python {env['python']}, {env['cpu_count']} CPUs. "
        f"{s['rounds']} measured rounds (+{s['warmup_rounds']} warm-up) of {s['replays']} replays per "
        "series, configurations interleaved (rounds cycle through all 6 orders); per-replay times are medians over "
        "rounds, ratios are medians of per-round ratios (time ratios: stock/policy > 1 means policy "
        "is faster, policy/global-patch < 1 means policy is faster).",
        "",
        "## Replay time",
        "",
        *_timing_caveat(s),
        *_timing(results),
        "",
        "The same ratios on process CPU time (`time.process_time`, not inflated by time other "
        "processes take from this one); the targets use the wall-time ratios above.",
        "",
        *_cpu_ratios(results),
        "",
        "## Cache outcomes per series (one mode, K replays)",
        "",
        *_counts(results),
    ]
    if results.get("hit_cost"):
        lines += [
            "",
            "## Cost of one hit on a backend op (median per call)",
            "",
            *_timing_caveat(s),
            *_hit_cost(results),
        ]
    if results.get("aten_hit_cost"):
        lines += [
            "",
            "## Cost of one hit on an aten op (median per call; stock caches these too)",
            "",
            *_aten_hit_cost(results),
        ]
    audited = [(name, w["audit"]) for name, w in results["workloads"].items() if w.get("audit")]
    if audited:
        lines += [
            "",
            "## Audit: served calls re-run uncached (one untimed series per caching configuration)",
            "",
            "| workload | configuration | served | stale | first calls after new ShapeEnv knowledge |",
            "| --- | --- | ---: | ---: | ---: |",
            *(
                f"| {name} | {config} | {a['served']} | {a['stale']} | {a['relearnt']} |"
                for name, audit in audited
                for config, a in audit.items()
            ),
        ]
    memory = results.get("memory")
    if memory:
        cal = memory["scan_calibration"]
        lines += [
            "",
            f"## Entries retained after {memory['modes']} short-lived modes",
            "",
            *_memory(memory),
            "",
            f"Heap-scan calibration: a live policy mode holding {cal['live_store_entries']} entries "
            f"showed {cal['backend_keys_seen_by_scan']} backend keys outside the class cache.",
        ]
    lines += ["", "## Targets", ""]
    if not judges_timings(s):
        lines += [_indicative_note(s), ""]
    lines += ["```", *(t["line"] for t in results["targets"]), "```"]
    correctness = results["correctness"]
    lines += ["", "## Correctness", ""]
    if correctness["ok"]:
        lines.append("All checks passed: " + "; ".join(correctness["checks"]) + ".")
    else:
        lines += ["FAILED:", "", *(f"- {f}" for f in correctness["failures"])]
    lines += ["", verdict_summary(results)]
    return "\n".join(lines) + "\n"


def _indicative_note(settings: Mapping[str, Any]) -> str:
    return (
        f"This run measured {settings['rounds']} rounds of {settings['replays']} replays: it judges cache outcomes, "
        "correctness and memory retention, which are exact, but not timings. Its time ratios swing by tens of "
        "percent from one short run to the next on a loaded machine, so the timing targets are shown as "
        f"INDICATIVE, without a verdict; a run of at least {TIMING_VERDICT_MIN_ROUNDS} rounds of "
        f"{TIMING_VERDICT_MIN_REPLAYS} replays (the full run: `python -m benchmarks.replay`, `make bench-full`) "
        "judges them."
    )


def verdict_summary(results: Mapping[str, Any]) -> str:
    """One closing line: what was judged and how it fared, and what was only indicative."""
    statuses = [t["status"] for t in results["targets"]]
    judged = [s for s in statuses if s in ("PASS", "FAIL")]
    parts = [f"{len(judged)} targets judged: {judged.count('PASS')} PASS, {judged.count('FAIL')} FAIL"]
    if "INDICATIVE" in statuses:
        parts.append(f"{statuses.count('INDICATIVE')} timing targets indicative only (too few rounds to judge)")
    if "SKIP" in statuses:
        parts.append(f"{statuses.count('SKIP')} not measured")
    parts.append("correctness " + ("ok" if results["correctness"]["ok"] else "FAILED"))
    return "Summary: " + "; ".join(parts) + "."
