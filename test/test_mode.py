# Owner(s): ["module: fakeTensor"]
"""Tests of torch_cachepolicy.FakeTensorMode: caching, safety, isolation, lifetime."""

from __future__ import annotations

import collections.abc
import contextlib
import gc
import math
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

import cachepolicy_testing as testing
import torch
import torch._library.utils as library_utils
from torch._ops import OpOverload
from torch._subclasses._fake_tensor_utils import _CacheKeyState
from torch._subclasses.fake_tensor import (
    FakeTensor,
    _BypassDispatchCache,
    _DispatchCacheBypassEntry,
    unset_fake_temporarily,
)
from torch._subclasses.fake_tensor import FakeTensorMode as StockMode
from torch.fx.experimental.symbolic_shapes import (
    DimDynamic,
    ShapeEnv,
    StatelessSymbolicContext,
)
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
)

import torch_cachepolicy as tcp
from torch_cachepolicy import _driver, _key, _verify
from torch_cachepolicy.report import KeyStats

aten = torch.ops.aten

conv, pair, dyn, size0 = testing.op("conv"), testing.op("pair"), testing.op("dyn"), testing.op("size0")
described = testing.described
q_per_tensor = torch.ops.quantized_decomposed.quantize_per_tensor.default
RUNS_BACKEND_OPS = "its kernel dispatches a backend op or an op the policy denies (a hit would not run it)"
dq_per_tensor = torch.ops.quantized_decomposed.dequantize_per_tensor.default


def storage(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


def keys_for_namespace(table: dict[Any, Any], ns: str) -> list[Any]:
    return [k for k in list(table) if getattr(k.key[0], "namespace", None) == ns]


def valid_entries_for_namespace(table: dict[Any, Any], ns: str) -> list[Any]:
    """Positive entries; stock itself leaves negative 'non-builtin' ones."""
    return [k for k in keys_for_namespace(table, ns) if not isinstance(table.get(k), _DispatchCacheBypassEntry)]


class TestBackendCaching(testing.CachePolicyTestCase):
    def test_backend_op_runs_its_fake_kernel_twice_then_hits(self) -> None:
        """A registered-namespace op runs its fake kernel on its first sight and on the miss making the entry, then hits."""
        # Crosscheck off: kernel runs are counted, and a crosscheck runs the kernel again.
        mode = tcp.FakeTensorMode(cache_policy=testing.backend_policy(), cache_crosscheck=False)
        with mode:
            x = torch.empty(2, 3, 8, 8)
            outs = [conv(x, 2) for _ in range(4)]
        self.assertEqual(testing.calls["conv"], 2)
        self.assertEqual((mode.cache_report()[conv].hits, mode.cache_report()[conv].misses), (2, 2))
        for out in outs:
            self.assertIsInstance(out, FakeTensor)
            self.assertEqual(out.shape, (2, 6, 4, 4))
        self.assertEqual(len({storage(o) for o in outs}), 4)

    def test_stock_runs_the_fake_kernel_every_time(self) -> None:
        """Control: stock FakeTensorMode never caches the same backend op."""
        with StockMode():
            x = torch.empty(2, 3, 8, 8)
            for _ in range(4):
                conv(x, 2)
        self.assertEqual(testing.calls["conv"], 4)

    def test_quantized_decomposed_ops(self) -> None:
        """Real quantized_decomposed ops shipped with torch are served from cache."""
        mode = tcp.FakeTensorMode(cache_policy=testing.backend_policy())
        with mode:
            x = torch.empty(4, testing.fresh_size())
            for _ in range(3):
                y = q_per_tensor(x, 0.1, 0, -128, 127, torch.int8)
                z = dq_per_tensor(y, 0.1, 0, -128, 127, torch.int8)
        self.assertEqual((y.dtype, z.dtype), (torch.int8, torch.float32))
        report = mode.cache_report()
        self.assertEqual((report[q_per_tensor].hits, report[q_per_tensor].misses), (1, 2))
        self.assertEqual((report[dq_per_tensor].hits, report[dq_per_tensor].misses), (1, 2))

    def test_crosscheck_runs_on_every_hit(self) -> None:
        """With crosscheck on, each hit re-runs the kernel and compares."""
        mode = tcp.FakeTensorMode(cache_policy=testing.backend_policy(), cache_crosscheck=True)
        with mode:
            x = torch.empty(1, 2, 5, 5)
            for _ in range(4):
                conv(x, 1)
                pair(x)
        report = mode.cache_report()
        self.assertEqual([(report[op].hits, report[op].misses) for op in (conv, pair)], [(2, 2)] * 2)
        self.assertEqual((testing.calls["conv"], testing.calls["pair"]), (4, 4))  # first sight, miss, 2 crosschecks

    def test_crosscheck_follows_dynamo_config(self) -> None:
        """cache_crosscheck=None follows torch._dynamo.config."""
        with mock.patch("torch._dynamo.config.fake_tensor_cache_crosscheck_enabled", True):
            self.assertTrue(tcp.FakeTensorMode().cache_crosscheck_enabled)
        with mock.patch("torch._dynamo.config.fake_tensor_cache_crosscheck_enabled", False):
            self.assertFalse(tcp.FakeTensorMode().cache_crosscheck_enabled)
            self.assertTrue(tcp.FakeTensorMode(cache_crosscheck=True).cache_crosscheck_enabled)

    def test_crosscheck_catches_a_wrong_entry(self) -> None:
        """A corrupted entry is reported by crosscheck instead of returned."""
        mode = tcp.FakeTensorMode(cache_policy=testing.backend_policy(), cache_crosscheck=True)
        with mode:
            x = torch.empty(1, 2, 6, 6)
            y = torch.empty(1, 2, 6, 6)
            for _ in range(2):  # the first sight, then the miss that makes the entry
                conv(x, 1)
                conv(y, 2)
            tables = list(mode._cache.partition.all_tables())
            entries = {k.key[-1]: (t, k) for t in tables for k in t if k.key[0] is conv}
            # Swap the two entries' values: each key now answers with the other's shape.
            (t1, k1), (t2, k2) = entries[1], entries[2]
            t1[k1], t2[k2] = t2[k2], t1[k1]
            with self.assertRaisesRegex(tcp.CrosscheckError, "differs from an uncached dispatch"):
                conv(x, 1)

    def test_symbolic_shapes(self) -> None:
        """Backend ops on symbolic inputs are cached per ShapeEnv, outside torch's caches."""
        shape_env = ShapeEnv()
        mode = tcp.FakeTensorMode(cache_policy=testing.backend_policy(), shape_env=shape_env, cache_crosscheck=True)
        ctx = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC] + [DimDynamic.STATIC] * 3)
        x = mode.from_tensor(torch.empty(3, 2, 8, 8), symbolic_context=ctx)
        with mode:
            a = conv(x, 2)
            conv(x, 2)  # the miss that makes the entry
            b = conv(x, 2)
            n = size0(x)
            size0(x)
            m = size0(x)
        self.assertEqual(testing.calls["conv"], 3)  # the first sight, the miss, one crosscheck
        self.assertEqual(str(a.shape[0]), str(x.shape[0]))
        self.assertEqual(a.shape, b.shape)
        self.assertIs(n.node, m.node)
        self.assertEqual((mode.cache_report()[conv].hits, mode.cache_report()[size0].hits), (1, 1))
        self.assertEqual(keys_for_namespace(shape_env.fake_tensor_cache, testing.NS), [])
        self.assertEqual(valid_entries_for_namespace(StockMode.cache, testing.NS), [])
        self.assertTrue(any(keys_for_namespace(t, testing.NS) for t in mode._cache.partition.all_tables()))

    def test_aten_entries_are_shared_with_torch_by_default(self) -> None:
        """aten entries go to torch's storage, exactly as a stock mode would put them."""
        n = testing.fresh_size()
        with StockMode():
            torch.empty(n, 3).sin()
        mode = tcp.FakeTensorMode()
        with mode:
            torch.empty(n, 3).sin()
        self.assertEqual(mode.cache_report()[torch.ops.aten.sin.default].hits, 1)

    def test_isolated_store_keeps_aten_private(self) -> None:
        """An isolated store computes aten entries itself and keeps them."""
        n = testing.fresh_size()
        before = len(StockMode.cache)
        store = tcp.CacheStore(isolated=True)
        mode = tcp.FakeTensorMode(cache_store=store)
        with mode:
            for _ in range(2):
                torch.empty(n, 3).cos()
        self.assertEqual(len(StockMode.cache), before)
        self.assertHitsMisses(mode, 2, 2)
        self.assertEqual(len(store), 2)


def stock_bypass_reason(op: OpOverload) -> str | None:
    """Why stock FakeTensorMode refuses to cache ``op`` whatever its arguments (None: it does not)."""
    try:
        StockMode()._validate_cache_key(op, (), {})
    except _BypassDispatchCache as e:
        return e.reason
    return None


