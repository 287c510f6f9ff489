"""Times the two ways :mod:`torch_cachepolicy.keyset` classifies operators.

Both paths compute, for every operator registered in this process, the bitmask
over :data:`keyset.KEYS` of keys that have a kernel registered directly: the C++
helper in one batched call, the fallback with one dispatcher query per
(operator, key) pair. Turning masks into frozensets is common to both and left
out. Run it with ``python -m benchmarks.keyset_classify`` from the repository root.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from types import ModuleType

import torch

from benchmarks.timing import timed
from torch_cachepolicy import keyset

_C: ModuleType | None
try:
    # Imported directly, not through keyset._ext: that one is None whenever
    # TORCH_CACHEPOLICY_FORCE_PYTHON is set, yet the comparison still makes sense.
    from torch_cachepolicy import _C  # type: ignore[attr-defined,no-redef]
except ImportError:
    _C = None

__all__ = ["run"]


def _operators_with_schema() -> list[str]:
    # An impl() without def() is listed by the dispatcher but rejected by both
    # paths, and one such name would abort the whole C++ batch.
    names = []
    for name in torch._C._dispatch_get_all_op_names():
        base, _, overload = name.partition(".")
        try:
            torch._C._dispatch_find_schema_or_throw(base, overload)
        except RuntimeError:
            continue
        names.append(name)
    return names


def _time_once(fn: Callable[[], list[int]]) -> tuple[float, list[int]]:
    # The collector would charge one path for garbage the other one left.
    with timed(collect=False) as timing:
        result = fn()
    return timing.seconds, result


def run(repeats: int = 5) -> dict[str, object]:
    """Classifies every registered operator with each path and times it.

    Repeats alternate between the paths, so that drift in machine load hits
    both alike. One untimed warm-up of each comes first, and it also checks that
    the two paths agree, since timing different answers would be meaningless.

    Args:
        repeats: timed runs of each path; the medians are reported.

    Returns:
        ``ops`` (operators classified), ``keys`` (len(KEYS)), ``repeats``,
        ``python_median_s``, and, when the C++ helper is built,
        ``cpp_median_s`` and ``ratio_python_over_cpp``; otherwise a ``note``
        saying why those are missing.

    Raises:
        ValueError: ``repeats`` is less than 1.
        RuntimeError: the two paths disagree about some operator.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    names = _operators_with_schema()
    key_values = [k.value for k in keyset.KEYS]

    def python_path() -> list[int]:
        return [keyset._python_mask(n) for n in names]

    paths: dict[str, Callable[[], list[int]]] = {"python": python_path}
    if _C is not None:
        ext = _C

        def cpp_path() -> list[int]:
            return list(ext.kernel_masks(names, key_values))

        paths["cpp"] = cpp_path

    warm = {label: fn() for label, fn in paths.items()}
    if _C is not None and warm["cpp"] != warm["python"]:
        bad = next(n for n, c, p in zip(names, warm["cpp"], warm["python"], strict=True) if c != p)
        raise RuntimeError(f"C++ and Python masks differ, first for {bad}")

    samples: dict[str, list[float]] = {label: [] for label in paths}
    order = list(paths)
    for _ in range(repeats):
        for label in order:
            samples[label].append(_time_once(paths[label])[0])
        # Neither path always runs right after the other's allocations.
        order.reverse()

    result: dict[str, object] = {
        "ops": len(names),
        "keys": len(key_values),
        "repeats": repeats,
        "python_median_s": statistics.median(samples["python"]),
    }
    if _C is None:
        result["note"] = (
            "torch_cachepolicy._C is not built (USE_CPP=0 or the build failed); only the Python fallback was timed"
        )
    else:
        cpp = statistics.median(samples["cpp"])
        result["cpp_median_s"] = cpp
        result["ratio_python_over_cpp"] = statistics.median(samples["python"]) / cpp if cpp > 0 else float("inf")
    return result


if __name__ == "__main__":
    for field, value in run().items():
        print(f"{field}: {value:.6g}" if isinstance(value, float) else f"{field}: {value}")
