"""``CacheStore``: where a policy mode keeps the entries that depend on its policy."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Hashable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch._subclasses.fake_tensor import _DispatchCacheEntry, _DispatchCacheKey
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

__all__ = ["CacheStore"]


class _Table(dict["_DispatchCacheKey", "_DispatchCacheEntry"]):
    """One dict of entries; weak-referenceable so a GraphModule's finalizer can
    evict its keys without keeping the table (or the store) alive."""

    __slots__ = ("__weakref__",)


def _evict(table_ref: weakref.ref[_Table], key: _DispatchCacheKey) -> None:
    table = table_ref()
    if table is not None:
        table.pop(key, None)


# The attribute under which a ShapeEnv carries the tables of every partition
# that cached symbolic entries for it. See Note [Symbolic entries live on the ShapeEnv].
_SHAPE_ENV_ATTR = "_torch_cachepolicy_tables"


class _Partition:
    """The entries made under one policy identity.

    Note [Sub-tables]
    Entries of backend ops depend on more than the stock key: on the policy's
    context value and on the fake kernel that computed them. Rather than
    widening every key (rehashing a long tuple on each hit), they go into a
    sub-table per (context, kernel); a re-registered kernel or a new context
    simply selects another, empty, sub-table.

    Note [Symbolic entries live on the ShapeEnv]
    An entry whose key holds symbols still references its ShapeEnv after
    torch strips the key (the stripped stub keeps the SymNode, and a SymInt
    output is stored as is). Held from the store, even weakly keyed, such an
    entry would keep the ShapeEnv alive. So, like torch's own
    ``shape_env.fake_tensor_cache``, the tables hang off the ShapeEnv itself
    (one attribute of ours, keyed weakly by partition): the cycle is
    collectable, and the store keeps only a weak set of ShapeEnvs to count
    and clear its entries.
    """

    __slots__ = ("__weakref__", "_lock", "_shape_envs", "tables")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.tables: dict[Hashable, _Table] = {}
        self._shape_envs: weakref.WeakSet[ShapeEnv] = weakref.WeakSet()

    def table(self, sub: Hashable, shape_env: ShapeEnv | None) -> _Table:
        if shape_env is None:
            table = self.tables.get(sub)
            if table is None:
                table = self.tables.setdefault(sub, _Table())
            return table
        per_env = self._env_tables(shape_env)
        table = per_env.get(sub)
        if table is None:
            table = per_env.setdefault(sub, _Table())
        return table

    def _env_tables(self, shape_env: ShapeEnv, create: bool = True) -> dict[Hashable, _Table]:
        by_partition = shape_env.__dict__.get(_SHAPE_ENV_ATTR)
        per_env = None if by_partition is None else by_partition.get(self)
        if per_env is None and create:
            with self._lock:
                by_partition = shape_env.__dict__.setdefault(_SHAPE_ENV_ATTR, weakref.WeakKeyDictionary())
                per_env = by_partition.setdefault(self, {})
                self._shape_envs.add(shape_env)
        return per_env if per_env is not None else {}

    def all_tables(self) -> Iterator[_Table]:
        yield from list(self.tables.values())
        for shape_env in list(self._shape_envs):
            yield from list(self._env_tables(shape_env, create=False).values())

    def clear(self) -> None:
        self.tables.clear()
        for shape_env in list(self._shape_envs):
            self._env_tables(shape_env, create=False).clear()


class CacheStore:
    """Private FakeTensor cache storage for one or more policy modes.

    Every mode has one; pass the same store to several modes (for example the
    two modes an ExportPass can end up with) to share entries. Sharing is safe
    across different policies because entries are partitioned by policy
    identity (``CachePolicy.identity``).

    Args:
        isolated: keep *every* entry here. By default, entries of ops that
            stock torch caches anyway (aten, prim, prims, HOPs) do not depend
            on the policy and are shared with torch's own storage, exactly as
            a stock mode shares them; an isolated store keeps those private
            too, at the cost of recomputing what other modes already know.
    """

    def __init__(self, *, isolated: bool = False) -> None:
        if not isinstance(isolated, bool):
            raise TypeError("CacheStore(isolated=...): expected a bool")
        self._isolated = isolated
        self._lock = threading.Lock()
        self._partitions: dict[Hashable, _Partition] = {}

    @property
    def isolated(self) -> bool:
        """Whether entries of builtin ops stay private too."""
        return self._isolated

    def _partition(self, identity: Hashable) -> _Partition:
        part = self._partitions.get(identity)
        if part is None:
            with self._lock:
                part = self._partitions.setdefault(identity, _Partition())
        return part

    def clear(self) -> None:
        """Drops every entry of every partition.

        Partitions are emptied in place, not replaced: modes already using one
        keep seeing the same (now empty) partition as every other mode.
        """
        with self._lock:
            parts = list(self._partitions.values())
        for part in parts:
            part.clear()

    def __len__(self) -> int:
        """The number of entries, negative ones included, in all partitions."""
        return sum(len(t) for p in list(self._partitions.values()) for t in p.all_tables())

    def __repr__(self) -> str:
        return (
            f"CacheStore(isolated={self._isolated}, partitions={len(self._partitions)}, "
            f"entries={len(self)})"
        )


def evict_when_collected(owner: object, table: _Table, key: _DispatchCacheKey) -> None:
    """Drops ``key`` from ``table`` once ``owner`` (a GraphModule) is collected."""
    weakref.finalize(owner, _evict, weakref.ref(table), key)
