"""Run one of torch's own test files stock and with ``torch_cachepolicy.FakeTensorMode``, and compare.

Usage, from the repository root (torch's test files live outside the repository)::

    python test/peer_suite.py PATH/TO/torch/test/test_custom_ops.py [-k EXPR] [--scope process|module]
        [--timeout SECONDS] [--out DIR]

The runner starts ``python -m pytest PATH`` twice, each in a fresh subprocess whose working directory is the
test file's directory: once stock (``PEER_SUITE_CONFIG=stock``) and once with the rebinding
(``PEER_SUITE_CONFIG=ours``). Both children load this module as a pytest plugin (``-p peer_suite``), which
records every test's outcome (passed, failed, skipped, error, xfailed, xpassed) and, for failures and errors,
the first lines of the traceback, into a JSON file. The parent then prints the counts of both runs, the tests
that pass under stock and fail (or error) under ours, and the reverse. ``--out DIR`` keeps both JSON files
and both pytest logs. The exit status is 1 when a test passes under stock and not under ours, else 0.

Nothing is changed in the parent process, nor in the package: the rebinding is done by the plugin, in the
child run with ``PEER_SUITE_CONFIG=ours`` only, at ``pytest_configure`` (before pytest imports the test
module). Which names are rebound, and why:

* **The test code's names** (``--scope module`` and ``--scope process``). Test code is every Python file under
  the test file's directory (the test file and the ``test/`` siblings it imports). The module objects
  ``torch._subclasses`` and ``torch._subclasses.fake_tensor`` get a module class whose attribute lookup
  answers ``FakeTensorMode`` with :class:`PeerFakeTensorMode` when, and only when, the calling frame belongs
  to test code. So ``from torch._subclasses.fake_tensor import FakeTensorMode`` in the test file,
  ``torch._subclasses.FakeTensorMode()`` and ``torch._subclasses.fake_tensor.FakeTensorMode.cache_info()``
  written in a test all see our class, while torch's own modules reading the same attributes
  (``isinstance`` checks, ``py_impl(FakeTensorMode)`` registrations of lazily imported modules) still get
  torch's class. The module global ``FakeTensorMode`` in ``torch/_subclasses/fake_tensor.py`` is never
  rebound: torch's code reads it for its class counters (``FakeTensorMode.cache_hits += 1`` would then
  create counters on our class), its shared cache dict and its ``isinstance`` checks.
* **Modes torch creates internally** (``--scope process``, the default). ``torch.library.opcheck``,
  ``make_fx(tracing_mode="fake"/"symbolic")``, dynamo, AOTAutograd and export build their modes with
  ``FakeTensorMode(...)`` inside torch. To reach those without rebinding any name, the child sets
  ``FakeTensorMode.__new__`` on torch's class so that constructing exactly torch's class returns a
  :class:`PeerFakeTensorMode` (whose ``__init__`` then runs). Every name, ``isinstance`` check, class
  counter and ``python_key_table`` key stays torch's; only the instances are ours. This patch writes a
  torch class attribute, which is acceptable in this test harness's child process only and never happens in
  the package. With ``--scope module`` torch's internal modes stay stock.
* ``--class-api aggregate`` (a probe): ``cache_info()``/``cache_clear()`` called on our class sum/clear every
  live instance (torch's are class-wide), so the tests after such a call run on.
* ``--scope instances`` (a probe): the construction redirect alone, no name rebound. The test code then calls
  torch's class for class-level APIs (``FakeTensorMode.cache_info()``, ``FakeTensorMode.cache_clear()``, the
  shared ``FakeTensorMode.cache``) while every instance it makes is ours: it shows what lies behind a
  difference that the first class-level call hides under the default scope.

:class:`PeerFakeTensorMode` is ``torch_cachepolicy.FakeTensorMode`` whose default ``cache_policy`` (when the
caller passes none, as torch's tests and torch's internals do) is ``CachePolicy(predicate=admit_every_op)``:
aten/prim/prims as stock, plus every other namespace, so the test files' own namespaces (``mylib``,
``_torch_testing``, ``_test_custom_op``, ``mini_op_test``, ...) are all cached and checked.

Tests are identified by pytest node id; a test that exists in one run only (a collection difference) is
listed as such.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time
import types
import weakref
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
HERE = pathlib.Path(__file__).resolve().parent

ENV_CONFIG = "PEER_SUITE_CONFIG"  # "stock" or "ours"
ENV_SCOPE = "PEER_SUITE_SCOPE"  # "process" or "module"
ENV_OUT = "PEER_SUITE_OUT"  # where the child writes its outcomes (JSON)
ENV_TEST_ROOT = "PEER_SUITE_TEST_ROOT"  # the directory whose files count as test code
ENV_CLASS_API = "PEER_SUITE_CLASS_API"  # "raw" or "aggregate" (see --class-api)

OUTCOMES = ("passed", "failed", "error", "skipped", "xfailed", "xpassed")
FAILING = frozenset({"failed", "error"})
DETAIL_CHARS = 6000

# --------------------------------------------------------------------------------------------------------------
# The pytest plugin (runs in the child processes only).
# --------------------------------------------------------------------------------------------------------------

_results: dict[str, str] = {}
_details: dict[str, str] = {}
_patched: list[str] = []
_instances: list[int] = [0]  # PeerFakeTensorMode instances made in this child (shows the rebinding is reached)
# Every per-op statistics dict of those instances (read at the end), with the counts it started from: a mode's
# copy starts from a copy of the original's counters, which the totals must not count twice.
_all_stats: list[tuple[dict[Any, Any], dict[Any, tuple[int, int, Counter[str]]]]] = []
_live_modes: weakref.WeakSet[Any] = weakref.WeakSet()  # for --class-api aggregate


def admit_every_op(op: Any) -> bool:
    """The harness policy's predicate: every operator outside aten/prim/prims is admitted."""
    return True


