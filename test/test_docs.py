# Owner(s): ["module: fakeTensor"]
"""Every ```python block in README.md and docs/ runs, so the docs cannot rot."""

from __future__ import annotations

import inspect
import pathlib
import re
import runpy
import tempfile

from torch.testing._internal.common_utils import TestCase, instantiate_parametrized_tests, parametrize, run_tests

from torch_cachepolicy import _reasons

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def blocks() -> list[tuple[str, str]]:
    found = []
    for path in DOCS:
        for i, match in enumerate(BLOCK.finditer(path.read_text())):
            found.append((f"{path.relative_to(ROOT)}#{i}", match.group(1)))
    return found


class TestDocs(TestCase):
    def test_docs_have_code(self) -> None:
        """The README carries at least one runnable example."""
        self.assertTrue(any(name.startswith("README.md") for name, _ in blocks()))

    def test_layout_names_every_module(self) -> None:
        """README's Layout table and docs/design.md's Pieces table name every module and native source."""
        package = sorted(
            str(p.relative_to(ROOT))
            for p in [*(ROOT / "torch_cachepolicy").rglob("*.py"), *(ROOT / "csrc").iterdir()]
            if p.name not in ("__init__.py", "version.py")
        )
        readme = (ROOT / "README.md").read_text()
        design = (ROOT / "docs" / "design.md").read_text()
        self.assertEqual([f for f in package if f"`{f}`" not in readme], [], msg="add these to README.md's Layout")
        relative = [f.removeprefix("torch_cachepolicy/") for f in package if "recipes" not in f]
        self.assertEqual([f for f in relative if f"`{f}`" not in design], [], msg="add these to docs/design.md's Pieces")

    def test_guide_names_every_bypass_reason(self) -> None:
        """docs/guide.md names every bypass reason the package records (torch_cachepolicy._reasons)."""
        guide = (ROOT / "docs" / "guide.md").read_text()
        missing = []
        for name, value in vars(_reasons).items():
            if name.startswith("_") or not (isinstance(value, str) or inspect.isfunction(value)):
                continue
            text = value if isinstance(value, str) else value(*["X"] * len(inspect.signature(value).parameters))
            # A templated reason is named by its fixed part (before the placeholder).
            fixed = text if isinstance(value, str) else text.split("X")[0].split("(")[0].strip()
            if fixed and fixed not in guide:
                missing.append(name)
        self.assertEqual(missing, [])

    @parametrize("name, code", blocks(), name_fn=lambda name, code: re.sub(r"\W", "_", name))
    def test_block_runs(self, name: str, code: str) -> None:
        """The code block runs as a script without raising."""
        with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
            f.write(code)
        runpy.run_path(f.name, run_name="__docs__")


instantiate_parametrized_tests(TestDocs)

if __name__ == "__main__":
    run_tests()
