"""A mode's cache statistics: the counters its dispatches bump, and their snapshots."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from torch._ops import OpOverloadPacket

__all__ = ["CacheReport", "KeyStats", "OpReport"]


class OpStats:
    """Mutable counters of one operator in one mode (the hit path bumps these)."""

    __slots__ = ("bypasses", "hits", "misses")

    def __init__(self) -> None:
        self.hits = 0
        self.misses = 0
        self.bypasses: dict[str, int] = {}

    def bypass(self, reason: str) -> None:
        self.bypasses[reason] = self.bypasses.get(reason, 0) + 1


class KeyStats:
    """Keys one mode's C++ builder produced (``built``), and ``{reason: count}`` of those left to torch's ``_cache_key``."""

    __slots__ = ("built", "fallbacks")

    def __init__(self) -> None:
        self.built = 0
        self.fallbacks: dict[str, int] = {}

    def fall_back(self, reason: str) -> None:
        self.fallbacks[reason] = self.fallbacks.get(reason, 0) + 1

    @property
    def handled_share(self) -> float:
        """The share of keys the builder produced (1.0 with no keys yet)."""
        total = self.built + sum(self.fallbacks.values())
        return self.built / total if total else 1.0

    def __repr__(self) -> str:
        return f"KeyStats(built={self.built}, fallbacks={dict(sorted(self.fallbacks.items()))})"


@dataclass(frozen=True)
class OpReport:
    """Hits, misses and bypasses (by reason) of one operator."""

    op: str
    hits: int
    misses: int
    bypasses: dict[str, int] = field(default_factory=dict)

    @property
    def namespace(self) -> str:
        return self.op.split("::", 1)[0] if "::" in self.op else "(hop)"

    @property
    def calls(self) -> int:
        return self.hits + self.misses + sum(self.bypasses.values())


@dataclass(frozen=True)
class CacheReport(Mapping[str, OpReport]):
    """A snapshot of :meth:`FakeTensorMode.cache_report`: a mapping from each dispatched operator's name
    (``"aten::add.Tensor"``, ``"invoke_subgraph"``) to its :class:`OpReport`, in name order.

    ``report[op]`` and ``op in report`` also take the operator itself (an ``OpOverload``, a higher-order operator).
    """

    ops: tuple[OpReport, ...]

    @classmethod
    def from_stats(cls, stats: dict[object, OpStats]) -> CacheReport:
        rows = [
            OpReport(_op_name(op), s.hits, s.misses, dict(sorted(dict(s.bypasses).items())))
            for op, s in list(stats.items())
        ]
        return cls(tuple(sorted(rows, key=lambda r: r.op)))

    def by_namespace(self) -> dict[str, tuple[int, int, int]]:
        """``{namespace: (hits, misses, bypasses)}``."""
        out: dict[str, tuple[int, int, int]] = {}
        for r in self.ops:
            h, m, b = out.get(r.namespace, (0, 0, 0))
            out[r.namespace] = (h + r.hits, m + r.misses, b + sum(r.bypasses.values()))
        return dict(sorted(out.items()))

    def __getitem__(self, op: object) -> OpReport:
        name = _op_name(op)
        for r in self.ops:
            if r.op == name:
                return r
        # Rows are per overload: a packet, or its name ("ns::op"), names them all.
        packet = op._qualified_op_name if isinstance(op, OpOverloadPacket) else None
        if isinstance(op, str) and "." not in op.partition("::")[2]:
            packet = op
        if packet is not None:
            name = packet
            dispatched = [r.op for r in self.ops if r.op.rpartition(".")[0] == name]
            if dispatched:
                raise KeyError(f"torch_cachepolicy.CacheReport[...]: {name} has a row per overload; pass one of {dispatched}")
            raise KeyError(f"torch_cachepolicy.CacheReport[...]: no overload of {name} was dispatched by this mode")
        raise KeyError(f"torch_cachepolicy.CacheReport[...]: {name} was not dispatched by this mode")

    def __iter__(self) -> Iterator[str]:
        return (r.op for r in self.ops)

    def __len__(self) -> int:
        return len(self.ops)

    def __str__(self) -> str:
        if not self.ops:
            return "(no dispatches)"
        width = max(len(r.op) for r in self.ops)
        lines = [f"{'op':<{width}}  hits  misses  bypasses"]
        for r in self.ops:
            why = ", ".join(f"{k}: {v}" for k, v in r.bypasses.items())
            lines.append(f"{r.op:<{width}}  {r.hits:>4}  {r.misses:>6}  {why}".rstrip())
        return "\n".join(lines)


def _op_name(op: object) -> str:
    name = getattr(op, "name", None)
    if callable(name):
        n = name()
        overload = getattr(op, "_overloadname", None)
        return f"{n}.{overload}" if overload and "." not in n else str(n)
    return str(op)
