# Owner(s): ["module: fakeTensor"]
"""torch_cachepolicy.export in ExecuTorch's Ethos-U55 pt2e flow (benchmarks/export_stage.py).

Needs ExecuTorch: ``make test-executorch`` installs it (``pip install
--no-deps -r requirements-executorch.txt``) and runs this file.
"""

from __future__ import annotations

import unittest
from typing import Any, ClassVar

from torch._subclasses.fake_tensor import _DispatchCacheBypassEntry
from torch.testing._internal.common_utils import TestCase, run_tests

import torch_cachepolicy as tcp
from benchmarks import executorch, export_stage
from torch_cachepolicy import _driver
from torch_cachepolicy.recipes.executorch import executorch_policy

HAS_EXECUTORCH = executorch.executorch_version() == executorch.EXECUTORCH_VERSION


@unittest.skipUnless(HAS_EXECUTORCH, "ExecuTorch 1.5.1 is not installed: make test-executorch installs it")
class TestExportStage(TestCase):
    flows: ClassVar[dict[str, dict[str, Any]]]

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        policy = executorch_policy()
        cls.flows = {config: export_stage.pt2e_flow(config, policy=policy) for config in export_stage.CONFIGS}

    def test_same_quantized_program(self) -> None:
        """The re-exported quantized program has stock's graph code and belongs to a policy mode."""
        self.assertEqual(self.flows["policy"]["code"], self.flows["stock"]["code"])
        self.assertIn("quantized_decomposed", self.flows["stock"]["code"])
        self.assertIsInstance(executorch.program_mode(self.flows["policy"]["program"]), tcp.FakeTensorMode)
        self.assertNotIsInstance(executorch.program_mode(self.flows["stock"]["program"]), tcp.FakeTensorMode)

    def test_re_export_caches_backend_ops(self) -> None:
        """The re-export dispatches quantized_decomposed ops through the policy mode: entries for keys seen twice, no hit."""
        hits, misses, _ = self.flows["policy"]["re-export namespaces"]["quantized_decomposed"]
        mode = executorch.program_mode(self.flows["policy"]["program"])
        assert isinstance(mode, tcp.FakeTensorMode)
        entries = [
            entry
            for table in mode._cache.partition.all_tables()
            for key, entry in table.items()
            if getattr(key.key[0], "namespace", None) == "quantized_decomposed"
        ]
        seen = sum(entry is _driver._SEEN for entry in entries)
        made = sum(type(entry) is not _DispatchCacheBypassEntry for entry in entries)
        self.assertGreater(made, 0)
        # Each key missed on its first sight, and on the second that made its entry: no kernel ran more than stock's.
        self.assertEqual((hits, misses), (0, seen + 2 * made))

    def test_adopt_cost_measures_every_value(self) -> None:
        """adopt_cost copies as many values as adopt moves, and leaves every one on the policy mode."""
        program = export_stage.pt2e_flow("stock")["program"]
        cost = export_stage.adopt_cost(program, executorch_policy())
        mode = executorch.program_mode(program)
        self.assertIsInstance(mode, tcp.FakeTensorMode)
        values = export_stage.fake_values(program)
        self.assertGreater(cost["values"], 50)
        self.assertEqual(cost["values"], len(values))
        self.assertEqual({id(v.fake_mode) for v in values}, {id(mode)})
        self.assertGreater(cost["adopt_cpu"], 0)
        self.assertGreater(cost["floor_cpu"], 0)


if __name__ == "__main__":
    run_tests()
