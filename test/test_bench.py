# Owner(s): ["module: fakeTensor"]
"""Tests for torch_cachepolicy.bench, the stock / global-patch / policy benchmark.

Every workload runs for a tiny K under all three configurations. Nothing here
looks at how long anything took: timings are the benchmark's output, not
something a test can rely on.
"""

from __future__ import annotations

import contextlib
import gc
import io
import json
import tempfile
from pathlib import Path
from unittest import mock

import torch
import torch._library.utils as library_utils
from torch._subclasses import fake_tensor as _ft
from torch.fx.experimental.symbolic_shapes import ShapeEnv
from torch.testing._internal.common_utils import (
    TestCase,
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
)

import torch_cachepolicy as tcp
from torch_cachepolicy.bench import (
    BACKEND_NAMESPACES,
    CONFIG_KEYS,
    CONFIG_NAMES,
    EXIT_CORRECTNESS,
    RATIOS,
    TOP_LEVEL_KEYS,
    WORKLOAD_KEYS,
    WORKLOAD_NAMES,
    main,
)
from torch_cachepolicy.bench import runner as bench_runner
from torch_cachepolicy.bench.configs import GlobalPatch, Policy, make_configurations
from torch_cachepolicy.bench.global_patch import backend_entries, global_patch
from torch_cachepolicy.bench.metadata import capture, first_difference
from torch_cachepolicy.bench.replay import fake_inputs, replay
from torch_cachepolicy.bench.runner import run_series, run_workload
from torch_cachepolicy.bench.workloads import build_workload

K = 2  # replays per series: the second replay is where caches answer
TINY_RUN = [
    "--workloads", "dialect,aten-only",
    "--rounds", "1", "--warmup-rounds", "0", "--replays", "2",
    "--memory-modes", "3", "--hit-batches", "1", "--hit-calls", "2",
]  # fmt: skip


def _quiet_main(argv: list[str]) -> int:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return main(argv)


def setUpModule() -> None:
    # The runner collects garbage before every series; frozen, the objects
    # torch's import left behind are not rescanned each time (as run_benchmark does).
    gc.collect()
    gc.freeze()


def tearDownModule() -> None:
    gc.unfreeze()


class TestBenchReplays(TestCase):
    @parametrize("name", WORKLOAD_NAMES)
    def test_outputs_identical_across_configurations(self, name: str) -> None:
        """Every replay under every configuration yields the same node metadata."""
        run = run_workload(
            build_workload(name), make_configurations(BACKEND_NAMESPACES), rounds=1, warmup_rounds=0, replays=K
        )
        self.assertEqual(run.mismatches, [])
        self.assertEqual(run.mismatch_count, 0)
        # The first replay is the reference; all others were compared with it.
        self.assertEqual(run.replays_checked, len(CONFIG_NAMES) * K - 1)
        self.assertEqual(set(run.series), set(CONFIG_NAMES))

    @parametrize("name", ["qdq", "dialect", "symbolic"])
    def test_policy_hits_backend_ops(self, name: str) -> None:
        """The policy mode serves every backend node of a second replay from its cache."""
        workload = build_workload(name)
        mode = Policy(BACKEND_NAMESPACES).make_mode(ShapeEnv() if workload.dynamic_batch else None)
        assert isinstance(mode, tcp.FakeTensorMode)
        replay(workload.graph, mode, fake_inputs(mode, workload), K)
        per_namespace = mode.cache_report().by_namespace()
        backend = [per_namespace[ns] for ns in BACKEND_NAMESPACES if ns in per_namespace]
        hits = sum(h for h, _, _ in backend)
        bypasses = sum(b for _, _, b in backend)
        self.assertGreaterEqual(hits, workload.backend_nodes())
        self.assertEqual(bypasses, 0)
        self.assertEqual(hits + sum(m for _, m, _ in backend), K * workload.backend_nodes())

    def test_stock_never_caches_backend_ops(self) -> None:
        """Stock bypasses every backend dispatch, so the comparison is against uncached work."""
        series, _ = run_series(make_configurations(BACKEND_NAMESPACES)[0], build_workload("dialect"), K)
        self.assertEqual(series.counts.misses, 0)
        self.assertEqual(series.counts.bypass_reasons, {"non-builtin": K * build_workload("dialect").backend_nodes()})

    def test_mismatch_is_detected(self) -> None:
        """Outputs with different strides are reported, naming the first differing node."""
        workload = build_workload("aten-only")
        envs = []
        for channels_last in (False, True):
            mode = _ft.FakeTensorMode(allow_non_fake_inputs=True)
            inputs: list[torch.Tensor] = list(fake_inputs(mode, workload))
            if channels_last:
                inputs[-1] = inputs[-1].contiguous(memory_format=torch.channels_last)
            envs.append(capture(workload.graph, replay(workload.graph, mode, inputs, 1)[0]))
        self.assertIsNone(first_difference(envs[0], envs[0]))
        diff = first_difference(envs[0], envs[1])
        self.assertIsNotNone(diff)
        self.assertIn("node ", diff or "")


