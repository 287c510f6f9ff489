# Owner(s): ["module: fakeTensor"]
"""The wheel holds the library only, the sdist builds the C++ helper, and importing the library pulls in nothing else.

The wheel is built once per run with ``pip wheel --no-build-isolation
--no-deps`` from a copy of the repository (so the working tree's ``build/``
and in-place ``_C`` are neither reused nor overwritten). By default the build
runs with ``USE_CPP=0``: it then takes seconds instead of the ~40 s the C++
helper needs, and the wheel must not hold ``_C``.
``TORCH_CACHEPOLICY_TEST_WHEEL_CPP=1`` (``make test-wheel``, not part of
``make test``) builds the helper and requires ``_C`` in the wheel. The sdist
is built once too, and the helper is built from it (what a user without a
wheel for their torch does). One more wheel is built with a compiler that does
not run (``CC`` and ``CXX`` name no program), failing in seconds.
"""

from __future__ import annotations

import ast
import email.message
import email.parser
import json
import os
import pathlib
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import unittest
import zipfile
from typing import ClassVar

from torch.testing._internal.common_utils import TestCase, run_tests

import torch_cachepolicy
from torch_cachepolicy import _native

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10 has no TOML reader in the standard library.
    tomllib = None

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "torch_cachepolicy"
WITH_CPP = os.environ.get("TORCH_CACHEPOLICY_TEST_WHEEL_CPP") == "1"
# What a checkout holds besides sources: never part of what the build sees.
NOT_COPIED = shutil.ignore_patterns(
    ".git", "build", "dist", ".venv*", "*.so", "__pycache__", "*.egg-info", "bench-results", ".*_cache"
)


def build_wheel(out: pathlib.Path, *, with_cpp: bool | None, **extra_env: str) -> tuple[pathlib.Path, str]:
    """Builds the wheel from a copy of the repository, with ``USE_CPP`` 1, 0 or unset (``with_cpp`` True, False or
    None) and ``extra_env`` set; returns its path and what the build printed."""
    src = out / "src"
    shutil.copytree(ROOT, src, ignore=NOT_COPIED)
    env = {**{k: v for k, v in os.environ.items() if k != "USE_CPP"}, **extra_env}
    if with_cpp is not None:
        env["USE_CPP"] = "1" if with_cpp else "0"
    # -v: pip shows what setup.py printed.
    cmd = [sys.executable, "-m", "pip", "wheel", "-v", "--no-build-isolation", "--no-deps", "-w", str(out / "dist")]
    cmd.append(".")
    proc = subprocess.run(cmd, cwd=src, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed:\n{proc.stdout}\n{proc.stderr}")
    (wheel,) = (out / "dist").glob("torch_cachepolicy-*.whl")
    return wheel, proc.stdout + proc.stderr


# What the wheel must ship besides its metadata and (when built) _C: the modules of the two packages setup.py's
# find_packages() names (torch_cachepolicy, torch_cachepolicy.recipes) and its package_data (py.typed). The C++
# sources (csrc/, its headers included) stay in the repository: the wheel holds the built _C only.
LIBRARY_FILES = frozenset(
    f"torch_cachepolicy/{name}"
    for name in (
        "__init__.py",
        "_arguments.py",
        "_class_api.py",
        "_compat.py",
        "_driver.py",
        "_fakes.py",
        "_frames.py",
        "_kernels.py",
        "_key.py",
        "_key_extension.py",
        "_keyset.py",
        "_names.py",
        "_native.py",
        "_reasons.py",
        "_routes.py",
        "_rules.py",
        "_state.py",
        "_symbols.py",
        "_synth.py",
        "_verify.py",
        "adopt.py",
        "export.py",
        "mode.py",
        "policy.py",
        "py.typed",
        "recipes/__init__.py",
        "recipes/executorch.py",
        "report.py",
        "store.py",
        "version.py",
    )
)


def imported_modules(path: pathlib.Path) -> set[str]:
    """Top-level names of every module ``path`` imports, at any depth of its code."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name.partition(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.partition(".")[0])
    return names


class TestWheel(TestCase):
    """The wheel ``pip wheel .`` builds."""

    tmp: ClassVar[tempfile.TemporaryDirectory[str]]
    names: ClassVar[set[str]]
    metadata: ClassVar[email.message.Message]

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls.tmp = tempfile.TemporaryDirectory()
        wheel, _ = build_wheel(pathlib.Path(cls.tmp.name), with_cpp=WITH_CPP)
        with zipfile.ZipFile(wheel) as zf:
            cls.names = set(zf.namelist())
            (meta,) = (n for n in cls.names if n.endswith(".dist-info/METADATA"))
            cls.metadata = email.parser.Parser().parsestr(zf.read(meta).decode())

    @classmethod
    def tearDownClass(cls) -> None:
        cls.tmp.cleanup()
        super().tearDownClass()

    def assertShips(self, name: str) -> None:
        self.assertIn(name, self.names, f"the wheel lacks {name}")

    def test_holds_the_library_only(self) -> None:
        """Outside its metadata the wheel holds exactly the package's modules, py.typed and (when built) _C."""
        shipped = {n for n in self.names if ".dist-info/" not in n}
        extension = {n for n in shipped if n.startswith("torch_cachepolicy/_C") and n.endswith(".so")}
        self.assertEqual(sorted(shipped - extension), sorted(LIBRARY_FILES))
        self.assertEqual(len(extension), 1 if WITH_CPP else 0, sorted(extension))

    def test_no_sources_of_the_extension(self) -> None:
        """csrc/ (its .cpp files and headers such as operator_entry_access.h) is not in the wheel."""
        self.assertEqual(sorted(n for n in self.names if n.startswith("csrc/") or n.endswith((".cpp", ".h"))), [])

    def test_no_benchmarks_or_tests(self) -> None:
        """benchmarks/ (with the global-patch baseline) and test/ stay in the repository."""
        self.assertEqual(sorted(n for n in self.names if n.startswith(("benchmarks/", "test/"))), [])
        self.assertEqual(sorted(n for n in self.names if "global_patch" in n or "/bench" in n), [])

    def test_ships_typing_marker_and_recipe(self) -> None:
        """py.typed and the ExecuTorch recipe are in the wheel."""
        self.assertShips("torch_cachepolicy/py.typed")
        self.assertShips("torch_cachepolicy/recipes/executorch.py")
        self.assertShips("torch_cachepolicy/version.py")

    def test_metadata(self) -> None:
        """Version from version.py; torch (the oldest supported, no upper cap) and typing-extensions the runtime
        requirements."""
        self.assertEqual(self.metadata["Name"], "torch_cachepolicy")
        self.assertEqual(self.metadata["Version"], torch_cachepolicy.__version__)
        requires = sorted(self.metadata.get_all("Requires-Dist") or [])
        self.assertExpectedInline(
            "\n".join(requires),
            """\
expecttest; extra == "test"
matplotlib==3.11.2; extra == "bench"
mypy==2.4.1; extra == "lint"
numpy; extra == "test"
pytest; extra == "test"
ruff==0.17.6; extra == "lint"
torch>=2.13
typing-extensions>=4.4""",
        )

    @unittest.skipIf(tomllib is None, "tomllib is new in Python 3.11")
    def test_build_requires_the_runtime_torch_range(self) -> None:
        """pyproject.toml's [build-system] builds against the torch range the wheel requires (version.py's)."""
        build = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]
        self.assertEqual(build["build-backend"], "setuptools.build_meta")
        (torch_req,) = (r for r in build["requires"] if r.startswith("torch"))
        (runtime,) = (r for r in self.metadata.get_all("Requires-Dist") or [] if r.startswith("torch"))
        self.assertEqual(set(torch_req.removeprefix("torch").split(",")), set(runtime.removeprefix("torch").split(",")))


