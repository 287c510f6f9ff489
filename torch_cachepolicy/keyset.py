"""Dispatcher questions a cache policy asks about an operator.

This is the only module that talks to ``torch_cachepolicy._C``. When the
extension is missing (built with ``USE_CPP=0``, no compiler, an import error)
or ``TORCH_CACHEPOLICY_FORCE_PYTHON=1`` is set, the same answers come from
``torch._C._dispatch_has_kernel_for_dispatch_key`` one key at a time, and a
warning says why once.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from types import ModuleType

import torch
from torch._C import DispatchKey

__all__ = [
    "KEYS",
    "backend",
    "kernel_keys",
    "kernel_keys_many",
    "keys_from_mask",
]

# The keys a policy looks at, in bit order: bit ``i`` of a mask stands for
# ``KEYS[i]``. The C++ side receives this order from Python, so the two can
# never disagree about it.
KEYS: tuple[DispatchKey, ...] = (
    DispatchKey.CompositeImplicitAutograd,
    DispatchKey.CompositeExplicitAutograd,
    DispatchKey.CompositeExplicitAutogradNonFunctional,
    DispatchKey.Meta,
    DispatchKey.CPU,
    DispatchKey.CUDA,
    DispatchKey.Autograd,
    DispatchKey.AutogradCPU,
    DispatchKey.ADInplaceOrView,
    DispatchKey.Functionalize,
    DispatchKey.BackendSelect,
    DispatchKey.Python,
    DispatchKey.PrivateUse1,
)

_FORCE_ENV = "TORCH_CACHEPOLICY_FORCE_PYTHON"


def _load_extension() -> tuple[ModuleType | None, str]:
    if os.environ.get(_FORCE_ENV, "") not in ("", "0"):
        return None, f"{_FORCE_ENV} is set"
    try:
        from torch_cachepolicy import _C  # type: ignore[attr-defined]
    except ImportError as e:
        return None, f"torch_cachepolicy._C could not be imported ({e})"
    return _C, ""


_ext, _fallback_reason = _load_extension()
_warned = False


def backend() -> str:
    """Returns ``"cpp"`` when the C++ helper answers, ``"python"`` otherwise."""
    return "python" if _ext is None else "cpp"


def _warn_fallback_once() -> None:
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(
            "torch_cachepolicy.keyset: using the pure-Python dispatcher checks "
            f"because {_fallback_reason}; answers are the same, only slower. "
            "Rebuild with `pip install --no-build-isolation -e .` to get the C++ helper.",
            stacklevel=3,
        )


def _qualified_name(op: object) -> str:
    if isinstance(op, torch._ops.OpOverload):
        return op.name()
    if isinstance(op, str):
        return op
    raise TypeError(
        "torch_cachepolicy.keyset: expected an OpOverload or a 'ns::name.overload' "
        f"string, got {type(op).__name__}"
    )


def _python_mask(name: str) -> int:
    # Raises RuntimeError for unknown operators, like the C++ side.
    torch._C._dispatch_find_schema_or_throw(*_split(name))
    mask = 0
    for bit, key in enumerate(KEYS):
        if torch._C._dispatch_has_kernel_for_dispatch_key(name, key):
            mask |= 1 << bit
    return mask


def _split(name: str) -> tuple[str, str]:
    base, _, overload = name.partition(".")
    return base, overload


def keys_from_mask(mask: int) -> frozenset[DispatchKey]:
    """Turns a bitmask over :data:`KEYS` into a set of dispatch keys."""
    return frozenset(key for bit, key in enumerate(KEYS) if mask >> bit & 1)


def kernel_keys(op: torch._ops.OpOverload | str) -> frozenset[DispatchKey]:
    """The keys of :data:`KEYS` that have a kernel registered directly for ``op``.

    Args:
        op: an ``OpOverload`` or its qualified name, ``"aten::add.Tensor"``
            (``"aten::relu"`` for the default overload).

    Raises:
        TypeError: ``op`` is neither an ``OpOverload`` nor a string.
        ValueError: no such operator or overload is registered.
    """
    return kernel_keys_many([_qualified_name(op)])[0]


def kernel_keys_many(names: Sequence[str]) -> list[frozenset[DispatchKey]]:
    """Batched :func:`kernel_keys` for qualified operator names, in one call."""
    if isinstance(names, str) or not all(isinstance(n, str) for n in names):
        raise TypeError(
            "torch_cachepolicy.keyset.kernel_keys_many: expected a sequence of "
            "'ns::name.overload' strings"
        )
    try:
        if _ext is not None:
            # ``.value`` rather than ``int(k)``: torch's stub types DispatchKey
            # as a plain Enum, so mypy rejects int() though pybind allows it.
            masks = _ext.kernel_masks(list(names), [k.value for k in KEYS])
        else:
            _warn_fallback_once()
            masks = [_python_mask(n) for n in names]
    except RuntimeError as e:
        raise ValueError(f"torch_cachepolicy.keyset: {e}") from None
    return [keys_from_mask(m) for m in masks]
