"""MEASUREMENT ONLY: records which FakeTensorMode served each fake dispatch, and for how long.

Used by the ExecuTorch integration tests and by ``python -m
benchmarks.executorch --census`` / ``--split``; never by the library, and
never around a timed lowering (the wrapper costs a few microseconds per
dispatch). While a :func:`recording` scope is active it replaces, on torch's
``FakeTensorMode`` class only, ``__init__`` (to learn where each mode was
created) and ``__torch_dispatch__`` (to attribute each dispatch to its mode,
op namespace and phase). Both are restored on exit.

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

With ``outcomes=True`` it also classifies every dispatch by its own cache
outcome (:data:`OUTCOMES`: ``hit``, ``miss``, ``bypass``, or ``uncached`` when
the dispatch never reached the cache, e.g. a meta handler or a
``FakeTensorMode`` rule) and records each dispatch's *exclusive* time (its
inclusive time minus that of the dispatches nested in it), per (phase, kind,
namespace, outcome) and per (phase, kind, op, outcome), with the bypass
reasons per op. Exclusive times of all dispatches add up to the outermost
dispatches' inclusive time, so nothing is counted twice. A dispatch's outcome
is what its own cache lookup did: the counters it moved minus those its nested
dispatches moved (stock modes: torch's class counters; policy modes: the
mode's per-operator counters, read from its private ``_cache.stats``, the ones its
``cache_report()`` sums; a kernel dispatching its own op on the same policy
mode would be counted once for both).

The recorder's own work per dispatch lands inside the times it records (the
clocks start first and stop last in the wrapper); :func:`overhead_per_dispatch`
measures it so that a caller can subtract it.

Mode kinds: ``policy`` for :class:`torch_cachepolicy.FakeTensorMode`
instances, ``stock`` for every other mode. Each mode is also listed with the
place it was created (the first frame outside torch and this package) and the
phase it was created in.
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

import torch
from torch._subclasses import fake_tensor as _ft

import torch_cachepolicy as tcp

__all__ = [
    "OUTCOMES",
    "DispatchCensus",
    "Exclusive",
    "ModeRecord",
    "Tally",
    "overhead_per_dispatch",
    "recording",
]

OUTCOMES: tuple[str, ...] = ("hit", "miss", "bypass", "uncached")
"""A dispatch's own cache outcome (``outcomes=True``); ``uncached``: it never reached the cache."""

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
class Exclusive:
    """Dispatches of one outcome cell and their exclusive wall and CPU time (nested dispatches' time excluded)."""

    calls: int = 0
    seconds: float = 0.0
    cpu_seconds: float = 0.0


@dataclass
class ModeRecord:
    """A FakeTensorMode constructed while recording."""

    kind: str
    site: str
    phase: str
    calls: int = 0


