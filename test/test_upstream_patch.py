# Owner(s): ["module: fakeTensor"]
"""docs/upstream/fake_tensor_cache_policy.patch applies to the installed torch and works.

The patch is applied to copies of the installed files in a temporary tree laid
out like site-packages; a subprocess (test/upstream_patch_probe.py) then
imports torch with those copies loaded in place of torch._subclasses.fake_tensor
and torch._ops and runs every scenario. The installed torch is never written to.

One patch serves every supported torch: it is made against ``PATCH_BASE``
(2.13.0), where it applies exactly; on 2.14.1 every hunk's context is
unchanged and only its line numbers moved, so ``patch --fuzz=0`` and
``git apply`` apply it with offsets and without fuzz.
"""

from __future__ import annotations

import hashlib
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

from torch_cachepolicy import _compat

ROOT = pathlib.Path(__file__).resolve().parent.parent
PATCH = ROOT / "docs" / "upstream" / "fake_tensor_cache_policy.patch"
PROBE = pathlib.Path(__file__).resolve().parent / "upstream_patch_probe.py"
SITE = pathlib.Path(torch.__file__).resolve().parent.parent
TOUCHED = ("torch/_subclasses/fake_tensor.py", "torch/_ops.py")
PATCH_BASE = "2.13.0"  # the release whose line numbers the patch carries
TORCH_VERSION = str(torch.__version__).split("+")[0]


def sha256(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


INSTALLED = {rel: sha256(SITE / rel) for rel in TOUCHED}


def copy_installed(dest: pathlib.Path) -> None:
    for rel in TOUCHED:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(SITE / rel, dest / rel)


def apply_patch(tree: pathlib.Path, *, dry_run: bool = False) -> subprocess.CompletedProcess[str]:
    """Applies the patch to ``tree`` with patch(1), or with git apply when patch is missing.

    Every context line must match (``--fuzz=0``; git apply never fuzzes);
    hunks may move (offsets), which is how one patch serves 2.13 and 2.14.
    """
    if shutil.which("patch"):
        cmd = ["patch", "-p1", "--forward", "--batch", "--fuzz=0", "-i", str(PATCH)]
        if dry_run:
            cmd.insert(1, "--dry-run")
    elif shutil.which("git"):
        cmd = ["git", "apply", "--check" if dry_run else "--verbose", str(PATCH)]
    else:
        raise unittest.SkipTest("neither patch nor git is installed")
    # Keep git from finding a repository above the temporary tree (it would
    # then apply relative to that repository's root).
    env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(tree.parent)}
    return subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=120)


