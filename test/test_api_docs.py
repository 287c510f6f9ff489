# Owner(s): ["module: fakeTensor"]
"""docs/api.md documents every public name, with the signatures and docstrings the code has.

Format (see the top of docs/api.md): a heading ``## `Name` `` per name of
``torch_cachepolicy.__all__`` and ``### `Class.member` `` per member, each
followed by a ```text block whose first line is the signature as
``str(inspect.signature(...))`` prints it (``property Class.name -> 'T'`` plus a
``setter(...)`` line for properties, ``class Name(Bases)`` for classes without
a signature, ``NAME = value`` for constants) and whose remainder, after a blank
line, is the docstring exactly as ``inspect.cleandoc`` gives it.
"""

from __future__ import annotations

import inspect
import pathlib
import re
from typing import Any

from torch.testing._internal.common_utils import TestCase, instantiate_parametrized_tests, parametrize, run_tests

import torch_cachepolicy as tcp
import torch_cachepolicy.recipes.executorch as executorch_recipe

API_MD = pathlib.Path(__file__).resolve().parent.parent / "docs" / "api.md"
HEADING = re.compile(r"^(#{2,3}) `([^`]+)`\s*$", re.M)
TEXT_BLOCK = re.compile(r"^```text\n(.*?)^```\s*$", re.S | re.M)
# Special methods that count as API when the class defines them with a docstring.
DOCUMENTED_DUNDERS = ("__len__", "__getitem__", "__str__", "__iter__", "__contains__", "__call__")


def sections() -> dict[str, tuple[int, str | None]]:
    """``{dotted name: (heading level, first text block or None)}``, in file order."""
    text = API_MD.read_text()
    found: dict[str, tuple[int, str | None]] = {}
    heads = list(HEADING.finditer(text))
    for i, m in enumerate(heads):
        end = heads[i + 1].start() if i + 1 < len(heads) else len(text)
        block = TEXT_BLOCK.search(text, m.end(), end)
        if m.group(2) in found:
            raise AssertionError(f"docs/api.md documents {m.group(2)} twice")
        found[m.group(2)] = (len(m.group(1)), None if block is None else block.group(1).rstrip("\n"))
    return found


def docstring(obj: object) -> str:
    """The object's own docstring (never one inherited from a base class)."""
    doc = getattr(obj, "__doc__", None)
    return "" if not doc else inspect.cleandoc(doc)


def is_api_member(cls: type, name: str, raw: object) -> bool:
    if name.startswith("_") and name not in DOCUMENTED_DUNDERS:
        return False
    if isinstance(raw, property):
        return bool(docstring(raw))
    if isinstance(raw, (classmethod, staticmethod)):
        return bool(docstring(raw.__func__))
    raw = getattr(raw, "__wrapped__", raw)
    return inspect.isfunction(raw) and bool(docstring(raw))


# The public modules, by the prefix their names carry in docs/api.md's headings; each one's __all__ is its API.
PUBLIC_MODULES: dict[str, Any] = {"": tcp, "recipes.executorch.": executorch_recipe}


def public_names() -> list[str]:
    """Every public name, with its module's prefix."""
    return [prefix + name for prefix, module in PUBLIC_MODULES.items() for name in module.__all__]


def required_names() -> list[str]:
    """Every public name, and every member with a docstring that a public class defines itself."""
    names = []
    for name in public_names():
        names.append(name)
        obj = _resolve(name)
        if inspect.isclass(obj):
            names += [f"{name}.{m}" for m, raw in vars(obj).items() if is_api_member(obj, m, raw)]
    return names


def _resolve(public: str) -> Any:
    prefix = max((p for p in PUBLIC_MODULES if public.startswith(p)), key=len)
    return getattr(PUBLIC_MODULES[prefix], public.removeprefix(prefix))


