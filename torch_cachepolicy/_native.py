"""Loads ``torch_cachepolicy._C``, the package's native helpers, once for every module.

Without the extension (``USE_CPP=0`` or no working C++ compiler at install, an import error, an extension built
against another torch, a changed torch internal it rests on (``_compat.Feature.NATIVE``), or
``TORCH_CACHEPOLICY_FORCE_PYTHON=1`` at import) :func:`extension` and :func:`function` are None and
each module uses torch's own code instead (torch's key, torch's synthesis: the
same answers, slower); the kernel watch, whose fallback is also weaker, says
so once per process (:func:`warn_fallback_once`).
"""

from __future__ import annotations

import importlib.util
import os
import warnings
from types import ModuleType
from typing import Any

import torch

from torch_cachepolicy._compat import Feature, TorchDriftWarning, off

FORCE_ENV = "TORCH_CACHEPOLICY_FORCE_PYTHON"
"""Set to anything but ``""`` or ``"0"`` at import to use the pure-Python paths."""

REBUILD = "pip install --no-build-isolation -e ."
"""The command that builds the extension against the installed torch."""

# Note [An extension built for another torch]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# _C is compiled against one torch's headers and reads internals whose layout no release promises to keep
# (OperatorHandle's operatorDef_, Note [Reaching the OperatorEntry]). Built for another torch it may still import, the
# symbols it links against keeping their names, and then read the wrong memory. So setup.py records the
# torch.__version__ it builds against (_C.TORCH_VERSION), and _C is used only under exactly that torch: under any
# other the package runs on its Python paths and says so once, naming both versions (torchao likewise skips its C++
# extensions on a torch it was not built for).


def _load() -> tuple[ModuleType | None, str, bool]:
    """The extension (or None), why it is not used (``""`` when it is), and whether that was already said."""
    if os.environ.get(FORCE_ENV, "") not in ("", "0"):
        return None, f"{FORCE_ENV} is set", False
    drift = off(Feature.NATIVE)
    if drift is not None:  # the package's TorchDriftWarning names it
        return None, drift, True
    if importlib.util.find_spec("torch_cachepolicy._C") is None:
        return None, "torch_cachepolicy._C is not built (USE_CPP=0, or no working C++ compiler at install)", False
    try:
        from torch_cachepolicy import _C  # type: ignore[attr-defined]
    except ImportError as e:
        return None, f"torch_cachepolicy._C could not be imported ({e})", False
    built, running = getattr(_C, "TORCH_VERSION", "(unrecorded)"), str(torch.__version__)
    if built != running:
        reason = f"torch_cachepolicy._C was built against torch {built}, not the installed torch {running}"
        warnings.warn(
            f"torch_cachepolicy: {reason}, whose internals it reads may be laid out differently; the package uses its "
            f"pure-Python paths instead (the same answers, slower; a weaker kernel watch). Rebuild it against this "
            f"torch with `{REBUILD}`, or install with `USE_CPP=0` (removing {_C.__file__}) to go without it",
            TorchDriftWarning,
            stacklevel=2,
        )
        return None, reason, True
    return _C, "", False


# Module state, not constants: tests point it at one backend for a while.
_ext, _fallback_reason, _warned = _load()


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
        f"Rebuild with `{REBUILD}` to get the C++ helpers.",
        stacklevel=stacklevel + 1,
    )
