# Owner(s): ["module: fakeTensor"]
"""Statements of README.md and docs/*.md that no other test checks, and the check that every statement is listed.

Each test names the statement it holds the code to. test/doc_statements.md lists every statement of README.md and of
each docs/*.md with the tests that check it (these and others), or marks it as shown by an executed code block
(test/test_docs.py runs the docs' code blocks, test/test_api_docs.py their API blocks); TestStatementList holds that
list to the docs and the tests, and fails on a paragraph, list item or table row of a doc that holds no listed
statement and is not listed as "not a statement".

docs/upstream/ is left out: it is the upstream patch series' own record. test/test_upstream_patch.py checks that its
patches apply to the installed torch and that their tests pass, and that docs/upstream/README.md's release table and
per-patch line counts match the patches; test/test_docs.py runs its ```python blocks. Its other prose is checked by
nothing.
"""

from __future__ import annotations

import ast
import importlib
import pathlib
import re
from typing import Any

import torch
from torch._guards import detect_fake_mode
from torch._subclasses.fake_tensor import DispatchCacheInfo
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

    def test_make_requires_the_helper(self) -> None:
        """README: `make` sets `USE_CPP=1` for every build of the helper, so that a failed build stops it."""
        recipes = (ROOT / "Makefile").read_text().replace("\\\n", " ").splitlines()  # continued lines joined
        builds = [
            line for line in recipes
            if line.startswith("\t") and ("install --quiet --no-build-isolation -e" in line or " build_ext " in line)
        ]
        self.assertEqual(len(builds), 3)  # .venv's install, a torch tier's install, the sanitizer build
        self.assertEqual([line for line in builds if "USE_CPP=1 " not in line], [])

    def test_layout_names_are_defined(self) -> None:
        """README's Layout: each class a row names is defined in one of that row's modules."""
        rows = re.findall(r"^\| (`torch_cachepolicy/.*?) \| (.*) \|$", (ROOT / "README.md").read_text(), re.M)
        self.assertGreater(len(rows), 20)
        missing = []
        for paths, what in rows:
            modules = [f.removeprefix("torch_cachepolicy/").removesuffix(".py").replace("/", ".")
                       for f in BACKTICKED.findall(paths) if f.startswith("torch_cachepolicy/")]
            for name in re.findall(r"`([A-Z]\w+)`", what):
                if f"stock's `{name}`" not in what and not any(hasattr(importlib.import_module(f"torch_cachepolicy.{m}"), name) for m in modules):
                    missing.append((paths, name))
        self.assertEqual(missing, [])

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
ruled = define("ruled(Tensor x) -> Tensor", lambda x: torch.empty_like(x))


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

    def assertBypassed(self, mode: tcp.FakeTensorMode, op: object, reason: str, times: int, first_sight: bool = False) -> None:
        """``times`` bypasses for ``reason``; with ``first_sight``, after the miss of the key's first sight."""
        row = mode.cache_report()[op]
        expected = (0, int(first_sight), {reason: times})
        self.assertEqual((row.hits, row.misses, row.bypasses), expected, msg=str(mode.cache_report()))

    def test_outputs_alias_each_other(self) -> None:
        """Two outputs sharing a storage: `outputs alias each other`."""
        mode = tcp.FakeTensorMode(cache_policy=self.policy())
        with mode:
            x = torch.empty(2)
            outs = [twins(x) for _ in range(3)]
        self.assertTrue(all(a.untyped_storage()._cdata == b.untyped_storage()._cdata for a, b in outs))
        self.assertBypassed(mode, twins, _reasons.OUTPUTS_ALIAS, 2, first_sight=True)

    def test_undeclared_alias(self) -> None:
        """An output on an input's storage without a schema alias annotation bypasses, with its own name."""
        mode = tcp.FakeTensorMode(cache_policy=self.policy())
        with mode:
            x = torch.empty(2, 3)
            outs = [undeclared_view(x) for _ in range(3)]
        self.assertEqual({o.untyped_storage()._cdata for o in outs}, {x.untyped_storage()._cdata})
        self.assertBypassed(mode, undeclared_view, _reasons.UNDECLARED_ALIAS, 2, first_sight=True)

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
            for _ in range(3):
                fresh(x)
        self.assertBypassed(mode, fresh, "a hit could not rebuild the output (RuntimeError)", 2, first_sight=True)

    def test_entry_builder_cannot_describe(self) -> None:
        """An output torch's entry builder cannot describe (a dtype) bypasses instead of failing the dispatch."""
        mode = tcp.FakeTensorMode(cache_policy=self.policy())
        with mode:
            x = torch.empty(3)
            outs = [dtype_of(x) for _ in range(3)]
        self.assertEqual(outs, [outs[0]] * 3)
        [(reason, n)] = mode.cache_report()[dtype_of].bypasses.items()
        self.assertEqual((n, mode.cache_report()[dtype_of].misses), (2, 1))  # after the key's first sight
        self.assertTrue(reason.startswith("torch's entry builder cannot describe the output ("), msg=reason)

    def test_proxy_mode_with_symnode_output(self) -> None:
        """A bare SymInt output while a proxy mode traces: `Proxy mode with SymNode output`."""
        mode = tcp.FakeTensorMode(cache_policy=self.policy(), shape_env=ShapeEnv())
        x = mode.from_tensor(
            torch.empty(5, 2),
            symbolic_context=StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC, DimDynamic.STATIC]),
        )
        with mode, _ProxySlot():
            for _ in range(3):
                mode.dispatch(size0, (), (x,), {})
        self.assertBypassed(mode, size0, _reasons.PROXY_SYMNODE, 2, first_sight=True)

    def test_mutating_op_bypasses_unless_allowed_by_name(self) -> None:
        """A Tensor(a!) op: `mutates an argument (allow it with register_op)`, cached once allowed by name."""
        # Three calls: the key's first sight, then the miss that finds the mutation or makes the entry, then its use.
        for policy, expected in ((self.policy(), (0, 1, {_reasons.MUTATES: 2})), (self.policy(allow=[fill]), (1, 2, {}))):
            mode = tcp.FakeTensorMode(cache_policy=policy)
            with mode:
                x = torch.empty(3)
                for _ in range(3):
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
            shapes = [tuple(by_leaf(t).shape) for t in (leaf, non_leaf) * 3]
        self.assertEqual(shapes, [(1,), (2,)] * 3)
        row = mode.cache_report()[by_leaf]
        self.assertEqual((row.hits, row.misses, row.bypasses), (2, 4, {}))

    def test_no_fake_kernel_for_static_inputs(self) -> None:
        """An op admitted for its decomposition alone bypasses on a static miss, where the Meta backend fallback ran."""
        torch._decomp.decomposition_table[touch] = lambda x: None
        self.addCleanup(torch._decomp.decomposition_table.pop, touch)
        policy = tcp.CachePolicy(allow=[touch])  # by name: it mutates its argument
        self.assertTrue(policy.is_cacheable(touch))
        mode = tcp.FakeTensorMode(cache_policy=policy)
        with mode:
            x = torch.empty(3)
            for _ in range(3):
                touch(x)
        self.assertBypassed(mode, touch, _reasons.BACKEND_FALLBACK, 2, first_sight=True)

    def test_propagate_real_tensors(self) -> None:
        """Under `propagate_real_tensors` aten ops behave as under stock (backend ops: test_fidelity)."""
        mode = tcp.FakeTensorMode(cache_policy=self.policy(), cache_crosscheck=False)
        mode.propagate_real_tensors = True  # set after construction, stock's mode still caches aten ops
        with mode:
            x = torch.empty(2, 13)
            for _ in range(2):
                torch.ops.aten.cosh.default(x)
        row = mode.cache_report()[torch.ops.aten.cosh.default]
        self.assertEqual((row.hits, row.misses, row.bypasses), (1, 1, {}))

    def test_class_rule_is_not_counted(self) -> None:
        """An op a rule for the FakeTensorMode class replaces runs that rule, uncached and not counted."""
        calls = []

        def rule(mode: Any, func: Any, types: Any, args: Any, kwargs: Any) -> torch.Tensor:
            calls.append(func)
            return mode.from_tensor(torch.empty(3, dtype=torch.int8))

        with torch.library._scoped_library(NS, "FRAGMENT") as lib:
            torch.library.register_torch_dispatch(ruled, StockFakeTensorMode, rule, lib=lib)
            mode = tcp.FakeTensorMode(cache_policy=self.policy())
            with mode:
                outs = [ruled(torch.empty(2)) for _ in range(2)]
        self.assertEqual((len(calls), outs[1].dtype), (2, torch.int8))
        with self.assertRaises(KeyError):
            mode.cache_report()[ruled]

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


