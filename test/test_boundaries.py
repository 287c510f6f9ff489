# Owner(s): ["module: fakeTensor"]
"""The package's layout: module boundaries and the import graph.

Each module of ``torch_cachepolicy`` offers what others need through public
names (a function, a property, a class without a leading underscore); modules
that are not the documented API are private (``_driver.py``). The boundary
test reads every module's source and reports any ``module._name``, ``from
module import _name``, ``obj._name`` or ``getattr(obj, "_name")`` where
``_name`` is private to another module of the package. Names torch defines (a
FakeTensorMode method the mode overrides, ``Tensor._grad``) are torch's, not
ours, and are checked by ``test_compat.py`` instead. The layout tests hold the
package to what the lean redesign's line budgets stood for: the documented API
as the only public modules, and no import cycle. ``TestSuiteLayout`` holds the
tests to theirs: helpers in ``cachepolicy_testing.py`` and ``zoo_ops.py``, never
in another test module, and the crosscheck on for every test class of the files
that compare a hit with an uncached dispatch.
"""

from __future__ import annotations

import ast
import pathlib
import textwrap
from collections.abc import Iterable, Mapping

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.testing._internal.common_utils import TestCase, run_tests

import torch_cachepolicy

PACKAGE = pathlib.Path(torch_cachepolicy.__file__).parent
EXTENSION = "torch_cachepolicy._C"
LOADER = "torch_cachepolicy._native"  # the one module that loads EXTENSION
REPO = PACKAGE.parent

# Classes of torch whose private attributes the package may use by name.
_TORCH_CLASSES: tuple[type, ...] = (
    torch.Tensor,
    FakeTensor,
    FakeTensorMode,
    torch._ops.OpOverload,
    torch._ops.HigherOrderOperator,
    torch._library.custom_ops.CustomOpDef,
    torch.fx.experimental.symbolic_shapes.ShapeEnv,
    torch._subclasses._fake_tensor_utils._CacheKeyState,
)


def torch_private_names() -> frozenset[str]:
    names = set()
    for cls in _TORCH_CLASSES:
        names.update(dir(cls))
    names.update(vars(FakeTensorMode()))
    return frozenset(n for n in names if _is_private(n))


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def package_sources() -> dict[str, str]:
    """``{module name: source}`` of every module of the package."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        name = ".".join(("torch_cachepolicy", *parts)).removesuffix(".__init__")
        out[name] = path.read_text()
    return out


def _defined(tree: ast.AST) -> set[str]:
    """Private names a module defines: top-level and class members, attributes it assigns, slots."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            out.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            if node.id == "__slots__":
                continue
            out.add(node.id)
        elif isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__slots__" for t in node.targets
        ):
            if isinstance(node.value, (ast.Tuple, ast.List)):
                out.update(e.value for e in node.value.elts if isinstance(e, ast.Constant))
    return {n for n in out if _is_private(n)}


def boundary_violations(sources: Mapping[str, str], torch_names: Iterable[str] = ()) -> list[str]:
    """Every read of another module's private name in ``sources``, as ``"module:line: what"``."""
    trees = {name: ast.parse(src) for name, src in sources.items()}
    defined = {name: _defined(tree) for name, tree in trees.items()}
    exempt = frozenset(torch_names)
    found = []
    for module, tree in trees.items():
        others = set().union(*(names for name, names in defined.items() if name != module)) - exempt
        own = defined[module]
        modules_by_alias: dict[str, str] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "torch_cachepolicy":
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    if full == EXTENSION:
                        if module != LOADER:
                            found.append(f"{module}:{node.lineno}: loads {EXTENSION} itself; ask {LOADER}")
                        continue
                    if full in trees:  # a module, private (_compat) or not
                        modules_by_alias[alias.asname or alias.name] = full
                    elif _is_private(alias.name):
                        found.append(f"{module}:{node.lineno}: imports {alias.name} from {node.module}")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name in trees:
                        modules_by_alias[alias.asname or alias.name] = alias.name
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "setattr", "hasattr")
                and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant)
                and isinstance(node.args[1].value, str)
                and node.args[1].value in others
                and node.args[1].value not in own
            ):
                found.append(f"{module}:{node.lineno}: reads {node.args[1].value} by name")
            if not isinstance(node, ast.Attribute) or not _is_private(node.attr):
                continue
            value = node.value
            if isinstance(value, ast.Name) and modules_by_alias.get(value.id, module) != module:
                found.append(f"{module}:{node.lineno}: reads {value.id}.{node.attr}")
            elif (
                node.attr in others
                and node.attr not in own
                and not (isinstance(value, ast.Name) and value.id in ("self", "cls"))
            ):
                found.append(f"{module}:{node.lineno}: reads {ast.unparse(value)}.{node.attr}")
    return found


