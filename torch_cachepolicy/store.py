"""``CacheStore``: where a policy mode keeps the entries that depend on its policy."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Hashable, Iterator
from typing import TYPE_CHECKING, Any

from torch_cachepolicy._names import describe_value

if TYPE_CHECKING:
    from torch._subclasses.fake_tensor import _DispatchCacheEntry, _DispatchCacheKey
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

__all__ = ["CacheStore"]


class Table(dict["_DispatchCacheKey", "_DispatchCacheEntry"]):
    """A dict of entries, weak-referenceable so a GraphModule's finalizer can evict keys without keeping it alive."""

    __slots__ = ("__weakref__",)


# A ShapeEnv's attribute holding its tables, per partition (Note [Symbolic entries live on the ShapeEnv]).
_SHAPE_ENV_ATTR = "_torch_cachepolicy_tables"


class _EnvTables(weakref.WeakKeyDictionary["Partition", dict[Hashable, Table]]):
    """A ShapeEnv's tables by partition: a cache, so every copy of the ShapeEnv (copy, deepcopy, pickle) starts
    without them, as a copied mode's store does; its entries hold what only this ShapeEnv and store mean."""

    def __copy__(self) -> _EnvTables:
        return _EnvTables()

    def __deepcopy__(self, memo: dict[int, Any]) -> _EnvTables:
        return _EnvTables()

    def __reduce__(self) -> tuple[Any, ...]:
        return (_EnvTables, ())


class Partition:
    """The entries made under one policy identity."""

    # Note [Sub-tables]
    # ~~~~~~~~~~~~~~~~~
    # Backend ops' entries also depend on the policy's context and the fake kernel. Rather than widen every key
    # (rehashing a long tuple per hit), each table key (_kernels.KernelDeps.table_key) selects a sub-table.
    #
    # Note [Symbolic entries live on the ShapeEnv]
    # ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    # An entry whose key holds symbols means something only in their ShapeEnv: keys compare symbols by expression
    # (one ShapeEnv's s0 equals another's), its sub-table holds what that ShapeEnv knows, and the stripped key keeps
    # parts of SymNodes. So, like shape_env.fake_tensor_cache, the tables hang off the ShapeEnv (an attribute weakly
    # keyed by partition) and die with it; a weak set of ShapeEnvs lets the store count and clear them. Copies of
    # the ShapeEnv, of its SymInts, of a mode or of a graph holding them start without them (_EnvTables): nothing
    # of the package's reaches a copy of torch's objects.

    __slots__ = ("__weakref__", "_lock", "_shape_envs", "tables")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.tables: dict[Hashable, Table] = {}
        self._shape_envs: weakref.WeakSet[ShapeEnv] = weakref.WeakSet()

    def table(self, sub: Hashable, shape_env: ShapeEnv | None) -> Table:
        if shape_env is None:
            table = self.tables.get(sub)
            if table is None:
                table = self.tables.setdefault(sub, Table())
            return table
        per_env = self._env_tables(shape_env)
        table = per_env.get(sub)
        if table is None:
            table = per_env.setdefault(sub, Table())
        return table

    def _env_tables(self, shape_env: ShapeEnv, create: bool = True) -> dict[Hashable, Table]:
        by_partition = shape_env.__dict__.get(_SHAPE_ENV_ATTR)
        per_env = None if by_partition is None else by_partition.get(self)
        if per_env is None and create:
            with self._lock:
                by_partition = shape_env.__dict__.setdefault(_SHAPE_ENV_ATTR, _EnvTables())
                per_env = by_partition.setdefault(self, {})
                self._shape_envs.add(shape_env)
        return per_env if per_env is not None else {}

    def _shape_envs_now(self) -> list[ShapeEnv]:
        # Under the lock _env_tables adds with: iterating a WeakSet another thread adds to raises.
        with self._lock:
            return list(self._shape_envs)

    def all_tables(self) -> Iterator[Table]:
        yield from list(self.tables.values())
        for shape_env in self._shape_envs_now():
            yield from list(self._env_tables(shape_env, create=False).values())

    def clear(self) -> None:
        self.tables.clear()
        for shape_env in self._shape_envs_now():
            self._env_tables(shape_env, create=False).clear()


class CacheStore:
    """Private FakeTensor cache storage for one or more policy modes.

    Modes given one store (an ExportPass can end up with two) share entries, partitioned by ``CachePolicy.identity``.

    Args:
        isolated: keep *every* entry here; by default aten, prim and prims entries are shared with torch's
            storage, as a stock mode shares them.
    """

    def __init__(self, *, isolated: bool = False) -> None:
        if not isinstance(isolated, bool):
            raise TypeError(f"torch_cachepolicy.CacheStore(isolated=...): expected True or False, got {describe_value(isolated)}")
        self._isolated = isolated
        self._lock = threading.Lock()
        self._partitions: dict[Hashable, Partition] = {}

    @property
    def isolated(self) -> bool:
        """Whether entries of builtin ops stay private too."""
        return self._isolated

    def __reduce__(self) -> tuple[Any, ...]:
        # A store is a cache: copies (copy.copy, copy.deepcopy, pickle) start empty, equally isolated.
        return (CacheStore, (), {"_isolated": self._isolated})

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(isolated=state["_isolated"])  # type: ignore[misc]

    def clear(self) -> None:
        """Drops every entry, emptying partitions in place: modes using one keep sharing it."""
        with self._lock:
            parts = list(self._partitions.values())
        for part in parts:
            part.clear()

    def __len__(self) -> int:
        """The number of entries, negative ones and keys seen once included, in all partitions."""
        return sum(len(t) for p in list(self._partitions.values()) for t in p.all_tables())

    def __repr__(self) -> str:
        return f"CacheStore(isolated={self._isolated}, partitions={len(self._partitions)}, entries={len(self)})"


def partition(store: CacheStore, identity: Hashable) -> Partition:
    """The partition of ``store`` for a policy identity (``CachePolicy.identity``), created when missing."""
    part = store._partitions.get(identity)
    if part is None:
        with store._lock:
            part = store._partitions.setdefault(identity, Partition())
    return part
