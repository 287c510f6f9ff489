"""A cached fake dispatch (:func:`cached_dispatch`), as functions of the mode and its :class:`~._state.CacheState`."""

from __future__ import annotations

import logging
import weakref
from collections.abc import Hashable, Mapping, Sequence
from typing import Any, NamedTuple

import torch
import torch.fx
import torch.utils._pytree as pytree
from torch._subclasses import fake_tensor as _ft
from torch._subclasses._fake_tensor_utils import _CacheKeyState
from torch._subclasses.fake_tensor import (
    _BypassDispatchCache,
    _DispatchCacheBypassEntry,
    _DispatchCacheKey,
    _DispatchCacheValidEntry,
)

from torch_cachepolicy import _kernels, _reasons
from torch_cachepolicy._compat import SYNTHESIS_TAKES_FUNC
from torch_cachepolicy._deps import Dependent, Frame, current_table_key, record
from torch_cachepolicy._kernels import TableKey
from torch_cachepolicy._key import cache_key
from torch_cachepolicy._key_extension import check_visible, extend_key
from torch_cachepolicy._names import unhashable_context
from torch_cachepolicy._routes import BYPASS, HOP, POLICY, STOCK, Route
from torch_cachepolicy._state import CacheState
from torch_cachepolicy._symbols import check_own_symbols, knowledge, recording
from torch_cachepolicy._synth import stub_symint_output
from torch_cachepolicy._verify import (
    ALL_FIELDS,
    STORAGE_FIELDS,
    InputSnapshot,
    check_backend_op,
    check_backend_output,
    crosscheck,
    shape_env_state,
    verify_entry,
)
from torch_cachepolicy.store import Table

# Every mode these functions are handed is a policy mode; typed as torch's class, whose API they use.
_Mode = _ft.FakeTensorMode

log = logging.getLogger(__name__)

_StockMode = _ft.FakeTensorMode
_tls_key_included = torch._C._dispatch_tls_is_dispatch_key_included
_PYTHON_DISPATCHER = torch._C.DispatchKey.PythonDispatcher
_Entry = _DispatchCacheValidEntry | _DispatchCacheBypassEntry | Dependent

# Sub-tables of a partition for entries that do not depend on a fake kernel.
_STOCK_TABLE = ("stock",)
_MAX_CONTEXTS = 64
_HOP_TABLE = "hop"


