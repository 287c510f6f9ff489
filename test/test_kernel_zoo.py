# Owner(s): ["module: fakeTensor"]
"""The kernel zoo: every call of a zoo op bypasses the cache or returns exactly what an uncached dispatch returns.

Each case of ``zoo_ops.CASES`` runs its call sequence twice over, in two worlds built identically: the cached
world calls the op under ``torch_cachepolicy.FakeTensorMode(cache_policy=CachePolicy(namespaces=["tcp_zoo"]),
cache_crosscheck=X)``; the reference world makes the same call on its own inputs under
``disable_fake_tensor_cache(mode)``. ``describe_call`` reduces a call to a comparable structure (outputs, the inputs
after the call, storage sharing and object identity between them, symbols, the exception type) and
``assertSameDispatch`` compares the two. With crosscheck on, a ``CrosscheckError`` counts as a failure too: the target
is that no wrong hit happens at all.

Cases marked with a ``limit`` are documented limits (ambient state the policy does not declare, stateful kernels)
and run as expected failures. Controls must be served from the cache, so the zoo cannot pass by bypassing everything.
"""

from __future__ import annotations

import contextlib
import logging
import math
import unittest
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import sympy
import torch
import torch.utils._pytree as pytree
import zoo_ops as zoo
from torch._subclasses.fake_tensor import FakeTensor, disable_fake_tensor_cache
from torch.fx.experimental.symbolic_shapes import ShapeEnv, free_symbols
from torch.testing._internal.common_utils import (
    TestCase,
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
    subtest,
)

import torch_cachepolicy as tcp
from torch_cachepolicy import _reasons

_SYM_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)
_CROSSCHECK_ERROR = f"{tcp.CrosscheckError.__module__}.{tcp.CrosscheckError.__qualname__}"

# ------------------------------------------------------------ describing a call


@dataclass(frozen=True)
class CallDescription:
    """What one call did, in a form two calls on different (identically built) inputs can be compared by.

    Storages and tensor objects are numbered in their world in order of first appearance over the whole run
    (inputs before a call, inputs after it, outputs), so equal numbers mean "shares storage with" / "is the same
    object as", within a call and across calls. Symbols of the inputs keep their names; any other symbol is renamed
    ``fresh<k>`` if no earlier call returned it, ``replayed<k>`` if one did.
    """

    raised: str | None
    structure: str
    outputs: tuple[object, ...]
    inputs_after: tuple[object, ...]
    # The symbols the call created in the ShapeEnv of its inputs' mode (see _symbols_created).
    shape_env_delta: tuple[int, ...] = ()
    message: str = field(default="", compare=False)


class _Numbering:
    """Numbers keys by first appearance, holding their owners so no id is reused while numbered."""

    def __init__(self) -> None:
        self.ids: dict[int, int] = {}
        self.owners: list[object] = []

    def __call__(self, key: int, owner: object) -> int:
        n = self.ids.get(key)
        if n is None:
            n = self.ids[key] = len(self.ids)
            self.owners.append(owner)
        return n


