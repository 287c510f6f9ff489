# Owner(s): ["module: fakeTensor"]
"""Parity of torch_cachepolicy._key with torch's ``FakeTensorMode._cache_key``.

The C++ builder (``torch_cachepolicy._key._builder``, a ``_C.KeyBuilder``)
must build, for every call it handles, torch's key (same tuple, element types
included, same hash) and leave the ``_CacheKeyState`` torch's key leaves;
torch must not refuse (bypass) a call it handled. A
``cachepolicy_testing.KeyParityMode`` (a stock mode comparing every key of
``_key.cache_key`` with torch's) runs the benchmark workloads (symbolic
included) and the kernel zoo; the op_db samples are compared in
test_opinfo_crosscheck's sweep. Hand-made calls cover odd layouts and values
and each fallback reason; ``TORCH_CACHEPOLICY_SELF_CHECK`` is tested with a
stand-in builder that disagrees with torch. Without ``_C``
(``TORCH_CACHEPOLICY_FORCE_PYTHON=1``) every key is torch's, and the tests of
the builder skip.
"""

from __future__ import annotations

import contextlib
import os
import textwrap
import unittest
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any
from unittest import mock

import cachepolicy_testing as testing
import torch
import zoo_ops as zoo
from torch._subclasses._fake_tensor_utils import _CacheKeyState
from torch._subclasses.fake_tensor import FakeTensor, _BypassDispatchCache
from torch._subclasses.fake_tensor import FakeTensorMode as StockMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv
from torch.testing._internal.common_utils import (
    TestCase,
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
)

import torch_cachepolicy as tcp
from torch_cachepolicy import _compat, _key
from torch_cachepolicy.report import KeyStats

needs_builder = unittest.skipIf(not testing.HAS_KEY_BUILDER, testing.NO_KEY_BUILDER_REASON)


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def build(mode: Any, func: Any, args: Sequence[object], kwargs: Mapping[str, object], state: Any = None) -> Any:
    """The C++ builder's answer for the call: the key tuple, or why it leaves the call to torch."""
    assert _key._builder is not None
    return _key._builder.build(mode, _key.key_prefix(mode, func), args, kwargs, state)


# ------------------------------------------------------------------ sweeps


def sweep_workload(name: str) -> testing.KeyParity:
    """Two ExportPass-style replays of a benchmark workload in a KeyParityMode."""
    from benchmarks.replay.exportpass import fake_inputs, replay
    from benchmarks.replay.workloads import build_workload

    workload = build_workload(name)
    parity = testing.KeyParity()
    mode = testing.KeyParityMode(
        parity,
        allow_non_fake_inputs=True,
        shape_env=ShapeEnv() if workload.dynamic_batch else None,
    )
    with quiet():
        replay(workload.graph, mode, fake_inputs(mode, workload), 2)
    return parity


def sweep_zoo() -> testing.KeyParity:
    """Every kernel-zoo case's call sequence in a KeyParityMode (stock caching, so zoo ops bypass)."""
    parity = testing.KeyParity()
    for case in zoo.CASES:
        if case.limit:
            # A case at a torch limit (a bug in torch's dispatcher) leaves the
            # dispatcher in a state its own test then no longer reproduces.
            continue
        if case.reset is not None:
            case.reset()
        try:
            mode = testing.KeyParityMode(parity, shape_env=ShapeEnv() if case.symbolic else None)
            env = zoo.Env.make(mode, case.symbolic)
            call = None
            with mode, quiet():
                for i, step in enumerate(case.steps):
                    action = case.actions.get(i)
                    if action is not None:
                        action()
                    if step == "F" or call is None:
                        call = case.build(env, i)
                    with contextlib.suppress(Exception):
                        case.callee(*call.args, **call.kwargs)
        finally:
            if case.reset is not None:
                case.reset()
    return parity


# ------------------------------------------------------------------- tests


