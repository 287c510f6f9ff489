"""What a backend op's cache key needs beyond torch's ``_cache_key``.

Note [A key that sees what a fake kernel can see]
torch's key encodes each non-tensor argument as ``(type, value)`` and each
tensor as its metadata. Three things a fake kernel can observe are lost that
way, and aten's kernels never look at them, which is why stock torch can
ignore them. A backend kernel may:

* tell ``-0.0`` from ``0.0`` (``math.copysign``), which compare equal;
* receive ``NaN``, which never equals itself, so its key never hits and each
  call would add one more entry to the store;
* see which tensor arguments share storage, are the same object, or are
  views, and of what base (two views of one base, ``op(x, x)``), none of
  which is in the metadata of each tensor taken alone;
* find floats and tensors inside a ``Dict`` argument;
* read an argument's autograd state (``is_leaf``, ``.grad``).

For the ops a policy routes to its store we add the sign of zero and the
sharing pattern to the key, and refuse NaN (a bypass, so the store does not
grow). The extra part is empty in the common case (no signed zero, no
sharing, no view), and then the key is torch's key unchanged. Which
arguments to look at comes from the schema, once per operator, so a hit
only visits the arguments that can hold a float or a tensor.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch
from torch._ops import OpOverload
from torch._subclasses._fake_tensor_utils import _CacheKeyState
from torch._subclasses.fake_tensor import _BypassDispatchCache, _DispatchCacheKey

from torch_cachepolicy import native

__all__ = ["GENERIC_SLOTS", "VISIBLE_TYPES", "ArgSlots", "check_visible", "extend_key"]

# An argument's position in ``args`` and its name in ``kwargs``.
_Slot = tuple[int, str]

# Marks where torch's key ends and ours begins; never equal to anything torch
# puts in a key, so an extended key never collides with a plain one.
_EXTRA = object()

_NO_FLOAT = (
    torch.IntType,
    torch.BoolType,
    torch.StringType,
    torch.TensorType,
    torch.SymIntType,
    torch.SymBoolType,
    torch.DeviceObjType,
    torch.NoneType,
)


def _can_hold_float(t: torch._C.JitType) -> bool:
    if isinstance(t, (torch.OptionalType, torch.ListType)):
        return _can_hold_float(t.getElementType())
    # Everything else (float, Scalar, complex, Any, tuples, types we do not
    # know) may carry a float; the scan is cheap, so err on that side.
    return not isinstance(t, _NO_FLOAT)


def _can_hold_tensor(t: torch._C.JitType) -> bool:
    if isinstance(t, (torch.OptionalType, torch.ListType)):
        return _can_hold_tensor(t.getElementType())
    return not isinstance(
        t,
        (
            torch.IntType,
            torch.BoolType,
            torch.StringType,
            torch.FloatType,
            torch.ComplexType,
            torch.NumberType,
            torch.SymIntType,
            torch.SymBoolType,
            torch.DeviceObjType,
            torch.NoneType,
        ),
    )


# Schema types whose values torch's key sees completely: plain values,
# tensors (their metadata) and symbolic ints, in lists, tuples, dicts and
# optionals. Anything else (Any, a torchbind class, Generator, Stream,
# Storage, a type variable) may carry an object the key holds by identity.
_VISIBLE_SCHEMA_TYPES = (
    torch.IntType,
    torch.FloatType,
    torch.BoolType,
    torch.StringType,
    torch.NumberType,
    torch.ComplexType,
    torch.TensorType,
    torch.SymIntType,
    torch.SymBoolType,
    torch.DeviceObjType,
    torch.NoneType,
)


def _visible_schema_type(t: torch._C.JitType) -> bool:
    if isinstance(t, (torch.OptionalType, torch.ListType)):
        return _visible_schema_type(t.getElementType())
    if isinstance(t, torch.TupleType):
        return all(_visible_schema_type(e) for e in t.elements())
    if isinstance(t, torch.DictType):
        return _visible_schema_type(t.getKeyType()) and _visible_schema_type(t.getValueType())
    return isinstance(t, _VISIBLE_SCHEMA_TYPES)


class ArgSlots:
    """The arguments of one operator that can hold a float, a tensor or an opaque object.

    ``ArgSlots(op)`` reads them off the schema; :data:`GENERIC_SLOTS` stands
    for every argument, for callers without a schema (higher-order ops).
    """

    __slots__ = ("floats", "generic", "opaque", "single_tensor", "tensors")

    def __init__(self, op: OpOverload | None) -> None:
        self.generic = op is None
        arguments = [] if op is None else op._schema.arguments
        self.floats: tuple[_Slot, ...] = tuple(
            (i, a.name) for i, a in enumerate(arguments) if _can_hold_float(a.type)
        )
        self.tensors: tuple[_Slot, ...] = tuple(
            (i, a.name) for i, a in enumerate(arguments) if _can_hold_tensor(a.type)
        )
        # One plain Tensor argument: nothing it could share storage with.
        self.single_tensor = len(self.tensors) == 1 and isinstance(
            arguments[self.tensors[0][0]].type, torch.TensorType
        )
        # Arguments whose value the key may hold without seeing its content
        # (Note [Arguments the key cannot see]); HOPs keep torch's treatment.
        self.opaque: tuple[_Slot, ...] = tuple(
            (i, a.name) for i, a in enumerate(arguments) if not _visible_schema_type(a.type)
        )


GENERIC_SLOTS = ArgSlots(None)

# csrc/keyparts.cpp; fetched once because extend_key calls it on every hit.
_plain_args = native.function("plain_args")



def _values(
    slots: tuple[_Slot, ...], generic: bool, args: Sequence[object], kwargs: Mapping[str, object]
) -> list[tuple[object, object]]:
    """(where, value) of each argument in ``slots``, or of every argument."""
    if generic:
        return [*enumerate(args), *kwargs.items()]
    out: list[tuple[object, object]] = []
    n = len(args)
    for i, name in slots:
        if i < n:
            out.append((i, args[i]))
        elif name in kwargs:
            out.append((i, kwargs[name]))
    return out


VISIBLE_TYPES: frozenset[type] = frozenset(
    {int, float, bool, complex, str, bytes, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format}
)
"""Exact types of the values whose whole content torch's key holds (``(type, value)``)."""