class World:
    """The state ``describe_call`` keeps across the calls of one run in one world (cached or reference):
    the numbering of storages and objects, and the symbols earlier calls returned, so that a replayed unbacked
    symbol differs from a fresh one."""

    def __init__(self) -> None:
        self.objects = _Numbering()
        self.storages = _Numbering()
        self.modes = _Numbering()
        self.seen_symbols: set[sympy.Symbol] = set()

    def tensor(self, t: torch.Tensor, syms: _Symbols) -> dict[str, object]:
        storage = t.untyped_storage()
        return {
            "object": self.objects(id(t), t),
            "storage": self.storages(storage._cdata, storage),
            "type": type(t).__name__,
            "fake_mode": self.modes(id(t.fake_mode), t.fake_mode) if isinstance(t, FakeTensor) else None,
            # dtype first: when it differs, the sizes that differ too are its consequence.
            "dtype": t.dtype,
            "device": t.device,
            "layout": t.layout,
            "shape": tuple(syms.int_like(v) for v in t.shape),
            "stride": tuple(syms.int_like(v) for v in t.stride()),
            "storage_offset": syms.int_like(t.storage_offset()),
            "nbytes": syms.int_like(storage.nbytes()),
            "requires_grad": t.requires_grad,
            "is_conj": t.is_conj(),
            "is_neg": t.is_neg(),
            "is_inference": t.is_inference(),
            "is_leaf": t.is_leaf,
            # .grad lives in autograd meta, outside __dict__ and the metadata; _grad reads it without the
            # warning .grad gives on non-leaves.
            "grad": None if t._grad is None else (t._grad.dtype, tuple(syms.int_like(v) for v in t._grad.shape)),
            "attributes": _attributes(t),
            "version": _version(t),
            "hooks": (len(t._backward_hooks or {}), len(getattr(t, "_post_accumulate_grad_hooks", None) or {})),
        }


def _symbols_created(shape_env: ShapeEnv | None) -> tuple[int, ...]:
    """How many symbols ``shape_env`` has made: an uncached call makes its kernel's every time.

    Facts (guards, replacements) are left out: both worlds share one ShapeEnv, so the second call to need a fact
    finds it there already, and a hit never needs to add one the entry's miss added.
    """
    if shape_env is None:
        return ()
    return (len(shape_env.var_to_range), shape_env.unbacked_symint_counter, shape_env.unbacked_symfloat_counter)


def _version(t: torch.Tensor) -> int | None:
    try:
        return t._version
    except RuntimeError:  # inference tensors have no version counter
        return None


# What every FakeTensor carries in its __dict__; the memos (unbacked sizes an op such as nonzero found for the
# tensor, reused by later calls) are described by whether they are set.
_FAKE_ATTRIBUTES = frozenset({"_fake_device", "constant", "dispatch_keys", "fake_mode", "pytype", "real_tensor"})


def _attributes(t: torch.Tensor) -> tuple[tuple[str, object], ...]:
    """The Python attributes of ``t`` beyond a FakeTensor's own, and which of its memos are set."""
    out: list[tuple[str, object]] = []
    for name, value in sorted(vars(t).items()):
        if name in _FAKE_ATTRIBUTES or (name.startswith("_") and name.endswith(("_epoch", "_vc"))):
            continue
        if name.startswith("_") and name.endswith("_memo"):
            out.append((name, value is not None))
        else:
            out.append((name, type(value).__name__ if isinstance(value, torch.Tensor) else repr(value)))
    return tuple(out)


class _Symbols:
    """Renders symbolic values; see CallDescription."""

    def __init__(self, input_symbols: set[sympy.Symbol], seen: set[sympy.Symbol]) -> None:
        self.input_symbols = input_symbols
        self.seen = seen
        self.renamed: dict[sympy.Symbol, sympy.Symbol] = {}

    def expr(self, value: Any) -> str:
        expr = value.node.expr
        for s in sorted(expr.free_symbols - self.input_symbols, key=str):
            if s not in self.renamed:
                tag = "replayed" if s in self.seen else "fresh"
                self.renamed[s] = sympy.Symbol(f"{tag}{len(self.renamed)}")
        # Expanded: torch's own hit path for aten ops rebuilds a storage's nbytes as an equal but differently
        # written expression (4*s0*s1 vs 4*s1*(s0 - 1) + 4*s1), which is not a difference.
        return str(sympy.expand(expr.xreplace(self.renamed)))

    def int_like(self, value: Any) -> object:
        """Sizes, strides, offsets: an int, or the expression of a SymInt (a constant one as its int)."""
        if isinstance(value, torch.SymInt):
            expr = value.node.expr
            return int(expr) if expr.is_number else self.expr(value)
        return int(value)

    def commit(self) -> None:
        self.seen.update(self.renamed)


def _plain(value: object) -> object:
    # A namedtuple counts as a plain tuple (torch's hits build plain ones); a list stays a list.
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    return value