@dataclass
class DispatchCensus:
    """What :func:`recording` saw. ``phase`` is the current phase's name.

    ``outcomes`` (keyed by phase, kind, namespace, outcome), ``op_outcomes``
    (phase, kind, op, outcome) and ``bypass_reasons`` (phase, kind, op,
    reason) are filled only by ``recording(outcomes=True)``.
    """

    phase: str = "-"
    tallies: dict[tuple[str, str, str], Tally] = field(default_factory=dict)
    modes: list[ModeRecord] = field(default_factory=list)
    outcomes: dict[tuple[str, str, str, str], Exclusive] = field(default_factory=dict)
    op_outcomes: dict[tuple[str, str, Any, str], Exclusive] = field(default_factory=dict)
    bypass_reasons: dict[tuple[str, str, Any, str], int] = field(default_factory=dict)
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

    def exclusive(
        self,
        *,
        phase: str | None = None,
        kind: str | None = None,
        namespaces: Any = None,
        outcome: str | None = None,
    ) -> Exclusive:
        """The sum of the outcome cells matching the filters (``None``: any); needs ``outcomes=True``."""
        out = Exclusive()
        for (p, k, ns, o), e in self.outcomes.items():
            if (
                (phase is None or p == phase)
                and (kind is None or k == kind)
                and (namespaces is None or ns in namespaces)
                and (outcome is None or o == outcome)
            ):
                out.calls += e.calls
                out.seconds += e.seconds
                out.cpu_seconds += e.cpu_seconds
        return out

    def rows(self) -> list[dict[str, Any]]:
        """The cells as JSON-ready dicts, sorted by phase, kind, namespace."""
        return [{"phase": p, "kind": k, "namespace": ns, **vars(t)} for (p, k, ns), t in sorted(self.tallies.items())]

    def outcome_rows(self) -> list[dict[str, Any]]:
        """The outcome cells as JSON-ready dicts, sorted by phase, kind, namespace, outcome."""
        return [
            {"phase": p, "kind": k, "namespace": ns, "outcome": o, **vars(e)}
            for (p, k, ns, o), e in sorted(self.outcomes.items())
        ]

    def op_outcome_rows(self) -> list[dict[str, Any]]:
        """Per operator and outcome, as JSON-ready dicts (``op`` as ``str(op)``), most exclusive CPU time first."""
        rows = [
            {"phase": p, "kind": k, "op": str(op), "outcome": o, **vars(e)}
            for (p, k, op, o), e in self.op_outcomes.items()
        ]
        return sorted(rows, key=lambda r: (-r["cpu_seconds"], r["op"], r["outcome"]))

    def bypass_reason_rows(self) -> list[dict[str, Any]]:
        """Per operator and bypass reason, as JSON-ready dicts, most frequent first."""
        rows = [
            {"phase": p, "kind": k, "op": str(op), "reason": r, "calls": n}
            for (p, k, op, r), n in self.bypass_reasons.items()
        ]
        return sorted(rows, key=lambda r: (-r["calls"], r["op"], r["reason"]))


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


_NO_BYPASSES: dict[str, int] = {}


def _policy_counts(mode: object, func: object) -> tuple[int, int, dict[str, int]]:
    """A policy mode's hits, misses and bypasses (by reason) of ``func`` so far.

    MEASUREMENT ONLY: reads the mode's private per-operator counters (the ones
    ``cache_report()`` sums; ``cache_info()`` would sum every operator's on
    each dispatch). Without them every dispatch reads as ``uncached``, which
    :func:`benchmarks.executorch.census.split_lowering` reports as a mismatch
    against ``cache_info()``.
    """
    state = getattr(mode, "_cache", None)  # the mode's torch_cachepolicy._state.CacheState
    entry = state.stats.get(func) if state is not None else None
    if entry is None:
        return 0, 0, _NO_BYPASSES
    return entry.hits, entry.misses, dict(entry.bypasses)


class _Frame:
    """One dispatch in progress (``outcomes=True``): counters at entry, what nested dispatches took."""

    __slots__ = ("child_cpu", "child_seconds", "child_stock", "child_stock_bypasses", "entry_policy", "entry_stock")

    def __init__(self) -> None:
        self.child_seconds = 0.0
        self.child_cpu = 0.0
        # Class counters (hits, misses, bypasses) moved by nested dispatches, and their bypass reasons.
        self.child_stock = (0, 0, 0)
        self.child_stock_bypasses: dict[str, int] = {}
        self.entry_stock: tuple[int, int, dict[str, int]] = (0, 0, _NO_BYPASSES)
        self.entry_policy: tuple[int, int, dict[str, int]] = (0, 0, _NO_BYPASSES)


def _stock_counts() -> tuple[int, int, dict[str, int]]:
    cls = _ft.FakeTensorMode
    return cls.cache_hits, cls.cache_misses, dict(cls.cache_bypasses)


def _diff(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: n - before.get(k, 0) for k, n in after.items() if n != before.get(k, 0)}


def _add(cells: dict[Any, Exclusive], key: Any, seconds: float, cpu_seconds: float) -> None:
    cell = cells.get(key)
    if cell is None:
        cell = cells[key] = Exclusive()
    cell.calls += 1
    cell.seconds += seconds
    cell.cpu_seconds += cpu_seconds