_CONTAINERS = (list, tuple, dict)
_SYMBOLIC = (torch.SymInt, torch.SymFloat, torch.SymBool)


def check_visible(
    slots: ArgSlots, immutable: frozenset[type], args: Sequence[object], kwargs: Mapping[str, object]
) -> None:
    """Bypasses unless every value in the opaque slots is one whose content the key sees.

    Note [Arguments the key cannot see]
    torch's key turns an argument it does not know into ``(type(value),
    value)``: an object hashed and compared by identity (a torchbind
    object, a FakeScriptObject, a Generator, any Python object passed
    through an ``Any`` argument) is then keyed by *which* object it is, not
    by what it holds. A fake kernel that reads its state would be replayed
    after the state changed. Such arguments (only possible in schema slots
    of an opaque type, found once per operator) bypass, unless their type
    is declared immutable by the policy (``CachePolicy(immutable_types=...)``),
    whose author then vouches that equal keys mean equal content.

    Raises:
        _BypassDispatchCache: naming the type and the fix.
    """
    n = len(args)
    for i, name in slots.opaque:
        value = args[i] if i < n else kwargs.get(name)
        culprit = _hidden(value, immutable)
        if culprit is not None:
            raise _BypassDispatchCache(
                f"argument of type {culprit.__qualname__} whose content the key cannot see "
                "(CachePolicy(immutable_types=[...]) declares it immutable)"
            )


def _hidden(value: object, immutable: frozenset[type]) -> type | None:
    """The type of the first value in ``value`` whose content the key cannot see, or None."""
    tp = type(value)
    if tp in VISIBLE_TYPES or isinstance(value, (torch.Tensor, *_SYMBOLIC)):
        return None
    if isinstance(value, _CONTAINERS):
        items = (*value.keys(), *value.values()) if isinstance(value, dict) else value
        for item in items:
            found = _hidden(item, immutable)
            if found is not None:
                return found
        return None
    if immutable and isinstance(value, tuple(immutable)):
        return None
    return tp


def _float_marks(value: object, path: tuple[object, ...], out: list[object]) -> None:
    if isinstance(value, float):
        if value != value:
            raise _BypassDispatchCache("NaN argument")
        if value == 0.0 and math.copysign(1.0, value) < 0:
            out.append(("-0.0", path))
    elif isinstance(value, complex):
        for part, x in (("real", value.real), ("imag", value.imag)):
            if x != x:
                raise _BypassDispatchCache("NaN argument")
            if x == 0.0 and math.copysign(1.0, x) < 0:
                out.append(("-0.0", path, part))
    elif isinstance(value, (list, tuple)):
        for j, item in enumerate(value):
            _float_marks(item, (*path, j), out)
    elif isinstance(value, dict):
        for j, (k, item) in enumerate(value.items()):
            _float_marks(k, (*path, j, "key"), out)
            _float_marks(item, (*path, j), out)


