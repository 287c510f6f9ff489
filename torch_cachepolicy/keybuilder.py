"""torch's FakeTensor dispatch cache key, built cheaply for the common case.

A cache hit's largest single cost is the key: ``FakeTensorMode._cache_key``
flattens every argument with ``_prep_args_for_hash``, turning each FakeTensor
into ``extract_tensor_metadata(t)`` (a dozen property reads and method calls
on a Tensor subclass, and torch's Python ``suggest_memory_format``), and each
int of a shape or stride through a chain of about ten ``isinstance`` tests.

:func:`cache_key` returns a key **equal** to ``mode._cache_key(state, func,
args, kwargs)`` (the same tuple: equal, same hash, the same objects where
torch puts objects), so entries stay shared with torch's storage and every
other part of the cache is unchanged (Note [What the key builder reproduces]
in ``csrc/keybuilder.cpp``). It handles exact FakeTensors of the mode with
strided, not quantized, without a constant, their sizes static or symbolic;
SymInt arguments; list/tuple/dict containers; and scalars of the types in
:data:`PLAIN_TYPES`. A symbolic key updates the call's ``_CacheKeyState``
as torch's would (Note [Symbolic keys] in ``csrc/keybuilder.cpp``). For
anything else (tensor subclasses, sparse, nested, quantized, constants,
SymBool/SymFloat, other argument types) it calls torch's ``_cache_key``,
which raises the bypass or builds the key torch builds, and counts the
fallback by reason in a :class:`KeyStats`
(``FakeTensorMode.cache_key_stats()``).

The builder is ``torch_cachepolicy._C.KeyBuilder`` (``csrc/keybuilder.cpp``,
reads the TensorImpl). Without the extension (``USE_CPP=0``, an import error,
``TORCH_CACHEPOLICY_FORCE_PYTHON=1``) :func:`build_python` builds the same
tuple in Python through cheaper reads than torch's; ``test/test_keybuilder.py``
holds both to torch's key.
"""

from __future__ import annotations

import dis
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import SymBool, SymFloat, SymInt
from torch._subclasses import fake_tensor as _ft
from torch._subclasses._fake_tensor_utils import _CacheKeyState, _InputBackref, _PySymInputStub
from torch._subclasses.fake_tensor import FakeTensor, _DispatchCacheKey
from torch.fx.experimental.proxy_tensor import get_proxy_mode

from torch_cachepolicy import native

__all__ = [
    "PLAIN_TYPES",
    "SYMBOLIC_KEYS",
    "KeyStats",
    "backend",
    "build_python",
    "cache_key",
    "key_prefix",
    "native_builder",
    "settled",
]

PLAIN_TYPES: frozenset[type] = frozenset(
    {
        int,
        float,
        bool,
        complex,
        str,
        type(None),
        torch.dtype,
        torch.device,
        torch.layout,
        torch.memory_format,
    }
)
"""Exact types of the non-tensor values the builder encodes itself, as torch
does: ``(type(value), value)``. None of them is a tensor, a symbolic value, a
container or a callable, so torch's ``_prep_args_for_hash`` sends them all to
its final branch."""

_SYM_TYPES = (SymInt, SymBool, SymFloat)


def _symbolic_memory_format() -> tuple[bool, Callable[[Any], object] | None]:
    """Whether keys with symbolic sizes can be built, and the function to call for their memory format.

    torch's ``extract_tensor_metadata`` drops the memory format of a tensor
    with symbolic sizes; torch 2.13 computes it first (``suggest_memory_format``
    may guard on symbolic strides), torch 2.14 does not. Which one this torch
    does is read from the function's code: the first use of
    ``suggest_memory_format`` before or after that of
    ``_has_symbolic_sizes_strides``. Code that reads neither keeps symbolic
    keys with torch.
    """
    order = [
        ins.argval
        for ins in dis.get_instructions(_ft.extract_tensor_metadata)
        if ins.argval in ("suggest_memory_format", "_has_symbolic_sizes_strides")
    ]
    if "suggest_memory_format" not in order or "_has_symbolic_sizes_strides" not in order:
        return False, None
    computed_first = order.index("suggest_memory_format") < order.index("_has_symbolic_sizes_strides")
    # The function extract_tensor_metadata calls: the name in its module.
    return True, (getattr(_ft, "suggest_memory_format") if computed_first else None)  # noqa: B009


