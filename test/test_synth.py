# Owner(s): ["module: fakeTensor"]
"""torch_cachepolicy.synth: a hit's output built without dispatch equals torch's synthesis."""

from __future__ import annotations

import unittest
import warnings
from collections.abc import Callable, Sequence
from typing import Any
from unittest import mock

import cachepolicy_testing  # noqa: F401  (defines quantized_decomposed and tcp_test ops)
import torch
import torch.utils._pytree as pytree
from torch._subclasses import fake_tensor as _ft
from torch._subclasses.meta_utils import assert_eq, assert_metadata_eq
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext
from torch.testing._internal.common_utils import (
    TestCase,
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
    set_warn_always_context,
    subtest,
)

import torch_cachepolicy as tcp
from torch_cachepolicy import synth
from torch_cachepolicy.safety import describe, first_difference

aten = torch.ops.aten
qd = torch.ops.quantized_decomposed

# A backend op whose fake kernel returns a leaf that requires grad.
_lib = torch.library.Library("tcp_test", "FRAGMENT")
_lib.define("grad_out(Tensor x) -> Tensor")
torch.library.register_fake("tcp_test::grad_out", lambda x: torch.empty(x.shape, requires_grad=True), lib=_lib)
HAS_FAST = synth.available()
NO_FAST = "torch_cachepolicy._C is not loaded (USE_CPP=0 or TORCH_CACHEPOLICY_FORCE_PYTHON=1)"


