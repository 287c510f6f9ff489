"""Hit cost of two or more checkouts of the package, measured interleaved.

``python -m benchmarks.hitcost_trees BEFORE AFTER [--rounds N]`` takes
source trees of ``torch_cachepolicy`` (each with its ``_C`` built in place,
e.g. ``git worktree add /tmp/before <commit> && cd /tmp/before && python
setup.py build_ext --inplace``) and measures, in one fresh process per tree
and round, the trees taking turns, the CPU time per call of a policy hit of
each op of the benchmark's hit-cost tables (:mod:`benchmarks.replay.hitcost`,
under the Python dispatcher for backend ops as ExportPass runs them) and of
the floor (building the same output as torch builds a hit's output) in the
same process, and for aten ops of a stock FakeTensorMode's hit. It prints,
per op, the median over rounds of each tree's hit/floor (and hit/stock hit
for aten ops) and the ratio of each tree's median to the first tree's. The
measuring code is this checkout's; only the package comes from each tree.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Runs in the child: the package from the tree in argv[1], this checkout's benchmarks.
_CHILD = r"""
import json, statistics, sys
batches, calls, misses = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
from torch._dispatch.python import enable_python_dispatcher
from torch._subclasses.fake_tensor import FakeTensorMode
import torch_cachepolicy as tcp
from benchmarks.replay import dialect, hitcost
from benchmarks.timing import timed

def cpu_per_call(fn):
    with timed(collect=False) as t:
        fn()
    return t.cpu_seconds / calls

out = {}
cases = [(c, True) for c in hitcost.hit_cases()] + [(c, False) for c in hitcost.aten_hit_cases()]
for case, backend in cases:
    namespaces = [dialect.NAMESPACE, "quantized_decomposed"] if backend else []
    mode = tcp.FakeTensorMode(cache_policy=tcp.CachePolicy(namespaces=namespaces), allow_non_fake_inputs=True)
    args = case.make_args(mode)
    def hits():
        with mode:
            if backend:
                with enable_python_dispatcher():
                    for _ in range(calls):
                        case.op(*args)
            else:
                for _ in range(calls):
                    case.op(*args)
    with mode:
        if backend:
            with enable_python_dispatcher():
                sample = case.op(*args)
        else:
            sample = case.op(*args)
    floor = hitcost._floor(mode, sample, calls)
    # For aten ops, stock's own hit too (a stock mode caches them): hit/stock.
    stock = None
    if not backend:
        stock_mode = FakeTensorMode(allow_non_fake_inputs=True)
        stock_args = case.make_args(stock_mode)
        def stock():
            with stock_mode:
                for _ in range(calls):
                    case.op(*stock_args)
        stock()
    hit_s, floor_s, stock_s = [], [], []
    for b in range(batches):
        before = mode.cache_report()[case.op].hits
        for which in ((0, 1, 2) if b % 2 == 0 else (2, 1, 0)):
            if which == 0:
                hit_s.append(cpu_per_call(hits))
            elif which == 1:
                floor_s.append(cpu_per_call(floor))
            elif stock is not None:
                stock_s.append(cpu_per_call(stock))
        assert mode.cache_report()[case.op].hits - before == calls, case.label
    row = {"hit_us": statistics.median(hit_s) * 1e6, "floor_us": statistics.median(floor_s) * 1e6}
    if stock_s:
        row["stock_hit_us"] = statistics.median(stock_s) * 1e6
    if misses:
        # A miss on its own: each call in a mode (with an isolated store) that has not seen it, against the
        # same call in a mode with its cache off; modes and inputs are made before the clock starts.
        def fresh(cache):
            m = tcp.FakeTensorMode(cache_policy=tcp.CachePolicy(namespaces=namespaces), allow_non_fake_inputs=True,
                                   cache_store=tcp.CacheStore(isolated=True))
            m.cache_enabled = cache
            return m, case.make_args(m)
        miss_s, uncached_s = [], []
        for b in range(batches):
            for cache, sink in ((True, miss_s), (False, uncached_s)):
                pairs = [fresh(cache) for _ in range(misses)]
                def run():
                    for m, a in pairs:
                        with m:
                            if backend:
                                with enable_python_dispatcher():
                                    case.op(*a)
                            else:
                                case.op(*a)
                with timed(collect=True) as t:
                    run()
                sink.append(t.cpu_seconds / misses)
        row["miss_us"] = statistics.median(miss_s) * 1e6
        row["uncached_us"] = statistics.median(uncached_s) * 1e6
    out[case.label] = row