class _ClassLevelAggregate:
    """``--class-api aggregate`` (a probe): ``cache_info``/``cache_clear`` read on the class act on every live
    PeerFakeTensorMode (summed / each cleared), as torch's class-wide counters do; on an instance they are the
    package's own per-instance methods."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        if obj is not None:
            return getattr(objtype.__mro__[1], self.name).__get__(obj, objtype)
        name = self.name

        def on_every_live_mode() -> Any:
            from torch._subclasses.fake_tensor import DispatchCacheInfo

            modes = list(_live_modes)
            if name == "cache_clear":
                for m in modes:
                    m.cache_clear()
                return None
            infos = [m.cache_info() for m in modes]
            bypasses: Counter[str] = Counter()
            for i in infos:
                bypasses.update(i.bypasses)
            return DispatchCacheInfo(
                sum(i.hits for i in infos), sum(i.misses for i in infos), dict(bypasses), sum(i.size for i in infos)
            )

        return on_every_live_mode


def _make_peer_class() -> type:
    import torch_cachepolicy as tcp
    from torch_cachepolicy._state import CacheState

    class RecordedCacheState(CacheState):
        """Read-only instrumentation: a mode's cache state (``mode._cache``) keeps its per-op counters in
        ``stats``, a dict it replaces on cache_clear. Remembering each dict (not the mode, nor the state, which holds
        the store) lets the harness total hits/misses/bypasses per namespace at the end without keeping any mode
        alive. No slot of its own, so a CacheState can take this class."""

        __slots__ = ()

        @property  # type: ignore[override]
        def stats(self) -> dict[Any, Any]:
            return CacheState.stats.__get__(self)  # type: ignore[attr-defined,no-any-return]

        @stats.setter
        def stats(self, value: dict[Any, Any]) -> None:
            CacheState.stats.__set__(self, value)  # type: ignore[attr-defined]
            _all_stats.append((value, {}))  # a mode's first dict, or cache_clear's: empty

        @staticmethod
        def record(state: CacheState) -> None:
            state.__class__ = RecordedCacheState
            inherited = {op: (st.hits, st.misses, Counter(st.bypasses)) for op, st in state.stats.items()}
            _all_stats.append((state.stats, inherited))

        def _copy(self, policy: Any, store: Any, memo: dict[int, Any] | None) -> CacheState:
            clone = super()._copy(policy, store, memo)  # a mode's copy.copy / copy.deepcopy
            RecordedCacheState.record(clone)
            return clone

    class PeerFakeTensorMode(tcp.FakeTensorMode):  # type: ignore[no-untyped-call]
        """``torch_cachepolicy.FakeTensorMode`` that admits every namespace unless told otherwise."""

        def __init__(self, *, cache_policy: Any = None, **kwargs: Any) -> None:
            if cache_policy is None:
                cache_policy = tcp.CachePolicy(predicate=admit_every_op)
            super().__init__(cache_policy=cache_policy, **kwargs)
            RecordedCacheState.record(self._cache)
            _instances[0] += 1
            _live_modes.add(self)

    if os.environ.get(ENV_CLASS_API) == "aggregate":
        setattr(PeerFakeTensorMode, "cache_info", _ClassLevelAggregate("cache_info"))  # noqa: B010
        setattr(PeerFakeTensorMode, "cache_clear", _ClassLevelAggregate("cache_clear"))  # noqa: B010
        _patched.append("class-level cache_info()/cache_clear() aggregate every live mode (probe)")
    return PeerFakeTensorMode


def _cache_totals() -> dict[str, dict[str, Any]]:
    """Hits, misses and bypass reasons of every PeerFakeTensorMode, by namespace group."""
    totals: dict[str, dict[str, Any]] = {}
    for stats, inherited in _all_stats:
        for op, st in list(stats.items()):
            ns = getattr(op, "namespace", None) or "(hop)"
            group = ns if ns in ("aten", "prim", "prims", "(hop)") else "other namespaces"
            t = totals.setdefault(group, {"hits": 0, "misses": 0, "bypasses": Counter()})
            hits, misses, bypasses = inherited.get(op, (0, 0, Counter()))
            t["hits"] += st.hits - hits
            t["misses"] += st.misses - misses
            t["bypasses"].update(Counter(st.bypasses) - bypasses)
    return {
        g: {"hits": t["hits"], "misses": t["misses"], "bypasses": dict(t["bypasses"].most_common())}
        for g, t in sorted(totals.items())
    }


def _is_test_code(filename: str, test_root: str) -> bool:
    try:
        return os.path.realpath(filename).startswith(test_root)
    except (TypeError, ValueError):
        return False


def _rebind_for_test_code(module: types.ModuleType, peer: type, test_root: str) -> None:
    """Answer ``module.FakeTensorMode`` with ``peer`` for callers in test code, torch's class otherwise."""
    base = type(module)

    def __getattribute__(self: types.ModuleType, name: str) -> Any:
        if name == "FakeTensorMode":
            frame = sys._getframe(1)
            if _is_test_code(frame.f_code.co_filename, test_root):
                return peer
        return base.__getattribute__(self, name)

    cls = type(f"PeerSuiteModule[{module.__name__}]", (base,), {"__getattribute__": __getattribute__})
    module.__class__ = cls
    _patched.append(f"{module.__name__}.FakeTensorMode (for callers under {test_root})")


