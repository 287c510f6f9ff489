# Owner(s): ["module: fakeTensor"]
"""Tests for torch_cachepolicy._native: whether the package uses the C++ helper, and why not.

An extension built against another torch (Note [An extension built for another torch]) is simulated by changing one
side of the comparison, never the build: ``_C.TORCH_VERSION`` (the torch setup.py built against) or
``torch.__version__`` (the torch that runs), in this process around ``_native._load()``, or in a fresh interpreter
that loads ``_C`` with another recorded version before it imports the package.
"""

from __future__ import annotations

import os
import textwrap
import unittest
import warnings
from types import ModuleType
from typing import Any
from unittest import mock

import cachepolicy_testing as testing
import torch
from torch.testing._internal.common_utils import TestCase, instantiate_parametrized_tests, parametrize, run_tests

from torch_cachepolicy import _compat, _native

_C: ModuleType | None
try:
    # Directly, not through _native.extension(): that is None under TORCH_CACHEPOLICY_FORCE_PYTHON=1.
    from torch_cachepolicy import _C  # type: ignore[attr-defined,no-redef]
except ImportError:
    _C = None

needs_cpp = unittest.skipIf(_C is None, "torch_cachepolicy._C is not built (USE_CPP=0 or the build failed)")


def load(built: str, running: str) -> tuple[ModuleType | None, str, bool, list[Any]]:
    """``_native._load()`` with ``_C`` recorded as built against torch ``built`` under torch ``running``, and the
    warnings it gave."""
    with (
        mock.patch.dict(os.environ, {_native.FORCE_ENV: ""}),
        mock.patch.object(_C, "TORCH_VERSION", built),
        mock.patch.object(torch, "__version__", running),
        warnings.catch_warnings(record=True) as caught,
    ):
        warnings.simplefilter("always")
        ext, reason, warned = _native._load()
    return ext, reason, warned, list(caught)


@needs_cpp
class TestBuiltForAnotherTorch(TestCase):
    def test_build_records_the_running_torch(self) -> None:
        """setup.py recorded the torch _C was built against: here the installed one, so the package uses _C."""
        self.assertEqual(_C.TORCH_VERSION, str(torch.__version__))  # type: ignore[union-attr]
        ext, reason, warned, caught = load(str(torch.__version__), str(torch.__version__))
        self.assertEqual((ext, reason, warned, caught), (_C, "", False, []))

    @parametrize("built,running", [("2.15.0", "2.13.0"), ("2.13.0", "2.15.0"), ("2.15.0", "2.15.0+cu130")])
    def test_other_torch_is_not_used(self, built: str, running: str) -> None:
        """_C built against another torch (2.15.0 under 2.13.0, or the reverse) is not used: one warning, naming both
        versions and the rebuild, and the reason fallback_reason() gives."""
        ext, reason, warned, caught = load(built, running)
        self.assertIsNone(ext)
        self.assertEqual(reason, f"torch_cachepolicy._C was built against torch {built}, not the installed torch {running}")
        self.assertTrue(warned)  # the once-per-process fallback warning is this one
        (warning,) = caught
        self.assertIs(warning.category, _compat.TorchDriftWarning)
        message = str(warning.message)
        self.assertTrue(message.startswith(f"torch_cachepolicy: {reason}, whose internals"), msg=message)
        self.assertIn(f"Rebuild it against this torch with `{_native.REBUILD}`, or install with `USE_CPP=0`", message)


# Loads _C from its file with another recorded torch, then imports the package: as if _C had been built elsewhere.
_OTHER_BUILD = """
import importlib.util, json, sys, warnings
import torch
import torch.ao.quantization.fx._decomposed  # defines the quantized_decomposed ops

spec = importlib.util.spec_from_file_location("torch_cachepolicy._C", PATH)
ext = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ext)
ext.TORCH_VERSION = BUILT
sys.modules["torch_cachepolicy._C"] = ext

def run(mode):
    with mode:
        x = torch.empty(4, 8)
        outs = [torch.ops.quantized_decomposed.quantize_per_tensor(x, 0.1, 0, -128, 127, torch.int8) for _ in range(3)]
    return [(str(t.dtype), tuple(t.shape), t.stride()) for t in outs]

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import torch_cachepolicy as tcp
    from torch_cachepolicy import _native
    mode = tcp.FakeTensorMode(cache_policy=tcp.CachePolicy(namespaces=["quantized_decomposed"]))
    outs = run(mode)  # the first backend dispatch makes a kernel watch: the fallback warning was given already
stock = run(torch._subclasses.fake_tensor.FakeTensorMode())
row = mode.cache_report()[torch.ops.quantized_decomposed.quantize_per_tensor.default]
print(json.dumps({
    "warnings": [(w.category.__name__, str(w.message)) for w in caught],
    "backend": _native.backend(),
    "reason": _native.fallback_reason(),
    "same": outs == stock,
    "counts": [row.hits, row.misses],
    "keys": mode.cache_key_stats().fallbacks,
}))
"""


@needs_cpp
class TestImportUnderAnotherTorch(TestCase):
    def test_python_paths_serve(self) -> None:
        """`import torch_cachepolicy` with a _C built against another torch: one warning naming both versions; the
        Python paths serve the mode, with stock's outputs and the same hits."""
        built = "2.13.0" if str(torch.__version__).startswith("2.15.") else "2.15.0"
        script = _OTHER_BUILD.replace("PATH", repr(_C.__file__)).replace("BUILT", repr(built))  # type: ignore[union-attr]
        env = {k: v for k, v in os.environ.items() if k != _native.FORCE_ENV}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(testing.REPO_ROOT), env.get("PYTHONPATH", "")) if p)
        result = testing.run_json_script(self, textwrap.dedent(script), env)
        reason = f"torch_cachepolicy._C was built against torch {built}, not the installed torch {torch.__version__}"
        ((category, message),) = result["warnings"]
        self.assertEqual(category, "TorchDriftWarning")
        self.assertTrue(message.startswith(f"torch_cachepolicy: {reason}"), msg=message)
        self.assertEqual((result["backend"], result["reason"]), ("python", reason))
        self.assertTrue(result["same"])
        self.assertEqual(result["counts"], [1, 2])  # 3 calls: the first sight, the miss, a hit
        self.assertEqual(list(result["keys"]), ["no C++ key builder"])


instantiate_parametrized_tests(TestBuiltForAnotherTorch)

if __name__ == "__main__":
    run_tests()
