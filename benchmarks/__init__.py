"""Benchmark suites of torch_cachepolicy; not part of the installed package.

Run each from the repository root (the directory holding ``benchmarks/``),
with ``torch_cachepolicy`` installed:

* ``python -m benchmarks.replay [--quick]``: ExportPass-style FakeTensor
  replays under stock torch, the PR 21700 global-patch baseline and a policy
  mode, with hit costs and memory retention (``make bench``, ``make bench-full``);
* ``python -m benchmarks.executorch``: ExecuTorch 1.5.1's lowerings
  (Ethos-U55, Cortex-M, XNNPACK) under the same configurations (needs
  ``requirements-executorch.txt``);
* ``python -m benchmarks.export_stage``, ``python -m benchmarks.hitcost_trees
  BEFORE AFTER`` and ``python -m benchmarks.opdb_sweep``: the export stage,
  the hit cost of two checkouts, the op_db sweep's figures.

``benchmarks/README.md`` indexes every figure the docs quote to its command.

:mod:`benchmarks.global_patch` is the baseline both compare against:
the only code in the repository that writes torch's global state, which is
why it lives here and not in the library. :mod:`benchmarks.timing` is the
one timer every suite measures with.
"""