def _redirect_construction(stock: type, peer: type) -> None:
    """Make ``stock(...)`` (exactly torch's class) build a ``peer`` instance; subclasses are untouched."""

    def __new__(cls: type, *args: Any, **kwargs: Any) -> Any:
        return object.__new__(peer if cls is stock else cls)

    stock.__new__ = __new__  # type: ignore[assignment]
    _patched.append(f"{stock.__module__}.{stock.__qualname__}.__new__ (construction returns {peer.__name__})")


def install(scope: str, test_root: str) -> None:
    """Rebind as the module docstring describes (child process only)."""
    import torch._subclasses
    import torch._subclasses.fake_tensor as fake_tensor

    peer = _make_peer_class()
    stock = fake_tensor.FakeTensorMode
    if scope in ("process", "module"):
        _rebind_for_test_code(torch._subclasses, peer, test_root)
        _rebind_for_test_code(fake_tensor, peer, test_root)
    if scope in ("process", "instances"):
        _redirect_construction(stock, peer)


def pytest_configure(config: Any) -> None:
    if os.environ.get(ENV_CONFIG) == "ours":
        install(os.environ.get(ENV_SCOPE, "process"), os.environ[ENV_TEST_ROOT])


def pytest_report_header(config: Any) -> list[str]:
    lines = [f"peer_suite: configuration {os.environ.get(ENV_CONFIG, 'stock')}"]
    lines += [f"peer_suite: rebound {p}" for p in _patched]
    return lines


