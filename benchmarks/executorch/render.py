"""The ExecuTorch benchmark's results as Markdown: the timed run and the census."""

from __future__ import annotations

import statistics
from typing import Any

__all__ = ["render_census", "render_markdown", "render_split"]


def render_markdown(results: dict[str, Any]) -> str:
    """The result of :func:`~benchmarks.executorch.runner.run` as Markdown tables, one section per flow."""
    env, settings = results["environment"], results["settings"]
    lines = [
        f"ExecuTorch {env['executorch']}, torch {env['torch']}, model `{settings['model']}`; "
        f"{settings['repeats']} interleaved rounds after 1 warm-up, {env['cpu_count']} CPUs",
    ]
    for name, flow in results["flows"].items():
        configs = flow["configs"]
        lines += [
            "",
            f"### {name}: {flow['title']}, {flow['delegates']} delegate(s)",
            "",
            f"model: {flow.get('model_description', settings.get('model_description', '-'))}",
            "",
            "| config | median wall s | median CPU s | setup ms | (export + setup) / export | hits | misses |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        for config in configs:
            c = configs[config]
            lines.append(
                f"| {config} | {c['median_seconds']:.3f} | {c['median_cpu_seconds']:.3f} | "
                f"{c['median_setup_ms']:.1f} | {c.get('median_export_stage_ratio', float('nan')):.3f} | "
                f"{statistics.median(c['hits']):.0f} | "
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
    """The result of :func:`~benchmarks.executorch.census.census` as Markdown tables."""
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


def _s(seconds: float) -> str:
    return f"{seconds:.2f}"


def render_split(results: dict[str, Any]) -> str:
    """The result of :func:`~benchmarks.executorch.census.split_lowering` as Markdown tables."""
    settings, env = results["settings"], results["environment"]
    lines = [
        f"Split of one lowering, model `{settings['model']}`: {settings['rounds']} rounds after 1 warm-up, each "
        "lowering every configuration plain and under the dispatch recorder (Note [The split of a lowering] in "
        f"benchmarks/executorch/census.py); ExecuTorch {env['executorch']}, torch {env['torch']}, "
        f"{env['cpu_count']} CPUs, load average {env['load_average']}. CPU seconds (wall in parentheses), "
        "medians over rounds; fake-dispatch times with the recorder's calibrated share removed.",
    ]
    for name, flow in results["flows"].items():
        lines += [
            "",
            f"### {name}: {flow['title']}",
            "",
            f"model: {flow['model_description']}",
            "",
            "| config | plain lowering s | recorded lowering s | fake dispatch s | hits s (calls) | misses s (calls) "
            "| bypasses s (calls) | uncached s (calls) | on modes the policy does not reach s | rest s | "
            "time / time with fake dispatch free | plain / rest |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for config, c in flow["configs"].items():
            cpu, wall = c["summary"]["cpu"], c["summary"]["wall"]
            cells = []
            for outcome in ("hit", "miss", "bypass", "uncached"):
                calls = sum(c["calls"][kind][outcome] for kind in ("policy", "stock"))
                seconds = sum(cpu["parts"][kind][outcome] for kind in ("policy", "stock"))
                cells.append(f"{_s(seconds)} ({calls:,})")
            unreached = (
                f"{_s(sum(cpu['parts']['stock'].values()))} ({sum(c['calls']['stock'].values()):,} calls)"
                if config.startswith("policy")
                else "-"
            )
            lines.append(
                f"| {config} | {_s(cpu['plain'])} ({_s(wall['plain'])}) | {_s(cpu['total'])} ({_s(wall['total'])}) "
                f"| {_s(cpu['fake_net'])} ({_s(wall['fake_net'])}) | {' | '.join(cells)} | {unreached} "
                f"| {_s(cpu['rest'])} ({_s(wall['rest'])}) | {cpu['limit']:.3f} ({wall['limit']:.3f}) "
                f"| {cpu['plain_over_rest']:.3f} ({wall['plain_over_rest']:.3f}) |"
            )
        lines += ["", "| ratio (plain lowerings; rest: recorded) | CPU | wall |", "| --- | --- | --- |"]
        lines += [f"| {ratio} | {r['cpu']:.3f} | {r['wall']:.3f} |" for ratio, r in flow["ratios"].items()]
        calibration = flow["calibration"]
        overhead = {
            kind: statistics.median(cal[kind]["cpu_seconds"] for cal in calibration) * 1e6
            for kind in ("stock", "policy")
        }
        checks = [c["summary"]["cpu"]["check"] for c in flow["configs"].values()]
        policy_ok = all(p["ok"] for p in flow["policy_check"])
        lines += [
            "",
            f"Recorder overhead per dispatch (calibrated each round, median): stock {overhead['stock']:.1f} us, "
            f"policy {overhead['policy']:.1f} us CPU; (rest + fake dispatch) / plain lowering, per configuration: "
            + ", ".join(f"{x:.3f}" for x in checks)
            + f" (1 when the calibration holds); recorder's outcomes on the policy mode equal its counters: "
            f"{'yes' if policy_ok else 'NO'}; outputs identical: {'yes' if flow['identical'] else 'NO'}",
        ]
        for config in flow["configs"]:
            c = flow["configs"][config]
            if not config.startswith("policy") and config != "global-patch":
                continue
            lines += [
                "",
                f"Operators with the most exclusive fake-dispatch time under `{config}`, per outcome (per lowering; "
                "CPU ms, recorder's share included):",
                "",
                "| outcome | op | mode | calls | CPU ms |",
                "| --- | --- | --- | --- | --- |",
            ]
            for outcome in ("miss", "bypass", "uncached", "hit"):
                for row in c["ops"][outcome][: 8 if outcome != "hit" else 5]:
                    lines.append(
                        f"| {outcome} | `{row['op']}` | {row['kind']} | {row['calls']:.0f} | "
                        f"{row['cpu_seconds'] * 1e3:.1f} |"
                    )
            if c["bypass_reasons"]:
                lines += [
                    "",
                    "bypass reasons: "
                    + "; ".join(
                        f"`{r['op']}` {r['reason']} x{r['calls']:.0f} ({r['kind']})" for r in c["bypass_reasons"][:10]
                    ),
                ]
            if c["stock_modes"]:
                lines += [
                    "",
                    "stock modes dispatching: "
                    + "; ".join(f"{m['site']} ({m['calls']:.0f} dispatches)" for m in c["stock_modes"]),
                ]
    return "\n".join(lines)
