# Owner(s): ["module: fakeTensor"]
"""torch_cachepolicy._synth: a hit's output built without dispatch equals torch's synthesis.

Every hit of a :class:`_ParityMode` is built twice, by the package (``Synthesizer.output``: a ``Plan`` of steps, or
torch's path) and by torch's ``FakeTensorMode._output_from_cache_entry``, and the two are compared field by field:
``_verify.describe``, torch's ``assert_metadata_eq``, the type, the dispatch keys, the mutable-data-pointer guard and
the FakeTensor's Python attributes. ``TORCH_CACHEPOLICY_SELF_CHECK`` makes the package do the first of those
comparisons on every plain hit itself; :class:`TestSelfCheck` holds it to raising on a difference and only then.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import sys
import textwrap
import unittest
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any
from unittest import mock

import cachepolicy_testing as testing  # defines quantized_decomposed and tcp_test ops
import torch
import torch.utils._pytree as pytree
import zoo_ops as zoo
from torch._dispatch.python import enable_python_dispatcher
from torch._subclasses import fake_tensor as _ft
from torch._subclasses.meta_utils import assert_eq, assert_metadata_eq
from torch.fx.experimental.proxy_tensor import ProxyTorchDispatchMode, PythonKeyTracer, get_proxy_mode
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
    set_warn_always_context,
    subtest,
)
from torch.utils._python_dispatch import TorchDispatchMode

import torch_cachepolicy as tcp
from torch_cachepolicy import _compat, _key, _reasons, _synth
from torch_cachepolicy._verify import describe, first_difference

synthesis_call, synthesis_args = testing.synthesis_call, testing.synthesis_args

aten = torch.ops.aten
qd = torch.ops.quantized_decomposed
BUILTIN_NAMESPACES = ("aten", "prim", "prims")  # stock's: entries on first sight

# A backend op whose fake kernel returns a leaf that requires grad.
_lib = torch.library.Library("tcp_test", "FRAGMENT")
_lib.define("grad_out(Tensor x) -> Tensor")
torch.library.register_fake("tcp_test::grad_out", lambda x: torch.empty(x.shape, requires_grad=True), lib=_lib)
HAS_FAST = _synth._meta_empty_strided is not None
NO_FAST = "torch_cachepolicy._C is not loaded (USE_CPP=0 or TORCH_CACHEPOLICY_FORCE_PYTHON=1)"


def data_ptr_guard(t: torch.Tensor) -> str:
    """What ``t.data_ptr()`` does: raise (the throwing guard), warn (the deprecation guard) or neither."""
    # TORCH_WARN_ONCE would warn for whichever tensor asks first.
    with warnings.catch_warnings(record=True) as caught, set_warn_always_context(True):
        warnings.simplefilter("always")
        try:
            t.data_ptr()
        except RuntimeError as e:
            return f"raised {str(e)[:40]}"
    return f"warned {len(caught)}"


def fake_tensor_state(t: Any) -> tuple[object, ...]:
    """A FakeTensor's state comparable across modes: type, dispatch keys, data-pointer guard, attributes."""
    plain = (type(None), bool, int, str, torch.device)
    attrs = sorted(
        (k, "mode" if v is t.fake_mode else v if isinstance(v, plain) else type(v)) for k, v in vars(t).items()
    )
    return (type(t), str(torch._C._dispatch_keys(t)), data_ptr_guard(t), attrs)


_STATE_PARTS = ("type", "dispatch keys", "data-pointer guard", "attributes")


def _difference(ours: object, theirs: object, args: Sequence[object]) -> str | None:
    """How two outputs differ: _verify.describe's first difference, torch's metadata check, then FakeTensor state."""
    diff = first_difference(describe(ours, args, {}), describe(theirs, args, {}))
    if diff is not None:
        return diff
    for a, b in zip(pytree.tree_leaves(ours), pytree.tree_leaves(theirs), strict=True):
        if not isinstance(a, _ft.FakeTensor) or not isinstance(b, _ft.FakeTensor):
            if type(a) is not type(b) or a != b:
                return f"constant {a!r} != {b!r}"
            continue
        try:
            assert_metadata_eq(assert_eq, a, b)
        except AssertionError as e:
            return f"assert_metadata_eq: {e}"
        if a.fake_mode is not b.fake_mode or a.fake_device != b.fake_device:
            return "fake mode or device"
        for name, x, y in zip(_STATE_PARTS, fake_tensor_state(a), fake_tensor_state(b), strict=True):
            if x != y:
                return f"{name}: {x} != {y}"
    return None


