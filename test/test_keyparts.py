# Owner(s): ["module: fakeTensor"]
"""torch_cachepolicy._key_extension: the C++ test for the common case agrees with the full pass of the key extension."""

from __future__ import annotations

import math
import random
import unittest
from collections.abc import Callable
from typing import Any
from unittest import mock

import torch
from torch._subclasses._fake_tensor_utils import _CacheKeyState
from torch._subclasses.fake_tensor import _BypassDispatchCache, _DispatchCacheKey
from torch.testing._internal.common_utils import TestCase, instantiate_parametrized_tests, parametrize, run_tests

import torch_cachepolicy as tcp
from torch_cachepolicy import _key_extension

HAS_CPP = _key_extension._plain_args is not None
needs_cpp = unittest.skipIf(
    not HAS_CPP, "torch_cachepolicy._C is not loaded (USE_CPP=0 or TORCH_CACHEPOLICY_FORCE_PYTHON=1): no _C.plain_args"
)
KEY = _DispatchCacheKey(("op", 1))


def _pool(mode: tcp.FakeTensorMode) -> dict[str, Callable[[], Any]]:
    """Named argument makers; each call makes fresh tensors unless the name says shared."""
    base = mode.from_tensor(torch.zeros(4, 4))
    shared = mode.from_tensor(torch.zeros(3))
    with_grad = mode.from_tensor(torch.zeros(2))
    with_grad.grad = mode.from_tensor(torch.ones(2))
    real_leaf = torch.zeros(2, requires_grad=True)
    return {
        "tensor": lambda: mode.from_tensor(torch.zeros(2, 3)),
        "shared tensor": lambda: shared,
        "view": lambda: base[1],
        "view base": lambda: base,
        "real non-leaf": lambda: real_leaf * 2,
        "tensor with grad": lambda: with_grad,
        "float": lambda: 0.5,
        "zero": lambda: 0.0,
        "negative zero": lambda: -0.0,
        "nan": lambda: math.nan,
        "inf": lambda: -math.inf,
        "complex": lambda: complex(1.0, 2.0),
        "complex negative zero": lambda: complex(1.0, -0.0),
        "int": lambda: 3,
        "bool": lambda: True,
        "none": lambda: None,
        "str": lambda: "same",
        "dtype": lambda: torch.float16,
        "size": lambda: torch.Size([2, 3]),
    }


class _EveryArgument:
    """Slots naming every argument of one call, as plain_args looks at them."""

    def __init__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.floats = self.tensors = (*((i, "") for i in range(len(args))), *((len(args), k) for k in kwargs))
        self.opaque = ()