def cached_dispatch(
    mode: _Mode,
    state: CacheState,
    func: Any,
    types: Sequence[type],
    args: Sequence[object],
    kwargs: Mapping[str, object],
) -> object:
    """``FakeTensorMode._cached_dispatch_impl`` of a policy mode."""
    if state.policy.identity is not state.synced_identity:
        state.sync()
    # An OpOverload's hash is a Python call: one lookup per dispatch; the route carries the rest per op.
    route = state.routes.get(func)
    if route is None:
        route = state.route(func)
    kind = route.kind
    stats = route.stats
    if kind is BYPASS:
        log.debug("bypass %s: %s (route)", func, route.label)
        stats.bypass(route.label)
        if state.frames.open:
            record(mode, state, route)
        return mode._dispatch_impl(func, types, args, kwargs)
    table_key: TableKey | None = None
    try:
        if kind is not STOCK:
            table_key = _before_key(mode, state, route, args, kwargs)
        key_state = _CacheKeyState(mode.shape_env)
        key = cache_key(mode, key_state, func, args, kwargs, state.key_stats)
        if route.slots is not None:
            key = extend_key(key, route.slots, key_state, args, kwargs)
        shape_env = key_state.shape_env if key_state.cache_on_shape_env() else None
        if shape_env is not None:  # every route: stock's aten entries compare symbols across ShapeEnvs
            if mode.shape_env is None:  # guards and symbols a kernel adds there are not the mode's to replay
                raise _BypassDispatchCache(_reasons.UNKNOWN_SYMBOL)
            check_own_symbols(key, key_state)
        # Raises for a key with a symbol shape_env does not know (_reasons.UNKNOWN_SYMBOL).
        table = _table(state, route, table_key, key_state, shape_env)
    except _BypassDispatchCache as e:
        log.debug("bypass %s: %s (key)", func, e.reason)
        stats.bypass(e.reason)
        if kind is POLICY:  # See Note [Entries cover inner ops]
            state.frames.taint()
        return mode._dispatch_impl(func, types, args, kwargs)

    entry: Any = table.get(key)
    if entry is None and shape_env is not None and kind is not STOCK and recording(shape_env) is not None:
        # A guard-free scope (Note [What the ShapeEnv knows]): entries made where guards are recorded serve too.
        entry = _table(state, route, table_key, key_state, shape_env, as_recording=True).get(key)
    if type(entry) is Dependent:
        entry = state.frames.valid_entry(entry, lambda r: current_table_key(mode, state, r))
    elif isinstance(entry, _DispatchCacheBypassEntry):
        log.debug("bypass %s: %s (negative entry)", func, entry.reason)
        stats.bypass(entry.reason)
        if kind is POLICY or entry.reason == _reasons.RUNS_EXCLUDED:
            state.frames.taint()
        return mode._dispatch_impl(func, types, args, kwargs)
    if entry is None:
        return _miss(mode, state, route, _Call(key_state, key, table, table_key, shape_env, types, args, kwargs))
    # Through the mode, as stock's hits, so that an override of it builds every hit.
    if SYNTHESIS_TAKES_FUNC:
        output = mode._output_from_cache_entry(key_state, entry, key, func, args)  # type: ignore[call-arg,arg-type]
    else:
        output = mode._output_from_cache_entry(key_state, entry, key, args)  # type: ignore[call-arg,arg-type]
    stats.hits += 1
    if mode.cache_crosscheck_enabled:
        crosscheck(mode, output, func, types, args, kwargs, shape_env=kind is not STOCK)
    return output


def _before_key(
    mode: _Mode, state: CacheState, route: Route, args: Sequence[object], kwargs: Mapping[str, object]
) -> TableKey | None:
    """The bypasses of a backend or higher-order op decided before its key; a backend op's table key."""
    if mode.propagate_real_tensors:
        # See Note [The kernel in effect]: the real kernel's outputs may replace the fake kernel's.
        raise _BypassDispatchCache(_reasons.REAL_TENSORS)
    if route.kind is not POLICY:
        return None
    assert route.deps is not None and route.slots is not None
    table_key = route.deps.table_key(state.policy, mode.allow_fallback_kernels)
    if state.frames.open:
        record(mode, state, route, table_key)
    if _kernels.profiled(table_key):
        raise _BypassDispatchCache(_reasons.PROFILED)
    if route.slots.opaque:
        check_visible(route.slots, route.immutable, args, kwargs)
    return table_key


def _table(
    state: CacheState, route: Route, table_key: TableKey | None, key_state: _CacheKeyState, shape_env: Any,
    as_recording: bool = False,
) -> Any:
    """Where entries of this call live (Note [Sub-tables]; for keys with symbols, Note [What the ShapeEnv knows]:
    ``as_recording``, where they would if the ShapeEnv recorded guards)."""
    if route.kind is POLICY:
        assert table_key is not None
        where: Hashable = table_key
        if shape_env is not None:
            where = _kernels.symbolic_table_key(route.func, table_key, shape_env, key_state.known_symbols, as_recording)
        try:
            if route.deps.uses_context:  # type: ignore[union-attr]
                _check_context(route, table_key.context)
            return state.partition.table(where, shape_env)
        except _BypassDispatchCache:
            raise
        except Exception as e:  # a user's __hash__ or __eq__ may raise anything
            raise unhashable_context(route.func, table_key.context, e) from None
    if route.private or state.isolated:
        return _private_table(state, route, shape_env, key_state, as_recording)
    if shape_env is not None:
        return shape_env.fake_tensor_cache
    return _StockMode.cache