def _record(nodeid: str, outcome: str, report: Any) -> None:
    previous = _results.get(nodeid)
    # A failing teardown turns a passed test into an error; never hide an earlier failure.
    if previous in FAILING and outcome not in FAILING:
        return
    _results[nodeid] = outcome
    if outcome in FAILING:
        text = str(getattr(report, "longreprtext", "") or "")
        _details[nodeid] = text[-DETAIL_CHARS:]


def pytest_runtest_logreport(report: Any) -> None:
    wasxfail = hasattr(report, "wasxfail")
    if report.when == "call":
        if wasxfail:
            _record(report.nodeid, "xfailed" if report.skipped else "xpassed", report)
        else:
            _record(report.nodeid, report.outcome, report)
    elif report.when == "setup":
        if report.failed:
            _record(report.nodeid, "error", report)
        elif report.skipped:
            _record(report.nodeid, "xfailed" if wasxfail else "skipped", report)
    elif report.when == "teardown" and report.failed:
        _record(report.nodeid, "error", report)


def pytest_collectreport(report: Any) -> None:
    if report.failed:
        _record(f"{report.nodeid}::<collection>", "error", report)


def pytest_sessionfinish(session: Any, exitstatus: int) -> None:
    out = os.environ.get(ENV_OUT)
    if out:
        payload = {
            "config": os.environ.get(ENV_CONFIG, "stock"),
            "patched": _patched,
            "results": _results,
            "details": _details,
            "exitstatus": int(exitstatus),
            "peer_instances": _instances[0],
            "cache_totals": _cache_totals(),
        }
        pathlib.Path(out).write_text(json.dumps(payload, indent=1, sort_keys=True))


# --------------------------------------------------------------------------------------------------------------
# The runner (parent process).
# --------------------------------------------------------------------------------------------------------------


def run_child(
    test_file: pathlib.Path,
    config: str,
    scope: str,
    keyword: str | None,
    workdir: pathlib.Path,
    timeout: float,
    extra_args: Sequence[str],
    class_api: str = "raw",
) -> dict[str, Any]:
    """Run pytest on ``test_file`` in a fresh subprocess; return the plugin's JSON payload."""
    out = workdir / f"{config}.json"
    log = workdir / f"{config}.log"
    ini = workdir / "pytest.ini"
    ini.write_text("[pytest]\n")
    env = dict(os.environ)
    path_parts = [str(HERE), str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env.update(
        {
            "PYTHONPATH": os.pathsep.join(path_parts),
            ENV_CONFIG: config,
            ENV_SCOPE: scope,
            ENV_OUT: str(out),
            ENV_TEST_ROOT: os.path.realpath(test_file.parent),
            ENV_CLASS_API: class_api,
        }
    )
    env.setdefault("PYTORCH_PRINT_REPRO_ON_FAILURE", "0")  # opcheck's repro banner hides the error line
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        str(test_file),
        "-p",
        "peer_suite",
        "-p",
        "no:cacheprovider",
        "-c",
        str(ini),
        "--rootdir",
        str(test_file.parent),
        "-q",
        "-rN",
        "--tb=native",
    ]
    if keyword:
        cmd += ["-k", keyword]
    cmd += list(extra_args)
    start = time.monotonic()
    with log.open("w") as fh:
        proc = subprocess.run(
            cmd, cwd=test_file.parent, env=env, stdout=fh, stderr=subprocess.STDOUT, timeout=timeout, check=False
        )
    elapsed = time.monotonic() - start
    if not out.exists():
        tail = log.read_text()[-3000:]
        raise RuntimeError(f"the {config} run wrote no results (exit {proc.returncode}); log tail:\n{tail}")
    payload: dict[str, Any] = json.loads(out.read_text())
    payload["seconds"] = round(elapsed, 1)
    payload["returncode"] = proc.returncode
    return payload


def compare(stock: dict[str, str], ours: dict[str, str]) -> dict[str, list[str]]:
    """Sort node ids into the differences that matter."""
    both = stock.keys() & ours.keys()
    return {
        "stock_pass_ours_fail": sorted(n for n in both if stock[n] == "passed" and ours[n] in FAILING),
        "stock_fail_ours_pass": sorted(n for n in both if stock[n] in FAILING and ours[n] == "passed"),
        "other_changes": sorted(
            n for n in both if stock[n] != ours[n] and not ({stock[n], ours[n]} <= {"passed"} | FAILING)
        ),
        "only_stock": sorted(stock.keys() - ours.keys()),
        "only_ours": sorted(ours.keys() - stock.keys()),
    }


