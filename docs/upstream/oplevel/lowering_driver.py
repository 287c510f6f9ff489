"""Lowers ExecuTorch flows on torch with the op-level series, stock, and under the global is_builtin swap.

Usage, from the repository root (ExecuTorch 1.5.1 installed, see requirements-executorch.txt)::

    python docs/upstream/oplevel/lowering_driver.py --flow ethos-u55 --model tiny --repeats 7

The sibling of docs/upstream/executorch/lowering_driver.py (whose tree finder, loader and digest it
reuses): it copies the files ``docs/upstream/oplevel/000*.patch`` and
``docs/upstream/oplevel/executorch/0001-*.patch`` touch from the installed torch and ExecuTorch into
a temporary tree, applies them with ``patch -p1 --fuzz=0`` and serves the patched copies in place of
the installed modules. The installed packages are never written.

Each round lowers a freshly exported copy of the same quantized program under each configuration,
interleaved (the order rotates every round), after one discarded warm-up round:

* ``stock``: no operator declared (torch.library's declarations emptied for the lowering): the
  stock cache, on the patched torch (the no-registration path);
* ``global-patch``: the same, inside ``benchmarks/global_patch.py`` (ExecuTorch PR 21700's
  process-global ``is_builtin`` swap);
* ``oplevel``: the declarations as ExecuTorch and torch make them, each with a new token, so no
  entry of an earlier round answers (as the series' per-mode entries start empty on a fresh
  program's mode); their entries are evicted after the round, outside the timing.

Only the lowering call is timed (process CPU time and wall time, GC collected before, off during).
Ratios are medians of per-round ratios. Delegate payloads, the lowered graph's code and a digest of
its constants must be identical across configurations.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.util
import io
import json
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent.parent.parent
# This directory holds executorch/ (the patch): it must not shadow the package.
sys.path[:] = [p for p in sys.path if pathlib.Path(p or ".").resolve() != HERE]
SERIES = sorted(HERE.glob("000*.patch"))
EXECUTORCH_PATCH = HERE / "executorch" / "0001-declare-backend-ops-cacheable.patch"
CONFIGS = ("stock", "global-patch", "oplevel")
NAMESPACES = ("quantized_decomposed", "tosa", "dim_order_ops", "cortex_m")


def _driver() -> Any:
    """docs/upstream/executorch/lowering_driver.py, loaded by path (its helpers are reused)."""
    spec = importlib.util.spec_from_file_location("_series_driver", HERE.parent / "executorch" / "lowering_driver.py")
    assert spec is not None and spec.loader is not None
    module = sys.modules["_series_driver"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


DRIVER = _driver()


def _touched(patch: pathlib.Path) -> list[tuple[str, bool]]:
    """The files a patch writes, each with whether it exists before the patch."""
    lines = patch.read_text().splitlines()
    return [
        (line[len("+++ b/") :].split("\t")[0], lines[i - 1] != "--- /dev/null")
        for i, line in enumerate(lines)
        if line.startswith("+++ b/")
    ]


def prepare(tree: pathlib.Path, executorch: bool = True) -> None:
    """Copies the files the patches touch into ``tree`` (laid out like site-packages) and applies them."""
    et = tree / "executorch"
    jobs = [(tree, "torch", SERIES)] + ([(et, "executorch", [EXECUTORCH_PATCH])] if executorch else [])
    for root, package, patches in jobs:
        base = DRIVER._package_dir(package)
        for patch in patches:
            for rel, exists in _touched(patch):
                dest = root / rel
                if exists and not dest.exists():
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile((base.parent if package == "torch" else base) / rel, dest)
        for patch in patches:
            subprocess.run(["patch", "-p1", "--batch", "--fuzz=0", "-s", "-i", str(patch)], cwd=root, check=True)


def run(args: argparse.Namespace, tree: pathlib.Path) -> dict[str, Any]:
    sys.meta_path.insert(0, DRIVER._TreeFinder(tree))
    import torch
    import torch._subclasses.fake_tensor as ft
    from torch._library import fake_cache
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    flows = DRIVER._load("_driver_flows", "benchmarks/executorch/flows.py")
    models = DRIVER._load("_driver_models", "benchmarks/executorch/models.py")
    global_patch = DRIVER._load("_driver_global_patch", "benchmarks/global_patch.py")

    flow = flows.get_flow(args.flow)
    module, example, _ = models.build_model(args.model, 0)
    if flow.channels_last:
        example = tuple(t.to(memory_format=torch.channels_last) for t in example)
    prepared = prepare_pt2e(torch.export.export(module, example).module(check_guards=False), flow.make_quantizer())
    prepared(*example)
    converted = convert_pt2e(prepared)
    for name in ("torch._subclasses.fake_tensor", "torch._library.fake_cache", "torch.library"):
        assert str(sys.modules[name].__file__).startswith(str(tree)), sys.modules[name].__file__
    # Every declaration made so far, lazy imports during a lowering included.
    declared: dict[str, object] = {}

    def backend_entries(mode: Any) -> set[int]:
        """The positive backend-op entries the mode can hit (ids of their keys)."""
        caches = [ft.FakeTensorMode.cache] + ([mode.shape_env.fake_tensor_cache] if mode.shape_env else [])
        return {
            id(key)
            for cache in caches
            for key in global_patch.backend_entries(cache, NAMESPACES)
            if not isinstance(cache.get(key), ft._DispatchCacheBypassEntry)
        }

    def lower(config: str) -> dict[str, Any]:
        ep = torch.export.export(converted, example)
        mode = next(n.meta["val"].fake_mode for n in ep.graph.nodes if isinstance(n.meta.get("val"), ft.FakeTensor))
        declared.update(fake_cache.tokens)
        fake_cache.tokens.clear()
        if config == "oplevel":  # fresh tokens: no entry of an earlier round answers
            fake_cache.tokens.update({q: object() for q in declared})
        scope: Any = contextlib.nullcontext()
        if config == "global-patch":
            scope = global_patch.global_patch(NAMESPACES, shape_envs=[mode.shape_env])
        info0 = ft.FakeTensorMode.cache_info()
        entries0 = backend_entries(mode)
        with contextlib.redirect_stdout(io.StringIO()), scope:
            gc.collect()
            gc.disable()
            try:
                start, cpu = time.perf_counter(), time.process_time()
                lowered = flow.lower_program(ep)
                seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu
            finally:
                gc.enable()
            entries = len(backend_entries(mode) - entries0)
        info = ft.FakeTensorMode.cache_info()
        declared.update(fake_cache.tokens)
        if config == "oplevel":
            global_patch.evict_backend_entries(NAMESPACES, shape_envs=[mode.shape_env])
        fake_cache.tokens.update({q: object() for q in declared})
        bypasses = {k: v - info0.bypasses.get(k, 0) for k, v in info.bypasses.items()}
        return {
            "seconds": seconds,
            "cpu_seconds": cpu_seconds,
            "hits": info.hits - info0.hits,
            "misses": info.misses - info0.misses,
            "non_builtin_bypasses": bypasses.get("non-builtin", 0),
            "other_bypasses": {k: v for k, v in sorted(bypasses.items()) if v and k != "non-builtin"},
            "new_backend_entries": entries,
            "outputs": DRIVER._digest(lowered),
        }

    configs = args.configs.split(",")
    for config in configs:  # warm-up round, discarded
        lower(config)
    namespaces = sorted({q.split("::")[0] for q in declared})
    rounds = []
    for r in range(args.repeats):
        order = configs[r % len(configs) :] + configs[: r % len(configs)]
        rounds.append({config: lower(config) for config in order})
    assert "torch_cachepolicy" not in sys.modules, "prototype code was imported"
    outputs = {json.dumps(r[c].pop("outputs")) for r in rounds for c in configs}

    def ratios(a: str, b: str, field: str) -> list[float]:
        return sorted(r[a][field] / r[b][field] for r in rounds)

    summary: dict[str, Any] = {
        "flow": args.flow,
        "model": args.model,
        "rounds": args.repeats,
        "torch": torch.__version__,
        "identical_outputs": len(outputs) == 1,
        "declared": {ns: sum(q.startswith(ns + "::") for q in declared) for ns in namespaces},
        "median_cpu_s": {c: round(statistics.median(r[c]["cpu_seconds"] for r in rounds), 3) for c in configs},
        "counts": {c: {k: v for k, v in rounds[-1][c].items() if "seconds" not in k} for c in configs},
    }
    for a, b in (("oplevel", "stock"), ("global-patch", "stock"), ("oplevel", "global-patch")):
        if a in configs and b in configs:
            for field in ("cpu_seconds", "seconds"):
                v = ratios(a, b, field)
                summary[f"{a}/{b} {field}"] = {
                    "median": round(statistics.median(v), 3),
                    "min": round(v[0], 3),
                    "max": round(v[-1], 3),
                }
            summary[f"{a}/{b} cpu per round"] = [
                round(r[a]["cpu_seconds"] / r[b]["cpu_seconds"], 3) for r in rounds
            ]
    return summary


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--flow", default="ethos-u55", choices=("ethos-u55", "cortex-m", "xnnpack"))
    parser.add_argument("--model", default="tiny", choices=("tiny", "large"))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--tree", type=pathlib.Path, help="where to put the patched copies (default: a temporary dir)")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    with tempfile.TemporaryDirectory(prefix="oplevel-tree-") as tmp:
        tree = args.tree or pathlib.Path(tmp)
        prepare(tree)
        print(json.dumps(run(args, tree), indent=1))


if __name__ == "__main__":
    main()
