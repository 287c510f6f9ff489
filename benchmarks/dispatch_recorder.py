"""MEASUREMENT ONLY: records which FakeTensorMode served each fake dispatch, and for how long.

Used by the ExecuTorch integration tests and by ``python -m
benchmarks.executorch --census``; never by the library, and never around a
timed lowering (the wrapper costs a few microseconds per dispatch). While a
:func:`recording` scope is active it replaces, on torch's ``FakeTensorMode``
class only, ``__init__`` (to learn where each mode was created) and
``__torch_dispatch__`` (to attribute each dispatch to its mode, op namespace
and phase). Both are restored on exit.

What it records, per (phase, mode kind, namespace):

* ``calls``: every fake dispatch, nested ones (a fake kernel's inner ops)
  included;
* ``outer_calls`` / ``outer_seconds`` / ``outer_cpu_seconds``: dispatches with
  no fake dispatch above them, and their inclusive wall and CPU time. Their
  sum is the time the program spent in fake dispatch, each dispatch counted
  once and attributed to the outermost op's namespace;
* ``non_builtin``: "non-builtin" bypasses torch's class counter recorded
  during the dispatch itself (not its nested dispatches). Only stock modes
  write that counter; a policy mode's bypasses are in its ``cache_report()``.

Mode kinds: ``policy`` for :class:`torch_cachepolicy.FakeTensorMode`
instances, ``stock`` for every other mode. Each mode is also listed with the
place it was created (the first frame outside torch and this package) and the
phase it was created in.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

from torch._subclasses import fake_tensor as _ft

import torch_cachepolicy as tcp

__all__ = ["DispatchCensus", "ModeRecord", "Tally", "recording"]

# Frames in these files are skipped when naming where a mode was created:
# the interesting site is the caller that decided to build a mode.
_SKIPPED_PATHS = ("/torch/", "/torch_cachepolicy/", "/benchmarks/dispatch_recorder.py", "contextlib.py")


@dataclass
class Tally:
    """Counts and times of one (phase, kind, namespace) cell."""

    calls: int = 0
    outer_calls: int = 0
    outer_seconds: float = 0.0
    outer_cpu_seconds: float = 0.0
    non_builtin: int = 0


@dataclass
class ModeRecord:
    """A FakeTensorMode constructed while recording."""

    kind: str
    site: str
    phase: str
    calls: int = 0


@dataclass
class DispatchCensus:
    """What :func:`recording` saw. ``phase`` is the current phase's name."""

    phase: str = "-"
    tallies: dict[tuple[str, str, str], Tally] = field(default_factory=dict)
    modes: list[ModeRecord] = field(default_factory=list)
    _mode_index: dict[int, ModeRecord] = field(default_factory=dict, repr=False)

    @contextlib.contextmanager
    def in_phase(self, name: str) -> Iterator[None]:
        """Attributes what happens in this scope to phase ``name``."""
        previous, self.phase = self.phase, name
        try:
            yield
        finally:
            self.phase = previous

    def total(self, *, phase: str | None = None, kind: str | None = None, namespaces: Any = None) -> Tally:
        """The sum of the cells matching the filters (``None``: any)."""
        out = Tally()
        for (p, k, ns), t in self.tallies.items():
            if (
                (phase is None or p == phase)
                and (kind is None or k == kind)
                and (namespaces is None or ns in namespaces)
            ):
                out.calls += t.calls
                out.outer_calls += t.outer_calls
                out.outer_seconds += t.outer_seconds
                out.outer_cpu_seconds += t.outer_cpu_seconds
                out.non_builtin += t.non_builtin
        return out

    def rows(self) -> list[dict[str, Any]]:
        """The cells as JSON-ready dicts, sorted by phase, kind, namespace."""
        return [{"phase": p, "kind": k, "namespace": ns, **vars(t)} for (p, k, ns), t in sorted(self.tallies.items())]


def _site() -> str:
    for frame in reversed(traceback.extract_stack()[:-2]):
        if not any(part in frame.filename for part in _SKIPPED_PATHS):
            path = frame.filename
            for marker in ("site-packages/", "wt-flows/"):
                path = path.split(marker, 1)[-1]
            return f"{path}:{frame.lineno} ({frame.name})"
    return "(torch)"


def _kind(mode: object) -> str:
    return "policy" if isinstance(mode, tcp.FakeTensorMode) else "stock"


@contextlib.contextmanager
def recording(probe: Callable[[Any], None] | None = None) -> Iterator[DispatchCensus]:
    """Records every FakeTensorMode construction and fake dispatch in this scope.

    Args:
        probe: called with the operator before each fake dispatch (tests use
            it to sample global state from inside the dispatch).
    """
    census = DispatchCensus()
    local = threading.local()
    real_init = _ft.FakeTensorMode.__init__
    real_dispatch = _ft.FakeTensorMode.__torch_dispatch__
    counter = _ft.FakeTensorMode.cache_bypasses

    def init(self: _ft.FakeTensorMode, *args: Any, **kwargs: Any) -> None:
        record = ModeRecord(_kind(self), _site(), census.phase)
        census.modes.append(record)
        census._mode_index[id(self)] = record
        real_init(self, *args, **kwargs)

    def torch_dispatch(self: _ft.FakeTensorMode, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if probe is not None:
            probe(func)
        namespace = getattr(func, "namespace", "(hop)")
        key = (census.phase, _kind(self), namespace)
        tally = census.tallies.get(key)
        if tally is None:
            tally = census.tallies[key] = Tally()
        tally.calls += 1
        record = census._mode_index.get(id(self))
        if record is not None:
            record.calls += 1
        stack: list[list[int]] = getattr(local, "stack", None) or []
        local.stack = stack
        outer = not stack
        frame = [counter.get("non-builtin", 0), 0]  # counter at entry, nested bypasses
        stack.append(frame)
        start, cpu_start = time.perf_counter(), time.process_time()
        try:
            return real_dispatch(self, func, types, args, kwargs or {})
        finally:
            if outer:
                tally.outer_calls += 1
                tally.outer_seconds += time.perf_counter() - start
                tally.outer_cpu_seconds += time.process_time() - cpu_start
            stack.pop()
            inclusive = counter.get("non-builtin", 0) - frame[0]
            tally.non_builtin += inclusive - frame[1]
            if stack:
                stack[-1][1] += inclusive

    with (
        mock.patch.object(_ft.FakeTensorMode, "__init__", init),
        mock.patch.object(_ft.FakeTensorMode, "__torch_dispatch__", torch_dispatch),
    ):
        yield census


def print_census(census: DispatchCensus, file: Any = sys.stdout) -> None:
    """A plain listing, for debugging."""
    for row in census.rows():
        print(row, file=file)
    for m in census.modes:
        print(m, file=file)