print(json.dumps(out))
"""


def _measure(tree: Path, batches: int, calls: int, misses: int) -> dict[str, dict[str, float]]:
    with tempfile.TemporaryDirectory() as tmp:
        os.symlink(tree / "torch_cachepolicy", Path(tmp) / "torch_cachepolicy")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([tmp, str(ROOT)]))
        done = subprocess.run(
            [sys.executable, "-c", _CHILD, str(batches), str(calls), str(misses)],
            env=env,
            cwd=tmp,
            capture_output=True,
            text=True,
        )
    if done.returncode != 0:
        raise RuntimeError(f"measuring {tree} failed:\n{done.stderr[-3000:]}")
    result: dict[str, dict[str, float]] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _print_stock_ratios(trees: list[Path], samples: dict[str, list[dict[str, dict[str, float]]]], ops: list[str]) -> None:
    """For aten ops: the median over rounds of each tree's policy hit / stock hit (same process)."""
    aten = [op for op in ops if "stock_hit_us" in samples[str(trees[0])][0][op]]
    if not aten:
        return
    print("| aten op | " + " | ".join(f"{t.name} hit/stock hit" for t in trees) + " |")
    print("|" + " --- |" * (1 + len(trees)))
    for op in aten:
        cells = [
            f"{statistics.median(s[op]['hit_us'] / s[op]['stock_hit_us'] for s in samples[str(t)]):.3f}" for t in trees
        ]
        print(f"| {op} | " + " | ".join(cells) + " |")
    print()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.hitcost_trees", description=__doc__.split("\n\n")[0])
    p.add_argument("trees", nargs="+", type=Path, help="source trees; the first is the reference")
    p.add_argument("--rounds", type=int, default=6, help="processes per tree, interleaved")
    p.add_argument("--batches", type=int, default=9, help="timed batches per op and process")
    p.add_argument("--calls", type=int, default=200, help="calls per batch")
    p.add_argument("--misses", type=int, default=0, help="also time misses: calls per batch (0: hits only)")
    p.add_argument("--json", type=Path, help="write the raw samples here")
    args = p.parse_args(argv)
    trees = [t.resolve() for t in args.trees]
    samples: dict[str, list[dict[str, dict[str, float]]]] = {str(t): [] for t in trees}
    for r in range(args.rounds):
        order = trees if r % 2 == 0 else trees[::-1]
        for tree in order:
            samples[str(tree)].append(_measure(tree, args.batches, args.calls, args.misses))
        print(f"[round {r + 1}/{args.rounds}]", file=sys.stderr, flush=True)
    ops = list(samples[str(trees[0])][0])
    ref = str(trees[0])
    _print_stock_ratios(trees, samples, ops)
    header = "| op | " + " | ".join(f"{t.name} hit us (hit/floor)" for t in trees)
    header += "".join(f" | {t.name}/{trees[0].name}" for t in trees[1:]) + " |"
    print(header)
    print("|" + " --- |" * (1 + 2 * len(trees) - 1))
    for op in ops:
        cells, ratios = [], []
        med = {}
        for t in trees:
            rows = samples[str(t)]
            hit = statistics.median(s[op]["hit_us"] for s in rows)
            norm = statistics.median(s[op]["hit_us"] / s[op]["floor_us"] for s in rows)
            med[str(t)] = norm
            cells.append(f"{hit:.1f} ({norm:.2f})")
        for t in trees[1:]:
            ratios.append(f"{med[str(t)] / med[ref]:.3f}")
        print(f"| {op} | " + " | ".join(cells) + "".join(f" | {r}" for r in ratios) + " |")
    if args.misses:
        print()
        print("| op | " + " | ".join(f"{t.name} miss us (miss/uncached)" for t in trees)
              + "".join(f" | {t.name}/{trees[0].name}" for t in trees[1:]) + " |")
        print("|" + " --- |" * (1 + 2 * len(trees) - 1))
        for op in ops:
            miss_cells: list[str] = []
            norms: dict[str, float] = {}
            for t in trees:
                rows = samples[str(t)]
                miss = statistics.median(s[op]["miss_us"] for s in rows)
                norms[str(t)] = statistics.median(s[op]["miss_us"] / s[op]["uncached_us"] for s in rows)
                miss_cells.append(f"{miss:.1f} ({norms[str(t)]:.2f})")
            miss_ratios = "".join(f" | {norms[str(t)] / norms[ref]:.3f}" for t in trees[1:])
            print(f"| {op} | " + " | ".join(miss_cells) + miss_ratios + " |")
    if args.json:
        args.json.write_text(json.dumps(samples, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
