"""Compile time of torch's own workloads, unpatched torch against a series, nothing registered or attached.

    python docs/upstream/compile_time_ab.py [--series proposed|alternative] [--rounds 8] [--reps 3]
        [--stat median|min] [--out results.json]
    python docs/upstream/compile_time_ab.py --stat calls

--series proposed (the default) is the op-level series (docs/upstream/000N-*.patch): the workloads dispatch no
declared operator, so they take its no-registration path; alternative is the per-mode policy series
(docs/upstream/alternative-policy/), with no policy attached.

Workloads (models like those of torch's export tests): torch.export.export followed
by run_decompositions() of an MLP, a conv net with batch norm and a transformer
encoder, each with static shapes and with a dynamic batch dimension; and
torch.compile(backend="eager") of the MLP and the conv net (static, then a second
input shape, dynamic). Nothing is declared for them and no cache policy is
attached anywhere: this measures what the series costs the code that does not
use it.

Each round starts two fresh interpreters, in alternating order, one with copies
of the installed (unpatched) files served in place of the installed modules, and
one with the series applied to such copies (as test/test_upstream_patch.py does;
nothing is installed). Both sides are served the same way, from the same kind of
directory: torch inspects source paths (a frame in a file outside its package
counts as user code when a ShapeEnv records where a guard or symbol came from), so
a copy against the installed file would compare locations, not code. Each
interpreter runs every workload once to warm up, then --reps times, clearing
FakeTensorMode's cache and dynamo's state before each run, and reports the median
(or, with --stat min, the least: the run other jobs disturbed least) CPU time
(time.process_time) per workload. The result is the median over rounds of the
per-round ratio series/unpatched per workload, with its range; only these
interleaved ratios mean anything on a shared machine.

--stat calls counts instead of timing: one run of each workload per side under
cProfile, its Python function calls and FakeTensorMode's counters (hits, misses,
bypasses by reason), which do not depend on the machine's load.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
RELEASES = ("2.13.0", "2.14.1", "2.15.0")
SERIES = {
    "proposed": {
        "dir": HERE,
        "patches": [
            "0001-fake-tensor-cache-stock-hardening.patch",
            "0002-fake-tensor-cache-clear-on-subclass.patch",
            "0003-fake-tensor-cacheable-ops.patch",
            "0004-quantized-decomposed-cacheable.patch",
        ],
        # module -> file served from the trees (torch._library's __init__, which 0003 changes by one import that
        # fake_tensor.py also makes, is not served: a package is left to the installed torch)
        "files": {
            "torch._subclasses.fake_tensor": "torch/_subclasses/fake_tensor.py",
            "torch._library.custom_ops": "torch/_library/custom_ops.py",
            "torch._library.fake_cache": "torch/_library/fake_cache.py",
            "torch.library": "torch/library.py",
            "torch.ao.quantization.fx._decomposed": "torch/ao/quantization/fx/_decomposed.py",
        },
        # true on the patched side only
        "marker": "hasattr(sys.modules['torch._subclasses.fake_tensor'], '_cache_context_key')",
    },
    "alternative": {
        "dir": HERE / "alternative-policy",
        "patches": [
            "0001-fake-tensor-cache-stock-hardening.patch",
            "0002-fake-tensor-cache-clear-on-subclass.patch",
            "0003-fake-tensor-cache-policy.patch",
        ],
        "files": {
            "torch._subclasses.fake_tensor": "torch/_subclasses/fake_tensor.py",
            "torch._subclasses._fake_tensor_cache_policy": "torch/_subclasses/_fake_tensor_cache_policy.py",
        },
        "marker": "hasattr(FakeTensorMode, '_cache_policy')",
    },
}


CHILD = r"""
import importlib.abc, importlib.util, json, os, statistics, sys, time
FILES = json.loads(os.environ["AB_FILES"])
TREE = os.environ["AB_TREE"]