def counts(results: dict[str, str]) -> Counter[str]:
    c: Counter[str] = Counter(results.values())
    for o in OUTCOMES:
        c.setdefault(o, 0)
    return c


def report(
    test_file: pathlib.Path,
    keyword: str | None,
    scope: str,
    stock: dict[str, Any],
    ours: dict[str, Any],
    echo: Callable[[str], None] = print,
) -> dict[str, list[str]]:
    diff = compare(stock["results"], ours["results"])
    echo(f"peer suite: {test_file}" + (f" -k {keyword!r}" if keyword else "") + f" (scope {scope})")
    for p in ours["patched"]:
        echo(f"  ours rebinds {p}")
    echo(f"  ours made {ours.get('peer_instances', 0)} torch_cachepolicy FakeTensorMode instances")
    for group, t in ours.get("cache_totals", {}).items():
        top = ", ".join(f"{r}: {n}" for r, n in list(t["bypasses"].items())[:4])
        echo(f"    {group}: {t['hits']} hits, {t['misses']} misses, bypasses {{{top}}}")
    echo(f"  {'':6} " + " ".join(f"{o:>8}" for o in OUTCOMES) + f" {'total':>8} {'seconds':>8}")
    for name, run in (("stock", stock), ("ours", ours)):
        c = counts(run["results"])
        echo(
            f"  {name:6} "
            + " ".join(f"{c[o]:8d}" for o in OUTCOMES)
            + f" {len(run['results']):8d}"
            + f" {run['seconds']:8.1f}"
        )
    titles = {
        "stock_pass_ours_fail": "pass under stock, fail under ours",
        "stock_fail_ours_pass": "fail under stock, pass under ours",
        "other_changes": "other outcome changes (skip/xfail)",
        "only_stock": "only in the stock run",
        "only_ours": "only in our run",
    }
    for key, title in titles.items():
        names = diff[key]
        echo(f"{title}: {len(names)}")
        for n in names:
            extra = f"  [{stock['results'].get(n)} -> {ours['results'].get(n)}]" if key == "other_changes" else ""
            echo(f"  {n}{extra}")
    return diff


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("test_file", type=pathlib.Path, help="one of torch's test files (outside this repository)")
    parser.add_argument("-k", dest="keyword", default=None, help="pytest -k expression, for both runs")
    parser.add_argument(
        "--scope",
        choices=("process", "module", "instances"),
        default="process",
        help="process: the test code's names and every mode torch builds (default); module: the "
        "test code's names only; instances: every mode built, no name rebound (a probe)",
    )
    parser.add_argument(
        "--class-api",
        choices=("raw", "aggregate"),
        default="raw",
        help="raw: class-level cache_info()/cache_clear() are the package's (default); aggregate: "
        "a probe where, called on the class, they sum/clear every live mode",
    )
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per run (default 3600)")
    parser.add_argument("--out", type=pathlib.Path, default=None, help="keep both runs' JSON and logs here")
    parser.add_argument("pytest_args", nargs="*", help="after --: more pytest arguments for both runs")
    args = parser.parse_args(argv)
    test_file = args.test_file.resolve()
    if not test_file.is_file():
        parser.error(f"no such file: {test_file}")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        workdir = args.out
        ctx: Any = None
    else:
        ctx = tempfile.TemporaryDirectory(prefix="peer_suite_")
        workdir = pathlib.Path(ctx.name)
    try:
        stock = run_child(test_file, "stock", args.scope, args.keyword, workdir, args.timeout, args.pytest_args)
        ours = run_child(
            test_file, "ours", args.scope, args.keyword, workdir, args.timeout, args.pytest_args, args.class_api
        )
        diff = report(test_file, args.keyword, args.scope, stock, ours)
        if args.out is not None:
            (workdir / "diff.json").write_text(json.dumps(diff, indent=1))
    finally:
        if ctx is not None:
            ctx.cleanup()
    return 1 if diff["stock_pass_ours_fail"] else 0


if __name__ == "__main__":
    sys.exit(main())
