"""Charts (PNG) of the benchmarks' results, drawn with matplotlib when it is installed.

matplotlib is an optional extra of the benchmarks (``pip install -e
".[bench]"``; ``make bench`` installs it), never a dependency of the package.
Without it every function here draws nothing and :func:`write_charts` says
that the charts were skipped; the tables are printed and written all the same.

* :func:`replay_charts`: the replay benchmark's hit costs (a hit against the
  floor and the uncached or stock dispatch, per op) and replay times;
* :func:`executorch_charts`: the ExecuTorch benchmark's lowering times per
  flow and configuration, and the split of a lowering (stacked bars: the
  rest, and fake dispatch by outcome).

Every chart shows CPU time (``time.process_time``), which other processes on
a shared machine inflate least; the tables next to them have the wall times
too.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["INSTALL_HINT", "executorch_charts", "pyplot", "replay_charts", "write_charts"]

INSTALL_HINT = "pip install matplotlib, or the benchmarks' extra: pip install -e '.[bench]' (make bench installs it)"

_CONFIG_COLORS = {
    "stock": "#9e9e9e",
    "global-patch": "#e6a23c",
    "policy": "#3c78d8",
    "policy-isolated": "#7aa6ee",
    "floor": "#5cb85c",
}
# The hit-cost tables' variants: legend label and color.
_VARIANTS = {
    "policy_hit": ("policy hit", _CONFIG_COLORS["policy"]),
    "floor": ("floor (build the output only)", _CONFIG_COLORS["floor"]),
    "global_patch_hit": ("global-patch hit", _CONFIG_COLORS["global-patch"]),
    "stock_uncached": ("stock (uncached)", _CONFIG_COLORS["stock"]),
    "stock_hit": ("stock hit", _CONFIG_COLORS["stock"]),
}
_OUTCOME_COLORS = {
    "rest": "#d9d9d9",
    "hit": "#3c78d8",
    "miss": "#d9534f",
    "bypass": "#e6a23c",
    "uncached": "#8e7cc3",
    "unreached": "#444444",
}


def pyplot() -> Any | None:
    """``matplotlib.pyplot`` on the non-interactive Agg backend, or ``None`` when matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def write_charts(
    draw: Callable[[Any], list[Path]], emit: Callable[[str], None] | None = None
) -> list[Path]:
    """Runs ``draw(pyplot)`` and reports the files written, or that charts were skipped without matplotlib."""
    plt = pyplot()
    if plt is None:
        if emit is not None:
            emit(f"charts skipped: matplotlib is not installed ({INSTALL_HINT})")
        return []
    written = draw(plt)
    if emit is not None and written:
        emit("charts: " + ", ".join(str(p) for p in written))
    return written


def _bar_labels(ax: Any, bars: Any, fmt: str = "{:.1f}") -> None:
    for bar in bars:
        height = bar.get_height()
        ax.annotate(
            fmt.format(height),
            (bar.get_x() + bar.get_width() / 2, height),
            ha="center",
            va="bottom",
            fontsize=7,
            xytext=(0, 2),
            textcoords="offset points",
        )


def _grouped(
    ax: Any, groups: list[str], series: Mapping[str, list[float]], colors: Mapping[str, str], fmt: str = "{:.1f}"
) -> None:
    """Bars of each series side by side within each group."""
    n = max(len(series), 1)
    width = 0.8 / n
    for i, (name, values) in enumerate(series.items()):
        xs = [g + (i - (n - 1) / 2) * width for g in range(len(groups))]
        bars = ax.bar(xs, values, width, label=name, color=colors.get(name))
        _bar_labels(ax, bars, fmt)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups, fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)


