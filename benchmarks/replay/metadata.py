"""What every replay must reproduce exactly: each node output's metadata."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import sympy
import torch
import torch.utils._pytree as pytree

__all__ = ["GraphMetadata", "capture", "first_difference"]

# Per call_function node, in graph order: (node name, per output leaf a tuple
# of (shape, dtype, stride, storage offset, device, storage owner) or the
# value's text for non-tensor leaves).
GraphMetadata = tuple[tuple[str, tuple[object, ...]], ...]


class _SymbolNames:
    """Names a replay's symbols by first appearance, so two modes (two
    ShapeEnvs that may number their symbols differently) compare equal when
    their outputs have the same symbolic structure."""

    def __init__(self) -> None:
        self._names: dict[sympy.Symbol, sympy.Symbol] = {}

    def text(self, value: object) -> str:
        if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            expr = value.node.expr
            for sym in sorted(expr.free_symbols, key=str):
                if sym not in self._names:
                    self._names[sym] = sympy.Symbol(f"d{len(self._names)}", integer=True)
            return str(expr.xreplace(self._names))
        return repr(value)

    def seq(self, values: Iterable[object]) -> str:
        return "(" + ", ".join(self.text(v) for v in values) + ")"


def capture(graph: torch.fx.GraphModule, env: Mapping[torch.fx.Node, Any]) -> GraphMetadata:
    """The metadata of every ``call_function`` node's output in one replay.

    The storage owner is the first node (placeholders included) whose output
    uses the same storage, so a cache hit that loses or invents aliasing is
    caught as well as a wrong shape, dtype or stride.
    """
    names = _SymbolNames()
    owners: dict[int, str] = {}
    captured: list[tuple[str, tuple[object, ...]]] = []
    for node in graph.graph.nodes:
        if node.op not in ("placeholder", "call_function"):
            continue
        leaves: list[object] = []
        for leaf in pytree.tree_leaves(env[node]):
            if isinstance(leaf, torch.Tensor):
                owner = owners.setdefault(leaf.untyped_storage()._cdata, node.name)
                leaves.append(
                    (
                        names.seq(leaf.shape),
                        str(leaf.dtype),
                        names.seq(leaf.stride()),
                        names.text(leaf.storage_offset()),
                        str(leaf.device),
                        owner,
                    )
                )
            else:
                leaves.append(names.text(leaf))
        if node.op == "call_function":
            captured.append((node.name, tuple(leaves)))
    return tuple(captured)


def first_difference(expected: GraphMetadata, actual: GraphMetadata) -> str | None:
    """A sentence naming the first node whose metadata differs, or None."""
    if len(expected) != len(actual):
        return f"{len(actual)} nodes captured, expected {len(expected)}"
    for (name, exp), (_, act) in zip(expected, actual, strict=True):
        if exp != act:
            return f"node {name}: got {act}, expected {exp}"
    return None
