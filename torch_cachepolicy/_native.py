"""Loads ``torch_cachepolicy._C``, the package's native helpers, once for every module.

Without the extension (``USE_CPP=0``, no compiler, an import error, or
``TORCH_CACHEPOLICY_FORCE_PYTHON=1`` at import) :func:`extension` is None and
each module uses torch's own code instead (torch's key, torch's synthesis: the
same answers, slower); the kernel watch, whose fallback is also weaker, says
so once per process (:func:`warn_fallback_once`).
"""

from __future__ import annotations

import os
import warnings
from types import ModuleType
from typing import Any

FORCE_ENV = "TORCH_CACHEPOLICY_FORCE_PYTHON"
"""Set to anything but ``""`` or ``"0"`` at import to use the pure-Python paths."""


def _load() -> tuple[ModuleType | None, str]:
    if os.environ.get(FORCE_ENV, "") not in ("", "0"):
        return None, f"{FORCE_ENV} is set"
    try:
        from torch_cachepolicy import _C  # type: ignore[attr-defined]
    except ImportError as e:
        return None, f"torch_cachepolicy._C could not be imported ({e})"
    return _C, ""


# Module state, not constants: tests point it at one backend for a while.
_ext, _fallback_reason = _load()
_warned = False


def extension() -> ModuleType | None:
    """The loaded ``torch_cachepolicy._C``, or None when the package runs on its Python fallbacks."""
    return _ext


def function(name: str) -> Any | None:
    """The extension's attribute ``name``, or None without the extension.

    Modules whose hit path calls a native function fetch it once at import
    (a module global is one dictionary read per call, an attribute of the
    extension two).
    """
    return getattr(_ext, name, None)


def backend() -> str:
    """``"cpp"`` when the C++ helpers answer, ``"python"`` otherwise."""
    return "python" if _ext is None else "cpp"


def fallback_reason() -> str:
    """Why the extension is not used (``""`` when it is)."""
    return _fallback_reason


def warn_fallback_once(consequences: str, *, stacklevel: int = 2) -> None:
    """Warns, once per process, that the Python fallbacks are in use.

    Args:
        consequences: what the caller's fallback does differently, in
            sentences (``"Kernel fingerprints cost microseconds ..."``).
        stacklevel: as for :func:`warnings.warn`, counted from the caller.
    """
    global _warned
    if _warned:
        return
    _warned = True
    warnings.warn(
        f"torch_cachepolicy: using the pure-Python fallbacks because {_fallback_reason}. {consequences} "
        "Rebuild with `pip install --no-build-isolation -e .` to get the C++ helpers.",
        stacklevel=stacklevel + 1,
    )