class _ParityMode(tcp.FakeTensorMode):
    """Builds every hit's output twice, ours and torch's, and records both.

    Both are described at once: the one returned goes on through the
    dispatcher (ADInplaceOrView makes a view op's output a view), the other
    does not.
    """

    def __init__(self, *, unsafe_data_ptr: bool | None = None, **kwargs: Any) -> None:
        super().__init__(
            cache_policy=tcp.CachePolicy(namespaces=["quantized_decomposed", "tcp_test"]),
            cache_store=tcp.CacheStore(isolated=True),
            **kwargs,
        )
        if unsafe_data_ptr is not None:
            self._allow_unsafe_data_ptr_access = unsafe_data_ptr
        # (op, the entry's plan or None, the first difference or None)
        self.built: list[tuple[object, _synth.Plan | None, str | None]] = []

    def _output_from_cache_entry(self, state: Any, entry: Any, key: Any, *rest: Any) -> Any:
        _, _, _, func, args = synthesis_call((state, entry, key, *rest))
        ours = super()._output_from_cache_entry(state, entry, key, *rest)
        theirs = _ft.FakeTensorMode._output_from_cache_entry(self, state, entry, key, *rest)
        # The plan the synthesizer built ours with (None: torch's synthesis); torch's check of a new entry runs on
        # a copy it drops, whose plan is not kept (Note [One synthesis for hits and their verification]).
        synth = self._cache.synth
        held, plan = (entry, _synth.output_plan(entry)) if synth.transient else synth.plans.get(id(entry), (None, None))
        self.built.append((func, plan if held is entry else None, _difference(ours, theirs, args)))
        return ours

    def plan(self, op: object) -> _synth.Plan | None:
        """The plan of the entry of the last output built for ``op``."""
        return [plan for func, plan, _ in self.built if func is op][-1]


def _t(*shape: int, **kwargs: Any) -> torch.Tensor:
    return torch.zeros(*shape, **kwargs)


# (make real inputs, the call)
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
    subtest(((_t(4, 6),), lambda x: aten.max.dim(x, 1)), name="max_dim_tuple"),
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
    subtest(((_t(3, 4), _t(3, 4)), lambda x, y: aten.is_same_size.default(x, y)), name="constant_output"),
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
    subtest(((_t(6, 4),), lambda x: aten.split.Tensor(x, 2)), name="split_tuple_of_views"),
    subtest(((_t(4, 8),), lambda x: aten.add_.Tensor(x, 1.0)), name="inplace"),
    subtest(((_t(4, 8), _t(8)), lambda x, y: aten.mul_.Tensor(x, y)), name="inplace_two_args"),
    subtest(((_t(2, 4),), lambda x: torch.ops.tcp_test.good_view.default(x)), name="backend_view"),
]

TORCH_PATH_CASES: list[Any] = [
    subtest(((_t(2, 8, dtype=torch.complex64),), lambda x: aten._conj.default(x)), name="conj_view"),
    subtest(((_t(2, 8),), lambda x: aten._neg_view.default(x)), name="neg_view"),
]


def _case(name: str) -> tuple[Sequence[torch.Tensor], Call]:
    """The inputs and call of the plain or view case ``name``."""
    return next(c.arg_values for c in PLAIN_CASES + VIEW_CASES if c.name == name)


def _miss_then_hit(mode: tcp.FakeTensorMode, inputs: Sequence[torch.Tensor], call: Call) -> tuple[object, object]:
    """A miss then a hit of ``call`` under ``mode`` (after a backend key's first sight); both outputs."""
    fakes = [mode.from_tensor(t) for t in inputs]
    with mode:
        first = call(*fakes)
        if any(row.namespace not in BUILTIN_NAMESPACES for row in mode.cache_report().ops):
            first = call(*fakes)  # the backend op's first sight made no entry (Note [An entry on a key's second sight])
        second = call(*fakes)
    return first, second


@contextlib.contextmanager
def torch_synthesis() -> Iterator[None]:
    """Every hit's output is torch's ``_output_from_cache_entry`` (as without the C++ extension)."""
    with mock.patch.object(_synth, "_meta_empty_strided", None):
        yield