class TestSafety(testing.CachePolicyTestCase):
    """Each case also runs with the safety checks removed (the naive namespace
    opt-in) and must then go wrong, so these tests can fail."""

    @contextmanager
    def naive(self) -> Iterator[None]:
        """The safety checks removed; crosscheck off for the modes made inside, whose wrong hits are the point."""
        with (
            testing.crosscheck_off(),
            mock.patch.object(_driver, "check_backend_op", lambda *a, **k: None),
            mock.patch.object(_driver, "check_backend_output", lambda *a, **k: None),
            mock.patch.object(_driver, "verify_entry", lambda *a, **k: None),
            mock.patch.object(_driver, "shape_env_state", lambda shape_env, **kwargs: ()),
        ):
            yield

    def _unbacked_symbols(self) -> list[Any]:
        mode = tcp.FakeTensorMode(cache_policy=testing.backend_policy(), shape_env=ShapeEnv())
        with mode:
            x = torch.empty(4, 4)
            return [dyn(x) for _ in range(3)]  # the first sight, the miss, the call a stored entry would serve

    def test_unbacked_scalar_output_is_never_replayed(self) -> None:
        """Each call of an op returning new_dynamic_size() gets a fresh symbol."""
        a, b, c = self._unbacked_symbols()
        self.assertEqual(len({a.node.expr, b.node.expr, c.node.expr}), 3)
        with self.naive():
            a, b, c = self._unbacked_symbols()
        self.assertIs(b.node.expr, c.node.expr)

    def test_scalar_output_derived_from_inputs_is_cached(self) -> None:
        """A SymInt output made of input symbols is safe to cache."""
        mode = tcp.FakeTensorMode(cache_policy=testing.backend_policy(), shape_env=ShapeEnv())
        x = mode.from_tensor(
            torch.empty(5, 2),
            symbolic_context=StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC, DimDynamic.STATIC]),
        )
        with mode:
            for _ in range(3):
                size0(x)
        self.assertEqual((mode.cache_report()[size0].hits, mode.cache_report()[size0].misses), (1, 2))

    def _undeclared_alias(self) -> tuple[torch.Tensor, list[torch.Tensor]]:
        mode = tcp.FakeTensorMode(cache_policy=testing.backend_policy())
        with mode:
            x = torch.empty(3, 3)
            return x, [testing.op("bad_view")(x) for _ in range(3)]

    def test_undeclared_aliasing_is_never_cached(self) -> None:
        """An output sharing an input's storage without a schema annotation bypasses."""
        x, outs = self._undeclared_alias()
        self.assertEqual([storage(o) for o in outs], [storage(x)] * 3)
        with self.naive():
            x, outs = self._undeclared_alias()
        self.assertNotEqual(storage(outs[2]), storage(x))

    def _twins(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        with tcp.FakeTensorMode(cache_policy=testing.backend_policy()):
            x = torch.empty(2, 2)
            return [testing.op("twins")(x) for _ in range(3)]

    def test_outputs_aliasing_each_other_are_never_cached(self) -> None:
        """Two outputs sharing a storage bypass, so a hit cannot split them."""
        self.assertEqual([storage(a) == storage(b) for a, b in self._twins()], [True, True, True])
        with self.naive():
            self.assertEqual([storage(a) == storage(b) for a, b in self._twins()], [True, True, False])

    @parametrize("store", ["shared", "isolated"])
    def test_builtin_alias_that_is_not_a_view(self, store: str) -> None:
        """prims.as_strided returns Tensor(a!) on its input's storage: never replayed unaliased."""
        op = torch.ops.prims.as_strided.default
        mode = tcp.FakeTensorMode(cache_store=tcp.CacheStore(isolated=store == "isolated"))
        with mode:
            x = torch.empty(2, testing.fresh_size())
            outs = [op(x, [3, 2], [1, 3], 0) for _ in range(3)]
        self.assertEqual({storage(o) for o in outs}, {storage(x)})
        # torch 2.14 refuses to cache prims.as_strided itself, with its own
        # reason, before our entry check runs; 2.13 caches it, and only the
        # entry check keeps the hit aliased (the naive control shows why).
        stock_reason = stock_bypass_reason(op)
        self.assertBypassed(mode, op, stock_reason or "output aliasing a cache hit would not reproduce", 3)
        if stock_reason is None:
            with self.naive(), tcp.FakeTensorMode(cache_store=tcp.CacheStore(isolated=True)):
                x = torch.empty(2, 3)
                outs = [op(x, [3, 2], [1, 3], 0) for _ in range(2)]
            self.assertNotEqual(storage(outs[1]), storage(x))

    def test_declared_view_is_cached_with_aliasing(self) -> None:
        """A Tensor(a) -> Tensor(a) backend view hits and still aliases its input."""
        mode = tcp.FakeTensorMode(cache_policy=testing.backend_policy())
        with mode:
            x = torch.empty(3, 3)
            outs = [testing.op("good_view")(x) for _ in range(4)]
        self.assertEqual(mode.cache_report()[testing.op("good_view")].hits, 2)
        self.assertEqual({storage(o) for o in outs}, {storage(x)})

    def _mutations(self, policy: tcp.CachePolicy) -> int:
        # Crosscheck off: kernel runs are counted, and a crosscheck runs the kernel again.
        with tcp.FakeTensorMode(cache_policy=policy, cache_crosscheck=False):
            x = torch.empty(3)
            for _ in range(4):
                testing.op("mut")(x)
        return testing.calls["mut"]

    def test_mutating_op_needs_an_explicit_opt_in(self) -> None:
        """A Tensor(a!) op runs its kernel every time unless allowed by name (then twice: its first sight, its miss)."""
        self.assertEqual(self._mutations(testing.backend_policy()), 4)
        testing.calls.clear()
        self.assertEqual(self._mutations(testing.backend_policy(allow=[testing.op("mut")])), 2)
        testing.calls.clear()
        with self.naive():
            self.assertEqual(self._mutations(testing.backend_policy()), 2)

    def _multi_view(self) -> tcp.FakeTensorMode:
        mode = tcp.FakeTensorMode(cache_policy=testing.backend_policy())
        with mode:
            x, y = torch.empty(2, 2), torch.empty(2, 2)
            for _ in range(2):  # the first sight, then the miss that reaches the schema check
                testing.op("multi_view")(x, y)
        return mode

    def test_view_with_several_tensor_args_bypasses(self) -> None:
        """A view schema with two tensor args bypasses instead of asserting."""
        mode = self._multi_view()
        self.assertBypassed(mode, testing.op("multi_view"), "view op with several tensor arguments", 1)
        # Without the schema check torch's entry builder asserts ("exactly one tensor arg"); the miss still bypasses.
        with self.naive():
            naive = self._multi_view()
        self.assertBypassed(naive, testing.op("multi_view"), "torch's entry builder cannot describe the output (AssertionError)", 1)

    @parametrize("returns", ["ScalarType", "Device", "Layout", "MemoryFormat", "(Tensor, ScalarType)"])
    def test_outputs_torch_cannot_describe_bypass(self, returns: str) -> None:
        """An op returning a dtype, device, layout or memory format (which no aten op torch caches returns) works as
        under stock: its miss bypasses with the reason, never raises."""
        lib = torch.library.Library("tcp_returns", "FRAGMENT")
        self.addCleanup(lib._destroy)
        lib.define(f"f(Tensor x) -> {returns}")
        values = {"ScalarType": lambda x: x.dtype, "Device": lambda x: x.device, "Layout": lambda x: x.layout,
                  "MemoryFormat": lambda x: torch.contiguous_format, "(Tensor, ScalarType)": lambda x: (x.new_empty(2), x.dtype)}
        torch.library.register_fake("tcp_returns::f", values[returns], lib=lib)
        op = torch.ops.tcp_returns.f.default
        outs = []
        for mode in (StockMode(), tcp.FakeTensorMode(cache_policy=tcp.CachePolicy(namespaces=["tcp_returns"]))):
            with mode:
                outs.append([str(op(torch.empty(3))) for _ in range(3)])
        self.assertEqual(outs[1], outs[0])
        self.assertBypassed(mode, op, "torch's entry builder cannot describe the output (AssertionError)", 2)

    @parametrize("overload", ["default", "ovl"])
    def test_reregistered_fake_kernel_is_not_served_old_entries(self, overload: str) -> None:
        """Swapping an op's fake impl makes entries of the old kernel unused."""
        op = getattr(torch.ops.tcp_test.swappable, overload)
        extra = () if overload == "default" else (3,)
        name = op.name()
        # Crosscheck off: kernel runs are counted, and a crosscheck runs the kernel again.
        mode = tcp.FakeTensorMode(cache_policy=testing.backend_policy(), cache_crosscheck=False)
        lib = torch.library.Library(testing.NS, "FRAGMENT")
        try:
            with mode:
                x = torch.empty(4, 4)
                for _ in range(2):  # the first sight, then the miss that makes v1's entry
                    self.assertEqual(op(x, *extra).shape, (4, 4))
                torch.library.register_fake(name, lambda x, *a: testing.swappable_v2(x), lib=lib)
                for _ in range(3):  # v2's first sight, its miss, its hit
                    self.assertEqual(op(x, *extra).shape, (4, 1))
        finally:
            lib._destroy()
        self.assertEqual(testing.calls["swappable"], 4)
        with mode:
            self.assertEqual(op(x, *extra).shape, (4, 4))  # v1 again: its entries are still valid
        self.assertEqual(testing.calls["swappable"], 4)

    def test_context_key_separates_ambient_state(self) -> None:
        """A context_key hook keeps a kernel reading global state from being replayed stale."""
        ambient_cast = testing.op("ambient_cast")

        def run(policy: tcp.CachePolicy) -> list[torch.dtype]:
            dtypes = []
            # Crosscheck off: kernel runs are counted, and the policy without the hook must show its stale hits.
            with tcp.FakeTensorMode(cache_policy=policy, cache_crosscheck=False):
                x = torch.empty(2)
                for dtype in [torch.float32, torch.int8] * 3:
                    testing.ambient["dtype"] = dtype
                    dtypes.append(ambient_cast(x).dtype)
            testing.ambient["dtype"] = torch.float32
            return dtypes

        expected = [torch.float32, torch.int8] * 3
        self.assertEqual(run(testing.backend_policy(context_key=lambda: testing.ambient["dtype"])), expected)
        self.assertEqual(testing.calls["ambient_cast"], 4)  # per context: the first sight and the miss
        self.assertNotEqual(run(testing.backend_policy()), expected)  # without the hook: stale

    def test_context_namespaces_limit_the_context(self) -> None:
        """With context_namespaces, ops of other namespaces share entries across contexts."""
        ambient_cast = testing.op("ambient_cast")
        policy = testing.backend_policy(context_key=lambda: testing.ambient["dtype"], context_namespaces=[testing.NS])
        mode = tcp.FakeTensorMode(cache_policy=policy)
        with mode:
            x = torch.empty(2, testing.fresh_size())
            for dtype in (torch.float32, torch.int8, torch.float32, torch.float32):
                testing.ambient["dtype"] = dtype
                self.assertEqual(ambient_cast(x).dtype, dtype)
                q_per_tensor(x, 0.1, 0, -128, 127, torch.int8)
        testing.ambient["dtype"] = torch.float32
        report = mode.cache_report()
        self.assertEqual((report[ambient_cast].hits, report[ambient_cast].misses), (1, 3))
        self.assertEqual((report[q_per_tensor].hits, report[q_per_tensor].misses), (2, 2))

    def test_context_key_subclass_override(self) -> None:
        """A subclass may override context_key() instead of passing a hook."""

        class SpecPolicy(tcp.CachePolicy):
            def context_key(self) -> Any:
                return testing.ambient["dtype"]

        with tcp.FakeTensorMode(cache_policy=SpecPolicy(namespaces=[testing.NS])):
            x = torch.empty(2)
            testing.ambient["dtype"] = torch.int16
            for _ in range(2):  # the first sight, then the miss that makes the int16 entry
                self.assertEqual(testing.op("ambient_cast")(x).dtype, torch.int16)
            testing.ambient["dtype"] = torch.float32
            self.assertEqual(testing.op("ambient_cast")(x).dtype, torch.float32)


class TestVerification(testing.CachePolicyTestCase):
    """Note [Verify every entry on the miss that creates it], and the crosscheck
    that backs it: each test also shows the wrong hit the check prevents."""

    def setUp(self) -> None:
        super().setUp()
        self.lib = torch.library.Library("tcp_verify", "FRAGMENT")
        self.addCleanup(self.lib._destroy)
        self.lib.define("offset(Tensor x) -> Tensor")
        self.lib.define("unsqueezes(Tensor x) -> Tensor")
        torch.library.register_fake("tcp_verify::offset", lambda x: x.new_empty(x.numel() + 8)[8:], lib=self.lib)

        def unsqueezes(x: torch.Tensor) -> torch.Tensor:
            x.unsqueeze_(0)
            return x.new_empty(2)

        torch.library.register_fake("tcp_verify::unsqueezes", unsqueezes, lib=self.lib)
        self.policy = tcp.CachePolicy(namespaces=["tcp_verify"])

    @contextmanager
    def unverified(self) -> Iterator[None]:
        """The naive opt-in: entries as torch builds them, nothing compared; crosscheck off for the modes made inside,
        whose wrong hits are the point."""
        with (
            testing.crosscheck_off(),
            mock.patch.object(_driver, "verify_entry", lambda *a, **k: None),
            mock.patch.object(_verify.InputSnapshot, "changed", lambda self: None),
        ):
            yield

    def test_fresh_output_at_an_offset_is_never_replayed_at_zero(self) -> None:
        """A hit would rebuild the output at offset 0; the miss notices and bypasses."""
        mode = tcp.FakeTensorMode(cache_policy=self.policy)
        with mode:
            outs = [torch.ops.tcp_verify.offset(torch.empty(4)) for _ in range(3)]
        self.assertEqual([o.storage_offset() for o in outs], [8, 8, 8])
        self.assertBypassed(mode, torch.ops.tcp_verify.offset.default, "a hit would differ in storage_offset", 2)
        with self.unverified():
            mode = tcp.FakeTensorMode(cache_policy=self.policy)
            with mode:
                outs = [torch.ops.tcp_verify.offset(torch.empty(4)) for _ in range(3)]
        self.assertEqual([o.storage_offset() for o in outs], [8, 8, 0])

    def test_input_metadata_change_is_never_skipped(self) -> None:
        """A kernel that unsqueezes its input runs on every call."""
        mode = tcp.FakeTensorMode(cache_policy=self.policy)
        with mode:
            xs = [torch.empty(3) for _ in range(3)]
            for x in xs:
                torch.ops.tcp_verify.unsqueezes(x)
        self.assertEqual([x.shape for x in xs], [(1, 3)] * 3)
        # From the first call: a key's first sight compares the inputs too (Note [An entry on a key's second sight]).
        self.assertBypassed(mode, torch.ops.tcp_verify.unsqueezes.default, "fake kernel changed an input's shape", 3)
        with self.unverified():
            with tcp.FakeTensorMode(cache_policy=self.policy):
                xs = [torch.empty(3) for _ in range(3)]
                for x in xs:
                    torch.ops.tcp_verify.unsqueezes(x)
        self.assertEqual([x.shape for x in xs], [(1, 3), (1, 3), (3,)])

    def test_a_kernel_memoizing_on_its_input_is_never_replayed(self) -> None:
        """A kernel that changes an input only on its first run on it (a memo) bypasses from the key's first sight."""
        self.lib.define("memo(Tensor x) -> Tensor")

        def memo(x: torch.Tensor) -> torch.Tensor:
            if not hasattr(x, "tcp_memo"):
                x.tcp_memo = x.shape[0]  # type: ignore[attr-defined]
            return x.new_empty(2)

        torch.library.register_fake("tcp_verify::memo", memo, lib=self.lib)
        op = torch.ops.tcp_verify.memo.default
        mode = tcp.FakeTensorMode(cache_policy=self.policy)
        with mode:
            x, y = torch.empty(3), torch.empty(3)
            op(x), op(x)  # the first sight, then a run on the same input that changes nothing
            op(y)  # a hit would leave y without its memo
        self.assertEqual(getattr(y, "tcp_memo", None), 3)
        self.assertBypassed(mode, op, "fake kernel changed an input's python attributes", 3)

    @parametrize("op_name", ["offset", "unsqueezes"])
    def test_crosscheck_catches_what_verification_would(self, op_name: str) -> None:
        """Without verification, the crosscheck reports the wrong hit (storage offset, input metadata)."""
        op = getattr(torch.ops.tcp_verify, op_name).default
        expected = {"offset": "differs from an uncached dispatch in output 0 storage_offset",
                    "unsqueezes": "changed an input's shape; the cache hit did not"}[op_name]
        with tcp.FakeTensorMode(cache_policy=self.policy, cache_crosscheck=True):
            with self.unverified():
                op(torch.empty(3))  # the first sight
                op(torch.empty(3))  # the miss stores the entry torch builds
            with self.assertRaisesRegex(tcp.CrosscheckError, expected):
                op(torch.empty(3))

    def test_signed_zero_and_nan_arguments(self) -> None:
        """-0.0 gets its own entry; NaN bypasses without growing the store."""
        self.lib.define("by_sign(Tensor x, float s) -> Tensor")
        torch.library.register_fake(
            "tcp_verify::by_sign",
            lambda x, s: x.new_empty(2 if math.copysign(1.0, s) < 0 else 1),
            lib=self.lib,
        )
        op = torch.ops.tcp_verify.by_sign.default
        mode = tcp.FakeTensorMode(cache_policy=self.policy)
        with mode:
            x = torch.empty(1)
            shapes = [tuple(op(x, s).shape) for s in (0.0, -0.0) * 3]
            size = len(mode.cache_store)
            for _ in range(20):
                op(x, float("nan"))
        self.assertEqual(shapes, [(1,), (2,)] * 3)
        self.assertEqual(len(mode.cache_store), size)
        self.assertBypassed(mode, op, "NaN argument", 20)
        self.assertEqual((mode.cache_report()[op].hits, mode.cache_report()[op].misses), (2, 4))

    def test_view_bases_autograd_state_joins_the_key(self) -> None:
        """A kernel reading its view argument's base (x._base.grad, x._base.requires_grad) gets one entry per state."""
        self.lib.define("reads_base(Tensor x) -> Tensor")

        def reads_base(x: torch.Tensor) -> torch.Tensor:
            base = x._base
            return x.new_empty(2 if base is not None and base.grad is not None else 3)

        torch.library.register_fake("tcp_verify::reads_base", reads_base, lib=self.lib)
        op = torch.ops.tcp_verify.reads_base.default
        sizes = []
        for mode in (StockMode(), tcp.FakeTensorMode(cache_policy=self.policy)):
            with mode:
                plain, graded = torch.empty(6, requires_grad=True), torch.empty(6, requires_grad=True)
                graded.grad = torch.empty(6)
                with torch.no_grad():
                    sizes.append([op(base[1:]).shape[0] for base in (plain, graded, plain, graded)])
        self.assertEqual(sizes[1], sizes[0])
        self.assertEqual(sizes[0], [3, 2, 3, 2])

    def test_aliased_arguments_get_their_own_entry(self) -> None:
        """op(x, x) and op(x, y) with equal metadata are different keys."""
        self.lib.define("pair_in(Tensor a, Tensor b) -> Tensor")

        def pair_in(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            if a.untyped_storage()._cdata == b.untyped_storage()._cdata:
                raise ValueError("tcp_verify::pair_in: a and b share storage")
            return a.new_empty(a.shape)

        torch.library.register_fake("tcp_verify::pair_in", pair_in, lib=self.lib)
        op = torch.ops.tcp_verify.pair_in.default
        with tcp.FakeTensorMode(cache_policy=self.policy):
            x, y = torch.empty(3), torch.empty(3)
            op(x, y)
            op(x, y)
            with self.assertRaisesRegex(ValueError, "share storage"):
                op(x, x)
            with self.assertRaisesRegex(ValueError, "share storage"):
                op(x[:], x)

    def test_inner_op_context_is_a_dependency(self) -> None:
        """A kernel calling an op that reads the context is run on every call, never replayed across contexts."""
        self.lib.define("outer(Tensor x) -> Tensor")
        torch.library.register_fake("tcp_verify::outer", lambda x: testing.op("ambient_cast")(x), lib=self.lib)
        policy = tcp.CachePolicy(
            namespaces=["tcp_verify", testing.NS],
            context_key=lambda: testing.ambient["dtype"],
            context_namespaces=[testing.NS],
        )
        mode = tcp.FakeTensorMode(cache_policy=policy)
        try:
            with mode:
                x = torch.empty(2)
                dtypes = []
                for dtype in (torch.float16, torch.float16, torch.int8, torch.float16, torch.float16):
                    testing.ambient["dtype"] = dtype
                    dtypes.append(torch.ops.tcp_verify.outer(x).dtype)
        finally:
            testing.ambient["dtype"] = torch.float32
        self.assertEqual(dtypes, [torch.float16, torch.float16, torch.int8, torch.float16, torch.float16])
        # The outer op's kernel dispatches a backend op: its first sight is a miss, every later call a bypass that
        # runs it (Note [Entries cover inner ops]).
        self.assertBypassed(mode, torch.ops.tcp_verify.outer.default, RUNS_BACKEND_OPS, 4)
        self.assertEqual(mode.cache_report()[torch.ops.tcp_verify.outer.default].misses, 1)
        self.assertEqual(mode.cache_report()[testing.op("ambient_cast")].hits, 2)

    def test_context_key_is_asked_once_per_dispatch_of_its_namespaces(self) -> None:
        """context_key() is called once per dispatch (hit or miss) of an op of context_namespaces, and never for
        other ops, even ones whose kernel dispatches such an op (that inner dispatch asks once)."""
        self.lib.define("outer(Tensor x) -> Tensor")
        torch.library.register_fake("tcp_verify::outer", lambda x: testing.op("ambient_cast")(x), lib=self.lib)
        asked: list[int] = []
        policy = tcp.CachePolicy(
            namespaces=["tcp_verify", testing.NS, "quantized_decomposed"],
            context_key=lambda: asked.append(1) or testing.ambient["dtype"],
            context_namespaces=[testing.NS],
        )
        calls = {
            "ambient_cast": lambda x: testing.op("ambient_cast")(x),
            "outer": lambda x: torch.ops.tcp_verify.outer(x),
            "quantize": lambda x: q_per_tensor(x, 0.1, 0, -128, 127, torch.int8),
        }
        per_call = {}
        with tcp.FakeTensorMode(cache_policy=policy):
            x = torch.empty(2)
            for name, call in calls.items():
                counts = []
                for _ in range(4):
                    asked.clear()
                    call(x)
                    counts.append(len(asked))
                per_call[name] = counts
        self.assertEqual(per_call, {"ambient_cast": [1] * 4, "outer": [1] * 4, "quantize": [0] * 4})

    @parametrize("where", ["mode", "meta", "scratch_stock_mode"])
    def test_inner_kernel_swapped(self, where: str) -> None:
        """An inner op dispatched through the mode is a dependency (a swap starts afresh); one a kernel evaluates
        outside the mode is not tracked, and crosscheck catches the stale hit."""
        self.lib.define("inner(Tensor x) -> Tensor")
        self.lib.define("outer(Tensor x) -> Tensor")
        torch.library.register_fake("tcp_verify::inner", lambda x: x.new_empty(5), lib=self.lib)
        inner = torch.ops.tcp_verify.inner.default

        def outer(x: torch.Tensor) -> torch.Tensor:
            if where == "mode":
                return inner(x).new_empty(inner(x).shape)
            if where == "meta":
                with unset_fake_temporarily():
                    n = inner(torch.empty(x.shape, device="meta")).shape[0]
            else:
                with StockMode() as scratch:
                    n = inner(scratch.from_tensor(torch.empty(x.shape))).shape[0]
            return x.new_empty(n)

        torch.library.register_fake("tcp_verify::outer", outer, lib=self.lib)
        # Crosscheck off until the limit's stale hit has shown; then on, to catch it.
        mode = tcp.FakeTensorMode(cache_policy=self.policy, cache_crosscheck=False)
        x = mode.from_tensor(torch.empty(3))
        with mode:
            for _ in range(2):  # the first sight, then the miss that makes the entry
                self.assertEqual(torch.ops.tcp_verify.outer(x).shape, (5,))
        lib2 = torch.library.Library("tcp_verify", "FRAGMENT")
        self.addCleanup(lib2._destroy)
        torch.library.register_fake("tcp_verify::inner", lambda x: x.new_empty(14), lib=lib2, allow_override=True)
        with mode:
            again = torch.ops.tcp_verify.outer(x).shape
        if where == "mode":
            self.assertEqual(again, (14,))
            return
        self.assertEqual(again, (5,))  # the documented limit (docs/guide.md): not tracked
        mode.cache_crosscheck_enabled = True
        with mode, self.assertRaisesRegex(tcp.CrosscheckError, "differs from an uncached dispatch in output 0 shape"):
            torch.ops.tcp_verify.outer(x)

    def test_kernel_returning_its_memo(self) -> None:
        """A kernel returning the tensor it made on an earlier call gets a fresh, equal tensor on a hit (the
        documented limit: every field matches, crosscheck included, but not the identity across calls)."""
        self.lib.define("memo(Tensor x) -> Tensor")
        memo: dict[object, torch.Tensor] = {}

        def kernel(x: torch.Tensor) -> torch.Tensor:
            return memo.setdefault(tuple(x.shape), x.new_empty(x.shape))

        torch.library.register_fake("tcp_verify::memo", kernel, lib=self.lib)
        mode = tcp.FakeTensorMode(cache_policy=self.policy, cache_crosscheck=True)
        x = mode.from_tensor(torch.empty(3))
        with mode:
            outs = [torch.ops.tcp_verify.memo(x) for _ in range(4)]
        self.assertEqual([o is outs[0] for o in outs], [True, True, False, False])
        self.assertEqual({(o.shape, o.stride(), o.dtype, o.storage_offset()) for o in outs}, {((3,), (1,), torch.float32, 0)})
        self.assertEqual(mode.cache_report()[torch.ops.tcp_verify.memo.default].hits, 2)

    def test_denied_inner_op_runs_every_time(self) -> None:
        """A backend kernel calling a denied op is not cached either."""
        self.lib.define("outer(Tensor x) -> Tensor")
        torch.library.register_fake("tcp_verify::outer", lambda x: conv(x, 1), lib=self.lib)
        policy = testing.backend_policy()
        policy.register_namespace("tcp_verify")
        policy.deny(conv)
        mode = tcp.FakeTensorMode(cache_policy=policy)
        with mode:
            x = torch.empty(1, 2, 4, 4)
            for _ in range(3):
                torch.ops.tcp_verify.outer(x)
        self.assertEqual(testing.calls["conv"], 3)
        self.assertBypassed(mode, torch.ops.tcp_verify.outer.default, RUNS_BACKEND_OPS, 2)  # after its first sight


def change_policy_state(mode: tcp.FakeTensorMode, policy: tcp.CachePolicy, step: str) -> None:
    """Clears ``mode``, gives it a new policy, or changes its policy's rules in place."""
    if step == "cache_clear":
        mode.cache_clear()
    elif step == "new_policy":
        mode.cache_policy = testing.backend_policy()
    else:
        policy.register_namespace(testing.NS)


def entries_in_torch_storage(op: OpOverload) -> int:
    """How many entries torch's class-wide cache holds for ``op``."""
    return sum(1 for k in list(StockMode.cache) if k.key[0] is op)


STEPS = ["cache_clear", "new_policy", "rule_change"]


class TestAtenVerification(testing.CachePolicyTestCase):
    """Note [What a hit of an aten entry can get wrong]: an aten miss compares where the output lives and the inputs
    its schema lets the kernel write. Ops defined in the aten namespace with such Meta kernels show what stock would
    replay wrongly (overriding a real aten op's kernel would outlive the test in torch's caches)."""

    # schema, Meta kernel, reason
    KERNELS: dict[str, tuple[str, Callable[[torch.Tensor], torch.Tensor], str]] = {
        "offset": ("(Tensor x) -> Tensor", lambda x: x.new_empty(x.numel() + 8)[8:].view(x.shape),
                   "a hit would differ in storage_offset"),
        "larger_storage": ("(Tensor x) -> Tensor", lambda x: x.new_empty(x.numel() + 8)[: x.numel()].view(x.shape),
                           "a hit would differ in storage size"),
        "resizes_input": ("(Tensor(a!) x) -> Tensor(a!)", lambda x: x.resize_(x.numel() + 1),
                          "fake kernel changed an input's shape"),
        "returns_input_storage": ("(Tensor x) -> Tensor", lambda x: x.view(x.shape),
                                  "output aliasing a cache hit would not reproduce"),
    }  # fmt: skip

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls.lib = torch.library.Library("aten", "FRAGMENT")
        for name, (schema, meta, _) in cls.KERNELS.items():
            cls.lib.define(f"_tcp_test_{name}{schema}")
            cls.lib.impl(f"_tcp_test_{name}", meta, "Meta")

    @classmethod
    def tearDownClass(cls) -> None:
        cls.lib._destroy()
        super().tearDownClass()

    @parametrize("kernel", list(KERNELS))
    def test_meta_kernel_a_hit_cannot_reproduce(self, kernel: str) -> None:
        """An aten op whose Meta kernel returns what torch's entry cannot rebuild, or changes its input, bypasses."""
        op = getattr(torch.ops.aten, f"_tcp_test_{kernel}").default
        mode = tcp.FakeTensorMode()
        with mode:
            outs = [(op(x := torch.empty(4)), x) for _ in range(3)]
        self.assertBypassed(mode, op, self.KERNELS[kernel][2], 3)
        seen = {(o.storage_offset(), o.untyped_storage().nbytes(), storage(o) == storage(x), tuple(x.shape))
                for o, x in outs}  # fmt: skip
        self.assertEqual(len(seen), 1, msg=f"calls differ: {seen}")
        # The control: stock replays a different output, or skips the kernel's change (crosscheck off: its own would
        # raise on that hit).
        with testing.crosscheck_off(), StockMode():
            x = torch.empty(4)
            first = op(x)
            x2 = torch.empty(4)
            second = op(x2)
        self.assertNotEqual(
            (first.storage_offset(), first.untyped_storage().nbytes(), storage(first) == storage(x), tuple(x.shape)),
            (second.storage_offset(), second.untyped_storage().nbytes(), storage(second) == storage(x2),
             tuple(x2.shape)),
        )  # fmt: skip


class TestRejectedOpsStayPrivate(testing.CachePolicyTestCase):
    """Note [Entries that must reproduce aliasing]: an op whose entry failed
    verification once keeps its entries in the mode's store for the mode's life."""

    @parametrize("step", STEPS)
    def test_entries_stay_out_of_torch_storage(self, step: str) -> None:
        """After one rejected entry, an aten op's later entries go to the store, not torch's, also after the step."""
        op = torch.ops.aten.cosh.default
        real_verify = _driver.verify_entry
        rejected: list[object] = []

        def reject_once(mode: Any, state: Any, entry: Any, key: Any, func: Any, *rest: Any) -> None:
            if func is op and not rejected:
                rejected.append(op)
                raise _BypassDispatchCache("rejected by the test")
            real_verify(mode, state, entry, key, func, *rest)

        policy = tcp.CachePolicy()
        mode = tcp.FakeTensorMode(cache_policy=policy)
        x = mode.from_tensor(torch.empty(testing.fresh_size()))
        with mock.patch.object(_driver, "verify_entry", reject_once), mode:
            op(x)
        self.assertBypassed(mode, op, "rejected by the test", 1)
        self.assertIn(op, mode._cache.private_ops)
        first_route = mode._cache.route(op)
        self.assertTrue(first_route.private)

        change_policy_state(mode, policy, step)
        before = entries_in_torch_storage(op)
        y = mode.from_tensor(torch.empty(testing.fresh_size()))
        with mode:
            op(y)
            op(y)
        route = mode._cache.route(op)
        self.assertIsNot(route, first_route)  # made afresh by the step, and private all the same
        self.assertTrue(route.private)
        self.assertIn(op, mode._cache.private_ops)
        self.assertEqual(entries_in_torch_storage(op), before)
        in_store = [k for t in mode._cache.partition.all_tables() for k in t if k.key[0] is op]
        self.assertEqual(len(in_store), 1)
        report = mode.cache_report()[op]
        self.assertEqual((report.hits, report.misses), (1, 1))
        # Control: a mode that never rejected the op shares its entry with torch's storage.
        control = tcp.FakeTensorMode()
        with control:
            op(control.from_tensor(torch.empty(testing.fresh_size())))
        self.assertFalse(control._cache.route(op).private)
        self.assertEqual(entries_in_torch_storage(op), before + 1)

    @parametrize("step", STEPS)
    def test_stale_stock_entry_is_not_read(self, step: str) -> None:
        """aten.resize's hit would shrink the storage: after the step the mode still misses instead of reading stock's entry."""
        op = torch.ops.aten.resize.default
        n, m = testing.fresh_size(), testing.fresh_size()
        policy = tcp.CachePolicy()
        mode = tcp.FakeTensorMode(cache_policy=policy)
        with mode:
            op(torch.empty(m), [2])
        self.assertBypassed(mode, op, "a hit would differ in storage size", 1)
        self.assertIn(op, mode._cache.private_ops)
        # A stock mode caches the same call in torch's storage; its hit replays a storage of the new size.
        with StockMode():
            stock = [op(torch.empty(n), [2]).untyped_storage().nbytes() for _ in range(2)]
        self.assertEqual(stock, [4 * n, 8])

        change_policy_state(mode, policy, step)
        with mode:
            ours = [op(torch.empty(n), [2]).untyped_storage().nbytes() for _ in range(2)]
        self.assertEqual(ours, [4 * n, 4 * n])
        self.assertEqual(mode.cache_report()[op].hits, 0)
        self.assertTrue(mode._cache.route(op).private)


class TestIsolation(testing.CachePolicyTestCase):
    def test_torch_globals_are_untouched(self) -> None:
        """is_builtin, the class cache and the class counters never change."""
        original_is_builtin = library_utils.is_builtin
        seen: list[object] = []
        before = testing.stock_info()
        shape_env = ShapeEnv()

        def spy(x: torch.Tensor, stride: int) -> torch.Tensor:
            seen.append(library_utils.is_builtin)
            return x.new_empty(x.shape)

        lib = torch.library.Library(testing.NS, "FRAGMENT")
        try:
            torch.library.register_fake(f"{testing.NS}::conv", spy, lib=lib)
            # Crosscheck off: `seen` counts kernel runs, which a crosscheck runs again.
            mode = tcp.FakeTensorMode(
                cache_policy=testing.backend_policy(), shape_env=shape_env, cache_crosscheck=False
            )
            ctx = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC] * 4)
            x = mode.from_tensor(torch.empty(2, 2, 2, 2), symbolic_context=ctx)
            n = testing.fresh_size()
            with mode:
                for _ in range(3):
                    conv(x, 1)
                    conv(torch.empty(1, 1, 1, n), 1)
        finally:
            lib._destroy()
        self.assertEqual(seen, [original_is_builtin] * 4)  # per key: the first sight and the miss
        self.assertIs(library_utils.is_builtin, original_is_builtin)
        hits, misses, bypasses, _ = testing.stock_info()
        self.assertEqual((hits, misses, bypasses), before[:3])
        self.assertEqual(valid_entries_for_namespace(StockMode.cache, testing.NS), [])
        self.assertEqual(keys_for_namespace(shape_env.fake_tensor_cache, testing.NS), [])
        self.assertGreater(mode.cache_info().hits, 0)

    def test_stock_mode_in_another_thread_still_bypasses(self) -> None:
        """While policy modes run, a stock mode elsewhere bypasses backend ops as 'non-builtin'."""
        n_calls = 50
        barrier = threading.Barrier(2)
        errors: list[BaseException] = []
        before = testing.stock_info()[2].get("non-builtin", 0)

        def stock_worker() -> None:
            try:
                with StockMode():
                    x = torch.empty(1, 1, 4, 4)
                    barrier.wait()
                    for _ in range(n_calls):
                        conv(x, 1)
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        thread = threading.Thread(target=stock_worker)
        thread.start()
        mode = tcp.FakeTensorMode(cache_policy=testing.backend_policy())
        with mode:
            x = torch.empty(1, 1, 4, 4)
            barrier.wait()
            for _ in range(n_calls):
                conv(x, 1)
        thread.join()
        self.assertEqual(errors, [])
        self.assertEqual(testing.stock_info()[2].get("non-builtin", 0) - before, n_calls)
        self.assertEqual(mode.cache_report()[conv].hits, n_calls - 2)  # the first sight and the miss did not hit

    def test_reading_stats_while_another_thread_dispatches(self) -> None:
        """cache_info() and cache_report() may be read while the mode dispatches new ops elsewhere."""
        names = [n for n in ("sin", "cos", "exp", "log", "tanh", "sigmoid", "abs", "neg", "sqrt", "rsqrt", "floor",
                             "ceil", "round", "trunc", "frac", "sign", "erf", "expm1", "log1p", "reciprocal")]
        mode = tcp.FakeTensorMode(cache_store=tcp.CacheStore(isolated=True))
        done = threading.Event()
        errors: list[BaseException] = []

        def dispatch() -> None:
            try:
                with mode:
                    for _ in range(20):
                        for n in names:
                            getattr(torch.ops.aten, n).default(torch.empty(2, testing.fresh_size()))
            except BaseException as e:  # noqa: BLE001
                errors.append(e)
            finally:
                done.set()

        thread = threading.Thread(target=dispatch)
        thread.start()
        reads = 0
        while not done.is_set():
            mode.cache_info()
            str(mode.cache_report())
            reads += 1
        thread.join()
        self.assertEqual(errors, [])
        self.assertGreater(reads, 0)
        self.assertGreaterEqual(len(mode.cache_report().ops), len(names))

    def test_policy_modes_in_two_threads_keep_separate_stats(self) -> None:
        """Two policy modes in two threads count and store only their own work."""
        results: dict[int, tcp.FakeTensorMode] = {}

        def worker(i: int) -> None:
            mode = tcp.FakeTensorMode(cache_policy=testing.backend_policy())
            with mode:
                x = torch.empty(1, 1, 4, 4 + i)
                for _ in range(10 * (i + 1)):
                    conv(x, 1)
            results[i] = mode

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(results[0].cache_report()[conv].hits, 8)
        self.assertEqual(results[1].cache_report()[conv].hits, 18)
        self.assertEqual(len(results[0].cache_store), 1)


