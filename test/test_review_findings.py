# Owner(s): ["module: fakeTensor"]
"""The upstream v3 review's findings (../shared/reviews/upstream-v3.md, N1, N2, N8), held by the prototype too.

Each was first a probe of the review ported to the package (a variant of it where the review's own probe passed):
an op bypassing inside invoke_subgraph for what its key cannot see (N1), a mode without a ShapeEnv given SymInts of
one (N2), a decision that is not a CacheDecision of bools (N8). Every test compares with an uncached run or asserts
the error; each failed before the fix.
"""

from __future__ import annotations

from typing import Any

import cachepolicy_testing as testing
import numpy as np
import torch
from torch._dynamo.source import ConstantSource
from torch._higher_order_ops.invoke_subgraph import invoke_subgraph
from torch.fx.experimental.symbolic_shapes import ShapeEnv
from torch.testing._internal.common_utils import TestCase, instantiate_parametrized_tests, parametrize, run_tests

import torch_cachepolicy as tcp

NS = "tcp_findings"
OPS = testing.CountedOps(NS)


@OPS.define("shrink(Tensor x, SymInt n) -> Tensor")
def _shrink(x: torch.Tensor, n: Any) -> torch.Tensor:
    return x.new_empty(n - 3)  # a size not provably non-zero: rebuilding it unsuppressed guards Ne(n - 3, 0)


@OPS.define("makes_symbol(Tensor x, SymInt n) -> Tensor")
def _makes_symbol(x: torch.Tensor, n: Any) -> torch.Tensor:
    n.node.shape_env.create_unbacked_symint()  # a symbol in its argument's ShapeEnv, not in the output
    return x.new_empty(2)


@OPS.define("reads_seed(Tensor x, Generator? g) -> Tensor")
def _reads_seed(x: torch.Tensor, g: torch.Generator | None) -> torch.Tensor:
    return x.new_empty(1 + (0 if g is None else g.initial_seed() % 3))


