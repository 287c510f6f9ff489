# Owner(s): ["module: fakeTensor"]
"""docs/upstream/fake_tensor_cache_policy.patch applies to the installed torch and works.

The patch is applied to copies of the installed files in a temporary tree laid
out like site-packages; a subprocess then imports torch with those copies
loaded in place of torch._subclasses.fake_tensor and torch._ops. The installed
torch is never written to.
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
import textwrap
import unittest
from typing import Any

import torch
from torch.testing._internal.common_utils import TestCase, run_tests

ROOT = pathlib.Path(__file__).resolve().parent.parent
PATCH = ROOT / "docs" / "upstream" / "fake_tensor_cache_policy.patch"
SITE = pathlib.Path(torch.__file__).resolve().parent.parent
TOUCHED = ("torch/_subclasses/fake_tensor.py", "torch/_ops.py")
PATCHED_FOR = "2.13."


def sha256(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


INSTALLED = {rel: sha256(SITE / rel) for rel in TOUCHED}


def copy_installed(dest: pathlib.Path) -> None:
    for rel in TOUCHED:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(SITE / rel, dest / rel)


def apply_patch(tree: pathlib.Path, *, dry_run: bool = False) -> subprocess.CompletedProcess[str]:
    """Applies the patch to ``tree`` with patch(1), or with git apply when patch is missing."""
    if shutil.which("patch"):
        cmd = ["patch", "-p1", "--forward", "--batch", "-i", str(PATCH)]
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


# Runs first in every subprocess: serves the patched copies in place of the
# installed modules, before torch is imported.
LOADER = textwrap.dedent(
    """
    import importlib.abc, importlib.util, os, sys

    _TREE = os.environ["TCP_PATCHED_TREE"]
    _FILES = {"torch._subclasses.fake_tensor": "torch/_subclasses/fake_tensor.py", "torch._ops": "torch/_ops.py"}

    class _PatchedFinder(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            rel = _FILES.get(name)
            return None if rel is None else importlib.util.spec_from_file_location(name, os.path.join(_TREE, rel))

    if _TREE:
        sys.meta_path.insert(0, _PatchedFinder())
    """
)

# Every scenario the README claims, each reported as a dict (or its error).
PROBE = textwrap.dedent(
    """
    import inspect, json, traceback
    from dataclasses import dataclass

    import torch
    import torch.ao.quantization.fx._decomposed  # noqa: F401  (defines quantized_decomposed)
    import torch._subclasses.fake_tensor as ft
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    FTM = ft.FakeTensorMode
    q = torch.ops.quantized_decomposed.quantize_per_tensor.default
    calls = {}
    ambient = {"dtype": torch.float32}
    lib = torch.library.Library("tcp_upstream", "DEF")

    def define(schema, fn):
        lib.define(schema)
        name = schema.split("(")[0]
        qualname = "tcp_upstream::" + name

        def kernel(*args):
            calls[name] = calls.get(name, 0) + 1
            return fn(*args)

        torch.library.register_fake(qualname, kernel, lib=lib)

    define("dyn(Tensor x) -> SymInt", lambda x: torch.library.get_ctx().new_dynamic_size())
    define("bad_view(Tensor x) -> Tensor", lambda x: x.view(-1))
    define("good_view(Tensor(a) x) -> Tensor(a)", lambda x: x.view(-1))
    define("twins(Tensor x) -> (Tensor, Tensor)", lambda x: (lambda o: (o, o.view(-1)))(x.new_empty(x.shape)))
    define("mut(Tensor(a!) x) -> ()", lambda x: None)
    define("multi_view(Tensor(a) x, Tensor y) -> Tensor(a)", lambda x, y: x.view(-1))
    define("ambient_cast(Tensor x) -> Tensor", lambda x: x.new_empty(x.shape, dtype=ambient["dtype"]))
    define("swap.ovl(Tensor x) -> Tensor", lambda x: x.new_empty(x.shape))
    define("sparse(Tensor x) -> Tensor", lambda x: x.to_sparse())

    def op(name, overload="default"):
        return getattr(getattr(torch.ops.tcp_upstream, name), overload)

    @dataclass(frozen=True)
    class Decision:
        cacheable: bool
        label: str
        explicit: bool = False

    class Policy:
        # The smallest object FakeTensorCachePolicy accepts.
        def __init__(self, namespaces=("quantized_decomposed", "tcp_upstream"), deny=(), allow=(), context=None):
            self.namespaces, self.deny, self.allow, self.context = set(namespaces), set(deny), set(allow), context
            self.identity = (frozenset(self.namespaces), frozenset(self.deny), frozenset(self.allow), context)

        def decide(self, op):
            if op in self.deny:
                return Decision(False, "denied by policy")
            if op in self.allow:
                return Decision(True, "cacheable", explicit=True)
            ok = op.namespace in {"aten", "prim", "prims"} | self.namespaces
            return Decision(ok, "cacheable" if ok else "non-builtin")

        def context_key(self):
            return None if self.context is None else self.context()

    def info(i):
        return {"hits": i.hits, "misses": i.misses, "bypasses": i.bypasses, "size": i.size}

    def global_keys(ns):
        return sum(1 for k in list(FTM.cache) if getattr(k.key[0], "namespace", None) == ns)

    def run_q(mode, n=3):
        with mode:
            x = torch.empty(2, 8)
            return [q(x, 0.1, 0, -128, 127, torch.int8) for _ in range(n)]

    def s_loaded():
        sig = inspect.signature(FTM.__init__).parameters["cache_policy"]
        return {
            "fake_tensor": ft.__file__,
            "ops": torch._ops.__file__,
            "kind": sig.kind.name,
            "default": repr(sig.default),
            "protocol": hasattr(ft, "FakeTensorCachePolicy"),
        }

    def s_admitted():
        before = info(FTM.cache_info())
        mode = FTM(cache_policy=Policy())
        outs = run_q(mode)
        after = info(FTM.cache_info())
        return {
            "policy": info(mode.policy_cache_info()),
            "shapes": [list(o.shape) for o in outs],
            "dtypes": [str(o.dtype) for o in outs],
            "global_qd_keys": global_keys("quantized_decomposed"),
            "global_bypass_delta": {k: v - before["bypasses"].get(k, 0) for k, v in after["bypasses"].items()},
            "partitions": [list(map(repr, k[:2])) for k in mode.policy_cache],
        }

    def s_default():
        before = FTM.cache_info().bypasses.get("non-builtin", 0)
        mode = FTM()
        run_q(mode)
        return {
            "non_builtin_delta": FTM.cache_info().bypasses.get("non-builtin", 0) - before,
            "policy": info(mode.policy_cache_info()),
            "cache_policy": repr(mode.cache_policy),
        }

    def s_denied_builtin():
        add = torch.ops.aten.add.Tensor
        mode = FTM(cache_policy=Policy(deny={add}))
        with mode:
            x = torch.empty(3, 5)
            size = len(FTM.cache)
            add(x, x)
            add(x, x)
            grown = len(FTM.cache) - size
        return {"policy": info(mode.policy_cache_info()), "global_growth": grown}

    def bypass_case(name, n=2, policy=None, **kw):
        mode = FTM(cache_policy=policy or Policy(), **kw)
        calls.pop(name, None)
        with mode:
            x = torch.empty(4, 4)
            outs = [op(name)(*([x, x] if name == "multi_view" else [x])) for _ in range(n)]
        return mode, x, outs

    def storage(t):
        return t.untyped_storage()._cdata

    def s_unbacked():
        mode, _, outs = bypass_case("dyn", shape_env=ShapeEnv())
        return {"policy": info(mode.policy_cache_info()), "distinct": len({str(o) for o in outs}), "calls": calls["dyn"]}

    def s_alias():
        mode, x, outs = bypass_case("bad_view")
        return {"policy": info(mode.policy_cache_info()), "aliased": [storage(o) == storage(x) for o in outs]}

    def s_declared_view():
        mode, x, outs = bypass_case("good_view", n=3)
        return {"policy": info(mode.policy_cache_info()), "aliased": [storage(o) == storage(x) for o in outs]}

    def s_twins():
        mode, _, outs = bypass_case("twins")
        return {"policy": info(mode.policy_cache_info()), "shared": [storage(a) == storage(b) for a, b in outs]}

    def s_mutable():
        mode, _, _ = bypass_case("mut")
        explicit, _, _ = bypass_case("mut", n=3, policy=Policy(allow={op("mut")}))
        return {"policy": info(mode.policy_cache_info()), "explicit": info(explicit.policy_cache_info()), "calls": calls["mut"]}

    def s_multi_view():
        mode, _, _ = bypass_case("multi_view")
        return {"policy": info(mode.policy_cache_info())}

    def s_sparse():
        mode, _, outs = bypass_case("sparse")
        return {"policy": info(mode.policy_cache_info()), "layouts": [str(o.layout) for o in outs]}

    def s_context():
        mode = FTM(cache_policy=Policy(context=lambda: ambient["dtype"]))
        calls.pop("ambient_cast", None)
        dtypes = []
        with mode:
            x = torch.empty(2)
            for dtype in (torch.float32, torch.float32, torch.float16, torch.float16, torch.float32):
                ambient["dtype"] = dtype
                dtypes.append(str(op("ambient_cast")(x).dtype))
        ambient["dtype"] = torch.float32
        return {"policy": info(mode.policy_cache_info()), "dtypes": dtypes, "calls": calls["ambient_cast"]}

    def s_kernel_swap():
        swap = op("swap", "ovl")
        mode = FTM(cache_policy=Policy())
        fragment = torch.library.Library("tcp_upstream", "FRAGMENT")
        shapes = []
        with mode:
            x = torch.empty(4, 4)
            shapes.append(list(swap(x).shape))
            torch.library.register_fake("tcp_upstream::swap.ovl", lambda x: x.new_empty(7), lib=fragment)
            shapes.append(list(swap(x).shape))
            shapes.append(list(swap(x).shape))
        fragment._destroy()
        return {"policy": info(mode.policy_cache_info()), "shapes": shapes}

    def s_policy_cache_clear():
        mode = FTM(cache_policy=Policy())
        run_q(mode)
        mode.policy_cache_clear()
        return {"policy": info(mode.policy_cache_info())}

    def s_cache_clear_subclass():
        class Sub(FTM):
            pass

        Sub.cache_clear()
        shadowed = sorted(k for k in ("cache_hits", "cache_misses", "cache_bypasses", "cache") if k in Sub.__dict__)
        with FTM():
            x = torch.empty(2, 3)
            x + x
            x + x
        return {"shadowed": shadowed, "sub_hits_follow_base": Sub.cache_info().hits == FTM.cache_info().hits >= 1}

    def s_hop_subclass():
        class Sub(FTM):
            pass

        with Sub():
            x = torch.empty(3)
            out = torch.cond(x.sum() > 0, lambda x: x + 1, lambda x: x - 1, (x,))
        return {"shape": list(out.shape), "fake": isinstance(out, ft.FakeTensor)}

    def s_cachepolicy_protocol():
        import torch_cachepolicy as tcp

        mode = FTM(cache_policy=tcp.CachePolicy(namespaces=["quantized_decomposed"]))
        run_q(mode)
        return {"policy": info(mode.policy_cache_info())}

    results = {}
    for name, fn in list(globals().items()):
        if name.startswith("s_"):
            try:
                results[name[2:]] = fn()
            except BaseException:
                results[name[2:]] = {"error": traceback.format_exc()}
    print("PROBE-RESULT " + json.dumps(results))
    """
)

# A fixed workload whose stock cache counters must not change with the patch
# when no policy is given.
WORKLOAD = textwrap.dedent(
    """
    import json

    import torch
    import torch.ao.quantization.fx._decomposed  # noqa: F401
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv, DimDynamic, StatelessSymbolicContext

    FakeTensorMode.cache_clear()
    q = torch.ops.quantized_decomposed.quantize_per_tensor.default
    log = []
    for mode in (FakeTensorMode(), FakeTensorMode(shape_env=ShapeEnv())):
        ctx = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC] * 2)
        x = mode.from_tensor(torch.empty(3, 4), symbolic_context=ctx if mode.shape_env else None)
        with mode:
            for _ in range(3):
                y = x + x
                y.add_(1)
                v = y.view(-1)
                z = q(y, 0.1, 0, -128, 127, torch.int8)
                n = torch.ops.aten.nonzero.default(y) if mode.shape_env else y.sum()
                log.append([str(t.shape) for t in (y, v, z, n)] + [str(z.dtype)])
        log.append(str(mode.shape_env.fake_tensor_cache.__len__() if mode.shape_env else None))
    info = FakeTensorMode.cache_info()
    print("WORKLOAD-RESULT " + json.dumps([info.hits, info.misses, dict(sorted(info.bypasses.items())), info.size, log]))
    """
)


def run_python(code: str, tree: pathlib.Path | None, marker: str) -> Any:
    """Runs ``code`` in a fresh interpreter (patched modules when ``tree`` is set)."""
    env = {**os.environ, "TCP_PATCHED_TREE": "" if tree is None else str(tree)}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    proc = subprocess.run(
        [sys.executable, "-c", LOADER + code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
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
        if not torch.__version__.startswith(PATCHED_FOR):
            raise unittest.SkipTest(f"the patch is against torch {PATCHED_FOR}x; torch {torch.__version__} is installed")
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
            cls._probe = run_python(PROBE, cls.tree, "PROBE-RESULT")
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
        """A dry run succeeds without fuzz or offsets on fresh copies of the installed files."""
        with tempfile.TemporaryDirectory() as d:
            tree = pathlib.Path(d) / "site-packages"
            copy_installed(tree)
            proc = apply_patch(tree, dry_run=True)
            self.assertEqual(proc.returncode, 0, msg=proc.stdout + proc.stderr)
            self.assertNotRegex(proc.stdout + proc.stderr, r"(?i)fuzz|offset|reject|already applied")
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
        stock = run_python(WORKLOAD, None, "WORKLOAD-RESULT")
        patched = run_python(WORKLOAD, self.tree, "WORKLOAD-RESULT")
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
