# Owner(s): ["module: fakeTensor"]
"""The split of a lowering (``python -m benchmarks.executorch --split``) and the tools around it.

* the dispatch recorder's outcomes (``recording(outcomes=True)``): each
  dispatch's own cache outcome and exclusive time, which add up to the
  outermost dispatches' time (no ExecuTorch needed);
* ``split_lowering`` on the tiny Cortex-M flow, one round (needs ExecuTorch:
  ``make test-executorch``);
* charts skipped without matplotlib, drawn with it; the bench extra read from
  setup.py; progress estimates.
"""

from __future__ import annotations

import io
import math
import tempfile
import unittest
from contextlib import redirect_stderr
from pathlib import Path
from typing import Any, ClassVar
from unittest import mock

import torch
from torch._subclasses import fake_tensor as _ft
from torch.testing._internal.common_utils import TestCase, run_tests

import torch_cachepolicy as tcp
from benchmarks import charts, executorch, extras, progress
from benchmarks.dispatch_recorder import OUTCOMES, overhead_per_dispatch, recording

HAS_EXECUTORCH = executorch.executorch_version() == executorch.EXECUTORCH_VERSION

# A backend op whose fake kernel dispatches other ops: its inner dispatches nest inside it.
_LIB = torch.library.Library("tcp_split_test", "DEF")
_LIB.define("double(Tensor x) -> Tensor")
torch.library.register_fake("tcp_split_test::double", lambda x: torch.empty_like(x) * 2, lib=_LIB)


def _quantize_twice_and_linear(mode: _ft.FakeTensorMode) -> None:
    """A backend op twice and linear (its decomposition: t and addmm), under ``mode``."""
    import torch.ao.quantization.fx._decomposed  # noqa: F401  (defines quantized_decomposed)

    with mode:
        x = torch.empty(4, 8)
        for _ in range(2):
            torch.ops.quantized_decomposed.quantize_per_tensor(x, 0.1, 0, -128, 127, torch.int8)
        torch.nn.functional.linear(x, torch.empty(3, 8))


class TestRecorderOutcomes(TestCase):
    """benchmarks/dispatch_recorder.py with outcomes on."""

    def test_outcomes_per_mode_kind(self) -> None:
        """A stock mode bypasses the backend op ("non-builtin"); a policy mode misses twice (first sight, entry), then hits."""
        with recording(outcomes=True) as census:
            _quantize_twice_and_linear(_ft.FakeTensorMode())
            policy_mode = tcp.FakeTensorMode(cache_policy=tcp.CachePolicy(namespaces=["quantized_decomposed"]))
            for _ in range(2):
                _quantize_twice_and_linear(policy_mode)
        backend = {"quantized_decomposed"}
        self.assertEqual(census.exclusive(kind="stock", namespaces=backend, outcome="bypass").calls, 2)
        self.assertEqual(census.exclusive(kind="policy", namespaces=backend, outcome="miss").calls, 2)
        self.assertEqual(census.exclusive(kind="policy", namespaces=backend, outcome="hit").calls, 2)
        self.assertEqual(census.total(kind="stock", namespaces=backend).non_builtin, 2)
        reasons = {(r["kind"], r["op"], r["reason"]) for r in census.bypass_reason_rows()}
        self.assertIn(("stock", "quantized_decomposed.quantize_per_tensor.default", "non-builtin"), reasons)
        # The recorder's counts on the policy mode are the mode's own.
        info = policy_mode.cache_info()
        self.assertEqual(census.exclusive(kind="policy", outcome="hit").calls, info.hits)
        self.assertEqual(census.exclusive(kind="policy", outcome="miss").calls, info.misses)
        self.assertEqual(census.exclusive(kind="policy", outcome="bypass").calls, sum(info.bypasses.values()))
        self.assertTrue({row["outcome"] for row in census.outcome_rows()} <= set(OUTCOMES))

    def test_exclusive_times_add_up_to_outermost(self) -> None:
        """Exclusive times of all dispatches add up to the outermost dispatches' inclusive time; calls agree too."""
        with recording(outcomes=True) as census:
            for mode in (_ft.FakeTensorMode(), tcp.FakeTensorMode(cache_policy=tcp.CachePolicy())):
                _quantize_twice_and_linear(mode)
                with mode:
                    torch.ops.tcp_split_test.double(torch.empty(3))
        total, exclusive = census.total(), census.exclusive()
        self.assertEqual(total.calls, exclusive.calls)
        self.assertGreater(total.calls, total.outer_calls)  # the double kernel's inner ops are nested
        # The kernel's own time excludes its inner ops'; each dispatch counted once.
        double = census.total(namespaces={"tcp_split_test"})
        self.assertEqual(double.calls, 2)
        self.assertLess(census.exclusive(namespaces={"tcp_split_test"}).cpu_seconds, double.outer_cpu_seconds)
        self.assertAlmostEqual(total.outer_seconds, exclusive.seconds, delta=1e-9 * total.calls)
        self.assertAlmostEqual(total.outer_cpu_seconds, exclusive.cpu_seconds, delta=1e-9 * total.calls)
        self.assertTrue(all(row["seconds"] >= 0 for row in census.op_outcome_rows()))

    def test_outcomes_off_records_what_it_did(self) -> None:
        """Without outcomes the outcome tables stay empty and the tallies are as before."""
        with recording() as census:
            _quantize_twice_and_linear(_ft.FakeTensorMode())
        self.assertEqual(census.outcomes, {})
        self.assertEqual(census.total(namespaces={"quantized_decomposed"}).non_builtin, 2)

    def test_overhead_is_measured_per_kind(self) -> None:
        """overhead_per_dispatch returns finite wall and CPU seconds for both mode kinds."""
        overhead = overhead_per_dispatch(batches=3, calls=50)
        self.assertEqual(set(overhead), {"stock", "policy"})
        for figures in overhead.values():
            self.assertEqual(set(figures), {"seconds", "cpu_seconds"})
            self.assertTrue(all(math.isfinite(v) for v in figures.values()))