@needs_builder
class TestKeyBuilderSweeps(TestCase):
    """The keys of the benchmark workloads and the kernel zoo."""

    def assertParity(self, parity: testing.KeyParity, min_share: float) -> None:
        self.assertEqual(parity.differences[:20], [], msg=f"{len(parity.differences)} differences")
        self.assertGreater(parity.keys, 0)
        self.assertGreaterEqual(parity.built / parity.keys, min_share, msg=str(parity.figures()))

    @parametrize("name", ["qdq", "dialect", "aten-only", "symbolic"])
    def test_workload_keys(self, name: str) -> None:
        """Every key of two replays of the workload equals torch's, and all of them are built."""
        parity = sweep_workload(name)
        if name == "symbolic" and not _compat.SYMBOLIC_KEYS:
            # A torch whose extract_tensor_metadata is not a known one: torch builds symbolic keys.
            self.assertParity(parity, 0.0)
            self.assertGreater(parity.fallbacks["symbolic sizes"], 0)
        else:
            self.assertParity(parity, 1.0)

    def test_zoo_keys(self) -> None:
        """Every key of the kernel zoo's calls equals torch's, and at least half of them are built."""
        self.assertParity(sweep_zoo(), 0.5)


instantiate_parametrized_tests(TestKeyBuilderSweeps)


def _cases() -> dict[str, Any]:
    """Name -> ``build(mode) -> (func, args, kwargs)`` of calls with unusual tensors and values."""
    aten = torch.ops.aten

    def t(*shape: int, **kw: Any) -> torch.Tensor:
        return torch.empty(*shape, **kw)

    return {
        "contiguous": lambda m: (aten.relu.default, (t(2, 3, 4, 5),), {}),
        "channels_last": lambda m: (aten.relu.default, (t(2, 3, 4, 5).to(memory_format=torch.channels_last),), {}),
        "channels_last_3d": lambda m: (
            aten.relu.default,
            (t(2, 3, 4, 5, 6).to(memory_format=torch.channels_last_3d),),
            {},
        ),
        "size_one_channels": lambda m: (aten.relu.default, (t(2, 1, 4, 4).to(memory_format=torch.channels_last),), {}),
        "zero_size": lambda m: (aten.relu.default, (t(2, 0, 4, 4),), {}),
        "expanded": lambda m: (aten.relu.default, (t(1, 3, 1, 1).expand(2, 3, 4, 4),), {}),
        "transposed": lambda m: (aten.relu.default, (t(2, 3, 4, 5).permute(0, 3, 1, 2),), {}),
        "offset_view": lambda m: (aten.relu.default, (t(4, 5)[1:, 2:],), {}),
        "scalar": lambda m: (aten.relu.default, (t(()),), {}),
        "conj": lambda m: (aten.abs.default, (t(3, dtype=torch.complex64).conj(),), {}),
        "neg": lambda m: (aten.abs.default, (t(3, dtype=torch.complex64).conj().imag,), {}),
        "requires_grad": lambda m: (aten.relu.default, (t(3, requires_grad=True),), {}),
        "inference": lambda m: (aten.relu.default, (_inference(t(3)),), {}),
        "scalars": lambda m: (
            aten.clamp.default,
            (t(3),),
            {"min": -0.0, "max": float("nan")},
        ),
        "int_bool_float": lambda m: (aten.add.Tensor, (t(3), True), {"alpha": 1}),
        "lists_and_dtype": lambda m: (
            aten.sum.dim_IntList,
            (t(2, 3), [0, 1]),
            {"keepdim": False, "dtype": torch.float64},
        ),
        "tensor_list": lambda m: (aten.cat.default, ([t(2, 3), t(2, 3)], 0), {}),
        "torch_size": lambda m: (aten.view.default, (t(2, 3), torch.Size([6])), {}),
        "none_and_layout": lambda m: (
            aten.empty.memory_format,
            ([2, 3],),
            {"dtype": None, "layout": torch.strided, "device": torch.device("cpu"), "memory_format": None},
        ),
        "long_list": lambda m: (aten.view.default, (t(*([1] * 70)), [1] * 70), {}),
        "empty_args": lambda m: (aten.empty.memory_format, ([3],), {}),
    }


