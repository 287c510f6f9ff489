# Owner(s): ["module: fakeTensor"]
"""Tests of torch_cachepolicy.export: torch.export.export traced under a policy mode."""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from typing import Any

import cachepolicy_testing as testing
import torch
import torch._library.utils as library_utils
import torch.utils._pytree as pytree
from torch._export.pass_base import _ExportPassBaseDeprecatedDoNotUse as ExportPass
from torch._guards import TracingContext, detect_fake_mode, tracing
from torch._subclasses.fake_tensor import FakeTensor, _DispatchCacheBypassEntry
from torch._subclasses.fake_tensor import FakeTensorMode as StockMode
from torch.export import Dim, ExportedProgram
from torch.fx.experimental.symbolic_shapes import ShapeEnv
from torch.testing._internal.common_utils import (
    TestCase,
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
)

import torch_cachepolicy as tcp

qd = torch.ops.quantized_decomposed
q_per_tensor = qd.quantize_per_tensor.default
dq_per_tensor = qd.dequantize_per_tensor.default
API = r"^torch_cachepolicy\.export\(\.\.\.\): "  # every error message starts by naming the call

# A backend namespace of this test's own: its fake kernel counts its calls.
EXPORT_OPS = testing.CountedOps("tcp_export_test")
NS = EXPORT_OPS.ns
kernel_calls = EXPORT_OPS.calls


@EXPORT_OPS.define("rescale(Tensor x, float scale) -> Tensor")
def _rescale_fake(x: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.empty_like(x)


torch.library.impl(f"{NS}::rescale", "CompositeExplicitAutograd", lambda x, scale: x * scale, lib=EXPORT_OPS.lib)


rescale = torch.ops.tcp_export_test.rescale.default


def policy() -> tcp.CachePolicy:
    return tcp.CachePolicy(namespaces=["quantized_decomposed", NS])


class Backend(torch.nn.Module):
    """q/dq, a backend op called with equal arguments twice, a buffer, views aliasing one result."""

    def __init__(self, features: int = 16) -> None:
        super().__init__()
        self.inner = torch.nn.Linear(features, features)
        self.register_buffer("shift", torch.ones(features))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        # Two calls with equal arguments: the second is a hit under the policy.
        y = torch.ops.tcp_export_test.rescale(testing.qdq(x), 0.5) + torch.ops.tcp_export_test.rescale(testing.qdq(x), 0.5)
        y = torch.relu(self.inner(y)) + self.shift
        z = torch.ops.tcp_export_test.rescale(testing.qdq(y), 2.0)
        return z.view(-1), z.t(), z[:, :4]


class WithKwargs(torch.nn.Module):
    """Keyword-only inputs, one of them optional."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, *, bias: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        return torch.ops.tcp_export_test.rescale(self.inner(testing.qdq(x)) + bias, scale)


class Flatten(torch.nn.Module):
    """A guard (s0 * s1 == s2) that only prefer_deferred_runtime_asserts_over_guards can keep."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x.reshape(-1) + y


@dataclasses.dataclass(frozen=True)
class Case:
    make: Callable[[], torch.nn.Module]
    args: tuple[Any, ...]
    kwargs: dict[str, Any] | None = None
    export_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)


def cases() -> dict[str, Case]:
    batch = Dim("batch")
    return {
        "static": Case(Backend, (torch.randn(4, 16),)),
        "dynamic": Case(Backend, (torch.randn(4, 16),), export_kwargs={"dynamic_shapes": {"x": {0: batch}}}),
        "kwargs": Case(
            WithKwargs,
            (torch.randn(3, 8),),
            {"bias": torch.randn(3, 8), "scale": 0.25},
            {"dynamic_shapes": {"x": {0: batch}, "bias": {0: batch}, "scale": None}},
        ),
        "deferred_asserts": Case(
            Flatten,
            (torch.randn(3, 4), torch.randn(12)),
            export_kwargs={
                "dynamic_shapes": ({0: Dim("a", min=2), 1: Dim("b", min=2)}, {0: Dim("c", min=4)}),
                "prefer_deferred_runtime_asserts_over_guards": True,
            },
        ),
        "preserved_call": Case(
            Backend, (torch.randn(4, 16),), export_kwargs={"preserve_module_call_signature": ("inner",)}
        ),
    }


CASES = cases()


def stock_export(case: Case, module: torch.nn.Module) -> ExportedProgram:
    return torch.export.export(module, case.args, case.kwargs, **case.export_kwargs)


