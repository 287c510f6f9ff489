"""A real client: ExecuTorch lowering flows, stock vs PR 21700's patch vs a policy mode.

Run ``python -m benchmarks.executorch [--flow F] [--model M] [--repeats N]
[--configs C,...] [--json PATH] [--census]`` from the repository root with
ExecuTorch 1.5.1 installed (``pip install --no-deps -r
requirements-executorch.txt``). The package imports without ExecuTorch: every
ExecuTorch import happens inside the functions that need it.

A model (:data:`MODELS`: ``tiny``, a two-convolution net, or ``large``, a
MobileNet-style stack of depthwise-separable blocks; seeded random weights) is
quantized once per flow (:data:`FLOWS`: ``ethos-u55``, ``cortex-m``,
``xnnpack``), exported afresh for every lowering (a lowering consumes its
program), and lowered under each configuration of :data:`CONFIGS` (``stock``,
``global-patch``, ``policy``, ``policy-isolated``), interleaved after one
discarded warm-up round. Only the lowering call is timed. Every lowering of a
flow must produce the same delegate payloads, graph code and constants.
``--census`` additionally runs each flow's whole pipeline under
:mod:`benchmarks.dispatch_recorder` and reports the fake dispatches the policy
does not reach; ``--split`` splits one lowering's time into fake dispatch (by
cache outcome and mode) and the rest, and reports each configuration's
distance to a lowering whose fake dispatches were all free.

Modules:

* :mod:`.models`: the models (:class:`TinyConvNet`, :class:`MobileNetStyle`,
  :func:`build_model`; :class:`SequenceTransformer` and :func:`model_case`
  for the dynamic-shape flow);
* :mod:`.flows`: the flows as data (:class:`Flow`, :data:`FLOWS`,
  :func:`get_flow`), each a quantizer and a lowering;
* :mod:`.lowering`: one lowering (:func:`quantized_program_factory`,
  :func:`lower`, :class:`Lowering`) and the configurations;
* :mod:`.runner`: the interleaved, timed run (:func:`run`) and its ratios;
* :mod:`.census`: the dispatch census (:func:`census_pipeline`, :func:`census`)
  and the split of a lowering (:func:`split_lowering`);
* :mod:`.render`: the results as Markdown;
* :mod:`.environment`: the ExecuTorch version required and the machine recorded;
* :mod:`.cli`: the command line (:func:`main`).
"""

from benchmarks.executorch.census import census, census_pipeline, split_lowering
from benchmarks.executorch.cli import main
from benchmarks.executorch.environment import EXECUTORCH_VERSION, executorch_version
from benchmarks.executorch.flows import ETHOS_U_TARGET, FLOWS, Flow, get_flow
from benchmarks.executorch.lowering import CONFIGS, Lowering, lower, program_mode, quantized_program_factory
from benchmarks.executorch.models import (
    FAMILIES,
    MODELS,
    MobileNetStyle,
    ModelCase,
    SequenceTransformer,
    TinyConvNet,
    build_model,
    model_case,
)
from benchmarks.executorch.render import render_census, render_markdown, render_split
from benchmarks.executorch.runner import run

__all__ = [
    "CONFIGS",
    "ETHOS_U_TARGET",
    "EXECUTORCH_VERSION",
    "FAMILIES",
    "FLOWS",
    "MODELS",
    "Flow",
    "Lowering",
    "MobileNetStyle",
    "ModelCase",
    "SequenceTransformer",
    "TinyConvNet",
    "build_model",
    "census",
    "census_pipeline",
    "executorch_version",
    "get_flow",
    "lower",
    "main",
    "model_case",
    "program_mode",
    "quantized_program_factory",
    "render_census",
    "render_markdown",
    "render_split",
    "run",
    "split_lowering",
]