def _leaf(value: object, world: World, syms: _Symbols) -> object:
    if isinstance(value, torch.Tensor):
        return world.tensor(value, syms)
    if isinstance(value, _SYM_TYPES):
        return (type(value).__name__, syms.expr(value))
    if isinstance(value, float) and math.isnan(value):
        return ("float", "nan" if math.copysign(1.0, value) > 0 else "-nan")
    if isinstance(value, (float, complex)):
        return (type(value).__name__, repr(value))  # repr tells -0.0 from 0.0
    return (type(value).__name__, value)


def _symbols_of(leaves: list[object]) -> set[sympy.Symbol]:
    found: set[sympy.Symbol] = set()
    for a in leaves:
        if isinstance(a, torch.Tensor):
            found |= free_symbols((a, a.untyped_storage().nbytes()))
        elif isinstance(a, _SYM_TYPES):
            found |= free_symbols(a)
    return found


def describe_call(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], world: World) -> CallDescription:
    """Calls ``fn(*args, **kwargs)`` and describes what it returned or raised and what it did to the inputs."""
    leaves = pytree.tree_leaves((args, kwargs))
    inputs = [a for a in leaves if isinstance(a, torch.Tensor)]
    input_symbols = _symbols_of(leaves)
    shape_env = next((a.fake_mode.shape_env for a in inputs if isinstance(a, FakeTensor)), None)
    env_before = _symbols_created(shape_env)
    for a in inputs:
        storage = a.untyped_storage()
        world.objects(id(a), a)
        world.storages(storage._cdata, storage)
    raised: Exception | None = None
    out: object = None
    try:
        out = fn(*args, **kwargs)
    except Exception as e:
        raised = e
    input_symbols |= _symbols_of(leaves)  # a kernel may have changed an input's metadata
    syms = _Symbols(input_symbols, world.seen_symbols)
    inputs_after = tuple(world.tensor(a, syms) for a in inputs)
    out_leaves, spec = pytree.tree_flatten(_plain(out))
    outputs = tuple(_leaf(o, world, syms) for o in out_leaves)
    syms.commit()
    env_after = _symbols_created(shape_env)
    return CallDescription(
        raised=None if raised is None else f"{type(raised).__module__}.{type(raised).__qualname__}",
        structure=str(spec),
        outputs=outputs,
        inputs_after=inputs_after,
        shape_env_delta=tuple(a - b for a, b in zip(env_after, env_before, strict=True)),
        message="" if raised is None else f"{type(raised).__name__}: {raised}".splitlines()[0][:300],
    )


def _first_difference(path: str, a: object, b: object) -> str | None:
    if _pairs(a) and _pairs(b) and len(a) != len(b):  # type: ignore[arg-type]
        only_cached = sorted(set(a) - set(b), key=str)  # type: ignore[arg-type]
        only_uncached = sorted(set(b) - set(a), key=str)  # type: ignore[arg-type]
        return f"{path}: only cached has {only_cached}, only uncached has {only_uncached}"
    if isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys():
        for k in a:
            why = _first_difference(f"{path}.{k}", a[k], b[k])
            if why:
                return why
        return None
    if isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b) and not (a and isinstance(a[0], str)):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            why = _first_difference(f"{path}[{i}]", x, y)
            if why:
                return why
        return None
    return None if a == b else f"{path}: cached {a!r}, uncached {b!r}"


def _pairs(value: object) -> bool:
    return isinstance(value, tuple) and all(isinstance(v, tuple) and len(v) == 2 for v in value)