def policy_export(case: Case, module: torch.nn.Module, **kwargs: Any) -> ExportedProgram:
    return tcp.export(module, case.args, case.kwargs, cache_policy=policy(), **kwargs, **case.export_kwargs)


def describe(leaf: object) -> object:
    if isinstance(leaf, torch.Tensor):
        return (
            tuple(map(testing.size_key, leaf.shape)),
            tuple(map(testing.size_key, leaf.stride())),
            testing.size_key(leaf.storage_offset()),
            leaf.dtype,
            leaf.device,
            leaf.requires_grad,
        )
    return testing.size_key(leaf)


def node_metadata(ep: ExportedProgram) -> list[tuple[str, str, list[object]]]:
    """(node, meta key, described leaves) for every meta entry holding a tensor or a SymInt."""
    rows = []
    for node in ep.graph_module.graph.nodes:
        for key, value in node.meta.items():
            leaves = [leaf for leaf in pytree.tree_leaves(value) if isinstance(leaf, (torch.Tensor, torch.SymInt))]
            if leaves:
                rows.append((node.name, key, [describe(leaf) for leaf in leaves]))
    return rows


def fake_values(ep: ExportedProgram) -> list[FakeTensor]:
    return [
        leaf
        for node in ep.graph_module.graph.nodes
        for value in node.meta.values()
        for leaf in pytree.tree_leaves(value)
        if isinstance(leaf, FakeTensor)
    ]


def program_mode(ep: ExportedProgram) -> StockMode:
    mode = detect_fake_mode([n.meta["val"] for n in ep.graph_module.graph.find_nodes(op="placeholder")])
    assert mode is not None
    return mode


class TestSameProgram(TestCase):
    def setUp(self) -> None:
        super().setUp()
        kernel_calls.clear()

    @parametrize("name", list(CASES))
    def test_same_program_as_stock_export(self, name: str) -> None:
        """Code, node metadata, storage sharing, range constraints, signatures and state equal stock's."""
        case = CASES[name]
        module = case.make()
        reference = stock_export(case, module)
        tcp.adopt(reference, cache_policy=policy())
        ep = policy_export(case, module)
        self.assertEqual(ep.graph_module.code, reference.graph_module.code)
        self.assertEqual(node_metadata(ep), node_metadata(reference))
        self.assertEqual(testing.sharing(fake_values(ep)), testing.sharing(fake_values(reference)))
        self.assertEqual(str(ep.range_constraints), str(reference.range_constraints))
        self.assertEqual(
            [(e.fqn, e.signature) for e in ep.module_call_graph],
            [(e.fqn, e.signature) for e in reference.module_call_graph],
        )
        self.assertEqual(str(ep.graph_signature), str(reference.graph_signature))
        self.assertEqual(ep.state_dict, reference.state_dict)
        self.assertEqual(ep.constants, reference.constants)
        self.assertEqual(ep.module()(*case.args, **(case.kwargs or {})), module(*case.args, **(case.kwargs or {})))

    @parametrize("name", list(CASES))
    def test_values_belong_to_the_policy_mode(self, name: str) -> None:
        """Every FakeTensor of the program belongs to one policy mode, which adopt() returns as is."""
        case = CASES[name]
        store = tcp.CacheStore()
        ep = policy_export(case, case.make(), cache_store=store)
        modes = {id(t.fake_mode) for t in fake_values(ep)}
        mode = program_mode(ep)
        self.assertEqual(modes, {id(mode)})
        self.assertIsInstance(mode, tcp.FakeTensorMode)
        assert isinstance(mode, tcp.FakeTensorMode)
        self.assertIs(mode.cache_store, store)
        values = [id(t) for t in fake_values(ep)]
        self.assertIs(tcp.adopt(ep), mode)
        self.assertEqual([id(t) for t in fake_values(ep)], values)  # nothing re-created

    @parametrize("name", list(CASES))
    def test_mode_is_configured_as_torch_export_configures_its_own(self, name: str) -> None:
        """Mode flags and ShapeEnv settings equal those of the mode torch.export.export creates."""
        case = CASES[name]
        module = case.make()
        stock = program_mode(stock_export(case, module))
        ours = program_mode(policy_export(case, module))
        self.assertIs(type(stock), StockMode)

        def settings(mode: StockMode) -> dict[str, object]:
            shape_env = mode.shape_env
            assert shape_env is not None
            return {
                "allow_non_fake_inputs": mode.allow_non_fake_inputs,
                "allow_fallback_kernels": mode.allow_fallback_kernels,
                "static_shapes": mode.static_shapes,
                "export": mode.fake_tensor_converter.export,
                "unsafe_data_ptr": mode._allow_unsafe_data_ptr_access,
                "shape_env.settings": shape_env.settings,
                "shape_env.co_fields": shape_env.co_fields,
                "shape_env.tracks_fakes": shape_env.tracked_fakes is not None,
                "shape_env.guards": [str(g.expr) for g in shape_env.guards],
                "shape_env.var_to_range": str(shape_env.var_to_range),
            }

        self.assertEqual(settings(ours), settings(stock))
        self.assertEqual(ours.shape_env.co_fields["co_name"], "forward")  # type: ignore[union-attr]


