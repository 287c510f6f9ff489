"""What an entry's kernel dispatched: the frames of misses being computed.

Note [Entries cover inner ops]
An entry replays everything its kernel did, including the ops that
kernel dispatched: a backend kernel calling another backend op, or
invoke_subgraph running a whole subgraph. Those inner ops may read the
policy's context, be re-registered, or be denied by the policy, and
the outer key sees none of it. So each miss opens a frame; every inner
dispatch of a backend op, cached or not, records what its result
depends on beyond its arguments (its kernel_sub: kernels and context), and
a denied op taints the frame. A tainted miss becomes a negative
entry, so the denied kernel runs every time; a miss with
dependencies becomes a :class:`Dependent` entry, served only while each
dependency still has the value it had (else it is a miss again). A hit
of a Dependent entry passes its dependencies on to enclosing frames.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable

from torch._subclasses.fake_tensor import _DispatchCacheValidEntry

from torch_cachepolicy.routes import Route

__all__ = ["RUNS_EXCLUDED", "Dependent", "Frame", "Frames"]

RUNS_EXCLUDED = "its kernel dispatches an op the policy denies"
"""The bypass reason of a miss whose kernel dispatched a denied op."""


class Frame:
    """A miss being computed."""

    __slots__ = ("deps", "tainted")

    def __init__(self) -> None:
        self.tainted = False
        self.deps: dict[Route, Hashable] = {}


class Dependent:
    """An entry whose kernel dispatched backend ops: valid while they are unchanged."""

    __slots__ = ("deps", "entry")

    def __init__(self, entry: _DispatchCacheValidEntry, deps: tuple[tuple[Route, Hashable], ...]) -> None:
        self.entry = entry
        self.deps = deps


class Frames:
    """The open frames of one mode, per thread.

    Attributes:
        open: how many frames are open in all threads; the hit path tests it
            (a plain attribute read) before doing anything about frames.
    """

    __slots__ = ("_local", "_lock", "open")

    def __init__(self) -> None:
        self._local = threading.local()
        self.open = 0
        # `+=` on an attribute is not atomic across threads; a lost update
        # could hide an open frame from the hit path's test.
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
        """Records, in every open frame of this thread, that ``route``'s op ran under ``sub``.

        A route that taints (a denied op) taints the frames instead.
        """
        frames = self.stack()
        if route.taints:
            for frame in frames:
                frame.tainted = True
            return
        for frame in frames:
            seen = frame.deps.setdefault(route, sub)
            if seen != sub:
                # The kernel saw two values of one dependency: no single
                # value can stand for this miss.
                frame.tainted = True

    def taint(self) -> None:
        """Taints every open frame of this thread."""
        for frame in self.stack():
            frame.tainted = True

    def still_valid(self, entry: Dependent, current: Callable[[Route], Hashable]) -> bool:
        """Whether every dependency of ``entry`` has its recorded value (``current(route)``).

        If so, the dependencies pass on to this thread's open frames.
        """
        for route, sub in entry.deps:
            if current(route) != sub:
                return False
        if self.open:
            for route, sub in entry.deps:
                self.record(route, sub)
        return True