class TestIdentity(testing.CachePolicyTestCase):
    def test_rule_change_moves_to_a_fresh_partition(self) -> None:
        """Registering a namespace after use takes effect at once: no stale negative entry."""
        policy = tcp.CachePolicy()
        mode = tcp.FakeTensorMode(cache_policy=policy)
        with mode:
            x = torch.empty(1, 1, 3, 3)
            conv(x, 1)
            conv(x, 1)
            policy.register_namespace(testing.NS)
            for _ in range(3):
                conv(x, 1)
        self.assertEqual(mode.cache_report()[conv].bypasses, {"non-builtin": 2})
        self.assertEqual((mode.cache_report()[conv].hits, mode.cache_report()[conv].misses), (1, 2))

    def test_stock_negative_entry_does_not_block_the_policy(self) -> None:
        """A 'non-builtin' entry stock left in torch's cache is never consulted for admitted ops."""
        with StockMode():
            x = torch.empty(1, 1, 7, 7)
            conv(x, 1)
        self.assertTrue(
            any(isinstance(StockMode.cache[k], _DispatchCacheBypassEntry) for k in keys_for_namespace(StockMode.cache, testing.NS))
        )
        mode = tcp.FakeTensorMode(cache_policy=testing.backend_policy())
        with mode:
            x = torch.empty(1, 1, 7, 7)
            for _ in range(3):
                conv(x, 1)
        self.assertEqual(mode.cache_report()[conv].hits, 1)

    def test_denied_op_is_never_served(self) -> None:
        """deny() beats namespaces and keeps even an aten op out of every layer."""
        n = testing.fresh_size()
        with StockMode():
            torch.empty(n).exp()  # torch's storage now holds an entry for it
        policy = testing.backend_policy(deny=[torch.ops.aten.exp.default, conv])
        mode = tcp.FakeTensorMode(cache_policy=policy)
        with mode:
            x = torch.empty(n)
            x.exp()
            x.exp()
            conv(torch.empty(1, 1, 2, 2), 1)
        self.assertBypassed(mode, torch.ops.aten.exp.default, "denied by policy", 2)
        self.assertBypassed(mode, conv, "denied by policy", 1)

    def test_shared_store_keeps_policies_apart(self) -> None:
        """Two policies sharing a store never see each other's entries."""
        store = tcp.CacheStore()
        # Crosscheck off: kernel runs are counted, and a crosscheck runs the kernel again.
        a = tcp.FakeTensorMode(cache_policy=testing.backend_policy(), cache_store=store, cache_crosscheck=False)
        b = tcp.FakeTensorMode(
            cache_policy=testing.backend_policy(context_key=lambda: "b"), cache_store=store, cache_crosscheck=False
        )
        c = tcp.FakeTensorMode(cache_policy=testing.backend_policy(), cache_store=store, cache_crosscheck=False)
        for mode in (a, b, c):
            with mode:
                for _ in range(2):
                    conv(torch.empty(1, 1, 5, 5), 1)
        self.assertEqual([m.cache_report()[conv].hits for m in (a, b, c)], [0, 0, 2])
        self.assertEqual(testing.calls["conv"], 4)  # a's and b's first sight and miss

    def test_replacing_the_policy(self) -> None:
        """mode.cache_policy can be replaced, and is validated."""
        mode = tcp.FakeTensorMode()
        mode.cache_policy = testing.backend_policy()
        with mode:
            for _ in range(3):
                conv(torch.empty(1, 1, 2, 2), 1)
        self.assertEqual(mode.cache_report()[conv].hits, 1)
        with self.assertRaisesRegex(TypeError, r"FakeTensorMode.cache_policy = \.\.\.: expected a torch_cachepolicy.CachePolicy or None, got the string 'tosa'"):
            mode.cache_policy = "tosa"  # type: ignore[assignment]

    def test_cleared_partition_stays_shared(self) -> None:
        """After cache_clear(), modes sharing the store and policy still share entries."""
        store = tcp.CacheStore()
        policy = testing.backend_policy()
        a, b, c = (tcp.FakeTensorMode(cache_policy=policy, cache_store=store) for _ in range(3))
        with a:
            conv(torch.empty(1, 1, 3, 9), 1)
        a.cache_clear()
        self.assertEqual(len(store), 0)
        with b:
            for _ in range(2):  # the first sight, then the miss that makes the entry
                conv(torch.empty(1, 1, 3, 9), 1)  # b was synced before the clear
        self.assertEqual(len(store), 1)
        with c:
            conv(torch.empty(1, 1, 3, 9), 1)
        self.assertEqual(c.cache_report()[conv].hits, 1)
        store.clear()
        self.assertEqual(len(store), 0)

    def test_cache_clear_clears_this_instance_only(self) -> None:
        """cache_clear() resets this mode; another mode's entries and counters stay."""
        store = tcp.CacheStore()
        a = tcp.FakeTensorMode(cache_policy=testing.backend_policy(), cache_store=store)
        b = tcp.FakeTensorMode(cache_policy=testing.backend_policy(context_key=lambda: 1), cache_store=store)
        for mode in (a, b):
            with mode:
                for _ in range(3):
                    conv(torch.empty(1, 1, 5, 6), 1)
        a.cache_clear()
        self.assertEqual(a.cache_info().hits, 0)
        self.assertEqual(b.cache_report()[conv].hits, 1)
        self.assertEqual(len(store), 1)  # b's conv entry remains