def _save(plt: Any, fig: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def replay_charts(results: Mapping[str, Any], out_dir: Path) -> Callable[[Any], list[Path]]:
    """The replay benchmark's charts, for :func:`write_charts`: ``hitcost.png`` and ``replay.png`` in ``out_dir``."""

    def draw(plt: Any) -> list[Path]:
        written: list[Path] = []
        hit, aten = results.get("hit_cost") or {}, results.get("aten_hit_cost") or {}
        if hit or aten:
            panels = [(t, v) for t, v in (("backend ops", hit), ("aten ops", aten)) if v]
            fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.2), squeeze=False)
            for ax, (title, table) in zip(axes[0], panels, strict=True):
                ops = list(table)
                variants = list(next(iter(table.values()))["median_cpu_us"])
                series = {_VARIANTS[v][0]: [table[op]["median_cpu_us"][v] for op in ops] for v in variants}
                colors = {label: color for label, color in _VARIANTS.values()}
                _grouped(ax, [op.split(" ")[0].replace("::", "::\n") for op in ops], series, colors)
                against = "the global patch's hit and stock's uncached dispatch" if title == "backend ops" else "stock's hit"
                ax.set_title(f"One hit on {title}: the policy's against the floor, {against}", fontsize=9)
                ax.set_ylabel("CPU us per call (median)")
                ax.legend(fontsize=7)
            written.append(_save(plt, fig, out_dir / "hitcost.png"))
        workloads = results.get("workloads") or {}
        if workloads:
            names = list(workloads)
            configs = [c for c in ("stock", "global-patch", "policy") if all(c in w["configs"] for w in workloads.values())]
            series = {c: [workloads[w]["configs"][c]["median_cpu_ms_per_replay"] for w in names] for c in configs}
            fig, ax = plt.subplots(figsize=(7.5, 4.2))
            _grouped(ax, names, series, _CONFIG_COLORS, "{:.2f}")
            ax.set_ylabel("CPU ms per replay (median over rounds)")
            ax.set_title("ExportPass-style replay of each workload, by configuration", fontsize=9)
            ax.legend(fontsize=7)
            written.append(_save(plt, fig, out_dir / "replay.png"))
        return written

    return draw


def executorch_charts(results: Mapping[str, Any], out_dir: Path, stem: str) -> Callable[[Any], list[Path]]:
    """The ExecuTorch benchmark's charts, for :func:`write_charts`, in ``out_dir``:

    ``{stem}-lowering.png`` (the timed run: median CPU seconds of each flow's
    lowering per configuration, whiskers from the fastest to the slowest
    round, the ratio to stock above each bar) and ``{stem}-split.png`` (the
    split: per flow and configuration, the rest and fake dispatch by outcome
    as stacked bars, and "time / time with fake dispatch free" above each).
    """

    def draw(plt: Any) -> list[Path]:
        written: list[Path] = []
        flows = results.get("flows") or {}
        if flows:
            fig, axes = plt.subplots(1, len(flows), figsize=(max(3.6 * len(flows) + 0.8, 5.5), 4.2), squeeze=False)
            for ax, (name, flow) in zip(axes[0], flows.items(), strict=True):
                configs = list(flow["configs"])
                medians = [flow["configs"][c]["median_cpu_seconds"] for c in configs]
                lows = [m - min(flow["configs"][c]["cpu_seconds"]) for c, m in zip(configs, medians, strict=True)]
                highs = [max(flow["configs"][c]["cpu_seconds"]) - m for c, m in zip(configs, medians, strict=True)]
                bars = ax.bar(
                    range(len(configs)),
                    medians,
                    color=[_CONFIG_COLORS.get(c) for c in configs],
                    yerr=[lows, highs],
                    capsize=3,
                )
                stock = flow["configs"].get("stock", {}).get("cpu_seconds")
                for bar, config in zip(bars, configs, strict=True):
                    if stock and config != "stock":
                        ratios = [
                            a / b for a, b in zip(flow["configs"][config]["cpu_seconds"], stock, strict=True)
                        ]
                        text = f"{statistics.median(ratios):.2f}x"
                    else:
                        text = f"{bar.get_height():.2f} s"
                    ax.annotate(
                        text,
                        (bar.get_x() + bar.get_width() / 2, 0),
                        ha="center",
                        va="bottom",
                        fontsize=7,
                        xytext=(0, 3),
                        textcoords="offset points",
                        color="white",
                        fontweight="bold",
                    )
                ax.set_xticks(range(len(configs)))
                ax.set_xticklabels([c.replace("-", "-\n") for c in configs], fontsize=7)
                ax.set_title(f"{name}: {flow['delegates']} delegate(s)", fontsize=9)
                ax.set_ylabel("lowering CPU s (median; whiskers: min-max)", fontsize=8)
                ax.grid(axis="y", alpha=0.3)
                ax.set_axisbelow(True)
            model = results.get("settings", {}).get("model", "")
            fig.suptitle(
                f"ExecuTorch lowering CPU time by configuration, model {model}\n"
                "(in the bars: stock's median seconds, the others' median ratio to stock)",
                fontsize=9,
            )
            written.append(_save(plt, fig, out_dir / f"{stem}-lowering.png"))
        split = results.get("split")
        if split and split.get("flows"):
            written.append(_split_chart(plt, split, out_dir / f"{stem}-split.png"))
        return written

    return draw


