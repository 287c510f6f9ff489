"""Per-instance FakeTensor dispatch caching of backend operators, chosen by a policy.

Example::

    import torch_cachepolicy as tcp

    policy = tcp.CachePolicy(namespaces=["quantized_decomposed"])
    with tcp.FakeTensorMode(cache_policy=policy) as mode:
        ...
    print(mode.cache_report())
"""

from torch_cachepolicy._compat import (
    TorchDriftWarning,
    UnlistedKernelSourceWarning,
    UntestedTorchWarning,
    check_torch_internals,
)

check_torch_internals()

from torch_cachepolicy._verify import CrosscheckError  # noqa: E402
from torch_cachepolicy.adopt import adopt  # noqa: E402
from torch_cachepolicy.export import export  # noqa: E402
from torch_cachepolicy.mode import FakeTensorMode  # noqa: E402
from torch_cachepolicy.policy import BUILTIN_NAMESPACES, CacheDecision, CachePolicy  # noqa: E402
from torch_cachepolicy.report import CacheReport, KeyStats, OpReport  # noqa: E402
from torch_cachepolicy.store import CacheStore  # noqa: E402
from torch_cachepolicy.version import __version__ as __version__  # noqa: E402

__all__ = [
    "BUILTIN_NAMESPACES",
    "CacheDecision",
    "CachePolicy",
    "CacheReport",
    "CacheStore",
    "CrosscheckError",
    "FakeTensorMode",
    "KeyStats",
    "OpReport",
    "TorchDriftWarning",
    "UnlistedKernelSourceWarning",
    "UntestedTorchWarning",
    "adopt",
    "export",
]