class TestGlobalPatchBaseline(TestCase):
    def test_patches_the_attribute_fake_tensor_reads(self) -> None:
        """fake_tensor.py's library_utils is the module the baseline patches."""
        self.assertIs(_ft.library_utils, library_utils)  # type: ignore[attr-defined]
        self.assertIs(torch._library.utils, library_utils)

    @parametrize("name", ["qdq", "dialect", "symbolic"])
    def test_restores_is_builtin_and_leaves_no_backend_entries(self, name: str) -> None:
        """After a global-patch series torch's is_builtin is back and the class cache holds no backend entry."""
        original = library_utils.is_builtin
        series, _ = run_series(GlobalPatch(BACKEND_NAMESPACES), build_workload(name), K)
        self.assertIs(library_utils.is_builtin, original)
        self.assertEqual(backend_entries(_ft.FakeTensorMode.cache, BACKEND_NAMESPACES), [])
        # It did cache backend ops while active: the comparison is against a working baseline.
        self.assertGreater(series.counts.hits, 0)
        self.assertNotIn("non-builtin", series.counts.bypass_reasons)

    def test_restores_is_builtin_after_an_error(self) -> None:
        """The swap is undone when the scope exits with an exception."""
        original = library_utils.is_builtin
        op = torch.ops.quantized_decomposed.quantize_per_tensor.default
        with self.assertRaisesRegex(RuntimeError, "inside the scope"):
            with global_patch(BACKEND_NAMESPACES):
                self.assertIsNot(library_utils.is_builtin, original)
                self.assertTrue(library_utils.is_builtin(op))
                raise RuntimeError("inside the scope")
        self.assertIs(library_utils.is_builtin, original)
        self.assertFalse(library_utils.is_builtin(op))


class TestBenchCommand(TestCase):
    def test_results_json_has_documented_keys(self) -> None:
        """A tiny run writes results.md and a results.json with every documented key."""
        with tempfile.TemporaryDirectory() as out:
            self.assertEqual(_quiet_main([*TINY_RUN, "--out", out]), 0)
            data = json.loads((Path(out) / "results.json").read_text())
            markdown = (Path(out) / "results.md").read_text()
        self.assertLessEqual(set(TOP_LEVEL_KEYS), set(data))
        self.assertEqual(list(data["workloads"]), ["dialect", "aten-only"])
        for workload in data["workloads"].values():
            self.assertLessEqual(set(WORKLOAD_KEYS), set(workload))
            self.assertEqual(set(workload["configs"]), set(CONFIG_NAMES))
            for config in workload["configs"].values():
                self.assertLessEqual(set(CONFIG_KEYS), set(config))
                self.assertLessEqual({"hits", "misses", "bypasses", "bypass_reasons"}, set(config["counts"]))
            for ratios in (workload["ratios"], workload["ratios_cpu_time"]):
                self.assertEqual(set(ratios), {name for name, _, _ in RATIOS})
                for ratio in ratios.values():
                    self.assertEqual(set(ratio), {"per_round", "median", "of_medians"})
            self.assertTrue(workload["metadata_check"]["identical"])
        for op in data["hit_cost"].values():
            for medians in (op["median_us"], op["median_cpu_us"]):
                self.assertEqual(set(medians), {"policy_hit", "floor", "global_patch_hit", "stock_uncached"})
        for per_config in data["memory"]["workloads"].values():
            self.assertEqual(set(per_config), set(CONFIG_NAMES))
            self.assertEqual(per_config["policy"]["stores_alive"], 0)
            self.assertEqual(per_config["policy"]["retained_backend_entries"], 0)
        for target in data["targets"]:
            self.assertEqual(set(target), {"name", "metric", "comparison", "threshold", "value", "status", "line"})
            self.assertIn(target["status"], ("PASS", "FAIL", "SKIP"))
        self.assertTrue(data["correctness"]["ok"], data["correctness"]["failures"])
        self.assertIn("| workload |", markdown)

    def test_mismatch_exits_nonzero(self) -> None:
        """A replay whose metadata differs fails the run whatever the timings."""
        with mock.patch.object(bench_runner, "first_difference", return_value="node x: got a, expected b"):
            rc = _quiet_main([*TINY_RUN, "--memory-modes", "0", "--hit-batches", "0", "--workloads", "aten-only"])
        self.assertEqual(rc, EXIT_CORRECTNESS)


instantiate_parametrized_tests(TestBenchReplays)
instantiate_parametrized_tests(TestGlobalPatchBaseline)

if __name__ == "__main__":
    run_tests()