class _Served(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        rel = FILES.get(name)
        if rel is None or not os.path.exists(os.path.join(TREE, rel)):
            return None
        return importlib.util.spec_from_file_location(name, os.path.join(TREE, rel))


sys.meta_path.insert(0, _Served())
import warnings

warnings.filterwarnings("ignore")
import torch
import torch._dynamo
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.export import Dim

assert FakeTensorMode.__module__ == "torch._subclasses.fake_tensor"
assert sys.modules[FakeTensorMode.__module__].__file__.startswith(TREE), "wrong torch served"
assert eval(os.environ["AB_MARKER"]) == (os.environ["AB_SIDE"] == "series"), "wrong side served"
torch.manual_seed(0)


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
            torch.nn.ReLU(), torch.nn.Linear(256, 10),
        )

    def forward(self, x):
        return self.net(x)


class ConvBN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
            torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.BatchNorm2d(32), torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1),
        )
        self.head = torch.nn.Linear(32, 10)

    def forward(self, x):
        return self.head(self.features(x).flatten(1))


def encoder():
    layer = torch.nn.TransformerEncoderLayer(
        d_model=64, nhead=4, dim_feedforward=128, batch_first=True, dropout=0.0
    )
    return torch.nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)


MODELS = {
    "mlp": (MLP().eval(), (torch.randn(8, 64),)),
    "convbn": (ConvBN().eval(), (torch.randn(2, 3, 32, 32),)),
    "encoder": (encoder().eval(), (torch.randn(2, 16, 64),)),
}


def export(name, dynamic):
    model, args = MODELS[name]
    shapes = {"x" if name != "encoder" else "src": {0: Dim("batch", min=2, max=64)}} if dynamic else None
    ep = torch.export.export(model, args, dynamic_shapes=shapes)
    ep.run_decompositions()


def compile_eager(name):
    model, args = MODELS[name]
    compiled = torch.compile(model, backend="eager")
    compiled(*args)
    x = args[0]
    compiled(torch.randn(x.shape[0] * 2, *x.shape[1:]))


WORKLOADS = {}
for name in MODELS:
    WORKLOADS[f"export+decomp {name} static"] = lambda n=name: export(n, False)
    WORKLOADS[f"export+decomp {name} dynamic"] = lambda n=name: export(n, True)
for name in ("mlp", "convbn"):
    WORKLOADS[f"compile eager {name}"] = lambda n=name: compile_eager(n)

reps = int(os.environ["AB_REPS"])
out = {}
if os.environ["AB_STAT"] == "calls":
    import cProfile, pstats

    for name, fn in WORKLOADS.items():
        fn()
        FakeTensorMode.cache_clear()
        torch._dynamo.reset()
        profile = cProfile.Profile()
        profile.runcall(fn)
        info = FakeTensorMode.cache_info()
        out[name] = [pstats.Stats(profile).total_calls, info.hits, info.misses, dict(sorted(info.bypasses.items()))]
    print("AB-RESULT " + json.dumps(out))
    sys.exit(0)
for name, fn in WORKLOADS.items():
    times = []
    for i in range(reps + 1):
        FakeTensorMode.cache_clear()
        torch._dynamo.reset()
        t0 = time.process_time()
        fn()
        if i:
            times.append(time.process_time() - t0)
    out[name] = min(times) if os.environ["AB_STAT"] == "min" else statistics.median(times)
