"""Progress lines of the long benchmark runs, on stderr: elapsed time, and an estimate of what is left.

:class:`StderrProgress` prints a message with the time since the run started;
:class:`Rounds` counts the rounds a run planned and adds to each round's line
how long the remaining rounds should take at the pace so far (rounds of
different cost, such as warm-up rounds or another flow's, make it rough).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

__all__ = ["Rounds", "StderrProgress", "format_seconds"]


def format_seconds(seconds: float) -> str:
    """``42 s``, ``3.5 min`` or ``1.2 h``."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


class StderrProgress:
    """Prints each message to stderr, prefixed with the seconds since this object was created."""

    def __init__(self) -> None:
        self._start = time.perf_counter()

    def __call__(self, message: str) -> None:
        print(f"[{time.perf_counter() - self._start:7.1f}s] {message}", file=sys.stderr, flush=True)


class Rounds:
    """Counts planned rounds; :meth:`done` reports one with an estimate of the time left.

    Args:
        total: rounds the run will make in all.
        emit: where lines go (e.g. a :class:`StderrProgress`); ``None``: nowhere.
    """

    def __init__(self, total: int, emit: Callable[[str], None] | None) -> None:
        self.total = max(total, 1)
        self.finished = 0
        self._emit = emit
        self._start = time.perf_counter()

    def estimate_left(self) -> float:
        """Seconds the remaining rounds should take at the mean pace of the finished ones."""
        if not self.finished:
            return float("nan")
        elapsed = time.perf_counter() - self._start
        return elapsed / self.finished * max(self.total - self.finished, 0)

    def done(self, message: str) -> None:
        """One round finished: emits ``message; k/N rounds done, about T left``."""
        self.finished += 1
        if self._emit is not None:
            self._emit(
                f"{message}; {self.finished}/{self.total} rounds done, "
                f"about {format_seconds(self.estimate_left())} left"
            )