SYMBOLIC_KEYS, _SUGGEST_FOR_SYMBOLIC = _symbolic_memory_format()
"""Whether the builders build keys with symbolic values (this torch's extract_tensor_metadata is a known one)."""


class KeyStats:
    """How many keys one mode built itself, and why it left the others to torch.

    Attributes:
        built: keys the builder produced.
        fallbacks: ``{reason: count}`` of the keys torch's ``_cache_key``
            built (or refused with a bypass) instead.
    """

    __slots__ = ("built", "fallbacks")

    def __init__(self) -> None:
        self.built = 0
        self.fallbacks: dict[str, int] = {}

    @property
    def handled_share(self) -> float:
        """The share of keys the builder produced (1.0 with no keys yet)."""
        total = self.built + sum(self.fallbacks.values())
        return self.built / total if total else 1.0

    def __repr__(self) -> str:
        return f"KeyStats(built={self.built}, fallbacks={dict(sorted(self.fallbacks.items()))})"


def _make_cpp_builder() -> Any:
    key_builder = native.function("KeyBuilder")
    if key_builder is None:
        return None
    return key_builder(
        FakeTensor,
        torch.Size,
        PLAIN_TYPES,
        _SYM_TYPES,
        torch.strided,
        torch.contiguous_format,
        torch.channels_last,
        torch.channels_last_3d,
        SymInt,
        _PySymInputStub,
        _InputBackref,
        _SUGGEST_FOR_SYMBOLIC,
    )


_cpp = _make_cpp_builder()


def backend() -> str:
    """``"cpp"`` when ``torch_cachepolicy._C.KeyBuilder`` builds keys, ``"python"`` otherwise."""
    return "python" if _cpp is None else "cpp"


def native_builder() -> Any:
    """The ``_C.KeyBuilder`` this module builds keys with, or None (the Python builder)."""
    return _cpp


def settled() -> bool:
    """Whether a static key may be built natively with no comparison against ``_cache_key``.

    True once the canary has seen a static key agree (and has not turned the
    builder off); ``hitpath`` asks before every native hit.
    """
    return not _canary.pending and not _canary.disabled and _cpp is not None


def key_prefix(mode: Any, func: object) -> tuple[object, ...]:
    """The values ``_cache_key`` puts before the arguments (for a fresh state)."""
    return (
        func,
        torch.get_default_dtype(),
        torch._C._get_default_device(),
        torch.is_inference_mode_enabled(),
        mode.shape_env.settings if mode.shape_env else None,
        get_proxy_mode() is not None,
    )


def cache_key(
    mode: Any,
    state: _CacheKeyState,
    func: object,
    args: Sequence[object],
    kwargs: Mapping[str, object],
    stats: KeyStats,
) -> _DispatchCacheKey:
    """A key equal to ``mode._cache_key(state, func, args, kwargs)``.

    Raises:
        _BypassDispatchCache: as ``_cache_key`` does, for the calls left to it.
    """
    reason: str
    if _canary.disabled:
        reason = _canary.disabled
    elif state.known_symbols or state.sym_node_lookup:
        # _cache_key adds the epoch for a state that has seen symbols already.
        reason = "state with symbols"
    else:
        prefix = key_prefix(mode, func)
        scratch = state if SYMBOLIC_KEYS else None
        built: tuple[object, ...] | str = (
            build_python(mode, prefix, args, kwargs, scratch)
            if _cpp is None
            else _cpp.build(mode, prefix, args, kwargs, scratch)
        )
        if type(built) is tuple:
            key = _DispatchCacheKey(built)
            if _canary.pending or (_canary.pending_symbolic and state.sym_node_lookup):
                return _canary.check(key, mode, state, func, args, kwargs, stats)
            stats.built += 1
            return key
        reason = built  # type: ignore[assignment]
    fallbacks = stats.fallbacks
    fallbacks[reason] = fallbacks.get(reason, 0) + 1
    return mode._cache_key(state, func, args, kwargs)


