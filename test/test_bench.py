# Owner(s): ["module: fakeTensor"]
"""Tests for benchmarks/replay, the stock / global-patch / policy benchmark.

Every workload runs for a tiny K under all three configurations. Nothing here
looks at how long anything took: timings are the benchmark's output, not
something a test can rely on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import io
import json
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any
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
from benchmarks.global_patch import backend_entries, global_patch
from benchmarks.replay import (
    BACKEND_NAMESPACES,
    CONFIG_KEYS,
    CONFIG_NAMES,
    EXIT_CORRECTNESS,
    EXIT_TARGETS,
    FULL,
    QUICK,
    RATIOS,
    TOP_LEVEL_KEYS,
    WORKLOAD_KEYS,
    WORKLOAD_NAMES,
    Settings,
    main,
)
from benchmarks.replay import runner as bench_runner
from benchmarks.replay import suite as bench_suite
from benchmarks.replay.audit import audit_configuration
from benchmarks.replay.configs import GlobalPatch, Policy, make_configurations
from benchmarks.replay.exportpass import fake_inputs, replay
from benchmarks.replay.metadata import capture, first_difference
from benchmarks.replay.runner import run_series, run_workload
from benchmarks.replay.targets import KINDS, STATUSES, Target, evaluate_targets, judges_timings
from benchmarks.replay.workloads import Workload, build_workload

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
        # Its hits and misses are aten's, which depend on what torch's class-wide cache already held (earlier tests,
        # and the release: torch 2.15 caches _unsafe_view); every backend dispatch bypasses.
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
        self.assertEqual(
            list(data["aten_hit_cost"]),
            ["aten::convolution", "aten::addmm (linear with bias)", "aten::relu", "aten::view"],
        )
        for op in data["aten_hit_cost"].values():
            for medians in (op["median_us"], op["median_cpu_us"]):
                self.assertEqual(set(medians), {"policy_hit", "floor", "stock_hit"})
        for per_config in data["memory"]["workloads"].values():
            self.assertEqual(set(per_config), set(CONFIG_NAMES))
            self.assertEqual(per_config["policy"]["stores_alive"], 0)
            self.assertEqual(per_config["policy"]["retained_backend_entries"], 0)
        for target in data["targets"]:
            self.assertEqual(
                set(target), {"name", "kind", "metric", "comparison", "threshold", "value", "status", "line"}
            )
            self.assertIn(target["kind"], KINDS)
            self.assertIn(target["status"], STATUSES)
        self.assertTrue(data["correctness"]["ok"], data["correctness"]["failures"])
        self.assertIn("| workload |", markdown)

    def test_mismatch_exits_nonzero(self) -> None:
        """A replay whose metadata differs fails the run whatever the timings."""
        with mock.patch.object(bench_runner, "first_difference", return_value="node x: got a, expected b"):
            rc = _quiet_main([*TINY_RUN, "--memory-modes", "0", "--hit-batches", "0", "--workloads", "aten-only"])
        self.assertEqual(rc, EXIT_CORRECTNESS)


def _synthetic_results(
    settings: Settings,
    *,
    ratio: float,
    policy_hits: int,
    patch_hits: int,
    names: Sequence[str] = ("qdq", "dialect", "aten-only"),
    policy_stale: int = 0,
    policy_relearnt: int = 0,
    policy_misses: int = 1,
) -> dict[str, Any]:
    """A results document with every time ratio equal to ``ratio`` and the given hit counts (and audit)."""

    def counts(hits: int, misses: int = 1) -> dict[str, Any]:
        return {"hits": hits, "misses": misses, "bypasses": 0, "bypass_reasons": {}}

    def audit(served: int, stale: int, relearnt: int) -> dict[str, Any]:
        return {"served": served, "stale": stale, "correct": served - stale, "relearnt": relearnt}

    workload = {
        "ratios": {name: {"median": ratio} for name, _, _ in RATIOS},
        "configs": {
            "policy": {"counts_per_round": [counts(policy_hits, policy_misses)] * 2},
            "global-patch": {"counts_per_round": [counts(patch_hits)] * 2},
        },
        "audit": {
            "policy": audit(policy_hits, policy_stale, policy_relearnt),
            "global-patch": audit(patch_hits, 0, 0),
        },
    }
    return {
        "settings": dataclasses.asdict(settings),
        "workloads": {name: workload for name in names},
        "memory": {},
    }


class TestTargetVerdicts(TestCase):
    """Note [Which targets a run may judge]: a quick run never judges timings."""

    def assertStatuses(self, results: dict[str, Any], kind: str, expected: set[str]) -> None:
        self.assertEqual({t.status for t in evaluate_targets(results) if t.kind == kind}, expected)

    def test_quick_settings_do_not_judge_timings(self) -> None:
        """The quick run is below the rounds a timing verdict needs; the full run is not."""
        self.assertFalse(judges_timings(dataclasses.asdict(QUICK)))
        self.assertTrue(judges_timings(dataclasses.asdict(FULL)))

    @parametrize("ratio", [0.5, 1.0, 3.0])
    def test_quick_run_reports_timings_as_indicative(self, ratio: float) -> None:
        """Whatever the quick run's ratios, its timing targets are INDICATIVE, never PASS or FAIL."""
        self.assertStatuses(
            _synthetic_results(QUICK, ratio=ratio, policy_hits=5, patch_hits=5), "timing", {"INDICATIVE"}
        )

    def test_full_run_judges_timings(self) -> None:
        """With the full run's rounds the same ratios get verdicts, a missed one FAIL."""
        self.assertStatuses(
            _synthetic_results(FULL, ratio=1.0, policy_hits=5, patch_hits=5), "timing", {"PASS", "FAIL"}
        )

    @parametrize("settings", [QUICK, FULL], name_fn=lambda s: "quick" if s is QUICK else "full")
    def test_counts_are_judged_by_every_run(self, settings: Settings) -> None:
        """Cache outcomes are exact: equal ones PASS and different ones FAIL, in a quick run too."""
        self.assertStatuses(_synthetic_results(settings, ratio=1.0, policy_hits=5, patch_hits=5), "counts", {"PASS"})
        differ = evaluate_targets(_synthetic_results(settings, ratio=1.0, policy_hits=5, patch_hits=6))
        self.assertEqual({t.status for t in differ if t.name.startswith("policy's hits, misses")}, {"FAIL"})

    @parametrize(
        "policy_hits, policy_misses, status", [(4, 2, "PASS"), (5, 2, "PASS"), (5, 1, "PASS"), (3, 3, "FAIL"), (4, 1, "FAIL")]
    )
    def test_counts_move_second_sights_to_misses(self, policy_hits: int, policy_misses: int, status: str) -> None:
        """A hit of the patch's may be the policy's second-sight miss (its first sight missed too), and a second
        sight's inner ops may add hits; any other difference FAILs."""
        results = _synthetic_results(QUICK, ratio=1.0, policy_hits=policy_hits, patch_hits=5, policy_misses=policy_misses)
        verdicts = {t.status for t in evaluate_targets(results) if t.name.startswith("policy's hits, misses")}
        self.assertEqual(verdicts, {status})

    @parametrize(
        "policy_hits, relearnt, second, status",
        [(5, 0, 1, "PASS"), (6, 0, 1, "PASS"), (4, 1, 1, "PASS"), (4, 0, 2, "PASS"), (3, 1, 2, "PASS"), (4, 0, 1, "FAIL")],
    )
    def test_symbolic_counts_need_the_patchs_right_hits(
        self, policy_hits: int, relearnt: int, second: int, status: str
    ) -> None:
        """On symbolic the policy serves every call the patch serves right, but a first call after new knowledge and
        a key's second sight (a miss more than the patch's one)."""
        results = _synthetic_results(
            FULL, ratio=1.0, policy_hits=policy_hits, patch_hits=5, names=("symbolic",), policy_relearnt=relearnt,
            policy_misses=second,
        )
        verdicts = {t.name: t.status for t in evaluate_targets(results)}
        name = (
            "policy serves every call global-patch serves right on symbolic, "
            "but a node's first call after new ShapeEnv knowledge and a key's second sight"
        )
        self.assertEqual(verdicts[name], status)
        self.assertEqual(verdicts["policy at most 0.75x global-patch on symbolic"], "FAIL")  # ratio 1.0

    def test_a_stale_served_call_fails(self) -> None:
        """One served call that an uncached dispatch answers differently fails the run's counts."""
        results = _synthetic_results(QUICK, ratio=1.0, policy_hits=5, patch_hits=5, names=("qdq",), policy_stale=1)
        verdicts = {t.name: t.status for t in evaluate_targets(results)}
        self.assertEqual(verdicts["every call the policy's cache served equals an uncached dispatch on qdq"], "FAIL")


    def test_short_run_prints_no_fail_and_says_why(self) -> None:
        """A one-round run with --strict judges counts and memory only, exits 0, and says its timings are indicative."""
        with tempfile.TemporaryDirectory() as out:
            self.assertEqual(_quiet_main([*TINY_RUN, "--strict", "--out", out]), 0)
            markdown = (Path(out) / "results.md").read_text()
            data = json.loads((Path(out) / "results.json").read_text())
        self.assertNotRegex(markdown, r"(?m)^FAIL ")
        self.assertIn("INDICATIVE", markdown)
        self.assertIn("Indicative figures", markdown)
        statuses = {t["kind"]: set() for t in data["targets"]}
        for t in data["targets"]:
            statuses[t["kind"]].add(t["status"])
        # qdq is not in the tiny run: its speed-up target is SKIP (not measured).
        self.assertEqual(statuses, {"timing": {"INDICATIVE", "SKIP"}, "counts": {"PASS"}, "memory": {"PASS"}})
        self.assertExpectedInline(
            markdown.rstrip().splitlines()[-1],
            """Summary: 6 targets judged: 6 PASS, 0 FAIL; 10 timing targets indicative only (too few rounds to judge); 1 not measured; correctness ok.""",
        )

    def test_strict_fails_on_a_judged_target(self) -> None:
        """--strict exits EXIT_TARGETS when a judged (counts) target fails."""

        def failing_counts(results: dict[str, Any]) -> list[Target]:
            return [
                dataclasses.replace(t, status="FAIL") if t.kind == "counts" else t for t in evaluate_targets(results)
            ]

        with mock.patch.object(bench_suite, "evaluate_targets", failing_counts):
            rc = _quiet_main([*TINY_RUN, "--strict", "--memory-modes", "0", "--hit-batches", "0"])
        self.assertEqual(rc, EXIT_TARGETS)


