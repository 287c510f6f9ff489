"""Builds torch_cachepolicy and its optional C++ helper ``torch_cachepolicy._C``.

The fast path, against the torch already installed (the extension is then
built against that torch's headers)::

    pip install --no-build-isolation -e ".[test]"

``USE_CPP=0`` skips the C++ build; the package then uses torch's own key and
output synthesis (the same answers, slower) and a Python kernel watch. A plain ``pip install .`` or
``pip wheel .`` also works: pip then builds in an isolated environment with
the torch that ``pyproject.toml``'s ``[build-system]`` names, downloaded again.
"""

import glob
import os
import runpy

from setuptools import find_packages, setup

USE_CPP = os.environ.get("USE_CPP", "1") not in ("0", "false", "False", "")

# One source for the version and the torch requirement; read without importing the package, which needs torch.
_VERSION_PY = runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_cachepolicy", "version.py"))
VERSION = _VERSION_PY["__version__"]
TORCH_REQUIREMENT = "torch" + _VERSION_PY["TORCH_REQUIREMENT"]

ext_modules = []
cmdclass = {}
if USE_CPP:
    import torch
    from torch.utils.cpp_extension import BuildExtension, CppExtension

    ext_modules.append(
        CppExtension(
            "torch_cachepolicy._C",
            sorted(glob.glob("csrc/*.cpp")),
            # The headers too, so that a change to one rebuilds the extension (MANIFEST.in ships them in the sdist).
            depends=sorted(glob.glob("csrc/*.h")),
            # The torch it is built against: _native uses _C only under that very torch (Note [An extension built
            # for another torch] in torch_cachepolicy/_native.py).
            define_macros=[("TORCH_CACHEPOLICY_TORCH_VERSION", f'"{torch.__version__}"')],
            extra_compile_args={"cxx": ["-O2"]},
        )
    )
    cmdclass["build_ext"] = BuildExtension

setup(
    name="torch_cachepolicy",
    version=VERSION,
    description="Per-instance FakeTensor dispatch caching of backend operators, chosen by a policy",
    # The library only: benchmarks/ and test/ stay in the repository.
    packages=find_packages(include=["torch_cachepolicy", "torch_cachepolicy.*"]),
    package_data={"torch_cachepolicy": ["py.typed"]},
    python_requires=">=3.10",
    # The oldest supported torch and no upper cap (version.py); a newer torch installs and the package decides at
    # import what it can do there. typing-extensions: `override` marks each method that overrides a torch internal.
    install_requires=[TORCH_REQUIREMENT, "typing-extensions>=4.4"],
    extras_require={
        # What the tests import (expecttest through torch.testing._internal.common_utils).
        "test": ["expecttest", "pytest", "numpy"],
        # `make lint`; pinned because new releases add rules and checks.
        "lint": ["ruff==0.17.6", "mypy==2.4.1"],
        # The benchmarks' charts (benchmarks/charts.py), installed by the Makefile's bench targets;
        # without it the benchmarks print and write their tables and skip the charts.
        "bench": ["matplotlib==3.11.2"],
    },
    ext_modules=ext_modules,
    cmdclass=cmdclass,
)
