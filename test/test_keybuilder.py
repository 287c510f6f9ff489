# Owner(s): ["module: fakeTensor"]
"""Parity of torch_cachepolicy.keybuilder with torch's ``FakeTensorMode._cache_key``.

A :class:`ParityMode` is a stock ``FakeTensorMode`` whose ``_cache_key`` runs
the key builders (the C++ ``_C.KeyBuilder`` when it is loaded, and always the
Python ``build_python``) before torch's own and compares: every key a builder
produces must equal torch's (same tuple, element types included, same hash),
torch must not refuse (bypass) a call a builder handled, and the two builders
must agree on what they handle and why they fall back. The calls come from
op_db samples (the crosscheck sweep's inputs), the benchmark workloads
(symbolic included) and the kernel zoo; each sweep reports its handled share.
With ``TORCH_CACHEPOLICY_FORCE_PYTHON=1`` only the Python builder is checked.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import json
import os
import textwrap
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import cachepolicy_testing as testing
import test_opinfo_crosscheck
import torch
import torch.utils._pytree as pytree
import zoo_ops as zoo
from torch._subclasses._fake_tensor_utils import _CacheKeyState
from torch._subclasses.fake_tensor import FakeTensor, _BypassDispatchCache, _DispatchCacheKey
from torch._subclasses.fake_tensor import FakeTensorMode as StockMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv
from torch.testing._internal.common_device_type import OpDTypes, instantiate_device_type_tests, ops
from torch.testing._internal.common_methods_invocations import op_db
from torch.testing._internal.common_utils import (
    TestCase,
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
)
from torch.testing._internal.opinfo.core import OpInfo

import torch_cachepolicy as tcp
from torch_cachepolicy import keybuilder

HANDLED = "handled"


@dataclass
class Parity:
    """What a :class:`ParityMode` saw: keys compared, fallbacks by reason, differences."""

    handled: int = 0
    fallbacks: collections.Counter[str] = field(default_factory=collections.Counter)
    differences: list[str] = field(default_factory=list)

    @property
    def keys(self) -> int:
        return self.handled + sum(self.fallbacks.values())

    def add(self, other: Parity) -> None:
        self.handled += other.handled
        self.fallbacks.update(other.fallbacks)
        self.differences += other.differences

    def figures(self) -> dict[str, Any]:
        return {
            "keys": self.keys,
            "handled": self.handled,
            "handled_share": round(self.handled / self.keys, 4) if self.keys else None,
            "fallbacks": dict(self.fallbacks.most_common()),
            "differences": len(self.differences),
        }


def builders() -> list[tuple[str, Any]]:
    """The builders this process can check: Python always, C++ when loaded."""
    out: list[tuple[str, Any]] = [("python", keybuilder.build_python)]
    if keybuilder._cpp is not None:
        out.append(("cpp", keybuilder._cpp.build))
    return out


def first_difference(built: tuple[object, ...], expected: tuple[object, ...]) -> str | None:
    """Where two key tuples differ (length, a value, or a value's type), or None."""
    if len(built) != len(expected):
        return f"length {len(built)} != {len(expected)}"
    for i, (b, e) in enumerate(zip(built, expected, strict=True)):
        # `is` first, as tuple equality does: a NaN argument is the same object in both.
        if b is not e and (type(b) is not type(e) or b != e):
            return f"[{i}]: {b!r} ({type(b).__name__}) != {e!r} ({type(e).__name__})"
    if hash(_DispatchCacheKey(built)) != hash(_DispatchCacheKey(expected)):
        return "hash"
    return None


def state_difference(built: _CacheKeyState | None, expected: _CacheKeyState) -> str | None:
    """How the state a builder left differs from the one torch's _cache_key left, or None."""
    if built is None:
        return None if not expected.sym_node_lookup else "a builder without a state handled symbols"
    for name in ("sym_node_lookup", "known_symbols"):
        if getattr(built, name) != getattr(expected, name):
            return f"state.{name}: {getattr(built, name)} != {getattr(expected, name)}"
    if built.shape_env is not expected.shape_env:
        return "state.shape_env"
    return None


class ParityMode(StockMode):
    """A stock mode that checks every cache key against the key builders."""

    def __init__(self, parity: Parity, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.parity = parity

    def _cache_key(
        self,
        state: _CacheKeyState,
        func: Any,
        args: Sequence[object],
        kwargs: Mapping[str, object],
    ) -> _DispatchCacheKey:
        fresh = not state.known_symbols and not state.sym_node_lookup
        prefix = keybuilder.key_prefix(self, func)
        # Each builder gets a fresh state of its own, compared with the one
        # torch's key leaves. Before torch's key: a builder's guards, if any,
        # must come first to be seen (Note [Symbolic keys]).
        states = {name: _CacheKeyState(self.shape_env) if keybuilder.SYMBOLIC_KEYS else None for name, _ in builders()}
        results = {name: build(self, prefix, args, kwargs, states[name]) for name, build in builders()} if fresh else {}
        outcomes = {r if isinstance(r, str) else HANDLED for r in results.values()}
        parity = self.parity
        if len(outcomes) > 1:
            parity.differences.append(f"{func}: the builders disagree: {results}")
        try:
            expected = super()._cache_key(state, func, args, kwargs)
        except _BypassDispatchCache as e:
            for name, r in results.items():
                if not isinstance(r, str):
                    parity.differences.append(f"{func}: {name} built a key, torch bypassed ({e.reason})")
            parity.fallbacks[outcomes.pop() if len(outcomes) == 1 else "state with symbols"] += 1
            raise
        for name, r in results.items():
            if not isinstance(r, str):
                diff = first_difference(r, expected.key) or state_difference(states[name], state)
                if diff is not None:
                    parity.differences.append(f"{func}: {name} key differs at {diff}")
        outcome = outcomes.pop() if len(outcomes) == 1 else "state with symbols"
        if outcome == HANDLED:
            parity.handled += 1
        else:
            parity.fallbacks[outcome] += 1
        return expected


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


# ------------------------------------------------------------------ sweeps


def sweep_op(opinfo: OpInfo, device: str) -> Parity:
    """The crosscheck sweep's samples of ``opinfo``, each called once in a ParityMode."""
    parity = Parity()
    with quiet():
        for dtype in test_opinfo_crosscheck.dtypes_for(opinfo):
            try:
                samples = list(
                    itertools.islice(
                        opinfo.sample_inputs(device, dtype, requires_grad=False),
                        test_opinfo_crosscheck.SAMPLES_PER_OP,
                    )
                )
            except Exception:
                continue
            for sample in samples:
                mode = ParityMode(parity)

                def convert(x: object, mode: ParityMode = mode) -> object:
                    return mode.from_tensor(x) if isinstance(x, torch.Tensor) else x

                try:
                    inp, args, kwargs = pytree.tree_map(convert, (sample.input, sample.args, sample.kwargs))
                    with mode:
                        opinfo.op(inp, *args, **kwargs)
                except Exception:
                    # Fake dispatch of this sample raises (stock's problem, not the key's);
                    # the keys computed before it were still compared.
                    continue
    return parity


SWEEP = Parity()
SWEEP_STARTED: set[str] = set()


def sweep_workload(name: str) -> Parity:
    """Two ExportPass-style replays of a benchmark workload in a ParityMode."""
    from benchmarks.replay.exportpass import fake_inputs, replay
    from benchmarks.replay.workloads import build_workload

    workload = build_workload(name)
    parity = Parity()
    mode = ParityMode(
        parity,
        allow_non_fake_inputs=True,
        shape_env=ShapeEnv() if workload.dynamic_batch else None,
    )
    with quiet():
        replay(workload.graph, mode, fake_inputs(mode, workload), 2)
    return parity


def sweep_zoo() -> Parity:
    """Every kernel-zoo case's call sequence in a ParityMode (stock caching, so zoo ops bypass)."""
    parity = Parity()
    for case in zoo.CASES:
        if case.limit:
            # A case at a torch limit (a bug in torch's dispatcher) leaves the
            # dispatcher in a state its own test then no longer reproduces.
            continue
        if case.reset is not None:
            case.reset()
        try:
            mode = ParityMode(parity, shape_env=ShapeEnv() if case.symbolic else None)
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


def print_figures(name: str, parity: Parity) -> None:
    print(f"\nkeybuilder parity [{keybuilder.backend()}] {name}: {json.dumps(parity.figures())}")


# ------------------------------------------------------------------- tests


class TestKeyBuilderOpInfo(TestCase):
    def setUp(self) -> None:
        super().setUp()
        SWEEP_STARTED.add(self._testMethodName)

    @ops(op_db[test_opinfo_crosscheck.SHARD[0] :: test_opinfo_crosscheck.SHARD[1]], dtypes=OpDTypes.none)
    def test_op_db_keys(self, device: str, op: OpInfo) -> None:
        """Every key of the op's samples that a builder handles equals torch's."""
        parity = sweep_op(op, device)
        SWEEP.add(parity)
        self.assertEqual(parity.differences, [])


instantiate_device_type_tests(TestKeyBuilderOpInfo, globals(), only_for="cpu")


class TestKeyBuilderSweeps(TestCase):
    """The totals of the op_db sweep (run after it), the workloads and the zoo."""

    def assertParity(self, name: str, parity: Parity, min_share: float) -> None:
        print_figures(name, parity)
        self.assertEqual(parity.differences[:20], [], msg=f"{len(parity.differences)} differences")
        self.assertGreater(parity.keys, 0)
        self.assertGreaterEqual(parity.handled / parity.keys, min_share, msg=str(parity.figures()))

    def test_op_db_figures(self) -> None:
        """Over the whole op_db sweep: no difference, most keys handled."""
        per_op = globals()["TestKeyBuilderOpInfoCPU"]
        expected = {
            n
            for n in dir(per_op)
            if n.startswith("test_op_db_keys_") and not getattr(getattr(per_op, n), "__unittest_skip__", False)
        }
        if expected - SWEEP_STARTED:
            self.skipTest("not every per-op test ran in this process (-k selection?)")
        self.assertParity("op_db", SWEEP, 0.9)
        self.assertGreater(SWEEP.keys, 1000 // test_opinfo_crosscheck.SHARD[1])

    @parametrize("name", ["qdq", "dialect", "aten-only", "symbolic"])
    def test_workload_keys(self, name: str) -> None:
        """Every key of two replays of the workload that a builder handles equals torch's."""
        parity = sweep_workload(name)
        if name == "symbolic" and not keybuilder.SYMBOLIC_KEYS:
            # A torch whose extract_tensor_metadata is not a known one: torch builds symbolic keys.
            self.assertParity(name, parity, 0.0)
            self.assertGreater(parity.fallbacks["symbolic sizes"], 0)
        else:
            self.assertParity(name, parity, 1.0)

    def test_zoo_keys(self) -> None:
        """Every key of the kernel zoo's calls that a builder handles equals torch's."""
        self.assertParity("zoo", sweep_zoo(), 0.5)


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
    strided = StatelessSymbolicContext(
        dynamic_sizes=[DimDynamic.DYNAMIC] * 4, dynamic_strides=[DimDynamic.DYNAMIC] * 4
    )
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
        """Every builder handles the call, with torch's key."""
        expected = mode._cache_key(_CacheKeyState(mode.shape_env), func, args, kwargs)
        for name, build in builders():
            built = build(mode, keybuilder.key_prefix(mode, func), args, kwargs)
            self.assertIsInstance(built, tuple, msg=f"{name}: {built}")
            self.assertIsNone(first_difference(built, expected.key), msg=name)
        stats = keybuilder.KeyStats()
        key = keybuilder.cache_key(mode, _CacheKeyState(mode.shape_env), func, args, kwargs, stats)
        self.assertEqual((key, hash(key), stats.built, stats.fallbacks), (expected, hash(expected), 1, {}))

    def assertFallback(
        self, reason: str, mode: Any, func: Any, args: Sequence[object], kwargs: Mapping[str, object]
    ) -> None:
        """Every builder falls back for ``reason``, and cache_key answers as torch's _cache_key."""
        for name, build in builders():
            self.assertEqual(build(mode, keybuilder.key_prefix(mode, func), args, kwargs), reason, msg=name)
        stats = keybuilder.KeyStats()
        try:
            expected: object = mode._cache_key(_CacheKeyState(mode.shape_env), func, args, kwargs)
        except _BypassDispatchCache as e:
            with self.assertRaisesRegex(_BypassDispatchCache, ""):
                keybuilder.cache_key(mode, _CacheKeyState(mode.shape_env), func, args, kwargs, stats)
            expected = e.reason
        else:
            got = keybuilder.cache_key(mode, _CacheKeyState(mode.shape_env), func, args, kwargs, stats)
            self.assertEqual(got, expected)
        self.assertEqual((stats.built, stats.fallbacks), (0, {reason: 1}))

    @parametrize("case", list(CASES))
    def test_same_key(self, case: str) -> None:
        """The builders' key of an unusual but handled call equals torch's."""
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
            keybuilder.cache_key(
                mode, _CacheKeyState(), torch.ops.aten.add.Tensor, (x, v), {}, keybuilder.KeyStats()
            )
            for v in (1, 1.0, True)
        }
        self.assertEqual(len(keys), 3)

    def test_without_a_state_symbolic_values_fall_back(self) -> None:
        """Without a state to record them in, symbolic sizes and SymInt arguments are not built."""
        mode = StockMode(shape_env=ShapeEnv())
        x = mode.from_tensor(torch.empty(4, 3), symbolic_context=_dynamic(2))
        y = mode.from_tensor(torch.empty(4, 3), symbolic_context=_dynamic(2, dims=0))
        for func, args, reason in [
            (torch.ops.aten.relu.default, (x,), "symbolic sizes"),
            (torch.ops.aten.view.default, (y, [x.shape[0], 3]), "symbolic argument"),
        ]:
            for name, build in builders():
                self.assertEqual(build(mode, keybuilder.key_prefix(mode, func), args, {}), reason, msg=name)

    @parametrize("case", list(SYMBOLIC_CASES))
    def test_symbolic_same_key_state_and_guards(self, case: str) -> None:
        """A symbolic key equals torch's, leaves torch's state, and adds the guards torch's key adds."""
        if not keybuilder.SYMBOLIC_KEYS:
            self.skipTest("this torch's extract_tensor_metadata is not a known one")
        # Two identical ShapeEnvs: one sees torch's key only, the other the
        # builder's key first (its guards, if any), then torch's.
        torch_only = _symbolic_case(case)
        mode, func, args, kwargs = torch_only
        mode._cache_key(_CacheKeyState(mode.shape_env), func, args, kwargs)
        expected_guards = [str(g.expr) for g in mode.shape_env.guards]
        if case == "4d_channels_last_symbolic_strides":
            # torch 2.13's key guards here, 2.14's does not: the case means something on both.
            self.assertEqual(bool(expected_guards), keybuilder._SUGGEST_FOR_SYMBOLIC is not None)
        for name, build in builders():
            mode, func, args, kwargs = _symbolic_case(case)
            ours = _CacheKeyState(mode.shape_env)
            built = build(mode, keybuilder.key_prefix(mode, func), args, kwargs, ours)
            self.assertIsInstance(built, tuple, msg=f"{name}: {built}")
            self.assertEqual([str(g.expr) for g in mode.shape_env.guards], expected_guards, msg=name)
            theirs = _CacheKeyState(mode.shape_env)
            expected = mode._cache_key(theirs, func, args, kwargs)
            self.assertIsNone(first_difference(built, expected.key), msg=name)
            self.assertIsNone(state_difference(ours, theirs), msg=name)
            self.assertTrue(ours.sym_node_lookup, msg=name)
        # The mode's entry point: built, not left to torch.
        mode, func, args, kwargs = _symbolic_case(case)
        stats = keybuilder.KeyStats()
        state = _CacheKeyState(mode.shape_env)
        key = keybuilder.cache_key(mode, state, func, args, kwargs, stats)
        theirs = _CacheKeyState(mode.shape_env)
        self.assertEqual(key, mode._cache_key(theirs, func, args, kwargs))
        self.assertEqual((stats.built, stats.fallbacks, state_difference(state, theirs)), (1, {}, None))

    def test_symbolic_state_records_symbols_when_reached(self) -> None:
        """A symbol that a later tensor's memory-format guard replaces is recorded as torch records it: when reached."""
        if keybuilder._SUGGEST_FOR_SYMBOLIC is None:
            self.skipTest("this torch's key adds no memory-format guard")
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
        for name, build in builders():
            mode, func, args = case()
            ours = _CacheKeyState(mode.shape_env)
            self.assertIsInstance(build(mode, keybuilder.key_prefix(mode, func), args, {}, ours), tuple, msg=name)
            self.assertEqual(sorted(map(str, ours.known_symbols)), sorted(map(str, theirs.known_symbols)), msg=name)

    def test_symbolic_fallbacks(self) -> None:
        """SymBool and SymFloat arguments, and a state that has seen symbols, are left to torch."""
        if not keybuilder.SYMBOLIC_KEYS:
            self.skipTest("this torch's extract_tensor_metadata is not a known one")
        mode = StockMode(shape_env=ShapeEnv())
        x = mode.from_tensor(torch.empty(4, 3), symbolic_context=_dynamic(2))
        add = torch.ops.aten.add.Tensor
        for value in (x.shape[0] > 2, x.shape[0] * 0.5):
            state = _CacheKeyState(mode.shape_env)
            for name, build in builders():
                self.assertEqual(build(mode, keybuilder.key_prefix(mode, add), (x, value), {}, state), "symbolic argument", msg=name)
            self.assertEqual((state.sym_node_lookup, state.known_symbols), ({}, set()), msg="a fall back leaves the state fresh")
        stats = keybuilder.KeyStats()
        seen = _CacheKeyState(mode.shape_env)
        seen.known_symbols.update(x.shape[0].node.expr.free_symbols)
        expected = mode._cache_key(_CacheKeyState(mode.shape_env), add, (x, 1), {})
        got = keybuilder.cache_key(mode, seen, add, (x, 1), {}, stats)
        self.assertNotEqual(got, expected)  # torch's key for such a state holds the epoch
        self.assertEqual(stats.fallbacks, {"state with symbols": 1})

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

    def test_canary_disables_a_disagreeing_builder(self) -> None:
        """A built key that differs from torch's turns the builder off, with a warning, and torch's key is used."""
        mode = StockMode()
        with mode:
            x = torch.empty(3)
        relu = torch.ops.aten.relu.default
        canary = keybuilder._Canary()
        stats = keybuilder.KeyStats()
        wrong = _DispatchCacheKey((relu, "not torch's key"))
        with self.assertWarnsRegex(UserWarning, "differs from FakeTensorMode._cache_key"):
            key = canary.check(wrong, mode, _CacheKeyState(), relu, (x,), {}, stats)
        self.assertEqual(key, mode._cache_key(_CacheKeyState(), relu, (x,), {}))
        self.assertEqual((canary.pending, canary.disabled), (False, "key builder disagrees with this torch"))
        self.assertEqual(stats.fallbacks, {"key builder disagrees with this torch": 1})

    def test_mode_counts_built_keys(self) -> None:
        """The policy mode builds its keys with the builder and counts fallbacks by reason."""
        policy = tcp.CachePolicy(namespaces=["quantized_decomposed"])
        mode = tcp.FakeTensorMode(cache_policy=policy, shape_env=ShapeEnv())
        x = mode.from_tensor(torch.empty(2, 4), symbolic_context=_dynamic(2, dims=0))
        s = mode.from_tensor(torch.empty(4, 3), symbolic_context=_dynamic(2))
        with mode:
            for _ in range(2):
                torch.ops.quantized_decomposed.quantize_per_tensor(x, 0.1, 0, -128, 127, torch.int8)
                torch.relu(x)
        stats = mode.cache_key_stats()
        self.assertEqual((stats.built, stats.fallbacks, stats.handled_share), (4, {}, 1.0))
        self.assertEqual(mode.cache_info().hits, 2)
        with mode:
            torch.relu(s)  # a miss
            torch.ops.aten.mul.Scalar(s, s.shape[0] * 0.5)  # a SymFloat argument: torch's key
        stats = mode.cache_key_stats()
        self.assertGreaterEqual(stats.built, 5)
        self.assertEqual(set(stats.fallbacks), {"symbolic argument"} if keybuilder.SYMBOLIC_KEYS else {"symbolic sizes", "symbolic argument"})
        self.assertEqual(stats.handled_share, stats.built / (stats.built + sum(stats.fallbacks.values())))
        mode.cache_clear()
        self.assertEqual(repr(mode.cache_key_stats()), "KeyStats(built=0, fallbacks={})")

    def test_python_fallback_in_a_subprocess(self) -> None:
        """With TORCH_CACHEPOLICY_FORCE_PYTHON=1 the Python builder builds torch's key."""
        script = textwrap.dedent(
            """
            import json, torch
            from torch._subclasses._fake_tensor_utils import _CacheKeyState
            import torch_cachepolicy as tcp
            from torch_cachepolicy import keybuilder
            mode = tcp.FakeTensorMode()
            with mode:
                x = torch.empty(2, 3, 4, 5).to(memory_format=torch.channels_last)
                torch.relu(x)
                torch.relu(x)
            func = torch.ops.aten.relu.default
            stats = keybuilder.KeyStats()
            key = keybuilder.cache_key(mode, _CacheKeyState(), func, (x,), {}, stats)
            same = key == mode._cache_key(_CacheKeyState(), func, (x,), {})
            print(json.dumps({"backend": keybuilder.backend(), "same": same,
                              "built": mode.cache_key_stats().built, "hits": mode.cache_info().hits}))
            """
        )
        env = {**os.environ, "TORCH_CACHEPOLICY_FORCE_PYTHON": "1"}
        result = testing.run_json_script(self, script, env, "-W", "ignore")
        self.assertEqual((result["backend"], result["same"], result["hits"]), ("python", True, 1))
        self.assertGreaterEqual(result["built"], 2)  # the relu calls, and the ops making x




def _dynamic(ndim: int, dims: int = 1) -> Any:
    """A symbolic context whose first ``dims`` dimensions are dynamic."""
    from torch.fx.experimental.symbolic_shapes import DimDynamic, StatelessSymbolicContext

    return StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC] * dims + [DimDynamic.STATIC] * (ndim - dims))


instantiate_parametrized_tests(TestKeyBuilder)


if __name__ == "__main__":
    run_tests()
