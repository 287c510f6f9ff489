"""Small facts about fake tensors and symbolic ints, shared by the modules that compare them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeGuard

import torch
from torch._subclasses import fake_tensor as _ft
from torch.fx.experimental.symbolic_shapes import statically_known_true

from torch_cachepolicy._compat import SYNTHESIS_TAKES_FUNC


def _is_python_fake_tensor(x: object) -> TypeGuard[torch.Tensor]:
    return isinstance(x, _ft.FakeTensor)


# Note [Which fake tensors]
# ~~~~~~~~~~~~~~~~~~~~~~~~~
# torch 2.14 adds fake tensors implemented in C++, which are not instances of
# the Python FakeTensor class, and `fake_tensor.is_fake_tensor` to ask about
# both. Where the package asks "is this a fake tensor" (storages, aliasing),
# it uses torch's predicate when present; on 2.13 only the Python class exists.
# Sites that read attributes only the Python class has (`.fake_mode`,
# `.constant`) keep isinstance(x, FakeTensor), as torch's own code does.
is_fake_tensor: Callable[[object], TypeGuard[torch.Tensor]] = getattr(_ft, "is_fake_tensor", _is_python_fake_tensor)


def storage_id(t: torch.Tensor) -> int:
    """An int naming ``t``'s storage: equal for tensors sharing one."""
    return t.untyped_storage()._cdata


class GuardFreeInt:
    """A symbolic int that compares without adding guards to its ShapeEnv.

    ``SymInt == SymInt`` followed by ``bool()`` would guard. Two expressions
    are equal here if they are the same after expansion (``4*s0*s1`` and the
    ``empty_strided`` form ``4*s1*(s0 - 1) + 4*s1``) or if the ShapeEnv can
    prove them equal from what it already knows; anything else counts as a
    difference, which only ever costs a bypass.
    """

    __slots__ = ("value",)

    def __init__(self, value: torch.SymInt) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, GuardFreeInt):
            return False
        a, b = self.value.node.expr, other.value.node.expr
        # Expanded separately: sympy memoizes each expansion, so a miss comparing many sizes pays little.
        if a == b or a.expand() == b.expand():
            return True
        return bool(statically_known_true(self.value == other.value))

    def __hash__(self) -> int:
        return hash(type(self))

    def __repr__(self) -> str:
        return str(self.value)


def guard_free_int(v: object) -> object:
    """An int as itself, a SymInt as its int value (a symbol pinned to a number) or a :class:`GuardFreeInt`."""
    if isinstance(v, torch.SymInt):
        value = v.node.maybe_as_int()
        return value if value is not None else GuardFreeInt(v)
    return v


def output_from_entry(build: Callable[..., Any], state: object, entry: object, key: Any, args: object) -> Any:
    """Calls ``build``, a bound ``_output_from_cache_entry``, with this torch's signature: ``(func, args)`` before
    2.15, ``(args)`` since; the func is a key's first item either way."""
    if SYNTHESIS_TAKES_FUNC:
        return build(state, entry, key, key.key[0], args)
    return build(state, entry, key, args)