class TestReport(testing.CachePolicyTestCase):
    def test_cache_report(self) -> None:
        """cache_report() lists each op's hits, misses and bypass reasons."""
        mode = tcp.FakeTensorMode(cache_policy=tcp.CachePolicy(namespaces=[testing.NS]), shape_env=ShapeEnv())
        with mode:
            x = torch.empty(1, 1, 3, testing.fresh_size())
            for _ in range(3):
                conv(x, 1)
                dyn(x)
                q_per_tensor(x, 0.1, 0, -128, 127, torch.int8)
        self.assertExpectedInline(
            str(mode.cache_report()),
            """\
op                                                 hits  misses  bypasses
aten::empty.memory_format                             0       1
aten::new_empty.default                               1       1
quantized_decomposed::quantize_per_tensor.default     0       0  non-builtin: 3
tcp_test::conv.default                                1       2
tcp_test::dyn.default                                 0       1  unbacked symbol in scalar output: 2""",
        )
        self.assertEqual(
            mode.cache_report().by_namespace(),
            {"aten": (1, 2, 0), "quantized_decomposed": (0, 0, 3), "tcp_test": (1, 3, 2)},
        )

    def test_report_is_a_mapping(self) -> None:
        """A report is a Mapping from op names to rows: in, len, iteration, get and dict() work, by op or name."""
        with tcp.FakeTensorMode(cache_policy=testing.backend_policy()) as mode:
            x = torch.empty(1, 1, 2, 2)
            conv(x, 1), conv(x, 1), conv(x, 1)
        report = mode.cache_report()
        self.assertIsInstance(report, collections.abc.Mapping)
        self.assertEqual(list(report), [r.op for r in report.ops])
        self.assertEqual(len(report), len(report.ops))
        self.assertIn(conv, report)
        self.assertIn("tcp_test::conv.default", report)
        self.assertNotIn(torch.ops.tcp_test.conv, report)  # a packet names no row
        self.assertNotIn(0, report)
        self.assertIsNone(report.get(torch.ops.tcp_test.pair.default))
        self.assertEqual(dict(report)["tcp_test::conv.default"], report[conv])
        self.assertEqual(report[conv].hits, 1)

    def test_report_lookup_errors(self) -> None:
        """Looking up a packet names the overloads dispatched; an op never dispatched says so."""
        with tcp.FakeTensorMode(cache_policy=testing.backend_policy()) as mode:
            conv(torch.empty(1, 1, 2, 2), 1)
        report = mode.cache_report()
        errors = []
        ops: list[object] = [torch.ops.tcp_test.conv, torch.ops.tcp_test.pair, torch.ops.tcp_test.pair.default]
        for op in [*ops, "tcp_test::conv", "tcp_test::pair", "tcp_test::pair.default"]:
            with self.assertRaises(KeyError) as caught:
                report[op]
            errors.append(caught.exception.args[0])
        self.assertEqual(report["tcp_test::conv.default"], report[torch.ops.tcp_test.conv.default])
        self.assertExpectedInline("\n".join(errors), """\
torch_cachepolicy.CacheReport[...]: tcp_test::conv has a row per overload; pass one of ['tcp_test::conv.default']
torch_cachepolicy.CacheReport[...]: no overload of tcp_test::pair was dispatched by this mode
torch_cachepolicy.CacheReport[...]: tcp_test::pair.default was not dispatched by this mode
torch_cachepolicy.CacheReport[...]: tcp_test::conv has a row per overload; pass one of ['tcp_test::conv.default']
torch_cachepolicy.CacheReport[...]: no overload of tcp_test::pair was dispatched by this mode
torch_cachepolicy.CacheReport[...]: tcp_test::pair.default was not dispatched by this mode""")


