"""Lowers ExecuTorch flows on stock torch, under the global is_builtin swap, with the op-level series and with the
alternative policy series, interleaved round by round.

Usage, from the repository root (ExecuTorch 1.5.1 installed, see requirements-executorch.txt)::

    python docs/upstream/executorch/lowering_driver.py --flow ethos-u55 --model tiny --rounds 9 [--out run.json]

The two series both patch ``torch/_subclasses/fake_tensor.py``, so they cannot be loaded in one process. The driver
therefore copies the files each series touches (the torch series and its ExecuTorch patch) from the installed torch
and ExecuTorch into two temporary trees, applies them with ``patch -p1 --fuzz=0``, and starts one child process per
tree (``--child``), each serving its tree's copies in place of the installed modules (a finder first on
``sys.meta_path``, installed before torch is imported; the installed packages are never written and
``torch_cachepolicy`` is never imported, both checked):

* the ``oplevel`` child (``docs/upstream/000*.patch`` + ``executorch/0001-declare-backend-ops-cacheable.patch``)
  measures ``stock`` (every declaration removed for the lowering: the op-level torch's no-registration path),
  ``global-patch`` (the same inside ``benchmarks/global_patch.py``, ExecuTorch PR 21700's process-global swap) and
  ``oplevel`` (the declarations ExecuTorch and torch make);
* the ``policy`` child (``alternative-policy/000*.patch`` + its ExportPass patch) measures ``stock`` (no policy
  attached: ``exir.fake_tensor_cache.ENABLED = False``), ``global-patch`` and ``policy``.

Both children build the same quantized program, lower it once per configuration to warm up (discarded), and wait.
The parent then runs the rounds in lock step: in each round it tells one child, then the other (the first child
alternates from round to round), to lower a freshly exported copy once per configuration (the order rotating every
round); a child runs only while the other waits, so the two never share the CPU. Every lowering starts from an empty
cache (``FakeTensorMode.cache_clear()``; each export has a new ShapeEnv), as in a fresh process. Only the lowering
call is timed: process CPU time (``time.process_time``) and wall time, GC collected before and off during.

Reported: medians of per-round ratios, with their min and max: within a child (X/stock, X/global-patch), and across
the two children in the same round (oplevel/policy, and stock/stock, which shows what separates the two processes
when they run the same code path). Delegate payloads, the lowered graph's code and a digest of its constants must be
identical across every configuration of both children. Counts (torch's cache counters over the lowering, backend
entries made) are those of the last round.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import io
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from types import ModuleType
from typing import Any

HERE = pathlib.Path(__file__).resolve().parent
UPSTREAM = HERE.parent
ROOT = UPSTREAM.parent.parent
# This directory is named executorch/: it must not shadow the package.
sys.path[:] = [p for p in sys.path if pathlib.Path(p or ".").resolve() != HERE]
NAMESPACES = ("quantized_decomposed", "tosa", "dim_order_ops", "cortex_m")
SERIES = {
    "oplevel": (sorted(UPSTREAM.glob("000*.patch")), HERE / "0001-declare-backend-ops-cacheable.patch"),
    "policy": (
        sorted((UPSTREAM / "alternative-policy").glob("000*.patch")),
        UPSTREAM / "alternative-policy" / "executorch" / "0001-exportpass-fake-tensor-cache-policy.patch",
    ),
}
CONFIGS = {"oplevel": ("stock", "global-patch", "oplevel"), "policy": ("stock", "global-patch", "policy")}


def _package_dir(name: str) -> pathlib.Path:
    spec = importlib.util.find_spec(name)  # does not import the package
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"{name} is not installed")
    return pathlib.Path(next(iter(spec.submodule_search_locations)))


def _touched(patch: pathlib.Path) -> list[tuple[str, bool]]:
    """The files a patch writes, each with whether it exists before the patch."""
    lines = patch.read_text().splitlines()
    return [
        (line[len("+++ b/") :].split("\t")[0], lines[i - 1] != "--- /dev/null")
        for i, line in enumerate(lines)
        if line.startswith("+++ b/")
    ]


def prepare(tree: pathlib.Path, series: str, executorch: bool = True) -> None:
    """Copies the files a series (and its ExecuTorch patch) touch into ``tree`` (laid out like site-packages) and applies them."""
    patches, et_patch = SERIES[series]
    jobs = [(tree, "torch", patches)] + ([(tree / "executorch", "executorch", [et_patch])] if executorch else [])
    for root, package, todo in jobs:
        base = _package_dir(package)
        for patch in todo:
            for rel, exists in _touched(patch):
                dest = root / rel
                if exists and not dest.exists():
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile((base.parent if package == "torch" else base) / rel, dest)
        for patch in todo:
            subprocess.run(["patch", "-p1", "--batch", "--fuzz=0", "-s", "-i", str(patch)], cwd=root, check=True)


class _TreeFinder(importlib.abc.MetaPathFinder):
    """Serves every module whose ``.py`` file exists in the tree (never a package)."""

    def __init__(self, tree: pathlib.Path) -> None:
        self.tree = tree

    def find_spec(
        self, name: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        file = self.tree.joinpath(*name.split(".")).with_suffix(".py")
        return importlib.util.spec_from_file_location(name, file) if file.is_file() else None


def _load(name: str, rel: str) -> ModuleType:
    """Loads a module of this repository by path (``benchmarks/executorch/__init__`` would import the prototype)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / rel)
    assert spec is not None and spec.loader is not None
    module = sys.modules[name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _digest(ep: Any) -> tuple[dict[str, str], str, str]:
    """The delegates' payloads (hashed), the graph code and a digest of the constants of a lowered program."""
    import torch
    from executorch.exir.lowered_backend_module import LoweredBackendModule

    gm = ep.graph_module
    payloads = {
        name: hashlib.sha256(bytes(m.processed_bytes)).hexdigest()
        for name, m in gm.named_modules()
        if isinstance(m, LoweredBackendModule)
    }
    digest = hashlib.sha256()
    named = {**ep.state_dict, **ep.constants}
    for name in sorted(named):
        digest.update(name.encode())
        value = named[name]
        if isinstance(value, torch.Tensor):
            t = value.detach().contiguous().cpu()
            digest.update(f"{t.dtype}{tuple(t.shape)}".encode())
            digest.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        else:
            digest.update(repr(value).encode())
    return payloads, gm.code, hashlib.sha256(digest.hexdigest().encode()).hexdigest()


def child(args: argparse.Namespace) -> None:
    """One series' process: warm up, then one round per ``round N`` line on stdin, a JSON line each on stdout."""
    tree = args.tree
    sys.meta_path.insert(0, _TreeFinder(tree))
    sys.path.insert(0, str(ROOT))
    import torch
    import torch._subclasses.fake_tensor as ft
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    flows = _load("_driver_flows", "benchmarks/executorch/flows.py")
    models = _load("_driver_models", "benchmarks/executorch/models.py")
    global_patch = _load("_driver_global_patch", "benchmarks/global_patch.py")
    series = args.child
    if series == "oplevel":
        from torch._library import fake_cache

        checked = ["torch._subclasses.fake_tensor", "torch._library.fake_cache", "torch.library"]
    else:
        from executorch.exir import fake_tensor_cache

        checked = ["torch._subclasses.fake_tensor", "executorch.exir.fake_tensor_cache", "executorch.exir.pass_base"]
        import executorch.exir.pass_base  # noqa: F401

    flow = flows.get_flow(args.flow)
    module, example, _ = models.build_model(args.model, 0)
    if flow.channels_last:
        example = tuple(t.to(memory_format=torch.channels_last) for t in example)
    prepared = prepare_pt2e(torch.export.export(module, example).module(check_guards=False), flow.make_quantizer())
    prepared(*example)
    converted = convert_pt2e(prepared)
    declared: dict[str, object] = {}

    def backend_entries(mode: Any) -> tuple[int, int]:
        """Positive and negative entries of backend ops in torch's cache and the mode's ShapeEnv's."""
        caches = [ft.FakeTensorMode.cache] + ([mode.shape_env.fake_tensor_cache] if mode.shape_env else [])
        keys = [(c, k) for c in caches for k in global_patch.backend_entries(c, NAMESPACES)]
        negative = sum(isinstance(c.get(k), ft._DispatchCacheBypassEntry) for c, k in keys)
        return len(keys) - negative, negative

    def entry_kinds(mode: Any) -> dict[str, int]:
        """Entries by kind after a lowering: positive/negative, class cache or ShapeEnv cache (symbolic keys), op kind."""
        from torch._ops import HigherOrderOperator

        kinds: dict[str, int] = {}
        caches = {"class": ft.FakeTensorMode.cache}
        if mode.shape_env is not None:
            caches["shape_env"] = mode.shape_env.fake_tensor_cache
        for where, cache in caches.items():
            for key, entry in list(cache.items()):
                op = key.key[0] if getattr(key, "key", ()) else None
                if isinstance(op, HigherOrderOperator):
                    what = "hop"
                else:
                    ns = getattr(op, "namespace", "?")
                    what = ns if ns in NAMESPACES else ("aten" if ns in ("aten", "prim", "prims") else "other")
                sign = "negative" if isinstance(entry, ft._DispatchCacheBypassEntry) else "positive"
                name = f"{what} {where} {sign}"
                kinds[name] = kinds.get(name, 0) + 1
        return dict(sorted(kinds.items()))

    def lower(config: str) -> dict[str, Any]:
        ep = torch.export.export(converted, example)
        mode = next(n.meta["val"].fake_mode for n in ep.graph.nodes if isinstance(n.meta.get("val"), ft.FakeTensor))
        if series == "oplevel":
            declared.update(fake_cache.declared)
            if config != "oplevel":  # the no-registration path
                fake_cache.declared.clear()
                fake_cache.namespaces.clear()
        else:
            fake_tensor_cache.ENABLED = config == "policy"
        scope: Any = contextlib.nullcontext()
        if config == "global-patch":
            scope = global_patch.global_patch(NAMESPACES, shape_envs=[mode.shape_env])
        ft.FakeTensorMode.cache_clear()
        info0 = ft.FakeTensorMode.cache_info()
        with contextlib.redirect_stdout(io.StringIO()), scope:
            gc.collect()
            gc.disable()
            try:
                start, cpu = time.perf_counter(), time.process_time()
                lowered = flow.lower_program(ep)
                seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu
            finally:
                gc.enable()
            positive, negative = backend_entries(mode)
            kinds = entry_kinds(mode)
        info = ft.FakeTensorMode.cache_info()
        if series == "oplevel":
            declared.update(fake_cache.declared)  # declarations made by lazy imports during the lowering
            fake_cache.declared.update(declared)
            fake_cache.namespaces.clear()
            for qualname in fake_cache.declared:
                namespace = qualname.split("::")[0]
                fake_cache.namespaces[namespace] = fake_cache.namespaces.get(namespace, 0) + 1
        else:
            fake_tensor_cache.ENABLED = True
        bypasses = {k: v - info0.bypasses.get(k, 0) for k, v in info.bypasses.items()}
        return {
            "seconds": seconds,
            "cpu_seconds": cpu_seconds,
            "hits": info.hits - info0.hits,
            "misses": info.misses - info0.misses,
            "non_builtin_bypasses": bypasses.get("non-builtin", 0),
            "other_bypasses": {k: v for k, v in sorted(bypasses.items()) if v and k != "non-builtin"},
            "backend_entries": positive,
            "backend_negative_entries": negative,
            "entry_kinds": kinds,
            "outputs": hashlib.sha256(json.dumps(_digest(lowered)).encode()).hexdigest(),
        }

    configs = CONFIGS[series]
    for config in configs:  # warm-up, discarded
        lower(config)
    for name in checked:
        assert str(sys.modules[name].__file__).startswith(str(tree)), sys.modules[name].__file__
    ready = {"torch": torch.__version__, "pid": os.getpid()}
    if series == "oplevel":
        ready["declared"] = {ns: sum(q.startswith(ns + "::") for q in declared) for ns in NAMESPACES}
    print("READY " + json.dumps(ready), flush=True)
    for line in sys.stdin:
        if not line.startswith("round "):
            break
        r = int(line.split()[1])
        order = configs[r % len(configs) :] + configs[: r % len(configs)]
        result = {config: lower(config) for config in order}
        assert "torch_cachepolicy" not in sys.modules, "prototype code was imported"
        print("ROUND " + json.dumps(result), flush=True)


def _read(proc: subprocess.Popen[str], marker: str) -> Any:
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith(marker + " "):
            return json.loads(line[len(marker) + 1 :])
    raise SystemExit(f"child exited ({proc.wait()}) before {marker}")


def _stats(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3), "max": round(max(values), 3)}


