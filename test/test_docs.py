# Owner(s): ["module: fakeTensor"]
"""Every ```python block in README.md and docs/ runs, so the docs cannot rot."""

from __future__ import annotations

import pathlib
import re
import runpy
import tempfile

from torch.testing._internal.common_utils import TestCase, instantiate_parametrized_tests, parametrize, run_tests

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

    @parametrize("name, code", blocks(), name_fn=lambda name, code: re.sub(r"\W", "_", name))
    def test_block_runs(self, name: str, code: str) -> None:
        """The code block runs as a script without raising."""
        with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
            f.write(code)
        runpy.run_path(f.name, run_name="__docs__")


instantiate_parametrized_tests(TestDocs)

if __name__ == "__main__":
    run_tests()