class TestHigherOrderOps(testing.CachePolicyTestCase):
    def test_cond(self) -> None:
        """torch.cond dispatches under the subclass as under stock, on every call (Note [Higher-order ops bypass])."""
        def run(mode: Any) -> list[object]:
            with mode:
                x = torch.empty(3, 4)
                return [
                    described(torch.cond(torch.tensor(flag), lambda t: t.sin(), lambda t: t.cos() + 1, (x,)))
                    for flag in (True, True, False, False)
                ]

        self.assertEqual(run(tcp.FakeTensorMode()), run(StockMode()))

    def test_while_loop(self) -> None:
        """while_loop dispatches under the subclass as under stock."""
        def run(mode: Any) -> list[object]:
            with mode:
                i, x = torch.tensor(0), torch.empty(2, 2)
                return [
                    described(torch._higher_order_ops.while_loop(lambda i, x: i < 3, lambda i, x: (i + 1, x + 1), (i, x)))
                    for _ in range(2)
                ]

        self.assertEqual(run(tcp.FakeTensorMode(shape_env=ShapeEnv())), run(StockMode(shape_env=ShapeEnv())))

    @parametrize("python_dispatcher", [False, True])
    def test_opoverload_rule_only_under_python_dispatcher(self, python_dispatcher: bool) -> None:
        """An OpOverload's py_impl(FakeTensorMode) rule applies exactly when stock applies it."""
        from torch._dispatch.python import enable_python_dispatcher

        lib = torch.library.Library("tcp_rule", "FRAGMENT")
        self.addCleanup(lib._destroy)
        lib.define("f(Tensor x) -> Tensor")
        torch.library.register_fake("tcp_rule::f", lambda x: x.new_empty(3), lib=lib)
        op = torch.ops.tcp_rule.f.default
        op.py_impl(StockMode)(lambda mode, x: x.new_empty(6))
        self.addCleanup(op.python_key_table.pop, StockMode, None)

        def run(mode: Any) -> torch.Size:
            x = mode.from_tensor(torch.zeros(2))
            with mode, enable_python_dispatcher() if python_dispatcher else contextlib.nullcontext():
                return op(x).shape

        expected = torch.Size([6 if python_dispatcher else 3])
        self.assertEqual(run(StockMode()), expected)
        self.assertEqual(run(tcp.FakeTensorMode()), expected)
        self.assertEqual(run(tcp.FakeTensorMode(cache_policy=tcp.CachePolicy(namespaces=["tcp_rule"]))), expected)

    def test_hop_defined_after_import(self) -> None:
        """A HOP whose FakeTensorMode rule is registered after our import works."""
        from torch._ops import HigherOrderOperator

        class LateHop(HigherOrderOperator):
            def __init__(self) -> None:
                super().__init__("tcp_late_hop")

            def __call__(self, x: torch.Tensor) -> torch.Tensor:
                return super().__call__(x)

        late_hop = LateHop()
        late_hop.fallthrough(torch._C.DispatchKey.AutogradCPU)

        @late_hop.py_impl(StockMode)
        def _fake(mode: StockMode, x: torch.Tensor) -> torch.Tensor:
            with mode:
                return x.new_empty(7)

        for mode in (StockMode(), tcp.FakeTensorMode()):
            with mode:
                self.assertEqual(late_hop(torch.empty(2)).shape, (7,))

    def test_context_hook_is_asked_only_by_its_namespaces(self) -> None:
        """Inside invoke_subgraph the context hook is asked by ops of context_namespaces only, not by the HOP."""
        from torch._higher_order_ops.invoke_subgraph import invoke_subgraph

        def outside_lowering() -> object:
            raise RuntimeError("no TosaLoweringContext is open")

        policy = testing.backend_policy(context_key=outside_lowering, context_namespaces=["quantized_decomposed"])
        plain = torch.fx.symbolic_trace(lambda x: (conv(x, 1).sin(),))
        quantizing = torch.fx.symbolic_trace(lambda x: (q_per_tensor(x, 0.1, 0, -128, 127, torch.int8),))
        mode = tcp.FakeTensorMode(cache_policy=policy)
        with mode:
            x = torch.empty(1, 1, 3, testing.fresh_size())
            for _ in range(2):
                self.assertEqual(invoke_subgraph(plain, "plain", x)[0].shape, conv(x, 1).shape)
            with self.assertRaisesRegex(RuntimeError, r"^torch_cachepolicy\.CachePolicy\.context_key\(\): raised "):
                invoke_subgraph(quantizing, "quantizing", x)
        self.assertEqual(mode.cache_report()["invoke_subgraph"].bypasses, {"higher-order operator (the ops of its subgraph are cached)": 3})
        self.assertEqual(mode.cache_report()[conv].hits, 2)  # 4 calls: the first sight, the miss, 2 hits

    def test_invoke_subgraph_runs_its_body_and_its_ops_hit(self) -> None:
        """invoke_subgraph is dispatched uncached; the ops of its body are cached, per context of the policy, and
        nothing keyed by the GraphModule is kept (no finalizer, no entry)."""
        from torch._higher_order_ops.invoke_subgraph import invoke_subgraph

        policy = tcp.CachePolicy(
            namespaces=[testing.NS], context_key=lambda: testing.ambient["dtype"], context_namespaces=[testing.NS]
        )
        gm = torch.fx.symbolic_trace(lambda x: (testing.op("ambient_cast")(x),))
        store = tcp.CacheStore(isolated=True)
        mode = tcp.FakeTensorMode(cache_policy=policy, cache_store=store)
        dtypes = []
        finalizers_before = len(weakref.finalize._registry)  # type: ignore[attr-defined]
        try:
            with mode:
                x = torch.empty(2)
                for dtype in [torch.float16, torch.int8] * 4:
                    testing.ambient["dtype"] = dtype
                    dtypes.append(invoke_subgraph(gm, "sub", x)[0].dtype)
        finally:
            testing.ambient["dtype"] = torch.float32
        self.assertEqual(dtypes, [torch.float16, torch.int8] * 4)
        report = mode.cache_report()
        self.assertEqual(report["invoke_subgraph"].bypasses, {"higher-order operator (the ops of its subgraph are cached)": 8})
        inner = report[testing.op("ambient_cast")]
        self.assertEqual((inner.hits, inner.misses), (4, 4))  # per context: the first sight, the miss, 2 hits
        self.assertEqual(len(weakref.finalize._registry), finalizers_before)  # type: ignore[attr-defined]
        ref = weakref.ref(gm)
        del gm
        gc.collect()
        self.assertIsNone(ref())

    def test_invoke_subgraph_under_a_context_whose_eq_is_not_a_bool(self) -> None:
        """A context value whose == gives no bool (a tensor) is compared as a dict lookup would: no crash, a new
        entry for a new object, hits for the same object (v5 review N2, on the prototype)."""
        from torch._higher_order_ops.invoke_subgraph import invoke_subgraph

        context = {"value": torch.tensor([1.0, 2.0])}
        policy = tcp.CachePolicy(
            namespaces=[testing.NS], context_key=lambda: context["value"], context_namespaces=[testing.NS]
        )
        gm = torch.fx.symbolic_trace(lambda x: (testing.op("ambient_cast")(x),))
        mode = tcp.FakeTensorMode(cache_policy=policy)
        with mode:
            x = torch.empty(2)
            for _ in range(2):
                for _ in range(3):
                    self.assertEqual(invoke_subgraph(gm, "sub", x)[0].shape, (2,))
                context["value"] = torch.tensor([1.0, 2.0])  # equal values, another object
        report = mode.cache_report()[testing.op("ambient_cast")]
        self.assertEqual((report.hits, report.misses), (2, 4))  # per object: the first sight, the miss, a hit


