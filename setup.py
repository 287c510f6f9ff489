"""Builds torch_cachepolicy and its optional C++ helper ``torch_cachepolicy._C``.

``USE_CPP=0 pip install --no-build-isolation -e .`` skips the C++ build; the
package then answers dispatcher questions through its pure-Python fallback.
"""

import os

from setuptools import find_packages, setup

USE_CPP = os.environ.get("USE_CPP", "1") not in ("0", "false", "False", "")

ext_modules = []
cmdclass = {}
if USE_CPP:
    from torch.utils.cpp_extension import BuildExtension, CppExtension

    ext_modules.append(
        CppExtension(
            "torch_cachepolicy._C",
            ["csrc/keyset.cpp"],
            extra_compile_args={"cxx": ["-O2"]},
        )
    )
    cmdclass["build_ext"] = BuildExtension

setup(
    name="torch_cachepolicy",
    version="0.1.0",
    description="Per-instance FakeTensor dispatch caching of backend operators, chosen by a policy",
    packages=find_packages(include=["torch_cachepolicy", "torch_cachepolicy.*"]),
    package_data={"torch_cachepolicy": ["py.typed"]},
    python_requires=">=3.10",
    install_requires=["torch==2.13.0", "typing-extensions"],
    extras_require={"test": ["expecttest", "pytest", "numpy"]},
    ext_modules=ext_modules,
    cmdclass=cmdclass,
)