def run_probe(command: str, tree: pathlib.Path | None, marker: str) -> Any:
    """Runs ``upstream_patch_probe.py command`` in a fresh interpreter (patched modules when ``tree`` is set)."""
    env = {**os.environ, "TCP_PATCHED_TREE": "" if tree is None else str(tree)}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    proc = subprocess.run(
        [sys.executable, str(PROBE), command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    for line in proc.stdout.splitlines():
        if line.startswith(marker + " "):
            return json.loads(line[len(marker) + 1 :])
    raise AssertionError(f"subprocess exited {proc.returncode} without {marker}:\n{proc.stdout}\n{proc.stderr}")


class TestUpstreamPatch(TestCase):
    tmp: tempfile.TemporaryDirectory[str]
    tree: pathlib.Path
    _probe: dict[str, Any] | None = None

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        minor = _compat._torch_minor(TORCH_VERSION)
        if minor is None or not _compat._LOWER <= minor < _compat._UPPER:
            raise unittest.SkipTest(
                f"the patch is kept applying to torch{_compat.SUPPORTED_TORCH}; torch {TORCH_VERSION} is installed"
            )
        cls.tmp = tempfile.TemporaryDirectory(prefix="tcp-upstream-")
        cls.tree = pathlib.Path(cls.tmp.name) / "site-packages"
        copy_installed(cls.tree)
        proc = apply_patch(cls.tree)
        if proc.returncode != 0:
            raise AssertionError(f"the patch does not apply:\n{proc.stdout}\n{proc.stderr}")

    @classmethod
    def tearDownClass(cls) -> None:
        tmp = getattr(cls, "tmp", None)
        if tmp is not None:
            tmp.cleanup()
        super().tearDownClass()
        changed = [rel for rel in TOUCHED if sha256(SITE / rel) != INSTALLED[rel]]
        if changed:
            raise AssertionError(f"the installed torch was modified: {changed}")

    def probe(self, scenario: str) -> dict[str, Any]:
        cls = type(self)
        if cls._probe is None:
            cls._probe = run_probe("probe", cls.tree, "PROBE-RESULT")
        result = cls._probe[scenario]
        self.assertNotIn("error", result, msg=result.get("error"))
        return result

    # ------------------------------------------------------------ applying

    def test_patch_touches_only_declared_files(self) -> None:
        """The patch edits exactly torch/_subclasses/fake_tensor.py and torch/_ops.py."""
        text = PATCH.read_text()
        self.assertEqual(re.findall(r"^--- a/(\S+)$", text, re.M), list(TOUCHED))
        self.assertEqual(re.findall(r"^\+\+\+ b/(\S+)$", text, re.M), list(TOUCHED))

    def test_readme_matches_patch(self) -> None:
        """docs/upstream/README.md gives the patch's per-file line counts and explains every hunk."""
        readme = (PATCH.parent / "README.md").read_text()
        counts: dict[str, list[int]] = {}
        current = None
        hunks = []
        for line in PATCH.read_text().splitlines():
            if line.startswith("+++ b/"):
                current = counts.setdefault(line[len("+++ b/") :], [0, 0])
            elif line.startswith("@@ "):
                hunks.append(line.split()[1].split(",")[0])
            elif current is not None and line[:1] in "+-" and not line.startswith("--- "):
                current[line[0] == "-"] += 1
        for rel, (added, removed) in counts.items():
            self.assertRegex(readme, rf"\| `{re.escape(rel)}`[^|]*\| {added} \| {removed} \|")
        self.assertEqual(sorted(set(re.findall(r"`@@ (-\d+)`", readme))), sorted(set(hunks)))

    def test_patch_applies_cleanly(self) -> None:
        """A dry run succeeds without fuzz on fresh copies of the installed files (and without offsets on PATCH_BASE)."""
        with tempfile.TemporaryDirectory() as d:
            tree = pathlib.Path(d) / "site-packages"
            copy_installed(tree)
            proc = apply_patch(tree, dry_run=True)
            output = proc.stdout + proc.stderr
            self.assertEqual(proc.returncode, 0, msg=output)
            self.assertNotRegex(output, r"(?i)fuzz|reject|already applied")
            if TORCH_VERSION == PATCH_BASE:
                self.assertNotRegex(output, r"(?i)offset")
            self.assertEqual({rel: sha256(tree / rel) for rel in TOUCHED}, INSTALLED)

    def test_git_apply_check(self) -> None:
        """git apply --check accepts the patch as well."""
        if not shutil.which("git"):
            self.skipTest("git is not installed")
        with tempfile.TemporaryDirectory() as d:
            tree = pathlib.Path(d) / "site-packages"
            copy_installed(tree)
            env = {**os.environ, "GIT_CEILING_DIRECTORIES": d}
            proc = subprocess.run(
                ["git", "apply", "--check", str(PATCH)], cwd=tree, env=env, capture_output=True, text=True, timeout=120
            )
            self.assertEqual(proc.returncode, 0, msg=proc.stderr)

    def test_patched_files_changed_and_compile(self) -> None:
        """Both patched files differ from the installed ones and byte-compile."""
        for rel in TOUCHED:
            path = self.tree / rel
            self.assertNotEqual(sha256(path), INSTALLED[rel], msg=rel)
            with tempfile.TemporaryDirectory() as d:
                py_compile.compile(str(path), cfile=os.path.join(d, "out.pyc"), doraise=True)

    # ----------------------------------------------------- patched torch

    def test_patched_modules_are_the_ones_imported(self) -> None:
        """The subprocess imports the patched copies, and FakeTensorMode takes cache_policy=None."""
        loaded = self.probe("loaded")
        self.assertEqual(pathlib.Path(loaded["fake_tensor"]), self.tree / TOUCHED[0])
        self.assertEqual(pathlib.Path(loaded["ops"]), self.tree / TOUCHED[1])
        self.assertEqual((loaded["kind"], loaded["default"]), ("KEYWORD_ONLY", "None"))
        self.assertTrue(loaded["protocol"])

    def test_policy_admits_backend_op(self) -> None:
        """A policy admitting quantized_decomposed turns repeats of quantize_per_tensor into hits."""
        r = self.probe("admitted")
        self.assertEqual(r["policy"], {"hits": 2, "misses": 1, "bypasses": {}, "size": 1})
        self.assertEqual(r["shapes"], [[2, 8]] * 3)
        self.assertEqual(r["dtypes"], ["torch.int8"] * 3)
        self.assertEqual(r["global_qd_keys"], 0)
        self.assertEqual({k: v for k, v in r["global_bypass_delta"].items() if v}, {})
        self.assertEqual(len(r["partitions"]), 1)

    def test_no_policy_bypasses_as_non_builtin(self) -> None:
        """With cache_policy=None the backend op bypasses as 'non-builtin', as stock does."""
        r = self.probe("default")
        self.assertEqual(r["non_builtin_delta"], 3)
        self.assertEqual(r["policy"], {"hits": 0, "misses": 0, "bypasses": {}, "size": 0})
        self.assertEqual(r["cache_policy"], "None")

    def test_no_policy_matches_stock_counters(self) -> None:
        """Without a policy, a fixed workload leaves the same stock counters as unpatched torch."""
        stock = run_probe("workload", None, "WORKLOAD-RESULT")
        patched = run_probe("workload", self.tree, "WORKLOAD-RESULT")
        self.assertEqual(patched, stock)
        self.assertIn("non-builtin", stock[2])

    def test_denied_builtin_never_reaches_shared_cache(self) -> None:
        """A builtin op the policy rejects bypasses before lookup and writes nothing to FakeTensorMode.cache."""
        r = self.probe("denied_builtin")
        self.assertEqual(r["policy"]["bypasses"], {"denied by policy": 2})
        self.assertEqual(r["global_growth"], 0)

    def test_unbacked_scalar_output_bypasses(self) -> None:
        """A bare SymInt output with a fresh unbacked symbol is never replayed."""
        r = self.probe("unbacked")
        self.assertEqual(r["policy"]["bypasses"], {"unrepresented symbol in output": 2})
        self.assertEqual((r["distinct"], r["calls"]), (2, 2))

    def test_undeclared_alias_bypasses(self) -> None:
        """An output sharing an input's storage without an alias annotation bypasses and stays aliased."""
        r = self.probe("alias")
        self.assertEqual(r["policy"]["bypasses"], {"output aliases an undeclared input": 2})
        self.assertEqual(r["aliased"], [True, True])

    def test_declared_view_is_cached(self) -> None:
        """A Tensor(a) -> Tensor(a) backend view hits and the hit still aliases its input."""
        r = self.probe("declared_view")
        self.assertEqual((r["policy"]["hits"], r["policy"]["misses"]), (2, 1))
        self.assertEqual(r["aliased"], [True, True, True])

    def test_outputs_aliasing_each_other_bypass(self) -> None:
        """Two outputs sharing one storage bypass, so a hit cannot split them."""
        r = self.probe("twins")
        self.assertEqual(r["policy"]["bypasses"], {"outputs alias each other": 2})
        self.assertEqual(r["shared"], [True, True])

    def test_mutable_schema_bypasses_unless_explicit(self) -> None:
        """A Tensor(a!) op bypasses, unless the policy allowed it by name (explicit)."""
        r = self.probe("mutable")
        self.assertEqual(r["policy"]["bypasses"], {"mutable schema": 2})
        self.assertEqual((r["explicit"]["hits"], r["explicit"]["misses"]), (2, 1))
        self.assertEqual(r["calls"], 1)

    def test_view_with_several_tensor_args_bypasses(self) -> None:
        """A view schema with two tensor args bypasses instead of raising AssertionError."""
        r = self.probe("multi_view")
        self.assertEqual(r["policy"]["bypasses"], {"view op with several tensor args": 2})

    def test_sparse_output_bypasses(self) -> None:
        """A sparse output bypasses as 'sparse output' (the stock check runs before the aliasing check)."""
        r = self.probe("sparse")
        self.assertEqual(r["policy"]["bypasses"], {"sparse output": 2})
        self.assertEqual(r["layouts"], ["torch.sparse_coo"] * 2)

    def test_context_key_partitions_entries(self) -> None:
        """A context_key() change selects another partition; going back hits the old one."""
        r = self.probe("context")
        self.assertEqual(r["dtypes"], ["torch.float32"] * 2 + ["torch.float16"] * 2 + ["torch.float32"])
        self.assertEqual((r["policy"]["hits"], r["policy"]["misses"], r["calls"]), (3, 2, 2))

    def test_reregistered_fake_kernel_is_not_served_old_entries(self) -> None:
        """Re-registering the fake kernel of a non-default overload selects a fresh partition."""
        r = self.probe("kernel_swap")
        self.assertEqual(r["shapes"], [[4, 4], [7], [7]])
        self.assertEqual((r["policy"]["hits"], r["policy"]["misses"]), (1, 2))

    def test_policy_cache_clear(self) -> None:
        """policy_cache_clear() empties this mode's policy entries and counters."""
        self.assertEqual(self.probe("policy_cache_clear")["policy"], {"hits": 0, "misses": 0, "bypasses": {}, "size": 0})

    def test_cache_clear_does_not_shadow_counters_on_subclass(self) -> None:
        """Subclass.cache_clear() resets the base counters instead of shadowing them."""
        r = self.probe("cache_clear_subclass")
        self.assertEqual(r["shadowed"], [])
        self.assertTrue(r["sub_hits_follow_base"])

    def test_hop_under_mode_subclass(self) -> None:
        """torch.cond runs under a plain FakeTensorMode subclass (rule found along the MRO)."""
        self.assertEqual(self.probe("hop_subclass"), {"shape": [3], "fake": True})

    def test_cachepolicy_fits_the_protocol(self) -> None:
        """torch_cachepolicy.CachePolicy can be passed as the native cache_policy."""
        r = self.probe("cachepolicy_protocol")
        self.assertEqual((r["policy"]["hits"], r["policy"]["misses"]), (2, 1))

    def test_installed_torch_unchanged(self) -> None:
        """The installed torch files hash as they did before any test ran."""
        self.assertEqual({rel: sha256(SITE / rel) for rel in TOUCHED}, INSTALLED)


if __name__ == "__main__":
    run_tests()
