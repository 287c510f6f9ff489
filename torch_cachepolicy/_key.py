"""torch's FakeTensor dispatch cache key, built cheaply for the common case.

``FakeTensorMode._cache_key`` turns each FakeTensor argument into
``extract_tensor_metadata(t)`` (a dozen property reads and torch's Python
``suggest_memory_format``) and each int through about ten ``isinstance``
tests: a hit's largest single cost. :func:`cache_key` returns a key *equal* to
torch's (same tuple, same hash, the same objects where torch puts objects),
built by ``_C.KeyBuilder`` from the TensorImpl for the common case
(Note [What the key builder reproduces], Note [Symbolic keys] in ``csrc/keybuilder.cpp``),
and torch's ``_cache_key`` for everything else, counted by reason in the
mode's ``KeyStats``. ``TORCH_CACHEPOLICY_SELF_CHECK=1`` at import compares
every built key with torch's, for a torch the tests have not seen.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import SymBool, SymFloat, SymInt
from torch._subclasses import fake_tensor as _ft
from torch._subclasses._fake_tensor_utils import _CacheKeyState, _InputBackref, _PySymInputStub
from torch._subclasses.fake_tensor import FakeTensor, _BypassDispatchCache, _DispatchCacheKey
from torch.fx.experimental.proxy_tensor import get_proxy_mode

from torch_cachepolicy import _native
from torch_cachepolicy._compat import SYMBOLIC_KEYS, SYMBOLIC_MEMORY_FORMAT_GUARDS
from torch_cachepolicy.report import KeyStats

# Exact types of the values the builder encodes as torch does, (type(value),
# value): none is a tensor, symbolic, a container or a callable, so torch's
# _prep_args_for_hash sends them all to its final branch.
PLAIN_TYPES: frozenset[type] = frozenset(
    {int, float, bool, complex, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format}
)

# Whether every built key (and every synthesized hit, _synth) is compared with torch's.
SELF_CHECK_ENV = "TORCH_CACHEPOLICY_SELF_CHECK"
SELF_CHECK: bool = os.environ.get(SELF_CHECK_ENV, "") not in ("", "0")
# The fallback reason of every key when torch_cachepolicy._C is not loaded (or a changed internal switched it off).
NO_BUILDER = "no C++ key builder"


def torch_key_of(value: object) -> object:
    """What torch's key holds for the plain ``value`` after its type, read off torch's own code; None if that is
    not one value."""
    out: list[object] = []
    # (tuple, "length_1", then what it makes of the value); the branch for a plain value reads neither the mode nor
    # the state.
    _ft.FakeTensorMode._prep_args_for_hash(None, out, (value,), None, [])  # type: ignore[arg-type]
    return out[3] if len(out) == 4 and out[2] is type(value) else None


def _keyed_as_given(value: object) -> bool:
    try:
        keyed = torch_key_of(value)
    except Exception:
        return False
    return type(keyed) is type(value) and str(keyed) == str(value)


# Plain types whose values torch's key transforms (torch 2.15 keys an index-less device as its resolved index):
# the builder asks torch_key_of, that is torch, for each such argument.
TORCH_KEYED_TYPES: frozenset[type] = frozenset(
    t for t, probe in ((torch.device, torch.device("cuda")),) if not _keyed_as_given(probe)
)


def _make_builder() -> Any:
    key_builder = _native.function("KeyBuilder")
    if key_builder is None:
        return None
    return key_builder(
        {
            "fake_type": FakeTensor,
            "size_type": torch.Size,
            "plain_types": PLAIN_TYPES,
            "torch_keyed_types": TORCH_KEYED_TYPES,
            "torch_key_of": torch_key_of,
            "sym_types": (SymInt, SymBool, SymFloat),
            "strided": torch.strided,
            "contiguous_format": torch.contiguous_format,
            "channels_last": torch.channels_last,
            "channels_last_3d": torch.channels_last_3d,
            "symint_type": SymInt,
            "stub_type": _PySymInputStub,
            "backref_type": _InputBackref,
            # What extract_tensor_metadata calls for a symbolic tensor's memory
            # format, for its guards (Note [Symbolic keys]); None where it calls nothing.
            "suggest_memory_format": getattr(_ft, "suggest_memory_format") if SYMBOLIC_MEMORY_FORMAT_GUARDS else None,  # noqa: B009
        }
    )


_builder = _make_builder()


def key_prefix(mode: _ft.FakeTensorMode, func: object) -> tuple[object, ...]:
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
    mode: _ft.FakeTensorMode,
    state: _CacheKeyState,
    func: Any,
    args: Sequence[object],
    kwargs: Mapping[str, object],
    stats: KeyStats,
) -> _DispatchCacheKey:
    """A key equal to ``mode._cache_key(state, func, args, kwargs)``.

    Raises:
        _BypassDispatchCache: as ``_cache_key`` does, for the calls left to it.
    """
    if _builder is None:
        reason = NO_BUILDER
    elif state.known_symbols or state.sym_node_lookup:
        # _cache_key adds the epoch for a state that has seen symbols already.
        reason = "state with symbols"
    else:
        built = _builder.build(mode, key_prefix(mode, func), args, kwargs, state if SYMBOLIC_KEYS else None)
        if type(built) is tuple:
            key = _DispatchCacheKey(built)
            if SELF_CHECK:
                _check_against_torch(key, mode, state, func, args, kwargs)
            stats.built += 1
            return key
        reason = built
    stats.fall_back(reason)
    return mode._cache_key(state, func, args, kwargs)


def _check_against_torch(
    key: _DispatchCacheKey,
    mode: _ft.FakeTensorMode,
    state: _CacheKeyState,
    func: Any,
    args: Sequence[object],
    kwargs: Mapping[str, object],
) -> None:
    fresh = _CacheKeyState(mode.shape_env)
    try:
        expected: Any = mode._cache_key(fresh, func, args, kwargs)
    except _BypassDispatchCache:
        expected = None  # torch bypasses a call the builder keyed
    same_state = (fresh.sym_node_lookup, fresh.known_symbols, fresh.shape_env) == (
        state.sym_node_lookup,
        state.known_symbols,
        state.shape_env,
    )
    same = expected is not None and expected == key and hash(expected) == hash(key) and same_state
    # By type too: 1, 1.0 and True are equal, but a kernel tells them apart.
    if not same or list(map(type, expected.key)) != list(map(type, key.key)):
        raise RuntimeError(
            f"torch_cachepolicy ({SELF_CHECK_ENV}=1): the key built for {func} differs from "
            f"FakeTensorMode._cache_key's on torch {torch.__version__}; unset {SELF_CHECK_ENV} and install the "
            "package with USE_CPP=0 to use torch's keys, and please report this with your torch version"
        )