def _inference(x: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return torch.empty_like(x)


CASES = _cases()


def _symbolic_case(name: str) -> tuple[Any, Any, tuple[Any, ...], dict[str, Any]]:
    """A fresh mode with its own ShapeEnv and the call ``name`` of :data:`SYMBOLIC_CASES` on it."""
    from torch.fx.experimental.symbolic_shapes import DimDynamic, StatelessSymbolicContext

    mode = StockMode(shape_env=ShapeEnv())
    x = mode.from_tensor(torch.empty(4, 3), symbolic_context=_dynamic(2))
    both = mode.from_tensor(torch.empty(5, 6), symbolic_context=_dynamic(2, dims=2))
    strided = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC] * 4, dynamic_strides=[DimDynamic.DYNAMIC] * 4)
    nhwc = mode.from_tensor(torch.empty(2, 3, 4, 5).to(memory_format=torch.channels_last), symbolic_context=strided)
    nchw = mode.from_tensor(torch.empty(2, 3, 4, 5), symbolic_context=_dynamic(4, dims=4))
    func, args, kwargs = SYMBOLIC_CASES[name](mode, x, both, nhwc, nchw)
    return mode, func, args, kwargs


def _symbolic_calls() -> dict[str, Any]:
    """Name -> ``call(mode, x, both, nhwc, nchw) -> (func, args, kwargs)`` with symbolic values."""
    aten = torch.ops.aten

    def offset(mode: Any, t: Any) -> Any:
        with mode:
            return t[1:]  # storage offset s1: symbolic

    return {
        "sizes": lambda m, x, b, h, c: (aten.relu.default, (x,), {}),
        "symint_arguments_backref": lambda m, x, b, h, c: (aten.view.default, (x, [x.shape[0], 3]), {}),
        "same_tensor_twice": lambda m, x, b, h, c: (aten.add.Tensor, (x, x), {}),
        "two_symbols": lambda m, x, b, h, c: (aten.mm.default, (b, b.t()), {}),
        "symbolic_offset": lambda m, x, b, h, c: (aten.relu.default, (offset(m, b),), {}),
        "kwargs_symint": lambda m, x, b, h, c: (aten.empty.memory_format, ([x.shape[0], 2],), {"dtype": torch.float16}),
        "4d_contiguous": lambda m, x, b, h, c: (aten.relu.default, (c,), {}),
        # On torch 2.13 extract_tensor_metadata guards on these strides.
        "4d_channels_last_symbolic_strides": lambda m, x, b, h, c: (aten.relu.default, (h,), {}),
        "list_of_symbolic_tensors": lambda m, x, b, h, c: (aten.cat.default, ([x, x, b[:, :3]], 0), {}),
    }


SYMBOLIC_CASES = _symbolic_calls()


