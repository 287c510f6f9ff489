# Owner(s): ["module: fakeTensor"]
"""Statements of README.md, docs/guide.md, docs/api.md and docs/design.md that no other test checks.

Each test names the statement it holds the code to; the others are listed, with their tests, beside the docs
(test/test_docs.py runs the docs' code blocks, test/test_api_docs.py their API blocks).
"""

from __future__ import annotations

import importlib
import pathlib
import re
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode as StockFakeTensorMode
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext
from torch.testing._internal.common_utils import TestCase, run_tests
from torch.utils._python_dispatch import TorchDispatchMode

import torch_cachepolicy as tcp
from torch_cachepolicy import _reasons
from torch_cachepolicy.version import TESTED_TORCH, TORCH_REQUIREMENT

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "torch_cachepolicy"
DESIGN = ROOT / "docs" / "design.md"
# Docs whose Note references must name Notes of the code (RFC.md and docs/upstream/ quote torch's own).
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

MODULES = {p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
BACKTICKED = re.compile(r"`([^`\s]+)`")
NOTE_DEFINED = re.compile(r"^\s*(?:#|//) Note \[(?P<name>[^\]]+)\]\s*\n\s*(?:#|//) ~+\s*$", re.M)
NOTE_NAMED = re.compile(r"Note \[([^\]]+)\]")
INDEX_ROW = re.compile(r"^\| Note \[(?P<name>[^\]]+)\] \| `(?P<file>[^`]+)` \|$", re.M)


def code_notes() -> set[tuple[str, str]]:
    """(Note name, file) for every Note defined in the package and csrc/: a comment title underlined with ``~``."""
    found = set()
    for path in [*PACKAGE.rglob("*.py"), *(ROOT / "csrc").iterdir()]:
        name = str(path.relative_to(PACKAGE if path.is_relative_to(PACKAGE) else ROOT))
        for m in NOTE_DEFINED.finditer(path.read_text()):
            found.add((m["name"], name))
    return found


def resolve(dotted: str) -> object:
    """The object a ``module.attr...`` name of the package refers to; AttributeError if there is none."""
    module, *attrs = dotted.split(".")
    obj: object = importlib.import_module(f"torch_cachepolicy.{module}")
    for attr in attrs:
        obj = getattr(obj, attr)
    return obj


# ------------------------------------------------------------------ design.md


class TestDesignMap(TestCase):
    def test_named_files_exist(self) -> None:
        """docs/design.md's Pieces name files of the package and csrc/ that exist."""
        text = DESIGN.read_text()
        files = [
            t for t in BACKTICKED.findall(text) if t.endswith((".py", ".cpp", ".h")) and (t.startswith("csrc/") or "/" not in t)
        ]
        self.assertGreater(len(files), 25)
        missing = [f for f in files if not ((ROOT / f) if f.startswith("csrc/") else (PACKAGE / f)).is_file()]
        self.assertEqual(missing, [])

    def test_named_functions_exist(self) -> None:
        """Every module.function (or module.Class.member) docs/design.md names exists in the code."""
        text = DESIGN.read_text()
        names = [
            t for t in BACKTICKED.findall(text)
            if "." in t and t.split(".")[0] in MODULES and not t.endswith((".py", ".cpp", ".h"))
        ]
        self.assertGreater(len(names), 50)
        missing = []
        for name in names:
            try:
                resolve(name)
            except (AttributeError, ImportError):
                missing.append(name)
        self.assertEqual(missing, [])

    def test_notes_index_is_the_code_notes(self) -> None:
        """docs/design.md's index of Notes lists every Note of the code, with its file, and nothing else."""
        index = {(m["name"], m["file"].removeprefix("torch_cachepolicy/")) for m in INDEX_ROW.finditer(DESIGN.read_text())}
        code = code_notes()
        self.assertGreater(len(code), 30)
        self.assertEqual(sorted(code - index), [], msg="add these to docs/design.md's Notes")
        self.assertEqual(sorted(index - code), [], msg="these are not (or no longer) Notes of the code")

    def test_every_note_the_docs_name_exists(self) -> None:
        """A Note named in README.md or docs/*.md is a Note of the code."""
        defined = {name for name, _ in code_notes()}
        # The benchmarks' own Notes are named as theirs (benchmarks/...).
        benchmarks = set(NOTE_NAMED.findall("\n".join(p.read_text() for p in (ROOT / "benchmarks").rglob("*.py"))))
        named = {(p.name, re.sub(r"\s+", " ", n)) for p in DOCS for n in NOTE_NAMED.findall(p.read_text()) if n != "..."}
        self.assertEqual(sorted((doc, n) for doc, n in named if n not in defined | benchmarks), [])


# ------------------------------------------------------------------ README.md


class TestReadme(TestCase):
    def test_make_test_runs_the_tiers(self) -> None:
        """README: `make test` runs every tier in .venv (torch 2.13.0), the full suite on 2.15.0 and the core tests
        on 2.14.1 through `make test-torch TORCH=X SUITE=core|full` in .venv-torch-X; CI's .ci/run runs `make test`."""
        makefile = (ROOT / "Makefile").read_text()
        self.assertIn("MAIN_TORCH := 2.13.0", makefile)
        self.assertIn("TIER_VENV = .venv-torch-$(TORCH)", makefile)
        recipe = makefile[makefile.index("\ntest: ") + 1 :].split("\n\n")[0]
        for target in ("lint", "test-fallback", "test-main", "test-sanitizers", "test-executorch"):
            self.assertIn(target, recipe.splitlines()[0])
        self.assertIn("$(MAKE) test-torch TORCH=2.15.0 SUITE=full", recipe)
        self.assertIn("$(MAKE) test-torch TORCH=2.14.1 SUITE=core", recipe)
        self.assertRegex((ROOT / ".ci" / "run").read_text(), r"\nmake test\n")

    def test_torch_versions(self) -> None:
        """README's torch requirement and tested releases are version.py's."""
        readme = (ROOT / "README.md").read_text()
        self.assertIn(f"`torch{TORCH_REQUIREMENT}`", readme)
        self.assertIn(f"tested on {', '.join(TESTED_TORCH[:-1])} and {TESTED_TORCH[-1]}", readme)


# ------------------------------------------------------------------ guide.md: what the mode checks

LIB = torch.library.Library("tcp_doc_stmt", "DEF")
NS = "tcp_doc_stmt"


def define(schema: str, fake: Any) -> Any:
    """Defines ``tcp_doc_stmt::<schema>`` with the fake kernel ``fake``; returns its default overload."""
    LIB.define(schema)
    name = schema.split("(")[0]
    if fake is not None:
        torch.library.register_fake(f"{NS}::{name}", fake, lib=LIB)
    return getattr(torch.ops.tcp_doc_stmt, name).default


twins = define("twins(Tensor x) -> (Tensor, Tensor)", lambda x: (lambda t: (t, t[:1]))(x.new_empty(4)))
undeclared_view = define("undeclared_view(Tensor x) -> Tensor", lambda x: x.view(-1))
fresh = define("fresh(Tensor x) -> Tensor", lambda x: torch.empty_like(x))
dtype_of = define("dtype_of(Tensor x) -> ScalarType", lambda x: x.dtype)
size0 = define("size0(Tensor x) -> SymInt", lambda x: x.shape[0])
fill = define("fill(Tensor(a!) x) -> Tensor(a!)", lambda x: x)
by_leaf = define("by_leaf(Tensor x) -> Tensor", lambda x: x.new_empty(1 if x.is_leaf else 2))
# No Meta, composite or fake kernel: admitted only by its decomposition; torch's trivial fake impl of an op that
# returns nothing runs where the Meta key's backend fallback is reached.
touch = define("touch(Tensor(a!) x) -> ()", None)


class _ProxySlot(TorchDispatchMode):
    """Sits where make_fx's proxy mode sits (the PROXY slot), so that a proxy mode traces; dispatches on."""

    def __init__(self) -> None:
        super().__init__()
        self._mode_key = torch._C._TorchDispatchModeKey.PROXY

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return func(*args, **(kwargs or {}))


class TestGuideTable(TestCase):
    """docs/guide.md, "What the mode checks": the rows no other test names by their reason."""

    def policy(self, **kwargs: Any) -> tcp.CachePolicy:
        return tcp.CachePolicy(namespaces=[NS], **kwargs)

    def assertBypassed(self, mode: tcp.FakeTensorMode, op: object, reason: str, times: int) -> None:
        row = mode.cache_report()[op]
        self.assertEqual((row.hits, row.misses, row.bypasses), (0, 0, {reason: times}), msg=str(mode.cache_report()))

    def test_outputs_alias_each_other(self) -> None:
        """Two outputs sharing a storage: `outputs alias each other`."""
        mode = tcp.FakeTensorMode(cache_policy=self.policy())
        with mode:
            x = torch.empty(2)
            outs = [twins(x) for _ in range(2)]
        self.assertTrue(all(a.untyped_storage()._cdata == b.untyped_storage()._cdata for a, b in outs))
        self.assertBypassed(mode, twins, _reasons.OUTPUTS_ALIAS, 2)

    def test_undeclared_alias(self) -> None:
        """An output on an input's storage without a schema alias annotation bypasses, with its own name."""
        mode = tcp.FakeTensorMode(cache_policy=self.policy())
        with mode:
            x = torch.empty(2, 3)
            outs = [undeclared_view(x) for _ in range(2)]
        self.assertEqual({o.untyped_storage()._cdata for o in outs}, {x.untyped_storage()._cdata})
        self.assertBypassed(mode, undeclared_view, _reasons.UNDECLARED_ALIAS, 2)

    def test_hit_could_not_rebuild(self) -> None:
        """An output a hit cannot rebuild at all: `a hit could not rebuild the output (<type>)`."""

        class Unbuildable(tcp.FakeTensorMode):
            def _output_from_cache_entry(self, state: Any, entry: Any, key: Any, *rest: Any) -> Any:
                if key.key[0] is fresh and not self._cache.synth.transient:  # the miss's verification and hits
                    raise RuntimeError("cannot rebuild")
                return super()._output_from_cache_entry(state, entry, key, *rest)

        mode = Unbuildable(cache_policy=self.policy())
        with mode:
            x = torch.empty(3)
            for _ in range(2):
                fresh(x)
        self.assertBypassed(mode, fresh, "a hit could not rebuild the output (RuntimeError)", 2)

    def test_entry_builder_cannot_describe(self) -> None:
        """An output torch's entry builder cannot describe (a dtype) bypasses instead of failing the dispatch."""
        mode = tcp.FakeTensorMode(cache_policy=self.policy())
        with mode:
            x = torch.empty(3)
            outs = [dtype_of(x) for _ in range(2)]
        self.assertEqual(outs[0], outs[1])
        [(reason, n)] = mode.cache_report()[dtype_of].bypasses.items()
        self.assertEqual(n, 2)
        self.assertTrue(reason.startswith("torch's entry builder cannot describe the output ("), msg=reason)

    def test_proxy_mode_with_symnode_output(self) -> None:
        """A bare SymInt output while a proxy mode traces: `Proxy mode with SymNode output`."""
        mode = tcp.FakeTensorMode(cache_policy=self.policy(), shape_env=ShapeEnv())
        x = mode.from_tensor(
            torch.empty(5, 2),
            symbolic_context=StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC, DimDynamic.STATIC]),
        )
        with mode, _ProxySlot():
            for _ in range(2):
                mode.dispatch(size0, (), (x,), {})
        self.assertBypassed(mode, size0, _reasons.PROXY_SYMNODE, 2)

    def test_mutating_op_bypasses_unless_allowed_by_name(self) -> None:
        """A Tensor(a!) op: `mutates an argument (allow it with register_op)`, cached once allowed by name."""
        for policy, expected in ((self.policy(), (0, 0, {_reasons.MUTATES: 2})), (self.policy(allow=[fill]), (1, 1, {}))):
            mode = tcp.FakeTensorMode(cache_policy=policy)
            with mode:
                x = torch.empty(3)
                for _ in range(2):
                    fill(x)
            row = mode.cache_report()[fill]
            self.assertEqual((row.hits, row.misses, row.bypasses), expected)

    def test_argument_with_a_grad(self) -> None:
        """An argument with a .grad: `argument with a .grad`."""
        mode = tcp.FakeTensorMode(cache_policy=self.policy())
        with mode:
            x = torch.empty(3, requires_grad=True)
            x.grad = torch.empty(3)
            for _ in range(2):
                fresh(x)
        self.assertBypassed(mode, fresh, _reasons.GRAD, 2)

    def test_non_leaf_argument_joins_the_key(self) -> None:
        """A leaf and a non-leaf argument of equal metadata get separate entries (no bypass)."""
        mode = tcp.FakeTensorMode(cache_policy=self.policy())
        with mode:
            leaf = torch.empty(3, requires_grad=True)
            non_leaf = leaf * 1
            shapes = [tuple(by_leaf(t).shape) for t in (leaf, non_leaf, leaf, non_leaf)]
        self.assertEqual(shapes, [(1,), (2,), (1,), (2,)])
        row = mode.cache_report()[by_leaf]
        self.assertEqual((row.hits, row.misses, row.bypasses), (2, 2, {}))

    def test_no_fake_kernel_for_static_inputs(self) -> None:
        """An op admitted for its decomposition alone bypasses on a static miss, where the Meta backend fallback ran."""
        torch._decomp.decomposition_table[touch] = lambda x: None
        self.addCleanup(torch._decomp.decomposition_table.pop, touch)
        policy = tcp.CachePolicy(allow=[touch])  # by name: it mutates its argument
        self.assertTrue(policy.is_cacheable(touch))
        mode = tcp.FakeTensorMode(cache_policy=policy)
        with mode:
            x = torch.empty(3)
            for _ in range(2):
                touch(x)
        self.assertBypassed(mode, touch, _reasons.BACKEND_FALLBACK, 2)

    def test_policy_decisions_are_counted_and_nothing_is_stored(self) -> None:
        """An op the policy does not admit is dispatched uncached, counted under the decision's label, never stored."""
        view_as = torch.ops.aten.view_as.default
        add = torch.ops.aten.add.Tensor
        cases = [
            (tcp.CachePolicy(), fresh, 1, _reasons.NON_BUILTIN),
            (self.policy(deny=[fresh]), fresh, 1, _reasons.DENIED),
            (tcp.CachePolicy(include_builtins=False, namespaces=[NS]), add, 2, _reasons.BUILTIN_EXCLUDED),
            (tcp.CachePolicy(), view_as, 2, _reasons.CIA_VIEW),
        ]
        for policy, op, arity, label in cases:
            # torch's class-wide cache may hold entries of the op from earlier tests: count only what this adds.
            before = sum(1 for k in list(StockFakeTensorMode.cache) if k.key[0] is op)
            mode = tcp.FakeTensorMode(cache_policy=policy)
            # Under autograd the dispatcher runs a CompositeImplicitAutograd kernel before the mode sees the op.
            with mode, torch.inference_mode():
                x = torch.empty(2, 7)
                for _ in range(2):
                    op(*[x] * arity)
            row = mode.cache_report()[op]
            self.assertEqual((row.hits, row.misses, row.bypasses), (0, 0, {label: 2}), msg=label)
            self.assertEqual(len(mode.cache_store), 0, msg=label)
            self.assertEqual(sum(1 for k in list(StockFakeTensorMode.cache) if k.key[0] is op), before, msg=label)


# ------------------------------------------------------------------ api.md: the notes under the blocks


class TestApiNotes(TestCase):
    def test_cache_decision_labels(self) -> None:
        """CacheDecision is frozen; its label is "cacheable" for a cacheable decision."""
        decision = tcp.CachePolicy(namespaces=[NS]).decide(fresh)
        self.assertEqual((decision.cacheable, decision.label), (True, "cacheable"))
        with self.assertRaises(AttributeError):
            decision.label = "x"  # type: ignore[misc]

    def test_op_report_namespace_and_calls(self) -> None:
        """OpReport.namespace is the part before `::`; calls is hits + misses + every bypass."""
        row = tcp.OpReport("ns::op.default", hits=2, misses=1, bypasses={"a": 3, "b": 4})
        self.assertEqual((row.namespace, row.calls), ("ns", 10))

    def test_cache_policy_none_installs_the_default(self) -> None:
        """Assigning None to FakeTensorMode.cache_policy installs CachePolicy()."""
        mode = tcp.FakeTensorMode(cache_policy=tcp.CachePolicy(namespaces=[NS]))
        mode.cache_policy = None  # type: ignore[assignment]
        self.assertTrue(mode.cache_policy.is_stock_equivalent)


if __name__ == "__main__":
    run_tests()