def dispatch_difference(cached: CallDescription, uncached: CallDescription) -> str | None:
    """None if the two descriptions are equal; else one line saying where they first differ.

    A ``CrosscheckError`` from the cached call is always a difference: the crosscheck caught a wrong hit, and
    the target is that none happens.
    """
    if cached.raised == _CROSSCHECK_ERROR:
        return f"the cache made a wrong hit that crosscheck caught: {cached.message}"
    if cached == uncached:
        return None
    if cached.raised != uncached.raised:
        got = f"raised {cached.message}" if cached.raised else "returned"
        want = f"raised {uncached.message}" if uncached.raised else "returned"
        return f"cached call {got}; uncached call {want}"
    if cached.structure != uncached.structure:
        return f"output structure: cached {cached.structure}, uncached {uncached.structure}"
    if cached.shape_env_delta != uncached.shape_env_delta:
        return f"symbols created: {cached.shape_env_delta} (cached), {uncached.shape_env_delta} (uncached)"
    for name in ("outputs", "inputs_after"):
        why = _first_difference(name, getattr(cached, name), getattr(uncached, name))
        if why:
            return why
    return f"descriptions differ: {cached} != {uncached}"


@contextlib.contextmanager
def logging_disabled() -> Iterator[None]:
    """torch logs every exception a fake kernel raises at ERROR level; zoo kernels raise some on purpose."""
    logging.disable(logging.ERROR)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)


# --------------------------------------------------------------- running a case


class ZooTestCase(TestCase):
    def setUp(self) -> None:
        super().setUp()
        zoo.calls.clear()

    def assertSameDispatch(self, cached: CallDescription, uncached: CallDescription, msg: str = "") -> None:
        """The cached call did exactly what the uncached call did (and raised no CrosscheckError)."""
        why = dispatch_difference(cached, uncached)
        if why:
            self.fail(f"{msg}: {why}")

    def run_case(self, case: zoo.ZooCase, crosscheck: bool, *, cache: bool = True) -> tcp.FakeTensorMode:
        """Runs ``case``'s call sequence in a cached and a reference world; returns the mode.

        ``cache=False`` disables the cache in the "cached" world too (the harness's own check).
        """
        if case.reset is not None:
            case.reset()
        try:
            mode = tcp.FakeTensorMode(
                cache_policy=case.policy(),
                cache_crosscheck=crosscheck,
                shape_env=ShapeEnv() if case.symbolic or case.shape_env else None,
            )
            if not cache:
                mode.cache_enabled = False
            env = zoo.Env.make(mode, case.symbolic)
            cached_world, reference_world = World(), World()
            cached = reference = None
            caught = 0
            with mode, logging_disabled():
                for i, step in enumerate(case.steps):
                    action = case.actions.get(i)
                    if action is not None:
                        action()
                    if step == "F" or cached is None:
                        cached, reference = case.build(env, i), case.build(env, i)
                    runs = _kernel_runs(mode, case.op)
                    got = describe_call(case.callee, cached.args, cached.kwargs, cached_world)
                    ran = _kernel_runs(mode, case.op) - runs
                    if crosscheck and case.caught_by_crosscheck and got.raised == _CROSSCHECK_ERROR:
                        caught += 1
                        continue
                    with disable_fake_tensor_cache(mode):
                        want = describe_call(case.callee, reference.args, reference.kwargs, reference_world)
                    self.assertSameDispatch(got, want, msg=f"{case.name} call {i} ({step})")
                    # The report counts only dispatches that take the cached path: a crosscheck's re-run of a
                    # hit, or any run with the cache off, is invisible there for non-zoo ops (zoo kernels count
                    # their runs themselves), so those are checked only when every run is visible.
                    observable = (cache and not crosscheck) or case.op.namespace in (zoo.NS, zoo.CTX_NS)
                    if case.runs_every_call and observable and not ran:
                        self.fail(f"{case.name} call {i} ({step}): the kernel of {case.op} did not run")
            if crosscheck and case.caught_by_crosscheck:
                self.assertGreater(caught, 0, msg=f"{case.name}: crosscheck did not catch the limit")
        finally:
            if case.reset is not None:
                case.reset()
        return mode


_CROSSCHECK_ERROR = f"{tcp.CrosscheckError.__module__}.{tcp.CrosscheckError.__qualname__}"


