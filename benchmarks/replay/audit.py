"""Which of a configuration's cache hits equal an uncached dispatch.

Counting hits says how often a configuration reuses an entry, not whether the
reuse was right. The audit replays a workload once per caching configuration
(untimed, after the timed rounds) and re-dispatches, with the mode's cache
off, every node call that the cache served whole (the call's dispatches were
all hits). A served call is *stale* when the uncached dispatch returns other
metadata (shapes, strides, offsets, dtypes, symbols by expression) or teaches
the ShapeEnv something the hit skipped (a guard, a runtime assertion, a
replacement): a symbolic entry reused under other knowledge skips the guards
its kernel would take. The targets compare what each configuration serves
correctly, so a configuration cannot win by serving stale entries.

The policy files a symbolic entry under what the ShapeEnv knows about the
key's symbols (Note [What the ShapeEnv knows] in torch_cachepolicy/_symbols.py), so
the first call of a node after the ShapeEnv learnt something is a miss even
where reuse would have been right, as it is for a kernel that never asks. The
audit counts those calls (``relearnt``: a node dispatched again, not served,
with the ShapeEnv knowing more than at the node's previous dispatch).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch._dispatch.python import enable_python_dispatcher
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv
from torch.utils import _pytree as pytree

from benchmarks.replay.configs import Configuration
from benchmarks.replay.exportpass import ExportPassInterpreter, fake_inputs
from benchmarks.replay.workloads import Workload

__all__ = ["Audit", "audit_configuration"]


@dataclass
class Audit:
    """What one configuration's cache served in one audited series.

    Attributes:
        served: node calls the cache served whole (every dispatch a hit).
        stale: of those, the calls an uncached dispatch answered differently.
        relearnt: calls not served that follow new ShapeEnv knowledge since the node's previous dispatch.
        examples: the first few stale calls, one sentence each.
    """

    served: int = 0
    stale: int = 0
    relearnt: int = 0
    examples: list[str] = field(default_factory=list)
    last_knowledge: dict[str, tuple[int, ...]] = field(default_factory=dict, repr=False)

    @property
    def correct(self) -> int:
        """Served calls that equal an uncached dispatch."""
        return self.served - self.stale

    def to_json(self) -> dict[str, Any]:
        return {
            "served": self.served,
            "stale": self.stale,
            "correct": self.correct,
            "relearnt": self.relearnt,
            "examples": self.examples,
        }


def _describe(value: Any) -> list[str]:
    out = []
    for leaf in pytree.tree_leaves(value):
        if isinstance(leaf, torch.Tensor):
            out.append(f"{leaf.dtype} {tuple(leaf.shape)} {leaf.stride()} +{leaf.storage_offset()} {leaf.device}")
        else:
            out.append(repr(leaf))
    return out


def _knowledge(shape_env: ShapeEnv | None) -> tuple[int, ...]:
    """How much the ShapeEnv has learnt: it only grows, so equal sizes mean nothing was learnt."""
    if shape_env is None:
        return ()
    asserts = sum(len(v) for v in shape_env.deferred_runtime_asserts.values())
    return (len(shape_env.guards), asserts, len(shape_env.replacements), len(shape_env.divisible))


@contextlib.contextmanager
def _uncached(mode: FakeTensorMode) -> Iterator[None]:
    enabled = mode.cache_enabled
    mode.cache_enabled = False
    try:
        yield
    finally:
        mode.cache_enabled = enabled


class _AuditingInterpreter(ExportPassInterpreter):
    def __init__(self, graph: torch.fx.GraphModule, config: Configuration, mode: FakeTensorMode, audit: Audit):
        super().__init__(graph)
        self.config, self.mode, self.audit = config, mode, audit
        self.node_name = ""

    def run_node(self, n: torch.fx.Node) -> Any:
        self.node_name = n.name
        return super().run_node(n)

    def call_function(self, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        shape_env = self.mode.shape_env
        learnt = _knowledge(shape_env)
        previously = self.audit.last_knowledge.get(self.node_name)
        self.audit.last_knowledge[self.node_name] = learnt
        before = self.config.counts(self.mode)
        out = target(*args, **kwargs)
        delta = self.config.counts(self.mode) - before
        if delta.hits == 0 or delta.misses or delta.bypasses:
            if previously is not None and previously != learnt:
                self.audit.relearnt += 1
            return out
        self.audit.served += 1
        learnt = _knowledge(shape_env)
        with _uncached(self.mode):
            again = target(*args, **kwargs)
        if _describe(out) != _describe(again) or _knowledge(shape_env) != learnt:
            self.audit.stale += 1
            if len(self.audit.examples) < 3:
                what = "output" if _describe(out) != _describe(again) else "ShapeEnv knowledge (guards, asserts)"
                self.audit.examples.append(f"{target}: the uncached dispatch differs in {what}")
        return out


def audit_configuration(config: Configuration, workload: Workload, replays: int) -> Audit:
    """Replays ``workload`` ``replays`` times in a fresh mode of ``config``, auditing every served call."""
    mode = config.make_mode(ShapeEnv() if workload.dynamic_batch else None)
    inputs = fake_inputs(mode, workload)
    audit = Audit()
    with config.scope(mode):
        for _ in range(replays):
            with mode, enable_python_dispatcher():
                _AuditingInterpreter(workload.graph, config, mode, audit).run(*inputs)
    return audit
