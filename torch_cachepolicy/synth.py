"""The output of a cache hit, built without dispatch when the entry is plain.

torch builds a hit's output in ``FakeTensorMode._output_from_cache_entry``:
for each output, ``torch.empty_strided(..., device="meta")`` inside
``in_kernel_invocation_manager``, then ``FakeTensor(mode, meta, device)``.
After the key, that is a hit's largest cost, and most of it is the context
manager and the dispatch, not the tensor.

:func:`output_plan` reads an entry once and says whether every output of it
is *plain*: a tensor with static sizes and strides, strided, neither conj nor
neg, not a view or in-place alias of an input (or a constant int, bool or
``None``). For such an entry :func:`build` makes each meta tensor with
``torch_cachepolicy._C.meta_empty_strided`` (Note [Building a hit's meta
tensor without dispatch] in ``csrc/synth.cpp``) and the FakeTensor with
torch's own constructor. Anything else (symbolic sizes, views, in-place ops,
conj/neg bits, other layouts, SymInt constants) goes to torch's path, as does
everything without the C++ extension.

Every entry is verified on the miss that creates it against the output this
module builds (the mode's ``_output_from_cache_entry`` is the one path for
hits and verification). Entries a stock mode wrote to torch's shared storage
were never verified by us, so the first plain hits of each process are also
compared with torch's own synthesis (:func:`checked_build`); a difference
turns this module off for the process, with a warning.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any, TypeAlias, cast

import torch
from torch._subclasses.fake_tensor import FakeTensor, _DispatchCacheEntryOutputInfo, _DispatchCacheValidEntry

from torch_cachepolicy import keyset

__all__ = ["Plan", "available", "build", "checked_build", "output_plan"]

# One output: (shape, stride, dtype, device, requires_grad) for a tensor, or
# (constant,) for an int, bool or None.
_Step: TypeAlias = "tuple[tuple[int, ...], tuple[int, ...], torch.dtype, torch.device, bool] | tuple[object]"
Plan: TypeAlias = "tuple[bool, tuple[_Step, ...]]"
"""``(is_output_tuple, steps)``: how :func:`build` rebuilds an entry's output."""

_meta_empty_strided = getattr(keyset._ext, "meta_empty_strided", None)

_CONSTANT_TYPES = (int, bool, type(None))


def available() -> bool:
    """Whether hits of plain entries are built by the C++ helper."""
    return _meta_empty_strided is not None


def _ints(values: object) -> bool:
    return type(values) is tuple and all(type(v) is int for v in values)


def _step(info: _DispatchCacheEntryOutputInfo) -> _Step | None:
    if info.inplace_idx is not None or info.view_idx is not None:
        return None
    m = info.metadata
    if m is None:
        value = info.constant_value
        return (value,) if type(value) in _CONSTANT_TYPES else None
    if (
        m.layout is not torch.strided
        or m.is_conj
        or m.is_neg
        or m.is_sparse
        or m.is_quantized
        or not _ints(m.shape)
        or not _ints(m.stride)
        or type(m.dtype) is not torch.dtype
        or type(m.device) is not torch.device
    ):
        return None
    # _ints checked every element: the stubs the type allows are absent.
    return (cast(tuple[int, ...], m.shape), cast(tuple[int, ...], m.stride), m.dtype, m.device, bool(m.requires_grad))


def output_plan(entry: _DispatchCacheValidEntry) -> Plan | None:
    """How :func:`build` rebuilds ``entry``'s output, or ``None`` if it cannot."""
    if _meta_empty_strided is None:
        return None
    steps = []
    for info in entry.output_infos:
        step = _step(info)
        if step is None:
            return None
        steps.append(step)
    if not entry.is_output_tuple and len(steps) != 1:
        return None
    return bool(entry.is_output_tuple), tuple(steps)


def build(mode: Any, plan: Plan) -> object:
    """The output of a hit on an entry with this plan, made for ``mode``."""
    is_tuple, steps = plan
    meta_empty_strided = _meta_empty_strided
    assert meta_empty_strided is not None  # a plan exists only with the extension
    outputs = [
        step[0]
        if len(step) == 1
        else FakeTensor(mode, meta_empty_strided(step[0], step[1], step[2], step[4]), step[3])  # type: ignore[misc]
        for step in steps
    ]
    return tuple(outputs) if is_tuple else outputs[0]


class _Canary:
    """Compares the first plain hits of the process with torch's synthesis."""

    def __init__(self, checks: int = 8) -> None:
        self.remaining = checks


_canary = _Canary()


def checked_build(
    mode: Any, plan: Plan, torch_build: Callable[[], object], args: Sequence[object]
) -> object:
    """:func:`build`, compared with ``torch_build()`` while the canary lasts.

    A difference (a torch release that synthesizes outputs differently)
    switches the fast path off for the process, warns, and returns torch's
    output: correct, only slower.
    """
    ours = build(mode, plan)
    if _canary.remaining <= 0:
        return ours
    from torch_cachepolicy.safety import describe, first_difference

    theirs = torch_build()
    diff = first_difference(describe(ours, args, {}), describe(theirs, args, {}))
    if diff is None:
        _canary.remaining -= 1
        return ours
    global _meta_empty_strided
    _meta_empty_strided = None
    _canary.remaining = 0
    warnings.warn(
        f"torch_cachepolicy.synth: a cache hit built without dispatch differs from torch's "
        f"_output_from_cache_entry on torch {torch.__version__} ({diff}); every hit of this "
        "process now uses torch's synthesis (correct, only slower). Please report this with "
        "your torch version.",
        stacklevel=2,
    )
    return theirs
