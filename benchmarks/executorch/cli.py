"""``python -m benchmarks.executorch``: command line, Markdown on stdout, JSON file, exit status."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.charts import executorch_charts, write_charts
from benchmarks.executorch.census import SPLIT_CONFIGS, census, split_lowering
from benchmarks.executorch.flows import FLOWS
from benchmarks.executorch.lowering import CONFIGS
from benchmarks.executorch.models import MODELS
from benchmarks.executorch.render import render_census, render_markdown, render_split
from benchmarks.executorch.runner import run
from benchmarks.progress import StderrProgress

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: runs :func:`run` (and :func:`census`, :func:`split_lowering`), prints Markdown; 1 if outputs differed."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.executorch",
        description="Times ExecuTorch lowerings (Ethos-U55, Cortex-M, XNNPACK, XNNPACK with a dynamic sequence "
        "length): stock vs global patch vs policy.",
    )
    parser.add_argument("--flow", choices=[*FLOWS, "all"], default="ethos-u55", help="default ethos-u55")
    parser.add_argument("--model", choices=MODELS, default="tiny", help="default tiny")
    parser.add_argument("--repeats", type=int, default=5, help="measured rounds per flow (default 5; 0: no timing)")
    parser.add_argument(
        "--configs",
        default=",".join(CONFIGS),
        help=f"comma-separated subset of {','.join(CONFIGS)} (default: all)",
    )
    parser.add_argument("--census", action="store_true", help="also count dispatches on unreached modes")
    parser.add_argument(
        "--split",
        action="store_true",
        help="also split one lowering's time into fake dispatch (hits, misses, bypasses; per mode) and the rest, "
        "and report how far each configuration is from free fake dispatch",
    )
    parser.add_argument("--split-rounds", type=int, default=3, help="measured rounds of --split (default 3)")
    parser.add_argument(
        "--json",
        type=Path,
        help="also write the results as JSON here, the tables next to it (same name, .md) and, with matplotlib, "
        "charts (NAME-lowering.png, NAME-split.png)",
    )
    args = parser.parse_args(argv)
    flows = list(FLOWS) if args.flow == "all" else [args.flow]
    progress = StderrProgress()
    results: dict[str, Any] = {}
    tables: list[str] = []
    ok = True
    if args.repeats:
        configs = [c for c in args.configs.split(",") if c]
        results = run(args.repeats, flows=flows, model=args.model, configs=configs, progress=progress)
        tables.append(render_markdown(results))
        print(tables[-1])
        ok = all(all(f["identical"].values()) for f in results["flows"].values())
    if args.census:
        results["census"] = census(flows, model=args.model, progress=progress)
        tables.append(render_census(results["census"]))
        print()
        print(tables[-1])
        ok &= all(f["identical"] for f in results["census"]["flows"].values())
    if args.split:
        split_configs = [c for c in args.configs.split(",") if c in SPLIT_CONFIGS] or list(SPLIT_CONFIGS)
        results["split"] = split_lowering(
            flows, model=args.model, rounds=args.split_rounds, configs=split_configs, progress=progress
        )
        tables.append(render_split(results["split"]))
        print()
        print(tables[-1])
        ok &= all(f["identical"] for f in results["split"]["flows"].values())
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2, default=str) + "\n")
        markdown = args.json.with_suffix(".md")
        markdown.write_text("\n\n".join(tables) + "\n")
        progress(f"wrote {args.json} and {markdown}")
        write_charts(executorch_charts(results, args.json.parent, args.json.stem), emit=progress)
    return 0 if ok else 1
