"""A cached fake dispatch (:func:`cached_dispatch`), as functions of the mode and its :class:`~._state.CacheState`."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from torch._subclasses._fake_tensor_utils import _CacheKeyState
from torch._subclasses.fake_tensor import (
    FakeTensorMode,
    _BypassDispatchCache,
    _DispatchCacheBypassEntry,
    _DispatchCacheKey,
    _DispatchCacheValidEntry,
)

from torch_cachepolicy import _kernels, _reasons
from torch_cachepolicy._fakes import output_from_entry
from torch_cachepolicy._frames import Frame
from torch_cachepolicy._kernels import TableKey
from torch_cachepolicy._key import cache_key
from torch_cachepolicy._key_extension import check_visible, extend_key
from torch_cachepolicy._names import unhashable_context
from torch_cachepolicy._routes import BYPASS, POLICY, STOCK, Route
from torch_cachepolicy._state import CacheState
from torch_cachepolicy._symbols import check_own_symbols
from torch_cachepolicy._synth import TORCH_PATH, from_captured, stub_symint_output
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

if TYPE_CHECKING:
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

log = logging.getLogger(__name__)

_Entry = _DispatchCacheValidEntry | _DispatchCacheBypassEntry
# A private table of a partition: entries of builtin ops kept out of torch's storage.
_STOCK_TABLE = ("stock",)


def cached_dispatch(
    mode: FakeTensorMode,
    state: CacheState,
    func: Any,
    types: Sequence[type],
    args: Sequence[object],
    kwargs: Mapping[str, object],
) -> object:
    """``FakeTensorMode._cached_dispatch_impl`` of a policy mode (every mode handed here is one)."""
    if state.policy.identity is not state.synced_identity:
        state.sync()
    # An OpOverload's hash is a Python call: one lookup per dispatch; the route carries the rest per op.
    route = state.routes.get(func)
    if route is None:
        route = state.route(func)
    if route.taints and state.frames.open:  # See Note [Entries cover inner ops]
        state.frames.taint()
    kind = route.kind
    stats = route.stats
    if kind is BYPASS:
        log.debug("bypass %s: %s (route)", func, route.label)
        stats.bypass(route.label)
        return mode._dispatch_impl(func, types, args, kwargs)
    table_key: TableKey | None = None
    try:
        if kind is POLICY:
            table_key = _before_key(mode, state, route)
        if route.opaque:
            check_visible(route.opaque, route.immutable, args, kwargs)
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
        return mode._dispatch_impl(func, types, args, kwargs)

    entry = table.get(key)
    if entry is None and kind is POLICY:
        return _first_sight(mode, route, key, table, shape_env, types, args, kwargs)
    if entry is None or entry is _SEEN:
        return _miss(mode, state, route, _Call(key_state, key, table, shape_env, types, args, kwargs))
    if type(entry) is _DispatchCacheBypassEntry:
        log.debug("bypass %s: %s (negative entry)", func, entry.reason)
        stats.bypass(entry.reason)
        return mode._dispatch_impl(func, types, args, kwargs)
    # Through the mode, as stock's hits, so that an override of it builds every hit.
    output = output_from_entry(mode._output_from_cache_entry, key_state, entry, key, args)
    stats.hits += 1
    if mode.cache_crosscheck_enabled:
        crosscheck(mode, output, func, types, args, kwargs, shape_env=kind is not STOCK)
    return output


# Note [An entry on a key's second sight]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# A backend op's entry costs its miss a verification (the inputs snapshotted, the output a hit would build compared
# with the kernel's, the ShapeEnv compared) that pays off only if the key comes back. A pass over a graph whose keys
# are new (an export's trace, a lowering that retraces once, a compile) would pay it for nothing and cost more than no
# cache at all. So a backend key's first dispatch only runs the kernel and marks the key seen (_SEEN: nothing is
# stored that a hit could serve); its second makes the entry, as a first dispatch did before. A key that comes back
# costs one hit more; one that never does costs an input snapshot and its "seen once" mark in the table. Builtin ops keep stock's first-sight entries (their
# misses verify little: Note [What a hit of an aten entry can get wrong]), and torch's storage holds only torch's.
#
# What the first run does to its inputs is compared, though: the second run often gets the very same inputs, on
# which a kernel that memoizes on them (x.nonzero() keeps an unbacked size on x; an attribute set once) changes
# nothing, so its verification would pass an entry whose hits skip what the kernel does to fresh inputs. A change is
# the key's negative entry at once. (What a kernel adds to the ShapeEnv it adds on every run, unless it memoizes it
# on an input, which that comparison sees.)
_SEEN = _DispatchCacheBypassEntry("seen once")


def _first_sight(
    mode: FakeTensorMode,
    route: Route,
    key: _DispatchCacheKey,
    table: Table | dict[_DispatchCacheKey, Any],
    shape_env: ShapeEnv | None,
    types: Sequence[type],
    args: Sequence[object],
    kwargs: Mapping[str, object],
) -> object:
    """A backend key's first dispatch: the kernel, uncached, and the key marked seen, or its negative entry if the
    kernel changed an input (Note [An entry on a key's second sight])."""
    snapshot = InputSnapshot(args, kwargs)
    output = mode._dispatch_impl(route.func, types, args, kwargs)  # type: ignore[arg-type]
    changed = snapshot.changed()
    if changed is None:
        _store(key, shape_env, _SEEN, table)
        route.stats.misses += 1
    else:
        reason = _reasons.input_changed(changed)
        log.debug("negative entry for %s: %s (first sight)", route.func, reason)
        _store(key, shape_env, _DispatchCacheBypassEntry(reason), table)
        route.stats.bypass(reason)
    return output


def _before_key(mode: FakeTensorMode, state: CacheState, route: Route) -> TableKey:
    """The bypasses of a backend op decided before its key; its table key."""
    if mode.propagate_real_tensors:
        # See Note [The kernel in effect]: the real kernel's outputs may replace the fake kernel's.
        raise _BypassDispatchCache(_reasons.REAL_TENSORS)
    assert route.deps is not None
    table_key = route.deps.table_key(state.policy, mode.allow_fallback_kernels)
    if _kernels.profiled(table_key):
        raise _BypassDispatchCache(_reasons.PROFILED)
    return table_key


def _table(
    state: CacheState, route: Route, table_key: TableKey | None, key_state: _CacheKeyState, shape_env: ShapeEnv | None
) -> Table | dict[_DispatchCacheKey, Any]:
    """Where entries of this call live (Note [Sub-tables]; for keys with symbols, Note [What the ShapeEnv knows])."""
    if route.kind is POLICY:
        assert table_key is not None and route.deps is not None
        try:
            where: object = table_key
            if shape_env is not None:
                where = _kernels.symbolic_table_key(route.func, table_key, shape_env, key_state.known_symbols)
            if route.deps.uses_context:
                state.check_context(route, table_key.context)
            return state.partition.table(where, shape_env)
        except _BypassDispatchCache:
            raise
        except Exception as e:  # a user's __hash__ or __eq__ may raise anything
            raise unhashable_context(route.func, table_key.context, e) from None
    if route.private or state.isolated:
        return state.partition.table(_STOCK_TABLE, shape_env)
    if shape_env is not None:
        return shape_env.fake_tensor_cache
    return FakeTensorMode.cache


class _Call(NamedTuple):
    """One call's key and where its entry goes, handed from the lookup to the miss."""

    key_state: _CacheKeyState
    key: _DispatchCacheKey
    table: Table | dict[_DispatchCacheKey, Any]
    shape_env: ShapeEnv | None
    types: Sequence[type]
    args: Sequence[object]
    kwargs: Mapping[str, object]


def _run(mode: FakeTensorMode, state: CacheState, route: Route, call: _Call) -> tuple[object, Frame]:
    """Runs the kernel uncached inside a frame that notes what a hit would not run."""
    frame = state.frames.push()
    try:
        output = mode._dispatch_impl(route.func, call.types, call.args, call.kwargs)  # type: ignore[arg-type]
    finally:
        state.frames.pop(frame)
    return output, frame


def _miss(mode: FakeTensorMode, state: CacheState, route: Route, call: _Call) -> object:
    """Runs the kernel, reaches a verdict on the entry it would make, and stores it."""
    # See Note [What a hit of an aten entry can get wrong]: an aten kernel writes only what its schema declares.
    aten = route.kind is STOCK
    snapshot = None if aten and not route.func._schema.is_mutable else InputSnapshot(call.args, call.kwargs)  # type: ignore[attr-defined]
    # A backend kernel must not create symbols nor, if it saw none, teach the ShapeEnv (a hit would not).
    env = None if aten else mode.shape_env
    env_before = None if env is None else shape_env_state(env, symbols_only=call.shape_env is not None)
    output, frame = _run(mode, state, route, call)
    in_torch_storage = call.table is FakeTensorMode.cache or (
        call.shape_env is not None and call.table is call.shape_env.fake_tensor_cache
    )
    entry: _Entry
    try:
        entry, rebuilt = _entry(mode, state, route, call, output, in_torch_storage)
    except _BypassDispatchCache as e:
        # torch's verdict (or our schema check, on a private table): kept as stock would, but not in torch's storage.
        log.debug("bypass %s: %s (entry builder)", route.func, e.reason)
        route.stats.bypass(e.reason)
        if not in_torch_storage:
            _store(call.key, call.shape_env, _DispatchCacheBypassEntry(e.reason), call.table)
        return output
    reason = _verify(mode, route, call, entry, output, rebuilt, snapshot, frame, env_before)
    if reason is None:
        route.stats.misses += 1
    else:
        log.debug("negative entry for %s: %s", route.func, reason)
        route.stats.bypass(reason)
        entry = _DispatchCacheBypassEntry(reason)
    table = call.table
    if in_torch_storage and reason is not None:
        # A stock mode may put the rejected entry into torch's storage, which cannot hold our verdicts: the op's
        # entries now stay in our store (Note [Entries that must reproduce aliasing]).
        state.keep_private(route.func)
        table = state.partition.table(_STOCK_TABLE, call.shape_env)
    _store(call.key, call.shape_env, entry, table)
    return output


def _entry(
    mode: FakeTensorMode, state: CacheState, route: Route, call: _Call, output: object, in_torch_storage: bool
) -> tuple[_DispatchCacheValidEntry, object]:
    """torch's entry for this output, after the schema checks of a backend op, and the output a hit of it would
    give if torch's entry builder already built it (else TORCH_PATH)."""
    func: Any = route.func
    if route.kind is POLICY:
        check_backend_op(func, call.args, explicit=route.explicit)
        assert route.deps is not None
        if call.shape_env is None and route.deps.runs_backend_fallback():
            raise _BypassDispatchCache(_reasons.BACKEND_FALLBACK)
    synth = state.synth
    captured: list[object] = []
    synth.captured = captured  # See Note [One synthesis for hits and their verification]
    try:
        entry = mode._make_cache_entry(call.key_state, call.key, func, call.args, call.kwargs, output)  # type: ignore[arg-type]
    except _BypassDispatchCache:
        raise
    except Exception as e:
        # torch's builder asserts on outputs a builtin op never returns (a dtype, a device: what stock's non-builtin
        # bypass keeps from it); a dispatch never fails where stock's would not.
        raise _BypassDispatchCache(_reasons.not_described(e)) from None
    finally:
        synth.captured = None
    if not in_torch_storage:
        entry = stub_symint_output(entry, call.key_state, call.key)
    # An override of _output_from_cache_entry (a subclass's, or one patched on the class or the mode) may build hits
    # otherwise than the outputs captured: the verification then calls it (Note [One synthesis for hits and their
    # verification]).
    own = type(mode)._output_from_cache_entry is state.own_synthesis and "_output_from_cache_entry" not in vars(mode)
    return entry, from_captured(entry, captured, call.args) if own else TORCH_PATH


def _verify(
    mode: FakeTensorMode,
    route: Route,
    call: _Call,
    entry: _DispatchCacheValidEntry,
    output: object,
    rebuilt: object,
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
        env = mode.shape_env
        if env_before is not None and env is not None and shape_env_state(env, symbols_only=call.shape_env is not None) != env_before:
            return _reasons.SHAPE_ENV_CHANGED
        fields = STORAGE_FIELDS if route.kind is STOCK else ALL_FIELDS
        if rebuilt is TORCH_PATH:
            verify_entry(mode, call.key_state, entry, call.key, route.func, call.args, call.kwargs, output, fields)  # type: ignore[arg-type]
        else:
            verify_entry(mode, call.key_state, entry, call.key, route.func, call.args, call.kwargs, output, fields, rebuilt)  # type: ignore[arg-type]
    except _BypassDispatchCache as e:
        return e.reason
    return None


def _store(key: _DispatchCacheKey, shape_env: ShapeEnv | None, entry: _Entry, table: Table | dict[Any, Any]) -> None:
    if shape_env is not None:
        # Entries must not keep a ShapeEnv alive (torch does the same).
        key.strip_shape_env()
    table[key] = entry
