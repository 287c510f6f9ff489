"""The one timer of the benchmark suites: wall and process-CPU seconds of a block.

Every measured span in :mod:`benchmarks` (the replay series and hit costs of
:mod:`benchmarks.replay`, the lowerings and census phases of
:mod:`benchmarks.executorch`, the stages of :mod:`benchmarks.export_stage`)
is timed by :func:`timed`, so that they agree on what a figure includes and
on how the cyclic GC is kept out of it.
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["Timing", "timed"]


@dataclass
class Timing:
    """What :func:`timed` measured; both fields are set when the block exits.

    Attributes:
        seconds: wall time (``time.perf_counter``).
        cpu_seconds: process CPU time (``time.process_time``), which other
            processes on a shared machine do not inflate.
    """

    seconds: float = 0.0
    cpu_seconds: float = 0.0


@contextlib.contextmanager
def timed(*, collect: bool = True, gc_off: bool = True) -> Iterator[Timing]:
    """Times the ``with`` block.

    Args:
        collect: run a full collection before the clocks start, so that
            garbage left by earlier work is not collected inside the block.
            Callers that must collect elsewhere (before entering a scope whose
            own cost they time) or that time many short batches pass False.
        gc_off: keep the cyclic GC off while the block runs, as ``timeit``
            does: a collection triggered by another configuration's garbage
            would otherwise land in this one's figure. Its previous state is
            restored on exit. Long spans that should pay their own collections
            (a whole census phase) pass False.

    Yields:
        A :class:`Timing`, filled in when the block exits (also when it raises).
    """
    timing = Timing()
    if collect:
        gc.collect()
    was_enabled = gc.isenabled()
    if gc_off:
        gc.disable()
    start, cpu_start = time.perf_counter(), time.process_time()
    try:
        yield timing
    finally:
        timing.seconds = time.perf_counter() - start
        timing.cpu_seconds = time.process_time() - cpu_start
        if gc_off and was_enabled:
            gc.enable()
