"""What a ShapeEnv knows about the symbols of a cache key."""

# Note [What the ShapeEnv knows]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# A fake kernel may ask the ShapeEnv what it can prove (statically_known_true,
# guard_or_false, the size-oblivious checks); the answer changes when the
# ShapeEnv learns something, while the key, which holds the expressions, does
# not. So a symbolic entry of a backend (or higher-order) op is filed under
# what the ShapeEnv knows *about the key's symbols*, as torch's
# ShapeEnv._maybe_evaluate_static reads it: the replacements of those symbols
# (followed), the value ranges of the symbols reached, the guards and
# divisibility facts whose symbols are all among them, the deferred runtime
# assertions on them, which are size-like, and the configs that change how
# backed symbols are reasoned about (backed_size_oblivious, ...). A guard about other symbols
# leaves the entry reachable; a new fact about its own selects a new sub-table.
# The entry is filed under the knowledge before its kernel ran, so a kernel that
# taught the ShapeEnv about its own symbols misses once more on the next call
# (which then teaches nothing, or misses again): never rerun at the miss, where
# a second run could raise, or create symbols, for the caller. Whether the
# ShapeEnv records what a kernel asks (guards suppressed, frozen, or raising on
# a new guard) is part of the knowledge: an entry serves only calls made in a
# scope like its own. After any sequence of hits the ShapeEnv holds exactly
# what an uncached run leaves (test_symbols.py compares them).

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import Any

import torch.fx.experimental._config
from torch._subclasses._fake_tensor_utils import _CacheKeyState
from torch._subclasses.fake_tensor import _BypassDispatchCache, _DispatchCacheKey
from torch.fx.experimental.symbolic_shapes import ShapeEnv

from torch_cachepolicy._compat import config_reader
from torch_cachepolicy._reasons import UNKNOWN_SYMBOL


def check_own_symbols(key: _DispatchCacheKey, state: _CacheKeyState) -> None:
    """Bypasses (``UNKNOWN_SYMBOL``) a key holding a SymNode of another ShapeEnv than ``state``'s.

    Keys compare symbols by expression, so inputs of another ShapeEnv with
    equal symbol names may find an entry whose output expressions (and later
    guards) would land in the wrong ShapeEnv.
    """
    shape_env = state.shape_env
    items = key.key
    for index in state.sym_node_lookup.values():
        stub = items[index] if index < len(items) else None
        node = getattr(getattr(stub, "value", None), "node", None)
        if node is not None and node.shape_env is not shape_env:
            raise _BypassDispatchCache(UNKNOWN_SYMBOL)


class _Index:
    """Facts of one ShapeEnv by symbol, extended as the ShapeEnv appends guards."""

    __slots__ = ("by_symbol", "guards_seen")

    def __init__(self) -> None:
        self.guards_seen = 0
        # symbol -> (frozenset of the fact's symbols, the fact) for every guard mentioning it.
        self.by_symbol: dict[Any, list[tuple[frozenset[Any], Any]]] = {}

    def update(self, guards: list[Any]) -> None:
        for guard in guards[self.guards_seen :]:
            expr = guard.expr
            symbols = frozenset(expr.free_symbols)
            for s in symbols:
                self.by_symbol.setdefault(s, []).append((symbols, expr))
        self.guards_seen = len(guards)


_indexes: weakref.WeakKeyDictionary[ShapeEnv, _Index] = weakref.WeakKeyDictionary()
_suppress_guards_tls = ShapeEnv._suppress_guards_tls
# The configs that change what a kernel's guard_or_false / statically_known_true answer about backed symbols.
_SEMANTICS = tuple(
    config_reader(torch.fx.experimental._config, name)
    for name in ("backed_size_oblivious", "aggressive_guard_free_semantics")
)
_NONE: frozenset[Any] = frozenset()


def recording(shape_env: ShapeEnv) -> tuple[bool, bool, bool] | None:
    """None while ``shape_env`` records every guard; else whether it suppresses them, is frozen, or raises on one."""
    scope = (_suppress_guards_tls(), shape_env.frozen, shape_env._error_on_new_guards)
    return None if scope == _RECORDING else scope


_RECORDING = (False, False, False)


def knowledge(shape_env: ShapeEnv, symbols: Iterable[Any]) -> tuple[object, ...]:
    """Everything ``shape_env`` knows that bears on expressions over ``symbols``, and whether it records guards.

    Hashable, and equal for equal knowledge. See Note [What the ShapeEnv knows].
    """
    replacements = shape_env.replacements
    reached = set(symbols)
    todo = list(reached)
    while todo:
        target = replacements.get(todo.pop())
        if target is not None:
            for s in target.free_symbols:
                if s not in reached:
                    reached.add(s)
                    todo.append(s)
    index = _indexes.get(shape_env)
    if index is None:
        index = _indexes[shape_env] = _Index()
    if index.guards_seen != len(shape_env.guards):
        index.update(shape_env.guards)
    ranges = shape_env.var_to_range
    asserts = shape_env.deferred_runtime_asserts
    size_like = shape_env.size_like
    facts: set[Any] = set()
    for s in reached:
        for fact_symbols, fact in index.by_symbol.get(s, ()):
            if fact_symbols <= reached:
                facts.add(fact)
    divisible = frozenset(d for d in shape_env.divisible if d.free_symbols <= reached) if shape_env.divisible else _NONE
    rows = []
    for s in reached:
        value_range = ranges.get(s)
        if value_range is None:
            # A symbol of another ShapeEnv (inputs from several in one mode):
            # an entry would rebuild its output expressions in this one, which
            # does not know the symbol. Stock bypasses backend ops anyway.
            raise _BypassDispatchCache(UNKNOWN_SYMBOL)
        rows.append((str(s), replacements.get(s), value_range, len(asserts.get(s, ())), s in size_like))
    per_symbol = tuple(sorted(rows, key=lambda row: row[0]))
    semantics = tuple(read() for read in _SEMANTICS)
    return (per_symbol, frozenset(facts), divisible, semantics, recording(shape_env))