class TestKeyBuilder(TestCase):
    """Hand-made calls: odd layouts and values, each fallback reason, the mode's use of the builder."""

    def assertSameKey(self, mode: Any, func: Any, args: Sequence[object], kwargs: Mapping[str, object]) -> None:
        """The builder handles the call, with torch's key, and cache_key returns it."""
        expected = mode._cache_key(_CacheKeyState(mode.shape_env), func, args, kwargs)
        built = build(mode, func, args, kwargs)
        self.assertIsInstance(built, tuple, msg=built)
        self.assertIsNone(testing.key_difference(built, expected.key))
        stats = KeyStats()
        key = _key.cache_key(mode, _CacheKeyState(mode.shape_env), func, args, kwargs, stats)
        self.assertEqual((key, hash(key), stats.built, stats.fallbacks), (expected, hash(expected), 1, {}))

    def assertFallback(
        self, reason: str, mode: Any, func: Any, args: Sequence[object], kwargs: Mapping[str, object]
    ) -> None:
        """The builder falls back for ``reason``, and cache_key answers as torch's _cache_key."""
        self.assertEqual(build(mode, func, args, kwargs), reason)
        stats = KeyStats()
        try:
            expected: object = mode._cache_key(_CacheKeyState(mode.shape_env), func, args, kwargs)
        except _BypassDispatchCache as e:
            with self.assertRaisesRegex(_BypassDispatchCache, ""):
                _key.cache_key(mode, _CacheKeyState(mode.shape_env), func, args, kwargs, stats)
            expected = e.reason
        else:
            got = _key.cache_key(mode, _CacheKeyState(mode.shape_env), func, args, kwargs, stats)
            self.assertEqual(got, expected)
        self.assertEqual((stats.built, stats.fallbacks), (0, {reason: 1}))

    @needs_builder
    @parametrize("case", list(CASES))
    def test_same_key(self, case: str) -> None:
        """The builder's key of an unusual but handled call equals torch's."""
        mode = StockMode()
        with mode:
            func, args, kwargs = CASES[case](mode)
        self.assertSameKey(mode, func, args, kwargs)

    def test_distinct_values_distinct_keys(self) -> None:
        """1, 1.0 and True (equal in Python) give three keys, as in torch."""
        mode = StockMode()
        with mode:
            x = torch.empty(3)
        keys = {
            _key.cache_key(mode, _CacheKeyState(), torch.ops.aten.add.Tensor, (x, v), {}, KeyStats())
            for v in (1, 1.0, True)
        }
        self.assertEqual(len(keys), 3)

    @needs_builder
    def test_without_a_state_symbolic_values_fall_back(self) -> None:
        """Without a state to record them in, symbolic sizes and SymInt arguments are not built."""
        mode = StockMode(shape_env=ShapeEnv())
        x = mode.from_tensor(torch.empty(4, 3), symbolic_context=_dynamic(2))
        y = mode.from_tensor(torch.empty(4, 3), symbolic_context=_dynamic(2, dims=0))
        for func, args, reason in [
            (torch.ops.aten.relu.default, (x,), "symbolic sizes"),
            (torch.ops.aten.view.default, (y, [x.shape[0], 3]), "symbolic argument"),
        ]:
            self.assertEqual(build(mode, func, args, {}), reason, msg=str(func))

    @needs_builder
    @unittest.skipIf(not _compat.SYMBOLIC_KEYS, "this torch's extract_tensor_metadata is not a known one")
    @parametrize("case", list(SYMBOLIC_CASES))
    def test_symbolic_same_key_state_and_guards(self, case: str) -> None:
        """A symbolic key equals torch's, leaves torch's state, and adds the guards torch's key adds."""
        # Two identical ShapeEnvs: one sees torch's key only, the other the
        # builder's key first (its guards, if any), then torch's.
        mode, func, args, kwargs = _symbolic_case(case)
        mode._cache_key(_CacheKeyState(mode.shape_env), func, args, kwargs)
        expected_guards = [str(g.expr) for g in mode.shape_env.guards]
        if case == "4d_channels_last_symbolic_strides":
            # torch 2.13's key guards here, 2.14's does not: the case means something on both.
            self.assertEqual(bool(expected_guards), _compat.SYMBOLIC_MEMORY_FORMAT_GUARDS)
        mode, func, args, kwargs = _symbolic_case(case)
        ours = _CacheKeyState(mode.shape_env)
        built = build(mode, func, args, kwargs, ours)
        self.assertIsInstance(built, tuple, msg=built)
        self.assertEqual([str(g.expr) for g in mode.shape_env.guards], expected_guards)
        theirs = _CacheKeyState(mode.shape_env)
        expected = mode._cache_key(theirs, func, args, kwargs)
        self.assertIsNone(testing.key_difference(built, expected.key))
        self.assertIsNone(testing.key_state_difference(ours, theirs))
        self.assertTrue(ours.sym_node_lookup)
        # The mode's entry point: built, not left to torch.
        mode, func, args, kwargs = _symbolic_case(case)
        stats = KeyStats()
        state = _CacheKeyState(mode.shape_env)
        key = _key.cache_key(mode, state, func, args, kwargs, stats)
        theirs = _CacheKeyState(mode.shape_env)
        self.assertEqual(key, mode._cache_key(theirs, func, args, kwargs))
        self.assertEqual((stats.built, stats.fallbacks, testing.key_state_difference(state, theirs)), (1, {}, None))

    @needs_builder
    @unittest.skipIf(not _compat.SYMBOLIC_MEMORY_FORMAT_GUARDS, "this torch's key adds no memory-format guard")
    def test_symbolic_state_records_symbols_when_reached(self) -> None:
        """A symbol that a later tensor's memory-format guard replaces is recorded as torch records it: when reached."""
        from torch.fx.experimental.symbolic_shapes import DimDynamic, StatelessSymbolicContext

        def case() -> tuple[Any, Any, tuple[Any, ...]]:
            mode = StockMode(shape_env=ShapeEnv(specialize_zero_one=False))
            dynamic = [DimDynamic.DYNAMIC] * 4
            context = StatelessSymbolicContext(dynamic_sizes=dynamic, dynamic_strides=dynamic)
            t = mode.from_tensor(torch.empty(2, 1, 1, 1), symbolic_context=context)
            return mode, torch.ops.aten.add.Tensor, (t.stride()[1], t)

        mode, func, args = case()
        theirs = _CacheKeyState(mode.shape_env)
        mode._cache_key(theirs, func, args, {})
        self.assertTrue(mode.shape_env.replacements)  # the case replaces the first argument's symbol
        mode, func, args = case()
        ours = _CacheKeyState(mode.shape_env)
        self.assertIsInstance(build(mode, func, args, {}, ours), tuple)
        self.assertEqual(sorted(map(str, ours.known_symbols)), sorted(map(str, theirs.known_symbols)))

    @needs_builder
    @unittest.skipIf(not _compat.SYMBOLIC_KEYS, "this torch's extract_tensor_metadata is not a known one")
    def test_symbolic_fallbacks(self) -> None:
        """SymBool and SymFloat arguments, and a state that has seen symbols, are left to torch."""
        mode = StockMode(shape_env=ShapeEnv())
        x = mode.from_tensor(torch.empty(4, 3), symbolic_context=_dynamic(2))
        add = torch.ops.aten.add.Tensor
        for value in (x.shape[0] > 2, x.shape[0] * 0.5):
            state = _CacheKeyState(mode.shape_env)
            self.assertEqual(build(mode, add, (x, value), {}, state), "symbolic argument")
            self.assertEqual(
                (state.sym_node_lookup, state.known_symbols), ({}, set()), msg="a fall back leaves the state fresh"
            )
        stats = KeyStats()
        seen = _CacheKeyState(mode.shape_env)
        seen.known_symbols.update(x.shape[0].node.expr.free_symbols)
        expected = mode._cache_key(_CacheKeyState(mode.shape_env), add, (x, 1), {})
        got = _key.cache_key(mode, seen, add, (x, 1), {}, stats)
        self.assertNotEqual(got, expected)  # torch's key for such a state holds the epoch
        self.assertEqual(stats.fallbacks, {"state with symbols": 1})

    @needs_builder
    def test_fallback_tensors(self) -> None:
        """Non-fake tensors, another mode's fakes, constants and sparse tensors are left to torch."""
        mode, other = StockMode(), StockMode()
        relu = torch.ops.aten.relu.default
        self.assertFallback("non-fake tensor argument", mode, relu, (torch.empty(3),), {})
        self.assertFallback("fake tensor of another mode", mode, relu, (other.from_tensor(torch.empty(3)),), {})
        const = FakeTensor(mode, torch.empty(3, device="meta"), torch.device("cpu"), constant=torch.zeros(3))
        self.assertFallback("fake tensor with a constant", mode, relu, (const,), {})
        sparse = mode.from_tensor(torch.eye(3).to_sparse())
        self.assertFallback("layout other than strided", mode, torch.ops.aten.neg.default, (sparse,), {})

    @needs_builder
    def test_fallback_subclasses_and_types(self) -> None:
        """FakeTensor subclasses, unusual argument types and containers are left to torch."""

        class SubFake(FakeTensor):
            pass

        class SneakyList(list):  # type: ignore[type-arg]
            def __iter__(self) -> Iterator[Any]:
                return iter(reversed(list(super().__iter__())))

        class MyDict(dict):  # type: ignore[type-arg]
            pass

        mode = StockMode()
        with mode:
            x = torch.empty(2, 3)
        sub = SubFake(mode, torch.empty(3, device="meta"), torch.device("cpu"))
        self.assertFallback("FakeTensor subclass argument", mode, torch.ops.aten.relu.default, (sub,), {})
        view = torch.ops.aten.view.default
        self.assertFallback("argument of another type", mode, view, (x, range(6)), {})
        self.assertFallback("container subclass argument", mode, view, (x, SneakyList([6])), {})
        self.assertFallback("dict subclass argument", mode, view, (x, [6]), MyDict(size=[6]))

    @needs_builder
    def test_fallback_in_kernel_invocation(self) -> None:
        """While the mode runs a kernel FakeTensor.device is meta: left to torch."""
        mode = StockMode()
        with mode:
            x = torch.empty(3)
        mode.in_kernel_invocation = True
        try:
            self.assertFallback("in kernel invocation", mode, torch.ops.aten.relu.default, (x,), {})
        finally:
            mode.in_kernel_invocation = False

    def test_without_builder_every_key_is_torchs(self) -> None:
        """Without the C++ builder cache_key returns torch's key and counts it as "no C++ key builder"."""
        mode = StockMode()
        with mode:
            x = torch.empty(2, 3, 4, 5).to(memory_format=torch.channels_last)
        relu = torch.ops.aten.relu.default
        stats = KeyStats()
        with mock.patch.object(_key, "_builder", None):
            key = _key.cache_key(mode, _CacheKeyState(), relu, (x,), {}, stats)
            with self.assertRaisesRegex(_BypassDispatchCache, ""):
                _key.cache_key(mode, _CacheKeyState(), relu, (torch.empty(3),), {}, stats)  # torch's bypass
        self.assertEqual(key, mode._cache_key(_CacheKeyState(), relu, (x,), {}))
        self.assertEqual((stats.built, stats.fallbacks), (0, {_key.NO_BUILDER: 2}))
        self.assertEqual(_key.NO_BUILDER, "no C++ key builder")

    def test_mode_counts_built_keys(self) -> None:
        """The policy mode builds its keys with the builder (or counts each as torch's without it), by reason."""
        policy = tcp.CachePolicy(namespaces=["quantized_decomposed"])
        mode = tcp.FakeTensorMode(cache_policy=policy, shape_env=ShapeEnv())
        x = mode.from_tensor(torch.empty(2, 4), symbolic_context=_dynamic(2, dims=0))
        s = mode.from_tensor(torch.empty(4, 3), symbolic_context=_dynamic(2))
        with mode:
            for _ in range(2):
                torch.ops.quantized_decomposed.quantize_per_tensor(x, 0.1, 0, -128, 127, torch.int8)
                torch.relu(x)
        stats = mode.cache_key_stats()
        if testing.HAS_KEY_BUILDER:
            self.assertEqual((stats.built, stats.fallbacks, stats.handled_share), (4, {}, 1.0))
        else:
            self.assertEqual((stats.built, stats.fallbacks, stats.handled_share), (0, {_key.NO_BUILDER: 4}, 0.0))
        # relu's second call hits; quantize_per_tensor's first sight and miss make its entry (a backend key)
        self.assertEqual((mode.cache_info().hits, mode.cache_info().misses), (1, 3))
        with mode:
            torch.relu(s)  # a miss
            torch.ops.aten.mul.Scalar(s, s.shape[0] * 0.5)  # a SymFloat argument: torch's key
        stats = mode.cache_key_stats()
        if testing.HAS_KEY_BUILDER:
            self.assertGreaterEqual(stats.built, 5)
            expected = {"symbolic argument"} if _compat.SYMBOLIC_KEYS else {"symbolic sizes", "symbolic argument"}
            self.assertEqual(set(stats.fallbacks), expected)
        else:
            self.assertEqual((stats.built, set(stats.fallbacks)), (0, {_key.NO_BUILDER}))
        self.assertEqual(stats.handled_share, stats.built / (stats.built + sum(stats.fallbacks.values())))
        mode.cache_clear()
        self.assertEqual(repr(mode.cache_key_stats()), "KeyStats(built=0, fallbacks={})")


