"""The census of entry kinds: which kinds of cache entry real work creates and hits, and what each kind saves.

A policy mode's entries come in kinds, each with its own machinery (Note [Kinds of entry]). For each workload of
:data:`WORKLOADS` (the ExecuTorch flows and ``torch.export`` + ``run_decompositions()`` of common model shapes),
:func:`entry_census` counts, on one run with every kind on, the entries created and the hits served per kind; then
it times the workload with every kind on and with each kind that made an entry switched off (its dispatches
bypass, as stock would treat them), interleaved, several rounds, in process CPU time. What a kind saves is
``1 - on / off`` per round (the share of the workload's time with the kind off that the kind takes away), median
over rounds.

The counting and the switches wrap the package's private functions from outside (:func:`instrument`); the package
has no census hooks of its own. Nothing here runs in a timed span but the work itself and those wrappers, which
cost the same in every configuration of a round.
"""

# Note [Kinds of entry]
# ~~~~~~~~~~~~~~~~~~~~~
# An entry, or a hit, belongs to every kind whose machinery it needed; the kinds overlap:
#   aten        an aten/prim/prims op's entry (torch's storage, or the store's when private or isolated);
#   backend     an entry of an op the policy admits beyond the builtins;
#   context     a backend entry of an op whose fake kernel reads the policy's context (context_key);
#   symbolic    a backend entry whose key holds symbols (sub-tables by what the ShapeEnv knows).
# Switched off, a kind's dispatches bypass: aten and backend ops are routed to a bypass, context and symbolic
# lookups raise one. Three kinds the census removed (docs/design.md, "Kinds of entry") were counted by this module
# at commit 59b3e54: Dependent entries (a kernel that dispatched backend ops), higher-order operators' entries, and
# the second look of a guard-free ShapeEnv scope.

from __future__ import annotations

import collections
import contextlib
import io
import itertools
import statistics
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch._subclasses import fake_tensor as _ft
from torch._subclasses.fake_tensor import _BypassDispatchCache, _DispatchCacheBypassEntry

import torch_cachepolicy as tcp
from benchmarks.progress import Rounds
from benchmarks.timing import timed
from torch_cachepolicy import _driver, _routes, _state

__all__ = ["KINDS", "WORKLOADS", "Tally", "Workload", "entry_census", "instrument"]

KINDS: tuple[str, ...] = ("aten", "backend", "context", "symbolic")
"""The kinds of entry (Note [Kinds of entry])."""

SCHEMA = "benchmarks.executorch.entry_kinds/1"


@dataclass
class Tally:
    """Entries created and hits served per kind (Note [Kinds of entry]); ``negative`` counts negative entries by
    the kind of their op, ``by_op`` hits per (kind, op)."""

    created: collections.Counter[str] = field(default_factory=collections.Counter)
    hits: collections.Counter[str] = field(default_factory=collections.Counter)
    negative: collections.Counter[str] = field(default_factory=collections.Counter)
    by_op: collections.Counter[tuple[str, str]] = field(default_factory=collections.Counter)

    def as_dict(self) -> dict[str, Any]:
        return {
            "created": dict(self.created),
            "hits": dict(self.hits),
            "negative": dict(self.negative),
            "top_hits": {f"{kind} {op}": n for (kind, op), n in self.by_op.most_common(12)},
        }


class _Call:
    """What the wrappers learn about one cached dispatch while it runs."""

    __slots__ = ("func", "shape_env", "state")

    def __init__(self, state: Any, func: object) -> None:
        self.state = state
        self.func = func
        self.shape_env: object = None


_local = threading.local()


def _calls() -> list[_Call]:
    stack: list[_Call] | None = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    return stack


def _kinds(route: _routes.Route, shape_env: object) -> list[str]:
    """The kinds an entry or hit of ``route`` belongs to."""
    if route.kind is _routes.STOCK:
        return ["aten"]
    assert route.deps is not None
    kinds = ["backend"]
    if route.deps.uses_context:
        kinds.append("context")
    if shape_env is not None:
        kinds.append("symbolic")
    return kinds


