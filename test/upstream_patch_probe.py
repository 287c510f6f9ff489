"""The behaviour tests of the patch series in docs/upstream/, run against patched torch.

Runs in a subprocess, never imported by the test process::

    TCP_PATCHED_TREE=/tmp/x/site-packages python test/upstream_patch_probe.py probe 0003 ...
    TCP_PATCHED_TREE= python test/upstream_patch_probe.py workload [undeclared]

``TCP_SERIES`` picks whose tests run: ``proposed`` (docs/upstream/, the
default) or ``alternative`` (docs/upstream/alternative-policy/).

``TCP_PATCHED_TREE`` names a tree laid out like site-packages that holds the
patched copies of the files the series touches (``PATCHED_FILES``); those
present are served in place of the installed modules, so the installed torch
is never written. Empty: the installed torch, unpatched.

The tests are not written here. Each patch of the series comes with a patch
to torch's tests (``docs/upstream/tests/``) that adds helpers and methods to
``test/test_fake_tensor.py``'s ``FakeTensorDispatchCache`` and may add whole
test files (0003: ``test/export/``, ``test/dynamo/``); that is what a
maintainer reviews and what was run against torch's own file
(``docs/upstream/README.md``). torch's test file is not in this repository,
so ``probe`` reads what a test patch adds (test/upstream_test_sources.py) and
runs the methods in a ``TestCase`` that has what they use from
``test_fake_tensor.py``: its imports, its module-level cache configuration,
the patch's module-level helpers, and ``assertHitsMisses`` /
``assertBypasses`` (:class:`DispatchCacheTestCase`); a new test file runs as
a module of its own. It prints ``PROBE-RESULT <json>``: for every test id,
``"ok"`` or the failure.

``workload`` prints ``WORKLOAD-RESULT <json>``, the stock cache counters and
outputs of a fixed workload, which must not change with the series when no
policy is attached.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import pathlib
import sys
from collections.abc import Sequence
from types import ModuleType

PATCHED_FILES = {
    "torch._subclasses.fake_tensor": "torch/_subclasses/fake_tensor.py",
    "torch._subclasses._fake_tensor_cache_policy": "torch/_subclasses/_fake_tensor_cache_policy.py",
    "torch._library": "torch/_library/__init__.py",
    "torch._library.custom_ops": "torch/_library/custom_ops.py",
    "torch._library.fake_cache": "torch/_library/fake_cache.py",
    "torch.library": "torch/library.py",
    "torch.ao.quantization.fx._decomposed": "torch/ao/quantization/fx/_decomposed.py",
}
UPSTREAM = pathlib.Path(__file__).resolve().parent.parent / "docs" / "upstream"
# Which series' tests run (TCP_SERIES): the proposed one (docs/upstream/) or the alternative (alternative-policy/).
SERIES = os.environ.get("TCP_SERIES", "proposed")
TEST_PATCHES = UPSTREAM / "tests" if SERIES == "proposed" else UPSTREAM / "alternative-policy" / "tests"
# The TestCase name of each test patch's FakeTensorDispatchCache methods, by the number of the patch it tests.
CASES = {"0001": "StockHardening", "0002": "CacheClearOnSubclass"} | (
    {"0003": "CacheableOps", "0004": "QuantizedDecomposedCacheable"}
    if SERIES == "proposed"
    else {"0003": "CachePolicy"}
)
# Test patches whose methods use helper methods (not tests) another test patch adds.
HELPERS_FROM = {"0004": "0003"} if SERIES == "proposed" else {}


class _PatchedFinder(importlib.abc.MetaPathFinder):
    def __init__(self, tree: str) -> None:
        self.tree = tree

    def find_spec(
        self, name: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        rel = PATCHED_FILES.get(name)
        if rel is None or not os.path.exists(os.path.join(self.tree, rel)):
            return None
        if rel.endswith("/__init__.py"):
            # A package: its submodules that are not patched load from the installed package.
            torch_spec = importlib.machinery.PathFinder.find_spec("torch")
            assert torch_spec is not None and torch_spec.submodule_search_locations is not None
            installed = os.path.join(next(iter(torch_spec.submodule_search_locations)), *name.split(".")[1:])
            return importlib.util.spec_from_file_location(
                name, os.path.join(self.tree, rel), submodule_search_locations=[installed]
            )
        return importlib.util.spec_from_file_location(name, os.path.join(self.tree, rel))


def serve_patched_modules(tree: str) -> None:
    """Makes the next imports of the patched modules load the copies in ``tree`` (no-op if empty)."""
    if "torch" in sys.modules:
        raise RuntimeError("serve_patched_modules() must run before torch is imported")
    if tree:
        sys.meta_path.insert(0, _PatchedFinder(tree))


# Before torch is imported, which is why the imports below come after code.
serve_patched_modules(os.environ.get("TCP_PATCHED_TREE", ""))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import copy  # noqa: E402
import gc  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import traceback  # noqa: E402
import unittest  # noqa: E402
import weakref  # noqa: E402
from typing import Any  # noqa: E402
from unittest.mock import patch  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch._dynamo  # noqa: E402
import torch._functorch.config  # noqa: E402
import torch.ao.quantization.fx._decomposed  # noqa: E402, F401  (defines quantized_decomposed)
import torch.utils._pytree as pytree  # noqa: E402
import upstream_test_sources  # noqa: E402
from torch._guards import TracingContext  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode, extract_tensor_metadata  # noqa: E402
from torch.fx.experimental.proxy_tensor import make_fx  # noqa: E402
from torch.fx.experimental.symbolic_shapes import (  # noqa: E402
    DimDynamic,
    ShapeEnv,
    StatelessSymbolicContext,
    statically_known_true,
)
from torch.testing._internal.common_utils import (  # noqa: E402
    TestCase,
    instantiate_parametrized_tests,
    parametrize,
    skipIfTorchDynamo,
)

aten = torch.ops.aten
# As test/test_fake_tensor.py sets them at import.
torch._dynamo.config.fake_tensor_cache_enabled = True
torch._dynamo.config.fake_tensor_cache_crosscheck_enabled = True

# What the added methods may use from test_fake_tensor.py's module scope.
TEST_GLOBALS: dict[str, Any] = {
    "copy": copy,
    "gc": gc,
    "np": np,
    "io": io,
    "patch": patch,
    "weakref": weakref,
    "sys": sys,
    "pytree": pytree,
    "torch": torch,
    "aten": aten,
    "TracingContext": TracingContext,
    "FakeTensorMode": FakeTensorMode,
    "extract_tensor_metadata": extract_tensor_metadata,
    "make_fx": make_fx,
    "DimDynamic": DimDynamic,
    "ShapeEnv": ShapeEnv,
    "StatelessSymbolicContext": StatelessSymbolicContext,
    "statically_known_true": statically_known_true,
    "parametrize": parametrize,
    "skipIfTorchDynamo": skipIfTorchDynamo,
}


class DispatchCacheTestCase(TestCase):
    """The helpers of test_fake_tensor.py's FakeTensorDispatchCache the added tests call."""

    def assertHitsMisses(self, hits: int, misses: int) -> None:
        info = FakeTensorMode.cache_info()
        self.assertEqual(info.hits, hits)
        self.assertEqual(info.misses, misses)

    def assertBypasses(self, reason: str, count: int) -> None:
        info = FakeTensorMode.cache_info()
        if count > 0:
            self.assertIn(reason, info.bypasses)
            self.assertEqual(info.bypasses[reason], count)
        else:
            self.assertNotIn(reason, info.bypasses)