class _ParityMode(tcp.FakeTensorMode):
    """Builds every hit's output twice, ours and torch's, and records both.

    Both are described at once: the one returned goes on through the
    dispatcher (ADInplaceOrView makes a view op's output a view), the other
    does not.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(
            cache_policy=tcp.CachePolicy(namespaces=["quantized_decomposed", "tcp_test"]),
            cache_store=tcp.CacheStore(isolated=True),
            **kwargs,
        )
        # (op, whether the entry had a plan, the first difference or None)
        self.built: list[tuple[object, bool, str | None]] = []

    def _output_from_cache_entry(self, state: Any, entry: Any, key: Any, func: Any, args: Any) -> Any:
        ours = super()._output_from_cache_entry(state, entry, key, func, args)
        theirs = _ft.FakeTensorMode._output_from_cache_entry(self, state, entry, key, func, args)
        self.built.append((func, synth.output_plan(entry, func) is not None, _difference(ours, theirs, args)))
        return ours


def _difference(ours: object, theirs: object, args: Sequence[object]) -> str | None:
    """How two outputs differ: safety.describe's first difference, then torch's metadata check."""
    diff = first_difference(describe(ours, args, {}), describe(theirs, args, {}))
    if diff is not None:
        return diff
    for a, b in zip(pytree.tree_leaves(ours), pytree.tree_leaves(theirs), strict=True):
        if not isinstance(a, _ft.FakeTensor) or not isinstance(b, _ft.FakeTensor):
            if a != b:
                return f"constant {a!r} != {b!r}"
            continue
        try:
            assert_metadata_eq(assert_eq, a, b)
        except AssertionError as e:
            return f"assert_metadata_eq: {e}"
        if a.fake_mode is not b.fake_mode or a.fake_device != b.fake_device:
            return "fake mode or device"
    return None


def _t(*shape: int, **kwargs: Any) -> torch.Tensor:
    return torch.zeros(*shape, **kwargs)


# (name, make real inputs, the call, whether its entry is plain)
Call = Callable[..., object]
PLAIN_CASES: list[Any] = [
    subtest(((_t(2, 8, 4, 4),), lambda x: aten.relu.default(x)), name="relu"),
    subtest(
        ((_t(2, 3, 8, 8), _t(4, 3, 3, 3), _t(4)), lambda x, w, b: aten.convolution.default(x, w, b, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)),
        name="convolution",
    ),
    subtest(
        (
            (_t(2, 3, 8, 8).to(memory_format=torch.channels_last), _t(4, 3, 3, 3), _t(4)),
            lambda x, w, b: aten.convolution.default(x, w, b, [2, 2], [0, 0], [1, 1], False, [0, 0], 1),
        ),
        name="convolution_channels_last",
    ),
    subtest(((_t(3, 5), _t(5, 7), _t(7)), lambda x, w, b: aten.addmm.default(b, x, w)), name="addmm"),
    subtest(
        ((_t(2, 4, 3, 3), _t(4), _t(4)), lambda x, m, v: aten.native_batch_norm.default(x, None, None, m, v, False, 0.1, 1e-5)),
        name="native_batch_norm_tuple",
    ),
    subtest(
        ((_t(1, 2, 6, 6),), lambda x: aten.max_pool2d_with_indices.default(x, [2, 2], [2, 2])), name="max_pool_indices"
    ),
    subtest(
        (
            (_t(2, 4, 6, 6), _t(2, 3, 8, 8), _t(4, 3, 3, 3)),
            lambda g, x, w: aten.convolution_backward.default(
                g, x, w, [4], [1, 1], [0, 0], [1, 1], False, [0, 0], 1, [True, False, True]
            ),
        ),
        name="convolution_backward_with_none",
    ),
    subtest(((_t(3, 4),), lambda x: aten.sum.dim_IntList(x, [1], False, dtype=torch.float64)), name="sum_dtype"),
    subtest(((_t(0, 4),), lambda x: aten.relu.default(x)), name="zero_size"),
    subtest(((_t(3, 4, dtype=torch.complex64),), lambda x: aten.mul.Tensor(x, x)), name="complex"),
    subtest(((_t(3, 4),), lambda x: aten.gt.Scalar(x, 0.5)), name="bool_output"),
    subtest(
        ((_t(2, 4),), lambda x: aten.empty_strided.default([2, 3], [1, 2], dtype=torch.float16, device="cpu")),
        name="empty_strided_transposed",
    ),
    subtest(((_t(2, 4),), lambda x: qd.quantize_per_tensor.default(x, 0.1, 0, -128, 127, torch.int8)), name="quantize"),
    subtest(((_t(2, 4),), lambda x: torch.ops.tcp_test.pair.default(x)), name="backend_tuple"),
]

VIEW_CASES: list[Any] = [
    subtest(((_t(2, 8),), lambda x: aten.view.default(x, [16])), name="view"),
    subtest(((_t(2, 8),), lambda x: aten.t.default(x)), name="transpose"),
    subtest(((_t(4, 8),), lambda x: aten.select.int(x, 0, 2)), name="select_offset"),
    subtest(((_t(4, 8),), lambda x: aten.slice.Tensor(x, 1, 2, 7, 2)), name="strided_slice_offset"),
    subtest(((_t(4, 8),), lambda x: aten.view.dtype(x, torch.int16)), name="view_dtype"),
    subtest(((_t(4, 8),), lambda x: aten.add_.Tensor(x, 1.0)), name="inplace"),
    subtest(((_t(4, 8), _t(8)), lambda x, y: aten.mul_.Tensor(x, y)), name="inplace_two_args"),
    subtest(((_t(2, 4),), lambda x: torch.ops.tcp_test.good_view.default(x)), name="backend_view"),
]

TORCH_PATH_CASES: list[Any] = [
    subtest(((_t(2, 8, dtype=torch.complex64),), lambda x: aten._conj.default(x)), name="conj_view"),
    subtest(((_t(2, 8),), lambda x: aten._neg_view.default(x)), name="neg_view"),
]


@instantiate_parametrized_tests
class TestSynthParity(TestCase):
    """Each hit's output equals what torch's _output_from_cache_entry builds."""

    def run_twice(self, mode: _ParityMode, inputs: Sequence[torch.Tensor], call: Call) -> tuple[object, object]:
        """A miss then a hit of ``call``; both outputs."""
        fakes = [mode.from_tensor(t) for t in inputs]
        with mode:
            first = call(*fakes)
            second = call(*fakes)
        return first, second

    def assertBuiltAlike(self, mode: _ParityMode, op: object, *, plain: bool) -> None:
        """Every output built equals torch's; ``op``'s entries took the fast path iff ``plain``."""
        ops = [func for func, _, _ in mode.built]
        # The miss's verification and the hit both went through the override.
        self.assertGreaterEqual(ops.count(op), 2)
        for func, used_plan, diff in mode.built:
            self.assertIsNone(diff, str(func))
            if func is op:
                self.assertEqual(used_plan, plain and HAS_FAST, str(func))

    def check(self, inputs: Sequence[torch.Tensor], call: Call, *, plain: bool, inference: bool = False) -> None:
        """Every hit of ``call`` is built as torch builds it; plain entries take the fast path."""
        mode = _ParityMode()
        with torch.inference_mode(inference):
            miss, hit = self.run_twice(mode, inputs, call)
        # The last output built is the hit's; its op is the one under test
        # (the others are ops its kernel or decomposition dispatched).
        op = mode.built[-1][0]
        self.assertBuiltAlike(mode, op, plain=plain)
        self.assertEqual(mode.cache_report()[op].hits, 1)
        self.assertEqual(type(hit), type(miss))

    @parametrize("case", PLAIN_CASES)
    def test_plain_entries(self, case: tuple[Sequence[torch.Tensor], Call]) -> None:
        """Plain entries (static, strided, not an alias) are built by the C++ helper, equal to torch's."""
        self.check(*case, plain=True)

    @parametrize("case", PLAIN_CASES[:3])
    def test_plain_entries_inference_mode(self, case: tuple[Sequence[torch.Tensor], Call]) -> None:
        """Under inference mode both paths make inference tensors alike."""
        self.check(*case, plain=True, inference=True)

    @parametrize("case", VIEW_CASES)
    def test_view_and_inplace_entries(self, case: tuple[Sequence[torch.Tensor], Call]) -> None:
        """Views (on the input's storage, at its offset) and in-place ops (the input) match torch's."""
        self.check(*case, plain=True)

    @parametrize("case", TORCH_PATH_CASES)
    def test_conj_neg_entries_use_torch(self, case: tuple[Sequence[torch.Tensor], Call]) -> None:
        """Outputs with conj or neg bits are left to torch's synthesis."""
        self.check(*case, plain=False)

    @parametrize(
        "op, make_args",
        [
            subtest((aten.relu.default, lambda x: (x,)), name="aten_relu"),
            subtest((qd.quantize_per_tensor.default, lambda x: (x, 0.1, 0, -128, 127, torch.int8)), name="backend"),
            subtest((torch.ops.tcp_test.pair.default, lambda x: (x,)), name="backend_tuple"),
            subtest((torch.ops.tcp_test.grad_out.default, lambda x: (x,)), name="requires_grad"),
            subtest((aten.view.default, lambda x: (x, [-1])), name="view"),
            subtest((aten.t.default, lambda x: (x,)), name="transpose"),
            subtest((aten.select.int, lambda x: (x, 1, 2)), name="select_offset"),
            subtest((aten.slice.Tensor, lambda x: (x, 0, 1, 2**63 - 1)), name="slice_offset"),
            subtest((aten.unsqueeze.default, lambda x: (x, 0)), name="unsqueeze"),
            subtest((aten.view.dtype, lambda x: (x, torch.int16)), name="view_dtype"),
        ],
    )
    def test_symbolic_entries(self, op: Any, make_args: Callable[[Any], tuple[Any, ...]]) -> None:
        """Entries with symbolic sizes, fresh or views, are built from a template of torch's first synthesis, alike
        torch's, and add no guard an uncached run would not."""
        guards = []
        for cache in (True, False):
            mode = _ParityMode(shape_env=ShapeEnv())
            mode.cache_enabled = cache
            ctx = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC, DimDynamic.STATIC])
            x = mode.from_tensor(_t(4, 3), symbolic_context=ctx)
            with mode:
                outs = [op(*make_args(x)) for _ in range(3)]
            guards.append([str(g.expr) for g in mode.shape_env.guards])
            if cache:
                self.assertEqual(mode.cache_report()[op].hits, 2)
                self.assertBuiltAlike(mode, op, plain=True)
                first = pytree.tree_leaves(outs[-1])[0]
                self.assertEqual(op.is_view, first.untyped_storage()._cdata == x.untyped_storage()._cdata)
                self.assertIn(str(x.shape[0].node.expr), str(first.shape))
        self.assertEqual(guards[0], guards[1])

    @parametrize(
        "op",
        [aten.empty_like.default, aten.relu.default, aten.t.default, aten.view.default],
        name_fn=lambda op: str(op).replace(".", "_"),
    )
    def test_symbolic_hits_hold_this_calls_symints(self, op: Any) -> None:
        """A symbolic hit's sizes are this call's SymInts, as torch's synthesis makes them: their SymNodes (a tracer
        maps proxies by SymNode) and what the ShapeEnv learned since (a symbol replaced by a constant is an int)."""
        def run(cache: bool) -> list[object]:
            mode = _ParityMode(shape_env=ShapeEnv())
            mode.cache_enabled = cache
            ctx = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC, DimDynamic.DYNAMIC])
            x = mode.from_tensor(_t(4, 3), symbolic_context=ctx)
            args = (lambda t: (t, [-1])) if op is aten.view.default else (lambda t: (t,))
            seen: list[object] = []
            with mode:
                op(*args(x))
                # A twin of x: new SymNodes with x's expressions, so an equal key.
                twin = torch.empty_strided((x.shape[0] + 1 - 1, x.shape[1] * 1), x.stride())
                out = op(*args(twin))
                inputs = {id(s.node): f"twin.size{i}" for i, s in enumerate(twin.shape) if isinstance(s, torch.SymInt)}
                seen.append([inputs.get(id(s.node), "other") for s in out.shape if isinstance(s, torch.SymInt)])
                torch._check(x.shape[1] == 3)  # replaces a symbol by a constant
                out = op(*args(x))
                seen.append(([type(s).__name__ for s in out.shape], [type(s).__name__ for s in out.stride()]))
            if cache:
                self.assertEqual(mode.cache_report()[op].hits, 2)
                self.assertBuiltAlike(mode, op, plain=True)
            return seen

        self.assertEqual(run(True), run(False))

    def test_symbolic_hit_of_another_shape_env(self) -> None:
        """A hit whose SymInts belong to another ShapeEnv than the template's (equal names, so an equal key) gets its
        storage size from torch's synthesis, in its own ShapeEnv, as stock's hit does."""
        from torch._dynamo.source import ConstantSource

        def run(cache: bool) -> list[list[str]]:
            mode = _ParityMode(shape_env=ShapeEnv())
            mode.cache_enabled = cache
            envs = [ShapeEnv(), ShapeEnv()]
            with mode:
                for env in envs:
                    n = env.create_symintnode(env.create_symbol(6, ConstantSource("n")), hint=6)
                    out = torch.relu(torch.empty(n, 3))
                    bool(out.untyped_storage().nbytes() > 100)  # a guard on the storage size
            if cache:
                self.assertEqual(mode.cache_report()[aten.relu.default].hits, 1)
            return [[str(g.expr) for g in env.guards] for env in envs]

        self.assertEqual(run(True), run(False))

    @parametrize("name", ["sym_double", "size0"])
    def test_bare_symint_outputs_as_uncached(self, name: str) -> None:
        """A hit of a bare SymInt output returns what an uncached run returns: this call's input SymInt (size0 returns
        x.shape[0]) or a new SymNode (sym_double), so a traced graph is the uncached one."""
        from torch.fx.experimental.proxy_tensor import make_fx

        op = getattr(torch.ops.tcp_test, name).default

        def f(x: torch.Tensor) -> torch.Tensor:
            op(x)
            twin = torch.empty_strided((x.shape[0] + 1 - 1,), x.stride())
            return x.new_empty(op(twin))

        results = []
        for cache in (True, False):
            mode = tcp.FakeTensorMode(cache_policy=tcp.CachePolicy(namespaces=["tcp_test"]), shape_env=ShapeEnv())
            mode.cache_enabled = cache
            x = mode.from_tensor(_t(6), symbolic_context=StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC]))
            with mode:
                n, m = op(x), op(x)
                identity = (n.node is x.shape[0].node, m.node is x.shape[0].node, n.node is m.node)
                results.append((identity, make_fx(f)(x).code.strip()))
            if cache:
                self.assertGreaterEqual(mode.cache_report()[op].hits, 2)
        self.assertEqual(results[0], results[1])

    def test_requires_grad_output(self) -> None:
        """A hit of an entry whose output requires grad makes a leaf that requires grad."""
        mode = _ParityMode()
        x = mode.from_tensor(_t(2, 3))
        with mode:
            torch.ops.tcp_test.grad_out.default(x)
            out = torch.ops.tcp_test.grad_out.default(x)
        self.assertEqual(mode.cache_report()[torch.ops.tcp_test.grad_out.default].hits, 1)
        self.assertTrue(out.requires_grad)
        self.assertTrue(out.is_leaf)
        self.assertBuiltAlike(mode, torch.ops.tcp_test.grad_out.default, plain=True)


