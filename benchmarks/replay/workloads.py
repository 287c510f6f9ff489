"""The graphs the benchmark replays, as ExportPass sees them.

Every workload is an FX graph whose ``call_function`` targets are
OpOverloads, with parameters lifted to placeholders (as ``torch.export``
lifts them), plus real example inputs for every placeholder.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.ao.quantization.fx._decomposed  # noqa: F401  (registers quantized_decomposed)
from torch import nn

from benchmarks.replay import dialect

__all__ = [
    "BACKEND_NAMESPACES",
    "WORKLOAD_NAMES",
    "Workload",
    "build_workload",
    "build_workloads",
]

# The namespaces both caching configurations opt in to, as one lowering
# session would: quantized_decomposed (ships with torch) and our TOSA stand-in.
BACKEND_NAMESPACES: tuple[str, ...] = ("quantized_decomposed", dialect.NAMESPACE)

aten = torch.ops.aten
_qd = torch.ops.quantized_decomposed
_QMIN, _QMAX = -128, 127


@dataclass(frozen=True)
class Workload:
    """One graph to replay and the real inputs of its placeholders.

    Attributes:
        name: key in the results (``"qdq"``, ``"dialect"``, ...).
        description: one line for the results table.
        graph: the graph; parameters are placeholders, targets OpOverloads.
        inputs: a real tensor per placeholder, in placeholder order.
        dynamic_batch: replay with a ShapeEnv and a symbolic batch dimension
            on ``inputs[batch_input]``.
        batch_input: index of the activation input among ``inputs``.
    """

    name: str
    description: str
    graph: torch.fx.GraphModule
    inputs: tuple[torch.Tensor, ...]
    dynamic_batch: bool = False
    batch_input: int = 0

    @property
    def call_function_nodes(self) -> int:
        """How many nodes each replay dispatches."""
        return sum(1 for n in self.graph.graph.nodes if n.op == "call_function")

    def backend_nodes(self, namespaces: tuple[str, ...] = BACKEND_NAMESPACES) -> int:
        """How many of those nodes are operators of ``namespaces``."""
        return sum(
            1
            for n in self.graph.graph.nodes
            if n.op == "call_function" and getattr(n.target, "namespace", None) in namespaces
        )


def _frozen(t: torch.Tensor) -> nn.Parameter:
    # Parameters (unlike buffers) become get_attr nodes under symbolic_trace,
    # so ops applied to them (weight dequantization) stay in the graph.
    return nn.Parameter(t, requires_grad=False)


class _QdqNet(nn.Module):
    """A residual CNN, quantized the way a PT2E graph looks after convert:
    every activation goes through quantize/dequantize and every weight is
    stored int8 and dequantized in the graph. ``quantized=False`` is the same
    network with no quantized_decomposed op at all."""

    def __init__(self, channels: int, blocks: int, classes: int, *, quantized: bool) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.quantized = quantized
        self.blocks = blocks
        for i in range(blocks):
            w = torch.randn(channels, channels, 3, 3, generator=gen) * 0.1
            self.register_parameter(f"w{i}", _frozen(self._weight(w)))
            self.register_parameter(f"b{i}", _frozen(torch.randn(channels, generator=gen)))
        fc = torch.randn(classes, channels, generator=gen) * 0.1
        self.fc_w = _frozen(self._weight(fc))
        self.fc_b = _frozen(torch.randn(classes, generator=gen))

    def _weight(self, w: torch.Tensor) -> torch.Tensor:
        if not self.quantized:
            return w
        return torch.clamp(torch.round(w / 0.01), _QMIN, _QMAX).to(torch.int8)

    def _dq_weight(self, w: torch.Tensor) -> torch.Tensor:
        if not self.quantized:
            return w
        return _qd.dequantize_per_tensor.default(w, 0.01, 0, _QMIN, _QMAX, torch.int8)

    def _qdq(self, x: torch.Tensor, scale: float, zero_point: int) -> torch.Tensor:
        if not self.quantized:
            return x
        q = _qd.quantize_per_tensor.default(x, scale, zero_point, _QMIN, _QMAX, torch.int8)
        return _qd.dequantize_per_tensor.default(q, scale, zero_point, _QMIN, _QMAX, torch.int8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self._qdq(x, 0.02, 0)
        for i in range(self.blocks):
            w = self._dq_weight(getattr(self, f"w{i}"))
            y = aten.conv2d.default(x, w, getattr(self, f"b{i}"), [1, 1], [1, 1], [1, 1], 1)
            y = self._qdq(y, 0.05, 3)
            y = aten.relu.default(y)
            y = self._qdq(y, 0.025, -128)
            x = aten.add.Tensor(x, y)
            x = self._qdq(x, 0.04, -5)
        pooled = self._qdq(aten.mean.dim(x, [2, 3]), 0.03, 1)
        out = aten.linear.default(pooled, self._dq_weight(self.fc_w), self.fc_b)
        return self._qdq(out, 0.1, 7)


class _DialectNet(nn.Module):
    """Integer TOSA-style blocks (conv2d -> rescale -> table) joined by aten
    residual adds, ending in a transpose and an aten flatten."""

    def __init__(self, channels: int, blocks: int) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(1)
        self.blocks = blocks
        self.channels = channels
        for i in range(blocks):
            w = torch.randint(_QMIN, _QMAX + 1, (channels, channels, 3, 3), generator=gen, dtype=torch.int8)
            self.register_parameter(f"w{i}", _frozen(w))
            self.register_parameter(
                f"b{i}", _frozen(torch.randint(-1000, 1000, (channels,), generator=gen, dtype=torch.int32))
            )
            lut = torch.randint(_QMIN, _QMAX + 1, (256,), generator=gen, dtype=torch.int8)
            self.register_parameter(f"lut{i}", _frozen(lut))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ops = dialect.ops
        # Per-channel scales, as a real rescale after a per-channel conv has.
        scales = [0.0005 * (1 + c % 7) for c in range(self.channels)]
        for i in range(self.blocks):
            y = ops.conv2d(x, getattr(self, f"w{i}"), getattr(self, f"b{i}"), [1, 1], [1, 1, 1, 1], [1, 1])
            y = ops.rescale(y, torch.int8, scales, 0, -2)
            y = ops.table(y, getattr(self, f"lut{i}"))
            x = aten.add.Tensor(x, y)
        x = ops.transpose(x, [0, 2, 3, 1])
        return aten.flatten.using_ints(x, 1)


def _lift_parameters(gm: torch.fx.GraphModule) -> tuple[torch.fx.GraphModule, list[torch.Tensor]]:
    """Turns get_attr nodes into leading placeholders, as torch.export lifts
    parameters, so every tensor the replay sees is a fake input of the mode."""
    graph = gm.graph
    first = next(iter(graph.nodes))
    lifted: list[torch.Tensor] = []
    for node in list(graph.nodes):
        if node.op != "get_attr":
            continue
        with graph.inserting_before(first):
            placeholder = graph.placeholder(f"p_{node.target}")
        node.replace_all_uses_with(placeholder)
        graph.erase_node(node)
        lifted.append(getattr(gm, str(node.target)).detach())
    graph.lint()
    return torch.fx.GraphModule(torch.nn.Module(), graph), lifted


def _trace(module: nn.Module, *example: torch.Tensor) -> tuple[torch.fx.GraphModule, tuple[torch.Tensor, ...]]:
    gm, params = _lift_parameters(torch.fx.symbolic_trace(module))
    for node in gm.graph.nodes:
        if node.op == "call_function" and not isinstance(node.target, torch._ops.OpOverload):
            raise TypeError(f"workload graph has a non-OpOverload target {node.target!r}")
    return gm, (*params, *example)


def _qdq(*, quantized: bool, batch: int, size: int, name: str, description: str, dynamic: bool = False) -> Workload:
    net = _QdqNet(channels=16, blocks=4, classes=10, quantized=quantized)
    x = torch.randn(batch, 16, size, size, generator=torch.Generator().manual_seed(2))
    gm, inputs = _trace(net, x)
    return Workload(name, description, gm, inputs, dynamic_batch=dynamic, batch_input=len(inputs) - 1)


def _dialect(*, batch: int, size: int) -> Workload:
    net = _DialectNet(channels=16, blocks=6)
    x = torch.randint(_QMIN, _QMAX + 1, (batch, 16, size, size), dtype=torch.int8)
    gm, inputs = _trace(net, x)
    return Workload(
        "dialect",
        f"{dialect.NAMESPACE} conv2d/rescale/table/transpose with aten adds",
        gm,
        inputs,
        batch_input=len(inputs) - 1,
    )


_BUILDERS: dict[str, Callable[[int], Workload]] = {
    "qdq": lambda size: _qdq(
        quantized=True,
        batch=2,
        size=size,
        name="qdq",
        description="PT2E-style quantize/dequantize around aten conv2d/relu/add/linear",
    ),
    "dialect": lambda size: _dialect(batch=2, size=size),
    "aten-only": lambda size: _qdq(
        quantized=False,
        batch=2,
        size=size,
        name="aten-only",
        description="the qdq network without any quantized_decomposed op",
    ),
    "symbolic": lambda size: _qdq(
        quantized=True,
        batch=4,
        size=size,
        name="symbolic",
        dynamic=True,
        description="the qdq graph with a dynamic batch dimension (ShapeEnv)",
    ),
}

WORKLOAD_NAMES: tuple[str, ...] = tuple(_BUILDERS)


def build_workload(name: str, *, size: int = 16) -> Workload:
    """Builds workload ``name`` with ``size`` x ``size`` images.

    Different sizes give the same graph with different cache keys, which the
    memory measurement uses to tell the configurations' entries apart.
    """
    try:
        builder = _BUILDERS[name]
    except KeyError:
        raise ValueError(f"unknown workload {name!r}; choose from {', '.join(WORKLOAD_NAMES)}") from None
    return builder(size)


def build_workloads(names: tuple[str, ...] = WORKLOAD_NAMES) -> list[Workload]:
    """Builds the named workloads, in order."""
    return [build_workload(n) for n in names]