# Where a NaN argument sits: the zoo op taking it, and how the argument wraps the NaN.
NAN_ARGS: dict[str, tuple[str, Callable[[float], Any]]] = {
    "float": ("nan_arg", lambda v: v),
    "float_list": ("float_list", lambda v: [1.0, v]),
    "complex": ("complex_arg", lambda v: complex(1.0, v)),
    "scalar": ("scalar_arg", lambda v: v),
    "dict": ("dict_float", lambda v: {"s": v}),
}


def _kernel_runs(mode: tcp.FakeTensorMode, op: torch._ops.OpOverload) -> int:
    """How often ``op``'s kernel ran: zoo kernels count themselves; for others, the dispatches that were not hits."""
    if op.namespace in (zoo.NS, zoo.CTX_NS):
        return zoo.calls[op.name().split("::")[1]]
    try:
        row = mode.cache_report()[op]
    except KeyError:
        return 0
    return row.calls - row.hits


def _zoo_subtests() -> list[Any]:
    return [
        subtest(
            (c, crosscheck),
            name=f"crosscheck_{crosscheck}_{c.name}",
            decorators=[unittest.expectedFailure] if c.limit and crosscheck in c.limit_crosscheck else [],
        )
        for crosscheck in (False, True)
        for c in zoo.CASES
    ]


