"""What a backend operator's cache key needs beyond torch's ``_cache_key``."""

# Note [A key that sees what a fake kernel can see]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# torch's key holds non-tensor arguments as (type, value) and tensors as metadata, losing what a backend kernel
# may read: -0.0 vs 0.0 (equal), NaN (unequal to itself: an entry per call), which tensors share storage, are one
# object or views of what base (op(x, x)), floats and tensors in a Dict, is_leaf and .grad. A backend op's key adds
# the sign of zero, the sharing and view bases; NaN or a .grad bypasses (per op, the schema says where to look).

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch
from torch._ops import OpOverload
from torch._subclasses._fake_tensor_utils import _CacheKeyState
from torch._subclasses.fake_tensor import _BypassDispatchCache, _DispatchCacheKey

from torch_cachepolicy import _native, _reasons
from torch_cachepolicy._fakes import storage_id
from torch_cachepolicy._key import PLAIN_TYPES

_Slot = tuple[int, str]  # an argument's position in args and its name in kwargs

_EXTRA = object()  # ends torch's part of an extended key; equal to nothing torch puts in a key

_SCALAR_TYPES = (
    torch.IntType,
    torch.BoolType,
    torch.StringType,
    torch.SymIntType,
    torch.SymBoolType,
    torch.DeviceObjType,
    torch.NoneType,
)
_NO_FLOAT = (*_SCALAR_TYPES, torch.TensorType)
_NO_TENSOR = (*_SCALAR_TYPES, torch.FloatType, torch.ComplexType, torch.NumberType)
# Schema types the key sees in full, nested too; others (Any, torchbind, Generator, ...) may hold objects keyed by id.
_VISIBLE_SCHEMA_TYPES = (*_NO_TENSOR, torch.TensorType)


def _element(t: torch._C.JitType) -> torch._C.JitType:
    while isinstance(t, (torch.OptionalType, torch.ListType)):
        t = t.getElementType()
    return t


def _can_hold_float(t: torch._C.JitType) -> bool:
    # Anything else (Scalar, complex, Any, tuples, unknown types) may carry a float; the scan is cheap.
    return not isinstance(_element(t), _NO_FLOAT)


def _can_hold_tensor(t: torch._C.JitType) -> bool:
    return not isinstance(_element(t), _NO_TENSOR)


def _visible_schema_type(t: torch._C.JitType) -> bool:
    t = _element(t)
    if isinstance(t, torch.TupleType):
        return all(_visible_schema_type(e) for e in t.elements())
    if isinstance(t, torch.DictType):
        return _visible_schema_type(t.getKeyType()) and _visible_schema_type(t.getValueType())
    return isinstance(t, _VISIBLE_SCHEMA_TYPES)


class ArgSlots:
    """An op's arguments that can hold a float, a tensor or an opaque object."""

    __slots__ = ("floats", "opaque", "tensors")

    def __init__(self, op: OpOverload) -> None:
        arguments = op._schema.arguments
        self.floats: tuple[_Slot, ...] = tuple((i, a.name) for i, a in enumerate(arguments) if _can_hold_float(a.type))
        self.tensors: tuple[_Slot, ...] = tuple(
            (i, a.name) for i, a in enumerate(arguments) if _can_hold_tensor(a.type)
        )
        # Arguments the key may hold unseen (Note [Arguments the key cannot see]).
        self.opaque: tuple[_Slot, ...] = tuple(
            (i, a.name) for i, a in enumerate(arguments) if not _visible_schema_type(a.type)
        )


_plain_args = _native.function("plain_args")  # csrc/keyparts.cpp; fetched once: extend_key calls it per hit

def _values(slots: tuple[_Slot, ...], args: Sequence[object], kwargs: Mapping[str, object]) -> list[tuple[object, object]]:
    """(where, value) of each argument in ``slots``."""
    out: list[tuple[object, object]] = []
    n = len(args)
    for i, name in slots:
        if i < n:
            out.append((i, args[i]))
        elif name in kwargs:
            out.append((i, kwargs[name]))
    return out


