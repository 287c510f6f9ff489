# Owner(s): ["module: fakeTensor"]
"""A real client: ExecuTorch 1.5.1 lowering quantized models under a policy mode.

Four flows (``benchmarks.executorch.FLOWS``): Ethos-U55
(``to_edge_transform_and_lower`` with ``EthosUPartitioner``), Cortex-M
(``to_edge`` + ``CortexMPassManager``), XNNPACK
(``to_edge_transform_and_lower`` with ``XnnpackPartitioner``) and XNNPACK on a
transformer exported with a dynamic sequence length (``torch.export.Dim``). Each flow lowers
the same quantized program three times: (a) stock, (b) under ExecuTorch PR
21700's process-global ``is_builtin`` swap, (c) after ``adopt(ep,
cache_policy=...)``. Delegate payloads, graph code and constants must be
identical; (c) must serve backend ops from its cache without touching torch's
global state. (c) uses the library's ExecuTorch recipe,
:mod:`torch_cachepolicy.recipes.executorch`, as an ExecuTorch user would. The
Ethos-U55 flow is also checked in depth (the TOSA flatbuffer handed to Vela,
the context key).

Needs ExecuTorch: ``make test-executorch`` installs it (``pip install
--no-deps -r requirements-executorch.txt``) and runs this file.
"""

from __future__ import annotations

import collections
import contextlib
import gc
import importlib
import io
import pkgutil
import unittest
import weakref
from collections.abc import Callable, Hashable, Iterator
from typing import Any, ClassVar, cast
from unittest import mock

import torch
import torch._library.utils as library_utils
from torch._ops import OpOverload
from torch._subclasses import fake_tensor as _ft
from torch._subclasses.fake_tensor import _DispatchCacheBypassEntry
from torch.export import ExportedProgram
from torch.fx.experimental.symbolic_shapes import ShapeEnv
from torch.testing._internal.common_utils import TestCase, run_tests

import torch_cachepolicy as tcp
from benchmarks import executorch as flow
from benchmarks.dispatch_recorder import DispatchCensus, recording
from benchmarks.global_patch import backend_entries, global_patch, positive_backend_entries
from torch_cachepolicy import _driver
from torch_cachepolicy.adopt import adopt
from torch_cachepolicy.recipes import executorch as recipe

HAS_EXECUTORCH = flow.executorch_version() == flow.EXECUTORCH_VERSION
SKIP_REASON = "ExecuTorch 1.5.1 is not installed: make test-executorch installs it"
NAMESPACES = list(recipe.EXECUTORCH_NAMESPACES)
ORIGINAL_IS_BUILTIN = library_utils.is_builtin


@contextlib.contextmanager
def vela_input() -> Iterator[list[bytes]]:
    """Records the TOSA flatbuffer EthosUBackend hands to Vela.

    With ethos-u-vela installed Vela still compiles it (the delegate payload is
    Vela's command stream); without it, a stub returns the flatbuffer itself,
    so the payload is the TOSA flatbuffer. Only EthosUBackend's reference is
    patched, and only for this scope.
    """
    from executorch.backends.arm import arm_vela
    from executorch.backends.arm.ethosu import backend

    seen: list[bytes] = []
    real = backend.vela_compile

    def vela_compile(tosa_flatbuffer: bytes, args: list[str], *rest: Any, **kwargs: Any) -> Any:
        seen.append(bytes(tosa_flatbuffer))
        if not arm_vela.has_vela:
            return arm_vela.VelaCompileResult(processed_bytes=bytes(tosa_flatbuffer))
        return real(tosa_flatbuffer, args, *rest, **kwargs)

    with mock.patch.object(backend, "vela_compile", vela_compile):
        yield seen


