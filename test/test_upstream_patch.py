# Owner(s): ["module: fakeTensor"]
"""The patch series in docs/upstream/ apply to the installed torch and work.

docs/upstream/ holds the proposed series (the op-level design: 0001 and 0002
harden the stock cache, 0003 lets an operator be declared cacheable with
torch.library.register_fake_cacheable, 0004 declares quantized_decomposed)
and, in docs/upstream/alternative-policy/, the measured alternative (the
per-mode policy hook: the same 0001 and 0002, and its own 0003). Every patch
is applied to copies of the installed files in a temporary tree laid out like
site-packages: alone on its stack, and as the series, in order. A subprocess
(test/upstream_patch_probe.py) then imports torch with those copies loaded in
place of the installed modules and runs each patch's tests, which it reads
from the patch's test patch to torch's test/test_fake_tensor.py (the
series' tests/ directory). The installed torch is never written to.

Each series is a stack, kept for each release (``Series.dirs``: the series'
directory for 2.13.0, its torch-<release>/ for the others), the same change
with that release's line numbers, so that on the installed release it applies
without offsets or fuzz; where a release's files force a line of a series to
differ, the line is listed in the series' ``adaptations``. On a release
without a series every test here but the last is skipped. The proposed
series is checked in full; the alternative's static checks run too, and its
tests once, with its whole series applied.
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
from typing import Any, NamedTuple

import torch
from torch.testing._internal.common_utils import TestCase, run_tests

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import upstream_test_sources  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
UPSTREAM = ROOT / "docs" / "upstream"
PROBE = pathlib.Path(__file__).resolve().parent / "upstream_patch_probe.py"
SITE = pathlib.Path(torch.__file__).resolve().parent.parent
TORCH_VERSION = str(torch.__version__).split("+")[0]
RELEASES = ("2.13.0", "2.14.1", "2.15.0")
# What a series may add to torch, in lines, all files counted (upstream review of v5.5: its series added 694).
MAX_ADDED_LINES = 400
FT = "torch/_subclasses/fake_tensor.py"
STOCK_0001 = "0001-fake-tensor-cache-stock-hardening.patch"
STOCK_0002 = "0002-fake-tensor-cache-clear-on-subclass.patch"

Adaptations = dict[tuple[str, str], list[tuple[tuple[str, ...], tuple[str, ...]]]]

# 2.15 tests `func.is_view or func is aten._unsafe_view.default` in
# _get_output_info_for_cache_entry, an `if` over three lines: the context
# above 0001's first hunk is its closing line. The change is the same.
ADAPT_0001_215 = (
    ("         if isinstance(func, torch._ops.OpOverload) and func.is_view:",),
    ("         ):",),
)


class Series(NamedTuple):
    """A patch series as docs/upstream/ keeps it."""

    name: str
    base: pathlib.Path  # its directory: the 2.13.0 series; torch-<release>/ the others; tests/ its test patches
    # patch file -> (files it touches, its TestCase in the probe, the patches it is stacked on)
    patches: dict[str, tuple[tuple[str, ...], str, tuple[str, ...]]]
    # (patch, release) -> the runs of lines of that release's series that differ from the 2.13.0 series, in the
    # patch's order, each as (the base's lines, the release's lines). Lines are those of the hunks: context, added
    # and removed, prefix included; hunk line numbers, the function names git or diff print after them, and the
    # release in the header are not compared. Each difference is forced by the release's files, and
    # docs/upstream/README.md says why; any other difference, or an entry that no longer matches, fails
    # test_release_series_are_one_change.
    adaptations: Adaptations
    # Tests that pass on unpatched torch by design: they guard stock behaviour a patch must keep.
    pass_unpatched: frozenset[str]
    touched: tuple[str, ...]  # files of the installed torch it changes
    created: tuple[str, ...]  # files it creates (absent from the installed torch)

    @property
    def dirs(self) -> dict[str, pathlib.Path]:
        return {r: self.base if r == RELEASES[0] else self.base / f"torch-{r}" for r in RELEASES}

    @property
    def tests(self) -> pathlib.Path:
        return self.base / "tests"

    @property
    def release_dir(self) -> pathlib.Path | None:
        return self.dirs.get(TORCH_VERSION)

    @property
    def numbers(self) -> list[str]:
        return [patch[:4] for patch in self.patches]


GUARD_0001 = "StockHardening.test_cache_storage_check_keeps_data_dependent_sizes"
PROPOSED = Series(
    name="proposed",
    base=UPSTREAM,
    patches={
        STOCK_0001: ((FT,), "StockHardening", ()),
        STOCK_0002: ((FT,), "CacheClearOnSubclass", ()),
        # Made on 0001 and 0002 (a declared op relies on 0001's checks of the entry builder).
        "0003-fake-tensor-cacheable-ops.patch": (
            (
                "torch/_library/__init__.py",
                "torch/_library/custom_ops.py",
                "torch/_library/fake_cache.py",
                FT,
                "torch/library.py",
            ),
            "CacheableOps",
            (STOCK_0001, STOCK_0002),
        ),
        "0004-quantized-decomposed-cacheable.patch": (
            ("torch/ao/quantization/fx/_decomposed.py",),
            "QuantizedDecomposedCacheable",
            (STOCK_0001, STOCK_0002, "0003-fake-tensor-cacheable-ops.patch"),
        ),
    },
    adaptations={
        (STOCK_0001, "2.15.0"): [ADAPT_0001_215],
        # 2.14 imports CustomClassBase in fake_tensor.py just above torch._library.fake_class_registry, which the
        # import 0003 adds (torch._library.fake_cache, in isort's order) precedes: one context line of that hunk.
        ("0003-fake-tensor-cacheable-ops.patch", "2.14.1"): [
            ((" import torch._library.utils as library_utils",), ()),
            ((), (" from torch._custom_class_base import CustomClassBase",)),
        ],
        ("0003-fake-tensor-cacheable-ops.patch", "2.15.0"): [
            ((" import torch._library.utils as library_utils",), ()),
            ((), (" from torch._custom_class_base import CustomClassBase",)),
        ],
    },
    pass_unpatched=frozenset({GUARD_0001}),
    touched=(
        FT,
        "torch/_library/__init__.py",
        "torch/_library/custom_ops.py",
        "torch/library.py",
        "torch/ao/quantization/fx/_decomposed.py",
    ),
    created=("torch/_library/fake_cache.py",),
)
ALTERNATIVE = Series(
    name="alternative",
    base=UPSTREAM / "alternative-policy",
    patches={
        STOCK_0001: ((FT,), "StockHardening", ()),
        STOCK_0002: ((FT,), "CacheClearOnSubclass", ()),
        "0003-fake-tensor-cache-policy.patch": (
            (FT, "torch/_subclasses/_fake_tensor_cache_policy.py"),
            "CachePolicy",
            (STOCK_0001, STOCK_0002),
        ),
    },
    adaptations={
        (STOCK_0001, "2.15.0"): [ADAPT_0001_215],
        # 2.15's _output_from_cache_entry is (state, entry, key, args): no func. 0003's one call of it, in the
        # module it creates, drops func.
        ("0003-fake-tensor-cache-policy.patch", "2.15.0"): [
            (
                ("+    synth = mode._output_from_cache_entry(state, entry, key, func, args)",),
                ("+    synth = mode._output_from_cache_entry(state, entry, key, args)",),
            ),
        ],
    },
    pass_unpatched=frozenset({GUARD_0001}),
    touched=(FT,),
    created=("torch/_subclasses/_fake_tensor_cache_policy.py",),
)
ALL_TOUCHED = tuple(dict.fromkeys(PROPOSED.touched + ALTERNATIVE.touched))


def module_name(rel: str) -> str:
    return rel[: -len(".py")].removesuffix("/__init__").replace("/", ".")


def sha256(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


INSTALLED = {rel: sha256(SITE / rel) for rel in ALL_TOUCHED}


def copy_installed(series: Series, dest: pathlib.Path) -> None:
    """Copies the installed files the series changes (those it creates are not installed)."""
    for rel in series.touched:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(SITE / rel, dest / rel)


def apply_patch(
    series: Series, tree: pathlib.Path, patch: str, *, dry_run: bool = False, git: bool = False
) -> subprocess.CompletedProcess[str]:
    """Applies ``<series' directory for this release>/<patch>`` to ``tree`` with patch(1) (or git apply).

    Every context line must match (``--fuzz=0``; git apply never fuzzes).
    """
    directory = series.release_dir
    if directory is None:
        raise unittest.SkipTest(f"no series is kept for torch {TORCH_VERSION}")
    path = str(directory / patch)
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


def patched_tree(series: Series, parent: pathlib.Path, patches: list[str]) -> pathlib.Path:
    """Copies the installed files under ``parent`` and applies ``patches`` in order."""
    tree = parent / "site-packages"
    copy_installed(series, tree)
    for patch in patches:
        proc = apply_patch(series, tree, patch)
        if proc.returncode != 0:
            raise AssertionError(f"{patch} does not apply:\n{proc.stdout}\n{proc.stderr}")
    return tree


def run_probe(series: Series, args: list[str], tree: pathlib.Path | None, marker: str) -> Any:
    """Runs ``upstream_patch_probe.py *args`` in a fresh interpreter (patched modules when ``tree`` is set)."""
    env = {**os.environ, "TCP_PATCHED_TREE": "" if tree is None else str(tree), "TCP_SERIES": series.name}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    proc = subprocess.run(
        [sys.executable, str(PROBE), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
    )
    for line in proc.stdout.splitlines():
        if line.startswith(marker + " "):
            return json.loads(line[len(marker) + 1 :])
    raise AssertionError(f"subprocess exited {proc.returncode} without {marker}:\n{proc.stdout}\n{proc.stderr}")


def added_sources(series: Series, patch: str) -> upstream_test_sources.TestSources:
    return upstream_test_sources.read_test_patch(series.tests / patch)


def probe_test_names(series: Series, patch: str) -> list[str]:
    """The test ids the probe runs for ``patch``: the tests its test patch adds, parametrized ones expanded."""
    return upstream_test_sources.test_ids(added_sources(series, patch), series.patches[patch][1])


def hunks(path: pathlib.Path) -> dict[str, tuple[int, int]]:
    """Added and removed line counts per file of the patch at ``path``."""
    counts: dict[str, list[int]] = {}
    current: list[int] | None = None
    in_hunk = False
    for line in path.read_text().splitlines():
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
    """The lines of a patch's hunks: "@@" for each hunk header, then its context, added and removed lines."""
    body = text.split("\n--- ", 1)[1].splitlines()[1:]
    return [
        "@@" if line.startswith("@@ ") else line
        for line in body
        if line[:1] and line[0] in " +-@" and not line.startswith(("--- a/", "--- /dev/null", "+++ b/"))
    ]