class TestCachingDuringAndAfterExport(TestCase):
    def setUp(self) -> None:
        super().setUp()
        kernel_calls.clear()

    def test_export_itself_dispatches_through_the_mode(self) -> None:
        """Export's backend ops go through the policy mode's cache: a key's third call hits; no kernel runs more than under stock."""
        case = Case(lambda: Backend(testing.fresh_size()), (None,))
        module = case.make()
        args = (torch.randn(4, module.inner.in_features),)
        torch.export.export(module, args)
        stock_calls = kernel_calls["rescale"]
        kernel_calls.clear()
        ep = tcp.export(module, args, cache_policy=policy())
        mode = program_mode(ep)
        assert isinstance(mode, tcp.FakeTensorMode)
        report = mode.cache_report()
        # rescale(testing.qdq(x)) twice is a first sight and the miss making the entry; rescale(testing.qdq(y)) differs
        # (y requires grad): a first sight. quantize_per_tensor likewise; dequantize_per_tensor's three calls share a
        # key (int8 inputs require no grad): the third hits.
        self.assertEqual((report[rescale].hits, report[rescale].misses), (0, 3), msg=str(report))
        self.assertEqual((report[q_per_tensor].hits, report[q_per_tensor].misses), (0, 3), msg=str(report))
        self.assertEqual((report[dq_per_tensor].hits, report[dq_per_tensor].misses), (1, 2), msg=str(report))
        self.assertEqual((stock_calls, kernel_calls["rescale"]), (3, 3))

    @parametrize("dynamic", [False, True])
    def test_run_decompositions_uses_the_mode(self, dynamic: bool) -> None:
        """run_decompositions traces under the program's policy mode and hits its entries."""
        case = CASES["dynamic" if dynamic else "static"]
        ep = policy_export(case, case.make())
        mode = program_mode(ep)
        assert isinstance(mode, tcp.FakeTensorMode)
        before = mode.cache_report()[rescale]
        decomposed = ep.run_decompositions()
        first = mode.cache_report()[rescale]
        self.assertIs(program_mode(decomposed), mode)
        self.assertGreater(first.hits + first.misses, before.hits + before.misses)  # dispatched through the mode
        # Whether the first passes miss depends on the release (torch 2.15's run_decompositions teaches the ShapeEnv
        # a fact about the dynamic size, which files later entries elsewhere: a key's first sight there, then the
        # miss that makes its entry); from the third pass on, only hits on any.
        for _ in range(2):
            ep.run_decompositions()
        third = mode.cache_report()[rescale]
        ep.run_decompositions()
        fourth = mode.cache_report()[rescale]
        self.assertGreater(fourth.hits, third.hits)
        self.assertEqual(fourth.misses, third.misses, msg=str(mode.cache_report()))

    @parametrize("dynamic", [False, True])
    def test_export_pass_retrace_hits(self, dynamic: bool) -> None:
        """An ExportPass retrace runs under the policy mode and hits for backend ops once their keys have entries; with
        symbolic inputs the first retrace starts afresh, as export froze the ShapeEnv (Note [What the ShapeEnv knows])."""
        case = CASES["dynamic" if dynamic else "static"]
        ep = policy_export(case, case.make())
        mode = program_mode(ep)
        assert isinstance(mode, tcp.FakeTensorMode)
        made = mode.cache_report()
        # Per trace each op calls one key twice and another once (y requires grad): export sees both and makes the
        # first's entry; a trace that sees them afresh does the same, the next makes the second's entry.
        for op in (rescale, q_per_tensor):
            self.assertEqual((made[op].hits, made[op].misses), (0, 3), msg=str(made))
        retraces = [(3, 0), (1, 2), (0, 3)] if dynamic else [(1, 2), (0, 3), (0, 3)]
        for expected_misses, expected_hits in retraces:
            before = mode.cache_report()
            result = ExportPass()(ep.graph_module)
            after = mode.cache_report()
            self.assertIs(
                detect_fake_mode([n.meta["val"] for n in result.graph_module.graph.find_nodes(op="placeholder")]), mode
            )
            for op in (rescale, q_per_tensor):
                self.assertEqual(after[op].misses - before[op].misses, expected_misses, msg=str(after))
                self.assertEqual(after[op].hits - before[op].hits, expected_hits, msg=str(after))

    def test_store_shared_across_exports(self) -> None:
        """Exports given one store share entries: the second hits what the first made (and makes the rest), the third only hits."""
        store = tcp.CacheStore()
        module = Backend(testing.fresh_size())
        args = (torch.randn(4, module.inner.in_features),)
        first = program_mode(tcp.export(module, args, cache_policy=policy(), cache_store=store))
        kernel_calls.clear()
        second = program_mode(tcp.export(module, args, cache_policy=policy(), cache_store=store))
        assert isinstance(second, tcp.FakeTensorMode)
        self.assertIsNot(first, second)
        self.assertEqual(kernel_calls["rescale"], 1)  # rescale(testing.qdq(y)): the first export saw it once
        self.assertEqual((second.cache_report()[rescale].hits, second.cache_report()[rescale].misses), (2, 1))
        kernel_calls.clear()
        third = program_mode(tcp.export(module, args, cache_policy=policy(), cache_store=store))
        assert isinstance(third, tcp.FakeTensorMode)
        self.assertEqual(kernel_calls["rescale"], 0)
        self.assertEqual((third.cache_report()[rescale].hits, third.cache_report()[rescale].misses), (3, 0))

    def test_re_export_of_a_module_from_a_program(self) -> None:
        """pt2e's pattern: exporting ep.module() again gives stock's program, under a new policy mode."""
        case = CASES["dynamic"]
        first = policy_export(case, case.make())
        reference = stock_export(case, first.module())
        again = policy_export(case, first.module())
        self.assertEqual(again.graph_module.code, reference.graph_module.code)
        self.assertEqual(node_metadata(again), node_metadata(reference))
        self.assertIsNot(program_mode(again), program_mode(first))
        self.assertIsInstance(program_mode(again), tcp.FakeTensorMode)


