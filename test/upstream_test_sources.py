"""What a test patch of docs/upstream/tests/ adds, read without importing torch.

A test patch adds code to torch's ``test/test_fake_tensor.py`` (module-level
helpers, and methods of ``FakeTensorDispatchCache``) and may add whole test
files (``--- /dev/null``). Used by test/upstream_patch_probe.py, which runs the
tests, and by test/test_upstream_patch.py, which checks that every test the
patch adds was run.
"""

from __future__ import annotations

import ast
import pathlib
from typing import NamedTuple

FAKE_TENSOR_TESTS = "test/test_fake_tensor.py"


class TestSources(NamedTuple):
    """The code a test patch adds: to test_fake_tensor.py's module scope, to its class, and new files."""

    module: str  # module-level lines added to test_fake_tensor.py
    methods: str  # lines added inside FakeTensorDispatchCache (indented as there)
    files: dict[str, str]  # path of a new test file -> its source


def read_test_patch(path: pathlib.Path) -> TestSources:
    """Splits the ``+`` lines of a test patch by where they go.

    A hunk of test_fake_tensor.py whose first added line is not indented adds
    module-level code; any other hunk adds class-level code.
    ``instantiate_parametrized_tests(...)`` lines are left out: the probe
    instantiates every class it builds.
    """
    module: list[str] = []
    methods: list[str] = []
    files: dict[str, list[str]] = {}
    target: list[str] | None = None
    new_file = False
    current = ""
    for line in path.read_text().splitlines():
        if line.startswith("--- "):
            new_file = line == "--- /dev/null"
            target = None
        elif line.startswith("+++ b/"):
            current = line[len("+++ b/") :]
            if new_file:
                target = files.setdefault(current, [])
        elif line.startswith("@@ "):
            if not new_file:
                target = None if current == FAKE_TENSOR_TESTS else []
        elif line.startswith("+") and not line.startswith("+++"):
            text = line[1:]
            if not new_file and target is None and current == FAKE_TENSOR_TESTS:
                if not text.strip():
                    continue
                target = module if not text.startswith(" ") else methods
            if target is None:
                continue
            if not new_file and text.startswith("instantiate_parametrized_tests("):
                continue
            target.append(text)
    return TestSources("\n".join(module), "\n".join(methods), {k: "\n".join(v) + "\n" for k, v in files.items()})


def _test_names(cls: ast.ClassDef, prefix: str) -> list[str]:
    names = []
    for f in cls.body:
        if not isinstance(f, ast.FunctionDef) or not f.name.startswith("test_"):
            continue
        params = [d for d in f.decorator_list if isinstance(d, ast.Call) and getattr(d.func, "id", "") == "parametrize"]
        variants = [""]
        for d in params:
            arg, values = ast.literal_eval(d.args[0]), ast.literal_eval(d.args[1])
            variants = [f"{v}_{arg}_{value}" for v in variants for value in values]
        names += [f"{prefix}.{f.name}{v}" for v in variants]
    return names


def test_ids(sources: TestSources, case: str) -> list[str]:
    """Every test id the probe runs for these sources: ``case.test_*`` for the methods, ``Class.test_*`` for new files."""
    ids: list[str] = []
    if sources.methods.strip():
        cls = ast.parse("class Added:\n" + sources.methods + "\n").body[0]
        assert isinstance(cls, ast.ClassDef)
        ids += _test_names(cls, case)
    for source in sources.files.values():
        for node in ast.parse(source).body:
            if isinstance(node, ast.ClassDef):
                ids += _test_names(node, node.name)
    return ids