@contextlib.contextmanager
def is_builtin_samples() -> Iterator[list[bool]]:
    """Samples, inside every TOSA fake kernel, whether ``is_builtin`` is torch's own.

    TOSA fake kernels call their module's ``get_context_spec``; wrapping that
    name observes the kernels from inside without re-registering any of them.
    """
    import executorch.backends.arm.tosa.dialect.ops as ops_package

    samples: list[bool] = []
    with contextlib.ExitStack() as stack:
        for info in pkgutil.iter_modules(ops_package.__path__):
            module = importlib.import_module(f"{ops_package.__name__}.{info.name}")
            real = getattr(module, "get_context_spec", None)
            if real is None:
                continue

            def sampled(real: Callable[[], Any] = real) -> Any:
                samples.append(library_utils.is_builtin is ORIGINAL_IS_BUILTIN)
                return real()

            stack.enter_context(mock.patch.object(module, "get_context_spec", sampled))
        yield samples


@contextlib.contextmanager
def modes_created() -> Iterator[list[str]]:
    """Records the type of every FakeTensorMode constructed in this scope."""
    created: list[str] = []
    real_init = _ft.FakeTensorMode.__init__

    def init(self: _ft.FakeTensorMode, *args: Any, **kwargs: Any) -> None:
        created.append(type(self).__qualname__)
        real_init(self, *args, **kwargs)

    with mock.patch.object(_ft.FakeTensorMode, "__init__", init):
        yield created


program_mode = flow.program_mode


def fake_modes_of(gm: torch.fx.GraphModule) -> set[int]:
    """ids of the modes owning the FakeTensors in ``gm``'s node metadata."""
    return {
        id(node.meta["val"].fake_mode) for node in gm.graph.nodes if isinstance(node.meta.get("val"), _ft.FakeTensor)
    }


def lower(ep: ExportedProgram) -> tuple[Any, list[bytes]]:
    """``to_edge_transform_and_lower`` for ethos-u55-128; the program and Vela's inputs."""
    from executorch.backends.arm.ethosu import EthosUCompileSpec, EthosUPartitioner
    from executorch.exir import to_edge_transform_and_lower

    compile_spec = EthosUCompileSpec("ethos-u55-128")
    # Vela prints a summary per compiled graph.
    with vela_input() as tosa, contextlib.redirect_stdout(io.StringIO()):
        edge = to_edge_transform_and_lower(ep, partitioner=[EthosUPartitioner(compile_spec)])
    return edge, tosa


def delegate_payloads(edge: Any) -> dict[str, bytes]:
    """``processed_bytes`` of each delegate of the lowered program, by name."""
    from executorch.exir.lowered_backend_module import LoweredBackendModule

    return {
        name: bytes(m.processed_bytes)
        for name, m in edge.exported_program().graph_module.named_modules()
        if isinstance(m, LoweredBackendModule)
    }


def torch_cache_keys() -> set[Any]:
    """The keys of torch's class-global FakeTensor cache."""
    return set(_ft.FakeTensorMode.cache)


def class_counters() -> tuple[int, int, dict[str, int]]:
    """torch's class-global hit, miss and bypass counters."""
    return (
        _ft.FakeTensorMode.cache_hits,
        _ft.FakeTensorMode.cache_misses,
        dict(_ft.FakeTensorMode.cache_bypasses),
    )


def key_namespace(key: Any) -> str:
    """The namespace of a cache key's operator; "(hop)" for higher-order ops."""
    op = key.key[0]
    return op.namespace if isinstance(op, OpOverload) else "(hop)"