class TestDispatchRecorder(TestCase):
    """benchmarks/dispatch_recorder.py, the test-only census the ExecuTorch tier relies on."""

    def _dispatch_twice(self, mode: _ft.FakeTensorMode) -> None:
        """One quantize_per_tensor (a backend op) twice and one aten add, under ``mode``."""
        import torch.ao.quantization.fx._decomposed  # noqa: F401  (defines quantized_decomposed)

        with mode:
            x = torch.empty(4)
            for _ in range(2):
                torch.ops.quantized_decomposed.quantize_per_tensor(x, 0.1, 0, -128, 127, torch.int8)
            torch.add(x, x)

    def test_attributes_dispatches_to_mode_kind_and_namespace(self) -> None:
        """Dispatches are counted per phase, mode kind and namespace; modes are listed with their phase."""
        from benchmarks.dispatch_recorder import recording

        with recording() as census:
            with census.in_phase("a"):
                self._dispatch_twice(_ft.FakeTensorMode())
            with census.in_phase("b"):
                self._dispatch_twice(
                    tcp.FakeTensorMode(cache_policy=tcp.CachePolicy(namespaces=["quantized_decomposed"]))
                )
        self.assertEqual(census.total(phase="a", kind="stock", namespaces={"quantized_decomposed"}).calls, 2)
        self.assertEqual(census.total(phase="b", kind="policy", namespaces={"quantized_decomposed"}).calls, 2)
        self.assertEqual(census.total(phase="b", kind="stock").calls, 0)
        self.assertGreater(census.total(phase="a", kind="stock", namespaces={"aten"}).outer_calls, 0)
        self.assertEqual([(m.kind, m.phase) for m in census.modes], [("stock", "a"), ("policy", "b")])
        self.assertEqual(census.modes[0].calls, census.total(phase="a").calls)

    def test_counts_stock_non_builtin_bypasses(self) -> None:
        """A stock mode's "non-builtin" bypasses are attributed to the backend op; a policy mode's are not counted."""
        from benchmarks.dispatch_recorder import recording

        with recording() as census:
            self._dispatch_twice(_ft.FakeTensorMode())
            self._dispatch_twice(tcp.FakeTensorMode(cache_policy=tcp.CachePolicy(namespaces=["quantized_decomposed"])))
        self.assertEqual(census.total(kind="stock", namespaces={"quantized_decomposed"}).non_builtin, 2)
        self.assertEqual(census.total(kind="stock", namespaces={"aten"}).non_builtin, 0)
        self.assertEqual(census.total(kind="policy").non_builtin, 0)

    def test_classifies_policy_dispatches_by_outcome(self) -> None:
        """With outcomes=True, a policy mode's backend dispatches are classified from its own counters: misses, hits."""
        from benchmarks.dispatch_recorder import OUTCOMES, recording

        mode = tcp.FakeTensorMode(cache_policy=tcp.CachePolicy(namespaces=["quantized_decomposed"]))
        with recording(outcomes=True) as census:
            for _ in range(2):  # the key's first sight and the miss that makes its entry, then two hits
                self._dispatch_twice(mode)
        backend = {"quantized_decomposed"}
        counts = {o: census.exclusive(kind="policy", namespaces=backend, outcome=o).calls for o in OUTCOMES}
        self.assertEqual(counts, {"hit": 2, "miss": 2, "bypass": 0, "uncached": 0})

    def test_restores_torch(self) -> None:
        """FakeTensorMode's __init__ and __torch_dispatch__ are torch's own again after the scope."""
        from benchmarks.dispatch_recorder import recording

        init, dispatch = _ft.FakeTensorMode.__init__, _ft.FakeTensorMode.__torch_dispatch__
        with recording():
            self.assertIsNot(_ft.FakeTensorMode.__init__, init)
        self.assertIs(_ft.FakeTensorMode.__init__, init)
        self.assertIs(_ft.FakeTensorMode.__torch_dispatch__, dispatch)