def parent(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="lowering-trees-") as tmp:
        procs: dict[str, subprocess.Popen[str]] = {}
        ready: dict[str, Any] = {}
        load0 = os.getloadavg()
        try:
            for series in SERIES:
                tree = pathlib.Path(tmp) / series
                prepare(tree, series)
                cmd = [sys.executable, __file__, "--child", series, "--tree", str(tree), "--flow", args.flow]
                procs[series] = subprocess.Popen(
                    [*cmd, "--model", args.model], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
                )
            for series, proc in procs.items():  # warm-ups run concurrently; only the rounds are timed
                ready[series] = _read(proc, "READY")
            rounds: list[dict[str, dict[str, Any]]] = []
            for r in range(args.rounds):
                result: dict[str, dict[str, Any]] = {}
                for series in list(SERIES)[r % 2 :] + list(SERIES)[: r % 2]:
                    proc = procs[series]
                    assert proc.stdin is not None
                    proc.stdin.write(f"round {r}\n")
                    proc.stdin.flush()
                    result[series] = _read(proc, "ROUND")
                rounds.append(result)
                print(f"round {r + 1}/{args.rounds} done, load {os.getloadavg()[0]:.2f}", file=sys.stderr, flush=True)
        finally:
            for proc in procs.values():
                if proc.stdin:
                    proc.stdin.close()
                proc.wait(timeout=120)
        load1 = os.getloadavg()

    def cpu(r: dict[str, dict[str, Any]], series: str, config: str, field: str = "cpu_seconds") -> float:
        return float(r[series][config][field])

    outputs = {r[s][c].pop("outputs") for r in rounds for s in SERIES for c in CONFIGS[s]}
    summary: dict[str, Any] = {
        "flow": args.flow,
        "model": args.model,
        "rounds": args.rounds,
        "torch": ready["oplevel"]["torch"],
        "declared": ready["oplevel"].get("declared"),
        "load_average_1min": {"start": round(load0[0], 2), "end": round(load1[0], 2)},
        "identical_outputs": len(outputs) == 1,
        "median_cpu_s": {
            f"{s}:{c}": round(statistics.median(cpu(r, s, c) for r in rounds), 3) for s in SERIES for c in CONFIGS[s]
        },
        "counts": {
            f"{s}:{c}": {k: v for k, v in rounds[-1][s][c].items() if "seconds" not in k}
            for s in SERIES
            for c in CONFIGS[s]
        },
    }
    pairs = [
        ("oplevel:oplevel", "oplevel:stock"),
        ("oplevel:global-patch", "oplevel:stock"),
        ("oplevel:oplevel", "oplevel:global-patch"),
        ("policy:policy", "policy:stock"),
        ("policy:global-patch", "policy:stock"),
        ("policy:policy", "policy:global-patch"),
        ("oplevel:oplevel", "policy:policy"),
        ("oplevel:stock", "policy:stock"),
        ("oplevel:global-patch", "policy:global-patch"),
    ]
    for field in ("cpu_seconds", "seconds"):
        ratios = {}
        for a, b in pairs:
            (sa, ca), (sb, cb) = a.split(":"), b.split(":")
            ratios[f"{a} / {b}"] = _stats([cpu(r, sa, ca, field) / cpu(r, sb, cb, field) for r in rounds])
        # Each series against its own process's stock, then the two compared (per round).
        ratios["(oplevel/stock) / (policy/stock)"] = _stats(
            [
                (cpu(r, "oplevel", "oplevel", field) / cpu(r, "oplevel", "stock", field))
                / (cpu(r, "policy", "policy", field) / cpu(r, "policy", "stock", field))
                for r in rounds
            ]
        )
        summary[f"ratios {field}"] = ratios
    summary["per_round cpu oplevel/stock"] = [
        round(cpu(r, "oplevel", "oplevel") / cpu(r, "oplevel", "stock"), 3) for r in rounds
    ]
    summary["per_round cpu policy/stock"] = [
        round(cpu(r, "policy", "policy") / cpu(r, "policy", "stock"), 3) for r in rounds
    ]
    summary["per_round cpu oplevel/policy"] = [
        round(cpu(r, "oplevel", "oplevel") / cpu(r, "policy", "policy"), 3) for r in rounds
    ]
    return summary


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--flow", default="ethos-u55", choices=("ethos-u55", "cortex-m", "xnnpack"))
    parser.add_argument("--model", default="tiny", choices=("tiny", "large"))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=pathlib.Path, help="also write the JSON summary here")
    parser.add_argument("--child", choices=tuple(SERIES), help=argparse.SUPPRESS)
    parser.add_argument("--tree", type=pathlib.Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args)
        return
    summary = parent(args)
    text = json.dumps(summary, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
