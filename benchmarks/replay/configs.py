"""The three configurations the benchmark compares, and how each is counted."""

from __future__ import annotations

import abc
import contextlib
from dataclasses import dataclass, field

from torch._subclasses import fake_tensor as _ft
from torch._subclasses.fake_tensor import DispatchCacheInfo
from torch.fx.experimental.symbolic_shapes import ShapeEnv

import torch_cachepolicy as tcp
from benchmarks.global_patch import global_patch

__all__ = [
    "CONFIG_NAMES",
    "Configuration",
    "Counts",
    "GlobalPatch",
    "Policy",
    "Stock",
    "make_configurations",
]


@dataclass(frozen=True)
class Counts:
    """Cache outcomes of the dispatches made during one measured span."""

    hits: int = 0
    misses: int = 0
    bypass_reasons: dict[str, int] = field(default_factory=dict)

    @property
    def bypasses(self) -> int:
        return sum(self.bypass_reasons.values())

    @classmethod
    def of(cls, info: DispatchCacheInfo) -> Counts:
        return cls(info.hits, info.misses, dict(info.bypasses))

    def __sub__(self, before: Counts) -> Counts:
        reasons = {
            k: v - before.bypass_reasons.get(k, 0)
            for k, v in self.bypass_reasons.items()
            if v != before.bypass_reasons.get(k, 0)
        }
        return Counts(self.hits - before.hits, self.misses - before.misses, reasons)

    def to_json(self) -> dict[str, object]:
        return {
            "hits": self.hits,
            "misses": self.misses,
            "bypasses": self.bypasses,
            "bypass_reasons": dict(sorted(self.bypass_reasons.items())),
        }


class Configuration(abc.ABC):
    """How one configuration makes its mode, scopes a replay series, and counts.

    Args:
        namespaces: the backend namespaces a caching configuration opts in to.
    """

    name: str = ""
    summary: str = ""

    def __init__(self, namespaces: tuple[str, ...]) -> None:
        self.namespaces = namespaces

    @abc.abstractmethod
    def make_mode(self, shape_env: ShapeEnv | None) -> _ft.FakeTensorMode:
        """A fresh mode, as ExportPass would find on an exported program."""

    def scope(self, mode: _ft.FakeTensorMode) -> contextlib.AbstractContextManager[None]:
        """Entered around a mode's replay series (outside the timed span)."""
        return contextlib.nullcontext()

    @abc.abstractmethod
    def counts(self, mode: _ft.FakeTensorMode) -> Counts:
        """A snapshot of the counters that this configuration's dispatches bump;
        the runner subtracts a snapshot taken before from one taken after."""


class Stock(Configuration):
    """torch's FakeTensorMode as shipped."""

    name = "stock"
    summary = "torch FakeTensorMode as shipped"

    def make_mode(self, shape_env: ShapeEnv | None) -> _ft.FakeTensorMode:
        return _ft.FakeTensorMode(allow_non_fake_inputs=True, shape_env=shape_env)

    def counts(self, mode: _ft.FakeTensorMode) -> Counts:
        # Stock counts only in class attributes, shared by every stock mode;
        # series run one at a time, so a before/after delta is this mode's.
        return Counts.of(_ft.FakeTensorMode.cache_info())


class GlobalPatch(Stock):
    """Stock mode inside the process-global ``is_builtin`` swap (baseline)."""

    name = "global-patch"
    summary = "stock mode + PR 21700 process-global is_builtin swap (baseline)"

    def __init__(self, namespaces: tuple[str, ...], *, keep_positive_entries: bool = False) -> None:
        super().__init__(namespaces)
        self.keep_positive_entries = keep_positive_entries

    def scope(self, mode: _ft.FakeTensorMode) -> contextlib.AbstractContextManager[None]:
        # One patch scope spans the whole series, like one scope around a
        # pipeline of passes: generous to the baseline, since its eviction
        # scans happen once per series and outside the timed span.
        return global_patch(
            self.namespaces, shape_envs=[mode.shape_env], keep_positive_entries=self.keep_positive_entries
        )


class Policy(Configuration):
    """``torch_cachepolicy.FakeTensorMode`` with a per-instance policy."""

    name = "policy"
    summary = "torch_cachepolicy.FakeTensorMode(cache_policy=CachePolicy(namespaces=...))"

    def __init__(self, namespaces: tuple[str, ...]) -> None:
        super().__init__(namespaces)
        self.policy = tcp.CachePolicy(namespaces=list(namespaces))

    def make_mode(self, shape_env: ShapeEnv | None) -> _ft.FakeTensorMode:
        return tcp.FakeTensorMode(cache_policy=self.policy, allow_non_fake_inputs=True, shape_env=shape_env)

    def counts(self, mode: _ft.FakeTensorMode) -> Counts:
        assert isinstance(mode, tcp.FakeTensorMode)
        return Counts.of(mode.cache_info())


CONFIG_NAMES: tuple[str, ...] = (Stock.name, GlobalPatch.name, Policy.name)


def make_configurations(namespaces: tuple[str, ...]) -> list[Configuration]:
    """The three configurations, in the order ``CONFIG_NAMES`` lists them."""
    return [Stock(namespaces), GlobalPatch(namespaces), Policy(namespaces)]
