"""What an entry's kernel dispatched: the frames of misses being computed."""

# Note [Entries cover inner ops]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# An entry replays the ops its kernel dispatched too (a backend op calling another, invoke_subgraph's subgraph),
# which may read the policy's context, be re-registered or denied, unseen by the outer key. So a miss opens a frame
# where inner backend dispatches, cached or not, record their table keys; denied ops, and backend ops that bypass
# (their call is not replayable: N1 of the upstream review), taint it. A tainted miss becomes a negative entry, one
# with dependencies a Dependent, valid while each keeps its value (hits pass them on).

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING

from torch._ops import OpOverload
from torch._subclasses import fake_tensor as _ft
from torch._subclasses.fake_tensor import _DispatchCacheValidEntry

# Every mode these functions are handed is a policy mode; typed as torch's class, whose API they use.
_Mode = _ft.FakeTensorMode

if TYPE_CHECKING:
    from torch_cachepolicy._routes import Route
    from torch_cachepolicy._state import CacheState


def same_value(a: Hashable, b: Hashable) -> bool:
    """Whether a dict keyed by ``a`` would find ``b``: identity, else equal hashes and ``==``.

    Table keys hold the policy's context values, whose ``==`` may return a non-bool (a tensor: ambiguous) or raise,
    as a dict lookup never sees for values of different hashes; a comparison that fails counts as a change.
    """
    if a is b:
        return True
    try:
        return hash(a) == hash(b) and bool(a == b)
    except Exception:
        return False


class Frame:
    """A miss being computed."""

    __slots__ = ("deps", "tainted")

    def __init__(self) -> None:
        self.tainted = False
        self.deps: dict[Route, Hashable] = {}


# How many Dependents one key keeps (made under different values of its dependencies: an inner op's context that
# alternates); the oldest goes first.
_MAX_VARIANTS = 8


class Dependent:
    """An entry whose kernel dispatched backend ops: valid while they are unchanged.

    ``previous``: the key's entry made under other values of the dependencies, tried in turn (a chain of at most
    ``_MAX_VARIANTS``).
    """

    __slots__ = ("deps", "entry", "previous")

    def __init__(self, entry: _DispatchCacheValidEntry, deps: tuple[tuple[Route, Hashable], ...]) -> None:
        self.entry = entry
        self.deps = deps
        self.previous: Dependent | None = None

    def chain(self, older: object) -> Dependent:
        """This entry, keeping ``older`` (the key's entry it replaces, if a Dependent) as a variant to try after it."""
        if type(older) is Dependent:
            self.previous = older
            tail, n = older, 2
            while tail.previous is not None and n < _MAX_VARIANTS:
                tail, n = tail.previous, n + 1
            tail.previous = None
        return self


class Frames:
    """One mode's open frames, per thread; ``open`` counts them in all threads, for the hit path's cheap test."""

    __slots__ = ("_local", "_lock", "open")

    def __init__(self) -> None:
        self._local = threading.local()
        self.open = 0
        # `+=` is not atomic across threads; a lost update could hide an open frame from the hit path.
        self._lock = threading.Lock()

    def push(self) -> Frame:
        """Opens a frame for a miss on this thread."""
        frames: list[Frame] | None = getattr(self._local, "stack", None)
        if frames is None:
            frames = self._local.stack = []
        frame = Frame()
        frames.append(frame)
        with self._lock:
            self.open += 1
        return frame

    def pop(self, frame: Frame) -> None:
        """Closes ``frame``, opened by :meth:`push` on this thread."""
        with self._lock:
            self.open -= 1
        self._local.stack.remove(frame)

    def stack(self) -> list[Frame]:
        """This thread's open frames, outermost first (empty when none)."""
        return getattr(self._local, "stack", None) or []

    def record(self, route: Route, sub: Hashable) -> None:
        """Records in this thread's open frames that ``route``'s op ran under ``sub``; a denied op taints them."""
        frames = self.stack()
        if route.taints:
            for frame in frames:
                frame.tainted = True
            return
        for frame in frames:
            seen = frame.deps.setdefault(route, sub)
            if not same_value(seen, sub):
                # Two values of one dependency: no single value can stand for this miss.
                frame.tainted = True

    def taint(self) -> None:
        """Taints every open frame of this thread."""
        for frame in self.stack():
            frame.tainted = True

    def valid_entry(self, entry: Dependent, current: Callable[[Route], Hashable]) -> _DispatchCacheValidEntry | None:
        """The entry of the first variant of ``entry`` whose dependencies keep their values (see still_valid)."""
        variant: Dependent | None = entry
        while variant is not None:
            if self.still_valid(variant, current):
                return variant.entry
            variant = variant.previous
        return None

    def still_valid(self, entry: Dependent, current: Callable[[Route], Hashable]) -> bool:
        """Whether ``entry``'s dependencies keep their values; if so, they pass on to this thread's open frames."""
        for route, sub in entry.deps:
            if not same_value(current(route), sub):
                return False
        if self.open:
            for route, sub in entry.deps:
                self.record(route, sub)
        return True


def current_table_key(mode: _Mode, state: CacheState, route: Route) -> Hashable:
    """What ``route``'s op depends on now (its table key), under ``mode``'s policy and settings."""
    assert route.deps is not None
    return route.deps.table_key(state.policy, mode.allow_fallback_kernels)


def record(mode: _Mode, state: CacheState, route: Route, table_key: Hashable = None) -> None:
    """Records ``route``'s dispatch in this thread's open frames (Note [Entries cover inner ops])."""
    frames = state.frames
    if not frames.stack():
        return
    if not route.taints:
        if route.deps is None:
            return
        if table_key is None:
            # A bypass, but its output (and the enclosing entry) depends on what a cached op's would.
            table_key = current_table_key(mode, state, route)
    frames.record(route, table_key)


def record_rule(mode: _Mode, state: CacheState, func: OpOverload) -> None:
    """Records a dispatch that a rule for the FakeTensorMode class answered, never reaching the cache."""
    route = state.route(func)
    if route.taints:
        state.frames.taint()
    elif route.deps is not None:
        record(mode, state, route, current_table_key(mode, state, route))
