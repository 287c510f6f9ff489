# Owner(s): ["module: fakeTensor"]
"""The kernel zoo: every call of a zoo op bypasses the cache or returns exactly what an uncached dispatch returns.

Each case of ``zoo_ops.CASES`` runs its call sequence twice over, in two worlds built identically: the cached
world calls the op under ``torch_cachepolicy.FakeTensorMode(cache_policy=CachePolicy(namespaces=["tcp_zoo"]),
cache_crosscheck=X)``; the reference world makes the same call on its own inputs under
``disable_fake_tensor_cache(mode)``. ``zoo_ops.describe_call`` reduces a call to a comparable structure (outputs, the
inputs after the call, storage sharing and object identity between them, symbols, the exception type) and
``assertSameDispatch`` compares the two. With crosscheck on, a ``CrosscheckError`` counts as a failure too: the target
is that no wrong hit happens at all. Every case runs with crosscheck off (``crosscheck_False``: the hits alone must be
right, as without the test class's crosscheck) and on.

Cases marked with a ``limit`` are documented limits (ambient state the policy does not declare, stateful kernels)
and run as expected failures. Controls must be served from the cache, so the zoo cannot pass by bypassing everything.
"""

from __future__ import annotations

import math
import unittest
from collections.abc import Callable
from typing import Any

import torch
import zoo_ops as zoo
from torch._subclasses.fake_tensor import disable_fake_tensor_cache
from torch.fx.experimental.symbolic_shapes import ShapeEnv
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
    subtest,
)
from zoo_ops import CallDescription, World, describe_call, dispatch_difference

import torch_cachepolicy as tcp
from torch_cachepolicy import _reasons

# Where a NaN argument sits: the zoo op taking it, and how the argument wraps the NaN.
NAN_ARGS: dict[str, tuple[str, Callable[[float], Any]]] = {
    "float": ("nan_arg", lambda v: v),
    "float_list": ("float_list", lambda v: [1.0, v]),
    "complex": ("complex_arg", lambda v: complex(1.0, v)),
    "scalar": ("scalar_arg", lambda v: v),
    "dict": ("dict_float", lambda v: {"s": v}),
}


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


class TestKernelZoo(zoo.ZooTestCase):
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