def _split_chart(plt: Any, split: Mapping[str, Any], path: Path) -> Path:
    flows = split["flows"]
    width = max(4.6 * len(flows) + 2.6, 8.0)
    fig, axes = plt.subplots(1, len(flows), figsize=(width, 4.8), squeeze=False)
    for ax, (name, flow) in zip(axes[0], flows.items(), strict=True):
        configs = list(flow["configs"])
        bottoms = [0.0] * len(configs)
        segments = ["rest", "hit", "miss", "bypass", "uncached", "unreached"]
        for segment in segments:
            values = []
            for config in configs:
                cpu = flow["configs"][config]["summary"]["cpu"]
                if segment == "rest":
                    values.append(cpu["rest"])
                elif segment == "unreached":
                    # Stock modes under a policy configuration: the dispatches the policy does not reach.
                    values.append(sum(cpu["parts"]["stock"].values()) if config.startswith("policy") else 0.0)
                else:
                    stock_part = 0.0 if config.startswith("policy") else cpu["parts"]["stock"][segment]
                    values.append(cpu["parts"]["policy"][segment] + stock_part)
            values = [max(v, 0.0) for v in values]
            label = {
                "rest": "rest (no fake dispatch)",
                "hit": "fake dispatch: hits",
                "miss": "misses",
                "bypass": "bypasses",
                "uncached": "uncached (never reach the cache)",
                "unreached": "on modes the policy does not reach",
            }[segment]
            ax.bar(
                range(len(configs)),
                values,
                bottom=bottoms,
                color=_OUTCOME_COLORS[segment],
                label=label,
                width=0.6,
            )
            bottoms = [b + v for b, v in zip(bottoms, values, strict=True)]
        for i, config in enumerate(configs):
            limit = flow["configs"][config]["summary"]["cpu"]["limit"]
            ax.annotate(
                f"{limit:.3f}x\nof free",
                (i, bottoms[i]),
                ha="center",
                va="bottom",
                fontsize=7,
                xytext=(0, 2),
                textcoords="offset points",
            )
        ax.set_xticks(range(len(configs)))
        ax.set_xticklabels(configs, fontsize=8)
        ax.set_ylim(0, max(bottoms) * 1.15 if bottoms else 1)
        ax.set_title(f"{name}", fontsize=9)
        ax.set_ylabel("CPU s of one lowering (recorded; medians)", fontsize=8)
        ax.grid(axis="y", alpha=0.3)
        ax.set_axisbelow(True)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles[::-1], labels[::-1], loc="center right", fontsize=7)
    model = split.get("settings", {}).get("model", "")
    fig.suptitle(
        f"Where one lowering's time goes, model {model}: the rest and fake dispatch by outcome\n"
        "(above each bar: time / time with every fake dispatch free)",
        fontsize=9,
    )
    fig.tight_layout(rect=(0, 0, 1 - 2.6 / width, 0.92))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