class TestChartsAndTools(TestCase):
    """benchmarks/charts.py, benchmarks/extras.py and benchmarks/progress.py."""

    def test_charts_skipped_without_matplotlib(self) -> None:
        """Without matplotlib nothing is drawn and the run says so."""
        lines: list[str] = []
        with mock.patch.object(charts, "pyplot", lambda: None):
            written = charts.write_charts(charts.replay_charts({"hit_cost": {"x": {}}}, Path("unused")), lines.append)
        self.assertEqual(written, [])
        self.assertEqual(len(lines), 1)
        self.assertIn("charts skipped: matplotlib is not installed", lines[0])

    @unittest.skipIf(charts.pyplot() is None, "matplotlib is not installed (the bench extra)")
    def test_replay_charts_drawn(self) -> None:
        """With matplotlib the hit-cost and replay charts are written as PNG files."""
        results = {
            "hit_cost": {
                "quantized_decomposed::quantize_per_tensor": {
                    "median_cpu_us": {"policy_hit": 34.0, "floor": 15.0, "global_patch_hit": 87.0, "stock_uncached": 280.0}
                }
            },
            "aten_hit_cost": {"aten::relu": {"median_cpu_us": {"policy_hit": 23.0, "floor": 15.0, "stock_hit": 69.0}}},
            "workloads": {
                "qdq": {"configs": {c: {"median_cpu_ms_per_replay": 1.0} for c in ("stock", "global-patch", "policy")}}
            },
        }
        with tempfile.TemporaryDirectory() as tmp:
            written = charts.write_charts(charts.replay_charts(results, Path(tmp)))
            self.assertEqual([p.name for p in written], ["hitcost.png", "replay.png"])
            self.assertTrue(all(p.read_bytes().startswith(b"\x89PNG") for p in written))

    def test_bench_extra_read_from_setup_py(self) -> None:
        """The Makefile installs exactly setup.py's pinned bench extra: matplotlib."""
        (requirement,) = extras.extra_requirements("bench")
        self.assertRegex(requirement, r"^matplotlib==\d+\.\d+\.\d+$")
        with self.assertRaisesRegex(KeyError, "no extra 'nope'"):
            extras.extra_requirements("nope")
        with redirect_stderr(io.StringIO()):
            self.assertEqual(extras.main(["nope"]), 1)

    def test_rounds_estimate(self) -> None:
        """Rounds reports each round with the rounds done and an estimate of the time left."""
        lines: list[str] = []
        rounds = progress.Rounds(4, lines.append)
        self.assertTrue(math.isnan(rounds.estimate_left()))
        rounds.done("a")
        rounds.done("b")
        self.assertEqual(len(lines), 2)
        self.assertRegex(lines[1], r"^b; 2/4 rounds done, about \d+ s left$")
        self.assertEqual(progress.format_seconds(42), "42 s")
        self.assertEqual(progress.format_seconds(600), "10.0 min")


@unittest.skipUnless(HAS_EXECUTORCH, "ExecuTorch 1.5.1 is not installed: make test-executorch installs it")
class TestSplitLowering(TestCase):
    """split_lowering on the tiny Cortex-M flow, one round (about 10 s)."""

    result: ClassVar[dict[str, Any]]

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls.result = executorch.split_lowering(["cortex-m"], model="tiny", rounds=1)

    def test_outputs_identical_and_counts_agree(self) -> None:
        """Every lowering gave the same program; the recorder's outcomes on the policy mode are the mode's counters."""
        flow = self.result["flows"]["cortex-m"]
        self.assertTrue(flow["identical"])
        self.assertTrue(all(check["ok"] for check in flow["policy_check"]), flow["policy_check"])

    def test_split_adds_up(self) -> None:
        """Per configuration the parts add up to the fake-dispatch time, and the limit is (rest + fake) / rest."""
        flow = self.result["flows"]["cortex-m"]
        for config, c in flow["configs"].items():
            (split,) = c["splits"]
            for clock in ("wall", "cpu"):
                s = split[clock]
                parts = sum(sum(by_outcome.values()) for by_outcome in s["parts"].values())
                self.assertAlmostEqual(parts, s["fake_net"], delta=1e-6, msg=(config, clock))
                self.assertAlmostEqual(s["rest"], s["total"] - s["fake"], delta=1e-9)
                self.assertAlmostEqual(s["limit"], (s["rest"] + s["fake_net"]) / s["rest"], delta=1e-9)
                self.assertGreater(s["limit"], 1.0)

    def test_unreached_modes_in_policy_configuration(self) -> None:
        """Under the policy, the only stock-mode dispatches are the documented Cortex-M scratch-buffer mode's."""
        policy = self.result["flows"]["cortex-m"]["configs"]["policy"]
        stock_calls = sum(policy["calls"]["stock"].values())
        self.assertGreater(sum(policy["calls"]["policy"].values()), 0)
        self.assertEqual(stock_calls, sum(m["calls"] for m in policy["stock_modes"]))
        for m in policy["stock_modes"]:
            self.assertIn("executorch/backends/cortex_m/passes/aten_to_cortex_m_pass.py", m["site"])

    def test_renders(self) -> None:
        """The split renders as Markdown with the distance to the limit per configuration."""
        text = executorch.render_split(self.result)
        self.assertIn("time / time with fake dispatch free", text)
        for config in ("stock", "global-patch", "policy"):
            self.assertIn(f"| {config} |", text)


if __name__ == "__main__":
    run_tests()
