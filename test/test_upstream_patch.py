# Owner(s): ["module: fakeTensor"]
"""The patch series in docs/upstream/ applies to the installed torch and works.

Every patch is applied to copies of the installed files in a temporary tree
laid out like site-packages: alone, and as the series, in order. A subprocess
(test/upstream_patch_probe.py) then imports torch with those copies loaded in
place of the installed modules and runs each patch's tests, which it reads
from the patch's test patch to torch's test/test_fake_tensor.py
(docs/upstream/tests/). The installed torch is never written to.

The series is a stack: 0002 is made on 0001, 0003 on both. It is kept for
each release in ``SERIES_DIRS`` (docs/upstream/ for 2.13.0,
docs/upstream/torch-<release>/ for the others), the same change with that
release's line numbers, so that on the installed release it applies without
offsets or fuzz; where a release's fake_tensor.py forces a line of the
series to differ, the line is listed in ``RELEASE_ADAPTATIONS``. On a
release without a series every test here but the last is skipped.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import json
import os
import pathlib
import py_compile
import re
import shutil
import subprocess
import sys
import tempfile
import unittest
from typing import Any

import torch
from torch.testing._internal.common_utils import TestCase, run_tests

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import upstream_test_sources  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
UPSTREAM = ROOT / "docs" / "upstream"
PROBE = pathlib.Path(__file__).resolve().parent / "upstream_patch_probe.py"
SITE = pathlib.Path(torch.__file__).resolve().parent.parent
TORCH_VERSION = str(torch.__version__).split("+")[0]
# The series made for each release, with that release's line numbers. The
# first is the base the others are compared with (RELEASE_ADAPTATIONS).
SERIES_DIRS = {
    "2.13.0": UPSTREAM,
    "2.14.1": UPSTREAM / "torch-2.14.1",
    "2.15.0": UPSTREAM / "torch-2.15.0",
}
SERIES_DIR = SERIES_DIRS.get(TORCH_VERSION)

TESTS = UPSTREAM / "tests"
# The series, in order: patch file -> (files it touches, its TestCase in the
# probe, the patches it is stacked on). 0001 and 0002 apply alone; 0003 is
# made on both (its cache_clear hunk extends 0002's, and its policy entries
# rely on 0001's checks of the entry builder).
SERIES: dict[str, tuple[tuple[str, ...], str, tuple[str, ...]]] = {
    "0001-fake-tensor-cache-stock-hardening.patch": (("torch/_subclasses/fake_tensor.py",), "StockHardening", ()),
    "0002-fake-tensor-cache-clear-on-subclass.patch": (
        ("torch/_subclasses/fake_tensor.py",),
        "CacheClearOnSubclass",
        (),
    ),
    "0003-fake-tensor-cache-policy.patch": (
        ("torch/_subclasses/fake_tensor.py", "torch/_subclasses/_fake_tensor_cache_policy.py"),
        "CachePolicy",
        ("0001-fake-tensor-cache-stock-hardening.patch", "0002-fake-tensor-cache-clear-on-subclass.patch"),
    ),
}
NUMBERS = [patch[:4] for patch in SERIES]
# Release adaptations: (patch, release) -> the runs of lines of that release's
# series that differ from the base (2.13.0) series, in the patch's order, each
# as (the base's lines, the release's lines). Lines are those of the hunks:
# context, added and removed, prefix included; hunk line numbers and the
# release in the header are not compared. Each difference is forced by the
# release's fake_tensor.py, and docs/upstream/README.md says why; any other
# difference, or an entry that no longer matches, fails
# test_release_series_are_one_change.
RELEASE_ADAPTATIONS: dict[tuple[str, str], list[tuple[tuple[str, ...], tuple[str, ...]]]] = {
    # 2.15 tests `func.is_view or func is aten._unsafe_view.default` in
    # _get_output_info_for_cache_entry, an `if` over three lines: the context
    # above 0001's first hunk is its closing line. The change is the same.
    ("0001-fake-tensor-cache-stock-hardening.patch", "2.15.0"): [
        (
            ("         if isinstance(func, torch._ops.OpOverload) and func.is_view:",),
            ("         ):",),
        ),
    ],
    # 2.15's _output_from_cache_entry is (state, entry, key, args): no func,
    # a view output is one whose entry has a view_idx (which the entry
    # builder sets for the same ops as before, _unsafe_view aside, an aten op
    # that never reaches a policy entry). 0003's one call of it, in the module
    # it creates, drops func.
    ("0003-fake-tensor-cache-policy.patch", "2.15.0"): [
        (
            ("+    synth = mode._output_from_cache_entry(state, entry, key, func, args)",),
            ("+    synth = mode._output_from_cache_entry(state, entry, key, args)",),
        ),
    ],
}
# What the series may add to torch, in lines (upstream review of v5.5: 694).
MAX_ADDED_LINES = 400
# Tests that pass on unpatched torch by design: they guard stock behaviour a
# patch must keep (0001's storage check leaves data-dependent outputs cached).
PASS_UNPATCHED = {"StockHardening.test_cache_storage_check_keeps_data_dependent_sizes"}
# Files the series changes, and files it creates (absent from the installed torch).
TOUCHED = ("torch/_subclasses/fake_tensor.py",)
CREATED = ("torch/_subclasses/_fake_tensor_cache_policy.py",)
MODULES = {rel: rel[: -len(".py")].replace("/", ".") for rel in TOUCHED + CREATED}


def sha256(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


INSTALLED = {rel: sha256(SITE / rel) for rel in TOUCHED}


def copy_installed(dest: pathlib.Path) -> None:
    """Copies the installed files the series changes (those it creates are not installed)."""
    for rel in TOUCHED:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(SITE / rel, dest / rel)


def apply_patch(
    tree: pathlib.Path, patch: str, *, dry_run: bool = False, git: bool = False
) -> subprocess.CompletedProcess[str]:
    """Applies ``<SERIES_DIR>/<patch>`` to ``tree`` with patch(1) (or git apply).

    Every context line must match (``--fuzz=0``; git apply never fuzzes).
    """
    if SERIES_DIR is None:
        raise unittest.SkipTest(f"no series is kept for torch {TORCH_VERSION}")
    path = str(SERIES_DIR / patch)
    if shutil.which("patch") and not git:
        cmd = ["patch", "-p1", "--forward", "--batch", "--fuzz=0", "-i", path]
        if dry_run:
            cmd.insert(1, "--dry-run")
    elif shutil.which("git"):
        cmd = ["git", "apply", "--check" if dry_run else "--verbose", path]
    else:
        raise unittest.SkipTest("neither patch nor git is installed")
    # Keep git from finding a repository above the temporary tree (it would
    # then apply relative to that repository's root).
    env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(tree.parent)}
    return subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=120)


def patched_tree(parent: pathlib.Path, patches: list[str]) -> pathlib.Path:
    """Copies the installed files under ``parent`` and applies ``patches`` in order."""
    tree = parent / "site-packages"
    copy_installed(tree)
    for patch in patches:
        proc = apply_patch(tree, patch)
        if proc.returncode != 0:
            raise AssertionError(f"{patch} does not apply:\n{proc.stdout}\n{proc.stderr}")
    return tree


def run_probe(args: list[str], tree: pathlib.Path | None, marker: str) -> Any:
    """Runs ``upstream_patch_probe.py *args`` in a fresh interpreter (patched modules when ``tree`` is set)."""
    env = {**os.environ, "TCP_PATCHED_TREE": "" if tree is None else str(tree)}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    proc = subprocess.run(
        [sys.executable, str(PROBE), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
    )
    for line in proc.stdout.splitlines():
        if line.startswith(marker + " "):
            return json.loads(line[len(marker) + 1 :])
    raise AssertionError(f"subprocess exited {proc.returncode} without {marker}:\n{proc.stdout}\n{proc.stderr}")


def added_sources(patch: str) -> upstream_test_sources.TestSources:
    return upstream_test_sources.read_test_patch(TESTS / patch)


def probe_test_names(patch: str) -> list[str]:
    """The test ids the probe runs for ``patch``: the tests its test patch adds, parametrized ones expanded."""
    return upstream_test_sources.test_ids(added_sources(patch), SERIES[patch][1])


def hunks(patch: str) -> dict[str, tuple[int, int]]:
    """Added and removed line counts per file of ``patch``."""
    counts: dict[str, list[int]] = {}
    current: list[int] | None = None
    in_hunk = False
    for line in ((SERIES_DIR or UPSTREAM) / patch).read_text().splitlines():
        if line.startswith("+++ b/"):
            current = counts.setdefault(line[len("+++ b/") :], [0, 0])
            in_hunk = False
        elif line.startswith(("--- a/", "--- /dev/null")):
            in_hunk = False
        elif line.startswith("@@ "):
            in_hunk = True
        elif in_hunk and current is not None and line[:1] in "+-":
            current[line[0] == "-"] += 1
    return {rel: (a, r) for rel, (a, r) in counts.items()}


def hunk_lines(text: str) -> list[str]:
    """The lines of a patch's hunks: the hunk headers without their line numbers, context, added and removed lines."""
    body = text.split("\n--- a/", 1)[1].splitlines()[1:]
    return [
        re.sub(r"^@@ -\d+(?:,\d+)? \+\d+(?:,\d+)? @@", "@@", line)
        for line in body
        if line[:1] and line[0] in " +-@" and not line.startswith(("--- a/", "+++ b/"))
    ]


