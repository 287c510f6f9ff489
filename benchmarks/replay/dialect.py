"""``tosa_bench``: a small TOSA-like backend dialect the benchmark defines for itself.

The operators have fake (shape) kernels only, written the way backend dialects
write them: validate dtypes against a specification, do the shape arithmetic in
Python, allocate the output. That Python is what an uncached fake dispatch pays
for on every call and what a cache hit skips.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = ["NAMESPACE", "SPEC", "DialectError", "Spec", "ops"]

NAMESPACE = "tosa_bench"


class DialectError(ValueError):
    """An operator was called with arguments its specification rejects."""

    def __init__(self, op: str, message: str) -> None:
        super().__init__(f"{NAMESPACE}::{op}: {message}")


@dataclass(frozen=True)
class Spec:
    """The subset of a TOSA specification the fake kernels consult.

    Attributes:
        version: specification version, e.g. ``"1.0"``.
        profiles: ``"INT"`` and/or ``"FP"``.
        extensions: optional extensions, e.g. ``"int16"``, ``"bf16"``.
    """

    version: str
    profiles: frozenset[str]
    extensions: frozenset[str] = frozenset()

    def supports_integer(self) -> bool:
        return "INT" in self.profiles

    def supports_float(self) -> bool:
        return "FP" in self.profiles

    def supports_extension(self, name: str) -> bool:
        return name in self.extensions


# Real backends read the active specification from ambient state; here it is
# fixed, so cached entries depend only on the arguments (ambient state would
# need CachePolicy(context_key=...)).
SPEC = Spec("1.0", frozenset({"INT", "FP"}), frozenset({"int16"}))

_INT_ACTIVATIONS = (torch.int8, torch.int16)
_FLOAT_ACTIVATIONS = (torch.float16, torch.float32)
_RESCALE_OUTPUTS = (torch.int8, torch.int16, torch.int32)
_TABLE_SIZES = {torch.int8: (256, torch.int8, torch.int8), torch.int16: (513, torch.int16, torch.int32)}

_LIB = torch.library.Library(NAMESPACE, "DEF")
_LIB.define("conv2d(Tensor input, Tensor weight, Tensor bias, int[2] stride, int[4] pad, int[2] dilation) -> Tensor")
_LIB.define("rescale(Tensor input, ScalarType dtype, float[] scale, int in_zp, int out_zp) -> Tensor")
_LIB.define("table(Tensor input, Tensor table) -> Tensor")
_LIB.define("transpose(Tensor input, int[] perms) -> Tensor")


def _conv_dtype(spec: Spec, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.dtype:
    if x.dtype in _INT_ACTIVATIONS:
        if not spec.supports_integer():
            raise DialectError("conv2d", f"spec {spec} has no integer profile for {x.dtype}")
        if x.dtype == torch.int16 and not spec.supports_extension("int16"):
            raise DialectError("conv2d", "int16 activations need the int16 extension")
        if weight.dtype != torch.int8:
            raise DialectError("conv2d", f"integer convolution needs int8 weights, got {weight.dtype}")
        wanted_bias = torch.int32 if x.dtype == torch.int8 else torch.int64
        if bias.dtype != wanted_bias:
            raise DialectError("conv2d", f"bias must be {wanted_bias} for {x.dtype} input, got {bias.dtype}")
        return torch.int32 if x.dtype == torch.int8 else torch.int64
    if x.dtype in _FLOAT_ACTIVATIONS:
        if not spec.supports_float():
            raise DialectError("conv2d", f"spec {spec} has no float profile for {x.dtype}")
        if weight.dtype != x.dtype or bias.dtype != x.dtype:
            raise DialectError("conv2d", "float convolution needs input, weight and bias of one dtype")
        return x.dtype
    raise DialectError("conv2d", f"unsupported input dtype {x.dtype}")


def _conv2d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    stride: Sequence[int],
    pad: Sequence[int],
    dilation: Sequence[int],
) -> torch.Tensor:
    out_dtype = _conv_dtype(SPEC, x, weight, bias)
    if x.dim() != 4 or weight.dim() != 4:
        raise DialectError("conv2d", f"expected 4-D input and weight, got {x.dim()}-D and {weight.dim()}-D")
    n, c_in, h_in, w_in = x.shape
    c_out, w_c_in, k_h, k_w = weight.shape
    if w_c_in != c_in:
        raise DialectError("conv2d", f"weight expects {w_c_in} input channels, input has {c_in}")
    if bias.dim() != 1 or bias.shape[0] != c_out:
        raise DialectError("conv2d", f"bias must have {c_out} elements, got shape {tuple(bias.shape)}")
    if any(s < 1 for s in stride) or any(d < 1 for d in dilation) or any(p < 0 for p in pad):
        raise DialectError("conv2d", f"invalid stride {stride}, dilation {dilation} or pad {pad}")
    pad_top, pad_bottom, pad_left, pad_right = pad
    h_span = h_in + pad_top + pad_bottom - dilation[0] * (k_h - 1) - 1
    w_span = w_in + pad_left + pad_right - dilation[1] * (k_w - 1) - 1
    if h_span < 0 or w_span < 0:
        raise DialectError("conv2d", "kernel larger than the padded input")
    h_out = math.floor(h_span / stride[0]) + 1
    w_out = math.floor(w_span / stride[1]) + 1
    return torch.empty((n, c_out, h_out, w_out), dtype=out_dtype)


def _rescale(x: torch.Tensor, dtype: torch.dtype, scale: Sequence[float], in_zp: int, out_zp: int) -> torch.Tensor:
    if not SPEC.supports_integer():
        raise DialectError("rescale", f"spec {SPEC} has no integer profile")
    if dtype not in _RESCALE_OUTPUTS:
        raise DialectError("rescale", f"output dtype must be one of {_RESCALE_OUTPUTS}, got {dtype}")
    if x.dtype not in (*_RESCALE_OUTPUTS, torch.int64):
        raise DialectError("rescale", f"unsupported input dtype {x.dtype}")
    if len(scale) not in (1, x.shape[1] if x.dim() > 1 else 1):
        raise DialectError("rescale", f"{len(scale)} scales for {x.shape[1]} channels")
    if any(not (0.0 < s < 2.0**31) for s in scale):
        raise DialectError("rescale", "scales must be positive and representable")
    if dtype != torch.int8 and out_zp != 0:
        raise DialectError("rescale", f"output zero point must be 0 for {dtype}")
    if x.dtype != torch.int8 and in_zp != 0:
        raise DialectError("rescale", f"input zero point must be 0 for {x.dtype}")
    for name, zp, dt in (("in_zp", in_zp, x.dtype), ("out_zp", out_zp, dtype)):
        if dt == torch.int8 and not -128 <= zp <= 127:
            raise DialectError("rescale", f"{name}={zp} is outside the int8 range")
    return torch.empty_like(x, dtype=dtype)


def _table(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    if not SPEC.supports_integer():
        raise DialectError("table", f"spec {SPEC} has no integer profile")
    if x.dtype not in _TABLE_SIZES:
        raise DialectError("table", f"unsupported input dtype {x.dtype}")
    entries, table_dtype, out_dtype = _TABLE_SIZES[x.dtype]
    if x.dtype == torch.int16 and not SPEC.supports_extension("int16"):
        raise DialectError("table", "int16 lookups need the int16 extension")
    if tuple(table.shape) != (entries,) or table.dtype != table_dtype:
        raise DialectError("table", f"table must be {table_dtype}[{entries}], got {table.dtype}{list(table.shape)}")
    return torch.empty_like(x, dtype=out_dtype)


def _transpose(x: torch.Tensor, perms: Sequence[int]) -> torch.Tensor:
    if sorted(perms) != list(range(x.dim())):
        raise DialectError("transpose", f"{list(perms)} is not a permutation of {x.dim()} dimensions")
    # TOSA transpose produces a new (contiguous) tensor, not a view: the schema
    # says so and the kernel must agree, or cached hits would alias wrongly.
    return torch.empty([x.shape[p] for p in perms], dtype=x.dtype)


# Registered as calls rather than decorators so the kernels keep their types.
torch.library.register_fake(f"{NAMESPACE}::conv2d", _conv2d, lib=_LIB)
torch.library.register_fake(f"{NAMESPACE}::rescale", _rescale, lib=_LIB)
torch.library.register_fake(f"{NAMESPACE}::table", _table, lib=_LIB)
torch.library.register_fake(f"{NAMESPACE}::transpose", _transpose, lib=_LIB)


class _Ops:
    """Typed handles on the dialect's OpOverloads."""

    conv2d = torch.ops.tosa_bench.conv2d.default
    rescale = torch.ops.tosa_bench.rescale.default
    table = torch.ops.tosa_bench.table.default
    transpose = torch.ops.tosa_bench.transpose.default


ops = _Ops
