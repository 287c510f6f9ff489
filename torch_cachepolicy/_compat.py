"""The private torch internals this package builds on, checked once at import."""

from __future__ import annotations

import importlib

import torch

SUPPORTED_TORCH = "2.13"

# (module, attribute path) pairs; each is read, never written.
_REQUIRED: tuple[tuple[str, str], ...] = (
    ("torch._subclasses.fake_tensor", "FakeTensorMode._cached_dispatch_impl"),
    ("torch._subclasses.fake_tensor", "FakeTensorMode._cache_key"),
    ("torch._subclasses.fake_tensor", "FakeTensorMode._validate_cache_key"),
    ("torch._subclasses.fake_tensor", "FakeTensorMode._make_cache_entry"),
    ("torch._subclasses.fake_tensor", "FakeTensorMode._output_from_cache_entry"),
    ("torch._subclasses.fake_tensor", "FakeTensorMode._dispatch_impl"),
    ("torch._subclasses.fake_tensor", "FakeTensorMode.cache"),
    ("torch._subclasses.fake_tensor", "_DispatchCacheBypassEntry"),
    ("torch._subclasses.fake_tensor", "_BypassDispatchCache"),
    ("torch._subclasses.fake_tensor", "DispatchCacheInfo"),
    ("torch._subclasses.fake_tensor", "disable_fake_tensor_cache"),
    ("torch._subclasses.meta_utils", "assert_metadata_eq"),
    ("torch._subclasses.meta_utils", "assert_eq"),
    ("torch._subclasses._fake_tensor_utils", "_CacheKeyState"),
    ("torch._library.simple_registry", "singleton"),
    ("torch._higher_order_ops.utils", "registered_hop_fake_fns"),
)


def check_torch_internals() -> None:
    """Raises ImportError naming the first missing internal, if any."""
    for module_name, path in _REQUIRED:
        try:
            obj: object = importlib.import_module(module_name)
            for part in path.split("."):
                obj = getattr(obj, part)
        except (ImportError, AttributeError) as e:
            raise ImportError(
                f"torch_cachepolicy needs {module_name}.{path}, which torch "
                f"{torch.__version__} does not have ({e!r}); supported torch versions: "
                f"{SUPPORTED_TORCH}.x (pip install torch=={SUPPORTED_TORCH}.0)"
            ) from e