def _full_pass_adds_nothing(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether the key extension's full pass (every argument) leaves torch's key as it is."""
    try:
        slots: Any = _EveryArgument(args, kwargs)
        out = _key_extension._extend_key(KEY, slots, _CacheKeyState(None), args, kwargs)
    except _BypassDispatchCache:
        return False
    return out is KEY


@instantiate_parametrized_tests
class TestPlainArgs(TestCase):
    """_C.plain_args says True exactly when the full pass would add nothing."""

    def setUp(self) -> None:
        super().setUp()
        self.mode = tcp.FakeTensorMode()
        self.pool = _pool(self.mode)

    def assertAgrees(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        """The C++ answer equals the full pass's; returns it."""
        assert _key_extension._plain_args is not None
        expected = _full_pass_adds_nothing(args, kwargs)
        self.assertEqual(_key_extension._plain_args(args, kwargs), expected, f"{args!r} {kwargs!r}")
        return expected

    @needs_cpp
    @parametrize(
        "name,plain",
        [
            ("tensor", True),
            ("view", False),
            ("real non-leaf", False),
            ("tensor with grad", False),
            ("float", True),
            ("zero", True),
            ("negative zero", False),
            ("nan", False),
            ("inf", True),
            ("complex", True),
            ("complex negative zero", False),
            ("int", True),
            ("size", True),
        ],
    )
    def test_single_value(self, name: str, plain: bool) -> None:
        """Each kind of value alone, positional, nested in a list and as a dict value."""
        make = self.pool[name]
        for args, kwargs in (((make(),), {}), (([1, (make(),)],), {}), ((), {"x": {"k": make()}})):
            self.assertEqual(self.assertAgrees(args, kwargs), plain)

    @needs_cpp
    def test_sharing(self) -> None:
        """Two arguments on one storage (the same tensor, or a view and its base) are not plain."""
        shared = self.pool["shared tensor"]
        self.assertFalse(self.assertAgrees((shared(), shared()), {}))
        self.assertFalse(self.assertAgrees((self.pool["view base"](), self.pool["view"]()), {}))
        self.assertTrue(self.assertAgrees((self.pool["tensor"](), self.pool["tensor"]()), {}))
        self.assertFalse(self.assertAgrees((shared(),), {"y": [shared()]}))

    @needs_cpp
    def test_random_argument_lists(self) -> None:
        """600 random argument lists, nested in lists, tuples and dicts: the answers agree."""
        rng = random.Random(0)
        names = sorted(self.pool)

        def value(depth: int) -> Any:
            r = rng.random()
            if depth < 2 and r < 0.15:
                return [value(depth + 1) for _ in range(rng.randint(0, 3))]
            if depth < 2 and r < 0.25:
                return tuple(value(depth + 1) for _ in range(rng.randint(0, 3)))
            if depth < 2 and r < 0.3:
                return {f"k{i}": value(depth + 1) for i in range(rng.randint(0, 2))}
            return self.pool[rng.choice(names)]()

        seen = {True: 0, False: 0}
        for _ in range(600):
            args = tuple(value(0) for _ in range(rng.randint(0, 4)))
            kwargs = {f"a{i}": value(0) for i in range(rng.randint(0, 2))}
            seen[self.assertAgrees(args, kwargs)] += 1
        # Both answers occur, so the comparison is not vacuous.
        self.assertGreater(seen[True], 50)
        self.assertGreater(seen[False], 50)

    @needs_cpp
    def test_deep_nesting_goes_to_full_pass(self) -> None:
        """Arguments nested deeper than the C++ walk follows go to the full pass."""
        deep: Any = 1.0
        for _ in range(40):
            deep = [deep]
        assert _key_extension._plain_args is not None
        self.assertFalse(_key_extension._plain_args((deep,), {}))
        self.assertTrue(_full_pass_adds_nothing((deep,), {}))

    @parametrize("cpp", [True, False], name_fn=lambda cpp: "cpp" if cpp else "full_pass_only")
    def test_extend_key_uses_answer(self, cpp: bool) -> None:
        """extend_key returns torch's key itself for plain arguments, and extends it for shared ones."""
        if cpp and not HAS_CPP:
            self.skipTest("torch_cachepolicy._C is not loaded (USE_CPP=0 or TORCH_CACHEPOLICY_FORCE_PYTHON=1)")
        plain_args = _key_extension._plain_args if cpp else None
        t = self.pool["tensor"]
        shared = self.pool["shared tensor"]()
        with mock.patch.object(_key_extension, "_plain_args", plain_args):
            slots = _key_extension.ArgSlots(torch.ops.aten.addmm.default)
            self.assertIs(_key_extension.extend_key(KEY, slots, _CacheKeyState(None), (t(), t(), t()), {}), KEY)
            extended = _key_extension.extend_key(KEY, slots, _CacheKeyState(None), (shared, shared, t()), {})
            self.assertIsNot(extended, KEY)
            self.assertEqual(extended.key[: len(KEY.key)], KEY.key)
            # One tensor argument (no Python fast path any more): the same answers.
            relu = _key_extension.ArgSlots(torch.ops.aten.relu.default)
            self.assertIs(_key_extension.extend_key(KEY, relu, _CacheKeyState(None), (t(),), {}), KEY)
            view = self.pool["view"]()
            self.assertIsNot(_key_extension.extend_key(KEY, relu, _CacheKeyState(None), (view,), {}), KEY)

    def test_without_cpp_every_call_takes_the_full_pass(self) -> None:
        """Without _C.plain_args extend_key runs the full pass on every call, plain arguments included."""
        full_pass = mock.Mock(wraps=_key_extension._extend_key)
        t = self.pool["tensor"]
        slots = _key_extension.ArgSlots(torch.ops.aten.relu.default)
        with (
            mock.patch.object(_key_extension, "_plain_args", None),
            mock.patch.object(_key_extension, "_extend_key", full_pass),
        ):
            for args in ((t(),), (self.pool["view"](),), (self.pool["tensor with grad"](),)):
                try:
                    _key_extension.extend_key(KEY, slots, _CacheKeyState(None), args, {})
                except _BypassDispatchCache:
                    pass
        self.assertEqual(full_pass.call_count, 3)


if __name__ == "__main__":
    run_tests()