# Ops whose owners declare torch's own cacheability tags (Note [Reusing
# torch's validation] in mode.py): torch.Tag is a closed enum (tags.yaml), and
# these three are the tags _validate_cache_key reads.
# Their kernels count in testing.calls, which testing.CachePolicyTestCase clears before each test.
DECL_OPS = testing.CountedOps("tcp_decl", calls=testing.calls)
DECL_NS = DECL_OPS.ns
TAG_REASONS = {
    "data_dependent_output": "data dependent output",
    "dynamic_output_shape": "dynamic output shape",
    "inplace_view": "inplace view",
}
for _tag in TAG_REASONS:
    DECL_OPS.define(f"{_tag}(Tensor x) -> Tensor", tags=(getattr(torch.Tag, _tag),))(torch.empty_like)


@torch.library.custom_op(f"{DECL_NS}::tagged_custom", mutates_args=(), tags=(torch.Tag.data_dependent_output,))
def tagged_custom(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


tagged_custom.register_fake(DECL_OPS.counted("tagged_custom", torch.empty_like))


class TestOwnerDeclarations(testing.CachePolicyTestCase):
    """What torch lets an op's owner declare about fake caching, honoured under any policy."""

    def _stock_bypasses(self, op: OpOverload, n: int) -> dict[str, int]:
        before = dict(StockMode.cache_info().bypasses)
        with StockMode():
            x = torch.empty(2, 3)
            for _ in range(n):
                op(x)
        after = StockMode.cache_info().bypasses
        return {r: after[r] - before.get(r, 0) for r in after if after[r] != before.get(r, 0)}

    @parametrize("tag", list(TAG_REASONS))
    def test_torch_tag_bypasses_an_admitted_backend_op(self, tag: str) -> None:
        """A backend op tagged like aten's uncacheable ops bypasses with stock's reason after its first sight, even if allowed by name."""
        op = getattr(torch.ops.tcp_decl, tag).default
        for policy in (tcp.CachePolicy(namespaces=[DECL_NS]), tcp.CachePolicy(allow=[op])):
            testing.calls.clear()
            mode = tcp.FakeTensorMode(cache_policy=policy)
            with mode:
                x = torch.empty(2, 3)
                for _ in range(3):
                    op(x)
            self.assertTrue(policy.decide(op).cacheable)
            self.assertEqual(testing.calls[tag], 3)
            self.assertBypassed(mode, op, TAG_REASONS[tag], 2)  # the entry builder reads the tag: from the 2nd call
            self.assertEqual(mode.cache_report()[op].misses, 1)
        # Stock reads the tag before is_builtin: same reason, no "non-builtin".
        self.assertEqual(self._stock_bypasses(op, 2), {TAG_REASONS[tag]: 2})

    def test_custom_op_tags(self) -> None:
        """custom_op(tags=...) carries the owner's tag beside pt2_compliant_tag, and it is honoured."""
        op = tagged_custom._opoverload
        self.assertEqual(set(op.tags), {torch.Tag.pt2_compliant_tag, torch.Tag.data_dependent_output})
        mode = tcp.FakeTensorMode(cache_policy=tcp.CachePolicy(namespaces=[DECL_NS]))
        with mode:
            x = torch.empty(2, 3)
            for _ in range(3):
                op(x)
        self.assertEqual(testing.calls["tagged_custom"], 3)
        self.assertBypassed(mode, op, "data dependent output", 2)  # after the first sight

    def test_tag_enum_is_closed(self) -> None:
        """An owner cannot invent a tag such as 'fake_cacheable': Tag is generated from tags.yaml."""
        self.assertFalse(hasattr(torch.Tag, "fake_cacheable"))
        with self.assertRaises(TypeError):
            DECL_OPS.lib.define("untagged(Tensor x) -> Tensor", tags=("fake_cacheable",))  # type: ignore[arg-type]
        with self.assertRaises(TypeError):
            torch.library.custom_op(
                f"{DECL_NS}::strtag", mutates_args=(), schema="(Tensor x) -> Tensor", tags=("fake_cacheable",)  # type: ignore[arg-type]
            )(lambda x: x.clone())

    @parametrize("skip_cache", [True, False])
    def test_hop_is_never_cached(self, skip_cache: bool) -> None:
        """A HOP registered with register_fake is never cached by a policy mode, whatever skip_cache says."""
        from torch._higher_order_ops.utils import register_fake as register_hop_fake
        from torch._ops import HigherOrderOperator

        name = f"tcp_decl_hop_{skip_cache}"

        class DeclHop(HigherOrderOperator):
            def __init__(self) -> None:
                super().__init__(name)

            def __call__(self, x: torch.Tensor) -> torch.Tensor:
                return super().__call__(x)

        hop = DeclHop()
        hop.fallthrough(torch._C.DispatchKey.AutogradCPU)

        register_hop_fake(hop, DECL_OPS.counted(name, torch.empty_like), skip_cache=skip_cache)

        # Crosscheck off: kernel runs are counted, and a crosscheck runs the kernel again.
        mode = tcp.FakeTensorMode(cache_policy=testing.backend_policy(), cache_crosscheck=False)
        with mode:
            x = torch.empty(2, 3)
            for _ in range(3):
                hop(x)
        self.assertEqual(testing.calls[name], 3)


class TestLifetime(testing.CachePolicyTestCase):
    def test_mode_and_store_are_collected(self) -> None:
        """Dropping a mode frees it and its private store."""
        def make() -> tuple[weakref.ref[Any], ...]:
            mode = tcp.FakeTensorMode(cache_policy=testing.backend_policy(), shape_env=ShapeEnv())
            ctx = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC] * 4)
            x = mode.from_tensor(torch.empty(2, 2, 2, 2), symbolic_context=ctx)
            with mode:
                conv(x, 1)
                conv(x, 1)
            return weakref.ref(mode), weakref.ref(mode.cache_store)

        refs = make()
        gc.collect()
        self.assertEqual([r() for r in refs], [None, None])

    def test_store_does_not_hold_shape_env(self) -> None:
        """A store's symbolic entries never reach their ShapeEnv."""
        # torch's own lru caches keep ShapeEnvs alive, so reachability is what we can test.
        store = tcp.CacheStore()
        shape_env = ShapeEnv()
        mode = tcp.FakeTensorMode(cache_policy=testing.backend_policy(), shape_env=shape_env, cache_store=store)
        ctx = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC] * 4)
        x = mode.from_tensor(torch.empty(2, 2, 2, 2), symbolic_context=ctx)
        with mode:
            conv(x, 1)
        self.assertEqual(len(store), 1)
        self.assertTrue(testing.reaches(mode, shape_env))  # the helper does find real paths
        self.assertFalse(testing.reaches(store, shape_env))


