"""Operators and helpers shared by the torch_cachepolicy tests.

Test operators are defined through :class:`CountedOps`, whose fake kernels count their runs, so a test can tell a
cache hit (no run) from a miss. This module defines the ``tcp_test`` namespace, once per process; ``zoo_ops``
defines ``tcp_zoo`` the same way.
"""

from __future__ import annotations

import collections
import gc
import itertools
import json
import pathlib
import subprocess
import sys
import types
import unittest
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch
import torch.ao.quantization.fx._decomposed  # noqa: F401  (defines quantized_decomposed ops)
from torch._ops import OpOverload

import torch_cachepolicy as tcp

KernelT = TypeVar("KernelT", bound=Callable[..., Any])
REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent


class CountedOps:
    """The operators of one test namespace, each with a fake kernel that counts its runs.

    Attributes:
        ns: the namespace.
        lib: its ``DEF`` library, which owns the definitions and registrations made here.
        calls: how often each fake kernel ran, by operator name without the namespace (``calls["conv"]``).
    """

    def __init__(self, ns: str, calls: collections.Counter[str] | None = None) -> None:
        """Defines the namespace ``ns``.

        Args:
            ns: a namespace no library has defined yet.
            calls: the counter to count into, when the kernels of another namespace count in the same one
                (the tests read the runs of either by operator name); a new counter by default.
        """
        self.ns = ns
        self.lib = torch.library.Library(ns, "DEF")
        self.calls: collections.Counter[str] = collections.Counter() if calls is None else calls

    def op(self, name: str) -> OpOverload:
        """The default overload of ``ns::name``."""
        return getattr(getattr(torch.ops, self.ns), name).default

    def counted(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """A kernel that counts a run in ``calls[name]``, then runs ``fn``.

        For kernels registered by hand: replacements of a kernel, other dispatch keys, other namespaces' rules.
        """

        def kernel(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            return fn(*args, **kwargs)

        return kernel

    def define(self, schema: str, tags: Sequence[torch.Tag] = ()) -> Callable[[KernelT], KernelT]:
        """Defines ``ns::<schema>`` and registers the decorated function, counted, as its fake kernel.

        Args:
            schema: the operator's schema, name first (``"conv(Tensor x, int stride) -> Tensor"``).
            tags: torch tags the operator's owner declares.

        Returns:
            A decorator that returns the function unchanged (it does not count when called directly).
        """

        def wrap(fn: KernelT) -> KernelT:
            name = schema.split("(", 1)[0]
            self.lib.define(schema, tags=tags)
            torch.library.register_fake(f"{self.ns}::{name}", self.counted(name, fn), lib=self.lib)
            return fn

        return wrap


# ------------------------------------------------------------------ tcp_test

TEST_OPS = CountedOps("tcp_test")
NS = TEST_OPS.ns
calls = TEST_OPS.calls
op = TEST_OPS.op

# Fake kernels that read ambient state read this (like TOSA's active spec).
ambient: dict[str, Any] = {"dtype": torch.float32}


@TEST_OPS.define("conv(Tensor x, int stride) -> Tensor")
def _conv(x: torch.Tensor, stride: int) -> torch.Tensor:
    n, c, h, w = x.shape
    return x.new_empty(n, c * 2, (h - 1) // stride + 1, (w - 1) // stride + 1)


@TEST_OPS.define("pair(Tensor x) -> (Tensor, Tensor)")
def _pair(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x.new_empty(x.shape), x.new_empty(x.shape[0])


@TEST_OPS.define("dyn(Tensor x) -> SymInt")
def _dyn(x: torch.Tensor) -> Any:
    return torch.library.get_ctx().new_dynamic_size()


@TEST_OPS.define("size0(Tensor x) -> SymInt")
def _size0(x: torch.Tensor) -> Any:
    return x.shape[0]


@TEST_OPS.define("sym_double(Tensor x) -> SymInt")
def _sym_double(x: torch.Tensor) -> Any:
    return x.shape[0] * 2  # a new SymNode on every run


@TEST_OPS.define("bad_view(Tensor x) -> Tensor")
def _bad_view(x: torch.Tensor) -> torch.Tensor:
    return x.view(-1)  # aliases x, but the schema says it does not


@TEST_OPS.define("good_view(Tensor(a) x) -> Tensor(a)")
def _good_view(x: torch.Tensor) -> torch.Tensor:
    return x.view(-1)


@TEST_OPS.define("multi_view(Tensor(a) x, Tensor y) -> Tensor(a)")
def _multi_view(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x.view(-1)


@TEST_OPS.define("twins(Tensor x) -> (Tensor, Tensor)")
def _twins(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    out = x.new_empty(x.shape)
    return out, out.view(-1)  # the two outputs share a storage, undeclared


@TEST_OPS.define("mut(Tensor(a!) x) -> ()")
def _mut(x: torch.Tensor) -> None:
    return None


@TEST_OPS.define("ambient_cast(Tensor x) -> Tensor")
def _ambient_cast(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape, dtype=ambient["dtype"])


TEST_OPS.lib.define("no_fake(Tensor x) -> Tensor")  # no fake kernel at all

# Two versions of one kernel, for tests that replace it: both count as "swappable", on either overload.
TEST_OPS.lib.define("swappable(Tensor x) -> Tensor")
TEST_OPS.lib.define("swappable.ovl(Tensor x, int n) -> Tensor")


def _swappable_v1(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape)


def _swappable_v2(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape[0], 1)


swappable_v1 = TEST_OPS.counted("swappable", _swappable_v1)
swappable_v2 = TEST_OPS.counted("swappable", _swappable_v2)
torch.library.register_fake(f"{NS}::swappable", swappable_v1, lib=TEST_OPS.lib)
torch.library.register_fake(f"{NS}::swappable.ovl", lambda x, n: swappable_v1(x), lib=TEST_OPS.lib)


# ------------------------------------------------------------------ helpers

_unique = itertools.count(101)


def fresh_size() -> int:
    """A size no other test used, so torch's shared cache holds nothing for it."""
    return next(_unique)


def stock_info() -> tuple[int, int, dict[str, int], int]:
    """Stock FakeTensorMode's class-wide cache counters: (hits, misses, bypasses by reason, size)."""
    info = torch._subclasses.fake_tensor.FakeTensorMode.cache_info()
    return info.hits, info.misses, dict(info.bypasses), info.size


def backend_policy(**kwargs: Any) -> tcp.CachePolicy:
    """A policy caching the tcp_test and quantized_decomposed backend ops; ``kwargs`` go to CachePolicy."""
    return tcp.CachePolicy(namespaces=[NS, "quantized_decomposed"], **kwargs)


def qdq(x: torch.Tensor) -> torch.Tensor:
    """Quantizes ``x`` to int8 and back, as a backend's explicit q/dq pair does."""
    q = torch.ops.quantized_decomposed.quantize_per_tensor(x, 0.05, 0, -128, 127, torch.int8)
    return torch.ops.quantized_decomposed.dequantize_per_tensor(q, 0.05, 0, -128, 127, torch.int8)


def size_key(v: object) -> object:
    """A size as its expression: comparing it installs no guard."""
    if isinstance(v, torch.SymInt):
        expr = v.node.expr
        return int(expr) if expr.is_number else expr
    return v


def sharing(values: list[torch.Tensor]) -> list[tuple[int, ...]]:
    """For each value, the indices of the values sharing its storage."""
    ids = [v.untyped_storage()._cdata for v in values]
    return [tuple(j for j, other in enumerate(ids) if other == mine) for mine in ids]


def reaches(root: object, target: object, limit: int = 200_000) -> bool:
    """Whether ``target`` is reachable from ``root`` through containers and plain objects.

    Not through operators, modules, types or functions, which lead into torch's global state.
    """
    stop = (torch._ops.OperatorBase, types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType)
    seen, todo = {id(root)}, [root]
    while todo and len(seen) < limit:
        for ref in gc.get_referents(todo.pop()):
            if ref is target:
                return True
            if id(ref) not in seen and not isinstance(ref, stop):
                seen.add(id(ref))
                todo.append(ref)
    return False


def run_json_script(test: unittest.TestCase, script: str, env: dict[str, str], *python_flags: str) -> Any:
    """Runs ``script`` with ``python -c`` in a fresh interpreter, from the repository root.

    Args:
        test: the test that fails, showing the script's stderr, if the interpreter exits non-zero.
        script: the code; its last line of output is JSON.
        env: the interpreter's whole environment.
        python_flags: interpreter options before ``-c``.

    Returns:
        The JSON value of the script's last line of output.
    """
    proc = subprocess.run(
        [sys.executable, *python_flags, "-c", script],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        check=False,
        text=True,
        timeout=300,
    )
    test.assertEqual(proc.returncode, 0, proc.stderr)
    return json.loads(proc.stdout.strip().splitlines()[-1])