def _tensors(value: object, out: list[torch.Tensor]) -> None:
    if isinstance(value, torch.Tensor):
        out.append(value)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _tensors(item, out)
    elif isinstance(value, dict):
        for item in value.values():
            _tensors(item, out)


def _first_index(values: list[int]) -> tuple[int, ...]:
    seen: dict[int, int] = {}
    return tuple(seen.setdefault(v, i) for i, v in enumerate(values))


def extend_key(
    key: _DispatchCacheKey,
    slots: ArgSlots,
    state: _CacheKeyState,
    args: Sequence[object],
    kwargs: Mapping[str, object],
) -> _DispatchCacheKey:
    """``key``, extended by what torch's key cannot see (see the module note).

    Raises:
        _BypassDispatchCache: an argument is NaN or has a ``.grad``.
    """
    # This runs on every hit of a backend op. The common case is decided by
    # _C.plain_args in one walk (Note [The common case of the key extension]
    # in csrc/keyparts.cpp), or without the extension here, with no
    # allocation, for ops with one tensor argument; anything else takes the
    # full pass.
    if slots.generic:
        return _extend_key(key, slots, state, args, kwargs)
    if _plain_args is not None:
        return key if _plain_args(args, kwargs) else _extend_key(key, slots, state, args, kwargs)
    if not slots.single_tensor:
        return _extend_key(key, slots, state, args, kwargs)
    n = len(args)
    for i, name in slots.floats:
        value = args[i] if i < n else kwargs.get(name)
        if type(value) is float and value != 0.0 and value == value:
            continue
        if value is None or isinstance(value, (bool, int, str, torch.dtype)):
            continue  # cannot hold a float: None, and Scalars that are not floats
        return _extend_key(key, slots, state, args, kwargs)
    i, name = slots.tensors[0]
    t = args[i] if i < n else kwargs.get(name)
    if isinstance(t, torch.Tensor) and (t._is_view() or not t.is_leaf or t._grad is not None):
        return _extend_key(key, slots, state, args, kwargs)
    return key


def _extend_key(
    key: _DispatchCacheKey,
    slots: ArgSlots,
    state: _CacheKeyState,
    args: Sequence[object],
    kwargs: Mapping[str, object],
) -> _DispatchCacheKey:
    """The full pass of :func:`extend_key`.

    A view's base is described through ``state`` like any argument of torch's
    key, so its symbols take part in deciding where the entry lives, and an
    output symbol found there is rebuilt from it.

    Raises:
        _BypassDispatchCache: an argument is NaN.
    """
    marks: list[object] = []
    for where, value in _values(slots.floats, slots.generic, args, kwargs):
        if type(value) is not float or value == 0.0 or value != value:
            _float_marks(value, (where,), marks)
    if slots.single_tensor:
        i = slots.tensors[0][0]
        only = args[i] if i < len(args) else kwargs.get(slots.tensors[0][1])
        tensors = [only] if isinstance(only, torch.Tensor) else []
    else:
        tensors = []
        for _, value in _values(slots.tensors, slots.generic, args, kwargs):
            _tensors(value, tensors)
    views: list[int] = []
    for i, t in enumerate(tensors):
        if t._is_view():
            views.append(i)
        # Autograd state a kernel can read and torch's key omits: x.is_leaf,
        # and x.grad (rare in export; a bypass rather than a key of its own).
        # Reading a non-leaf's .grad warns; it has one only after retain_grad().
        if t.is_leaf:
            if t._grad is not None:
                raise _BypassDispatchCache("argument with a .grad")
        else:
            marks.append(("non-leaf", i))
            if t.retains_grad and t._grad is not None:
                raise _BypassDispatchCache("argument with a .grad")
    if len(tensors) > 1:
        storage_ids = [t.untyped_storage()._cdata for t in tensors]
        # The same object twice implies shared storage, so one test covers both.
        if len(set(storage_ids)) != len(storage_ids):
            marks.append(("shared", _first_index(storage_ids), _first_index([id(t) for t in tensors])))
    if not marks and not views:
        return key
    values: list[object] = [*key.key, _EXTRA, *marks]
    for i in views:
        # A kernel can look at x._base; torch's key describes x alone.
        base = tensors[i]._base
        assert base is not None
        is_arg = next((j for j, t in enumerate(tensors) if t is base), -1)
        values.append(("view of", i, is_arg, base.dtype, base.dim()))
        for v in (*base.shape, *base.stride(), base.storage_offset()):
            if isinstance(v, torch.SymInt):
                state.convert_sym_int(values, v)
            else:
                values.append(v)
    return _DispatchCacheKey(tuple(values))