@unittest.skipIf(not HAS_EXECUTORCH, SKIP_REASON)
class TestEthosULowering(TestCase):
    """One quantized model lowered (a) stock, (b) under the global patch, (c) adopted."""

    results: ClassVar[dict[str, dict[str, Any]]] = {}

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        fresh_program = flow.quantized_program_factory()
        cls.results = {}

        # (a) stock.
        edge, tosa = lower(fresh_program())
        cls.results["stock"] = {"edge": edge, "tosa": tosa}

        # (b) PR 21700: is_builtin swapped for the process, negative entries evicted.
        ep = fresh_program()
        with is_builtin_samples() as samples:
            with global_patch(NAMESPACES, shape_envs=[program_mode(ep).shape_env]):
                edge, tosa = lower(ep)
        cls.results["global-patch"] = {"edge": edge, "tosa": tosa, "is_builtin_samples": samples}

        # (c) the policy mode of the library's recipe, adopted by the exported
        # program before lowering; the recipe's context key is wrapped (by its
        # module-level name, which executorch_policy() reads) to record its values.
        contexts: set[Hashable] = set()
        real_context_key = recipe.tosa_context_key

        def context_key() -> Hashable:
            value = real_context_key()
            contexts.add(value)
            return value

        with mock.patch.object(recipe, "tosa_context_key", context_key):
            policy = recipe.executorch_policy()
        ep = fresh_program()
        shape_env = program_mode(ep).shape_env
        mode = adopt(ep, cache_policy=policy)
        is_builtin_before = library_utils.is_builtin
        keys_before, counters_before = torch_cache_keys(), class_counters()
        with is_builtin_samples() as samples, modes_created() as created:
            edge, tosa = lower(ep)
        cls.results["policy"] = {
            "edge": edge,
            "tosa": tosa,
            "mode": mode,
            "contexts": contexts,
            "is_builtin_samples": samples,
            "is_builtin_before": is_builtin_before,
            "is_builtin_after": library_utils.is_builtin,
            "new_torch_keys": torch_cache_keys() - keys_before,
            "counters": (counters_before, class_counters()),
            "modes_created": created,
            "shape_env": shape_env,
        }

    def test_tosa_flatbuffer_identical(self) -> None:
        """Vela receives the same TOSA flatbuffer in all three runs."""
        stock = self.results["stock"]["tosa"]
        self.assertEqual(len(stock), 1)
        self.assertGreater(len(stock[0]), 0)
        for config in ("global-patch", "policy"):
            self.assertTrue(self.results[config]["tosa"] == stock, f"{config}: TOSA flatbuffer differs from stock")

    def test_delegate_payload_identical(self) -> None:
        """The delegates' processed_bytes are byte-identical in all three runs."""
        stock = delegate_payloads(self.results["stock"]["edge"])
        self.assertEqual(list(stock), ["lowered_module_0"])
        for config in ("global-patch", "policy"):
            self.assertTrue(delegate_payloads(self.results[config]["edge"]) == stock, f"{config}: payload differs")

    def test_graph_code_identical(self) -> None:
        """The lowered top-level graph has the same code in all three runs."""
        stock = self.results["stock"]["edge"].exported_program().graph_module.code
        self.assertIn("executorch_call_delegate", stock)
        for config in ("global-patch", "policy"):
            self.assertEqual(self.results[config]["edge"].exported_program().graph_module.code, stock)

    def test_backend_ops_served_from_cache(self) -> None:
        """The adopted mode hits on quantized_decomposed and tosa ops."""
        report = self.results["policy"]["mode"].cache_report()
        by_ns = report.by_namespace()
        for ns in ("quantized_decomposed", "tosa"):
            hits, misses, _ = by_ns[ns]
            self.assertGreater(hits, misses, f"{ns}: {by_ns[ns]}")
        self.assertGreater(report[torch.ops.tosa.RESCALE.default].hits, 0)
        self.assertGreater(report[torch.ops.quantized_decomposed.quantize_per_tensor.default].hits, 0)
        # No op of a registered namespace was turned away for its namespace.
        for row in report.ops:
            if row.namespace in NAMESPACES:
                self.assertNotIn("non-builtin", row.bypasses, row.op)

    def test_export_passes_use_the_adopted_mode(self) -> None:
        """Every ExportPass of the lowering dispatched through the adopted mode."""
        policy = self.results["policy"]
        mode = policy["mode"]
        self.assertEqual(policy["modes_created"], [])
        # A stock mode dispatching anything would have moved torch's counters.
        before, after = policy["counters"]
        self.assertEqual(before, after)
        lowered = policy["edge"].exported_program().graph_module
        self.assertEqual(fake_modes_of(lowered), {id(mode)})
        self.assertEqual(fake_modes_of(lowered.lowered_module_0.original_module.graph_module), {id(mode)})

    def test_context_key_sees_the_tosa_spec(self) -> None:
        """The context key, consulted for tosa ops only, saw the u55 TOSA spec and the program's own ShapeEnv."""
        from executorch.backends.arm.ethosu import EthosUCompileSpec

        spec = EthosUCompileSpec("ethos-u55-128").tosa_spec
        shape_env = self.results["policy"]["shape_env"]
        self.assertEqual(self.results["policy"]["contexts"], {(str(spec), weakref.ref(shape_env))})
        self.assertIn("+u55", str(spec))

    def test_is_builtin_untouched(self) -> None:
        """is_builtin is torch's own before, after, and inside fake kernels under the policy."""
        policy = self.results["policy"]
        self.assertIs(policy["is_builtin_before"], ORIGINAL_IS_BUILTIN)
        self.assertIs(policy["is_builtin_after"], ORIGINAL_IS_BUILTIN)
        self.assertIs(library_utils.is_builtin, ORIGINAL_IS_BUILTIN)
        self.assertGreater(len(policy["is_builtin_samples"]), 0)
        self.assertTrue(all(policy["is_builtin_samples"]))
        # The sampler does see a swap: under the global patch it was replaced.
        patched = self.results["global-patch"]["is_builtin_samples"]
        self.assertGreater(len(patched), 0)
        self.assertFalse(any(patched))

    def test_no_backend_entries_in_torch_cache(self) -> None:
        """The policy run adds no backend entry to torch's class-global or ShapeEnv cache."""
        policy = self.results["policy"]
        new_namespaces = {key_namespace(k) for k in policy["new_torch_keys"]}
        self.assertTrue(new_namespaces <= tcp.BUILTIN_NAMESPACES | {"(hop)"}, new_namespaces)
        # torch.export's stock mode leaves negative ("non-builtin") entries
        # for quantized_decomposed; a positive one would answer every mode.
        self.assertEqual(positive_backend_entries(NAMESPACES), 0)
        env_cache = policy["shape_env"].fake_tensor_cache
        positive = [
            k for k in backend_entries(env_cache, NAMESPACES) if not isinstance(env_cache[k], _DispatchCacheBypassEntry)
        ]
        self.assertEqual(positive, [])