class _StandInBuilder:
    """Stands in for ``_C.KeyBuilder``: builds torch's key of each call, or with ``wrong`` a key torch would not."""

    def __init__(self, wrong: bool = False, keep_state: bool = True) -> None:
        self.wrong = wrong
        self.keep_state = keep_state
        self.calls = 0

    def build(self, mode: Any, prefix: tuple[object, ...], args: Any, kwargs: Any, state: Any) -> tuple[object, ...]:
        self.calls += 1
        # torch's key, recorded in the call's state as torch records it, unless keep_state is off.
        own = state if self.keep_state and state is not None else _CacheKeyState(mode.shape_env)
        key = mode._cache_key(own, prefix[0], args, kwargs).key
        return (*key, "not in torch's key") if self.wrong else key


class TestSelfCheck(TestCase):
    """TORCH_CACHEPOLICY_SELF_CHECK: every built key is compared with torch's, and a difference raises."""

    def setUp(self) -> None:
        super().setUp()
        patch = mock.patch.object(_key, "SELF_CHECK", True)
        patch.start()
        self.addCleanup(patch.stop)

    def test_differing_key_raises_naming_the_op(self) -> None:
        """A built key that differs from torch's raises RuntimeError naming the op, in cache_key and in a dispatch."""
        mode = StockMode()
        with mode:
            x = torch.empty(3)
        relu = torch.ops.aten.relu.default
        stand_in = _StandInBuilder(wrong=True)
        msg = r"TORCH_CACHEPOLICY_SELF_CHECK=1\): the key built for aten\.relu\.default differs from FakeTensorMode\._cache_key's"
        with mock.patch.object(_key, "_builder", stand_in):
            with self.assertRaisesRegex(RuntimeError, msg):
                _key.cache_key(mode, _CacheKeyState(), relu, (x,), {}, KeyStats())
            ours = tcp.FakeTensorMode(cache_store=tcp.CacheStore(isolated=True))
            y = ours.from_tensor(torch.empty(3))
            with self.assertRaisesRegex(RuntimeError, msg), ours:
                torch.ops.aten.relu.default(y)
        self.assertEqual(stand_in.calls, 2)
        with mock.patch.object(_key, "_builder", stand_in), mock.patch.object(_key, "SELF_CHECK", False):
            # Control: without the check nothing compares the wrong key.
            key = _key.cache_key(mode, _CacheKeyState(), relu, (x,), {}, KeyStats())
        self.assertNotEqual(key, mode._cache_key(_CacheKeyState(), relu, (x,), {}))

    @unittest.skipIf(not _compat.SYMBOLIC_KEYS, "this torch's extract_tensor_metadata is not a known one")
    def test_differing_state_raises(self) -> None:
        """A built key equal to torch's that leaves the call's state unlike torch's raises."""
        mode, func, args, kwargs = _symbolic_case("sizes")
        with mock.patch.object(_key, "_builder", _StandInBuilder(keep_state=False)):
            with self.assertRaisesRegex(RuntimeError, r"the key built for aten\.relu\.default differs"):
                _key.cache_key(mode, _CacheKeyState(mode.shape_env), func, args, kwargs, KeyStats())

    def test_agreeing_stand_in_does_not_raise(self) -> None:
        """A builder that builds torch's keys passes the check: through cache_key and a mode's dispatches."""
        stand_in = _StandInBuilder()
        mode, func, args, kwargs = _symbolic_case("symint_arguments_backref")
        stats = KeyStats()
        with mock.patch.object(_key, "_builder", stand_in):
            state = _CacheKeyState(mode.shape_env)
            key = _key.cache_key(mode, state, func, args, kwargs, stats)
            ours = tcp.FakeTensorMode(cache_store=tcp.CacheStore(isolated=True))
            with ours:
                x = torch.empty(2, 3)
                for _ in range(2):
                    torch.relu(x)
        self.assertEqual(key, mode._cache_key(_CacheKeyState(mode.shape_env), func, args, kwargs))
        self.assertEqual((stats.built, stats.fallbacks), (1, {}))
        self.assertEqual(ours.cache_info().hits, 1)
        self.assertEqual(ours.cache_key_stats().fallbacks, {})
        self.assertGreaterEqual(stand_in.calls, 3)

    @needs_builder
    def test_real_builder_passes_the_check(self) -> None:
        """The C++ builder's keys of the hand-made and symbolic calls pass the check."""
        for name, make in CASES.items():
            mode = StockMode()
            with mode:
                func, args, kwargs = make(mode)
            stats = KeyStats()
            _key.cache_key(mode, _CacheKeyState(), func, args, kwargs, stats)
            self.assertEqual(stats.built, 1, msg=name)
        if _compat.SYMBOLIC_KEYS:
            for name in SYMBOLIC_CASES:
                mode, func, args, kwargs = _symbolic_case(name)
                stats = KeyStats()
                _key.cache_key(mode, _CacheKeyState(mode.shape_env), func, args, kwargs, stats)
                self.assertEqual(stats.built, 1, msg=name)


