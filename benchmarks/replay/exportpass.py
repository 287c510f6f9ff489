"""Replaying a graph the way ExecuTorch's ExportPass does."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch._dispatch.python import enable_python_dispatcher
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.fx.experimental.symbolic_shapes import DimDynamic, StatelessSymbolicContext

from benchmarks.replay.workloads import Workload

__all__ = ["ExportPassInterpreter", "fake_inputs", "replay"]


class ExportPassInterpreter(torch.fx.Interpreter):
    """Re-dispatches every ``call_function`` node under the ambient fake mode.

    ExportPass builds a new graph while it does this; that bookkeeping costs
    the same under every configuration and is left out, so the ratios are
    those of dispatch plus interpretation. Values are kept (not freed after
    their last use) so the runner can check every node's output afterwards.
    """

    def __init__(self, graph: torch.fx.GraphModule) -> None:
        super().__init__(graph, garbage_collect_values=False)

    def call_function(self, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return target(*args, **kwargs)


def fake_inputs(mode: FakeTensorMode, workload: Workload) -> list[FakeTensor]:
    """Fakes of the workload's real inputs, created in ``mode``.

    With a ShapeEnv, the activation's batch dimension is dynamic and every
    other dimension static, so the graph's other sizes stay concrete.
    """
    if mode.shape_env is None:
        return [mode.from_tensor(t) for t in workload.inputs]
    fakes = []
    for i, t in enumerate(workload.inputs):
        dims = [
            DimDynamic.DYNAMIC if workload.dynamic_batch and i == workload.batch_input and d == 0 else DimDynamic.STATIC
            for d in range(t.dim())
        ]
        fakes.append(mode.from_tensor(t, symbolic_context=StatelessSymbolicContext(dynamic_sizes=dims)))
    return fakes


def replay(
    graph: torch.fx.GraphModule, mode: FakeTensorMode, inputs: Sequence[torch.Tensor], times: int
) -> list[Mapping[torch.fx.Node, Any]]:
    """Replays ``graph`` ``times`` times under ``mode``; returns each replay's
    node values.

    Each replay is one ExportPass call: a new interpreter, the mode and the
    Python dispatcher entered around the run.
    """
    envs: list[Mapping[torch.fx.Node, Any]] = []
    for _ in range(times):
        interpreter = ExportPassInterpreter(graph)
        with mode, enable_python_dispatcher():
            interpreter.run(*inputs)
        envs.append(interpreter.env)
    return envs