# Stock modes that still serve fake dispatches during a policy lowering, by
# flow: where they are created (a path suffix of the creating frame). Each is
# listed in docs/executorch.md, with the command that measures its cost; a
# site missing here fails test_unreached_modes_are_known.
UNREACHED_LOWERING_SITES: dict[str, tuple[str, ...]] = {
    "ethos-u55": (),
    # A throwaway FakeTensorMode() for one scratch-buffer placeholder per
    # convolution (from_tensor(torch.empty(0))).
    "cortex-m": ("executorch/backends/cortex_m/passes/aten_to_cortex_m_pass.py",),
    # The first XNNPACK lowering in a process traces the partitioner's pattern
    # graphs (bilinear_2d, sdpa) with their own modes, aten ops only; cached
    # afterwards. setUpClass lowers stock first, so only a reordering shows them.
    "xnnpack": ("executorch/backends/xnnpack/partition/graphs/",),
    "xnnpack-dynamic": ("executorch/backends/xnnpack/partition/graphs/",),
}


def entry_kinds(mode: tcp.FakeTensorMode, ns: str) -> collections.Counter[str]:
    """The mode's entries of ``ns`` by kind: "valid", "seen" (a key dispatched once) and "negative"."""
    kinds: collections.Counter[str] = collections.Counter()
    for table in mode._cache.partition.all_tables():
        for key, entry in list(table.items()):
            if getattr(key.key[0], "namespace", None) == ns:
                negative = type(entry) is _DispatchCacheBypassEntry
                kinds["seen" if entry is _driver._SEEN else "negative" if negative else "valid"] += 1
    return kinds