def _check_context(route: Route, context: object) -> None:
    """Bypasses once an op has met more context values than a lowering plausibly has: they never repeat."""
    # A context that never equals itself (a fresh object compared by identity, a new NaN) would open one sub-table
    # and one entry per dispatch, never hit, and grow the store for the mode's life; a bounded set tells.
    seen = route.contexts
    if context not in seen:
        if len(seen) >= _MAX_CONTEXTS:
            raise _BypassDispatchCache(_reasons.CONTEXT_NEVER_REPEATS)
        seen.add(context)


def _private_table(
    state: CacheState, route: Route, shape_env: Any, key_state: _CacheKeyState, as_recording: bool = False
) -> Table:
    if route.kind is not HOP:
        return state.partition.table(_STOCK_TABLE, shape_env)
    # A HOP's entry replays its subgraph's ops: its sub-table holds whether the Python dispatcher (preferring
    # py_impl kernels) is on and, with symbols, what the ShapeEnv knows. The policy's context is not asked here:
    # the inner ops that read it record it as a dependency (Note [Entries cover inner ops]), so a hook that
    # only works inside its backend's lowering is asked only by that backend's ops.
    known = None if shape_env is None else knowledge(shape_env, key_state.known_symbols, as_recording)
    return state.partition.table((_HOP_TABLE, known, _tls_key_included(_PYTHON_DISPATCHER)), shape_env)


class _Call(NamedTuple):
    """One call's key and where its entry goes, handed from the lookup to the miss."""

    key_state: _CacheKeyState
    key: _DispatchCacheKey
    table: Any
    table_key: TableKey | None
    shape_env: Any
    types: Sequence[type]
    args: Sequence[object]
    kwargs: Mapping[str, object]


def _run(mode: _Mode, state: CacheState, route: Route, call: _Call) -> tuple[object, Frame]:
    """Runs the kernel uncached inside a frame that records what it dispatched."""
    frame = state.frames.push()
    try:
        output = mode._dispatch_impl(route.func, call.types, call.args, call.kwargs)  # type: ignore[arg-type]
    finally:
        state.frames.pop(frame)
    return output, frame


def _miss(mode: _Mode, state: CacheState, route: Route, call: _Call) -> object:
    """Runs the kernel, reaches a verdict on the entry it would make, and stores it."""
    # See Note [What a hit of an aten entry can get wrong]: an aten kernel writes only what its schema declares.
    aten = route.kind is STOCK
    snapshot = None if aten and not route.func._schema.is_mutable else InputSnapshot(call.args, call.kwargs)  # type: ignore[attr-defined]
    # A backend kernel must not create symbols nor, if it saw none, teach the ShapeEnv (a hit would not).
    watch_env = route.kind is not STOCK and mode.shape_env is not None
    env_before = shape_env_state(mode.shape_env, symbols_only=call.shape_env is not None) if watch_env else None
    output, frame = _run(mode, state, route, call)
    in_torch_storage = call.table is _StockMode.cache or (
        call.shape_env is not None and call.table is call.shape_env.fake_tensor_cache
    )
    try:
        entry = _entry(mode, state, route, call, output, in_torch_storage)
    except _BypassDispatchCache as e:
        # torch's verdict (or our schema check, on a private table): kept as stock would, but not in torch's storage.
        log.debug("bypass %s: %s (entry builder)", route.func, e.reason)
        route.stats.bypass(e.reason)
        if route.kind is POLICY:
            state.frames.taint()
        if in_torch_storage:
            return output
        _store(state, route, call, _DispatchCacheBypassEntry(e.reason), [call.table])
        return output
    reason = _verify(mode, route, call, entry, output, snapshot, frame, env_before)
    if reason is not None:
        log.debug("negative entry for %s: %s", route.func, reason)
        route.stats.bypass(reason)
        if route.kind is POLICY or reason == _reasons.RUNS_EXCLUDED:
            state.frames.taint()
        entry = _DispatchCacheBypassEntry(reason)
    else:
        route.stats.misses += 1
        if frame.deps:
            entry = Dependent(entry, tuple(frame.deps.items()))  # type: ignore[arg-type]
    tables = [call.table]
    if in_torch_storage and not isinstance(entry, _DispatchCacheValidEntry):
        # A stock mode may put the rejected entry into torch's storage, which cannot hold our verdicts
        # or dependencies: the op's entries now stay in our store (Note [Entries that must reproduce aliasing]).
        state.keep_private(route)
        tables = [_private_table(state, route, call.shape_env, call.key_state)]
    _store(state, route, call, entry, tables)
    return output