@instantiate_parametrized_tests
class TestSynthParity(testing.CachePolicyTestCase):
    """Each hit's output equals what torch's _output_from_cache_entry builds."""

    def assertBuiltAlike(self, mode: _ParityMode, op: object, *, plain: bool) -> None:
        """Every output built equals torch's; ``op``'s entries took the fast path iff ``plain``."""
        ops = [func for func, _, _ in mode.built]
        # The miss's verification and the hit both went through the override.
        self.assertGreaterEqual(ops.count(op), 2)
        for func, plan, diff in mode.built:
            self.assertIsNone(diff, str(func))
            if func is op:
                self.assertEqual(plan is not None, plain and HAS_FAST, str(func))

    def check(
        self,
        inputs: Sequence[torch.Tensor],
        call: Call,
        *,
        plain: bool,
        inference: bool = False,
        unsafe_data_ptr: bool | None = None,
    ) -> _ParityMode:
        """Every hit of ``call`` is built as torch builds it; plain entries take the fast path."""
        mode = _ParityMode(unsafe_data_ptr=unsafe_data_ptr)
        with torch.inference_mode(inference):
            miss, hit = _miss_then_hit(mode, inputs, call)
        # The last output built is the hit's; its op is the one under test
        # (the others are ops its kernel or decomposition dispatched).
        op = mode.built[-1][0]
        self.assertBuiltAlike(mode, op, plain=plain)
        self.assertEqual(mode.cache_report()[op].hits, 1)
        self.assertEqual(type(hit), type(miss))
        return mode

    @parametrize("case", PLAIN_CASES)
    def test_plain_entries(self, case: tuple[Sequence[torch.Tensor], Call]) -> None:
        """Plain entries (static, strided, not an alias) are built by the C++ helper, equal to torch's."""
        self.check(*case, plain=True)

    # A view of a normal tensor under inference mode is torch's bypass (dispatch_key_set mismatch).
    @parametrize("case", PLAIN_CASES[:3] + VIEW_CASES[-3:-1])
    def test_entries_inference_mode(self, case: tuple[Sequence[torch.Tensor], Call]) -> None:
        """Under inference mode both paths make inference tensors alike (fresh and in-place outputs)."""
        self.check(*case, plain=True, inference=True)

    @parametrize("unsafe_data_ptr", [False, True])
    @parametrize("case", PLAIN_CASES[:1] + PLAIN_CASES[4:5] + VIEW_CASES[:1])
    def test_data_ptr_guard(self, case: tuple[Sequence[torch.Tensor], Call], unsafe_data_ptr: bool) -> None:
        """Either data-pointer setting of the mode gives a hit the guard torch's synthesis gives it."""
        mode = self.check(*case, plain=True, unsafe_data_ptr=unsafe_data_ptr)
        self.assertIs(mode._allow_unsafe_data_ptr_access, unsafe_data_ptr)

    @parametrize("case", VIEW_CASES)
    def test_view_and_inplace_entries(self, case: tuple[Sequence[torch.Tensor], Call]) -> None:
        """Views (on the input's storage, at its offset) and in-place ops (the input) match torch's."""
        self.check(*case, plain=True)

    @parametrize("case", TORCH_PATH_CASES)
    def test_conj_neg_entries_use_torch(self, case: tuple[Sequence[torch.Tensor], Call]) -> None:
        """Outputs with conj or neg bits are left to torch's synthesis."""
        self.check(*case, plain=False)

    @unittest.skipIf(not HAS_FAST, NO_FAST)
    @parametrize(
        "case, is_tuple, steps",
        [
            subtest((_case("relu"), False, ["_Fresh"]), name="fresh"),
            subtest((_case("max_dim_tuple"), True, ["_Fresh", "_Fresh"]), name="tuple"),
            subtest((_case("constant_output"), False, ["_Constant"]), name="constant"),
            subtest((_case("view"), False, ["_ViewOf"]), name="view"),
            subtest((_case("split_tuple_of_views"), True, ["_ViewOf"] * 3), name="tuple_of_views"),
            subtest((_case("inplace_two_args"), False, ["_InPlace"]), name="inplace"),
        ],
    )
    def test_plan_steps(self, case: tuple[Sequence[torch.Tensor], Call], is_tuple: bool, steps: list[str]) -> None:
        """Each kind of plain output has a step of its own in the entry's Plan."""
        mode = self.check(*case, plain=True)
        plan = mode.plan(mode.built[-1][0])
        assert plan is not None
        self.assertEqual((plan.is_tuple, [type(s).__name__ for s in plan.steps], plan.pending), (is_tuple, steps, ()))

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
        """Symbolic entries, fresh or views, are built alike torch's from a template and add no guard uncached lacks."""
        guards = []
        for cache in (True, False):
            mode = _ParityMode(shape_env=ShapeEnv())
            mode.cache_enabled = cache
            ctx = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC, DimDynamic.STATIC])
            x = mode.from_tensor(_t(4, 3), symbolic_context=ctx)
            calls = 3 if op.namespace in BUILTIN_NAMESPACES else 4  # a backend key's first sight makes no entry
            with mode:
                outs = [op(*make_args(x)) for _ in range(calls)]
            guards.append([str(g.expr) for g in mode.shape_env.guards])
            if cache:
                self.assertEqual(mode.cache_report()[op].hits, 2)
                self.assertBuiltAlike(mode, op, plain=not op.is_view)  # a symbolic view stays torch's
                first = pytree.tree_leaves(outs[-1])[0]
                self.assertEqual(op.is_view, first.untyped_storage()._cdata == x.untyped_storage()._cdata)
                self.assertIn(str(x.shape[0].node.expr), str(first.shape))
                if HAS_FAST:
                    # A symbolic view stays torch's (Note [Traced graphs are stock's]); a fresh one has a template.
                    plan = mode.plan(op)
                    if op.is_view:
                        self.assertIsNone(plan)
                    else:
                        assert plan is not None
                        self.assertEqual({type(s).__name__ for s in plan.steps}, {"_SymbolicFresh"})
                        self.assertEqual(plan.pending, ())  # the template came from torch's first synthesis
        self.assertEqual(guards[0], guards[1])

    @parametrize(
        "op",
        [aten.empty_like.default, aten.relu.default, aten.t.default, aten.view.default],
        name_fn=lambda op: str(op).replace(".", "_"),
    )
    def test_symbolic_hits_hold_this_calls_symints(self, op: Any) -> None:
        """A symbolic hit's sizes are this call's SymInts (SymNodes, what the ShapeEnv learned since), as torch's."""
        # A tracer maps proxies by SymNode; a symbol replaced by a constant since is an int.
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
                self.assertBuiltAlike(mode, op, plain=not op.is_view)  # a symbolic view stays torch's
            return seen

        self.assertEqual(run(True), run(False))

    def test_symbolic_hit_of_another_shape_env(self) -> None:
        """SymInts of other ShapeEnvs than the mode's bypass (no hit is built in a wrong ShapeEnv); guards as uncached."""
        # Equal symbol names make an equal key by expression; a hit would build the storage size in the first ShapeEnv.
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
                self.assertEqual(mode.cache_report()[aten.relu.default].bypasses, {_reasons.UNKNOWN_SYMBOL: 2})
            return [[str(g.expr) for g in env.guards] for env in envs]

        self.assertEqual(run(True), run(False))

    @parametrize("name", ["sym_double", "size0"])
    def test_bare_symint_outputs_as_uncached(self, name: str) -> None:
        """A bare SymInt output's hit is the input's SymInt or a new SymNode, as uncached, and so is the graph."""
        # size0 returns x.shape[0] (the input's SymNode), sym_double a new one.
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
            torch.ops.tcp_test.grad_out.default(x)  # the first sight
            torch.ops.tcp_test.grad_out.default(x)  # the miss that makes the entry
            out = torch.ops.tcp_test.grad_out.default(x)
        self.assertEqual(mode.cache_report()[torch.ops.tcp_test.grad_out.default].hits, 1)
        self.assertTrue(out.requires_grad)
        self.assertTrue(out.is_leaf)
        self.assertBuiltAlike(mode, torch.ops.tcp_test.grad_out.default, plain=True)

    @parametrize("unsafe_data_ptr", [False, True])
    def test_backend_op_under_python_dispatcher(self, unsafe_data_ptr: bool) -> None:
        """A backend op's hits under the Python dispatcher, with either data-pointer guard, are built as torch's."""
        mode = _ParityMode(unsafe_data_ptr=unsafe_data_ptr)
        x = mode.from_tensor(_t(2, 3))
        op = qd.quantize_per_tensor.default
        with mode, enable_python_dispatcher():
            for _ in range(5):
                op(x, 0.02, 0, -128, 127, torch.int8)
        report = mode.cache_report()[op]
        self.assertEqual((report.hits, report.misses), (3, 2))  # the first sight, the miss, 3 hits
        self.assertBuiltAlike(mode, op, plain=True)