class TestBoundaries(TestCase):
    def test_no_module_reads_another_modules_private_names(self) -> None:
        """Every module of the package uses only public names of the others."""
        self.assertEqual(boundary_violations(package_sources(), torch_private_names()), [])

    def test_scan_finds_each_kind_of_read(self) -> None:
        """The scan reports a private import, a module attribute, an object attribute of another module (also by name), and _C loaded elsewhere."""
        sources = {
            "torch_cachepolicy.a": textwrap.dedent(
                """
                _TABLE = {}
                class Store:
                    def __init__(self):
                        self._partitions = {}
                        self._grad = None
                """
            ),
            "torch_cachepolicy.b": textwrap.dedent(
                """
                from torch_cachepolicy import _C, a
                from torch_cachepolicy.a import _TABLE, Store
                def f(store: Store, t):
                    return a._TABLE, store._partitions, t._grad, store.public, getattr(store, "_partitions")
                """
            ),
        }
        self.assertExpectedInline(
            "\n".join(boundary_violations(sources, torch_names={"_grad"})),
            """\
torch_cachepolicy.b:2: loads torch_cachepolicy._C itself; ask torch_cachepolicy._native
torch_cachepolicy.b:3: imports _TABLE from torch_cachepolicy.a
torch_cachepolicy.b:5: reads a._TABLE
torch_cachepolicy.b:5: reads store._partitions
torch_cachepolicy.b:5: reads _partitions by name""",
        )

    def test_torch_names_are_not_ours(self) -> None:
        """A method the mode overrides is torch's name: reading it elsewhere is not a boundary violation."""
        self.assertIn("_output_from_cache_entry", torch_private_names())
        self.assertNotIn("_partitions", torch_private_names())


# The documented API (docs/api.md): the only modules without a leading underscore.
PUBLIC_MODULES = frozenset(
    {"__init__", "adopt", "export", "mode", "policy", "report", "store", "version", "recipes.__init__", "recipes.executorch"}
)


def runtime_imports(sources: Mapping[str, str]) -> dict[str, set[str]]:
    """``{module: the package modules it imports}``, leaving out imports under ``if TYPE_CHECKING:``."""
    graph: dict[str, set[str]] = {}
    for module, source in sources.items():
        tree = ast.parse(source)
        typing_only = {
            id(n)
            for stmt in ast.walk(tree)
            if isinstance(stmt, ast.If) and ast.unparse(stmt.test) == "TYPE_CHECKING"
            for n in ast.walk(stmt)
        }
        deps = set()
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("torch_cachepolicy"):
                # `from pkg import sub` imports sub (the package's __init__ runs
                # first for every module, so it is no edge of its own).
                names = [f"{node.module}.{a.name}" for a in node.names]
                deps.update(n if n in sources or node.module == "torch_cachepolicy" else node.module for n in names)
            elif isinstance(node, ast.Import):
                deps.update(a.name for a in node.names if a.name in sources)
        graph[module] = {d for d in deps if d in sources and d != module}
    return graph