# ------------------------------------------------------------------ guide.md: own the mode, read the report


class TestGuideCacheApi(TestCase):
    """docs/guide.md, "Exporter authors": the cache API of a mode and of the class."""

    def policy(self) -> tcp.CachePolicy:
        return tcp.CachePolicy(namespaces=[NS])

    def test_cache_info_is_torchs_type(self) -> None:
        """`mode.cache_info()` is torch's `DispatchCacheInfo` for this instance."""
        self.assertIsInstance(tcp.FakeTensorMode().cache_info(), DispatchCacheInfo)

    def test_instance_clear_leaves_torchs_storage(self) -> None:
        """`mode.cache_clear()` leaves torch's storage alone: another mode hits the aten entry it made."""
        a, b = tcp.FakeTensorMode(), tcp.FakeTensorMode()
        with a:
            torch.empty(3, 29).cosh()
        a.cache_clear()
        with b:
            torch.empty(3, 29).cosh()
        row = b.cache_report()[torch.ops.aten.cosh.default]
        self.assertEqual((row.hits, row.misses), (1, 0))

    def test_class_clear_clears_live_policy_modes(self) -> None:
        """`tcp.FakeTensorMode.cache_clear()` resets every live policy mode's counters and entries."""
        mode = tcp.FakeTensorMode(cache_policy=self.policy())
        with mode:
            x = torch.empty(3)
            fresh(x), fresh(x)
        tcp.FakeTensorMode.cache_clear()
        self.assertEqual((mode.cache_info().hits, mode.cache_info().misses, len(mode.cache_store)), (0, 0, 0))
        with mode:
            fresh(x)
        self.assertEqual(mode.cache_report()[fresh].misses, 1)

    def test_switching_policy_keeps_old_entries(self) -> None:
        """`mode.cache_policy = other` switches policy; the old policy's entries stay in their own partition."""
        first, other = self.policy(), tcp.CachePolicy(namespaces=[NS], deny=[twins])
        mode = tcp.FakeTensorMode(cache_policy=first)
        with mode:
            x = torch.empty(3)
            for policy in (first, first, other, first):  # first's entry is made on its second call
                mode.cache_policy = policy
                fresh(x)
        row = mode.cache_report()[fresh]
        self.assertEqual((row.hits, row.misses), (1, 3))


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

    def test_subclass_of_torchs_mode(self) -> None:
        """FakeTensorMode is a subclass of torch's; `**kwargs` go to its constructor."""
        mode = tcp.FakeTensorMode(allow_non_fake_inputs=True, static_shapes=True)
        self.assertIsInstance(mode, StockFakeTensorMode)
        self.assertEqual((mode.allow_non_fake_inputs, mode.static_shapes), (True, True))

    def test_cache_policy_none_installs_the_default(self) -> None:
        """Assigning None to FakeTensorMode.cache_policy installs CachePolicy()."""
        mode = tcp.FakeTensorMode(cache_policy=tcp.CachePolicy(namespaces=[NS]))
        mode.cache_policy = None  # type: ignore[assignment]
        self.assertTrue(mode.cache_policy.is_stock_equivalent)