def expected_block(dotted: str) -> str:
    """What the text block of ``dotted`` must say, derived from the code."""
    prefix = max((p for p in PUBLIC_MODULES if dotted.startswith(p)), key=len)
    top, _, member = dotted.removeprefix(prefix).partition(".")
    if top not in PUBLIC_MODULES[prefix].__all__:
        raise AssertionError(f"docs/api.md documents {prefix}{top}, which is not in a public module's __all__")
    obj: Any = getattr(PUBLIC_MODULES[prefix], top)
    top = prefix + top
    if not member:
        if not inspect.isclass(obj) and not inspect.isfunction(obj):
            return f"{top} = {obj!r}"  # compared by value, see test_block_matches_code
        try:
            head = top + str(inspect.signature(obj))
        except ValueError:
            head = f"class {top}({', '.join(b.__name__ for b in obj.__bases__)})"
        return _with_doc([head], obj)
    try:
        raw = inspect.getattr_static(obj, member)
    except AttributeError:
        raise AssertionError(f"docs/api.md documents {dotted}, which does not exist") from None
    if isinstance(raw, property):
        lines = [f"property {dotted}" + str(inspect.signature(raw.fget)).removeprefix("(self)")]
        if raw.fset is not None:
            lines.append("setter" + str(inspect.signature(raw.fset)))
        return _with_doc(lines, raw)
    func = raw.__func__ if isinstance(raw, (classmethod, staticmethod)) else getattr(raw, "__wrapped__", raw)
    if not callable(func):
        raise AssertionError(f"docs/api.md documents {dotted}, which is neither a method nor a property")
    # A method also callable on the class (mode._AlsoOnTheClass) is documented by its instance method.
    also_on_class = hasattr(raw, "__wrapped__") and not isinstance(raw, (classmethod, staticmethod))
    signed = func if also_on_class else getattr(obj, member)
    return _with_doc([dotted + str(inspect.signature(signed))], func)


def _with_doc(lines: list[str], obj: object) -> str:
    doc = docstring(obj)
    return "\n".join(lines) + (f"\n\n{doc}" if doc else "")


SECTIONS = sections()


class TestApiDocs(TestCase):
    def test_every_public_name_is_documented(self) -> None:
        """Each name of the public modules' __all__ has a top-level heading, and no other name does."""
        top = [name for name, (level, _) in SECTIONS.items() if level == 2]
        self.assertEqual(sorted(top), sorted(public_names()))

    def test_every_documented_member_is_listed(self) -> None:
        """Each public method or property with a docstring, of each public class, has a heading."""
        missing = [name for name in required_names() if name not in SECTIONS]
        self.assertEqual(missing, [], msg="add these to docs/api.md")

    def test_member_headings_are_nested_under_their_class(self) -> None:
        """A member heading is level 3 and comes after its class's heading."""
        order = list(SECTIONS)
        for name, (level, _) in SECTIONS.items():
            prefix = max((p for p in PUBLIC_MODULES if name.startswith(p)), key=len)
            if "." in name.removeprefix(prefix):
                cls = prefix + name.removeprefix(prefix).split(".")[0]
                self.assertEqual(level, 3, msg=name)
                self.assertIn(cls, SECTIONS, msg=name)
                self.assertLess(order.index(cls), order.index(name), msg=name)

    @parametrize("name", list(SECTIONS), name_fn=lambda name: re.sub(r"\W", "_", name))
    def test_block_matches_code(self, name: str) -> None:
        """The entry's text block gives the code's signature and docstring."""
        block = SECTIONS[name][1]
        self.assertIsNotNone(block, msg=f"{name} has no ```text block")
        assert block is not None
        expected = expected_block(name)
        obj = getattr(tcp, name.split(".")[0])
        if "." not in name and not inspect.isclass(obj) and not inspect.isfunction(obj):
            lhs, sep, rhs = block.partition(" = ")
            self.assertEqual((lhs, sep), (name, " = "))
            self.assertEqual(eval(rhs, {"frozenset": frozenset}), obj)
            return
        self.assertEqual(block.splitlines()[0], expected.splitlines()[0], msg="signature differs")
        self.assertEqual(block, expected, msg="docstring differs from the code's")


instantiate_parametrized_tests(TestApiDocs)

if __name__ == "__main__":
    run_tests()