class TestWithoutCompiler(TestCase):
    """``pip wheel .`` where the C++ compiler does not run, ``USE_CPP`` unset."""

    def test_installs_the_python_package(self) -> None:
        """The build warns, naming USE_CPP=0, and goes on without _C; the package it installs imports and reports the
        Python backend."""
        with tempfile.TemporaryDirectory() as tmp:
            out = pathlib.Path(tmp)
            missing = str(out / "no-compiler")
            wheel, log = build_wheel(out, with_cpp=None, CC=missing, CXX=missing)
            self.assertIn("torch_cachepolicy: the C++ helper torch_cachepolicy._C could not be built", log)
            self.assertIn("set USE_CPP=0 to skip the build", log)
            with zipfile.ZipFile(wheel) as zf:
                self.assertEqual([n for n in zf.namelist() if n.startswith("torch_cachepolicy/_C")], [])
            target = out / "site"
            install = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--target", str(target)]
            subprocess.run([*install, str(wheel)], capture_output=True, check=True)
            code = (
                "import json, torch_cachepolicy\n"
                "from torch_cachepolicy import _native\n"
                "print(json.dumps([torch_cachepolicy.__file__, _native.backend(), _native.fallback_reason()]))\n"
            )
            # -S: no site-packages .pth files, so that no editable install of the checkout can answer for the package
            # (or its _C); site-packages itself after the target, for torch.
            env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(target), sysconfig.get_paths()["purelib"]))}
            env.pop(_native.FORCE_ENV, None)
            proc = subprocess.run([sys.executable, "-S", "-c", code], cwd=out, env=env, capture_output=True, text=True)
            self.assertEqual(proc.returncode, 0, proc.stderr)
            where, backend, reason = json.loads(proc.stdout.splitlines()[-1])
        self.assertTrue(where.startswith(str(target)), where)  # the installed wheel, not the checkout
        self.assertEqual(backend, "python")
        self.assertIn("torch_cachepolicy._C is not built", reason)

    def test_use_cpp_1_requires_the_helper(self) -> None:
        """With USE_CPP=1 (make and CI set it) the failed build stops the install instead."""
        with tempfile.TemporaryDirectory() as tmp:
            missing = str(pathlib.Path(tmp) / "no-compiler")
            with self.assertRaisesRegex(AssertionError, "pip wheel .* failed") as ctx:
                build_wheel(pathlib.Path(tmp), with_cpp=True, CC=missing, CXX=missing)
        self.assertNotIn("could not be built", str(ctx.exception))


