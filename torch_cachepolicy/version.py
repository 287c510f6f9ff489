"""The version of torch_cachepolicy, in one place.

``setup.py`` reads this file without importing the package (which needs
torch); ``torch_cachepolicy.__version__`` re-exports it. Keep it free of
imports.
"""

__version__ = "0.1.0"