print("AB-RESULT " + json.dumps(out))
"""


def copied_tree(series: dict, release: str, parent: pathlib.Path, patched: bool) -> pathlib.Path:
    """A directory laid out like site-packages holding copies of the files the series changes, the series applied if patched."""
    import torch

    site = pathlib.Path(torch.__file__).resolve().parent.parent
    tree = parent / ("series" if patched else "unpatched") / "site-packages"
    directory = series["dir"] if release == RELEASES[0] else series["dir"] / f"torch-{release}"
    for patch in series["patches"]:
        for rel in re.findall(r"^\+\+\+ b/(\S+)", (directory / patch).read_text(), re.M):
            if (site / rel).exists() and not (tree / rel).exists():
                (tree / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(site / rel, tree / rel)
    for patch in series["patches"] if patched else ():
        subprocess.run(
            ["patch", "-p1", "--batch", "--fuzz=0", "-i", str(directory / patch)],
            cwd=tree,
            check=True,
            capture_output=True,
        )
    return tree


def child(series: dict, side: str, tree: pathlib.Path, reps: int, stat: str) -> dict[str, float]:
    env = {**os.environ, "AB_FILES": json.dumps(series["files"]), "AB_TREE": str(tree), "AB_SIDE": side}
    env.update(AB_REPS=str(reps), AB_STAT=stat, AB_MARKER=series["marker"], PYTHONDONTWRITEBYTECODE="1")
    proc = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=3600)
    for line in proc.stdout.splitlines():
        if line.startswith("AB-RESULT "):
            return json.loads(line[len("AB-RESULT ") :])
    raise RuntimeError(f"child failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--series", choices=tuple(SERIES), default="proposed")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--stat", choices=("median", "min", "calls"), default="median")
    parser.add_argument("--out", type=pathlib.Path)
    args = parser.parse_args()
    import torch

    release = str(torch.__version__).split("+")[0]
    if release not in RELEASES:
        raise SystemExit(f"no series for torch {release}")
    series = SERIES[args.series]
    with tempfile.TemporaryDirectory(prefix="compile-ab-") as d:
        trees = {
            side: copied_tree(series, release, pathlib.Path(d), side == "series") for side in ("unpatched", "series")
        }
        if args.stat == "calls":
            counts = {side: child(series, side, trees[side], 0, "calls") for side in trees}
            print(
                f"torch {torch.__version__}: Python function calls (cProfile) of one run, and FakeTensorMode's counters"
            )
            for w, (calls, *cache) in counts["unpatched"].items():
                calls_series, *cache_series = counts["series"][w]
                print(
                    f"{w:34s} unpatched {calls:9d}  series {calls_series:9d}  "
                    f"{calls_series - calls:+6d} ({(calls_series - calls) / calls:+.3%})  "
                    f"counters {'equal' if cache == cache_series else f'DIFFER {cache} {cache_series}'}"
                )
            return
        rounds: list[dict[str, dict[str, float]]] = []
        for r in range(args.rounds):
            order = ("unpatched", "series") if r % 2 == 0 else ("series", "unpatched")
            result = {side: child(series, side, trees[side], args.reps, args.stat) for side in order}
            rounds.append(result)
            print(
                f"round {r + 1}/{args.rounds}: "
                + ", ".join(f"{w} {result['series'][w] / result['unpatched'][w]:.3f}" for w in result["series"]),
                flush=True,
            )
    summary = {}
    for w in rounds[0]["series"]:
        ratios = sorted(x["series"][w] / x["unpatched"][w] for x in rounds)
        base = statistics.median(x["unpatched"][w] for x in rounds)
        summary[w] = {
            "unpatched_cpu_s": base,
            "median_ratio": statistics.median(ratios),
            "min": ratios[0],
            "max": ratios[-1],
        }
    allr = sorted(x["series"][w] / x["unpatched"][w] for x in rounds for w in x["series"])
    print(
        f"torch {torch.__version__}, {args.series} series, {args.rounds} rounds x {args.reps} reps ({args.stat}), "
        "CPU time (process_time), series/unpatched:"
    )
    print(f"{'workload':34s} {'unpatched s':>11s} {'median':>7s} {'min':>7s} {'max':>7s}")
    for w, s in summary.items():
        print(f"{w:34s} {s['unpatched_cpu_s']:11.3f} {s['median_ratio']:7.3f} {s['min']:7.3f} {s['max']:7.3f}")
    print(f"{'all workloads, all rounds':34s} {'':11s} {statistics.median(allr):7.3f} {allr[0]:7.3f} {allr[-1]:7.3f}")
    if args.out:
        args.out.write_text(
            json.dumps(
                {"torch": torch.__version__, "series": args.series, "rounds": rounds, "summary": summary}, indent=1
            )
        )


if __name__ == "__main__":
    main()