class _Canary:
    """Compares the first keys built in this process with torch's own.

    Note [A builder that follows torch]
    The builder mirrors private torch code (_prep_args_for_hash,
    extract_tensor_metadata); a torch release that changes either must not
    silently split the cache or, worse, merge keys torch keeps apart. The
    tests hold the builder to torch's key on the supported releases; in the
    field, the first keys built are also checked against ``_cache_key``
    (until one with a tensor, and one with a symbol, agree; for the latter
    also the state torch's key leaves), and a disagreement turns the
    builder off for the process, with a warning: every key is then torch's.
    """

    def __init__(self) -> None:
        self.pending = True
        self.pending_symbolic = True
        self.disabled = ""

    def check(
        self,
        key: _DispatchCacheKey,
        mode: Any,
        state: _CacheKeyState,
        func: object,
        args: Sequence[object],
        kwargs: Mapping[str, object],
        stats: KeyStats,
    ) -> _DispatchCacheKey:
        fresh = _CacheKeyState(mode.shape_env)
        expected = mode._cache_key(fresh, func, args, kwargs)
        if (
            expected == key
            and hash(expected) == hash(key)
            and fresh.sym_node_lookup == state.sym_node_lookup
            and fresh.known_symbols == state.known_symbols
            and fresh.shape_env is state.shape_env
        ):
            stats.built += 1
            if torch.Size in key.key:
                self.pending = False
            if state.sym_node_lookup:
                self.pending_symbolic = False
            return key
        self.pending = self.pending_symbolic = False
        self.disabled = "key builder disagrees with this torch"
        warnings.warn(
            f"torch_cachepolicy.keybuilder: the key built for {func} differs from "
            f"FakeTensorMode._cache_key's on torch {torch.__version__}; using torch's "
            "_cache_key for every key of this process (correct, only slower). "
            "Please report this with your torch version.",
            stacklevel=4,
        )
        stats.fallbacks[self.disabled] = stats.fallbacks.get(self.disabled, 0) + 1
        # The call goes on with torch's key, so with the state torch left.
        state.sym_node_lookup, state.known_symbols, state.shape_env = (
            fresh.sym_node_lookup,
            fresh.known_symbols,
            fresh.shape_env,
        )
        return expected


_canary = _Canary()


# ------------------------------------------------------ the Python builder

_LENGTHS = tuple(f"length_{n}" for n in range(64))


def _length(n: int) -> str:
    return _LENGTHS[n] if n < 64 else f"length_{n}"


class _SymNodes:
    """The SymNodes of one key by first position, until the key is built (Note [Symbolic keys])."""

    __slots__ = ("index", "order")

    def __init__(self) -> None:
        self.index: dict[int, int] = {}
        # (node, position, its free symbols when reached); holding the node
        # keeps its id unique meanwhile.
        self.order: list[tuple[Any, int, Any]] = []


def build_python(
    mode: Any,
    prefix: tuple[object, ...],
    args: object,
    kwargs: object,
    state: _CacheKeyState | None = None,
) -> tuple[object, ...] | str:
    """``_C.KeyBuilder.build`` in Python: the key tuple, or the reason to fall back.

    With ``state`` (a fresh ``_CacheKeyState``), symbolic values are handled
    too and, once the key is built, recorded in ``state`` as torch's
    ``convert_sym_int`` records them.
    """
    if mode.in_kernel_invocation:
        return "in kernel invocation"
    out = list(prefix)
    syms = None if state is None else _SymNodes()
    if args:
        reason = _container(mode, args, out, syms)
        if reason is not None:
            return reason
    if kwargs:
        reason = _container(mode, kwargs, out, syms)
        if reason is not None:
            return reason
    if syms is not None and syms.order:
        assert state is not None
        for node, position, symbols in syms.order:
            state.sym_node_lookup[id(node)] = position
            state.known_symbols.update(symbols)
        if state.shape_env is None:
            state.shape_env = syms.order[0][0].shape_env
    return tuple(out)


def _sym_int(value: SymInt, out: list[object], syms: _SymNodes) -> None:
    node = value.node
    first = syms.index.get(id(node))
    if first is None:
        syms.index[id(node)] = len(out)
        # Its free symbols now, as convert_sym_int reads them: a later
        # tensor's memory-format guard may replace one of them.
        syms.order.append((node, len(out), node.expr.free_symbols))
        out.append(_PySymInputStub(value))
    else:
        out.append(_InputBackref(first))