class TestEnvironment(TestCase):
    def test_torch_globals_are_untouched(self) -> None:
        """is_builtin, the class cache's backend entries, the class counters and torch's config never change."""
        seen: list[object] = []
        original_is_builtin = library_utils.is_builtin
        spy_lib = torch.library.Library(NS, "FRAGMENT")

        def spy(x: torch.Tensor, scale: float) -> torch.Tensor:
            seen.append(library_utils.is_builtin)
            return torch.empty_like(x)

        before = testing.stock_info()
        unsafe = torch._functorch.config.fake_tensor_allow_unsafe_data_ptr_access
        try:
            torch.library.register_fake(f"{NS}::rescale", spy, lib=spy_lib)
            case = CASES["dynamic"]
            ep = policy_export(case, case.make())
            ep.run_decompositions()
        finally:
            spy_lib._destroy()
        self.assertEqual(seen, [original_is_builtin] * len(seen))
        self.assertGreater(len(seen), 0)
        self.assertIs(library_utils.is_builtin, original_is_builtin)
        self.assertEqual(testing.stock_info()[:3], before[:3])
        for ns in ("quantized_decomposed", NS):
            stored = [
                k
                for k, v in StockMode.cache.items()
                if getattr(k.key[0], "namespace", None) == ns and not isinstance(v, _DispatchCacheBypassEntry)
            ]
            self.assertEqual(stored, [], msg=ns)
        self.assertEqual(torch._functorch.config.fake_tensor_allow_unsafe_data_ptr_access, unsafe)
        self.assertIsNone(TracingContext.try_get())

    def test_inside_an_active_policy_mode(self) -> None:
        """Called with a policy mode entered, export still creates its own mode and leaves the outer one alone."""
        outer = tcp.FakeTensorMode(cache_policy=policy())
        case = CASES["static"]
        module = case.make()
        with outer:
            ep = policy_export(case, module)
        self.assertIsNot(program_mode(ep), outer)
        self.assertEqual(str(outer.cache_report()), "(no dispatches)")
        self.assertEqual(ep.graph_module.code, stock_export(case, module).graph_module.code)

    def test_nested_call_from_a_forward(self) -> None:
        """A model whose forward calls torch_cachepolicy.export meets the active-TracingContext error."""

        class Nested(torch.nn.Module):
            def forward(self, x: torch.Tensor) -> torch.Tensor:
                tcp.export(torch.nn.ReLU(), (x,))
                return x

        with self.assertRaisesRegex(RuntimeError, API + "a torch._guards.TracingContext is already active"):
            tcp.export(Nested(), (torch.randn(2),))
        self.assertIsNone(TracingContext.try_get())

    def test_active_tracing_context(self) -> None:
        """Inside a TracingContext, the error names the cause and both fixes."""
        with tracing(TracingContext(StockMode(shape_env=ShapeEnv(tracked_fakes=[])))):
            with self.assertRaisesRegex(
                RuntimeError,
                API + r"a torch._guards.TracingContext is already active .* Call torch_cachepolicy.export "
                r"outside of it, or .* torch_cachepolicy.adopt\(program, cache_policy=...\)",
            ):
                tcp.export(torch.nn.ReLU(), (torch.randn(2),))