_ENV_SCRIPT = textwrap.dedent(
    """
    import json, torch
    from unittest import mock
    from torch._subclasses._fake_tensor_utils import _CacheKeyState
    import torch_cachepolicy as tcp
    from torch_cachepolicy import _key
    from torch_cachepolicy.report import KeyStats
    out = {"builder": _key._builder is not None, "self_check": _key.SELF_CHECK}
    mode = tcp.FakeTensorMode()
    with mode:
        x = torch.empty(2, 3, 4, 5).to(memory_format=torch.channels_last)
        torch.relu(x)
        torch.relu(x)
    func = torch.ops.aten.relu.default
    key = _key.cache_key(mode, _CacheKeyState(), func, (x,), {}, KeyStats())
    stats = mode.cache_key_stats()
    out.update(same=key == mode._cache_key(_CacheKeyState(), func, (x,), {}), built=stats.built,
               fallbacks=stats.fallbacks, hits=mode.cache_info().hits)

    class Wrong:
        def build(self, mode, prefix, args, kwargs, state):
            return (*mode._cache_key(_CacheKeyState(), prefix[0], args, kwargs).key, "not torch's")

    with mock.patch.object(_key, "_builder", Wrong()):
        try:
            with mode:
                torch.neg(x)
        except RuntimeError as e:
            out["error"] = str(e)
    print(json.dumps(out))
    """
)