def _container(mode: Any, c: Any, out: list[object], syms: _SymNodes | None) -> str | None:
    tp = type(c)
    if isinstance(c, dict):
        if tp is not dict:
            return "dict subclass argument"
        out.append(tp)
        out.append(_length(len(c)))
        for item in (*c.keys(), *c.values()):
            reason = _arg(mode, item, out, syms)
            if reason is not None:
                return reason
        return None
    base = list if isinstance(c, list) else tuple
    if tp is not base and tp.__iter__ is not base.__iter__:
        return "container subclass argument"
    out.append(tp)
    out.append(_length(len(c)))
    for item in c:
        reason = _arg(mode, item, out, syms)
        if reason is not None:
            return reason
    return None


def _arg(mode: Any, a: object, out: list[object], syms: _SymNodes | None) -> str | None:
    tp = type(a)
    if tp is FakeTensor:
        return _fake_tensor(mode, a, out, syms)  # type: ignore[arg-type]
    if tp is SymInt and syms is not None:
        _sym_int(a, out, syms)  # type: ignore[arg-type]
        return None
    if isinstance(a, torch.Tensor):
        return "FakeTensor subclass argument" if isinstance(a, FakeTensor) else "non-fake tensor argument"
    if tp in PLAIN_TYPES:
        out.append(tp)
        out.append(a)
        return None
    if isinstance(a, (list, tuple, dict)):
        return _container(mode, a, out, syms)
    return "symbolic argument" if isinstance(a, _SYM_TYPES) else "argument of another type"


def _fake_tensor(mode: Any, t: FakeTensor, out: list[object], syms: _SymNodes | None) -> str | None:
    if t.fake_mode is not mode:
        return "fake tensor of another mode"
    if t.constant is not None:
        return "fake tensor with a constant"
    symbolic = t._has_symbolic_sizes_strides
    if symbolic and syms is None:
        return "symbolic sizes"
    if t.layout is not torch.strided:
        return "layout other than strided"
    if t.is_nested:
        return "nested tensor"
    if t.is_quantized:
        return "quantized tensor"
    nbytes = t.untyped_storage().nbytes()
    if type(nbytes) is not int and syms is None:
        return "symbolic storage size"
    shape = t.shape
    stride = t.stride()
    n = len(shape)
    length = _length(n)
    out.append(t.dtype)
    out.append(torch.Size)
    out.append(length)
    s: Any
    for part, sizes in enumerate((shape, stride)):
        for s in sizes:
            if type(s) is int:
                out.append(int)
                out.append(s)
            elif type(s) is SymInt and syms is not None:
                _sym_int(s, out, syms)
            else:
                return "symbolic size of another type"
        if part == 0:
            out.append(tuple)
            out.append(length)
    out.append(t._fake_device)
    out.append(torch.strided)
    if symbolic:
        if n in (4, 5) and _SUGGEST_FOR_SYMBOLIC is not None:
            _SUGGEST_FOR_SYMBOLIC(t)  # for its guards; see Note [Symbolic keys]
        out.append(None)
    else:
        if n in (4, 5) and _channels_last_like(shape, stride):
            fmt = torch.channels_last if n == 4 else torch.channels_last_3d
        else:
            fmt = torch.contiguous_format
        out.append(fmt if t.is_contiguous(memory_format=fmt) else None)
    for value in (t.storage_offset(), nbytes):
        if type(value) is int:
            out.append(value)
        elif type(value) is SymInt and syms is not None:
            _sym_int(value, out, syms)
        else:
            return "symbolic size of another type"
    out.append(t.requires_grad)
    out.append(False)  # is_quantized
    out.append(t.is_conj())
    out.append(t.is_neg())
    out.append(t.is_inference())
    out.extend(_SPARSE_FIELDS)
    return None


# is_sparse, is_coalesced, dense_dim, sparse_dim of a strided tensor.
_SPARSE_FIELDS = (False, None, None, None)


def _channels_last_like(shape: Sequence[int], strides: Sequence[int]) -> bool:
    # torch._prims_common.are_strides_like_channels_last_or_false on static
    # sizes, where guard_or_true(b) is b.
    if strides[1] == 0:
        return False
    order = (1, 3, 2, 0) if len(shape) == 4 else (1, 4, 3, 2, 0)
    low = 0
    for d in order:
        if shape[d] == 0 or strides[d] < low:
            return False
        if d == 0 and low == strides[1]:
            return False
        low = strides[d] * shape[d]
    return True
