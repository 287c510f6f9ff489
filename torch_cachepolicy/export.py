"""``export``: ``torch.export.export`` traced under a policy ``FakeTensorMode``.

``torch.export.export`` (non-strict) creates its FakeTensorMode in
``torch._export.non_strict_utils.make_fake_inputs``, unless a
``torch._guards.TracingContext`` is active: then it traces under that
context's mode. :func:`export` creates a :class:`FakeTensorMode` configured
as ``make_fake_inputs`` configures its own, and runs ``torch.export.export``
inside a TracingContext holding it. The program's fake values belong to that
mode from the start, so export itself, ``run_decompositions`` and every later
ExportPass dispatch through it, and nothing needs to be :func:`adopt`-ed.

Example::

    ep = torch_cachepolicy.export(model, args, cache_policy=CachePolicy(namespaces=["quantized_decomposed"]))
    mode = torch_cachepolicy.adopt(ep)  # the program's mode; re-creates nothing
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

from torch_cachepolicy._compat import is_fake_tensor
from torch_cachepolicy.arguments import check_cache_arguments
from torch_cachepolicy.mode import FakeTensorMode
from torch_cachepolicy.policy import CachePolicy
from torch_cachepolicy.store import CacheStore

__all__ = ["export"]

_API = "torch_cachepolicy.export(...)"

# The keyword arguments torch.export.export takes after (mod, args, kwargs),
# read from the installed torch so that new ones pass through.
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
    """Exports ``mod`` as ``torch.export.export`` does, under a policy mode.

    Creates a :class:`FakeTensorMode` with the settings
    ``torch.export.export`` gives the mode it creates itself (a fresh
    ``ShapeEnv`` tracking fakes and trace asserts, named after ``mod``'s
    ``forward``, honouring ``prefer_deferred_runtime_asserts_over_guards``;
    ``allow_non_fake_inputs=True``; ``export=True``; no unsafe
    ``data_ptr`` access) and traces ``mod`` under it. The program is the one
    ``torch.export.export`` returns (same graph, metadata, range constraints
    and module call graph); only its fake values belong to the policy mode,
    so export's own dispatches, ``run_decompositions`` and later ExportPasses
    are cached under ``cache_policy``. ``torch_cachepolicy.adopt(program)``
    returns that mode without re-creating anything.

    Each call creates a new mode (an export's ShapeEnv belongs to that
    export). Pass one ``cache_store`` to several calls to share entries.

    Args:
        mod: the module to export.
        args: example positional inputs.
        kwargs: optional example keyword inputs.
        cache_policy: the mode's policy; ``None`` means ``CachePolicy()``.
        cache_store: the mode's store; ``None`` gives it a private one.
        cache_crosscheck: see :class:`FakeTensorMode`.
        **export_kwargs: more keyword arguments of ``torch.export.export``
            (``dynamic_shapes``, ``preserve_module_call_signature``,
            ``prefer_deferred_runtime_asserts_over_guards``; ``strict``
            only as ``False``).

    Returns:
        The exported program.

    Raises:
        TypeError: ``cache_policy``, ``cache_store`` or ``cache_crosscheck``
            has the wrong type, or
            ``export_kwargs`` names no argument of ``torch.export.export``.
        ValueError: ``strict=True``: Dynamo creates its own FakeTensorMode.
        RuntimeError: called while a ``torch._guards.TracingContext`` is
            active (inside ``torch.compile`` or another export), or export
            lifted a FakeTensor constant and
            ``torch._export.config.error_on_lifted_constant_tensors`` is set
            (as ``torch.export.export`` raises). Errors of
            ``torch.export.export`` itself propagate unchanged.
    """
    check_cache_arguments("torch_cachepolicy.export", cache_policy, cache_store, cache_crosscheck)
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
    # make_fake_inputs takes the active TracingContext's fake mode instead of
    # creating one; everything else export does is unchanged, except one
    # diagnostic: torch.export.export skips its check for FakeTensor
    # constants with a made-up name ("lifted_tensor_0", an op it could not
    # trace through) when it sees an ambient fake mode, which the context
    # is. _check_lifted_constants runs that check on the result instead,
    # unless the inputs hold FakeTensors (then stock skips it too).
    # The context is thread-local and export enters its own inside it.
    with unset_fake_temporarily():  # as torch.export.export looks at them
        fake_inputs = detect_fake_mode((args, kwargs)) is not None
    with tracing(TracingContext(mode)):
        program = torch.export.export(mod, args, kwargs, **export_kwargs)
    if not fake_inputs:
        _check_lifted_constants(program)
    return program


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
    # make_fake_inputs creates its mode under
    # torch._functorch.config.patch(fake_tensor_allow_unsafe_data_ptr_access=False),
    # which the constructor copies to this attribute. Setting the attribute
    # gives the same mode without changing torch's config, even briefly.
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