def _entry(mode: _Mode, state: CacheState, route: Route, call: _Call, output: object, in_torch_storage: bool) -> _Entry:
    """torch's entry for this output, after the schema checks of a backend op."""
    func: Any = route.func
    if route.kind is POLICY:
        check_backend_op(func, call.args, explicit=route.explicit)
        assert route.deps is not None
        if call.shape_env is None and route.deps.runs_backend_fallback():
            raise _BypassDispatchCache(_reasons.BACKEND_FALLBACK)
    synth = state.synth
    synth.transient = True  # See Note [One synthesis for hits and their verification]
    try:
        entry = mode._make_cache_entry(call.key_state, call.key, func, call.args, call.kwargs, output)  # type: ignore[arg-type]
    except _BypassDispatchCache:
        raise
    except Exception as e:
        # torch's builder asserts on outputs a builtin op never returns (a dtype, a device: what stock's non-builtin
        # bypass keeps from it); a dispatch never fails where stock's would not.
        raise _BypassDispatchCache(_reasons.not_described(e)) from None
    finally:
        synth.transient = False
    return entry if in_torch_storage else stub_symint_output(entry, call.key_state, call.key)


def _verify(
    mode: _Mode,
    route: Route,
    call: _Call,
    entry: Any,
    output: object,
    snapshot: InputSnapshot | None,
    frame: Frame,
    env_before: tuple[object, ...] | None,
) -> str | None:
    """Why a hit of ``entry`` would not be exactly this uncached run, or None."""
    changed = None if snapshot is None else snapshot.changed()
    if changed is not None:
        return _reasons.input_changed(changed)
    if frame.tainted:
        return _reasons.RUNS_EXCLUDED
    try:
        if route.kind is POLICY:
            check_backend_output(call.key_state, route.func, call.args, output)  # type: ignore[arg-type]
        if env_before is not None and shape_env_state(mode.shape_env, symbols_only=call.shape_env is not None) != env_before:
            return _reasons.SHAPE_ENV_CHANGED
        fields = STORAGE_FIELDS if route.kind is STOCK else ALL_FIELDS
        verify_entry(mode, call.key_state, entry, call.key, route.func, call.args, call.kwargs, output, fields)  # type: ignore[arg-type]
    except _BypassDispatchCache as e:
        return e.reason
    return None


def _store(state: CacheState, route: Route, call: _Call, entry: _Entry, tables: list[Any]) -> None:
    key = call.key
    if call.shape_env is not None:
        # Entries must not keep a ShapeEnv alive (torch does the same).
        key.strip_shape_env()
    for table in tables:
        known = key in table
        table[key] = entry.chain(table.get(key)) if type(entry) is Dependent else entry
        if isinstance(table, Table) and route.kind is HOP and not known:  # one finalizer per key and table
            for leaf in pytree.tree_leaves((call.args, call.kwargs)):
                owner = _id_hashed_owner(leaf)
                if owner is not None:
                    weakref.finalize(owner, _evict, weakref.ref(table), key)


def _evict(table_ref: weakref.ref[Table], key: _DispatchCacheKey) -> None:
    table = table_ref()
    if table is not None:
        table.pop(key, None)


def _id_hashed_owner(leaf: object) -> object | None:
    """The object whose id torch put in a key for ``leaf`` (``FakeTensorMode._prep_args_for_hash``), or None."""
    from torch._higher_order_ops.auto_functionalize import FunctionalCallableWithEpilogue
    from torch._higher_order_ops.utils import SubgraphCallableWrapper

    if isinstance(leaf, torch.fx.GraphModule):
        return leaf
    if isinstance(leaf, SubgraphCallableWrapper):
        return leaf.subgraph
    if isinstance(leaf, FunctionalCallableWithEpilogue):
        return leaf.orig_callable
    return None
