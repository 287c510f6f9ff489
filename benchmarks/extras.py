"""``python -m benchmarks.extras NAME``: prints the requirements of setup.py's extra NAME, one per line.

The Makefile's bench targets install the ``bench`` extra (matplotlib, for the
charts) with ``pip install $(python -m benchmarks.extras bench)``: setup.py
stays the one place that pins it, and the package, installed already, is not
built a second time (``pip install -e ".[bench]"`` would rebuild its C++
helper). setup.py is read, not run: running it needs torch and calls
``setup()``.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["extra_requirements", "main"]

SETUP_PY = Path(__file__).resolve().parent.parent / "setup.py"


def extra_requirements(name: str, setup_py: Path = SETUP_PY) -> list[str]:
    """The requirements listed for extra ``name`` in the ``extras_require`` literal of ``setup()``.

    Raises:
        KeyError: setup.py has no such extra.
        ValueError: setup.py's ``extras_require`` is not a literal dict of literal lists.
    """
    tree = ast.parse(setup_py.read_text(), filename=str(setup_py))
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "extras_require":
            try:
                extras = ast.literal_eval(node.value)
            except ValueError:
                raise ValueError(f"{setup_py}: extras_require is not a literal") from None
            if name not in extras:
                raise KeyError(f"{setup_py}: no extra {name!r} (extras: {', '.join(sorted(extras))})")
            return [str(r) for r in extras[name]]
    raise ValueError(f"{setup_py}: no extras_require= in setup()")


def main(argv: Sequence[str] | None = None) -> int:
    """Prints the requirements of each extra named on the command line."""
    names = list(sys.argv[1:] if argv is None else argv)
    if not names:
        print("usage: python -m benchmarks.extras NAME [NAME ...]", file=sys.stderr)
        return 2
    for name in names:
        try:
            print("\n".join(extra_requirements(name)))
        except (KeyError, ValueError) as e:
            print(f"python -m benchmarks.extras: {e.args[0]}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
