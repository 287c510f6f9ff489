"""In-process A/B of the op-level series' cost without a registration: stock torch against the series.

Usage, from the repository root: python docs/upstream/ab_no_registration.py [--rounds 40] [--declared]

Runs on the installed torch 2.13.0 (docs/upstream/000N-*.patch) or 2.15.0 (torch-2.15.0/). As the v5.5
review's p01b: the series is applied to copies of the files it touches (served in place of the
installed modules, as executorch/lowering_driver.py does), and the five methods of FakeTensorMode it
changes (_cached_dispatch_impl, _cache_key, _validate_cache_key, _make_cache_entry,
_get_output_info_for_cache_entry) are compiled from the installed, unpatched fake_tensor.py into the
patched module's namespace; each round runs the workloads with stock's five and with the series'
five, in alternating order. Workloads: an aten hit (x + x), a static miss (a fresh shape each call,
after cache_clear), a symbolic miss (a ShapeEnv, a fresh dynamic input each call). Times are process
CPU time; the figures are medians (and quartiles) of the per-round ratios series/stock.
``--declared`` imports torch's quantized_decomposed ops first (0004 declares 19), so that the
registry the series reads per dispatch is not empty; no declared op is dispatched.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import pathlib
import statistics
import sys
import tempfile
import textwrap
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if pathlib.Path(p or ".").resolve() != HERE]
NAMES = (
    "_cached_dispatch_impl",
    "_cache_key",
    "_validate_cache_key",
    "_make_cache_entry",
    "_get_output_info_for_cache_entry",
)


def _driver():
    spec = importlib.util.spec_from_file_location("_lowering_driver", HERE / "executorch" / "lowering_driver.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["_lowering_driver"] = module
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--declared", action="store_true")
    args = parser.parse_args()
    driver = _driver()
    import importlib.metadata

    release = importlib.metadata.version("torch").split("+")[0]
    if release != "2.13.0":  # the series made for this release
        series_dir = HERE / f"torch-{release}"
        driver.SERIES["oplevel"] = (sorted(series_dir.glob("000*.patch")), driver.SERIES["oplevel"][1])
    stock_file = driver._package_dir("torch") / "_subclasses" / "fake_tensor.py"
    with tempfile.TemporaryDirectory(prefix="oplevel-ab-") as tmp:
        tree = pathlib.Path(tmp)
        driver.prepare(tree, "oplevel", executorch=False)
        sys.meta_path.insert(0, driver._TreeFinder(tree))
        run(args, stock_file, tree)


def run(args: argparse.Namespace, stock_file: pathlib.Path, tree: pathlib.Path) -> None:
    import torch
    import torch._subclasses.fake_tensor as ft
    from torch._library import fake_cache
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

    assert str(ft.__file__).startswith(str(tree)) and not str(stock_file).startswith(str(tree))
    if args.declared:
        import torch.ao.quantization.fx._decomposed  # noqa: F401
    text = stock_file.read_text()
    lines = text.splitlines()
    stock = {}
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ClassDef) and node.name == "FakeTensorMode":
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name in NAMES:
                    src = textwrap.dedent("\n".join(lines[item.lineno - 1 : item.end_lineno]))
                    ns = dict(vars(ft))
                    exec(compile("from __future__ import annotations\n" + src, "stock_" + item.name, "exec"), ns)
                    stock[item.name] = ns[item.name]
    assert set(stock) == set(NAMES)
    series = {n: getattr(ft.FakeTensorMode, n) for n in NAMES}
    assert all(stock[n].__code__.co_code != series[n].__code__.co_code for n in NAMES)

    def use(impls):
        for n, f in impls.items():
            setattr(ft.FakeTensorMode, n, f)

    mode = ft.FakeTensorMode()
    x = mode.from_tensor(torch.empty(8, 8))
    xs = [mode.from_tensor(torch.empty(i + 1, 3)) for i in range(4000)]
    smode = ft.FakeTensorMode(shape_env=ShapeEnv())
    dyn = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC, DimDynamic.STATIC])
    sxs = [smode.from_tensor(torch.empty(i + 2, 3), symbolic_context=dyn) for i in range(2400)]

    def hit(n):
        with mode:
            for _ in range(n):
                x + x

    def miss(seq):
        with mode:
            for t in seq:
                t + t

    def smiss(seq):
        with smode:
            for t in seq:
                t * t

    res: dict = {}
    ratios: dict = {"aten hit": [], "aten miss": [], "symbolic miss": []}
    hit(200)
    si = mi = 0
    for r in range(args.rounds):
        per = {}
        for name in ("stock", "series") if r % 2 == 0 else ("series", "stock"):
            use(stock if name == "stock" else series)
            t0 = time.process_time_ns()
            hit(1500)
            per[("aten hit", name)] = (time.process_time_ns() - t0) / 1500
            ft.FakeTensorMode.cache_clear()
            seq = xs[mi : mi + 100]
            mi = (mi + 100) % 3900
            t0 = time.process_time_ns()
            miss(seq)
            per[("aten miss", name)] = (time.process_time_ns() - t0) / 100
            seq = sxs[si : si + 30]
            si = (si + 30) % 2370
            t0 = time.process_time_ns()
            smiss(seq)
            per[("symbolic miss", name)] = (time.process_time_ns() - t0) / 30
        for k in ratios:
            ratios[k].append(per[(k, "series")] / per[(k, "stock")])
        for k, v in per.items():
            res.setdefault(k, []).append(v)
    use(series)
    print(f"torch {torch.__version__}; declared ops in the registry: {len(fake_cache.declared)}; rounds: {args.rounds}")
    for k, v in sorted(res.items()):
        print(f"{k[0]:14s} {k[1]:6s} median {statistics.median(v) / 1000:8.2f} us per call")
    for k, v in ratios.items():
        v = sorted(v)
        n = len(v)
        print(
            f"{k:14s} series/stock per-round ratio: median {statistics.median(v):.4f} "
            f"(q1 {v[n // 4]:.4f}, q3 {v[3 * n // 4]:.4f}, min {v[0]:.4f}, max {v[-1]:.4f})"
        )


if __name__ == "__main__":
    main()