def backend_non_builtin(census: DispatchCensus, mode: tcp.FakeTensorMode | None) -> int:
    """Backend-op "non-builtin" bypasses: stock modes' (recorded) plus the policy mode's (its report)."""
    count = census.total(kind="stock", namespaces=NAMESPACES).non_builtin
    if mode is not None:
        count += sum(
            row.bypasses.get("non-builtin", 0) for row in mode.cache_report().ops if row.namespace in NAMESPACES
        )
    return count


class FlowChecks:
    """The checks every flow gets; a TestCase subclass sets ``FLOW``.

    setUpClass lowers one quantized program stock, under the global patch and
    adopted by a policy mode, each under the dispatch recorder.
    """

    FLOW: ClassVar[str]
    results: ClassVar[dict[str, dict[str, Any]]]

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()  # type: ignore[misc]
        spec = flow.get_flow(cls.FLOW)
        fresh_program = flow.quantized_program_factory(flow=spec)
        policy = recipe.executorch_policy()
        cls.results = {}
        for config in ("stock", "global-patch", "policy"):
            ep = fresh_program()
            shape_env = program_mode(ep).shape_env
            samples: list[bool] = []

            def probe(func: Any, samples: list[bool] = samples) -> None:
                if getattr(func, "namespace", None) in NAMESPACES:
                    samples.append(library_utils.is_builtin is ORIGINAL_IS_BUILTIN)

            keys_before = torch_cache_keys()
            with recording(probe) as census:
                lowering = flow.lower(ep, config, flow=spec, policy=policy)
            cls.results[config] = {
                "lowering": lowering,
                "census": census,
                "is_builtin_samples": samples,
                "is_builtin_after": library_utils.is_builtin,
                "new_torch_keys": torch_cache_keys() - keys_before,
                "shape_env": shape_env,
            }

    def _t(self) -> TestCase:
        return cast(TestCase, self)

    def _lowering(self, config: str) -> flow.Lowering:
        return cast(flow.Lowering, self.results[config]["lowering"])

    def test_outputs_identical(self) -> None:
        """Delegate payloads, graph code and constants are identical under all three configurations."""
        t, stock = self._t(), self._lowering("stock")
        spec = flow.get_flow(self.FLOW)
        t.assertEqual(bool(stock.payloads), spec.has_delegates)
        if spec.has_delegates:
            t.assertIn("executorch_call_delegate", stock.graph_code)
        for config in ("global-patch", "policy"):
            other = self._lowering(config)
            t.assertTrue(other.payloads == stock.payloads, f"{config}: delegate payloads differ")
            t.assertEqual(other.graph_code, stock.graph_code)
            t.assertEqual(other.constants, stock.constants)

    def test_backend_ops_served_from_cache(self) -> None:
        """Every backend namespace the flow dispatches gets entries, each key missing on its first two dispatches only; some hit."""
        t, mode = self._t(), self._lowering("policy").mode
        assert mode is not None
        by_ns = mode.cache_report().by_namespace()
        hits = 0
        for ns in flow.get_flow(self.FLOW).backend_namespaces:
            t.assertIn(ns, by_ns)
            kinds = entry_kinds(mode, ns)
            t.assertGreater(kinds["valid"], 0, f"{ns}: {by_ns[ns]}, entries {dict(kinds)}")
            # A key seen once missed once; one with an entry missed twice; one whose second sight made a negative
            # entry missed once (a negative entry of its first sight, none). Every other dispatch hit or bypassed.
            first_two = 2 * kinds["valid"] + kinds["seen"]
            misses = by_ns[ns][1]
            t.assertTrue(first_two <= misses <= first_two + kinds["negative"], f"{ns}: {by_ns[ns]}, entries {dict(kinds)}")
            hits += by_ns[ns][0]
        # A namespace may hit nothing (Cortex-M dispatches each cortex_m key at most twice): the flow's hits are the others'.
        t.assertGreater(hits, 0)

    def test_non_builtin_bypasses_within_patch(self) -> None:
        """Backend "non-builtin" bypasses: many under stock, under the policy no more than under the patch."""
        t = self._t()
        counts = {
            config: backend_non_builtin(r["census"], self._lowering(config).mode) for config, r in self.results.items()
        }
        t.assertGreater(counts["stock"], 0, counts)  # the count does see them
        t.assertLessEqual(counts["policy"], counts["global-patch"], counts)

    def test_is_builtin_untouched(self) -> None:
        """is_builtin is torch's own during (sampled at every backend dispatch) and after the policy lowering."""
        t, policy, patched = self._t(), self.results["policy"], self.results["global-patch"]
        t.assertIs(policy["is_builtin_after"], ORIGINAL_IS_BUILTIN)
        t.assertIs(library_utils.is_builtin, ORIGINAL_IS_BUILTIN)
        t.assertGreater(len(policy["is_builtin_samples"]), 0)
        t.assertTrue(all(policy["is_builtin_samples"]))
        # The probe does see a swap: under the global patch it was replaced.
        t.assertGreater(len(patched["is_builtin_samples"]), 0)
        t.assertFalse(any(patched["is_builtin_samples"]))

    def test_no_backend_entries_in_torch_cache(self) -> None:
        """The policy lowering adds no backend entry to torch's class-global or ShapeEnv cache."""
        t, policy = self._t(), self.results["policy"]
        new_namespaces = {key_namespace(k) for k in policy["new_torch_keys"]}
        t.assertTrue(new_namespaces <= tcp.BUILTIN_NAMESPACES | {"(hop)"}, new_namespaces)
        t.assertEqual(positive_backend_entries(NAMESPACES), 0)
        env_cache = policy["shape_env"].fake_tensor_cache
        positive = [
            k for k in backend_entries(env_cache, NAMESPACES) if not isinstance(env_cache[k], _DispatchCacheBypassEntry)
        ]
        t.assertEqual(positive, [])

    def test_unreached_modes_are_known(self) -> None:
        """Under the policy, stock modes serve no backend op, and only those created at the documented sites dispatch."""
        t, census = self._t(), cast(DispatchCensus, self.results["policy"]["census"])
        t.assertGreater(census.total(kind="policy").calls, 0)
        t.assertEqual(census.total(kind="stock", namespaces=NAMESPACES).calls, 0)
        known = UNREACHED_LOWERING_SITES[self.FLOW]
        dispatching = [m for m in census.modes if m.kind == "stock" and m.calls]
        for mode in dispatching:
            t.assertTrue(any(site in mode.site for site in known), f"undocumented stock mode: {mode}")
        # Every dispatch on a stock mode came from a recorded (hence listed) mode.
        t.assertEqual(sum(m.calls for m in dispatching), census.total(kind="stock").calls)


