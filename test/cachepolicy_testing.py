"""Operators and helpers shared by the torch_cachepolicy tests.

The ``tcp_test`` namespace is defined once per process. Every fake kernel
counts its calls, so a test can tell a cache hit (no call) from a miss.
"""

from __future__ import annotations

import collections
import itertools
from typing import Any

import torch
import torch.ao.quantization.fx._decomposed  # noqa: F401  (defines quantized_decomposed ops)

NS = "tcp_test"
calls: collections.Counter[str] = collections.Counter()

# Fake kernels that read ambient state read this (like TOSA's active spec).
ambient: dict[str, Any] = {"dtype": torch.float32}

_lib = torch.library.Library(NS, "DEF")
_lib.define("conv(Tensor x, int stride) -> Tensor")
_lib.define("pair(Tensor x) -> (Tensor, Tensor)")
_lib.define("dyn(Tensor x) -> SymInt")
_lib.define("size0(Tensor x) -> SymInt")
_lib.define("bad_view(Tensor x) -> Tensor")
_lib.define("good_view(Tensor(a) x) -> Tensor(a)")
_lib.define("multi_view(Tensor(a) x, Tensor y) -> Tensor(a)")
_lib.define("mut(Tensor(a!) x) -> ()")
_lib.define("ambient_cast(Tensor x) -> Tensor")
_lib.define("swappable(Tensor x) -> Tensor")
_lib.define("no_fake(Tensor x) -> Tensor")
_lib.define("twins(Tensor x) -> (Tensor, Tensor)")
_lib.define("swappable.ovl(Tensor x, int n) -> Tensor")


def _counted(name: str):  # type: ignore[no-untyped-def]
    def wrap(fn):  # type: ignore[no-untyped-def]
        def kernel(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return fn(*args, **kwargs)

        torch.library.register_fake(f"{NS}::{name}", kernel, lib=_lib)
        return fn

    return wrap


@_counted("conv")
def _conv(x: torch.Tensor, stride: int) -> torch.Tensor:
    n, c, h, w = x.shape
    return x.new_empty(n, c * 2, (h - 1) // stride + 1, (w - 1) // stride + 1)


@_counted("pair")
def _pair(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x.new_empty(x.shape), x.new_empty(x.shape[0])


@_counted("dyn")
def _dyn(x: torch.Tensor) -> Any:
    return torch.library.get_ctx().new_dynamic_size()


@_counted("size0")
def _size0(x: torch.Tensor) -> Any:
    return x.shape[0]


@_counted("bad_view")
def _bad_view(x: torch.Tensor) -> torch.Tensor:
    return x.view(-1)  # aliases x, but the schema says it does not


@_counted("good_view")
def _good_view(x: torch.Tensor) -> torch.Tensor:
    return x.view(-1)


@_counted("multi_view")
def _multi_view(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x.view(-1)


@_counted("twins")
def _twins(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    out = x.new_empty(x.shape)
    return out, out.view(-1)  # the two outputs share a storage, undeclared


@_counted("mut")
def _mut(x: torch.Tensor) -> None:
    return None


@_counted("ambient_cast")
def _ambient_cast(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape, dtype=ambient["dtype"])


def swappable_v1(x: torch.Tensor) -> torch.Tensor:
    calls["swappable"] += 1
    return x.new_empty(x.shape)


def swappable_v2(x: torch.Tensor) -> torch.Tensor:
    calls["swappable"] += 1
    return x.new_empty(x.shape[0], 1)


torch.library.register_fake(f"{NS}::swappable", swappable_v1, lib=_lib)
torch.library.register_fake(f"{NS}::swappable.ovl", lambda x, n: swappable_v1(x), lib=_lib)


def op(name: str) -> torch._ops.OpOverload:
    return getattr(getattr(torch.ops, NS), name).default


_unique = itertools.count(101)


def fresh_size() -> int:
    """A size no other test used, so torch's shared cache holds nothing for it."""
    return next(_unique)


def stock_info() -> tuple[int, int, dict[str, int], int]:
    info = torch._subclasses.fake_tensor.FakeTensorMode.cache_info()
    return info.hits, info.misses, dict(info.bypasses), info.size