@OPS.define("plain(Tensor x) -> Tensor")
def _plain(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def backed(shape_env: ShapeEnv, hint: int = 4) -> torch.SymInt:
    """A backed SymInt ``n`` of ``shape_env`` (equal names and hints in every ShapeEnv: equal keys)."""
    source = ConstantSource("n")
    return shape_env.create_symintnode(shape_env.create_symbol(hint, source), hint=hint, source=source)


class TestSymbolsWithoutAModeShapeEnv(TestCase):
    """N2: a mode without a ShapeEnv given SymInts of a ShapeEnv bypasses, so hits never skip that ShapeEnv's guards."""

    def run_both(self, sequence: Any) -> list[tuple[object, object]]:
        """``sequence(mode, shape_env)`` cached and uncached, each on a fresh ShapeEnv the mode does not own."""
        seen = []
        for cache in (True, False):
            shape_env = ShapeEnv()
            mode = tcp.FakeTensorMode(cache_policy=tcp.CachePolicy(namespaces=[NS]))  # no shape_env
            mode.cache_enabled = cache
            with mode:
                result = sequence(mode, shape_env)
            seen.append((result, [str(g.expr) for g in shape_env.guards], shape_env.unbacked_symint_counter))
        return seen

    def test_mode_without_shape_env_adds_no_guard_of_its_own(self) -> None:
        """A miss in a mode without a ShapeEnv leaves the SymInts' ShapeEnv with exactly the uncached run's guards."""
        def sequence(mode: Any, shape_env: ShapeEnv) -> list[str]:
            n = backed(shape_env)
            return [str(OPS.op("shrink")(torch.empty(3), n).shape) for _ in range(3)]

        cached, uncached = self.run_both(sequence)
        # Before the fix: cached guards ['s.. - 3 >= 0', 'Ne(s.. - 3, 0)'], uncached ['s.. - 3 >= 0'].
        self.assertEqual(cached, uncached)

    def test_mode_without_shape_env_watches_its_inputs_shape_env(self) -> None:
        """A kernel creating a symbol in its SymInt argument's ShapeEnv is not skipped by hits in a mode without one."""
        def sequence(mode: Any, shape_env: ShapeEnv) -> list[str]:
            n = backed(shape_env)
            return [str(OPS.op("makes_symbol")(torch.empty(3), n).shape) for _ in range(3)]

        cached, uncached = self.run_both(sequence)
        # Before the fix: unbacked_symint_counter 1 cached (two hits skipped the kernel), 3 uncached.
        self.assertEqual(cached, uncached)


class TestHigherOrderOpsInnerBypass(TestCase):
    """N1: an op bypassing inside invoke_subgraph keeps the invoke_subgraph entry from being stored."""

    @parametrize("held_by", ["operand", "subgraph"])
    def test_invoke_subgraph_around_an_op_reading_its_generator_is_not_replayed(self, held_by: str) -> None:
        """An op bypassing for an argument the key cannot see keeps invoke_subgraph around it from being cached."""
        g = torch.Generator()
        if held_by == "operand":
            gm = torch.fx.symbolic_trace(lambda a, gen: (OPS.op("reads_seed")(a, gen),))
            operands: tuple[object, ...] = (g,)
        else:  # the subgraph holds the Generator (get_attr): the HOP's key cannot see it at all
            root = torch.nn.Module()
            root.g = g
            graph = torch.fx.Graph()
            a = graph.placeholder("a")
            graph.output((graph.call_function(OPS.op("reads_seed"), (a, graph.get_attr("g"))),))
            gm = torch.fx.GraphModule(root, graph)
            operands = ()
        seen = []
        for cache in (True, False):
            mode = tcp.FakeTensorMode(cache_policy=tcp.CachePolicy(namespaces=[NS]))
            mode.cache_enabled = cache
            sizes = []
            with mode:
                x = torch.empty(2)
                for seed in (1, 1, 2, 2, 1):
                    g.manual_seed(seed)
                    sizes.append(invoke_subgraph(gm, "reads_seed", x, *operands)[0].shape[0])
            seen.append(sizes)
        # Before the fix: cached [2, 2, 2, 2, 2] (4 invoke_subgraph hits), uncached [2, 2, 3, 3, 2].
        self.assertEqual(seen[0], seen[1])


class TestDecisionsMustBeBools(TestCase):
    """N8: a decision is a CacheDecision of bools; anything else raises TypeError instead of admitting or denying."""

    @parametrize("value", ["int", "np_bool", "str"])
    def test_cache_decision_takes_bools_only(self, value: str) -> None:
        """CacheDecision(cacheable=...) and (explicit=...) reject truthy non-bools at construction."""
        bad = {"int": 1, "np_bool": np.bool_(True), "str": "no"}[value]
        with self.assertRaisesRegex(TypeError, r"CacheDecision\(\.\.\.\): cacheable and explicit must be bool"):
            tcp.CacheDecision(bad, "user rule", "cacheable")  # type: ignore[arg-type]
        with self.assertRaisesRegex(TypeError, r"CacheDecision\(\.\.\.\): cacheable and explicit must be bool"):
            tcp.CacheDecision(True, "user rule", "cacheable", bad)  # type: ignore[arg-type]

    @parametrize("answer", ["bare_bool", "np_bool", "none"])
    def test_decide_override_must_return_a_cache_decision(self, answer: str) -> None:
        """A decide() override returning anything but a CacheDecision raises TypeError naming decide."""
        value = {"bare_bool": True, "np_bool": np.bool_(True), "none": None}[answer]

        class Overriding(tcp.CachePolicy):
            def decide(self, op: Any) -> Any:
                return value

        mode = tcp.FakeTensorMode(cache_policy=Overriding(namespaces=[NS]))
        with self.assertRaisesRegex(TypeError, r"CachePolicy\.decide\(\.\.\.\): Overriding\.decide\(.*\) returned"):
            with mode:
                OPS.op("plain")(torch.empty(2))


instantiate_parametrized_tests(TestHigherOrderOpsInnerBypass)
instantiate_parametrized_tests(TestDecisionsMustBeBools)


if __name__ == "__main__":
    run_tests()