@unittest.skipIf(not HAS_EXECUTORCH, SKIP_REASON)
class TestEthosU55Flow(FlowChecks, TestCase):
    """Ethos-U55: EthosUQuantizer, to_edge_transform_and_lower with EthosUPartitioner (TOSA, Vela)."""

    FLOW = "ethos-u55"


@unittest.skipIf(not HAS_EXECUTORCH, SKIP_REASON)
class TestCortexMFlow(FlowChecks, TestCase):
    """Cortex-M: CortexMQuantizer, to_edge, CortexMPassManager(...).transform()."""

    FLOW = "cortex-m"

    def test_quantizer_passes_reach_policy_mode(self) -> None:
        """With the quantizer's graph module adopted, its annotation passes dispatch through the policy mode."""
        with recording() as census:
            flow.quantized_program_factory(flow=self.FLOW, policy=recipe.executorch_policy())
        self.assertGreater(census.total(kind="policy").calls, 0)
        # What stays on stock modes is torch.export's own mode, before adopt.
        stock_sites = {m.site for m in census.modes if m.kind == "stock" and m.calls}
        self.assertEqual(len(stock_sites), 1, stock_sites)
        self.assertIn("benchmarks/executorch/lowering.py", stock_sites.pop())


@unittest.skipIf(not HAS_EXECUTORCH, SKIP_REASON)
class TestXnnpackFlow(FlowChecks, TestCase):
    """XNNPACK: XNNPACKQuantizer, to_edge_transform_and_lower with XnnpackPartitioner."""

    FLOW = "xnnpack"