def test_patch(number: str) -> pathlib.Path:
    (path,) = TEST_PATCHES.glob(f"{number}-*.patch")
    return path


def test_cases(number: str) -> tuple[list[type[unittest.TestCase]], dict[str, str]]:
    """The TestCases of test patch ``number``, and the test ids of new files that could not be imported -> why.

    The methods added to FakeTensorDispatchCache become the class ``CASES[number]``, with the patch's module-level
    helpers in its module scope; each new file runs as a module of its own.
    """
    sources = upstream_test_sources.read_test_patch(test_patch(number))
    name = CASES[number]
    base = "DispatchCacheTestCase"
    namespace: dict[str, Any] = {**TEST_GLOBALS, "DispatchCacheTestCase": DispatchCacheTestCase}
    if number in HELPERS_FROM:
        # The other patch's methods, less its tests: in upstream's file both are methods of one class.
        helpers = upstream_test_sources.read_test_patch(test_patch(HELPERS_FROM[number]))
        exec(
            compile(
                f"{helpers.module}\n\n\nclass _Helpers(DispatchCacheTestCase):\n{helpers.methods}\n", "helpers", "exec"
            ),
            namespace,
        )
        for attr in [a for a in vars(namespace["_Helpers"]) if a.startswith("test_")]:
            delattr(namespace["_Helpers"], attr)
        base = "_Helpers"
    source = f"{sources.module}\n\n\nclass {name}({base}):\n{sources.methods}\n"
    exec(compile(source, str(test_patch(number)), "exec"), namespace)
    cls: type[TestCase] = namespace[name]
    instantiate_parametrized_tests(cls)
    classes: list[type[unittest.TestCase]] = [cls]
    broken: dict[str, str] = {}
    for path, file_source in sources.files.items():
        # A module in sys.modules: dynamo imports the module of the code it traces by name.
        new = ModuleType("upstream_" + pathlib.Path(path).stem)
        new.__file__ = path
        sys.modules[new.__name__] = new
        module = vars(new)
        try:
            exec(compile(file_source, path, "exec"), module)
        except Exception:
            why = traceback.format_exc()
            only = upstream_test_sources.TestSources("", "", {path: file_source})
            broken.update({test_id: why for test_id in upstream_test_sources.test_ids(only, name)})
            continue
        classes += [
            v
            for v in module.values()
            if isinstance(v, type) and issubclass(v, unittest.TestCase) and v.__module__ == module["__name__"]
        ]
    return classes, broken


