"""The ExecuTorch backend flows as data: each a quantizer and a lowering.

Four flows (:data:`FLOWS`), each a :class:`Flow`: a model family, a
quantizer, and a lowering from a quantized ``ExportedProgram`` to the final
one. The first three lower the ``image`` models (static shapes):

* ``ethos-u55``: ``EthosUQuantizer`` for ``ethos-u55-128``, then
  ``to_edge_transform_and_lower(ep, partitioner=[EthosUPartitioner(spec)])``
  (TOSA dialect passes, Vela; one delegate);
* ``cortex-m``: ``CortexMQuantizer`` (CMSIS-NN), then ``to_edge(ep,
  compile_config=cortex_m_edge_compile_config())`` and
  ``CortexMPassManager(edge.exported_program()).transform()``, as
  ExecuTorch's Cortex-M tester drives it (no delegate: ops are rewritten to
  ``cortex_m`` ops in place);
* ``xnnpack``: ``XNNPACKQuantizer`` with its symmetric config, then
  ``to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()])``
  (one delegate, XNNPACK's flatbuffer).

The fourth lowers the ``sequence`` model (a transformer encoder) exported with
a dynamic sequence length (``torch.export.Dim``):

* ``xnnpack-dynamic``: the ``xnnpack`` flow's quantizer and lowering. XNNPACK
  does not delegate reshapes to a symbolic shape (``ViewCopyConfig``:
  "Symbolic reshape is not supported"), nor ``expand_copy`` and
  ``split_with_sizes_copy`` (no config), so every attention's head split and
  merge, its batched matmuls' expands and its QKV split stay outside and the
  program lowers to 1 + 6 delegates per layer (7 for the tiny model, 25 for
  the large one).

Every ExecuTorch import happens inside the function that needs it, so this
module imports without ExecuTorch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch.export import ExportedProgram

__all__ = ["ETHOS_U_TARGET", "FLOWS", "Flow", "get_flow"]

ETHOS_U_TARGET = "ethos-u55-128"
"""The Ethos-U compile target: an Ethos-U55 with 128 MACs per cycle."""


@dataclass(frozen=True)
class Flow:
    """One ExecuTorch backend flow.

    Attributes:
        name: the ``--flow`` name.
        title: a human-readable name.
        backend_namespaces: the backend namespaces whose ops the flow
            dispatches (the tests require hits on each under the policy).
        has_delegates: whether the lowered program calls delegates.
        channels_last: the example input must be channels-last (the Cortex-M
            quantizer only quantizes convolutions on channels-last inputs).
        make_quantizer: builds the flow's pt2e quantizer.
        lower_program: lowers a quantized exported program; returns the final
            ``ExportedProgram``.
        model_family: the family of :data:`~benchmarks.executorch.models.FAMILIES`
            the flow lowers (``image``: static shapes; ``sequence``: a dynamic
            sequence length).
    """

    name: str
    title: str
    backend_namespaces: tuple[str, ...]
    has_delegates: bool
    channels_last: bool
    make_quantizer: Callable[[], Any] = field(repr=False)
    lower_program: Callable[[ExportedProgram], ExportedProgram] = field(repr=False)
    model_family: str = "image"


def _ethos_u_spec() -> Any:
    from executorch.backends.arm.ethosu import EthosUCompileSpec

    return EthosUCompileSpec(ETHOS_U_TARGET)


def _ethos_u_quantizer() -> Any:
    from executorch.backends.arm.quantizer import EthosUQuantizer, get_symmetric_quantization_config

    quantizer = EthosUQuantizer(_ethos_u_spec())
    quantizer.set_global(get_symmetric_quantization_config())
    return quantizer


def _ethos_u_lower(ep: ExportedProgram) -> ExportedProgram:
    from executorch.backends.arm.ethosu import EthosUPartitioner
    from executorch.exir import to_edge_transform_and_lower

    return to_edge_transform_and_lower(ep, partitioner=[EthosUPartitioner(_ethos_u_spec())]).exported_program()


def _cortex_m_quantizer() -> Any:
    from executorch.backends.cortex_m.quantizer.quantizer import CortexMQuantizer

    return CortexMQuantizer()


def _cortex_m_lower(ep: ExportedProgram) -> ExportedProgram:
    from executorch.backends.cortex_m.edge_compile_config import cortex_m_edge_compile_config
    from executorch.backends.cortex_m.passes.cortex_m_pass_manager import CortexMPassManager
    from executorch.exir import to_edge

    edge = to_edge(ep, compile_config=cortex_m_edge_compile_config())
    return CortexMPassManager(edge.exported_program()).transform()  # type: ignore[no-any-return]


def _xnnpack_quantizer() -> Any:
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )

    quantizer = XNNPACKQuantizer()
    quantizer.set_global(get_symmetric_quantization_config())
    return quantizer


def _xnnpack_lower(ep: ExportedProgram) -> ExportedProgram:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    return to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).exported_program()


FLOWS: dict[str, Flow] = {
    flow.name: flow
    for flow in (
        Flow(
            "ethos-u55",
            f"Arm Ethos-U55 ({ETHOS_U_TARGET}, TOSA + Vela)",
            ("quantized_decomposed", "tosa"),
            has_delegates=True,
            channels_last=False,
            make_quantizer=_ethos_u_quantizer,
            lower_program=_ethos_u_lower,
        ),
        Flow(
            "cortex-m",
            "Arm Cortex-M (CMSIS-NN, CortexMPassManager)",
            ("quantized_decomposed", "cortex_m"),
            has_delegates=False,
            channels_last=True,
            make_quantizer=_cortex_m_quantizer,
            lower_program=_cortex_m_lower,
        ),
        Flow(
            "xnnpack",
            "XNNPACK (XnnpackPartitioner)",
            ("quantized_decomposed",),
            has_delegates=True,
            channels_last=False,
            make_quantizer=_xnnpack_quantizer,
            lower_program=_xnnpack_lower,
        ),
        Flow(
            "xnnpack-dynamic",
            "XNNPACK (XnnpackPartitioner), transformer with a dynamic sequence length",
            ("quantized_decomposed",),
            has_delegates=True,
            channels_last=False,
            make_quantizer=_xnnpack_quantizer,
            lower_program=_xnnpack_lower,
            model_family="sequence",
        ),
    )
}
"""The flows, by ``--flow`` name."""


def get_flow(name: str | Flow) -> Flow:
    """The :class:`Flow` named ``name`` (a ``Flow`` is returned as is).

    Raises:
        ValueError: unknown name.
    """
    if isinstance(name, Flow):
        return name
    try:
        return FLOWS[name]
    except KeyError:
        raise ValueError(f"unknown flow {name!r}; expected one of {sorted(FLOWS)}") from None