class TestKernelZoo(ZooTestCase):
    @parametrize("case_and_crosscheck", _zoo_subtests())
    def test_zoo(self, case_and_crosscheck: tuple[zoo.ZooCase, bool]) -> None:
        """Every call of the zoo op bypasses or matches an uncached dispatch of the same call."""
        case, crosscheck = case_and_crosscheck
        mode = self.run_case(case, crosscheck)
        if case.min_hits:
            self.assertGreaterEqual(mode.cache_report()[case.op].hits, case.min_hits, msg=str(mode.cache_report()))

    def test_zoo_is_deterministic_uncached(self) -> None:
        """The harness itself: with the cache off in both worlds, every case (limits included) matches."""
        for case in zoo.CASES:
            self.run_case(case, crosscheck=False, cache=False)

    def test_zoo_size(self) -> None:
        """The zoo has 30+ operators, every failure class and some controls; each case builds every call's arguments."""
        for case in zoo.CASES:
            if case.reset is not None:
                case.reset()
            mode = tcp.FakeTensorMode(shape_env=ShapeEnv() if case.symbolic else None)
            env = zoo.Env.make(mode, case.symbolic)
            with mode:
                for i in range(len(case.steps)):
                    self.assertIsInstance(case.build(env, i), zoo.Call, msg=case.name)
        ops = {c.op for c in zoo.CASES}
        self.assertGreaterEqual(len(ops), 30)
        self.assertEqual({c.kind for c in zoo.CASES}, set(range(1, 9)))
        self.assertGreaterEqual(sum(c.min_hits > 0 for c in zoo.CASES), 3)

    @parametrize("crosscheck", [False, True])
    @parametrize("where", list(NAN_ARGS))
    def test_nan_does_not_grow_the_store(self, where: str, crosscheck: bool) -> None:
        """50 calls with a NaN argument match uncached dispatch and add at most one entry to the store."""
        name, make_arg = NAN_ARGS[where]
        fn = zoo.op(name)
        mode = tcp.FakeTensorMode(cache_policy=zoo.default_policy(), cache_crosscheck=crosscheck)
        cached_world, reference_world = World(), World()
        with mode:
            x, ref = torch.empty(3), torch.empty(3)
            fn(x, make_arg(math.nan))
            size = len(mode.cache_store)
            for i in range(50):
                nan = math.nan if i % 2 else -float("nan")  # one shared NaN object, and new negative ones
                got = describe_call(fn, (x, make_arg(nan)), {}, cached_world)
                with disable_fake_tensor_cache(mode):
                    want = describe_call(fn, (ref, make_arg(nan)), {}, reference_world)
                self.assertSameDispatch(got, want, msg=f"{name} call {i}")
        self.assertLessEqual(len(mode.cache_store) - size, 1, msg=f"the store grew per NaN call:\n{mode.cache_report()}")

    @parametrize("crosscheck", [False, True])
    @parametrize("fresh", ["object", "nan"])
    def test_context_that_never_repeats_is_bounded(self, fresh: str, crosscheck: bool) -> None:
        """100 calls under context values equal only to themselves match uncached dispatch; the store stops at 64."""
        make: Callable[[], object] = object if fresh == "object" else (lambda: -math.nan)
        fn = zoo.op("ambient_declared")
        policy = tcp.CachePolicy(namespaces=[zoo.NS], context_key=lambda: ("TOSA-1.0+INT", make()))
        mode = tcp.FakeTensorMode(cache_policy=policy, cache_crosscheck=crosscheck)
        cached_world, reference_world = World(), World()
        with mode:
            x, ref = torch.empty(3), torch.empty(3)
            for i in range(100):
                got = describe_call(fn, (x,), {}, cached_world)
                with disable_fake_tensor_cache(mode):
                    want = describe_call(fn, (ref,), {}, reference_world)
                self.assertSameDispatch(got, want, msg=f"call {i}")
        row = mode.cache_report()[fn]
        self.assertEqual((row.hits, row.misses, row.bypasses), (0, 64, {_reasons.CONTEXT_NEVER_REPEATS: 36}))
        self.assertEqual(len(mode.cache_store), 64)

    def test_describe_call_sees_differences(self) -> None:
        """The comparison itself: offsets, storage sharing, identity, fresh vs replayed symbols and errors all count."""
        with tcp.FakeTensorMode():

            def describe(fn: Callable[[torch.Tensor], Any]) -> CallDescription:
                return describe_call(fn, (torch.empty(4),), {}, World())

            fresh = describe(lambda a: a.new_empty(4))
            self.assertIsNone(dispatch_difference(fresh, describe(lambda a: a.new_empty(4))))
            kept = torch.empty(4)
            cases: dict[str, tuple[Callable[[torch.Tensor], Any], str]] = {
                "offset": (lambda a: a.new_empty(5)[1:], "storage_offset"),
                "nbytes": (lambda a: a.new_empty(8)[:4], "nbytes"),
                "aliases input": (lambda a: a.view(4), "storage"),
                "is the input": (lambda a: a, "object"),
                "raises": (lambda a: a.foo, "raised"),
                "mutates input": (lambda a: (a.unsqueeze_(0), a.new_empty(4))[1], "inputs_after[0].shape"),
                "requires grad": (lambda a: a.new_empty(4).requires_grad_(), "requires_grad"),
            }
            for name, (fn, where) in cases.items():
                self.assertIn(where, dispatch_difference(describe(fn), fresh) or "", msg=name)
            # Across calls: returning the same object twice differs from returning two fresh ones.
            world, other = World(), World()
            x = torch.empty(4)
            for _ in range(2):
                once = describe_call(lambda a: kept, (x,), {}, world)
            twice = [describe_call(lambda a: a.new_empty(4), (x,), {}, other) for _ in range(2)][-1]
            self.assertIn("object", dispatch_difference(once, twice) or "")
        # Symbols: a replayed unbacked symbol differs from a fresh one.
        shape_env = ShapeEnv()
        u0 = shape_env.create_unbacked_symint()
        world, other = World(), World()
        first = describe_call(lambda: u0, (), {}, world)
        replayed = describe_call(lambda: u0, (), {}, world)
        describe_call(lambda: shape_env.create_unbacked_symint(), (), {}, other)
        fresh_again = describe_call(lambda: shape_env.create_unbacked_symint(), (), {}, other)
        self.assertEqual(first, fresh_again)
        self.assertIn("replayed", dispatch_difference(replayed, fresh_again) or "")


instantiate_parametrized_tests(TestKernelZoo)


if __name__ == "__main__":
    run_tests()