# ------------------------------------------------------------------ exporters.md, executorch.md, reliability.md

EXECUTORCH_MD = ROOT / "docs" / "executorch.md"


def makefile_recipe(target: str) -> str:
    """The recipe of a Makefile target, continued lines joined."""
    text = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    return text[text.index(f"\n{target}:") + 1 :].split("\n\n")[0]


def doc_table(doc: pathlib.Path, header: str) -> list[list[str]]:
    """The rows of the table of ``doc`` whose header row starts with ``header``, as lists of cells."""
    text = doc.read_text()
    table = text[text.index(header) :].split("\n\n")[0].splitlines()[2:]
    return [[cell.strip() for cell in row.strip("|").split(" | ")] for row in table]


def fake_values(program: torch.export.ExportedProgram) -> list[Any]:
    """The FakeTensors of the nodes' ``val`` metadata."""
    return [n.meta["val"] for n in program.graph_module.graph.nodes if isinstance(n.meta.get("val"), torch.Tensor)]


class TestExportersDoc(TestCase):
    def test_programs_derived_before_adopt(self) -> None:
        """exporters.md: a program derived before `adopt` keeps the old mode but for the values it shares with `program`,
        which move; one derived after uses the policy mode."""
        ep = torch.export.export(torch.nn.Linear(4, 2), (torch.randn(3, 4),))
        old = detect_fake_mode([n.meta["val"] for n in ep.graph_module.graph.nodes if n.op == "placeholder"])
        before = ep.run_decompositions()
        shared = {id(v) for v in fake_values(ep)}
        mode = tcp.adopt(ep)
        after = ep.run_decompositions()
        own = {id(v.fake_mode) for v in fake_values(before) if id(v) not in shared}
        moved = {id(v.fake_mode) for v in fake_values(before) if id(v) in shared}
        self.assertEqual((own, moved), ({id(old)}, {id(mode)}))  # a mixed program: adopt before deriving any
        self.assertEqual({id(v.fake_mode) for v in fake_values(after)}, {id(mode)})