def _own_outcome(
    hits: int, misses: int, bypasses: dict[str, int]
) -> tuple[str, str | None]:
    """The outcome of one dispatch from the counters it moved itself; the bypass reason, if any."""
    if hits:
        return "hit", None
    if misses:
        return "miss", None
    for reason, n in bypasses.items():
        if n:
            return "bypass", reason
    return "uncached", None


@contextlib.contextmanager
def recording(probe: Callable[[Any], None] | None = None, *, outcomes: bool = False) -> Iterator[DispatchCensus]:
    """Records every FakeTensorMode construction and fake dispatch in this scope.

    Args:
        probe: called with the operator before each fake dispatch (tests use
            it to sample global state from inside the dispatch).
        outcomes: also classify each dispatch by its cache outcome and record
            exclusive times (a few microseconds more per dispatch).
    """
    census = DispatchCensus()
    local = threading.local()
    real_init = _ft.FakeTensorMode.__init__
    real_dispatch = _ft.FakeTensorMode.__torch_dispatch__
    counter = _ft.FakeTensorMode.cache_bypasses
    perf_counter, process_time = time.perf_counter, time.process_time

    def init(self: _ft.FakeTensorMode, *args: Any, **kwargs: Any) -> None:
        record = ModeRecord(_kind(self), _site(), census.phase)
        census.modes.append(record)
        census._mode_index[id(self)] = record
        real_init(self, *args, **kwargs)

    def torch_dispatch(self: _ft.FakeTensorMode, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        # The clocks start first and stop last: the recorder's own work is
        # inside the times it records (see overhead_per_dispatch).
        start, cpu_start = perf_counter(), process_time()
        if probe is not None:
            probe(func)
        kind = _kind(self)
        namespace = getattr(func, "namespace", "(hop)")
        key = (census.phase, kind, namespace)
        tally = census.tallies.get(key)
        if tally is None:
            tally = census.tallies[key] = Tally()
        tally.calls += 1
        record = census._mode_index.get(id(self))
        if record is not None:
            record.calls += 1
        stack: list[Any] | None = getattr(local, "stack", None)
        if stack is None:
            stack = local.stack = []
        outer = not stack
        frame: Any
        if outcomes:
            frame = _Frame()
            frame.entry_stock = _stock_counts()
            if kind == "policy":
                frame.entry_policy = _policy_counts(self, func)
        else:
            frame = [counter.get("non-builtin", 0), 0]  # counter at entry, nested bypasses
        stack.append(frame)
        try:
            return real_dispatch(self, func, types, args, kwargs or {})
        finally:
            stack.pop()
            parent = stack[-1] if stack else None
            if outcomes:
                _close_frame(census, self, func, kind, namespace, tally, frame, parent, start, cpu_start)
            else:
                inclusive = counter.get("non-builtin", 0) - frame[0]
                tally.non_builtin += inclusive - frame[1]
                if parent is not None:
                    parent[1] += inclusive
                if outer:
                    tally.outer_calls += 1
                    tally.outer_seconds += perf_counter() - start
                    tally.outer_cpu_seconds += process_time() - cpu_start

    def _close_frame(
        census: DispatchCensus,
        mode: Any,
        func: Any,
        kind: str,
        namespace: str,
        tally: Tally,
        frame: _Frame,
        parent: _Frame | None,
        start: float,
        cpu_start: float,
    ) -> None:
        hits, misses, bypasses = _stock_counts()
        h0, m0, b0 = frame.entry_stock
        # What this dispatch and its nested ones moved on the class counters.
        moved = (hits - h0, misses - m0, sum(bypasses.values()) - sum(b0.values()))
        moved_reasons = _diff(bypasses, b0) if moved[2] else _NO_BYPASSES
        own_reasons = (
            {r: n - frame.child_stock_bypasses.get(r, 0) for r, n in moved_reasons.items()}
            if moved_reasons
            else _NO_BYPASSES
        )
        tally.non_builtin += own_reasons.get("non-builtin", 0)
        if kind == "policy":
            ph, pm, pb = _policy_counts(mode, func)
            eh, em, eb = frame.entry_policy
            outcome, reason = _own_outcome(ph - eh, pm - em, _diff(pb, eb))
        else:
            c = frame.child_stock
            own_bypass = {r: n for r, n in own_reasons.items() if n}
            outcome, reason = _own_outcome(moved[0] - c[0], moved[1] - c[1], own_bypass)
        if parent is not None:
            parent.child_stock = (
                parent.child_stock[0] + moved[0],
                parent.child_stock[1] + moved[1],
                parent.child_stock[2] + moved[2],
            )
            if moved_reasons:
                merged = dict(parent.child_stock_bypasses)
                for r, n in moved_reasons.items():
                    merged[r] = merged.get(r, 0) + n
                parent.child_stock_bypasses = merged
        phase = census.phase
        seconds, cpu_seconds = perf_counter() - start, process_time() - cpu_start
        if parent is not None:
            parent.child_seconds += seconds
            parent.child_cpu += cpu_seconds
        else:
            tally.outer_calls += 1
            tally.outer_seconds += seconds
            tally.outer_cpu_seconds += cpu_seconds
        own, own_cpu = seconds - frame.child_seconds, cpu_seconds - frame.child_cpu
        _add(census.outcomes, (phase, kind, namespace, outcome), own, own_cpu)
        _add(census.op_outcomes, (phase, kind, func, outcome), own, own_cpu)
        if reason is not None:
            rkey = (phase, kind, func, reason)
            census.bypass_reasons[rkey] = census.bypass_reasons.get(rkey, 0) + 1

    with (
        mock.patch.object(_ft.FakeTensorMode, "__init__", init),
        mock.patch.object(_ft.FakeTensorMode, "__torch_dispatch__", torch_dispatch),
    ):
        yield census


def overhead_per_dispatch(*, outcomes: bool = True, batches: int = 9, calls: int = 300) -> dict[str, dict[str, float]]:
    """What :func:`recording` adds to one fake dispatch, in seconds, per mode kind.

    Times ``calls`` aten hits (``add`` of two FakeTensors) on a stock mode
    and on a policy mode, in batches alternating between plain and recorded
    (``outcomes`` as given), and returns, per kind, the median over batches
    of (recorded - plain) per call, wall and CPU: ``{"stock": {"seconds",
    "cpu_seconds"}, "policy": {...}}``. Nested dispatches cost the same
    bookkeeping, so the recorder's share of a recorded span is about this
    figure times its dispatches (``calls`` of the census).
    """
    from benchmarks.timing import timed

    out: dict[str, dict[str, float]] = {}
    for kind, mode in (
        ("stock", _ft.FakeTensorMode()),
        ("policy", tcp.FakeTensorMode(cache_policy=tcp.CachePolicy())),
    ):
        x = mode.from_tensor(torch.zeros(4, 4))

        def batch(mode: _ft.FakeTensorMode = mode, x: Any = x) -> None:
            with mode:
                for _ in range(calls):
                    torch.add(x, x)

        batch()  # the miss that fills the entry
        walls: list[float] = []
        cpus: list[float] = []
        for b in range(batches):
            plain_first = b % 2 == 0
            times: dict[bool, tuple[float, float]] = {}
            for recorded in (not plain_first, plain_first):
                with contextlib.ExitStack() as stack:
                    if recorded:
                        stack.enter_context(recording(outcomes=outcomes))
                    with timed(collect=False) as timing:
                        batch()
                times[recorded] = (timing.seconds, timing.cpu_seconds)
            walls.append((times[True][0] - times[False][0]) / calls)
            cpus.append((times[True][1] - times[False][1]) / calls)
        out[kind] = {"seconds": statistics.median(walls), "cpu_seconds": statistics.median(cpus)}
    return out


def print_census(census: DispatchCensus, file: Any = sys.stdout) -> None:
    """A plain listing, for debugging."""
    for row in census.rows():
        print(row, file=file)
    for m in census.modes:
        print(m, file=file)
