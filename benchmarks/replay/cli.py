"""``python -m benchmarks.replay``: command line, output files, exit status."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from benchmarks.charts import replay_charts, write_charts
from benchmarks.progress import StderrProgress
from benchmarks.replay.render import render_markdown
from benchmarks.replay.suite import FULL, QUICK, run_benchmark
from benchmarks.replay.workloads import WORKLOAD_NAMES

__all__ = ["EXIT_CORRECTNESS", "EXIT_TARGETS", "main"]

EXIT_CORRECTNESS = 1
"""Exit status when a replay's output metadata differed or another correctness check failed."""
EXIT_TARGETS = 3
"""Exit status with ``--strict`` when a target was missed (2 is argparse's usage error)."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.replay",
        description=(
            "Times ExportPass-style FakeTensor replays under stock torch, the PR 21700 "
            "global-patch baseline and torch_cachepolicy's policy mode, interleaved; "
            "checks that every replay produces identical output metadata."
        ),
        epilog=f"exit status: 0 ok, {EXIT_CORRECTNESS} correctness failure, {EXIT_TARGETS} missed target with --strict",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="a run under a minute (fewer rounds, replays and modes); its timing figures are indicative, not judged",
    )
    p.add_argument(
        "--out",
        type=Path,
        help="directory to write results.md, results.json and, with matplotlib, hitcost.png and replay.png to",
    )
    p.add_argument("--strict", action="store_true", help="exit non-zero when a target is missed")
    p.add_argument(
        "--workloads",
        type=lambda s: tuple(x for x in s.split(",") if x),
        help=f"comma-separated subset of {','.join(WORKLOAD_NAMES)}",
    )
    p.add_argument("--rounds", type=int, help="measured rounds per workload")
    p.add_argument("--warmup-rounds", type=int, help="discarded rounds before them")
    p.add_argument("--replays", type=int, help="K: replays per series")
    p.add_argument("--memory-modes", type=int, help="modes per configuration in the memory test (0 skips it)")
    p.add_argument("--hit-batches", type=int, help="batches of the hit-cost measurement (0 skips it)")
    p.add_argument("--hit-calls", type=int, help="calls per hit-cost batch")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    args = parser.parse_args(args_list)
    settings = QUICK if args.quick else FULL
    overrides = {
        "rounds": args.rounds,
        "warmup_rounds": args.warmup_rounds,
        "replays": args.replays,
        "memory_modes": args.memory_modes,
        "hit_batches": args.hit_batches,
        "hit_calls": args.hit_calls,
        "workloads": args.workloads,
    }
    settings = dataclasses.replace(settings, **{k: v for k, v in overrides.items() if v is not None})
    unknown = [w for w in settings.workloads if w not in WORKLOAD_NAMES]
    if unknown:
        parser.error(f"unknown workloads {unknown}; choose from {', '.join(WORKLOAD_NAMES)}")
    if settings.rounds < 1 or settings.replays < 1 or settings.warmup_rounds < 0:
        parser.error("--rounds and --replays must be at least 1, --warmup-rounds at least 0")

    results = run_benchmark(settings, argv=args_list, progress=StderrProgress())
    markdown = render_markdown(results)
    print(markdown, end="")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.md").write_text(markdown)
        (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
        print(f"wrote {args.out / 'results.md'} and {args.out / 'results.json'}", file=sys.stderr)
        write_charts(replay_charts(results, args.out), emit=lambda line: print(line, file=sys.stderr))

    if not results["correctness"]["ok"]:
        return EXIT_CORRECTNESS
    if args.strict and any(t["status"] == "FAIL" for t in results["targets"]):
        return EXIT_TARGETS
    return 0