class TestExecutorchPackage(TestCase):
    """benchmarks/executorch imports and builds its models without ExecuTorch."""

    def test_models_run(self) -> None:
        """Both models run on their example input and give 10 logits."""
        from benchmarks import executorch as flow

        for name in flow.MODELS:
            model, example, description = flow.build_model(name)
            self.assertEqual(tuple(model(*example).shape), (1, 10), name)
            self.assertTrue(description)

    def test_large_model_is_larger(self) -> None:
        """The large model has many more convolutions than the tiny one."""
        from benchmarks import executorch as flow

        def convs(name: str) -> int:
            return sum(isinstance(m, torch.nn.Conv2d) for m in flow.build_model(name)[0].modules())

        self.assertEqual(convs("tiny"), 2)
        self.assertGreaterEqual(convs("large"), 20)

    def test_flows_and_errors(self) -> None:
        """FLOWS names the four flows; unknown flows and models are rejected."""
        from benchmarks import executorch as flow

        self.assertEqual(sorted(flow.FLOWS), ["cortex-m", "ethos-u55", "xnnpack", "xnnpack-dynamic"])
        self.assertIs(flow.get_flow("xnnpack"), flow.FLOWS["xnnpack"])
        with self.assertRaisesRegex(ValueError, "unknown flow"):
            flow.get_flow("hexagon")
        with self.assertRaisesRegex(ValueError, "model must be one of"):
            flow.build_model("huge")