# ------------------------------------------------------------------ hits in context


def tuple_hit_mode() -> tuple[tcp.FakeTensorMode, torch.Tensor]:
    """A mode whose next ``aten.max.dim(x, 1)`` (a 2-tuple of fresh outputs) is a hit built by its plan."""
    mode = tcp.FakeTensorMode(cache_store=tcp.CacheStore(isolated=True))
    x = mode.from_tensor(torch.randn(4, 6))
    with mode:
        for _ in range(2):  # a miss (its verification memoizes the plan), then a hit
            aten.max.dim(x, 1)
    return mode, x


@contextlib.contextmanager
def during_first_fake_tensor_init(action: Callable[[], None]) -> Iterator[None]:
    """Runs ``action()`` once, when ``FakeTensor.__init__`` is first entered in the scope.

    That is Python code that runs between a tuple hit's outputs (on either
    synthesis): the window another thread, or a hook, could act in.
    """

    def hook(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code is _ft.FakeTensor.__init__.__code__:
            sys.setprofile(None)
            action()

    sys.setprofile(hook)
    try:
        yield
    finally:
        sys.setprofile(None)


class _PassThroughProxy(TorchDispatchMode):
    """Sits where make_fx's proxy mode sits (the PROXY slot) and dispatches on."""

    def __init__(self) -> None:
        super().__init__()
        self._mode_key = torch._C._TorchDispatchModeKey.PROXY

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return func(*args, **(kwargs or {}))


@instantiate_parametrized_tests
class TestHitsInContext(testing.CachePolicyTestCase):
    """Hits built by a plan behave as hits built by torch's synthesis around them: hooks, flags, errors, clears."""

    def assertSameAsTorchSynthesis(self, run: Callable[[], object]) -> object:
        """``run()`` returns the same with the package's synthesis and with torch's for every hit."""
        ours = run()
        with torch_synthesis():
            theirs = run()
        self.assertEqual(ours, theirs)
        return ours

    @unittest.skipIf(not HAS_FAST, NO_FAST)
    def test_tuple_hit_mode_hits_by_plan(self) -> None:
        """Control for the tests below: tuple_hit_mode's next max.dim is a hit its plan builds."""
        mode, x = tuple_hit_mode()
        built = []
        real = _synth.Plan.build

        def spy(plan: _synth.Plan, *args: Any) -> object:
            out = real(plan, *args)
            built.append(out is not _synth.TORCH_PATH)
            return out

        with mock.patch.object(_synth.Plan, "build", spy), mode:
            aten.max.dim(x, 1)
        self.assertEqual(built, [True])

    @parametrize("flag", ["data_ptr", "debug"])
    def test_flags_read_for_each_output(self, flag: str) -> None:
        """The data-pointer setting or FakeTensorConfig.debug changed amid a tuple hit applies to later outputs."""

        def run() -> list[object]:
            mode, x = tuple_hit_mode()
            if flag == "debug":
                # Crosscheck off: the flip lands amid the hit, so an uncached rerun after it differs from the hit's
                # first output by design.
                mode.cache_crosscheck_enabled = False

            def flip() -> None:  # while output 0 is made
                if flag == "data_ptr":
                    mode._allow_unsafe_data_ptr_access = not mode._allow_unsafe_data_ptr_access
                else:
                    _ft.FakeTensorConfig.debug = True

            try:
                with mode, during_first_fake_tensor_init(flip):
                    out = aten.max.dim(x, 1)
            finally:
                _ft.FakeTensorConfig.debug = False
            return [fake_tensor_state(t) for t in out]

        states = self.assertSameAsTorchSynthesis(run)
        assert isinstance(states, list)
        self.assertNotEqual(states[0], states[1])  # the flip showed

    def test_cache_clear_while_a_tuple_hit_is_built(self) -> None:
        """A cache_clear() landing between a tuple hit's outputs (another thread's) leaves the hit as it would be."""
        mode, x = tuple_hit_mode()
        fired: list[int] = []

        def clear() -> None:
            fired.append(1)
            tcp.FakeTensorMode.cache_clear()

        with mode:
            reference = aten.max.dim(x, 1)
            with during_first_fake_tensor_init(clear):
                out = aten.max.dim(x, 1)
        self.assertEqual(fired, [1])
        self.assertEqual(first_difference(describe(out, (x,), {}), describe(reference, (x,), {})), None)
        self.assertEqual([fake_tensor_state(t) for t in out], [fake_tensor_state(t) for t in reference])
        self.assertTrue(all(t.fake_mode is mode and t.device == x.device for t in out))

    def test_error_while_a_hit_is_built(self) -> None:
        """An error while a hit is built propagates and counts as with torch's synthesis; the next hit is normal."""

        def interrupt() -> None:
            raise RuntimeError("interrupted")

        def run() -> tuple[object, ...]:
            mode, x = tuple_hit_mode()
            with mode, self.assertRaisesRegex(RuntimeError, "interrupted"), during_first_fake_tensor_init(interrupt):
                aten.max.dim(x, 1)
            with mode:
                out = aten.max.dim(x, 1)
            return mode.cache_info(), mode.cache_key_stats().built, [fake_tensor_state(t) for t in out]

        self.assertSameAsTorchSynthesis(run)

    @parametrize("where", ["subclass", "class", "instance"])
    def test_own_synthesis_sees_every_hit(self, where: str) -> None:
        """_output_from_cache_entry overridden by a subclass, or patched on the class or a mode, builds every hit."""
        seen: list[object] = []

        class Subclass(tcp.FakeTensorMode):
            def _output_from_cache_entry(self, *args: Any) -> Any:
                seen.append(synthesis_call(args)[3])
                return super()._output_from_cache_entry(*args)

        mode = (Subclass if where == "subclass" else tcp.FakeTensorMode)(cache_store=tcp.CacheStore(isolated=True))
        original = tcp.FakeTensorMode._output_from_cache_entry
        returned: list[object] = []

        def wrapper(*args: Any) -> Any:
            state, entry, key, func, call_args = synthesis_call(args)
            seen.append(func)
            out = original(mode, state, entry, key, *synthesis_args(func, call_args))
            returned.append(out)
            return out

        patched: Any = contextlib.nullcontext()
        if where != "subclass":
            target: object = tcp.FakeTensorMode if where == "class" else mode
            patched = mock.patch.object(target, "_output_from_cache_entry", wrapper)
        x = mode.from_tensor(torch.randn(4, 6))
        with patched, mode:
            outs = [torch.relu(x) for _ in range(4)]
        self.assertEqual(mode.cache_info().hits, 3)
        # The miss's two (torch's check of its new entry, the package's verification), then the 3 hits.
        self.assertEqual(seen, [aten.relu.default] * 5)
        if where != "subclass":
            self.assertEqual(len(returned), 5)
            self.assertTrue(all(out is ret for out, ret in zip(outs[1:], returned[2:], strict=True)))

    @parametrize("where", ["dispatch_mode", "pre_dispatch"])
    def test_proxy_mode_in_the_key(self, where: str) -> None:
        """A proxy mode where get_proxy_mode looks (either place) keys hits apart from the rest, as torch's key."""

        @contextlib.contextmanager
        def proxy() -> Iterator[None]:
            if where == "pre_dispatch":
                # A real pre-dispatch proxy mode, pushed and popped as make_fx does (the PreDispatch key included).
                torch._ops._set_mode_pre_dispatch(ProxyTorchDispatchMode(PythonKeyTracer(), "real", pre_dispatch=True))
                try:
                    yield
                finally:
                    torch._ops._pop_mode_from_pre_dispatch()
            else:
                with _PassThroughProxy():
                    yield

        mode = tcp.FakeTensorMode(cache_store=tcp.CacheStore(isolated=True))
        x = mode.from_tensor(torch.randn(4, 6))
        # Every key the C++ builder makes is compared with torch's _cache_key.
        with mock.patch.object(_key, "SELF_CHECK", True), mode:
            for _ in range(2):
                mode.dispatch(aten.relu.default, (), (x,), {})
            with proxy():
                self.assertIsNotNone(get_proxy_mode())
                for _ in range(3):
                    mode.dispatch(aten.relu.default, (), (x,), {})
            mode.dispatch(aten.relu.default, (), (x,), {})
        info = mode.cache_info()
        self.assertEqual((info.hits, info.misses), (4, 2))  # one entry without the proxy mode, one with it


# ------------------------------------------------------------------ FakeTensors


@instantiate_parametrized_tests
class TestFakeTensors(testing.CachePolicyTestCase):
    """FakeTensors.make against torch's FakeTensor constructor."""

    @parametrize("unsafe_data_ptr", [False, True])
    @parametrize("requires_grad", [False, True])
    def test_made_as_torch_makes_them(self, unsafe_data_ptr: bool, requires_grad: bool) -> None:
        """FakeTensors.make gives what torch's constructor gives: attributes, keys, grad, the data_ptr guard."""
        mode = tcp.FakeTensorMode()
        mode._allow_unsafe_data_ptr_access = unsafe_data_ptr
        fakes = _synth.FakeTensors()
        device = torch.device("cpu")

        def meta() -> torch.Tensor:
            return torch.empty(2, 3, device="meta", requires_grad=requires_grad)

        first = fakes.make(mode, meta(), device)  # torch's own, teaching the attributes
        self.assertIsNotNone(fakes.bases[device])
        ours, theirs = fakes.make(mode, meta(), device), _ft.FakeTensor(mode, meta(), device)
        for t in (first, ours):
            self.assertEqual(vars(t), vars(theirs))
            self.assertEqual(torch._C._dispatch_keys(t), torch._C._dispatch_keys(theirs))
            self.assertEqual(
                (t.requires_grad, t.is_leaf, t.device, type(t)),
                (theirs.requires_grad, theirs.is_leaf, theirs.device, type(theirs)),
            )
            self.assertEqual(data_ptr_guard(t), data_ptr_guard(theirs))
        self.assertEqual(fake_tensor_state(ours), fake_tensor_state(theirs))

    def test_a_changed_constructor_is_used_as_is(self) -> None:
        """On a torch whose FakeTensor constructor takes another step, every hit's tensor is torch's own."""
        self.assertTrue(_compat.FAKE_TENSOR_CONSTRUCTOR_KNOWN)  # torch 2.13 / 2.14
        mode, fakes = tcp.FakeTensorMode(), _synth.FakeTensors()
        fakes.make(mode, torch.empty(2, device="meta"), torch.device("cpu"))
        made = []
        real = _ft.FakeTensor

        class Spy(real):  # type: ignore[valid-type,misc]
            def __new__(cls, *args: Any, **kwargs: Any) -> Any:
                made.append(args)
                return real(*args, **kwargs)

        with mock.patch.object(_synth, "FakeTensor", Spy):
            fakes.make(mode, torch.empty(2, device="meta"), torch.device("cpu"))
            self.assertEqual(len(made), 0)  # control: the known constructor is not called
            with mock.patch.object(_synth, "FAKE_TENSOR_CONSTRUCTOR_KNOWN", False):
                fakes.make(mode, torch.empty(2, device="meta"), torch.device("cpu"))
        self.assertEqual(len(made), 1)

    def test_debug_config_takes_torch_constructor(self) -> None:
        """With FakeTensorConfig.debug, every tensor is torch's (it records a traceback)."""
        mode = tcp.FakeTensorMode()
        fakes = _synth.FakeTensors()
        fakes.make(mode, torch.empty(2, device="meta"), torch.device("cpu"))
        self.assertNotIn("_debug_trace", vars(fakes.make(mode, torch.empty(2, device="meta"), torch.device("cpu"))))
        with mock.patch.object(_ft.FakeTensorConfig, "debug", True):
            t = fakes.make(mode, torch.empty(2, device="meta"), torch.device("cpu"))
        self.assertIn("_debug_trace", vars(t))

    def test_meta_fake_device_takes_torch_constructor(self) -> None:
        """A FakeTensor on the meta device is always torch's own (its attributes are not learned)."""
        mode = tcp.FakeTensorMode()
        fakes = _synth.FakeTensors()
        device = torch.device("meta")
        for _ in range(2):
            t = fakes.make(mode, torch.empty(2, device="meta"), device)
        self.assertIsNone(fakes.bases[device])
        theirs = _ft.FakeTensor(mode, torch.empty(2, device="meta"), device)
        self.assertEqual(fake_tensor_state(t), fake_tensor_state(theirs))


# ------------------------------------------------------------------ plans


class TestSynthHits(testing.CachePolicyTestCase):
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
        self.assertGreater(len(mode._cache.synth), 0)
        mode.cache_clear()
        self.assertEqual(len(mode._cache.synth), 0)

    @unittest.skipIf(not HAS_FAST, NO_FAST)
    def test_plans_bounded(self) -> None:
        """Misses (whose entries torch builds and drops) cannot grow the plan memo without bound."""
        mode = tcp.FakeTensorMode(cache_store=tcp.CacheStore(isolated=True))
        with mock.patch.object(_synth, "_MAX_PLANS", 50), mode:
            for n in range(1, 120):
                aten.relu.default(mode.from_tensor(_t(n)))
        self.assertLessEqual(len(mode._cache.synth), 50)
        self.assertEqual(mode.cache_report()[aten.relu.default].misses, 119)

    @unittest.skipIf(not HAS_FAST, NO_FAST)
    def test_plans_are_made_at_the_first_hit(self) -> None:
        """A miss leaves no plan (its verification reuses what torch's check of the new entry built); the first hit
        of each entry keeps one (Note [One synthesis for hits and their verification])."""
        mode = tcp.FakeTensorMode(cache_store=tcp.CacheStore(isolated=True))
        inputs = [mode.from_tensor(_t(n)) for n in range(1, 31)]
        with mode:
            for x in inputs:
                aten.relu.default(x)
            self.assertEqual((mode.cache_info().misses, len(mode._cache.synth)), (30, 0))
            for _ in range(2):
                for x in inputs:
                    aten.relu.default(x)
        self.assertEqual((mode.cache_info().hits, len(mode._cache.synth)), (60, 30))

    @unittest.skipIf(not HAS_FAST, NO_FAST)
    def test_meta_empty_strided_rejects_bad_input(self) -> None:
        """The C++ helper names itself and the fix for arguments a plan never passes."""
        fn = _synth._meta_empty_strided
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
        fn = _synth._meta_view_of
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

    @unittest.skipIf(HAS_FAST, "the C++ helper is loaded")
    def test_without_extension_no_plans(self) -> None:
        """Without torch_cachepolicy._C every hit goes through torch's synthesis."""
        self.assertIsNone(_synth.output_plan(object()))  # type: ignore[arg-type]
        mode = _ParityMode()
        _miss_then_hit(mode, [_t(2, 3)], aten.relu.default)
        self.assertEqual(len(mode._cache.synth), 0)
        self.assertEqual(mode.cache_report()[aten.relu.default].hits, 1)


# ------------------------------------------------------------------ TORCH_CACHEPOLICY_SELF_CHECK


class _Recording(tcp.FakeTensorMode):
    """Records the entry of every output built, by op."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(cache_store=tcp.CacheStore(isolated=True), **kwargs)
        self.entries: dict[object, object] = {}
        self.fakes: list[torch.Tensor] = []

    def _output_from_cache_entry(self, state: Any, entry: Any, key: Any, *rest: Any) -> Any:
        self.entries[key.key[0]] = entry
        return super()._output_from_cache_entry(state, entry, key, *rest)

    def plan(self, op: object) -> _synth.Plan:
        """The plan the mode's synthesizer holds for ``op``'s entry."""
        entry = self.entries[op]
        held, plan = self._cache.synth.plans[id(entry)]
        assert held is entry and plan is not None
        return plan


@contextlib.contextmanager
def building_differently(
    step: type, applies: Callable[[Any], bool], changes: dict[str, object]
) -> Iterator[list[object]]:
    """Steps of class ``step`` for which ``applies(step)`` build their output with ``changes`` to their fields.

    Yields the list of the outputs those steps built.
    """
    real = step.make  # type: ignore[attr-defined]
    built: list[object] = []

    def make(self: Any, *args: Any) -> object:
        if not applies(self):
            return real(self, *args)
        out = real(dataclasses.replace(self, **changes), *args)
        built.append(out)
        return out

    with mock.patch.object(step, "make", make):
        yield built


def _always(step: object) -> bool:
    return True


_SYMBOLIC = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC, DimDynamic.STATIC])

# (the op, inputs, the call, whether symbolic, the step class, which of its steps, their changed fields, the field the
# check names, what the changed step's output shows)
DISAGREEMENTS: list[Any] = [
    subtest(
        (aten.relu.default, [_t(2, 5)], lambda x: aten.relu.default(x), False, _synth._Fresh, _always,
         {"dtype": torch.float64}, "output 0 dtype", lambda out, inputs: out.dtype == torch.float64),
        name="fresh",
    ),
    subtest(
        (aten.max.dim, [_t(4, 6)], lambda x: aten.max.dim(x, 1), False, _synth._Fresh,
         lambda s: s.dtype == torch.int64, {"stride": (2,)}, "output 1 stride",
         lambda out, inputs: out.stride() == (2,)),
        name="tuple_second",
    ),
    subtest(
        (aten.select.int, [_t(4, 8)], lambda x: aten.select.int(x, 0, 2), False, _synth._ViewOf, _always,
         {"storage_offset": 8}, "output 0 storage_offset", lambda out, inputs: out.storage_offset() == 8),
        name="view",
    ),
    subtest(
        (aten.mul_.Tensor, [_t(4, 8), _t(4, 8)], lambda x, y: aten.mul_.Tensor(x, y), False, _synth._InPlace, _always,
         {"index": 1}, "output 0 identity with inputs", lambda out, inputs: out is inputs[1]),
        name="inplace",
    ),
    subtest(
        (aten.is_same_size.default, [_t(3), _t(3)], lambda x, y: aten.is_same_size.default(x, y), False,
         _synth._Constant, _always, {"value": False}, "output 0 value", lambda out, inputs: out is False),
        name="constant",
    ),
    subtest(
        (aten.relu.default, [_t(4, 3)], lambda x: aten.relu.default(x), True, _synth._SymbolicFresh, _always,
         {"requires_grad": True}, "output 0 requires_grad", lambda out, inputs: out.requires_grad),
        name="symbolic_fresh",
    ),
]  # fmt: skip


@instantiate_parametrized_tests
class TestSelfCheck(testing.CachePolicyTestCase):
    """TORCH_CACHEPOLICY_SELF_CHECK: every plain hit compared with torch's synthesis, raising on a difference."""

    def hits(
        self, inputs: Sequence[torch.Tensor], call: Call, symbolic: bool
    ) -> tuple[_Recording, Callable[[], object]]:
        """A mode with a plan for ``call``'s entry, and a function making one more hit.

        Crosscheck off: the tests build wrong hits on purpose, for the self-check (not the crosscheck) to catch.
        """
        mode = _Recording(shape_env=ShapeEnv() if symbolic else None, cache_crosscheck=False)
        fakes = mode.fakes = [mode.from_tensor(t, symbolic_context=_SYMBOLIC if symbolic else None) for t in inputs]
        with mode:
            for _ in range(3):  # a miss, then hits (a symbolic entry's first one gives the template)
                call(*fakes)

        def hit() -> object:
            with mode:
                return call(*fakes)

        return mode, hit

    @unittest.skipIf(not HAS_FAST, NO_FAST)
    @parametrize("case", DISAGREEMENTS)
    def test_disagreeing_step_raises(self, case: tuple[Any, ...]) -> None:
        """A plan step building other than torch's synthesis raises RuntimeError naming the op and the field."""
        op, inputs, call, symbolic, step, applies, changes, field, shows = case
        mode, hit = self.hits(inputs, call, symbolic)
        self.assertEqual(type(mode.plan(op).steps[-1]), step)
        with building_differently(step, applies, changes) as built:
            hit()
            self.assertEqual(len(built), 1)
            message = (
                f"torch_cachepolicy (TORCH_CACHEPOLICY_SELF_CHECK=1): a cache hit of {op} built without dispatch "
                f"differs from torch's _output_from_cache_entry on torch {torch.__version__} in {field}; please "
                "report this with your torch version"
            )
            with mock.patch.object(_synth, "SELF_CHECK", True):
                with self.assertRaisesRegex(RuntimeError, f"^{re.escape(message)}$"):
                    hit()
        report = mode.cache_report()[op]
        self.assertEqual((report.hits, report.misses), (3, 1))
        # Without the check, the hit is built with the changed step's output.
        self.assertTrue(shows(built[0], mode.fakes))
        # And the check passes the unchanged steps' output.
        with mock.patch.object(_synth, "SELF_CHECK", True):
            hit()
        self.assertEqual(mode.cache_report()[op].hits, 4)

    @unittest.skipIf(not HAS_FAST, NO_FAST)
    @parametrize("case", PLAIN_CASES + VIEW_CASES)
    def test_agreement_does_not_raise(self, case: tuple[Sequence[torch.Tensor], Call]) -> None:
        """With the check on, every plain or view hit is compared with torch's synthesis and returned unchanged."""
        checked: list[str | None] = []
        real = _synth._check_against_torch

        def counting(ours: object, theirs: object, func: object, args: Sequence[object]) -> None:
            checked.append(first_difference(describe(ours, args, {}), describe(theirs, args, {})))
            real(ours, theirs, func, args)

        mode = _ParityMode()
        with mock.patch.object(_synth, "SELF_CHECK", True), mock.patch.object(_synth, "_check_against_torch", counting):
            _miss_then_hit(mode, *case)
        op = mode.built[-1][0]
        self.assertEqual(mode.cache_report()[op].hits, 1)
        # The miss's verification and the hit, each checked and each alike.
        self.assertGreaterEqual(len(checked), 2)
        self.assertEqual(set(checked), {None})
        self.assertEqual({diff for _, _, diff in mode.built}, {None})

    def test_read_from_the_environment(self) -> None:
        """TORCH_CACHEPOLICY_SELF_CHECK=1 at import turns the check on for keys and hits; unset or 0 leaves it off."""
        script = textwrap.dedent(
            """
            import json
            from torch_cachepolicy import _key, _synth
            print(json.dumps([_key.SELF_CHECK_ENV, _key.SELF_CHECK, _synth.SELF_CHECK]))
            """
        )
        env = {k: v for k, v in os.environ.items() if k != _key.SELF_CHECK_ENV}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(testing.REPO_ROOT), env.get("PYTHONPATH", "")) if p)
        self.assertEqual(
            testing.run_json_script(self, script, {**env, _key.SELF_CHECK_ENV: "1"}),
            ["TORCH_CACHEPOLICY_SELF_CHECK", True, True],
        )
        self.assertEqual(
            testing.run_json_script(self, script, {**env, _key.SELF_CHECK_ENV: "0"}),
            ["TORCH_CACHEPOLICY_SELF_CHECK", False, False],
        )


class TestSelfCheckZoo(zoo.ZooTestCase):
    """TORCH_CACHEPOLICY_SELF_CHECK over the kernel zoo."""

    @unittest.skipIf(not HAS_FAST, NO_FAST)
    def test_kernel_zoo_agrees(self) -> None:
        """With the check on, every hit of the kernel zoo's call sequences is built as torch builds it."""
        checked: list[object] = []
        real = _synth._check_against_torch

        def counting(ours: object, theirs: object, func: object, args: Sequence[object]) -> None:
            checked.append(func)
            real(ours, theirs, func, args)

        with mock.patch.object(_synth, "SELF_CHECK", True), mock.patch.object(_synth, "_check_against_torch", counting):
            for case in zoo.CASES:
                if case.limit:
                    continue  # documented limits: their own tests in test_kernel_zoo
                self.run_case(case, crosscheck=False)  # off: the self-check alone is under test
        self.assertGreaterEqual(len(checked), 20)


if __name__ == "__main__":
    run_tests()