def _make(kind: str) -> Any:
    return StockMode() if kind == "stock" else tcp.FakeTensorMode()


class TestStockDispatch(testing.CachePolicyTestCase):
    """Every dispatch of a policy mode goes through stock's ``FakeTensorMode.dispatch`` (its tables, its logging)."""

    def calls_through_stock_dispatch(self, calls: int) -> int:
        """How many of ``calls`` relu dispatches went through stock FakeTensorMode.dispatch."""
        mode = tcp.FakeTensorMode(cache_store=tcp.CacheStore(isolated=True))
        x = mode.from_tensor(torch.zeros(3, 5))
        with mock.patch.object(StockMode, "dispatch", autospec=True, side_effect=StockMode.dispatch) as stock:
            with mode:
                for _ in range(calls):
                    torch.ops.aten.relu.default(x)
        self.assertHitsMisses(mode, calls - 1, 1)
        return sum(1 for c in stock.call_args_list if c.args[1] is torch.ops.aten.relu.default)

    def test_hits_go_through_stock_dispatch(self) -> None:
        """Hits, like the first call, go through stock dispatch."""
        self.assertEqual(self.calls_through_stock_dispatch(4), 4)

    def test_debug_logging_logs_every_call(self) -> None:
        """With FakeTensor DEBUG logging on, stock dispatch logs every call, hits included."""
        with self.assertLogs("torch._subclasses.fake_tensor", level="DEBUG") as logs:
            self.assertEqual(self.calls_through_stock_dispatch(3), 3)
        self.assertEqual(sum("__torch_dispatch__: aten.relu.default" in line for line in logs.output), 3)

    def test_directly_handled_op_never_reaches_the_cache(self) -> None:
        """An op stock serves itself (a table entry added at runtime) is never sent to the cache."""
        op = torch.ops.aten.relu.default
        with mock.patch.dict(torch._subclasses.fake_tensor._DISPATCH_HANDLE_DIRECTLY, {op: None}):
            mode = tcp.FakeTensorMode(cache_store=tcp.CacheStore(isolated=True))
            x = mode.from_tensor(torch.zeros(3, 5))
            with mode:
                torch.ops.aten.relu.default(x)
            self.assertEqual(mode.cache_info().hits + mode.cache_info().misses, 0)

    def test_subclass_override_of_the_cache_sees_every_call(self) -> None:
        """A subclass's _cached_dispatch_impl sees every call, as under stock's dispatch."""
        seen: list[object] = []

        class Counting(tcp.FakeTensorMode):
            def _cached_dispatch_impl(self, func: Any, types: Any, args: Any, kwargs: Any) -> object:
                seen.append(func)
                return super()._cached_dispatch_impl(func, types, args, kwargs)

        mode = Counting(cache_store=tcp.CacheStore(isolated=True))
        x = mode.from_tensor(torch.zeros(3, 5))
        with mode:
            for _ in range(3):
                torch.ops.aten.relu.default(x)
        self.assertEqual(seen.count(torch.ops.aten.relu.default), 3)


