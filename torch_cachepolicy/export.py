"""``export``: ``torch.export.export`` traced under a policy ``FakeTensorMode``.

Non-strict ``torch.export.export`` creates its mode in ``make_fake_inputs`` unless a ``torch._guards.TracingContext``
is active: :func:`export` runs it in a context holding a policy mode configured as that one would be.

Example::

    ep = torch_cachepolicy.export(model, args, cache_policy=CachePolicy(namespaces=["quantized_decomposed"]))
    mode = torch_cachepolicy.adopt(ep)  # the program's mode; moves nothing
    ep = ep.run_decompositions()  # dispatches through `mode`
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Mapping
from typing import Any

import torch
import torch._export.config as _export_config
from torch._guards import TracingContext, detect_fake_mode, tracing
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.export import ExportedProgram
from torch.export._trace import _is_bogus_const_name
from torch.fx.experimental.symbolic_shapes import ShapeEnv

from torch_cachepolicy._arguments import check_cache_arguments, check_feature
from torch_cachepolicy._compat import Feature
from torch_cachepolicy._fakes import is_fake_tensor
from torch_cachepolicy.mode import FakeTensorMode
from torch_cachepolicy.policy import CachePolicy
from torch_cachepolicy.store import CacheStore

__all__ = ["export"]

_API = "torch_cachepolicy.export(...)"

# torch.export.export's keyword-only arguments, read from the installed torch so new ones pass through.
_EXPORT_KEYWORDS = frozenset(
    name
    for name, p in inspect.signature(torch.export.export).parameters.items()
    if p.kind is inspect.Parameter.KEYWORD_ONLY
)


def export(
    mod: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any] | None = None,
    *,
    cache_policy: CachePolicy | None = None,
    cache_store: CacheStore | None = None,
    cache_crosscheck: bool | None = None,
    **export_kwargs: Any,
) -> ExportedProgram:
    """Exports ``mod`` as ``torch.export.export`` does, under a new policy mode.

    The mode has torch's settings for its own (a fresh ``ShapeEnv`` tracking fakes and trace asserts,
    ``allow_non_fake_inputs``, ``export=True``, no unsafe ``data_ptr``): export and later passes use ``cache_policy``.

    Args:
        mod, args, kwargs: as for ``torch.export.export``.
        cache_policy, cache_store, cache_crosscheck: as for :class:`FakeTensorMode`.
        **export_kwargs: more arguments of ``torch.export.export`` (``strict`` only as ``False``).

    Returns:
        The program ``torch.export.export`` returns, its fake values on the policy mode.

    Raises:
        TypeError: an argument has the wrong type or names no argument of ``torch.export.export``.
        ValueError: ``strict=True`` (Dynamo creates its own FakeTensorMode).
        RuntimeError: a ``torch._guards.TracingContext`` is active, or export lifted a FakeTensor
            constant under ``error_on_lifted_constant_tensors`` (as torch raises), or this torch changed an
            internal the function needs (Note [Checking torch's internals]).
    """
    check_feature(_API, Feature.EXPORT)
    check_cache_arguments("torch_cachepolicy.export", cache_policy, cache_store, cache_crosscheck)
    _check_export_arguments(export_kwargs)
    mode = _export_mode(
        mod,
        cache_policy=cache_policy,
        cache_store=cache_store,
        cache_crosscheck=cache_crosscheck,
        prefer_deferred_runtime_asserts_over_guards=bool(
            export_kwargs.get("prefer_deferred_runtime_asserts_over_guards", False)
        ),
    )
    # Note [Exporting under a TracingContext]
    # ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    # make_fake_inputs takes the TracingContext's fake mode instead of creating one; seeing it, export skips its check
    # for FakeTensor constants with made-up names ("lifted_tensor_0": an untraceable op), so _check_lifted_constants
    # runs it unless inputs hold FakeTensors (stock skips it then too). The context is thread-local; export nests one.
    with unset_fake_temporarily():  # as torch.export.export looks at them
        fake_inputs = detect_fake_mode((args, kwargs)) is not None
    with tracing(TracingContext(mode)):
        program = torch.export.export(mod, args, kwargs, **export_kwargs)
    if not fake_inputs:
        _check_lifted_constants(program)
    return program


def _check_export_arguments(export_kwargs: Mapping[str, Any]) -> None:
    """Raises for what :func:`export` cannot pass on to ``torch.export.export``, or cannot trace under a new mode."""
    unknown = sorted(set(export_kwargs) - _EXPORT_KEYWORDS)
    if unknown:
        raise TypeError(
            f"{_API}: unexpected keyword argument {unknown[0]!r}; besides cache_policy, cache_store and "
            f"cache_crosscheck it takes the keyword arguments of torch.export.export: "
            f"{', '.join(sorted(_EXPORT_KEYWORDS))}"
        )
    if export_kwargs.get("strict", False):
        raise ValueError(
            f"{_API}: strict=True traces with Dynamo, which creates its own FakeTensorMode for the "
            "inputs it fakifies, so the program would mix that mode with the policy mode. Pass "
            "strict=False (torch.export.export's default), or export with torch.export.export(..., "
            "strict=True) and move the program with torch_cachepolicy.adopt(program, cache_policy=...)"
        )
    if TracingContext.try_get() is not None:
        raise RuntimeError(
            f"{_API}: a torch._guards.TracingContext is already active (torch.compile, or an export, "
            "is tracing), and torch.export.export traces under that context's FakeTensorMode, not a "
            "new one. Call torch_cachepolicy.export outside of it, or call torch.export.export there "
            "and move the program with torch_cachepolicy.adopt(program, cache_policy=...)"
        )


def _export_mode(
    mod: torch.nn.Module,
    *,
    cache_policy: CachePolicy | None,
    cache_store: CacheStore | None,
    cache_crosscheck: bool | None,
    prefer_deferred_runtime_asserts_over_guards: bool,
) -> FakeTensorMode:
    """The mode torch.export's make_fake_inputs would create, with a policy."""
    shape_env = ShapeEnv(
        # make_fake_inputs refuses a mode whose ShapeEnv does not track fakes.
        tracked_fakes=[],
        co_fields=_co_fields(mod),
        prefer_deferred_runtime_asserts_over_guards=prefer_deferred_runtime_asserts_over_guards,
        trace_asserts=True,
    )
    mode = FakeTensorMode(
        cache_policy=cache_policy,
        cache_store=cache_store,
        cache_crosscheck=cache_crosscheck,
        shape_env=shape_env,
        allow_non_fake_inputs=True,
        export=True,
    )
    # As make_fake_inputs' fake_tensor_allow_unsafe_data_ptr_access=False patch, without touching torch's config.
    mode._allow_unsafe_data_ptr_access = False
    return mode


def _co_fields(mod: torch.nn.Module) -> dict[str, Any]:
    """Where ``mod.forward`` is defined, for the ShapeEnv's structured logs."""
    forward: Any = getattr(mod, "forward", None)
    forward = getattr(forward, "__func__", forward)  # a bound method, or a partial bound as one
    if isinstance(forward, functools.partial):
        forward = forward.func  # partial flattens nested partials itself
    code = getattr(forward, "__code__", None)
    if code is None:
        return {}  # not a module: torch.export.export raises its own error
    return {"co_name": code.co_name, "co_filename": code.co_filename, "co_firstlineno": code.co_firstlineno}


def _check_lifted_constants(program: ExportedProgram) -> None:
    """torch.export.export's check of lifted FakeTensor constants; see Note [Exporting under a TracingContext]."""
    for name, value in program.constants.items():
        if is_fake_tensor(value) and _is_bogus_const_name(name):
            message = (
                f"{_API}: We found a fake tensor in the exported program constant's list: {name}. "
                "Tracing met an op it cannot trace through (torch.export.export reports the same); "
                "look at that model attribute"
            )
            if _export_config.error_on_lifted_constant_tensors:
                raise RuntimeError(message)
            warnings.warn(message, stacklevel=3)
