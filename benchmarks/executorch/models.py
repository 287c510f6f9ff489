"""The models the ExecuTorch benchmark lowers, in two families of two sizes each.

* ``image`` (the static-shape flows): ``tiny``, a two-convolution net, and
  ``large``, a MobileNet-style stack; both take an RGB image
  (:func:`build_model`);
* ``sequence`` (the dynamic-shape flow): a transformer encoder (no normalization;
  multi-head attention and an MLP per layer) over a ``1 x seq x d`` input
  whose sequence length is exported as a ``torch.export.Dim``
  (:class:`SequenceTransformer`); ``tiny`` has 1 layer, ``large`` 4.

:func:`model_case` builds any of them by family and ``--model`` name, with
the ``dynamic_shapes`` to export it with. Every model has seeded random
weights; all import and run without ExecuTorch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = [
    "FAMILIES",
    "MODELS",
    "MobileNetStyle",
    "ModelCase",
    "SequenceTransformer",
    "TinyConvNet",
    "build_model",
    "model_case",
]

MODELS: tuple[str, ...] = ("tiny", "large")
"""The model sizes (``--model``) of every family."""

FAMILIES: tuple[str, ...] = ("image", "sequence")
"""The model families: ``image`` (static shapes) and ``sequence`` (a dynamic sequence length)."""


class TinyConvNet(torch.nn.Module):
    """Two 3x3 convolutions with a residual add and a linear head; 8x8 RGB input."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.fc = torch.nn.Linear(8 * 8 * 8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.conv1(x))
        y = torch.relu(self.conv2(y)) + y
        return self.fc(y.flatten(1))


class MobileNetStyle(torch.nn.Module):
    """A MobileNet-style stack: a strided 3x3 stem, depthwise-separable blocks
    (3x3 depthwise + 1x1 pointwise, each followed by ReLU; a residual add
    where shape allows), global average pooling and a linear head.

    Args:
        widths: output channels of the blocks, in order.
        strides: stride of each block's depthwise convolution.
        classes: outputs of the head.
    """

    def __init__(self, widths: Sequence[int], strides: Sequence[int], classes: int = 10) -> None:
        super().__init__()
        if len(widths) != len(strides):
            raise ValueError("MobileNetStyle: widths and strides must have the same length")
        self.stem = torch.nn.Conv2d(3, widths[0], 3, stride=2, padding=1)
        blocks: list[torch.nn.Module] = []
        channels = widths[0]
        for width, stride in zip(widths, strides, strict=True):
            blocks.append(_SeparableBlock(channels, width, stride))
            channels = width
        self.blocks = torch.nn.ModuleList(blocks)
        self.pool = torch.nn.AdaptiveAvgPool2d(1)
        self.fc = torch.nn.Linear(channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.stem(x))
        for block in self.blocks:
            y = block(y)
        return self.fc(self.pool(y).flatten(1))


class _SeparableBlock(torch.nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.depthwise = torch.nn.Conv2d(cin, cin, 3, stride=stride, padding=1, groups=cin)
        self.pointwise = torch.nn.Conv2d(cin, cout, 1)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.pointwise(torch.relu(self.depthwise(x))))
        return y + x if self.residual else y


# The large model: 14 separable blocks (29 convolutions, 10 residual adds),
# 1x3x64x64 input. Sized so that fake dispatch of backend ops is a large part
# of the stock Ethos-U55 lowering (`python -m benchmarks.executorch --split` measures the share).
_LARGE_WIDTHS = (16, 24, 24, 32, 32, 32, 64, 64, 64, 64, 96, 96, 96, 128)
_LARGE_STRIDES = (1, 2, 1, 2, 1, 1, 2, 1, 1, 1, 1, 1, 1, 2)


