"""``python -m benchmarks.executorch``: command line, Markdown on stdout, JSON file, exit status."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.executorch.census import census
from benchmarks.executorch.flows import FLOWS
from benchmarks.executorch.lowering import CONFIGS
from benchmarks.executorch.models import MODELS
from benchmarks.executorch.render import render_census, render_markdown
from benchmarks.executorch.runner import run

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: runs :func:`run` (and :func:`census`), prints Markdown; 1 if outputs differed."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.executorch",
        description="Times ExecuTorch lowerings (Ethos-U55, Cortex-M, XNNPACK): stock vs global patch vs policy.",
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
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    args = parser.parse_args(argv)
    flows = list(FLOWS) if args.flow == "all" else [args.flow]
    progress = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    results: dict[str, Any] = {}
    ok = True
    if args.repeats:
        configs = [c for c in args.configs.split(",") if c]
        results = run(args.repeats, flows=flows, model=args.model, configs=configs, progress=progress)
        print(render_markdown(results))
        ok = all(all(f["identical"].values()) for f in results["flows"].values())
    if args.census:
        results["census"] = census(flows, model=args.model, progress=progress)
        print()
        print(render_census(results["census"]))
        ok &= all(f["identical"] for f in results["census"]["flows"].values())
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2, default=str) + "\n")
    return 0 if ok else 1
