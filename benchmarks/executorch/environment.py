"""What the ExecuTorch benchmark needs installed, and what it records of the machine it ran on."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys
from typing import Any

import torch

import torch_cachepolicy as tcp

__all__ = ["EXECUTORCH_VERSION", "check_runnable", "environment", "executorch_version"]

EXECUTORCH_VERSION = "1.5.1"
"""The ExecuTorch release these flows were written against."""

_INSTALL_HINT = "pip install --no-deps -r requirements-executorch.txt (or: make test-executorch)"


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def executorch_version() -> str | None:
    """The installed ExecuTorch version, or ``None`` when it is not installed."""
    return _version("executorch")


def environment() -> dict[str, Any]:
    """The versions and machine a result was measured with (its ``environment`` key)."""
    return {
        "torch": torch.__version__,
        "torch_cachepolicy": tcp.__version__,
        "executorch": _version("executorch"),
        "torchao": _version("torchao"),
        "ethos-u-vela": _version("ethos-u-vela"),
        "tosa-tools": _version("tosa-tools"),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


def check_runnable(repeats: int = 1) -> None:
    """Raises unless ExecuTorch is installed and ``repeats`` is positive.

    Raises:
        ImportError: ExecuTorch is not installed.
        ValueError: ``repeats`` is not positive.
    """
    if executorch_version() is None:
        raise ImportError(f"ExecuTorch is not installed: {_INSTALL_HINT}")
    if repeats < 1:
        raise ValueError(f"expected a positive number of repeats, got {repeats}")