@contextlib.contextmanager
def instrument(tally: Tally | None = None, off: str | None = None) -> Iterator[None]:
    """Counts entries and hits per kind into ``tally`` and/or switches kind ``off`` (Note [Kinds of entry]).

    Patches the package's private functions for the duration of the block, in this process (the modes made
    inside are the ones affected: routes are memoized per mode, so make the modes inside the block).
    """
    if off is not None and off not in KINDS:
        raise ValueError(f"instrument(off=...): expected one of {KINDS}, got {off!r}")
    reason = f"census: {off} switched off"
    state_globals = vars(_state)
    cached_dispatch, table_of, store, route_for = (
        _driver.cached_dispatch, _driver._table, _driver._store, state_globals["route_for"]
    )

    def counted_dispatch(mode: Any, state: Any, func: Any, *rest: Any) -> object:
        stats = state.stats.get(func)
        before = 0 if stats is None else stats.hits
        call = _Call(state, func)
        stack = _calls()
        stack.append(call)
        try:
            return cached_dispatch(mode, state, func, *rest)
        finally:
            stack.pop()
            stats = state.stats.get(func)
            route = state.routes.get(func)
            if tally is not None and stats is not None and route is not None and stats.hits > before:
                for kind in _kinds(route, call.shape_env):
                    tally.hits[kind] += 1
                    tally.by_op[(kind, str(func))] += 1

    def table(state: Any, route: Any, table_key: Any, key_state: Any, shape_env: Any) -> Any:
        stack = _calls()
        if stack:
            stack[-1].shape_env = shape_env
        if off == "context" and route.kind is _routes.POLICY and route.deps.uses_context:
            raise _BypassDispatchCache(reason)
        if off == "symbolic" and route.kind is not _routes.STOCK and shape_env is not None:
            raise _BypassDispatchCache(reason)
        return table_of(state, route, table_key, key_state, shape_env)

    def stored(key: Any, shape_env: Any, entry: Any, where: Any) -> None:
        stack = _calls()
        # A key's "seen once" mark is not an entry (Note [An entry on a key's second sight]).
        if tally is not None and stack and entry is not _driver._SEEN:
            current = stack[-1]
            counter = tally.negative if isinstance(entry, _DispatchCacheBypassEntry) else tally.created
            for kind in _kinds(current.state.route(current.func), current.shape_env):
                counter[kind] += 1
        store(key, shape_env, entry, where)

    def routed(policy: Any, func: Any, stats: Any, private: bool) -> tuple[Any, bool]:
        route, memoized = route_for(policy, func, stats, private)
        kind = {_routes.STOCK: "aten", _routes.POLICY: "backend"}.get(route.kind)
        if off is not None and kind == off:
            return _routes.Route(_routes.BYPASS, func, stats, reason), memoized
        return route, memoized

    _driver.cached_dispatch = counted_dispatch  # type: ignore[assignment]
    _driver._table = table  # type: ignore[assignment]
    _driver._store = stored  # type: ignore[assignment]
    state_globals["route_for"] = routed
    try:
        yield
    finally:
        _driver.cached_dispatch, _driver._table, _driver._store = cached_dispatch, table_of, store  # type: ignore[assignment]
        state_globals["route_for"] = route_for


# ------------------------------------------------------------------ workloads


@dataclass(frozen=True)
class Workload:
    """One piece of real work: ``prepare()`` once, then ``run(prepared)`` per measured run (the timed span)."""

    name: str
    title: str
    prepare: Callable[[], Any] = field(repr=False)
    run: Callable[[Any], object] = field(repr=False)
    needs_executorch: bool = True


def _executorch_workload(flow: str, model: str) -> Workload:
    def prepare() -> Any:
        from benchmarks.executorch.lowering import quantized_program_factory

        return quantized_program_factory(flow=flow, model=model)

    def run(fresh_program: Any) -> object:
        from benchmarks.executorch.flows import get_flow
        from torch_cachepolicy.recipes.executorch import executorch_policy

        ep = fresh_program()  # outside the timed span: see entry_census
        return lambda: _lower(get_flow(flow), ep, executorch_policy())

    suffix = "" if model == "tiny" else f" ({model} model)"
    return Workload(f"{flow}{'' if model == 'tiny' else '-' + model}", f"ExecuTorch {flow} lowering{suffix}", prepare, run)