@instantiate_parametrized_tests
class TestFakeTensors(TestCase):
    @parametrize("unsafe_data_ptr", [False, True])
    @parametrize("requires_grad", [False, True])
    def test_made_as_torch_makes_them(self, unsafe_data_ptr: bool, requires_grad: bool) -> None:
        """FakeTensors.make gives what torch's constructor gives: attributes, keys, grad, the data_ptr guard."""
        mode = tcp.FakeTensorMode()
        mode._allow_unsafe_data_ptr_access = unsafe_data_ptr
        fakes = synth.FakeTensors()
        device = torch.device("cpu")

        def meta() -> torch.Tensor:
            return torch.empty(2, 3, device="meta", requires_grad=requires_grad)

        first = fakes.make(mode, meta(), device)  # torch's own, teaching the attributes
        ours, theirs = fakes.make(mode, meta(), device), _ft.FakeTensor(mode, meta(), device)
        for t in (first, ours):
            self.assertEqual(vars(t), vars(theirs))
            self.assertEqual(torch._C._dispatch_keys(t), torch._C._dispatch_keys(theirs))
            self.assertEqual((t.requires_grad, t.is_leaf, t.device, type(t)), (theirs.requires_grad, theirs.is_leaf, theirs.device, type(theirs)))

        def data_ptr(t: torch.Tensor) -> str:
            # TORCH_WARN_ONCE would warn for whichever tensor asks first.
            with warnings.catch_warnings(record=True) as caught, set_warn_always_context(True):
                warnings.simplefilter("always")
                try:
                    t.data_ptr()
                except RuntimeError as e:
                    return f"raised {str(e)[:40]}"
            return f"warned {len(caught)}"

        self.assertEqual(data_ptr(ours), data_ptr(theirs))

    def test_a_changed_constructor_is_used_as_is(self) -> None:
        """On a torch whose FakeTensor constructor takes another step, every hit's tensor is torch's own."""
        self.assertTrue(synth.FAST_FAKE_TENSORS)  # torch 2.13 / 2.14
        mode, fakes = tcp.FakeTensorMode(), synth.FakeTensors()
        fakes.make(mode, torch.empty(2, device="meta"), torch.device("cpu"))
        made = []
        real = _ft.FakeTensor

        class Spy(real):  # type: ignore[valid-type,misc]
            def __new__(cls, *args: Any, **kwargs: Any) -> Any:
                made.append(args)
                return real(*args, **kwargs)

        with mock.patch.object(synth, "FAST_FAKE_TENSORS", False), mock.patch.object(synth, "FakeTensor", Spy):
            fakes.make(mode, torch.empty(2, device="meta"), torch.device("cpu"))
        self.assertEqual(len(made), 1)

    def test_debug_config_takes_torch_constructor(self) -> None:
        """With FakeTensorConfig.debug, every tensor is torch's (it records a traceback)."""
        mode = tcp.FakeTensorMode()
        fakes = synth.FakeTensors()
        fakes.make(mode, torch.empty(2, device="meta"), torch.device("cpu"))
        with mock.patch.object(_ft.FakeTensorConfig, "debug", True):
            t = fakes.make(mode, torch.empty(2, device="meta"), torch.device("cpu"))
        self.assertIn("_debug_trace", vars(t))