class _Supported(TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        if SERIES_DIR is None:
            raise unittest.SkipTest(
                f"no series is kept for torch {TORCH_VERSION} (docs/upstream/ keeps one for {', '.join(SERIES_DIRS)})"
            )


class TestSeriesApplies(_Supported):
    """The series applies as a stack, without offsets or fuzz, to copies of the installed files."""

    def test_series_is_the_documented_one(self) -> None:
        """Each series directory holds exactly the series' patches, each touching only its declared files, each with a test patch."""
        for directory in SERIES_DIRS.values():
            self.assertEqual(sorted(p.name for p in directory.glob("*.patch")), list(SERIES), msg=str(directory))
        self.assertEqual(sorted(p.name for p in TESTS.glob("*.patch")), list(SERIES))
        for patch, (files, _, _) in SERIES.items():
            for directory in SERIES_DIRS.values():
                text = (directory / patch).read_text()
                olds = [f"a/{f}" if f in TOUCHED else "/dev/null" for f in files]
                self.assertEqual(re.findall(r"^--- (\S+)$", text, re.M), olds, msg=patch)
                self.assertEqual(re.findall(r"^\+\+\+ b/(\S+)$", text, re.M), list(files), msg=patch)
                self.assertLessEqual(set(files), set(TOUCHED + CREATED), msg=patch)
            tests = (TESTS / patch).read_text()
            added = re.findall(r"^\+\+\+ b/(\S+)$", tests, re.M)
            self.assertEqual(added[0], upstream_test_sources.FAKE_TENSOR_TESTS, msg=patch)
            self.assertEqual(set(added[1:]), set(added_sources(patch).files), msg=patch)
            for new in added[1:]:
                self.assertRegex(new, r"^test/(export|dynamo)/test_\w+\.py$", msg=patch)

    def test_release_series_are_one_change(self) -> None:
        """The series of every release has the same hunks, line for line but the listed release adaptations, and says the same but its release."""

        def header(text: str) -> str:
            return re.sub(r"\d+\.\d+\.\d+", "X", text.split("\n--- a/", 1)[0])

        (base_release, base), *others = SERIES_DIRS.items()
        for patch in SERIES:
            for release, directory in others:
                with self.subTest(patch=patch, release=release):
                    a, b = (base / patch).read_text(), (directory / patch).read_text()
                    self.assertEqual(header(a), header(b))
                    self.assertIn(f"\nAgainst torch {base_release}", a.split("\n--- a/", 1)[0])
                    self.assertIn(f"\nAgainst torch {release}", b.split("\n--- a/", 1)[0])
                    la, lb = hunk_lines(a), hunk_lines(b)
                    self.assertEqual(
                        [line for line in la if line.startswith("@@")], [line for line in lb if line.startswith("@@")]
                    )
                    differences = [
                        (tuple(la[i1:i2]), tuple(lb[j1:j2]))
                        for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, la, lb, autojunk=False).get_opcodes()
                        if tag != "equal"
                    ]
                    self.assertEqual(differences, RELEASE_ADAPTATIONS.get((patch, release), []))
        for patch, release in RELEASE_ADAPTATIONS:
            self.assertIn(patch, SERIES)
            self.assertIn(release, list(SERIES_DIRS)[1:])

    def test_test_patches_add_tests(self) -> None:
        """Each test patch only adds lines, FakeTensorDispatchCache tests among them, named in its patch's header."""
        for patch in SERIES:
            text = (TESTS / patch).read_text()
            body = text.split("\n--- a/", 1)[1]
            self.assertNotRegex(body, r"(?m)^-(?!--)", msg=patch)
            names = probe_test_names(patch)
            self.assertGreater(len([n for n in names if n.startswith(SERIES[patch][1] + ".")]), 0, msg=patch)
            header = (UPSTREAM / patch).read_text().split("\n--- a/", 1)[0]
            self.assertIn("FakeTensorDispatchCache", header, msg=patch)
            self.assertIn(f"tests/{patch}", header, msg=patch)

    def test_each_patch_has_a_header(self) -> None:
        """Every patch starts with a header saying what it does, why, where its tests are, and what it applies to."""
        for patch in SERIES:
            header = (UPSTREAM / patch).read_text().split("\n--- a/", 1)[0]
            for part in ("What:", "Why:", "Tests:", "Against torch "):
                self.assertIn(part, header, msg=patch)

    def test_each_patch_applies_on_its_stack(self) -> None:
        """A dry run of each patch on the patches it is stacked on succeeds without fuzz or offset."""
        for patch, (_, _, below) in SERIES.items():
            with self.subTest(patch=patch), tempfile.TemporaryDirectory() as d:
                tree = patched_tree(pathlib.Path(d), list(below))
                before = {rel: sha256(tree / rel) for rel in TOUCHED}
                proc = apply_patch(tree, patch, dry_run=True)
                output = proc.stdout + proc.stderr
                self.assertEqual(proc.returncode, 0, msg=output)
                self.assertNotRegex(output, r"(?i)fuzz|reject|already applied|offset")
                self.assertEqual({rel: sha256(tree / rel) for rel in TOUCHED}, before)

    def test_each_patch_git_apply_check(self) -> None:
        """git apply --check accepts each patch on its stack as well."""
        if not shutil.which("git"):
            self.skipTest("git is not installed")
        for patch, (_, _, below) in SERIES.items():
            with self.subTest(patch=patch), tempfile.TemporaryDirectory() as d:
                tree = patched_tree(pathlib.Path(d), list(below))
                proc = apply_patch(tree, patch, dry_run=True, git=True)
                self.assertEqual(proc.returncode, 0, msg=proc.stderr)

    def test_series_applies_in_order_and_compiles(self) -> None:
        """The patches apply one after the other without fuzz or offset; every touched file changes and byte-compiles."""
        with tempfile.TemporaryDirectory() as d:
            tree = pathlib.Path(d) / "site-packages"
            copy_installed(tree)
            for patch in SERIES:
                proc = apply_patch(tree, patch)
                self.assertEqual(proc.returncode, 0, msg=proc.stdout + proc.stderr)
                self.assertNotRegex(proc.stdout + proc.stderr, r"(?i)fuzz|reject|offset")
            for rel in TOUCHED:
                self.assertNotEqual(sha256(tree / rel), INSTALLED[rel], msg=rel)
            for rel in TOUCHED + CREATED:
                py_compile.compile(str(tree / rel), cfile=os.path.join(d, "out.pyc"), doraise=True)

    def test_series_adds_nothing_installed_torch_has(self) -> None:
        """No name the series defines exists in the installed torch (e.g. 2.14's is_fake_tensor), nor a module it creates, and no added line needs a fake-tensor predicate."""
        assert SERIES_DIR is not None
        for rel in CREATED:
            self.assertFalse((SITE / rel).exists(), msg=rel)
        for patch in SERIES:
            current = None
            for line in (SERIES_DIR / patch).read_text().splitlines():
                if line.startswith("+++ b/"):
                    rel = line[len("+++ b/") :]
                    current = importlib.import_module(MODULES[rel]) if rel in TOUCHED else None
                    continue
                m = re.match(r"^\+(?:def|class) (\w+)|^\+(\w+)(?:: [^=]+)? = ", line)
                if m and current is not None:
                    self.assertFalse(hasattr(current, m[1] or m[2]), msg=f"{patch}: {line}")
                if line.startswith("+"):
                    self.assertNotRegex(line, r"isinstance\([^)]*FakeTensor\b", msg=f"{patch}: {line}")

    def test_series_size(self) -> None:
        """The series adds at most MAX_ADDED_LINES lines to torch, all files counted (its tests are not in torch)."""
        added = sum(a for patch in SERIES for a, _ in hunks(patch).values())
        self.assertLessEqual(added, MAX_ADDED_LINES)

    def test_readme_lists_each_release(self) -> None:
        """docs/upstream/README.md's release table has a row per release with a series, naming its directory."""
        readme = (UPSTREAM / "README.md").read_text()
        for release, directory in SERIES_DIRS.items():
            where = "000N-*.patch" if directory == UPSTREAM else f"{directory.name}/000N-*.patch"
            self.assertRegex(readme, rf"(?m)^\| torch {re.escape(release)} \| `{re.escape(where)}`", msg=release)

    def test_readme_describes_each_patch(self) -> None:
        """docs/upstream/README.md has a section per patch with its per-file line counts."""
        readme = (UPSTREAM / "README.md").read_text()
        for patch in SERIES:
            self.assertIn(f"### `{patch}`", readme)
            section = readme.split(f"### `{patch}`", 1)[1].split("\n### ", 1)[0]
            for rel, (added, removed) in hunks(patch).items():
                self.assertRegex(section, rf"`{re.escape(rel)}`: \+{added} -{removed}\b", msg=patch)