def header(text: str) -> str:
    return text.split("\n--- ", 1)[0]


class _Supported(TestCase):
    S: Series = PROPOSED

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        if cls.S.release_dir is None:
            raise unittest.SkipTest(
                f"no series is kept for torch {TORCH_VERSION} (docs/upstream/ keeps one for {', '.join(RELEASES)})"
            )


class TestSeriesApplies(_Supported):
    """The series applies as a stack, without offsets or fuzz, to copies of the installed files."""

    def test_series_is_the_documented_one(self) -> None:
        """Each release directory holds exactly the series' patches, each touching only its declared files, each with a test patch."""
        S = self.S
        for directory in S.dirs.values():
            self.assertEqual(sorted(p.name for p in directory.glob("*.patch")), list(S.patches), msg=str(directory))
        self.assertEqual(sorted(p.name for p in S.tests.glob("*.patch")), list(S.patches))
        for patch, (files, _, _) in S.patches.items():
            for directory in S.dirs.values():
                text = (directory / patch).read_text()
                olds = [f"a/{f}" if f in S.touched else "/dev/null" for f in files]
                self.assertEqual(re.findall(r"^--- (\S+)$", text, re.M), olds, msg=patch)
                self.assertEqual(re.findall(r"^\+\+\+ b/(\S+)$", text, re.M), list(files), msg=patch)
                self.assertLessEqual(set(files), set(S.touched + S.created), msg=patch)
            tests = (S.tests / patch).read_text()
            added = re.findall(r"^\+\+\+ b/(\S+)$", tests, re.M)
            self.assertEqual(added[0], upstream_test_sources.FAKE_TENSOR_TESTS, msg=patch)
            self.assertEqual(set(added[1:]), set(added_sources(S, patch).files), msg=patch)
            for new in added[1:]:
                self.assertRegex(new, r"^test/(export|dynamo)/test_\w+\.py$", msg=patch)

    def test_release_series_are_one_change(self) -> None:
        """The series of every release has the same hunks, line for line but the listed release adaptations, and says the same but its release."""
        S = self.S
        (base_release, base), *others = S.dirs.items()
        for patch in S.patches:
            for release, directory in others:
                with self.subTest(patch=patch, release=release):
                    a, b = (base / patch).read_text(), (directory / patch).read_text()
                    self.assertEqual(re.sub(r"\d+\.\d+\.\d+", "X", header(a)), re.sub(r"\d+\.\d+\.\d+", "X", header(b)))
                    self.assertIn(f"\nAgainst torch {base_release}", header(a))
                    self.assertIn(f"\nAgainst torch {release}", header(b))
                    la, lb = hunk_lines(a), hunk_lines(b)
                    self.assertEqual(la.count("@@"), lb.count("@@"))
                    differences = [
                        (tuple(la[i1:i2]), tuple(lb[j1:j2]))
                        for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, la, lb, autojunk=False).get_opcodes()
                        if tag != "equal"
                    ]
                    self.assertEqual(differences, S.adaptations.get((patch, release), []))
        for patch, release in S.adaptations:
            self.assertIn(patch, S.patches)
            self.assertIn(release, RELEASES[1:])

    def test_test_patches_add_tests(self) -> None:
        """Each test patch only adds lines, FakeTensorDispatchCache tests among them, named in its patch's header."""
        S = self.S
        for patch in S.patches:
            text = (S.tests / patch).read_text()
            body = text.split("\n--- a/", 1)[1]
            self.assertNotRegex(body, r"(?m)^-(?!--)", msg=patch)
            names = probe_test_names(S, patch)
            self.assertGreater(len([n for n in names if n.startswith(S.patches[patch][1] + ".")]), 0, msg=patch)
            text = header((S.base / patch).read_text())
            self.assertIn("FakeTensorDispatchCache", text, msg=patch)
            self.assertIn(f"tests/{patch}", text, msg=patch)

    def test_each_patch_has_a_header(self) -> None:
        """Every patch starts with a header saying what it does, why, where its tests are, and what it applies to."""
        for patch in self.S.patches:
            text = header((self.S.base / patch).read_text())
            for part in ("What:", "Why:", "Tests:", "Against torch "):
                self.assertIn(part, text, msg=patch)

    def test_each_patch_applies_on_its_stack(self) -> None:
        """A dry run of each patch on the patches it is stacked on succeeds without fuzz or offset; so does git apply --check."""
        S = self.S
        for patch, (_, _, below) in S.patches.items():
            with self.subTest(patch=patch), tempfile.TemporaryDirectory() as d:
                tree = patched_tree(S, pathlib.Path(d), list(below))
                before = {rel: sha256(tree / rel) for rel in S.touched}
                proc = apply_patch(S, tree, patch, dry_run=True)
                output = proc.stdout + proc.stderr
                self.assertEqual(proc.returncode, 0, msg=output)
                self.assertNotRegex(output, r"(?i)fuzz|reject|already applied|offset")
                self.assertEqual({rel: sha256(tree / rel) for rel in S.touched}, before)
                if shutil.which("git"):
                    proc = apply_patch(S, tree, patch, dry_run=True, git=True)
                    self.assertEqual(proc.returncode, 0, msg=proc.stderr)

    def test_series_applies_in_order_and_compiles(self) -> None:
        """The patches apply one after the other without fuzz or offset; every touched file changes and byte-compiles."""
        S = self.S
        with tempfile.TemporaryDirectory() as d:
            tree = pathlib.Path(d) / "site-packages"
            copy_installed(S, tree)
            for patch in S.patches:
                proc = apply_patch(S, tree, patch)
                self.assertEqual(proc.returncode, 0, msg=proc.stdout + proc.stderr)
                self.assertNotRegex(proc.stdout + proc.stderr, r"(?i)fuzz|reject|offset")
            for rel in S.touched:
                self.assertNotEqual(sha256(tree / rel), INSTALLED[rel], msg=rel)
            for rel in S.touched + S.created:
                py_compile.compile(str(tree / rel), cfile=os.path.join(d, "out.pyc"), doraise=True)

    def test_series_adds_nothing_installed_torch_has(self) -> None:
        """No name the series defines at module level exists in the installed module (e.g. 2.14's is_fake_tensor), nor a module it creates, and no added line needs a fake-tensor predicate."""
        S = self.S
        directory = S.release_dir
        assert directory is not None
        for rel in S.created:
            self.assertFalse((SITE / rel).exists(), msg=rel)
        for patch in S.patches:
            current = None
            for line in (directory / patch).read_text().splitlines():
                if line.startswith("+++ b/"):
                    rel = line[len("+++ b/") :]
                    current = importlib.import_module(module_name(rel)) if rel in S.touched else None
                    continue
                m = re.match(r"^\+(?:def|class) (\w+)|^\+(\w+)(?:: [^=]+)? = ", line)
                if m and current is not None:
                    self.assertFalse(hasattr(current, m[1] or m[2]), msg=f"{patch}: {line}")
                if line.startswith("+"):
                    self.assertNotRegex(line, r"isinstance\([^)]*FakeTensor\b", msg=f"{patch}: {line}")

    def test_series_size(self) -> None:
        """The series adds at most MAX_ADDED_LINES lines to torch on every release, all files counted (its tests are not in torch)."""
        for release, directory in self.S.dirs.items():
            added = sum(a for patch in self.S.patches for a, _ in hunks(directory / patch).values())
            self.assertLessEqual(added, MAX_ADDED_LINES, msg=release)