class TestSynthHits(TestCase):
    """What every hit of a plain entry must be besides equal metadata."""

    def test_hits_get_fresh_storages(self) -> None:
        """Two hits of one entry never share a storage with each other or the input."""
        mode = tcp.FakeTensorMode(cache_store=tcp.CacheStore(isolated=True))
        x = mode.from_tensor(_t(2, 3))
        with mode:
            outs = [aten.relu.default(x) for _ in range(3)]
        self.assertEqual(mode.cache_info().hits, 2)
        storages = {o.untyped_storage()._cdata for o in outs} | {x.untyped_storage()._cdata}
        self.assertEqual(len(storages), 4)
        self.assertTrue(all(o._version == 0 and o.is_leaf and not o._is_view() for o in outs))

    @unittest.skipIf(not HAS_FAST, NO_FAST)
    def test_plans_dropped_on_cache_clear(self) -> None:
        """cache_clear forgets the plans with the entries they describe."""
        mode = tcp.FakeTensorMode(cache_store=tcp.CacheStore(isolated=True))
        x = mode.from_tensor(_t(2, 3))
        with mode:
            aten.relu.default(x)
            aten.relu.default(x)
        self.assertGreater(len(mode._synth), 0)
        mode.cache_clear()
        self.assertEqual(len(mode._synth), 0)

    @unittest.skipIf(not HAS_FAST, NO_FAST)
    def test_plans_bounded(self) -> None:
        """Misses (whose entries torch builds and drops) cannot grow the plan memo without bound."""
        mode = tcp.FakeTensorMode(cache_store=tcp.CacheStore(isolated=True))
        with mock.patch.object(synth, "_MAX_PLANS", 50), mode:
            for n in range(1, 120):
                aten.relu.default(mode.from_tensor(_t(n)))
        self.assertLessEqual(len(mode._synth), 50)
        self.assertEqual(mode.cache_report()[aten.relu.default].misses, 119)

    @unittest.skipIf(not HAS_FAST, NO_FAST)
    def test_meta_empty_strided_rejects_bad_input(self) -> None:
        """The C++ helper names itself and the fix for arguments a plan never passes."""
        fn = synth._meta_empty_strided
        assert fn is not None
        with self.assertRaisesRegex(TypeError, r"meta_empty_strided\(\.\.\.\): shape must be a tuple of ints"):
            fn([2], (1,), torch.float32, False)
        with self.assertRaisesRegex(TypeError, "shape must be a tuple of ints"):
            fn((True,), (1,), torch.float32, False)
        with self.assertRaisesRegex(TypeError, "dtype must be a torch.dtype"):
            fn((2,), (1,), "float32", False)
        with self.assertRaisesRegex(ValueError, "shape and stride differ in length"):
            fn((2, 3), (1,), torch.float32, False)

    @unittest.skipIf(not HAS_FAST, NO_FAST)
    def test_meta_view_of_rejects_bad_input(self) -> None:
        """The view helper names itself, and refuses a base without a meta storage."""
        fn = synth._meta_view_of
        assert fn is not None
        mode = tcp.FakeTensorMode()
        base = mode.from_tensor(_t(2, 3))
        self.assertEqual(fn(base, (3,), (1,), 3, torch.float32).shape, (3,))
        with self.assertRaisesRegex(ValueError, r"meta_view_of\(\.\.\.\): base must have a meta storage"):
            fn(_t(2, 3), (3,), (1,), 0, torch.float32)
        with self.assertRaisesRegex(TypeError, r"meta_view_of\(\.\.\.\): base must be a Tensor"):
            fn("x", (3,), (1,), 0, torch.float32)
        with self.assertRaisesRegex(TypeError, r"meta_view_of\(\.\.\.\): stride must be a tuple of ints"):
            fn(base, (3,), [1], 0, torch.float32)
        with self.assertRaisesRegex(ValueError, r"meta_view_of\(\.\.\.\): shape and stride differ in length"):
            fn(base, (3,), (1, 1), 0, torch.float32)

    @unittest.skipIf(not HAS_FAST, NO_FAST)
    def test_canary_switches_off_on_disagreement(self) -> None:
        """A fast-path output unlike torch's turns the fast path off, warns, and returns torch's."""
        real = synth._meta_empty_strided
        assert real is not None

        def wrong(shape: tuple[int, ...], stride: tuple[int, ...], dtype: torch.dtype, rg: bool) -> torch.Tensor:
            return real(shape, stride, torch.float64 if dtype != torch.float64 else torch.float32, rg)

        mode = tcp.FakeTensorMode(cache_store=tcp.CacheStore(isolated=True))
        x = mode.from_tensor(_t(2, 5))
        with mode:
            aten.relu.default(x)  # a miss: verified against the real output, fast path intact
        # A drifted synthesis on a hit: the canary compares it with torch's.
        real_view = synth._meta_view_of
        # The canary switches off both helpers; patching them here restores both afterwards.
        with (
            mock.patch.object(synth, "_meta_empty_strided", wrong),
            mock.patch.object(synth, "_meta_view_of", real_view),
            mock.patch.object(synth._canary, "remaining", 3),
        ):
            with self.assertWarnsRegex(UserWarning, "differs from torch's _output_from_cache_entry"), mode:
                out = aten.relu.default(x)
            self.assertIsNone(synth._meta_empty_strided)
            self.assertIsNone(synth._meta_view_of)
            self.assertEqual(synth._canary.remaining, 0)
        self.assertEqual(out.dtype, torch.float32)
        self.assertIs(synth._meta_empty_strided, real)
        self.assertIs(synth._meta_view_of, real_view)

    @unittest.skipIf(HAS_FAST, "the C++ helper is loaded")
    def test_without_extension_no_plans(self) -> None:
        """Without torch_cachepolicy._C every hit goes through torch's synthesis."""
        self.assertIsNone(synth.output_plan(object()))  # type: ignore[arg-type]


if __name__ == "__main__":
    run_tests()