def probe(numbers: Sequence[str]) -> dict[str, str]:
    """Runs the tests of the named test patches; maps each test id (``Case.test_name``) to "ok" or its failure."""
    classes: list[type[unittest.TestCase]] = []
    outcome: dict[str, str] = {}
    for number in numbers:
        cases, broken = test_cases(number)
        classes += cases
        outcome.update(broken)
    suite = unittest.TestSuite(unittest.defaultTestLoader.loadTestsFromTestCase(c) for c in classes)
    outcome.update({_test_id(t): "ok" for t in _tests(suite)})
    result = unittest.TestResult()
    suite.run(result)
    for test, trace in result.failures + result.errors:
        outcome[_test_id(test)] = trace
    for test, why in result.skipped:
        outcome[_test_id(test)] = "skipped: " + why
    return outcome


def _test_id(test: unittest.TestCase) -> str:
    # A failed subTest is reported as a _SubTest of the test that ran it.
    test = getattr(test, "test_case", test)
    return f"{type(test).__name__}.{test._testMethodName}"


def _tests(suite: unittest.TestSuite) -> list[unittest.TestCase]:
    out: list[unittest.TestCase] = []
    for t in suite:
        out.extend(_tests(t) if isinstance(t, unittest.TestSuite) else [t])  # type: ignore[list-item]
    return out


def workload(undeclared: bool = False) -> list[Any]:
    """Stock counters and outputs of a fixed workload, without a policy (and, if ``undeclared``, nothing declared cacheable)."""
    q = torch.ops.quantized_decomposed.quantize_per_tensor.default
    if undeclared:
        try:
            from torch._library import fake_cache  # type: ignore[attr-defined]
        except ImportError:  # unpatched torch, or the alternative series
            pass
        else:
            fake_cache.declared.clear()
    FakeTensorMode.cache_clear()
    log: list[Any] = []
    for mode in (FakeTensorMode(), FakeTensorMode(shape_env=ShapeEnv())):
        dynamic: StatelessSymbolicContext[..., Any] | None = (
            StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC] * 2) if mode.shape_env else None
        )
        x = mode.from_tensor(torch.empty(3, 4), symbolic_context=dynamic)
        with mode:
            for _ in range(3):
                y = x + x
                y.add_(1)
                v = y.view(-1)
                z = q(y, 0.1, 0, -128, 127, torch.int8)
                n = torch.ops.aten.nonzero.default(y) if mode.shape_env else y.sum()
                s = torch.ops.aten.sym_size.int(y, 0)
                log.append([str(t.shape) for t in (y, v, z, n)] + [str(s), str(z.dtype)])
        log.append(str(len(mode.shape_env.fake_tensor_cache) if mode.shape_env else None))
    stats = FakeTensorMode.cache_info()
    return [stats.hits, stats.misses, dict(sorted(stats.bypasses.items())), stats.size, log]


def main(argv: Sequence[str]) -> None:
    if argv[:1] == ["probe"] and len(argv) > 1:
        print("PROBE-RESULT " + json.dumps(probe(argv[1:])))
    elif argv in (["workload"], ["workload", "undeclared"]):
        print("WORKLOAD-RESULT " + json.dumps(workload(undeclared=argv[1:] == ["undeclared"])))
    else:
        raise SystemExit(f"usage: {sys.argv[0]} probe {' '.join(CASES)} | workload [undeclared]")


if __name__ == "__main__":
    main(sys.argv[1:])
