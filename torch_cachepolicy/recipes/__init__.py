"""Ready-made cache policies for specific clients of ``torch_cachepolicy``.

Each recipe is its own module and imports its client only when used, so
importing a recipe costs nothing when the client is not installed:

* :mod:`torch_cachepolicy.recipes.executorch`: ExecuTorch's Arm (TOSA,
  Ethos-U, Cortex-M) lowering.
"""