class TestSeriesDocumented(TestCase):
    """docs/upstream/README.md describes the proposed series; the alternative shares its 0001 and 0002."""

    def test_readme_lists_each_release(self) -> None:
        """docs/upstream/README.md's release table has a row per release, naming the proposed series' directory."""
        readme = (UPSTREAM / "README.md").read_text()
        for release, directory in PROPOSED.dirs.items():
            where = "000N-*.patch" if directory == UPSTREAM else f"{directory.name}/000N-*.patch"
            self.assertRegex(readme, rf"(?m)^\| torch {re.escape(release)} \| `{re.escape(where)}`", msg=release)

    def test_readme_describes_each_patch(self) -> None:
        """docs/upstream/README.md has a section per patch of the proposed series with its per-file line counts."""
        readme = (UPSTREAM / "README.md").read_text()
        for patch in PROPOSED.patches:
            self.assertIn(f"### `{patch}`", readme)
            section = readme.split(f"### `{patch}`", 1)[1].split("\n### ", 1)[0]
            for rel, (added, removed) in hunks(UPSTREAM / patch).items():
                self.assertRegex(section, rf"`{re.escape(rel)}`: \+{added} -{removed}\b", msg=patch)

    def test_alternative_shares_0001_and_0002(self) -> None:
        """The alternative's 0001 and 0002, their tests and their release copies are the proposed series' files, byte for byte."""
        for patch in (STOCK_0001, STOCK_0002):
            for release in RELEASES:
                self.assertEqual(
                    (ALTERNATIVE.dirs[release] / patch).read_bytes(), (PROPOSED.dirs[release] / patch).read_bytes()
                )
            self.assertEqual((ALTERNATIVE.tests / patch).read_bytes(), (PROPOSED.tests / patch).read_bytes())


