"""Instructions per dispatch added by the series when no policy is attached (callgrind).

Method (as torch's pr_time_benchmarks count instructions rather than time):
every run executes the same process under ``valgrind --tool=callgrind``:
import torch, build ``N_MAX`` fake inputs, dispatch the workload once (the
first miss and every lazy import on the path), then dispatch it ``n`` times
inside ``functools.reduce``; callgrind collects only inside that call
(``--collect-atstart=no --toggle-collect=functools_reduce``), and its total
(``Collected``) is read from its summary. The per-dispatch cost is the
difference between a run with ``n = N_HI`` and one with ``n = N_LO``
divided by ``N_HI - N_LO``, so the loop's own set-up cancels out; the cyclic
GC is off during the loop (a collection of the whole process would otherwise
land in some runs and not others).
``PYTHONHASHSEED=0``, and address randomization off (``setarch -R``). Each
workload is measured on two trees served the same way in place of the
installed ``fake_tensor.py`` (a finder first on ``sys.meta_path``, as
test/upstream_patch_probe.py does): an unpatched copy, and a copy with the
whole series applied; no policy is attached, the default. (Serving the same
file from another path changes the counts a little by itself, so the
installed module is not the baseline.)

Workloads (``FakeTensorMode()`` without a ShapeEnv):

* ``hit``: ``x + x`` on one fake, so every dispatch after the first is a hit;
* ``miss``: ``x_i + x_i`` on ``n`` fakes of distinct shapes, every one a miss;
* ``bypass``: ``quantized_decomposed.quantize_per_tensor`` (non-builtin), a
  stored negative entry on every dispatch after the first.

Those three run without a policy, unpatched and with the series: the
no-policy overhead. Three more price a policy hit against a stock hit of the
same op (``--workloads all``):

* ``hit+policy``: ``hit`` with a policy attached (series): the policy's
  routing, then the stock path (aten ops are not passed to ``decide`` since
  v5 of the series);
* ``q+swap``: ``bypass`` with ``is_builtin`` swapped to admit the namespace
  (unpatched torch; ExecuTorch PR 21700's swap): a stock hit of the backend op;
* ``q+policy``: ``bypass`` with a policy admitting the namespace (series): a
  policy hit.

Usage::

    python docs/upstream/alternative-policy/callgrind_no_policy.py            # all, prints a table (about 15 runs of 1-2 min)
    python docs/upstream/alternative-policy/callgrind_no_policy.py --child hit 1000   # one measured process (run by the above)
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
SERIES = sorted(HERE.glob("000*.patch"))
N_MAX = 2000
N_LO, N_HI = 200, 1200
WORKLOADS = ("hit", "miss", "bypass")
# The runs pricing a policy hit: workload -> the torch it runs on.
POLICY_WORKLOADS = {"hit+policy": "series", "q+swap": "unpatched", "q+policy": "series"}


def child(kind: str, n: int) -> None:
    tree = os.environ.get("TCP_PATCHED_TREE", "")
    if tree:
        import importlib.util

        class Finder:
            def find_spec(self, name: str, path: object = None, target: object = None) -> object:
                if name != "torch._subclasses.fake_tensor":
                    return None
                return importlib.util.spec_from_file_location(name, f"{tree}/torch/_subclasses/fake_tensor.py")

        sys.meta_path.insert(0, Finder())  # type: ignore[arg-type]
    import torch
    import torch.ao.quantization.fx._decomposed  # noqa: F401
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode()
    if tree:
        assert getattr(mode, "cache_policy", None) is None

    class Policy:
        def decide(self, func: object) -> bool | str:
            return func.namespace in ("aten", "prim", "prims", "quantized_decomposed") or "non-builtin"  # type: ignore[attr-defined]

        def context_key(self, func: object) -> None:
            return None

    if kind.endswith("+policy"):
        mode.cache_policy = Policy()
        kind = kind[: -len("+policy")]
    if kind == "q+swap":
        import torch._library.utils as library_utils

        is_builtin = library_utils.is_builtin
        library_utils.is_builtin = lambda op: is_builtin(op) or op.namespace == "quantized_decomposed"  # type: ignore[assignment]
        kind = "bypass"
    if kind == "q":
        kind = "bypass"
    xs = [mode.from_tensor(torch.empty(i + 1, 3)) for i in range(N_MAX + 1)]
    q = torch.ops.quantized_decomposed.quantize_per_tensor.default
    x = xs[0]
    steps = {
        "hit": lambda _, i: x + x,
        "miss": lambda _, i: xs[i] + xs[i],
        "bypass": lambda _, i: q(x, 0.1, 0, -128, 127, torch.int8),
    }
    with mode:
        # One dispatch outside the measured loop: the first miss, and every
        # lazy import on the path, happen here.
        steps[kind](None, 0)
        # Measured: callgrind collects only inside functools.reduce
        # (--toggle-collect=functools_reduce), with the cyclic GC off so that
        # no collection of the whole process lands in one run and not another.
        gc.collect()
        gc.disable()
        functools.reduce(steps[kind], range(1, n + 1), None)
        gc.enable()
    info = FakeTensorMode.cache_info()
    print(json.dumps([info.hits, info.misses, info.bypasses]))


def instructions(kind: str, n: int, tree: str) -> int:
    env = {**os.environ, "PYTHONHASHSEED": "0", "TCP_PATCHED_TREE": tree}
    with tempfile.TemporaryDirectory() as d:
        proc = subprocess.run(
            [
                *(["setarch", os.uname().machine, "-R"] if shutil.which("setarch") else []),  # no ASLR
                "valgrind",
                "--tool=callgrind",
                "--collect-atstart=no",
                "--toggle-collect=functools_reduce",
                f"--callgrind-out-file={d}/out",
                sys.executable,
                __file__,
                "--child",
                kind,
                str(n),
            ],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
    m = re.search(r"Collected : (\d+)", proc.stderr)
    assert m, proc.stderr[-2000:]
    return int(m[1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--child", nargs=2)
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help="a comma-separated list, or all")
    args = parser.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]))
        return
    import torch

    site = pathlib.Path(torch.__file__).parent.parent
    with tempfile.TemporaryDirectory() as d:
        tree = pathlib.Path(d)
        rel = "torch/_subclasses/fake_tensor.py"
        trees = {"unpatched": str(tree / "unpatched"), "series": str(tree / "series")}
        for t in trees.values():
            (pathlib.Path(t) / rel).parent.mkdir(parents=True)
            shutil.copyfile(site / rel, pathlib.Path(t) / rel)
        for patch in SERIES:
            subprocess.run(["patch", "-p1", "-s", "--fuzz=0", "-i", str(patch)], cwd=trees["series"], check=True)
        wanted = list(WORKLOADS) + list(POLICY_WORKLOADS) if args.workloads == "all" else args.workloads.split(",")
        per: dict[tuple[str, str], float] = {}
        for kind in wanted:
            for name in [POLICY_WORKLOADS[kind]] if kind in POLICY_WORKLOADS else list(trees):
                lo, hi = instructions(kind, N_LO, trees[name]), instructions(kind, N_HI, trees[name])
                per[kind, name] = (hi - lo) / (N_HI - N_LO)
                print(f"{kind} on {name}: {per[kind, name]:.0f}", flush=True)
    print(f"torch {torch.__version__}; instructions per dispatch (runs of {N_LO} and {N_HI} dispatches)")
    print("| workload | unpatched | series, no policy | delta | delta % |")
    print("| --- | --- | --- | --- | --- |")
    for kind in WORKLOADS:
        if (kind, "series") in per:
            a, b = per[kind, "unpatched"], per[kind, "series"]
            print(f"| {kind} | {a:.0f} | {b:.0f} | {b - a:+.0f} | {100 * (b - a) / a:+.3f}% |")
    for kind, name in POLICY_WORKLOADS.items():
        if (kind, name) in per:
            print(f"| {kind} ({name}) | {per[kind, name]:.0f} | | | |")


if __name__ == "__main__":
    main()
