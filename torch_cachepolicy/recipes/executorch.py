"""The cache policy for ExecuTorch's Arm lowering (TOSA, Ethos-U, Cortex-M).

Example::

    from executorch.exir import to_edge_transform_and_lower
    from torch_cachepolicy import adopt
    from torch_cachepolicy.recipes.executorch import executorch_policy

    policy = executorch_policy()  # once per process, for every lowering
    mode = adopt(ep, cache_policy=policy)  # once per exported program, before lowering
    edge = to_edge_transform_and_lower(ep, partitioner=[...])
    print(mode.cache_report().by_namespace())

Importing this module does not import ExecuTorch: :func:`tosa_context_key` does, on the first ``tosa`` dispatch.
Written against ExecuTorch 1.5.1; see ``docs/executorch.md``.
"""

from __future__ import annotations

import contextvars
import functools
import weakref
from typing import Any

from torch_cachepolicy.policy import CachePolicy

__all__ = ["EXECUTORCH_NAMESPACES", "TOSA_CONTEXT_NAMESPACES", "executorch_policy", "tosa_context_key"]

EXECUTORCH_NAMESPACES: tuple[str, ...] = ("quantized_decomposed", "tosa", "dim_order_ops", "cortex_m")
"""The backend namespaces ExecuTorch PR 21700 makes cacheable."""

TOSA_CONTEXT_NAMESPACES: tuple[str, ...] = ("tosa",)
"""The namespaces whose fake kernels read the active TOSA specification."""


@functools.cache
def _tosa_context_vars() -> tuple[contextvars.ContextVar[Any], contextvars.ContextVar[Any]]:
    # Resolved once: a cached ContextVar read beats re-running the import on every tosa dispatch.
    try:
        from executorch.backends.arm.tosa.specification import TosaLoweringContext
    except ImportError as e:
        raise ImportError(
            "torch_cachepolicy.recipes.executorch.tosa_context_key(): ExecuTorch's Arm backend "
            f"(executorch.backends.arm) cannot be imported ({e}); install ExecuTorch "
            "(pip install --no-deps -r requirements-executorch.txt) or give CachePolicy your own context_key"
        ) from e
    return TosaLoweringContext.tosa_spec_var, TosaLoweringContext.shape_env_var


def tosa_context_key() -> tuple[str, object] | None:
    """What TOSA fake kernels read of the active ``TosaLoweringContext``, for :class:`CachePolicy`'s ``context_key``.

    ``(str(spec), ShapeEnv)``: ``str(spec)`` since spec equality ignores extensions (``TOSA-1.0+INT+u55`` equals
    ``TOSA-1.0+INT``), and the context's ShapeEnv (some kernels make symbols in it) as a weak reference, so that an
    entry never keeps it alive nor serves another one. ``None`` outside a lowering context.

    Raises:
        ImportError: ExecuTorch's Arm backend is not installed.
    """
    spec_var, shape_env_var = _tosa_context_vars()
    spec = spec_var.get(None)
    if spec is None:
        return None
    shape_env = shape_env_var.get(None)
    return (str(spec), None if shape_env is None else weakref.ref(shape_env))


def executorch_policy() -> CachePolicy:
    """The policy for ExecuTorch's Arm flow: :data:`EXECUTORCH_NAMESPACES`, keyed by :func:`tosa_context_key`
    for ``tosa`` ops, the only ones whose fake kernels read the spec.

    Calls give equal identities (a shared store shares entries), but reuse one: decisions are memoized per object.
    """
    return CachePolicy(
        namespaces=list(EXECUTORCH_NAMESPACES),
        context_key=tosa_context_key,
        context_namespaces=list(TOSA_CONTEXT_NAMESPACES),
    )