def _lower(spec: Any, ep: Any, policy: tcp.CachePolicy) -> object:
    with contextlib.redirect_stdout(io.StringIO()):  # Vela's summary
        tcp.adopt(ep, cache_policy=policy)
        return spec.lower_program(ep)


class _Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        widths = (64, 128, 128, 128, 64)
        self.layers = torch.nn.Sequential(
            *(m for a, b in itertools.pairwise(widths) for m in (torch.nn.Linear(a, b), torch.nn.GELU()))
        )
        self.head = torch.nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.layers(x))


def _export_workload(name: str, title: str, build: Callable[[], tuple[torch.nn.Module, tuple[Any, ...], Any]]) -> Workload:
    def prepare() -> Any:
        return build()

    def run(built: Any) -> object:
        module, example, dynamic_shapes = built
        policy = tcp.CachePolicy()

        def work() -> object:
            ep = tcp.export(module, example, dynamic_shapes=dynamic_shapes, cache_policy=policy)
            return ep.run_decompositions()

        return work

    return Workload(name, title, prepare, run, needs_executorch=False)


def _mlp() -> tuple[torch.nn.Module, tuple[Any, ...], Any]:
    torch.manual_seed(0)
    return _Mlp().eval(), (torch.randn(8, 64),), None


def _convnet() -> tuple[torch.nn.Module, tuple[Any, ...], Any]:
    from benchmarks.executorch.models import model_case

    case = model_case("large", family="image")
    return case.module, case.example, None


def _transformer() -> tuple[torch.nn.Module, tuple[Any, ...], Any]:
    from benchmarks.executorch.models import model_case

    case = model_case("large", family="sequence")
    return case.module, case.example, case.dynamic_shapes


WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        _executorch_workload("ethos-u55", "tiny"),
        _executorch_workload("cortex-m", "tiny"),
        _executorch_workload("xnnpack", "tiny"),
        _executorch_workload("xnnpack-dynamic", "tiny"),
        _executorch_workload("ethos-u55", "large"),
        _export_workload("export-mlp", "torch.export + run_decompositions: an MLP (4 linear+GELU)", _mlp),
        _export_workload("export-convnet", "torch.export + run_decompositions: a MobileNet-style conv net", _convnet),
        _export_workload(
            "export-transformer",
            "torch.export + run_decompositions: a 4-layer transformer encoder, dynamic sequence length",
            _transformer,
        ),
    )
}
"""The work the census runs, by name."""


# ------------------------------------------------------------------ the census


def _run_once(work: Workload, prepared: Any, tally: Tally | None, off: str | None) -> float:
    """One run of ``work`` from a cold torch cache; its CPU seconds (the work only)."""
    # Every run starts as a fresh process would: torch's class-wide cache empty (aten entries of earlier runs
    # would otherwise serve this one, in some configurations and not others).
    _ft.FakeTensorMode.cache_clear()
    job = work.run(prepared)
    with instrument(tally, off), timed() as timing:
        job()  # type: ignore[operator]
    return timing.cpu_seconds