class TestDropIn(testing.CachePolicyTestCase):
    """Cache tests ported from PyTorch's FakeTensorDispatchCache, run against
    stock and against the subclass with the default policy."""

    def counts(self, kind: str, mode: Any) -> tuple[int, int, dict[str, int]]:
        if kind == "stock":
            hits, misses, bypasses, _ = testing.stock_info()
            base = self._base
            return hits - base[0], misses - base[1], {
                k: v - base[2].get(k, 0) for k, v in bypasses.items() if v - base[2].get(k, 0)
            }
        info = mode.cache_info()
        return info.hits, info.misses, info.bypasses

    def setUp(self) -> None:
        super().setUp()
        self._base = testing.stock_info()

    def _key(self, kind: str, fm: Any, arg: Any, stats: KeyStats) -> Any:
        """The key of ``aten.add.Tensor(arg)``: torch's for stock, the package's (checked equal to torch's) for policy."""
        func = torch.ops.aten.add.Tensor
        expected = StockMode._cache_key(fm, _CacheKeyState(fm.shape_env), func, [arg], {})
        if kind == "stock":
            return expected
        key = _key.cache_key(fm, _CacheKeyState(fm.shape_env), func, [arg], {}, stats)
        self.assertEqual((key, hash(key)), (expected, hash(expected)))
        return key

    def _key_differs(self, kind: str, fm: Any, stats: KeyStats, x: Any, y: Any, z: Any) -> None:
        self.assertEqual(self._key(kind, fm, x, stats), self._key(kind, fm, y, stats))
        self.assertNotEqual(self._key(kind, fm, x, stats), self._key(kind, fm, z, stats))

    @parametrize("kind", ["stock", "policy"])
    def test_cache_key_metadata(self, kind: str) -> None:
        """Keys differ in dtype, shape, stride, memory format, offset, grad and scalar type; the package's are torch's."""
        stats = KeyStats()
        with _make(kind) as fm:
            cases: list[tuple[Callable[[], Any], Callable[[], Any]]] = [
                (lambda: torch.empty(4, 3, dtype=torch.float16), lambda: torch.empty(4, 3)),
                (lambda: torch.empty(4, 3), lambda: torch.empty(4, 2)),
                (lambda: torch.empty(4, 2), lambda: torch.empty(4, 2).as_strided((4, 2), (1, 2))),
                (lambda: torch.empty(1, 2, 3, 4), lambda: torch.empty(1, 2, 3, 4).to(memory_format=torch.channels_last)),
                (lambda: torch.empty(3)[1:], lambda: torch.empty(2)),
                (lambda: torch.empty(4, 3), lambda: torch.empty(4, 3, requires_grad=True)),
            ]
            for same, other in cases:
                self._key_differs(kind, fm, stats, same(), same(), other())
            self._key_differs(kind, fm, stats, 1.0, 1.0, 1)
        if kind == "policy":
            # 7 cases, 4 keys each: every one built by the C++ builder, or (without it) every one torch's.
            if _key._builder is not None:
                self.assertEqual((stats.built, dict(stats.fallbacks)), (28, {}))
            else:
                self.assertEqual((stats.built, dict(stats.fallbacks)), (0, {_key.NO_BUILDER: 28}))

    @parametrize("kind", ["stock", "policy"])
    def test_cache_hit(self, kind: str) -> None:
        """A repeated add is a hit with identical metadata."""
        from torch._subclasses.fake_tensor import extract_tensor_metadata

        with _make(kind) as mode:
            x, y = torch.empty(4, testing.fresh_size()), torch.empty(4, 1)
            before = self.counts(kind, mode)
            r1 = x + y
            r2 = x + y
            after = self.counts(kind, mode)
        self.assertEqual((after[0] - before[0], after[1] - before[1]), (1, 1))
        self.assertEqual(extract_tensor_metadata(r1), extract_tensor_metadata(r2))

    @parametrize("kind", ["stock", "policy"])
    def test_cache_bypass_inplace_view(self, kind: str) -> None:
        """An inplace view bypasses with reason 'inplace view'."""
        with _make(kind) as mode:
            x = torch.empty(1, 2)
            x.unsqueeze_(0)
            self.assertEqual(self.counts(kind, mode)[2].get("inplace view"), 1)

    @parametrize("kind", ["stock", "policy"])
    def test_cache_default_dtype(self, kind: str) -> None:
        """The default dtype is part of the key."""
        with _make(kind) as mode:
            x = torch.empty(testing.fresh_size(), dtype=torch.int32)
            start = self.counts(kind, mode)
            try:
                dtypes = []
                for default in (torch.float32, torch.float16, torch.float32):
                    torch.set_default_dtype(default)
                    dtypes.append((x + 1.0).dtype)
            finally:
                torch.set_default_dtype(torch.float32)
            end = self.counts(kind, mode)
        self.assertEqual(dtypes, [torch.float32, torch.float16, torch.float32])
        self.assertEqual((end[0] - start[0], end[1] - start[1]), (1, 2))

    @parametrize("kind", ["stock", "policy"])
    def test_cache_inplace_op(self, kind: str) -> None:
        """An inplace op served from cache returns its input."""
        with _make(kind):
            x, y = torch.empty(1, testing.fresh_size()), torch.empty(1, 1)
            self.assertIs(x.add_(y), x)
            self.assertIs(x.add_(y), x)

    @parametrize("kind", ["stock", "policy"])
    def test_cache_view_op(self, kind: str) -> None:
        """A view flag is right whether the entry was made on a view or not."""
        with _make(kind):
            x1 = torch.ones(2, requires_grad=True).clone()
            x2 = torch.ones(2, requires_grad=True).clone()
            y2 = x2.view(-1)
            self.assertFalse(x1.mul_(2)._is_view())
            self.assertTrue(y2.mul_(2)._is_view())
            self.assertTrue(y2.mul_(2)._is_view())
            self.assertFalse(x1.mul_(2)._is_view())

    @parametrize("kind", ["stock", "policy"])
    def test_cache_dispatch_key_set(self, kind: str) -> None:
        """Ops that change the dispatch key set bypass."""
        with _make(kind) as mode:
            self.assertTrue(torch._efficientzerotensor(3)._is_zerotensor())
            self.assertTrue(torch._efficientzerotensor(3)._is_zerotensor())
            self.assertEqual(self.counts(kind, mode)[2].get("dispatch_key_set mismatch"), 2)

    @parametrize("kind", ["stock", "policy"])
    def test_inference_mode(self, kind: str) -> None:
        """Inference mode is part of the key."""
        with _make(kind) as mode:
            x, y = torch.empty(4, testing.fresh_size()), torch.empty(4, 1)
            start = self.counts(kind, mode)
            r1 = x + y
            with torch.inference_mode():
                r2 = x + y
            r3 = x + y
            with torch.inference_mode():
                r4 = x + y
            end = self.counts(kind, mode)
        self.assertEqual([r.is_inference() for r in (r1, r2, r3, r4)], [False, True, False, True])
        self.assertEqual((end[0] - start[0], end[1] - start[1]), (2, 2))

    @parametrize("kind", ["stock", "policy"])
    def test_cache_tuple_outputs(self, kind: str) -> None:
        """Tuple outputs are cached element by element."""
        with _make(kind) as mode:
            x = torch.empty(6, testing.fresh_size())
            start = self.counts(kind, mode)
            a = torch.split(x, 2)
            b = torch.split(x, 2)
            end = self.counts(kind, mode)
        self.assertEqual([t.shape for t in a], [t.shape for t in b])
        self.assertEqual(end[0] - start[0], 1)

    @parametrize("kind", ["stock", "policy"])
    def test_backend_op_bypass_reason(self, kind: str) -> None:
        """With the default policy a backend op bypasses as 'non-builtin', like stock."""
        with _make(kind) as mode:
            conv(torch.empty(1, 1, 2, testing.fresh_size()), 1)
            self.assertEqual(self.counts(kind, mode)[2].get("non-builtin"), 1)


class TestBypassLog(testing.CachePolicyTestCase):
    def test_every_bypass_exit_logs_its_reason(self) -> None:
        """Each way a dispatch bypasses (its route, its key, a negative entry, torch's entry builder) logs the
        reason at DEBUG on torch_cachepolicy._driver."""
        lib = torch.library.Library("tcp_bypass_log", "FRAGMENT")
        self.addCleanup(lib._destroy)
        lib.define("unbacked(Tensor x) -> Tensor")
        torch.library.register_fake(
            "tcp_bypass_log::unbacked", lambda x: x.new_empty(torch.library.get_ctx().new_dynamic_size()), lib=lib
        )
        policy = testing.backend_policy()
        policy.register_namespace("tcp_bypass_log")
        policy.deny(conv)
        mode = tcp.FakeTensorMode(cache_policy=policy, shape_env=ShapeEnv())
        with self.assertLogs("torch_cachepolicy._driver", level="DEBUG") as logs, mode:
            conv(torch.empty(1, 1, 4, 4), 1)
            q_per_tensor(torch.empty(2), float("nan"), 0, -128, 127, torch.int8)
            for _ in range(3):  # the first sight, the miss that makes the negative entry, the entry's bypass
                testing.op("bad_view")(torch.empty(4))
            for _ in range(2):  # the first sight, the miss whose entry builder bypasses
                torch.ops.tcp_bypass_log.unbacked(torch.empty(2))
        lines = [line.split(":", 2)[2] for line in logs.output if line.split(":", 2)[2].startswith("bypass ")]
        self.assertExpectedInline("\n".join(lines), """\
bypass tcp_test.conv.default: denied by policy (route)
bypass quantized_decomposed.quantize_per_tensor.default: NaN argument (key)
bypass tcp_test.bad_view.default: output aliases an input without a schema annotation (negative entry)
bypass tcp_bypass_log.unbacked.default: unrepresented symbol in output (entry builder)""")


class TestKeyedAsTorch(testing.CachePolicyTestCase):
    """Arguments whose keys torch itself decides (by release) are keyed and bypassed exactly as torch does."""

    @parametrize("op", [aten.detach.default, aten.alias.default])
    def test_mkldnn_arguments_as_stock(self, op: OpOverload) -> None:
        """A fake of an mkldnn tensor bypasses where stock bypasses it (torch 2.15: "mkldnn tensor"), equal outputs."""
        real = torch.randn(2, 3).to_mkldnn()
        StockMode.cache_clear()
        stock = StockMode()
        with stock:
            expected = [op(stock.from_tensor(real)) for _ in range(2)]
        stock_bypasses = StockMode.cache_info().bypasses
        mode = tcp.FakeTensorMode(cache_store=tcp.CacheStore(isolated=True))
        x = mode.from_tensor(real)
        with mode:
            outs = [op(x) for _ in range(2)]
        self.assertEqual(mode.cache_report()[op].bypasses, dict(stock_bypasses))
        for out, exp in zip(outs, expected, strict=True):
            self.assertEqual((out.layout, out.shape, out.dtype), (exp.layout, exp.shape, exp.dtype))

    @parametrize("device", ["cuda", "cuda:1", "cpu", "meta"])
    def test_device_arguments_keyed_as_torch(self, device: str) -> None:
        """A device argument is keyed as torch's _cache_key keys it (torch 2.15: an index-less one by its index)."""
        mode = tcp.FakeTensorMode()
        kwargs = {"dtype": torch.float32, "device": torch.device(device)}
        state, expected_state = _CacheKeyState(None), _CacheKeyState(None)
        key = _key.cache_key(mode, state, aten.empty.memory_format, ([2, 3],), kwargs, mode._cache.key_stats)
        expected = mode._cache_key(expected_state, aten.empty.memory_format, ([2, 3],), kwargs)
        self.assertEqual(key, expected)
        self.assertEqual([type(v) for v in key.key], [type(v) for v in expected.key])
        self.assertEqual([str(v) for v in key.key], [str(v) for v in expected.key])
        # Built natively where the extension is loaded, on every release.
        self.assertEqual(mode.cache_key_stats().built, 1 if testing.HAS_KEY_BUILDER else 0)


instantiate_parametrized_tests(TestDropIn)
instantiate_parametrized_tests(TestKeyedAsTorch)
instantiate_parametrized_tests(TestOwnerDeclarations)
instantiate_parametrized_tests(TestSafety)
instantiate_parametrized_tests(TestVerification)
instantiate_parametrized_tests(TestAtenVerification)
instantiate_parametrized_tests(TestRejectedOpsStayPrivate)
instantiate_parametrized_tests(TestHigherOrderOps)


if __name__ == "__main__":
    run_tests()