class TestEnvironment(TestCase):
    """One interpreter started with TORCH_CACHEPOLICY_FORCE_PYTHON=1 and TORCH_CACHEPOLICY_SELF_CHECK=1."""

    _result: Any = None

    def result(self) -> Any:
        """The script's answers, run once for the class."""
        if TestEnvironment._result is None:
            env = {**os.environ, "TORCH_CACHEPOLICY_FORCE_PYTHON": "1", _key.SELF_CHECK_ENV: "1"}
            TestEnvironment._result = testing.run_json_script(self, _ENV_SCRIPT, env, "-W", "ignore")
        return TestEnvironment._result

    def test_force_python_keys_are_torchs(self) -> None:
        """With TORCH_CACHEPOLICY_FORCE_PYTHON=1 there is no builder: every key is torch's, and hits are the same."""
        result = self.result()
        self.assertEqual((result["builder"], result["same"], result["hits"], result["built"]), (False, True, 1, 0))
        self.assertEqual(list(result["fallbacks"]), ["no C++ key builder"])
        self.assertGreaterEqual(result["fallbacks"]["no C++ key builder"], 2)  # the relu calls, and the ops making x

    def test_self_check_env_var(self) -> None:
        """TORCH_CACHEPOLICY_SELF_CHECK=1 at import turns the check on: a builder differing from torch raises."""
        result = self.result()
        self.assertTrue(result["self_check"])
        self.assertRegex(
            result.get("error", ""),
            r"^torch_cachepolicy \(TORCH_CACHEPOLICY_SELF_CHECK=1\): the key built for aten\.neg\.default differs",
        )


def _dynamic(ndim: int, dims: int = 1) -> Any:
    """A symbolic context whose first ``dims`` dimensions are dynamic."""
    from torch.fx.experimental.symbolic_shapes import DimDynamic, StatelessSymbolicContext

    return StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC] * dims + [DimDynamic.STATIC] * (ndim - dims))


instantiate_parametrized_tests(TestKeyBuilder)


if __name__ == "__main__":
    run_tests()