def entry_census(
    names: Sequence[str] = tuple(WORKLOADS),
    *,
    rounds: int = 5,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Counts entries and hits per kind on each workload, then times each kind switched off against all on.

    Args:
        names: names of :data:`WORKLOADS`.
        rounds: measured rounds per workload, after one discarded warm-up run of each configuration.
        progress: called with a line per round.

    Returns:
        ``{"schema", "settings", "workloads"}``; ``workloads[name]`` has ``counts`` (:meth:`Tally.as_dict` of
        one run with every kind on), ``timed`` (the kinds timed: those that made an entry), ``cpu_seconds``
        per configuration per round (``"on"`` and ``"<kind> off"``), and ``saves[kind]`` (median, min and max
        over rounds of ``1 - on / off``; 0 by construction, untimed, for a kind that made no entry).
    """
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        raise ValueError(f"entry_census(...): unknown workloads {unknown}; expected names of {list(WORKLOADS)}")
    if rounds < 1:
        raise ValueError(f"entry_census(rounds=...): expected at least 1, got {rounds}")
    out: dict[str, Any] = {}
    for name in names:
        work = WORKLOADS[name]
        prepared = work.prepare()
        tally = Tally()
        _run_once(work, prepared, tally, None)
        timed_kinds = [k for k in KINDS if tally.created[k] or tally.hits[k]]
        configs = [None, *timed_kinds]
        clock = Rounds(rounds + 1, progress)
        seconds: dict[str, list[float]] = {_label(c): [] for c in configs}
        for r in range(rounds + 1):
            order = configs[r % len(configs) :] + configs[: r % len(configs)]
            line = []
            for config in order:
                t = _run_once(work, prepared, None, config)
                if r:  # round 0 warms every configuration up and is discarded
                    seconds[_label(config)].append(t)
                line.append(f"{_label(config)} {t:.2f}")
            clock.done(f"{name} {'warm-up' if not r else f'round {r}/{rounds}'}, CPU s: {', '.join(line)}")
        saves: dict[str, Any] = {}
        for kind in KINDS:
            if kind not in timed_kinds:
                saves[kind] = {"median": 0.0, "min": 0.0, "max": 0.0, "timed": False}
                continue
            per_round = [1 - on / off for on, off in zip(seconds["on"], seconds[f"{kind} off"], strict=True)]
            saves[kind] = {
                "median": statistics.median(per_round),
                "min": min(per_round),
                "max": max(per_round),
                "timed": True,
            }
        out[name] = {
            "title": work.title,
            "counts": tally.as_dict(),
            "timed": timed_kinds,
            "cpu_seconds": seconds,
            "saves": saves,
        }
    return {"schema": SCHEMA, "settings": {"rounds": rounds, "workloads": list(names)}, "workloads": out}


def _label(config: str | None) -> str:
    return "on" if config is None else f"{config} off"


def render(result: dict[str, Any]) -> str:
    """The census as Markdown: entries created / hits per kind, and what each kind saves (median, range)."""
    lines = [
        "| work | " + " | ".join(KINDS) + " |",
        "| --- | " + " | ".join("---" for _ in KINDS) + " |",
    ]
    for name, w in result["workloads"].items():
        cells = []
        for kind in KINDS:
            created = w["counts"]["created"].get(kind, 0)
            hits = w["counts"]["hits"].get(kind, 0)
            s = w["saves"][kind]
            saved = f"{100 * s['median']:.1f}% ({100 * s['min']:.1f} to {100 * s['max']:.1f})" if s["timed"] else "-"
            cells.append(f"{created} / {hits}; {saved}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(
        "Each cell: entries created / hits served on one run with every kind on; what the kind saves (`1 - on/off` "
        f"in CPU time, median and range over {result['settings']['rounds']} interleaved rounds; `-`: made no entry, "
        "not timed)."
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m benchmarks.executorch.entry_kinds``: the census as Markdown on stdout (and JSON with ``--json``)."""
    import argparse
    import json
    import pathlib

    from benchmarks.progress import StderrProgress

    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.executorch.entry_kinds",
        description="Counts cache entries and hits per kind of entry on real work, and times each kind off.",
    )
    parser.add_argument("--work", default="all", help=f"comma-separated subset of {','.join(WORKLOADS)} (default all)")
    parser.add_argument("--rounds", type=int, default=5, help="measured rounds per workload (default 5)")
    parser.add_argument("--json", type=pathlib.Path, help="also write the result as JSON here")
    args = parser.parse_args(argv)
    names = list(WORKLOADS) if args.work == "all" else [n for n in args.work.split(",") if n]
    result = entry_census(names, rounds=args.rounds, progress=StderrProgress())
    table = render(result)
    print(table)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2, default=str) + "\n")
        args.json.with_suffix(".md").write_text(table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