_AUDIT_NS = "tcp_bench_audit"
_audit_lib = torch.library.Library(_AUDIT_NS, "DEF")  # noqa: TOR901
_audit_lib.define("pure(Tensor x) -> Tensor")
_audit_lib.define("counter(Tensor x) -> Tensor")
_counter_calls = [0]


@torch.library.register_fake(f"{_AUDIT_NS}::pure", lib=_audit_lib)
def _pure(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


@torch.library.register_fake(f"{_AUDIT_NS}::counter", lib=_audit_lib)
def _counter(x: torch.Tensor) -> torch.Tensor:
    _counter_calls[0] += 1  # undeclared state: every uncached dispatch answers another shape
    return x.new_empty(_counter_calls[0])


def _one_op_workload(op: torch._ops.OpOverload) -> Workload:
    graph = torch.fx.Graph()
    graph.output(graph.call_function(op, (graph.placeholder("x"),)))
    return Workload("audit", "one op", torch.fx.GraphModule(torch.nn.Module(), graph), (torch.ones(4),))


class TestAudit(TestCase):
    @parametrize("name, stale", [("pure", 0), ("counter", 2)])
    def test_audit_reruns_every_served_call(self, name: str, stale: int) -> None:
        """The audit re-runs each served call uncached and counts those that differ (a stateful kernel's)."""
        op = getattr(torch.ops, _AUDIT_NS).__getattr__(name).default
        # Four replays: the key's first sight, the miss that makes its entry, two served calls.
        audit = audit_configuration(Policy((_AUDIT_NS,)), _one_op_workload(op), replays=4)
        self.assertEqual((audit.served, audit.stale), (2, stale))


instantiate_parametrized_tests(TestBenchReplays)
instantiate_parametrized_tests(TestGlobalPatchBaseline)
instantiate_parametrized_tests(TestTargetVerdicts)
instantiate_parametrized_tests(TestAudit)

if __name__ == "__main__":
    run_tests()
