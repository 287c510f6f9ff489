"""Rules registered for stock's ``FakeTensorMode`` class, applied to the subclass where stock applies them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch._higher_order_ops.utils import registered_hop_fake_fns
from torch._ops import OpOverload
from torch._subclasses import fake_tensor as _ft

from torch_cachepolicy._kernels import PYTHON_DISPATCHER, tls_key_included
from torch_cachepolicy._state import CacheState

_StockMode = _ft.FakeTensorMode
_fake_registry = torch._library.simple_registry.singleton
# Stands for an operator's python_key_table when it has none.
_NO_RULES: Mapping[object, Any] = {}


def dispatch(
    mode: _StockMode, state: CacheState, func: Any, types: Sequence[type], args: Sequence[object], kwargs: Mapping[str, object]
) -> object:
    """``FakeTensorMode.dispatch`` of a policy mode."""
    # Note [Rules for the FakeTensorMode class]
    # ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    # torch looks up the rules registered for the FakeTensorMode class by the
    # mode's exact type, so none reaches a subclass; this applies each where
    # and in the order stock's dispatch would, uncached as under stock:
    # 1. under the Python dispatcher, an OpOverload's py_impl(FakeTensorMode)
    #    rule; for a HOP its rule, always (Note [HOPs under a subclass]);
    # 2. a torch.library.register_torch_dispatch(op, FakeTensorMode) rule.
    # Everything else goes to stock's dispatch, then _cached_dispatch_impl.
    handler = getattr(func, "python_key_table", _NO_RULES).get(_StockMode)
    is_op = isinstance(func, OpOverload)
    if handler is None and not is_op:
        # A HOP without a rule for FakeTensorMode: stock's HOP dispatch raises
        # before reaching the mode (the message is torch's, for a drop-in).
        raise NotImplementedError(
            f"There was no rule registered for HigherOrderOperator {func.name()} and mode {mode} "
            "(torch_cachepolicy.FakeTensorMode applies the rules registered for torch's FakeTensorMode; "
            f"register one with {func.name()}.py_impl(FakeTensorMode))"
        )
    if handler is not None and not _redirects_to_mode(func, handler) and (not is_op or tls_key_included(PYTHON_DISPATCHER)):
        if state.frames.open and is_op:
            state.rule_ran(func)
        return handler(mode, *args, **(kwargs or {}))
    # A rule registered with register_torch_dispatch: a routed op keeps its
    # registry entry's rules by class; otherwise the registry is read without
    # creating an entry.
    route = state.routes.get(func)
    if route is not None:
        rule = route.rules.get(_StockMode) if route.rules else None
    elif is_op:
        entry = _fake_registry.get(func.__qualname__)
        rule = None if entry is None else entry.torch_dispatch_rules.find(_StockMode)
    else:
        rule = None
    if rule is not None:
        if state.frames.open:
            state.rule_ran(func)
        return rule(mode, func, types, args, kwargs or {})
    return _StockMode.dispatch(mode, func, types, args, kwargs)


def _redirects_to_mode(func: object, handler: object) -> bool:
    """Whether a ``FakeTensorMode`` rule only calls the mode straight back.

    Such rules call ``mode.__torch_dispatch__`` again (the cached path of HOPs
    registered with ``register_fake``); forwarding to one would recurse.
    """
    return func in registered_hop_fake_fns or getattr(handler, "__qualname__", "") == "redirect_to_mode.<locals>.impl"
