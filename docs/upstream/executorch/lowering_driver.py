"""Lowers ExecuTorch flows on torch with the upstream series applied, without any prototype code.

Usage, from the repository root (ExecuTorch 1.5.1 installed, see
requirements-executorch.txt)::

    python docs/upstream/executorch/lowering_driver.py --flow ethos-u55 --model large --repeats 6

It copies the files the series touches from the installed torch, and those the
ExecuTorch patch touches from the installed ExecuTorch, into a temporary tree,
applies ``docs/upstream/000*.patch`` and
``docs/upstream/executorch/0001-exportpass-fake-tensor-cache-policy.patch``
with ``patch -p1 --fuzz=0``, and serves the patched copies in place of the
installed modules (a finder first on ``sys.meta_path``, installed before
torch is imported). The installed packages are never written, and
``torch_cachepolicy`` is never imported (checked at the end).

Each round lowers a freshly exported copy of the same quantized program under
each configuration, interleaved, after one discarded warm-up round:

* ``stock``: ``exir.fake_tensor_cache.ENABLED = False``: torch's stock cache;
* ``global-patch``: the same, inside ``benchmarks/global_patch.py`` (ExecuTorch
  PR 21700's process-global ``is_builtin`` swap) around the lowering;
* ``series``: ``ENABLED = True``: every ExportPass attaches the ExecuTorch
  policy to the mode it runs on (torch's ``FakeTensorMode._cache_policy``).

Only the lowering call is timed (GC collected before, off during), after
``FakeTensorMode.cache_clear()``: each lowering starts with an empty cache, as
in a fresh process (v6 keeps policy entries in torch's cache, which would
otherwise carry them from one round to the next). Ratios are medians of
per-round ratios. Counts are torch's counters over the lowering (policy
entries are hits and misses of torch's cache there) and the number of entries
a policy admitted. Delegate payloads, the lowered graph's code and a
digest of its constants must be identical across configurations.
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
ROOT = HERE.parent.parent.parent
SERIES = sorted((HERE.parent).glob("000*.patch"))
EXECUTORCH_PATCH = HERE / "0001-exportpass-fake-tensor-cache-policy.patch"
TORCH_FILES = ("torch/_subclasses/fake_tensor.py",)
EXECUTORCH_FILES = ("exir/pass_base.py", "exir/program/_program.py", "backends/arm/tosa/specification.py")
CONFIGS = ("stock", "global-patch", "series")


def _package_dir(name: str) -> pathlib.Path:
    spec = importlib.util.find_spec(name)  # does not import the package
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"{name} is not installed")
    return pathlib.Path(next(iter(spec.submodule_search_locations)))


def prepare(tree: pathlib.Path) -> None:
    """Copies the touched files into ``tree`` (laid out like site-packages) and applies the patches."""
    for rel in TORCH_FILES:
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(_package_dir("torch").parent / rel, tree / rel)
    et = tree / "executorch"
    for rel in EXECUTORCH_FILES:
        (et / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(_package_dir("executorch") / rel, et / rel)
    for cwd, patch in [(tree, p) for p in SERIES] + [(et, EXECUTORCH_PATCH)]:
        subprocess.run(["patch", "-p1", "--batch", "--fuzz=0", "-s", "-i", str(patch)], cwd=cwd, check=True)


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
    return payloads, gm.code, digest.hexdigest()


def run(args: argparse.Namespace, tree: pathlib.Path) -> dict[str, Any]:
    sys.meta_path.insert(0, _TreeFinder(tree))
    import torch
    import torch._subclasses.fake_tensor as ft
    from executorch.exir import fake_tensor_cache, pass_base
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    for module in (ft, fake_tensor_cache, pass_base):
        assert str(module.__file__).startswith(str(tree)), module.__file__
    flows = _load("_driver_flows", "benchmarks/executorch/flows.py")
    models = _load("_driver_models", "benchmarks/executorch/models.py")
    global_patch = _load("_driver_global_patch", "benchmarks/global_patch.py")

    flow = flows.get_flow(args.flow)
    module, example, _ = models.build_model(args.model, 0)
    if flow.channels_last:
        example = tuple(t.to(memory_format=torch.channels_last) for t in example)
    prepared = prepare_pt2e(torch.export.export(module, example).module(check_guards=False), flow.make_quantizer())
    prepared(*example)
    converted = convert_pt2e(prepared)

    def lower(config: str) -> dict[str, Any]:
        ep = torch.export.export(converted, example)
        mode = next(n.meta["val"].fake_mode for n in ep.graph.nodes if isinstance(n.meta.get("val"), ft.FakeTensor))
        fake_tensor_cache.ENABLED = config == "series"
        scope: Any = contextlib.nullcontext()
        if config == "global-patch":
            scope = global_patch.global_patch(fake_tensor_cache.CACHEABLE_NAMESPACES, shape_envs=[mode.shape_env])
        ft.FakeTensorMode.cache_clear()
        stock0 = ft.FakeTensorMode.cache_info()
        with contextlib.redirect_stdout(io.StringIO()), scope:
            gc.collect()
            gc.disable()
            try:
                start, cpu = time.perf_counter(), time.process_time()
                lowered = flow.lower_program(ep)
                seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu
            finally:
                gc.enable()
        stock = ft.FakeTensorMode.cache_info()
        caches = [ft.FakeTensorMode.cache, mode.shape_env.fake_tensor_cache if mode.shape_env else {}]
        policy_entries = [key for cache in caches for key in cache if "policy" in key.key]
        fake_tensor_cache.ENABLED = True
        return {
            "seconds": seconds,
            "cpu_seconds": cpu_seconds,
            "stock_hits": stock.hits - stock0.hits,
            "stock_misses": stock.misses - stock0.misses,
            "stock_non_builtin": stock.bypasses.get("non-builtin", 0) - stock0.bypasses.get("non-builtin", 0),
            "bypasses": {
                reason: n - stock0.bypasses.get(reason, 0)
                for reason, n in stock.bypasses.items()
                if n != stock0.bypasses.get(reason, 0)
            },
            "policy_entries": len(policy_entries),
            "policy_negative_entries": sum(
                isinstance(cache[key], ft._DispatchCacheBypassEntry)
                for cache in caches
                for key in cache
                if "policy" in key.key
            ),
            "outputs": _digest(lowered),
        }

    configs = args.configs.split(",")
    for config in configs:  # warm-up round, discarded
        lower(config)
    rounds = [{config: lower(config) for config in configs} for _ in range(args.repeats)]
    assert "torch_cachepolicy" not in sys.modules, "prototype code was imported"
    outputs = {json.dumps(r[c].pop("outputs")) for r in rounds for c in configs}

    def ratio(a: str, b: str, field: str) -> float:
        return statistics.median(r[a][field] / r[b][field] for r in rounds)

    summary: dict[str, Any] = {
        "flow": args.flow,
        "model": args.model,
        "rounds": args.repeats,
        "torch": torch.__version__,
        "identical_outputs": len(outputs) == 1,
        "median_cpu_s": {c: statistics.median(r[c]["cpu_seconds"] for r in rounds) for c in configs},
        "counts": {c: {k: v for k, v in rounds[-1][c].items() if "seconds" not in k} for c in configs},
    }
    for a, b in (("series", "stock"), ("global-patch", "stock"), ("series", "global-patch")):
        if a in configs and b in configs:
            summary[f"{a}/{b}"] = {f: round(ratio(a, b, f), 3) for f in ("cpu_seconds", "seconds")}
    summary["per_round_series/global-patch_cpu"] = [
        round(r["series"]["cpu_seconds"] / r["global-patch"]["cpu_seconds"], 3)
        for r in rounds
        if "series" in r and "global-patch" in r
    ]
    return summary


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--flow", default="ethos-u55", choices=("ethos-u55", "cortex-m", "xnnpack"))
    parser.add_argument("--model", default="tiny", choices=("tiny", "large"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--tree", type=pathlib.Path, help="where to put the patched copies (default: a temporary dir)")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    with tempfile.TemporaryDirectory(prefix="tcp-series-") as tmp:
        tree = args.tree or pathlib.Path(tmp)
        prepare(tree)
        print(json.dumps(run(args, tree), indent=1))


if __name__ == "__main__":
    main()
