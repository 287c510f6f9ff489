"""The models the ExecuTorch benchmark lowers: a tiny two-convolution net and a MobileNet-style stack.

Both have seeded random weights and take an RGB image; :func:`build_model`
builds either by its ``--model`` name. They import and run without ExecuTorch.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["MODELS", "MobileNetStyle", "TinyConvNet", "build_model"]

MODELS: tuple[str, ...] = ("tiny", "large")
"""The models :func:`build_model` builds."""


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
# of the stock Ethos-U55 lowering (docs/executorch.md has the measured share).
_LARGE_WIDTHS = (16, 24, 24, 32, 32, 32, 64, 64, 64, 64, 96, 96, 96, 128)
_LARGE_STRIDES = (1, 2, 1, 2, 1, 1, 2, 1, 1, 1, 1, 1, 1, 2)


def build_model(name: str, seed: int = 0) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...], str]:
    """A model of :data:`MODELS`, with seeded weights, its example input and a description.

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