@unittest.skipIf(not HAS_EXECUTORCH, SKIP_REASON)
class TestXnnpackDynamicFlow(FlowChecks, TestCase):
    """XNNPACK on a one-layer transformer whose sequence length is a torch.export.Dim."""

    FLOW = "xnnpack-dynamic"

    def test_sequence_length_stays_symbolic(self) -> None:
        """The lowered program's input keeps a symbolic sequence length under every configuration."""
        for config in ("stock", "global-patch", "policy"):
            edge = self._lowering(config).edge
            inputs = [n.meta["val"] for n in edge.graph.nodes if n.op == "placeholder" and n.name == "x"]
            self.assertEqual(len(inputs), 1, config)
            self.assertIsInstance(inputs[0].shape[1], torch.SymInt, config)
            self.assertEqual(inputs[0].shape[2], 32, config)

    def test_symbolic_backend_hits(self) -> None:
        """quantized_decomposed ops on symbolic shapes are served from the cache, none bypassed."""
        mode = self._lowering("policy").mode
        assert mode is not None
        hits, misses, bypasses = mode.cache_report().by_namespace()["quantized_decomposed"]
        self.assertGreater(hits, 10 * misses)
        self.assertEqual(bypasses, 0)


@unittest.skipIf(not HAS_EXECUTORCH, SKIP_REASON)
class TestTosaContextKey(TestCase):
    """Why the context key is ``str(spec)``: TOSA specs that compare equal validate differently."""

    def setUp(self) -> None:
        super().setUp()
        import executorch.backends.arm.tosa.dialect  # noqa: F401  (defines torch.ops.tosa)
        from executorch.backends.arm.tosa.specification import TosaSpecification

        self.int16 = TosaSpecification.create_from_string("TOSA-1.0+INT+int16")
        self.int_only = TosaSpecification.create_from_string("TOSA-1.0+INT")

    def concat_under_both_specs(self, mode: _ft.FakeTensorMode) -> None:
        """CONCAT of int16 tensors: valid under +int16 (twice, so a policy mode makes the entry), then under plain INT."""
        from executorch.backends.arm.tosa.specification import TosaLoweringContext

        with mode:
            x = torch.empty(2, 3, dtype=torch.int16)
            with TosaLoweringContext(self.int16):
                for _ in range(2):
                    torch.ops.tosa.CONCAT.default([x, x], axis=0)
            with TosaLoweringContext(self.int_only):
                torch.ops.tosa.CONCAT.default([x, x], axis=0)

    def test_specs_compare_equal(self) -> None:
        """TosaSpecification equality ignores extensions; its string does not."""
        self.assertEqual(self.int16, self.int_only)
        self.assertEqual(hash(self.int16), hash(self.int_only))
        self.assertNotEqual(str(self.int16), str(self.int_only))

    def test_context_key_reruns_kernel_per_spec(self) -> None:
        """Keyed by str(spec), the call under plain INT runs the kernel, which rejects int16."""
        from executorch.backends.arm.tosa.dialect.lib import TosaValueError

        mode = tcp.FakeTensorMode(cache_policy=recipe.executorch_policy())
        with self.assertRaisesRegex(TosaValueError, "Unsupported dtype torch.int16 for CONCAT"):
            self.concat_under_both_specs(mode)

    def test_spec_object_key_serves_stale_result(self) -> None:
        """Keyed by the spec object, the call under plain INT is a (wrong) hit."""
        from executorch.backends.arm.tosa.specification import get_context_spec

        mode = tcp.FakeTensorMode(cache_policy=tcp.CachePolicy(namespaces=["tosa"], context_key=get_context_spec))
        self.concat_under_both_specs(mode)
        self.assertEqual(mode.cache_report()[torch.ops.tosa.CONCAT.default].hits, 1)

    def test_global_patch_serves_stale_result(self) -> None:
        """PR 21700's patch has no context at all: stock rejects the call under plain INT, the patch hits."""
        from executorch.backends.arm.tosa.dialect.lib import TosaValueError

        with self.assertRaises(TosaValueError):
            self.concat_under_both_specs(_ft.FakeTensorMode())
        with global_patch(["tosa"]):
            self.concat_under_both_specs(_ft.FakeTensorMode())


