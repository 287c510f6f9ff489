"""The ExecuTorch benchmark's results as Markdown: the timed run and the census."""

from __future__ import annotations

import statistics
from typing import Any

__all__ = ["render_census", "render_markdown"]


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
