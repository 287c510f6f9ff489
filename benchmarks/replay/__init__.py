"""Benchmark of FakeTensor replay: stock torch vs the PR 21700 baseline vs a policy mode.

Run ``python -m benchmarks.replay [--quick] [--out DIR] [--strict]`` from the
repository root (``make bench`` runs the quick run, ``make bench-full`` the full one).

Three configurations are interleaved in one process (rotating which goes first
each round; warm-up rounds discarded):

* ``stock``: ``torch._subclasses.fake_tensor.FakeTensorMode`` as shipped;
* ``global-patch``: ExecuTorch PR 21700's process-global ``is_builtin`` swap,
  reimplemented in :mod:`benchmarks.global_patch` as a labelled
  baseline (the only code in the repository that writes torch globals);
* ``policy``: ``torch_cachepolicy.FakeTensorMode(cache_policy=CachePolicy(namespaces=...))``.

Each series creates one mode, makes fake inputs with ``mode.from_tensor`` and
times K ExportPass-style replays of a workload graph (``qdq``, ``dialect``,
``aten-only``, ``symbolic``; see :mod:`.workloads`). Every replay's output
metadata (shape, dtype, stride, storage offset, device, storage sharing of
every node) must match; a mismatch makes the run exit 1. Targets are printed
as PASS/FAIL lines and only fail the run with ``--strict`` (exit 3). Cache
outcomes and memory retention are judged by every run; timing targets only by
a run of at least 18 rounds of 20 replays (the full run). The quick run
(``--quick``, 6 rounds of 5 replays, about 30 s) prints its timing figures as
``INDICATIVE``, without a verdict (Note [Which targets a run may judge] in
:mod:`.targets`).

``results.json`` (with ``--out``) has the keys in :data:`TOP_LEVEL_KEYS`:

* ``schema``, ``environment``, ``settings``;
* ``workloads[name]``: the keys in :data:`WORKLOAD_KEYS`; ``configs[config]``
  has the keys in :data:`CONFIG_KEYS` (per-round seconds of the K replays,
  medians, hits/misses/bypasses of one series); ``ratios[name]`` for each
  of :data:`RATIOS` has ``per_round``, ``median`` and ``of_medians``;
* ``hit_cost[op]``: median microseconds per call (``median_us`` wall,
  ``median_cpu_us`` process CPU) of a policy hit, the floor (building the
  output FakeTensor from metadata), a global-patch hit and the stock
  (uncached) dispatch, and their ratios;
* ``memory``: entries retained after N short-lived modes per configuration
  (see :mod:`.memory` for the definition);
* ``targets``: ``name``, ``kind`` (timing/counts/memory), ``metric``,
  ``comparison``, ``threshold``, ``value``, ``status``
  (PASS/FAIL/SKIP/INDICATIVE), ``line``;
* ``correctness``: ``ok``, ``failures``, ``checks``.
"""

from benchmarks.replay.cli import EXIT_CORRECTNESS, EXIT_TARGETS, main
from benchmarks.replay.configs import CONFIG_NAMES
from benchmarks.replay.results import CONFIG_KEYS, RATIOS, TOP_LEVEL_KEYS, WORKLOAD_KEYS
from benchmarks.replay.suite import FULL, QUICK, Settings, run_benchmark
from benchmarks.replay.workloads import BACKEND_NAMESPACES, WORKLOAD_NAMES

__all__ = [
    "BACKEND_NAMESPACES",
    "CONFIG_KEYS",
    "CONFIG_NAMES",
    "EXIT_CORRECTNESS",
    "EXIT_TARGETS",
    "FULL",
    "QUICK",
    "RATIOS",
    "Settings",
    "TOP_LEVEL_KEYS",
    "WORKLOAD_KEYS",
    "WORKLOAD_NAMES",
    "main",
    "run_benchmark",
]