class TestAlternativeApplies(TestSeriesApplies):
    """The same checks, for the alternative (docs/upstream/alternative-policy/)."""

    S = ALTERNATIVE


class TestSeriesBehaviour(_Supported):
    """Each patch's tests pass with the series applied and with the patch on its stack; all fail unpatched."""

    tmp: tempfile.TemporaryDirectory[str]
    series: pathlib.Path
    _series_result: dict[str, str] | None = None

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls.tmp = tempfile.TemporaryDirectory(prefix="tcp-upstream-")
        cls.series = patched_tree(cls.S, pathlib.Path(cls.tmp.name) / "series", list(cls.S.patches))

    @classmethod
    def tearDownClass(cls) -> None:
        tmp = getattr(cls, "tmp", None)
        if tmp is not None:
            tmp.cleanup()
        super().tearDownClass()

    def assertAllPassed(self, result: dict[str, str], patch: str) -> None:
        expected = probe_test_names(self.S, patch)
        self.assertGreater(len(expected), 0)
        got = {k: v for k, v in result.items() if k in expected}
        self.assertEqual(sorted(got), sorted(expected))
        failed = {k: v for k, v in got.items() if v != "ok"}
        if failed:
            self.fail("\n".join(f"{k}:\n{v}" for k, v in failed.items()))

    def series_result(self) -> dict[str, str]:
        cls = type(self)
        if cls.__dict__.get("_series_result") is None:  # this class's own, never a base class's
            cls._series_result = run_probe(cls.S, ["probe", *cls.S.numbers], cls.series, "PROBE-RESULT")
        assert cls._series_result is not None
        return cls._series_result

    def test_patched_modules_are_the_ones_imported(self) -> None:
        """The subprocess loads the patched copies in place of the installed modules."""
        rels = self.S.touched + self.S.created
        code = "; ".join(f"import {module_name(rel)} as f; print(f.__file__)" for rel in rels)
        env = {**os.environ, "TCP_PATCHED_TREE": str(self.series), "TCP_SERIES": self.S.name}
        proc = subprocess.run(
            [sys.executable, "-c", f"import runpy; runpy.run_path({str(PROBE)!r}, run_name='probe'); {code}"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        self.assertEqual(proc.returncode, 0, msg=proc.stderr)
        self.assertEqual(proc.stdout.split(), [str(self.series / rel) for rel in rels])

    def test_each_patch_with_series(self) -> None:
        """Every patch's tests pass with the whole series applied."""
        for patch in self.S.patches:
            with self.subTest(patch=patch):
                self.assertAllPassed(self.series_result(), patch)

    def test_each_patch_alone(self) -> None:
        """Every patch's tests pass with only that patch and the patches it is stacked on applied."""
        for patch, (_, _, below) in self.S.patches.items():
            with self.subTest(patch=patch), tempfile.TemporaryDirectory() as d:
                tree = patched_tree(self.S, pathlib.Path(d), [*below, patch])
                self.assertAllPassed(run_probe(self.S, ["probe", patch[:4]], tree, "PROBE-RESULT"), patch)

    def test_tests_fail_on_unpatched_torch(self) -> None:
        """Every test of every patch fails on the installed, unpatched torch, but the named guards of stock behaviour."""
        result = run_probe(self.S, ["probe", *self.S.numbers], None, "PROBE-RESULT")
        self.assertEqual(sorted(result), sorted(n for patch in self.S.patches for n in probe_test_names(self.S, patch)))
        self.assertEqual({k for k, v in result.items() if v == "ok"}, self.S.pass_unpatched)

    def test_no_registration_matches_stock_counters(self) -> None:
        """With nothing declared, a fixed workload leaves the same stock counters and outputs as unpatched torch (each patch on its stack, series); with 0004's declarations, the same outputs, and quantized_decomposed hits where stock bypassed."""
        stock = run_probe(self.S, ["workload"], None, "WORKLOAD-RESULT")
        self.assertIn("non-builtin", stock[2])
        for patch, (_, _, below) in self.S.patches.items():
            with self.subTest(patch=patch), tempfile.TemporaryDirectory() as d:
                alone = patched_tree(self.S, pathlib.Path(d), [*below, patch])
                self.assertEqual(run_probe(self.S, ["workload", "undeclared"], alone, "WORKLOAD-RESULT"), stock)
        self.assertEqual(run_probe(self.S, ["workload", "undeclared"], self.series, "WORKLOAD-RESULT"), stock)
        declared = run_probe(self.S, ["workload"], self.series, "WORKLOAD-RESULT")
        self.assertEqual(declared[4], stock[4])  # outputs
        self.assertNotIn("non-builtin", declared[2])
        self.assertEqual(declared[0] + declared[1], stock[0] + stock[1] + stock[2]["non-builtin"])
        self.assertGreater(declared[0], stock[0])


class TestAlternativeBehaviour(TestSeriesBehaviour):
    """The alternative's tests pass with its whole series applied (its per-patch runs are left to the proposed series'; 0001 and 0002 are shared)."""

    S = ALTERNATIVE

    def _proposed_only(self) -> None:
        self.skipTest("run for the proposed series only (CI time)")

    test_each_patch_alone = _proposed_only  # type: ignore[assignment]
    test_tests_fail_on_unpatched_torch = _proposed_only  # type: ignore[assignment]
    test_no_registration_matches_stock_counters = _proposed_only  # type: ignore[assignment]


class TestTorchUntouched(TestCase):
    """Nothing above writes to the installed torch (this class runs last; tearDownModule checks again)."""

    def test_installed_torch_unchanged(self) -> None:
        """The installed torch files hash as they did when this module was imported."""
        self.assertEqual({rel: sha256(SITE / rel) for rel in ALL_TOUCHED}, INSTALLED)


def tearDownModule() -> None:
    changed = [rel for rel in ALL_TOUCHED if sha256(SITE / rel) != INSTALLED[rel]]
    if changed:
        raise AssertionError(f"the installed torch was modified: {changed}")


if __name__ == "__main__":
    run_tests()