class TestExecutorchDoc(TestCase):
    def test_pinned_versions_and_install(self) -> None:
        """executorch.md: ExecuTorch 1.5.1 with torch 2.13.0, installed --no-deps, `make test-executorch` runs test/integration."""
        self.assertIn("Checked against ExecuTorch 1.5.1 with torch 2.13.0", squash(EXECUTORCH_MD.read_text()))
        self.assertRegex((ROOT / "requirements-executorch.txt").read_text(), r"(?m)^executorch==1\.5\.1$")
        self.assertIn("MAIN_TORCH := 2.13.0", (ROOT / "Makefile").read_text())
        recipe = makefile_recipe("test-executorch")
        self.assertIn("install --quiet --no-deps -r requirements-executorch.txt", recipe)
        self.assertIn("-m pytest -q test/integration", recipe)

    def test_flow_table_is_the_benchmarks_flows(self) -> None:
        """executorch.md's flow table names exactly the benchmark's flows, each with its backend namespaces."""
        from benchmarks.executorch.flows import FLOWS

        rows = doc_table(EXECUTORCH_MD, "| flow (`--flow`) |")
        table = {row[0].strip("`"): tuple(BACKTICKED.findall(row[3])) for row in rows}
        self.assertEqual(table, {name: flow.backend_namespaces for name, flow in FLOWS.items()})

    def test_measuring_commands(self) -> None:
        """executorch.md's Measuring table: each make target runs the stated flags and writes the stated JSON."""
        rows = doc_table(EXECUTORCH_MD, "| command | writes |")
        self.assertEqual(len(rows), 3)
        for command, writes in rows:
            target = re.match(r"`make ([\w-]+)`", command)[1]  # type: ignore[index]
            recipe = squash(makefile_recipe(target))
            flags = re.findall(r"--[\w-]+(?: [a-z0-9-]+)?", command.split("(", 1)[1])
            flags = [f for f in flags if not f.startswith("--flow")] + re.findall(r"(?<=\()--flow \w+", command)
            for flag in flags:
                self.assertIn(flag, recipe, msg=target)
            for flow in ("ethos-u55", "large") if "Ethos-U55, large" in command else ():
                self.assertIn(flow, recipe, msg=target)
            stem = re.match(r"`(bench-results/[\w-]+)\.\{json,md\}`", writes)[1]  # type: ignore[index]
            self.assertIn(f"--json {stem}.json", recipe, msg=target)

    def test_exported_module_gets_a_guards_call_module(self) -> None:
        """executorch.md: on torch 2.13 `ExportedProgram.module()` adds a `_guards_fn` call_module; the benchmark drops it."""
        ep = torch.export.export(torch.nn.Linear(4, 2), (torch.randn(3, 4),))
        targets = [n.target for n in ep.module().graph.nodes if n.op == "call_module"]
        self.assertIn("_guards_fn", targets)
        unguarded = ep.module(check_guards=False)
        self.assertNotIn("_guards_fn", [n.target for n in unguarded.graph.nodes if n.op == "call_module"])
        self.assertIn("check_guards=False", (ROOT / "benchmarks" / "executorch" / "lowering.py").read_text())

    def test_export_pass_without_fake_inputs_makes_a_mode(self) -> None:
        """executorch.md: ExecuTorch's `ExportPass.call` creates a fresh mode when no graph input is a FakeTensor."""
        import inspect

        try:
            from executorch.exir.pass_base import ExportPass
        except ImportError:
            self.skipTest("needs ExecuTorch (make test-executorch)")
        source = squash(inspect.getsource(ExportPass.call))
        self.assertIn("if fake_tensor_mode is None: fake_tensor_mode = FakeTensorMode(", source)

    def test_a_loaded_program_has_its_own_mode(self) -> None:
        """executorch.md: deserializing a program creates a fake mode (so a loaded program is adopted again)."""
        import io

        ep = torch.export.export(torch.nn.Linear(4, 2), (torch.randn(3, 4),))
        mode = tcp.adopt(ep)
        buffer = io.BytesIO()
        torch.export.save(ep, buffer)
        buffer.seek(0)
        loaded = torch.export.load(buffer)
        found = detect_fake_mode([n.meta["val"] for n in loaded.graph_module.graph.nodes if n.op == "placeholder"])
        self.assertIsNotNone(found)
        self.assertIsNot(found, mode)
        self.assertNotIsInstance(found, tcp.FakeTensorMode)


