"""The misses being computed, per thread: what a hit of their entries would not run."""

# Note [Entries cover inner ops]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# An entry replays the ops its kernel dispatched too (a backend op calling another), which may read the policy's
# context, be re-registered or denied, unseen by the outer key. So a miss opens a frame, and a dispatch inside it of
# an op whose run a hit could not stand for (Route.taints: any op outside aten/prim/prims, cached or not, and any
# op the policy denies) taints every open frame of its thread; a tainted miss becomes a negative entry. The census
# (docs/design.md, "Kinds of entry") found no lowering whose backend kernels dispatch backend ops, so such entries
# are not kept with their inner ops' values, as they once were.

from __future__ import annotations

import threading


class Frame:
    """A miss being computed; ``tainted`` once it dispatched an op a hit would not run."""

    __slots__ = ("tainted",)

    def __init__(self) -> None:
        self.tainted = False


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

    def taint(self) -> None:
        """Taints every open frame of this thread."""
        for frame in getattr(self._local, "stack", None) or ():
            frame.tainted = True