class TestErrors(TestCase):
    def test_strict(self) -> None:
        """strict=True is refused with the reason and the fixes; strict=False is accepted."""
        with self.assertRaisesRegex(
            ValueError,
            API + r"strict=True traces with Dynamo, which creates its own FakeTensorMode.*Pass strict=False.*"
            r"torch_cachepolicy.adopt\(program, cache_policy=...\)",
        ):
            tcp.export(torch.nn.ReLU(), (torch.randn(2),), strict=True)
        ep = tcp.export(torch.nn.ReLU(), (torch.randn(2),), strict=False)
        self.assertIsInstance(program_mode(ep), tcp.FakeTensorMode)

    def test_wrong_arguments(self) -> None:
        """Wrong types and unknown keywords raise TypeError naming the call."""
        relu, args = torch.nn.ReLU(), (torch.randn(2),)
        with self.assertRaisesRegex(TypeError, r"^torch_cachepolicy\.export\(cache_policy=\.\.\.\): expected a torch_cachepolicy.CachePolicy"):
            tcp.export(relu, args, cache_policy=["quantized_decomposed"])  # type: ignore[arg-type]
        with self.assertRaisesRegex(TypeError, r"^torch_cachepolicy\.export\(cache_store=\.\.\.\): expected a torch_cachepolicy.CacheStore"):
            tcp.export(relu, args, cache_store={})  # type: ignore[arg-type]
        with self.assertRaisesRegex(TypeError, API + "unexpected keyword argument 'dynamic'; .*dynamic_shapes"):
            tcp.export(relu, args, dynamic=True)

    def test_not_a_module(self) -> None:
        """A function instead of a module gets torch.export.export's own error."""
        with self.assertRaisesRegex(ValueError, "Expected `mod` to be an instance of `torch.nn.Module`"):
            tcp.export(torch.relu, (torch.randn(2),))  # type: ignore[arg-type]

    @parametrize("error", [True, False])
    def test_lifted_fake_constant(self, error: bool) -> None:
        """A FakeTensor lifted as a constant is reported as torch.export.export reports it."""

        class Rolling(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.cache = torch.nn.Parameter(torch.zeros(1, 10, 5), requires_grad=False)
                self.out = torch.nn.Linear(5, 4)

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                rolled = torch.roll(self.cache.data, -x.size(1), dims=1)
                rolled[:, -x.size(1) :, :] = x
                self.cache.data = rolled  # an attribute export cannot trace through
                return self.out(self.cache)

        args = (torch.randn(1, 3, 5),)
        message = r"We found a fake tensor in the exported program constant's list.*lifted_tensor_0"
        with torch._export.config.patch(error_on_lifted_constant_tensors=error):
            for run in (lambda: torch.export.export(Rolling(), args), lambda: tcp.export(Rolling(), args)):
                if error:
                    with self.assertRaisesRegex(RuntimeError, message):
                        run()
                else:
                    with warnings.catch_warnings(record=True) as caught:
                        warnings.simplefilter("always")
                        ep = run()
                    self.assertTrue(any("We found a fake tensor" in str(w.message) for w in caught))
                    self.assertEqual(list(ep.constants), ["lifted_tensor_0"])


instantiate_parametrized_tests(TestSameProgram)
instantiate_parametrized_tests(TestCachingDuringAndAfterExport)
instantiate_parametrized_tests(TestErrors)


if __name__ == "__main__":
    run_tests()