class TestReliabilityDoc(TestCase):
    def test_opdb_sweep_switches(self) -> None:
        """reliability.md: the op_db sweep takes two samples per op and dtype, every one with TCP_FULL_OPDB=1, and
        shards by TCP_OPDB_SHARD=i/n; benchmarks.opdb_sweep takes --full."""
        source = (ROOT / "test" / "test_opinfo_crosscheck.py").read_text()
        self.assertIn('FULL = os.environ.get("TCP_FULL_OPDB") == "1"', source)
        self.assertIn("SAMPLES_PER_OP = None if FULL else 2", source)
        self.assertIn('os.environ.get("TCP_OPDB_SHARD", "0/1").split("/")', source)
        self.assertIn('"--full"', (ROOT / "benchmarks" / "opdb_sweep.py").read_text())

    def test_sanitizer_build(self) -> None:
        """reliability.md: `make test-sanitizers` builds with address and undefined sanitizers into build-sanitizers/lib,
        preloads libasan and libubsan with PYTHONMALLOC=malloc; `make test` runs it."""
        makefile = (ROOT / "Makefile").read_text()
        self.assertIn("SAN_DIR := build-sanitizers", makefile)
        self.assertIn("SAN_CFLAGS := -fsanitize=address,undefined", makefile)
        self.assertIn('LD_PRELOAD="$$(gcc -print-file-name=libasan.so):$$(gcc -print-file-name=libubsan.so)"', makefile)
        self.assertIn("PYTHONMALLOC=malloc", makefile)
        self.assertIn("test-sanitizers", makefile_recipe("test").splitlines()[0])

    def test_peer_suite_is_a_script_with_process_scope_by_default(self) -> None:
        """reliability.md: test/peer_suite.py is not collected by pytest, loads itself as a plugin, --scope defaults to process."""
        source = (ROOT / "test" / "peer_suite.py").read_text()
        self.assertFalse(pathlib.Path("peer_suite.py").name.startswith("test_"))
        self.assertIn('"-p",', source)
        self.assertRegex(source, r'"--scope",\s*choices=\("process", "module", "instances"\),\s*default="process"')
        self.assertRegex(source, r'"--class-api",\s*choices=\("raw", "aggregate"\)')