def import_cycle(graph: Mapping[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` (``[a, b, a]``), or None."""
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> list[str] | None:
        for dep in sorted(graph[module]):
            if dep in path:
                return path[path.index(dep) :] + [dep]
            if dep not in done:
                cycle = visit(dep, [*path, dep])
                if cycle:
                    return cycle
        done.add(module)
        return None

    for module in sorted(graph):
        cycle = visit(module, [module])
        if cycle:
            return cycle
    return None


class TestLayout(TestCase):
    def test_public_modules_are_the_api(self) -> None:
        """Every module without a leading underscore is part of the documented API, and no more than ten."""
        public = {
            ".".join(p.relative_to(PACKAGE).with_suffix("").parts)
            for p in PACKAGE.rglob("*.py")
            if not p.name.startswith("_") or p.name == "__init__.py"
        }
        self.assertEqual(public, PUBLIC_MODULES)
        self.assertLessEqual(len(public), 10)

    def test_no_import_cycle(self) -> None:
        """The package's modules import each other without a cycle (imports for type checking aside)."""
        self.assertIsNone(import_cycle(runtime_imports(package_sources())))

    def test_cycle_finder_finds_a_cycle(self) -> None:
        """import_cycle reports a two-module cycle and passes a chain."""
        self.assertEqual(import_cycle({"a": {"b"}, "b": {"a"}}), ["a", "b", "a"])
        self.assertIsNone(import_cycle({"a": {"b"}, "b": set()}))


TESTS = REPO / "test"
# The files that compare a hit with an uncached dispatch: each test class runs with the crosscheck on (Note [Crosscheck
# in the tests] in cachepolicy_testing.py).
SAFETY_FILES = ("test_mode.py", "test_kernel_zoo.py", "test_fuzz.py", "test_symbols.py", "test_fidelity.py",
                "test_synth.py", "test_opinfo_crosscheck.py")  # fmt: skip
CROSSCHECKED_BASES = {"testing.CachePolicyTestCase", "zoo.ZooTestCase"}


def imported_test_modules(source: str) -> set[str]:
    """The ``test_*`` modules ``source`` imports, at any depth."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        found.update(n.split(".")[0] for n in names if n.split(".")[0].startswith("test_"))
    return found


def classes_without_crosscheck(source: str) -> list[str]:
    """The test classes of ``source`` (named ``Test*`` or based on a ``*TestCase``) that do not derive from a base
    with the crosscheck on, directly or through a class of the same file."""
    classes = [node for node in ast.walk(ast.parse(source)) if isinstance(node, ast.ClassDef)]
    crosschecked = set(CROSSCHECKED_BASES)
    for _ in classes:  # a class may derive from one defined before or after it
        crosschecked |= {c.name for c in classes if {ast.unparse(b) for b in c.bases} & crosschecked}
    return [
        c.name
        for c in classes
        if (c.name.startswith("Test") or any(ast.unparse(b).endswith("TestCase") for b in c.bases))
        and c.name not in crosschecked
    ]


class TestSuiteLayout(TestCase):
    def test_no_test_module_imports_another(self) -> None:
        """Helpers live in cachepolicy_testing.py and zoo_ops.py: no test module imports another."""
        found = {
            str(p.relative_to(TESTS)): sorted(imported_test_modules(p.read_text()))
            for p in sorted(TESTS.rglob("*.py"))
        }
        self.assertEqual({k: v for k, v in found.items() if v}, {})
        source = "import test_a\ndef f():\n    from test_b.x import y\n"
        self.assertEqual(imported_test_modules(source), {"test_a", "test_b"})

    def test_safety_files_crosscheck_every_class(self) -> None:
        """Every test class of the files comparing a hit with an uncached dispatch runs with the crosscheck on."""
        missing = {name: classes_without_crosscheck((TESTS / name).read_text()) for name in SAFETY_FILES}
        self.assertEqual({k: v for k, v in missing.items() if v}, {})
        source = "\n".join([
            "class A(TestCase): pass",
            "class B(testing.CachePolicyTestCase): pass",
            "class TestC(B): pass",
            "class D: pass",
        ])
        self.assertEqual(classes_without_crosscheck(source), ["A"])


if __name__ == "__main__":
    run_tests()
