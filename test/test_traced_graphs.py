# Owner(s): ["module: fakeTensor"]
"""Graphs traced under a policy mode are the graphs stock traces, node names included.

A hit, or a miss's verification, must not create traced nodes an uncached
dispatch does not: expecttest graph tests compare graph code as text.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.ao.quantization.fx._decomposed  # noqa: F401  (defines the quantized_decomposed ops)
from torch.export import Dim
from torch.testing._internal.common_utils import TestCase, instantiate_parametrized_tests, parametrize, run_tests

import torch_cachepolicy as tcp


class _ConvNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn(self.conv1(x)))
        return torch.relu(self.conv2(y) + y).mean(dim=(2, 3))


class _QDQLinear(torch.nn.Module):
    """A Q/DQ graph as PT2E quantization leaves it: quantize, dequantize around a linear."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        qd = torch.ops.quantized_decomposed
        q = qd.quantize_per_tensor.default(x, 0.05, 0, -128, 127, torch.int8)
        y = self.linear(qd.dequantize_per_tensor.default(q, 0.05, 0, -128, 127, torch.int8))
        q = qd.quantize_per_tensor.default(y, 0.05, 0, -128, 127, torch.int8)
        return qd.dequantize_per_tensor.default(q, 0.05, 0, -128, 127, torch.int8)


def _transformer() -> torch.nn.Module:
    layer = torch.nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=128, batch_first=True, dropout=0.0)
    return torch.nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False).eval()


# name -> (module factory, example inputs, dynamic_shapes or None)
CASES: dict[str, tuple[Callable[[], torch.nn.Module], tuple[Any, ...], Any]] = {
    "transformer_static": (_transformer, (torch.randn(2, 5, 64),), None),
    "transformer_dynamic": (_transformer, (torch.randn(2, 5, 64),), ({0: Dim("batch", min=1, max=64)},)),
    "convnet_static": (lambda: _ConvNet().eval(), (torch.randn(2, 3, 16, 16),), None),
    "convnet_dynamic": (lambda: _ConvNet().eval(), (torch.randn(2, 3, 16, 16),), ({0: Dim("batch", min=1, max=64)},)),
    "qdq_static": (_QDQLinear, (torch.randn(4, 16),), None),
    "qdq_dynamic": (_QDQLinear, (torch.randn(4, 16),), ({0: Dim("batch", min=1, max=64)},)),
}
POLICIES = {
    "default": lambda: tcp.CachePolicy(),
    "qdq": lambda: tcp.CachePolicy(namespaces=["quantized_decomposed"]),
}


class TestTracedGraphs(TestCase):
    def export_both(self, case: str, policy: str) -> tuple[torch.export.ExportedProgram, torch.export.ExportedProgram]:
        """The program of ``torch.export.export`` and of ``torch_cachepolicy.export`` for one case."""
        factory, args, dynamic = CASES[case]
        torch.manual_seed(0)
        module = factory()
        stock = torch.export.export(module, args, dynamic_shapes=dynamic)
        ours = tcp.export(module, args, dynamic_shapes=dynamic, cache_policy=POLICIES[policy]())
        return stock, ours

    def assertSameGraph(self, stock: torch.export.ExportedProgram, ours: torch.export.ExportedProgram) -> None:
        self.assertEqual(ours.graph_module.code, stock.graph_module.code)
        self.assertEqual(str(ours.graph_signature), str(stock.graph_signature))

    @parametrize("policy", list(POLICIES))
    @parametrize("case", list(CASES))
    def test_export(self, case: str, policy: str) -> None:
        """torch_cachepolicy.export traces the graph torch.export.export traces, names included."""
        self.assertSameGraph(*self.export_both(case, policy))

    @parametrize("policy", list(POLICIES))
    @parametrize("case", list(CASES))
    def test_adopt_then_run_decompositions(self, case: str, policy: str) -> None:
        """adopt() then run_decompositions() gives the graph stock's run_decompositions() gives, names included."""
        factory, args, dynamic = CASES[case]
        torch.manual_seed(0)
        module = factory()
        stock = torch.export.export(module, args, dynamic_shapes=dynamic).run_decompositions()
        program = torch.export.export(module, args, dynamic_shapes=dynamic)
        mode = tcp.adopt(program, cache_policy=POLICIES[policy]())
        ours = program.run_decompositions()
        self.assertSameGraph(stock, ours)
        self.assertGreater(mode.cache_info().hits + mode.cache_info().misses, 0)

    @parametrize("tracing_mode", ["symbolic", "fake"])
    def test_make_fx_over_hits_of_scalar_and_tensor_backend_ops(self, tracing_mode: str) -> None:
        """make_fx over a policy mode whose third calls hit (a bare SymInt output, a tensor output) traces the
        graph stock traces: a hit's SymInt is this call's, never an earlier call's object (upstream review p13)."""
        from torch.fx.experimental.proxy_tensor import make_fx
        from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

        def f(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            # Three calls each: the first sight, the miss that makes the entry, a hit.
            a, b, c = (torch.ops.tcp_traced.nsize(x) for _ in range(3))
            y, z, w = (torch.ops.tcp_traced.twice(x) for _ in range(3))
            return x.new_zeros(a + b + c), y + z + w

        def trace(mode: Any) -> str:
            context = StatelessSymbolicContext([DimDynamic.DYNAMIC] * 2) if tracing_mode == "symbolic" else None
            x = mode.from_tensor(torch.randn(4, 3), symbolic_context=context)
            return make_fx(f, tracing_mode=tracing_mode)(x).code

        with torch.library._scoped_library("tcp_traced", "FRAGMENT") as lib:
            lib.define("nsize(Tensor x) -> SymInt")
            torch.library.register_fake("tcp_traced::nsize", lambda x: x.shape[0] * 3, lib=lib)
            lib.define("twice(Tensor x) -> Tensor")
            torch.library.register_fake("tcp_traced::twice", lambda x: x.new_empty(2 * x.shape[0], x.shape[1]), lib=lib)
            stock = trace(torch._subclasses.fake_tensor.FakeTensorMode(shape_env=ShapeEnv()))
            mode = tcp.FakeTensorMode(cache_policy=tcp.CachePolicy(namespaces=["tcp_traced"]), shape_env=ShapeEnv())
            ours = trace(mode)
            hits = [mode.cache_report()[op].hits for op in (torch.ops.tcp_traced.nsize.default, torch.ops.tcp_traced.twice.default)]
        self.assertEqual(ours, stock)
        self.assertEqual(hits, [1, 1])


instantiate_parametrized_tests(TestTracedGraphs)

if __name__ == "__main__":
    run_tests()