class _Attention(torch.nn.Module):
    """Multi-head self-attention: one fused QKV projection, scaled dot products, softmax, output projection."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"_Attention: dim {dim} is not a multiple of heads {heads}")
        self.heads, self.head_dim = heads, dim // heads
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.out = torch.nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, dim = x.shape
        q, k, v = (
            t.view(batch, seq, self.heads, self.head_dim).transpose(1, 2) for t in self.qkv(x).split(dim, dim=-1)
        )
        weights = torch.softmax((q @ k.transpose(-1, -2)) * self.head_dim**-0.5, dim=-1)
        return self.out((weights @ v).transpose(1, 2).reshape(batch, seq, dim))


class _EncoderLayer(torch.nn.Module):
    def __init__(self, dim: int, heads: int, hidden: int) -> None:
        super().__init__()
        self.attention = _Attention(dim, heads)
        self.fc1 = torch.nn.Linear(dim, hidden)
        self.fc2 = torch.nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(x)
        return x + self.fc2(torch.relu(self.fc1(x)))


class SequenceTransformer(torch.nn.Module):
    """A transformer encoder over ``batch x seq x dim`` (no normalization, ReLU MLP), then a linear head per token.

    Each layer: ``x + attention(x)``, then ``x + fc2(relu(fc1(x)))``. The
    sequence length is free: the model is exported with it as a
    ``torch.export.Dim`` (:func:`model_case`).

    Args:
        dim: model width.
        heads: attention heads (``dim`` must be a multiple).
        hidden: width of each layer's MLP.
        layers: encoder layers.
        classes: outputs of the head, per token.
    """

    def __init__(self, dim: int, heads: int, hidden: int, layers: int, classes: int = 10) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(_EncoderLayer(dim, heads, hidden) for _ in range(layers))
        self.head = torch.nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


# The sequence family: (dim, heads, hidden, layers) per size, the example's
# sequence length and the range exported for it.
_SEQUENCE_SIZES = {"tiny": (32, 2, 64, 1), "large": (64, 4, 128, 4)}
_SEQUENCE_EXAMPLE_LENGTH = 16
_SEQUENCE_MAX_LENGTH = 128


@dataclass(frozen=True)
class ModelCase:
    """A model ready to export: the module, its example input, a description and its dynamic shapes.

    Attributes:
        module: the model, in eval mode.
        example: the example (and calibration) input.
        description: one line naming the architecture and the input.
        dynamic_shapes: ``torch.export``'s ``dynamic_shapes`` argument, or
            ``None`` for static shapes.
    """

    module: torch.nn.Module
    example: tuple[torch.Tensor, ...]
    description: str
    dynamic_shapes: Any = None


def model_case(name: str, seed: int = 0, *, family: str = "image") -> ModelCase:
    """A model of ``family`` (:data:`FAMILIES`) and size ``name`` (:data:`MODELS`), with seeded weights.

    Raises:
        ValueError: unknown ``name`` or ``family``.
    """
    if family == "image":
        return ModelCase(*build_model(name, seed))
    if family != "sequence":
        raise ValueError(f"model_case(...): family must be one of {FAMILIES}, got {family!r}")
    if name not in _SEQUENCE_SIZES:
        raise ValueError(f"model_case(...): model must be one of {MODELS}, got {name!r}")
    torch.manual_seed(seed)
    dim, heads, hidden, layers = _SEQUENCE_SIZES[name]
    seq = torch.export.Dim("seq", min=2, max=_SEQUENCE_MAX_LENGTH)
    return ModelCase(
        SequenceTransformer(dim, heads, hidden, layers).eval(),
        (torch.randn(1, _SEQUENCE_EXAMPLE_LENGTH, dim),),
        f"SequenceTransformer ({layers} encoder layers, width {dim}, {heads} heads, MLP {hidden}, linear head "
        f"{dim}->10 per token), input 1 x seq x {dim}, seq dynamic in [2, {_SEQUENCE_MAX_LENGTH}] "
        f"(example {_SEQUENCE_EXAMPLE_LENGTH})",
        ({1: seq},),
    )


def build_model(name: str, seed: int = 0) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...], str]:
    """An ``image`` model of :data:`MODELS`, with seeded weights, its example input and a description.

    Raises:
        ValueError: unknown ``name``.
    """
    torch.manual_seed(seed)
    if name == "tiny":
        return (
            TinyConvNet().eval(),
            (torch.randn(1, 3, 8, 8),),
            "TinyConvNet (conv3x3 3->8, conv3x3 8->8, residual add, linear 512->10), input 1x3x8x8",
        )
    if name == "large":
        model = MobileNetStyle(_LARGE_WIDTHS, _LARGE_STRIDES).eval()
        return (
            model,
            (torch.randn(1, 3, 64, 64),),
            f"MobileNetStyle (stem conv3x3/2 + {len(_LARGE_WIDTHS)} depthwise-separable blocks, widths "
            f"{'/'.join(map(str, _LARGE_WIDTHS))}, avgpool, linear), input 1x3x64x64",
        )
    raise ValueError(f"build_model(...): model must be one of {MODELS}, got {name!r}")
