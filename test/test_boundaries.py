"""Module boundaries of the package: no module reads another module's private names.

Each module of ``torch_cachepolicy`` offers what others need through public
names (a function, a property, a class without a leading underscore); the
hit path caches such a read once where it needs a plain attribute. This test
reads every module's source and reports any ``module._name``, ``from module
import _name`` or ``obj._name`` where ``_name`` is private to another module
of the package. Names torch defines (a FakeTensorMode method the mode
overrides, ``Tensor._grad``) are torch's, not ours, and are checked by
``test_compat.py`` instead.
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
LOADER = "torch_cachepolicy.native"  # the one module that loads EXTENSION

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
        """The scan reports a private import, a module attribute, an object attribute of another module, and _C loaded elsewhere."""
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
                    return a._TABLE, store._partitions, t._grad, store.public
                """
            ),
        }
        self.assertExpectedInline(
            "\n".join(boundary_violations(sources, torch_names={"_grad"})),
            """\
torch_cachepolicy.b:2: loads torch_cachepolicy._C itself; ask torch_cachepolicy.native
torch_cachepolicy.b:3: imports _TABLE from torch_cachepolicy.a
torch_cachepolicy.b:5: reads a._TABLE
torch_cachepolicy.b:5: reads store._partitions""",
        )

    def test_torch_names_are_not_ours(self) -> None:
        """A method the mode overrides is torch's name: reading it elsewhere is not a boundary violation."""
        self.assertIn("_output_from_cache_entry", torch_private_names())
        self.assertNotIn("_partitions", torch_private_names())


if __name__ == "__main__":
    run_tests()