class TestSeriesBehaviour(_Supported):
    """Each patch's tests pass with the series applied and with the patch alone (plus what its tests need); all fail unpatched."""

    tmp: tempfile.TemporaryDirectory[str]
    series: pathlib.Path
    _series_result: dict[str, str] | None = None

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls.tmp = tempfile.TemporaryDirectory(prefix="tcp-upstream-")
        cls.series = patched_tree(pathlib.Path(cls.tmp.name) / "series", list(SERIES))

    @classmethod
    def tearDownClass(cls) -> None:
        tmp = getattr(cls, "tmp", None)
        if tmp is not None:
            tmp.cleanup()
        super().tearDownClass()

    def assertAllPassed(self, result: dict[str, str], patch: str) -> None:
        expected = probe_test_names(patch)
        self.assertGreater(len(expected), 0)
        got = {k: v for k, v in result.items() if k in expected}
        self.assertEqual(sorted(got), sorted(expected))
        failed = {k: v for k, v in got.items() if v != "ok"}
        if failed:
            self.fail("\n".join(f"{k}:\n{v}" for k, v in failed.items()))

    def series_result(self) -> dict[str, str]:
        cls = type(self)
        if cls._series_result is None:
            cls._series_result = run_probe(["probe", *NUMBERS], cls.series, "PROBE-RESULT")
        return cls._series_result

    def test_patched_modules_are_the_ones_imported(self) -> None:
        """The subprocess loads the patched copies in place of the installed modules."""
        code = "; ".join(f"import {m} as f; print(f.__file__)" for m in MODULES.values())
        env = {**os.environ, "TCP_PATCHED_TREE": str(self.series)}
        proc = subprocess.run(
            [sys.executable, "-c", f"import runpy; runpy.run_path({str(PROBE)!r}, run_name='probe'); {code}"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        self.assertEqual(proc.returncode, 0, msg=proc.stderr)
        self.assertEqual(proc.stdout.split(), [str(self.series / rel) for rel in TOUCHED + CREATED])

    def test_each_patch_with_series(self) -> None:
        """Every patch's tests pass with the whole series applied."""
        for patch in SERIES:
            with self.subTest(patch=patch):
                self.assertAllPassed(self.series_result(), patch)

    def test_each_patch_alone(self) -> None:
        """Every patch's tests pass with only that patch and the patches it is stacked on applied."""
        for patch, (_, _, below) in SERIES.items():
            with self.subTest(patch=patch), tempfile.TemporaryDirectory() as d:
                tree = patched_tree(pathlib.Path(d), [*below, patch])
                self.assertAllPassed(run_probe(["probe", patch[:4]], tree, "PROBE-RESULT"), patch)

    def test_tests_fail_on_unpatched_torch(self) -> None:
        """Every test of every patch fails on the installed, unpatched torch, but the named guards of stock behaviour."""
        result = run_probe(["probe", *NUMBERS], None, "PROBE-RESULT")
        self.assertEqual(sorted(result), sorted(n for patch in SERIES for n in probe_test_names(patch)))
        self.assertEqual({k for k, v in result.items() if v == "ok"}, PASS_UNPATCHED)

    def test_no_policy_matches_stock_counters(self) -> None:
        """Without a policy, a fixed workload leaves the same stock counters and outputs as unpatched torch (each patch on its stack, series)."""
        stock = run_probe(["workload"], None, "WORKLOAD-RESULT")
        self.assertIn("non-builtin", stock[2])
        for patch, (_, _, below) in SERIES.items():
            with self.subTest(patch=patch), tempfile.TemporaryDirectory() as d:
                alone = patched_tree(pathlib.Path(d), [*below, patch])
                self.assertEqual(run_probe(["workload"], alone, "WORKLOAD-RESULT"), stock)
        self.assertEqual(run_probe(["workload"], self.series, "WORKLOAD-RESULT"), stock)


class TestTorchUntouched(TestCase):
    """Nothing above writes to the installed torch (this class runs last; tearDownModule checks again)."""

    def test_installed_torch_unchanged(self) -> None:
        """The installed torch files hash as they did when this module was imported."""
        self.assertEqual({rel: sha256(SITE / rel) for rel in TOUCHED}, INSTALLED)


def tearDownModule() -> None:
    changed = [rel for rel in TOUCHED if sha256(SITE / rel) != INSTALLED[rel]]
    if changed:
        raise AssertionError(f"the installed torch was modified: {changed}")


if __name__ == "__main__":
    run_tests()
