"""The figures of test/test_opinfo_crosscheck.py's op_db sweep, over every OpInfo.

The per-op tests (``test_op_db_<op>_cpu``) each assert on their own op; the
totals of a whole sweep (ops and samples compared, skips by reason, hits,
misses and bypass reasons per policy mode, and the C++ key builder's share of
the stock calls' keys with its fallbacks by reason) are figures, not
assertions, so they are computed here. It runs the test module's
``sweep_op`` on each OpInfo of ``op_db`` and prints one JSON object (also
written to ``--out`` when given). Run it from the repository root::

    python -m benchmarks.opdb_sweep [--full] [--shard i/n] [--out figures.json]

``--full`` takes every sample (``TCP_FULL_OPDB=1``), ``--shard i/n`` every
n-th OpInfo from the i-th (``TCP_OPDB_SHARD``). The exit status is 1 if any
sample failed its crosscheck or key parity (the lines are printed to stderr).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import pathlib
import sys
import time
import warnings
from typing import Any

TEST_DIR = pathlib.Path(__file__).resolve().parent.parent / "test"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.opdb_sweep", description=__doc__.split("\n\n")[0])
    parser.add_argument("--full", action="store_true", help="every sample of each op and dtype")
    parser.add_argument("--shard", default="0/1", help="i/n: every n-th OpInfo, from the i-th")
    parser.add_argument("--out", type=pathlib.Path, help="also write the figures here")
    args = parser.parse_args(argv)
    # Read by test_opinfo_crosscheck at import.
    os.environ["TCP_OPDB_SHARD"] = args.shard
    if args.full:
        os.environ["TCP_FULL_OPDB"] = "1"
    sys.path.insert(0, str(TEST_DIR))
    # By name: the test module is not part of the type-checked code.
    sweep: Any = importlib.import_module("test_opinfo_crosscheck")

    start = time.perf_counter()
    tally = sweep.Tally()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for opinfo in sweep.OPS:
            tally.add(sweep.sweep_op(opinfo, "cpu"))
    figures = {**tally.figures(), "seconds": round(time.perf_counter() - start, 1)}
    text = json.dumps(figures, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text)
    for line in [*tally.failures, *tally.keys.differences]:
        print(line, file=sys.stderr)
    return 1 if tally.failures or tally.keys.differences or tally.stock_vs_uncached else 0


if __name__ == "__main__":
    sys.exit(main())
