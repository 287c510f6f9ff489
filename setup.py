"""Builds torch_cachepolicy and its optional C++ helper ``torch_cachepolicy._C``.

The fast path, against the torch already installed (the extension is then
built against that torch's headers)::

    pip install --no-build-isolation -e ".[test]"

``USE_CPP=0`` skips the C++ build; the package then uses torch's own key and
output synthesis (the same answers, slower) and a Python kernel watch. Without
``USE_CPP`` a failed build (no working C++ compiler) prints a warning and
installs the package without the helper, as ``USE_CPP=0`` would;
``USE_CPP=1`` makes it an error (make sets it). A plain ``pip install .`` or
``pip wheel .`` also works: pip then builds in an isolated environment with
the torch that ``pyproject.toml``'s ``[build-system]`` names, downloaded again
(the package uses that ``_C`` only if the same torch is installed).
"""

import glob
import os
import runpy
import sys

from setuptools import find_packages, setup

USE_CPP = os.environ.get("USE_CPP", "1") not in ("0", "false", "False", "")
# Whether a failed build of the helper stops the install, rather than leaving the package without it.
REQUIRE_CPP = os.environ.get("USE_CPP") in ("1", "true", "True")

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

    class BuildOptionalExtension(BuildExtension):
        """Builds the helper if this machine can; otherwise warns and builds nothing (unless ``USE_CPP=1``)."""

        def run(self) -> None:
            try:
                super().run()
            except Exception as e:  # torch's compiler check, a compile or a link: each fails with its own type
                if REQUIRE_CPP:
                    raise
                print(
                    f"WARNING: torch_cachepolicy: the C++ helper torch_cachepolicy._C could not be built "
                    f"({type(e).__name__}: {e}); the package is installed without it and runs on its pure-Python "
                    "paths (the same answers, slower). Install a C++ compiler and reinstall to build it, or set "
                    "USE_CPP=0 to skip the build (USE_CPP=1 makes a failed build an error).",
                    file=sys.stderr,
                )
                self.extensions = []  # nothing built: nothing to copy in place or to list in the wheel

    cmdclass["build_ext"] = BuildOptionalExtension

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