class TestSdist(TestCase):
    """The sdist ``setup.py sdist`` builds.

    ``make test-torch`` builds ``_C`` from the unpacked sdist's ``csrc/`` on each other torch release and checks that
    the package imported there uses it: a compile here would cost the main tier about 40 s.
    """

    tmp: ClassVar[tempfile.TemporaryDirectory[str]]
    names: ClassVar[set[str]]
    unpacked: ClassVar[pathlib.Path]

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls.tmp = tempfile.TemporaryDirectory()
        out = pathlib.Path(cls.tmp.name)
        src = out / "src"
        shutil.copytree(ROOT, src, ignore=NOT_COPIED)
        cmd = [sys.executable, "setup.py", "-q", "sdist", "-d", str(out / "dist")]
        proc = subprocess.run(cmd, cwd=src, capture_output=True, text=True)
        if proc.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} failed:\n{proc.stdout}\n{proc.stderr}")
        (sdist,) = (out / "dist").glob("torch_cachepolicy-*.tar.gz")
        with tarfile.open(sdist) as tf:
            cls.names = {n.split("/", 1)[1] for n in tf.getnames() if "/" in n}
            tf.extractall(out / "unpacked", filter="data")
        (cls.unpacked,) = (out / "unpacked").iterdir()

    @classmethod
    def tearDownClass(cls) -> None:
        cls.tmp.cleanup()
        super().tearDownClass()

    def test_ships_every_native_source(self) -> None:
        """Every file of csrc/ (the headers included) and what the build reads are in the sdist."""
        native = {f"csrc/{p.name}" for p in (ROOT / "csrc").iterdir() if p.is_file()}
        self.assertGreater(len({n for n in native if n.endswith(".h")}), 0)
        missing = sorted((native | {"setup.py", "pyproject.toml", "torch_cachepolicy/version.py"}) - self.names)
        self.assertEqual(missing, [])


class TestLayout(TestCase):
    """The repository's package directory against what the wheel must ship."""

    def test_package_directory_holds_the_library(self) -> None:
        """torch_cachepolicy/ holds exactly LIBRARY_FILES (plus the in-place _C and caches), so none goes unshipped."""
        found = {
            f"torch_cachepolicy/{p.relative_to(PACKAGE).as_posix()}"
            for p in PACKAGE.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and not (p.parent == PACKAGE and p.name.startswith("_C."))
        }
        self.assertEqual(sorted(found), sorted(LIBRARY_FILES))


class TestImports(TestCase):
    """What importing the library brings along (one fresh interpreter for the class)."""

    after_library: ClassVar[set[str]]
    after_recipe: ClassVar[set[str]]

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        code = (
            "import json, sys\n"
            "import torch_cachepolicy\n"
            "first = sorted(sys.modules)\n"
            "import torch_cachepolicy.recipes.executorch\n"
            "print(json.dumps([first, sorted(sys.modules)]))\n"
        )
        out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
        first, second = json.loads(out.stdout)
        cls.after_library, cls.after_recipe = set(first), set(second)

    def test_library_imports_no_benchmark_or_client(self) -> None:
        """import torch_cachepolicy loads neither benchmarks, nor the recipes, nor ExecuTorch."""
        self.assertIn("torch_cachepolicy", self.after_library)
        unwanted = ("benchmarks", "executorch", "torch_cachepolicy.recipes")
        self.assertEqual({m for m in self.after_library if m.startswith(unwanted)}, set())

    def test_recipe_imports_executorch_lazily(self) -> None:
        """Importing the ExecuTorch recipe does not import ExecuTorch."""
        self.assertIn("torch_cachepolicy.recipes.executorch", self.after_recipe)
        self.assertEqual({m for m in self.after_recipe if m.partition(".")[0] == "executorch"}, set())

    def test_no_library_module_imports_benchmarks(self) -> None:
        """No module of the library imports benchmarks/, lazily or not (the wheel does not ship it)."""
        offenders = [
            str(p.relative_to(ROOT)) for p in sorted(PACKAGE.rglob("*.py")) if "benchmarks" in imported_modules(p)
        ]
        self.assertEqual(offenders, [])

    @unittest.skipIf(
        not list(pathlib.Path(torch_cachepolicy.__file__).parent.glob("_C*"))
        or os.environ.get(_native.FORCE_ENV, "") not in ("", "0"),
        "installed without the C++ helper (USE_CPP=0) or run without it on purpose",
    )
    def test_install_built_the_helper(self) -> None:
        """The C++ helper pip install built loads against this torch, and the package uses it."""
        self.assertEqual((_native.backend(), _native.fallback_reason()), ("cpp", ""))

    def test_version_is_reexported(self) -> None:
        """torch_cachepolicy.__version__ is version.py's."""
        from torch_cachepolicy import version

        self.assertIs(torch_cachepolicy.__version__, version.__version__)


if __name__ == "__main__":
    run_tests()
