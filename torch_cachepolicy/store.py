"""``CacheStore``: where a policy mode keeps the entries that depend on its policy."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Hashable, Iterator
from typing import TYPE_CHECKING, Any

import torch
import torch.fx

if TYPE_CHECKING:
    from torch._subclasses.fake_tensor import _DispatchCacheEntry, _DispatchCacheKey
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

__all__ = ["CacheStore", "Partition", "Table", "evict_when_collected", "id_hashed_owner", "partition"]


class Table(dict["_DispatchCacheKey", "_DispatchCacheEntry"]):
    """One dict of entries; weak-referenceable so a GraphModule's finalizer can
    evict its keys without keeping the table (or the store) alive."""

    __slots__ = ("__weakref__",)


def _evict(table_ref: weakref.ref[Table], key: _DispatchCacheKey) -> None:
    table = table_ref()
    if table is not None:
        table.pop(key, None)


# The attribute under which a ShapeEnv carries the tables of every partition
# that cached symbolic entries for it. See Note [Symbolic entries live on the ShapeEnv].
_SHAPE_ENV_ATTR = "_torch_cachepolicy_tables"


class Partition:
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
                by_partition = shape_env.__dict__.setdefault(_SHAPE_ENV_ATTR, weakref.WeakKeyDictionary())
                per_env = by_partition.setdefault(self, {})
                self._shape_envs.add(shape_env)
        return per_env if per_env is not None else {}

    def all_tables(self) -> Iterator[Table]:
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
        self._partitions: dict[Hashable, Partition] = {}

    @property
    def isolated(self) -> bool:
        """Whether entries of builtin ops stay private too."""
        return self._isolated

    def __reduce__(self) -> tuple[Any, ...]:
        # A store is a cache: copies (copy.copy, copy.deepcopy, pickle)
        # start empty, with the same isolation.
        return (CacheStore, (), {"_isolated": self._isolated})

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(isolated=state["_isolated"])  # type: ignore[misc]

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


def partition(store: CacheStore, identity: Hashable) -> Partition:
    """The partition of ``store`` for a policy identity (``CachePolicy.identity``), created when missing."""
    part = store._partitions.get(identity)
    if part is None:
        with store._lock:
            part = store._partitions.setdefault(identity, Partition())
    return part


def evict_when_collected(owner: object, table: Table, key: _DispatchCacheKey) -> None:
    """Drops ``key`` from ``table`` once ``owner`` (a GraphModule) is collected."""
    weakref.finalize(owner, _evict, weakref.ref(table), key)


def id_hashed_owner(leaf: object) -> object | None:
    """The object whose id torch put in a key for ``leaf`` (see FakeTensorMode._prep_args_for_hash), or None."""
    from torch._higher_order_ops.auto_functionalize import FunctionalCallableWithEpilogue
    from torch._higher_order_ops.utils import SubgraphCallableWrapper

    if isinstance(leaf, torch.fx.GraphModule):
        return leaf
    if isinstance(leaf, SubgraphCallableWrapper):
        return leaf.subgraph
    if isinstance(leaf, FunctionalCallableWithEpilogue):
        return leaf.orig_callable
    return None
