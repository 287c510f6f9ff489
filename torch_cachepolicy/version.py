"""The version of torch_cachepolicy and the torch releases it asks for, in one place.

``setup.py`` reads this file without importing the package (which needs
torch); ``torch_cachepolicy.__version__`` re-exports it, and ``_compat`` reads
the torch releases. Keep it free of imports.
"""

__version__ = "0.2.0"

TORCH_REQUIREMENT = ">=2.13"
"""What ``install_requires`` and ``[build-system]`` ask of torch: the oldest supported release, and no upper cap
(as extension-cpp and torchao): a newer torch installs, and the package decides at import what it can do there
(Note [Checking torch's internals] in ``_compat.py``)."""

TESTED_TORCH = ("2.13.0", "2.14.1", "2.15.0")
"""The torch releases CI runs the tests on (``make test``), oldest first."""