_VISIBLE_TYPES: frozenset[type] = PLAIN_TYPES | {bytes}  # exact types whose content the key holds (type, value)

_CONTAINERS = (list, tuple, dict)
_SYMBOLIC = (torch.SymInt, torch.SymFloat, torch.SymBool)


def check_visible(
    opaque: tuple[_Slot, ...], immutable: frozenset[type], args: Sequence[object], kwargs: Mapping[str, object]
) -> None:
    """Bypasses, naming the type and the fix, unless the key sees the content of every opaque slot's value."""
    # Note [Arguments the key cannot see]
    # ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    # torch keys an unknown argument as (type(value), value): an object hashed by identity (torchbind, Generator,
    # anything passed as Any) is keyed by *which* object, not its state, so a hit could replay a stale read. Such
    # arguments (in opaque schema slots) bypass unless CachePolicy(immutable_types=...) declares them immutable.
    n = len(args)
    for i, name in opaque:
        value = args[i] if i < n else kwargs.get(name)
        culprit = _hidden(value, immutable)
        if culprit is not None:
            raise _BypassDispatchCache(_reasons.opaque_argument(culprit.__qualname__))


def _hidden(value: object, immutable: frozenset[type]) -> type | None:
    """The type of the first value in ``value`` whose content the key cannot see, or None."""
    tp = type(value)
    if tp in _VISIBLE_TYPES or isinstance(value, (torch.Tensor, *_SYMBOLIC)):
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
            raise _BypassDispatchCache(_reasons.NAN)
        if value == 0.0 and math.copysign(1.0, value) < 0:
            out.append(("-0.0", path))
    elif isinstance(value, complex):
        for part, x in (("real", value.real), ("imag", value.imag)):
            if x != x:
                raise _BypassDispatchCache(_reasons.NAN)
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
    """Extends ``key`` (Note [A key that sees what a fake kernel can see]); bypasses for NaN or a ``.grad``."""
    # On every backend hit, plain_args decides the common case in one walk; the rest, and all
    # without C++, take the full pass (Note [The common case of the key extension], csrc/keyparts.cpp).
    if _plain_args is not None and _plain_args(args, kwargs):
        return key
    return _extend_key(key, slots, state, args, kwargs)


def _extend_key(
    key: _DispatchCacheKey,
    slots: ArgSlots,
    state: _CacheKeyState,
    args: Sequence[object],
    kwargs: Mapping[str, object],
) -> _DispatchCacheKey:
    """The full pass of :func:`extend_key`; view bases go through ``state``, so their symbols count."""
    marks: list[object] = []
    for where, value in _values(slots.floats, args, kwargs):
        if type(value) is not float or value == 0.0 or value != value:
            _float_marks(value, (where,), marks)
    tensors: list[torch.Tensor] = []
    for _, value in _values(slots.tensors, args, kwargs):
        _tensors(value, tensors)
    views: list[int] = []
    for i, t in enumerate(tensors):
        if t._is_view():
            views.append(i)
        # torch's key omits is_leaf and .grad (rare in export: a bypass). Reading a non-leaf's .grad
        # warns; it has one only after retain_grad().
        if t.is_leaf:
            if t._grad is not None:
                raise _BypassDispatchCache(_reasons.GRAD)
        else:
            marks.append(("non-leaf", i))
            if t.retains_grad and t._grad is not None:
                raise _BypassDispatchCache(_reasons.GRAD)
    if len(tensors) > 1:
        storage_ids = [storage_id(t) for t in tensors]
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
        # Its autograd state too: the argument's own .grad bypasses, its base's may be read as well.
        # Reading a non-leaf's .grad warns; it has one only after retain_grad().
        grad = (base.is_leaf or base.retains_grad) and base._grad is not None
        values.append(("view of", i, is_arg, base.dtype, base.dim(), base.requires_grad, grad))
        for v in (*base.shape, *base.stride(), base.storage_offset()):
            if isinstance(v, torch.SymInt):
                state.convert_sym_int(values, v)
            else:
                values.append(v)
    return _DispatchCacheKey(tuple(values))