# ------------------------------------------------------------------ test/doc_statements.md

STATEMENTS = ROOT / "test" / "doc_statements.md"
EXECUTED = "executed block (test/test_docs.py)"
NOT_A_STATEMENT = "not a statement"
TABLE_ROW = re.compile(r"^\| (.+?) \| (.+?) \|$", re.M)
SEPARATOR = re.compile(r"^\|( *:?-+:? *\|)+$")
LINKS_ONLY = re.compile(r"^(\[[^\]]*\]\([^)]*\)[\s,.;]*)+$")
ITEM = re.compile(r"^\s*(?:[-*]|\d+\.) ")


def listed_docs() -> list[str]:
    """The docs test/doc_statements.md must cover: README.md and every docs/*.md (not docs/upstream/)."""
    return ["README.md", *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md"))]


def sections() -> dict[str, tuple[list[tuple[str, list[str]]], list[str]]]:
    """``{doc: (statements, not_statements)}`` from test/doc_statements.md, one ``## doc`` section per doc.

    statements are ``(excerpt, [checked by, ...])`` rows of the ``| statement | checked by |`` table; not_statements
    the excerpts of the ``| not a statement | why |`` table. An excerpt writes a doc's ``|`` as ``\\|``.
    """
    found: dict[str, tuple[list[tuple[str, list[str]]], list[str]]] = {}
    for section in STATEMENTS.read_text().split("\n## ")[1:]:
        doc, _, body = section.partition("\n")
        statements: list[tuple[str, list[str]]] = []
        not_statements: list[str] = []
        table = None
        for excerpt, second in TABLE_ROW.findall(body):
            excerpt = excerpt.replace("\\|", "|")  # a doc's table cells, quoted across a `|`
            if (excerpt, second) in (("statement", "checked by"), (NOT_A_STATEMENT, "why")):
                table = excerpt
            elif excerpt != "---":
                if table == NOT_A_STATEMENT:
                    not_statements.append(excerpt)
                else:
                    statements.append((excerpt, second.split(", ")))
        found[doc.strip()] = (statements, not_statements)
    return found


def listed() -> dict[str, list[tuple[str, list[str]]]]:
    """``{doc: [(excerpt, [checked by, ...])]}``: the statement rows of test/doc_statements.md."""
    return {doc: statements for doc, (statements, _) in sections().items()}


def squash(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def units(text: str) -> list[str]:
    """A doc's paragraphs, list items and table rows (whitespace collapsed), without headings, fenced blocks, HTML
    comments, tables' header rows and units that are only links."""
    found: list[str] = []
    lines: list[str] = []
    fenced = False

    def close() -> None:
        unit = squash(" ".join(lines))
        if unit and not LINKS_ONLY.match(unit):
            found.append(unit)
        lines.clear()

    text_lines = text.splitlines()
    for i, line in enumerate(text_lines):
        stripped = line.strip()
        if stripped.startswith("```"):
            close()
            fenced = not fenced
        elif fenced:
            continue
        elif not stripped or stripped.startswith(("#", "<!--")):
            close()
        elif stripped.startswith("|"):
            close()
            following = text_lines[i + 1].strip() if i + 1 < len(text_lines) else ""
            if not (SEPARATOR.match(stripped) or SEPARATOR.match(following)):
                found.append(squash(stripped))
        else:
            if ITEM.match(line):
                close()
            lines.append(stripped)
    close()
    return found


RESULTS = ROOT / "benchmarks" / "results"


class TestPerformanceRecords(TestCase):
    """docs/performance.md's measured figures are the committed runs' (benchmarks/results/)."""

    def test_first_pass_table_is_the_recorded_runs(self) -> None:
        """Each row of the first-pass table equals its file's medians (policy+qdq), rounds included."""
        import json

        text = (ROOT / "docs" / "performance.md").read_text()
        rows = re.findall(r"^\| [^|]*\(`([\w-]+\.json)`[^|]*\| (\d+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|$", text, re.M)
        self.assertEqual(len(rows), 6)
        for name, rounds, *figures in rows:
            run = json.loads((RESULTS / "first-pass" / name).read_text())
            stock, patch = run["ratio_to_stock_median"]["policy+qdq"], run["ratio_to_global_patch_median"]["policy+qdq"]
            expected = [stock[0], stock[1], stock[2], patch[2]]
            self.assertEqual((int(rounds), [float(f) for f in figures]), (run["rounds"], [round(x, 3) for x in expected]))
        second = {n: json.loads((RESULTS / "first-pass" / n).read_text()) for n, *_ in rows}
        static = [r["ratio_to_global_patch_median"]["policy+qdq"][1] for r in second.values() if not r["shape_env"]]
        symbolic = [r["ratio_to_global_patch_median"]["policy+qdq"][1] for r in second.values() if r["shape_env"]]
        self.assertIn(f"{min(static):.2f}-{max(static):.2f} of the global patch's with static inputs ({symbolic[0]:.2f}",
                      squash(text))

    def test_executorch_table_is_the_recorded_run(self) -> None:
        """Each flow's row holds executorch-tiny.json's CPU medians of per-round ratios."""
        import json

        text = (ROOT / "docs" / "performance.md").read_text()
        flows = json.loads((RESULTS / "executorch" / "executorch-tiny.json").read_text())["flows"]
        for flow, run in flows.items():
            ratios = run["ratios"]
            figures = [ratios[r]["cpu"]["median"] for r in ("policy/stock", "global-patch/stock", "policy/global-patch")]
            self.assertIn(f"| {flow} | " + " | ".join(f"{x:.3f}" for x in figures) + " |", text)

    def test_census_tables_are_the_recorded_run(self) -> None:
        """performance.md holds entry-kinds.md's table; design.md's totals are its sums and its savings its cells."""
        import json

        census = RESULTS / "census"
        performance = (ROOT / "docs" / "performance.md").read_text()
        table = [line for line in (census / "entry-kinds.md").read_text().splitlines() if line.startswith("| ")]
        self.assertGreater(len(table), 8)
        self.assertEqual([line for line in table if line not in performance], [])
        design = (ROOT / "docs" / "design.md").read_text()
        totals: dict[str, list[int]] = {}
        for run in json.loads((census / "entry-kinds.json").read_text())["workloads"].values():
            for kind in ("aten", "backend", "context", "symbolic"):
                total = totals.setdefault(kind, [0, 0])
                total[0] += run["counts"]["created"].get(kind, 0)
                total[1] += run["counts"]["hits"].get(kind, 0)
        rows = dict(re.findall(r"^\| (aten|backend|context|symbolic)[^|]* \| ([\d,]+ / [\d,]+) \|", design, re.M))
        found = {kind: rows.get(kind) for kind in totals}
        self.assertEqual(found, {kind: f"{c:,} / {h:,}" for kind, (c, h) in totals.items()})
        cells = "\n".join(table)
        for saving in re.findall(r"^\| (?:aten|backend|context|symbolic)[^|]* \| [\d,]+ / [\d,]+ \| [^|]*?([\d.]+)%", design, re.M):
            self.assertIn(f"{saving}% (", cells)

    def test_misscost_figures_are_the_recorded_runs(self) -> None:
        """The per-sight ratios the page quotes are misscost.json's and misscost-se.json's."""
        import json

        text = squash((ROOT / "docs" / "performance.md").read_text())
        for name in ("misscost.json", "misscost-se.json"):
            ratios = json.loads((RESULTS / "first-pass" / name).read_text())["policy_over_stock_median"]
            for ratio in ratios:
                self.assertIn(f"{ratio:.3f}", text, name)
        for name in ("misscost-profile-2cbaac0.txt", "misscost-profile-after.txt"):
            self.assertIn("cumtime", (RESULTS / "first-pass" / name).read_text())


class TestStatementList(TestCase):
    def test_sections_are_the_docs(self) -> None:
        """test/doc_statements.md has one section per doc: README.md and every docs/*.md, nothing else."""
        found = sections()
        self.assertEqual(set(found) ^ set(listed_docs()), set(), msg="a doc without a section, or a section without a doc")
        self.assertEqual([doc for doc, (rows, _) in found.items() if not rows], [])

    def test_excerpts_are_in_their_doc(self) -> None:
        """Every excerpt is a verbatim piece of its doc (whitespace collapsed), 15 to 120 characters long, or a whole
        unit of it."""
        bad = []
        for doc, (rows, not_statements) in sections().items():
            text = squash((ROOT / doc).read_text())
            whole = set(units((ROOT / doc).read_text()))
            for excerpt in [e for e, _ in rows] + not_statements:
                if squash(excerpt) not in text or not (15 <= len(excerpt) <= 120 or squash(excerpt) in whole):
                    bad.append((doc, excerpt))
        self.assertFalse(bad, msg="\n".join(f"{doc}: {excerpt}" for doc, excerpt in bad))

    def test_every_unit_is_listed(self) -> None:
        """Every paragraph, list item and table row of a doc holds a listed statement or a listed "not a statement"."""
        uncovered = []
        for doc, (rows, not_statements) in sections().items():
            excerpts = [squash(e) for e, _ in rows] + [squash(e) for e in not_statements]
            uncovered += [(doc, u) for u in units((ROOT / doc).read_text()) if not any(e in u for e in excerpts)]
        self.assertFalse(uncovered, msg="no listed statement (list one, or a not-a-statement if it states nothing):\n"
                         + "\n".join(f"{doc}: {unit}" for doc, unit in uncovered))

    def test_checking_tests_exist(self) -> None:
        """Every test a row names exists: its file, its class, and the method (a parametrized test's def) on it."""
        methods: dict[tuple[str, str], set[str]] = {}
        missing = []
        for doc, rows in listed().items():
            for excerpt, checks in rows:
                for check in checks:
                    if check == EXECUTED:
                        continue
                    path, cls, name = (check.split("::") + ["", ""])[:3]
                    if (path, cls) not in methods and (ROOT / path).is_file():
                        for node in ast.parse((ROOT / path).read_text()).body:
                            if isinstance(node, ast.ClassDef):
                                methods[(path, node.name)] = {f.name for f in node.body if isinstance(f, ast.FunctionDef)}
                    if name not in methods.get((path, cls), set()):
                        missing.append((doc, excerpt, check))
        self.assertEqual(missing, [])


if __name__ == "__main__":
    run_tests()