class TestExecuTorchRecipe(TestCase):
    """torch_cachepolicy.recipes.executorch, the policy an ExecuTorch user imports."""

    def test_policy_caches_pr_21700_namespaces(self) -> None:
        """The recipe caches PR 21700's namespaces and keys only tosa ops by the context."""
        import torch.ao.quantization.fx._decomposed  # noqa: F401  (defines quantized_decomposed)

        policy = recipe.executorch_policy()
        self.assertLessEqual(set(recipe.EXECUTORCH_NAMESPACES), policy.namespaces)
        self.assertEqual(policy.namespaces - tcp.BUILTIN_NAMESPACES, set(recipe.EXECUTORCH_NAMESPACES))
        self.assertTrue(policy.has_context)
        quantize = torch.ops.quantized_decomposed.quantize_per_tensor.default
        self.assertTrue(policy.is_cacheable(quantize))
        self.assertFalse(policy.uses_context(quantize))

    def test_calls_share_one_partition(self) -> None:
        """Policies from two calls have equal rules, hence one identity: a shared store serves both."""
        self.assertEqual(recipe.executorch_policy().identity, recipe.executorch_policy().identity)

    @unittest.skipIf(not HAS_EXECUTORCH, SKIP_REASON)
    def test_context_key_is_the_active_spec(self) -> None:
        """None outside a TOSA lowering context, (str(spec), the context's ShapeEnv, weakly) inside; tosa ops consult
        it, and an entry keyed by it neither keeps the ShapeEnv alive nor serves another one."""
        import executorch.backends.arm.tosa.dialect  # noqa: F401  (defines torch.ops.tosa)
        from executorch.backends.arm.tosa.specification import TosaLoweringContext, TosaSpecification

        spec = TosaSpecification.create_from_string("TOSA-1.0+INT+int16")
        self.assertIsNone(recipe.tosa_context_key())
        with TosaLoweringContext(spec):
            self.assertEqual(recipe.tosa_context_key(), ("TOSA-1.0+INT+int16", None))
        shape_env, other = ShapeEnv(), ShapeEnv()
        with TosaLoweringContext(spec, shape_env):
            key = recipe.tosa_context_key()
        with TosaLoweringContext(spec, other):
            self.assertNotEqual(recipe.tosa_context_key(), key)
        with TosaLoweringContext(spec, shape_env):
            self.assertEqual(recipe.tosa_context_key(), key)
        ref = weakref.ref(shape_env)
        del shape_env
        gc.collect()
        self.assertIsNone(ref())
        self.assertTrue(recipe.executorch_policy().uses_context(torch.ops.tosa.CONCAT.default))


if __name__ == "__main__":
    run_tests()
