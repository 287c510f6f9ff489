"""``torch_cachepolicy.FakeTensorMode``: stock FakeTensorMode plus a cache policy."""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch._higher_order_ops.utils import registered_hop_fake_fns
from torch._ops import HigherOrderOperator, OpOverload
from torch._subclasses import fake_tensor as _ft
from torch._subclasses._fake_tensor_utils import _CacheKeyState
from torch._subclasses.fake_tensor import (
    DispatchCacheInfo,
    FakeTensor,
    _BypassDispatchCache,
    _DispatchCacheBypassEntry,
)
from torch._subclasses.meta_utils import assert_eq, assert_metadata_eq
from torch.utils._python_dispatch import TorchDispatchMode

from torch_cachepolicy.policy import BUILTIN_NAMESPACES, CachePolicy
from torch_cachepolicy.report import CacheReport, OpStats
from torch_cachepolicy.store import CacheStore, _Partition, _Table, evict_when_collected

__all__ = ["CrosscheckError", "FakeTensorMode"]

_StockMode = _ft.FakeTensorMode
_fake_registry = torch._library.simple_registry.singleton

# Routes: which storage a dispatch of an operator uses.
_STOCK = 0  # policy-independent: torch's own storage (or the store when isolated)
_POLICY = 1  # admitted only by the policy: the store, with the extra safety checks
_BYPASS = 2  # the policy does not admit it: never looked up anywhere

# The sub-table of an isolated store that holds policy-independent entries.
_STOCK_SUB = ("stock",)

_SYM_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)
_NO_RULES: Mapping[object, Any] = {}
_NO_KWARGS: Mapping[str, object] = {}


class CrosscheckError(RuntimeError):
    """A cache hit differed from an uncached dispatch of the same call."""


def _fake_kernel(fake_impl: Any) -> object:
    # Note [Entries belong to a fake kernel]
    # A backend may re-register an op's fake impl (a newer library version,
    # a test that swaps it). Entries computed by the old kernel must not
    # answer for the new one, so the kernel's function selects the sub-table.
    # Holding the function keeps it alive only as long as the store.
    # `fake_impl` is the op's FakeImplHolder, fetched once per route.
    kernel = fake_impl.kernel
    return None if kernel is None else kernel.func


def _storage_id(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


class FakeTensorMode(_StockMode):
    """A ``FakeTensorMode`` whose dispatch cache follows a :class:`CachePolicy`.

    Backend operators the policy admits are cached in this mode's
    :class:`CacheStore`, never in torch's class-global cache. Nothing global
    in torch is changed: ``torch._library.utils.is_builtin``,
    ``FakeTensorMode.cache`` and the class counters are left alone (stock
    entries of aten ops are shared with torch's storage, exactly as a stock
    mode shares them, unless the store is isolated).

    Args:
        cache_policy: which operators to cache; ``None`` means
            ``CachePolicy()``, which caches what stock caches.
        cache_store: where policy-dependent entries live; ``None`` gives this
            mode a private store that dies with it. Pass one store to several
            modes to share entries.
        cache_crosscheck: re-run every hit uncached and compare, aliasing
            included. ``None`` follows
            ``torch._dynamo.config.fake_tensor_cache_crosscheck_enabled``.
        **kwargs: every keyword argument of torch's ``FakeTensorMode``.
    """

    # Note [HOPs under a subclass]
    # HigherOrderOperator.dispatch looks up `python_key_table[type(mode)]` by
    # exact type, so rules registered for torch's FakeTensorMode (cond,
    # while_loop, ..., and HOPs defined after we are imported) are invisible
    # to a subclass. With this flag the HOP calls our __torch_dispatch__ (and dispatch),
    # which forwards to the rule registered for the stock class. No HOP's
    # table is modified.
    supports_higher_order_operators = True

    def __init__(
        self,
        *,
        cache_policy: CachePolicy | None = None,
        cache_store: CacheStore | None = None,
        cache_crosscheck: bool | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self._cache_policy = _check_policy("FakeTensorMode(cache_policy=...)", cache_policy)
        if cache_store is None:
            cache_store = CacheStore()
        elif not isinstance(cache_store, CacheStore):
            raise TypeError(
                "FakeTensorMode(cache_store=...): expected a torch_cachepolicy.CacheStore, "
                f"got {type(cache_store).__name__}"
            )
        self._cache_store = cache_store
        if cache_crosscheck is not None:
            if not isinstance(cache_crosscheck, bool):
                raise TypeError("FakeTensorMode(cache_crosscheck=...): expected a bool or None")
            self.cache_crosscheck_enabled = cache_crosscheck
        self._stats: dict[object, OpStats] = {}
        self._synced_identity: object = None
        self._partition = _Partition()  # replaced by the policy's partition on first dispatch
        # op -> (route, bypass label, explicitly allowed, extra), where extra is
        # (FakeImplHolder, uses the policy's context) for _POLICY routes and,
        # for _STOCK routes, whether entries must stay out of torch's storage
        # (Note [Entries that must reproduce aliasing]).
        self._routes: dict[object, tuple[int, str, bool, Any]] = {}

    # ------------------------------------------------------------ public API

    @property
    def cache_policy(self) -> CachePolicy:
        """The policy consulted on every dispatch; may be replaced."""
        return self._cache_policy

    @cache_policy.setter
    def cache_policy(self, policy: CachePolicy | None) -> None:
        self._cache_policy = _check_policy("FakeTensorMode.cache_policy = ...", policy)
        self._synced_identity = None

    @property
    def cache_store(self) -> CacheStore:
        """The store holding this mode's policy-dependent entries."""
        return self._cache_store

    def cache_info(self) -> DispatchCacheInfo:  # type: ignore[override]
        """Hits, misses and bypasses of this instance; ``size`` counts every entry
        of its store, which other modes may share."""
        # list()/dict() copy in C, so another thread may read while this mode
        # dispatches without "dictionary changed size during iteration".
        all_stats = list(self._stats.values())
        bypasses: dict[str, int] = {}
        for stats in all_stats:
            for reason, n in dict(stats.bypasses).items():
                bypasses[reason] = bypasses.get(reason, 0) + n
        return DispatchCacheInfo(
            sum(s.hits for s in all_stats),
            sum(s.misses for s in all_stats),
            bypasses,
            len(self._cache_store),
        )

    def cache_report(self) -> CacheReport:
        """Per-operator hits, misses and bypass reasons of this instance."""
        return CacheReport.from_stats(self._stats)

    def cache_clear(self) -> None:  # type: ignore[override]
        """Resets this instance's counters and empties its policy's partition
        (shared by modes with equal policies on the same store). torch's
        storage and other partitions are left alone."""
        self._stats = {}
        self._cache_store._partition(self._cache_policy.identity).clear()

    # ------------------------------------------------------------- dispatch

    def dispatch(
        self,
        func: Any,
        types: Sequence[type],
        args: Sequence[object] = (),
        kwargs: Mapping[str, object] = _NO_KWARGS,
    ) -> object:
        # See Note [HOPs under a subclass]. Ops with a FakeTensorMode rule
        # (HOPs like cond, and a few OpOverloads such as _tensor_version)
        # get that rule, called as stock's dispatcher would call it. This is
        # `dispatch`, not `__torch_dispatch__`: torch wraps every override of
        # the latter in a dynamo-disabling shim, which would run twice per op.
        handler = getattr(func, "python_key_table", _NO_RULES).get(_StockMode)
        if handler is not None and not _redirects_to_mode(func, handler):
            return handler(self, *args, **(kwargs or {}))
        return super().dispatch(func, types, args, kwargs)

    def _cached_dispatch_impl(
        self,
        func: OpOverload,
        types: Sequence[type],
        args: Sequence[object],
        kwargs: Mapping[str, object],
    ) -> object:
        if self._cache_policy._identity is not self._synced_identity:
            self._sync_policy()
        route = self._routes.get(func)
        if route is None:
            route = self._route(func)
        kind = route[0]
        stats = self._stats.get(func)
        if stats is None:
            stats = self._stats[func] = OpStats()

        if kind == _BYPASS:
            stats.bypass(route[1])
            return self._dispatch_impl(func, types, args, kwargs)

        state = _CacheKeyState(self.shape_env)
        try:
            key = self._cache_key(state, func, args, kwargs)
        except _BypassDispatchCache as e:
            stats.bypass(e.reason)
            return self._dispatch_impl(func, types, args, kwargs)

        on_shape_env = state.cache_on_shape_env()
        table: dict[Any, Any]
        if kind == _POLICY:
            table = self._policy_table(func, route[3], state.shape_env if on_shape_env else None)
        elif self._cache_store._isolated or route[3]:
            table = self._partition.table(_STOCK_SUB, state.shape_env if on_shape_env else None)
        elif on_shape_env:
            assert state.shape_env is not None
            table = state.shape_env.fake_tensor_cache
        else:
            table = _StockMode.cache

        entry = table.get(key)
        if entry is not None:
            if isinstance(entry, _DispatchCacheBypassEntry):
                stats.bypass(entry.reason)
                return self._dispatch_impl(func, types, args, kwargs)
            output = self._output_from_cache_entry(state, entry, key, func, args)
            stats.hits += 1
            if self.cache_crosscheck_enabled:
                self._crosscheck(output, func, types, args, kwargs)
            return output

        output = self._dispatch_impl(func, types, args, kwargs)
        try:
            if kind == _POLICY:
                _check_backend_op(func, args, explicit=route[2])
            entry = self._make_cache_entry(state, key, func, args, kwargs, output)  # type: ignore[arg-type]
            # After torch's validation: outputs are now known to be dense
            # FakeTensors (or scalars), whose storages can be compared.
            if kind == _POLICY:
                _check_backend_output(state, func, args, output)
            _check_entry_aliasing(entry, args, kwargs, output)
        except _BypassDispatchCache as e:
            stats.bypass(e.reason)
            if table is _StockMode.cache or (on_shape_env and table is state.shape_env.fake_tensor_cache):  # type: ignore[union-attr]
                # Never leave a verdict of ours in torch's storage; see
                # Note [Entries that must reproduce aliasing].
                return output
            entry = _DispatchCacheBypassEntry(e.reason)
        else:
            stats.misses += 1
        if on_shape_env:
            # Entries must not keep a ShapeEnv alive (torch does the same).
            key.strip_shape_env()
        table[key] = entry
        if isinstance(table, _Table) and isinstance(func, HigherOrderOperator):
            for leaf in pytree.tree_leaves((args, kwargs)):
                owner = _id_hashed_owner(leaf)
                if owner is not None:
                    evict_when_collected(owner, table, key)
        return output

    def _validate_cache_key(
        self, func: OpOverload, args: Sequence[object], kwargs: Mapping[str, object]
    ) -> None:
        # Note [Reusing torch's validation]
        # Stock validation ends with "non-builtin" (is_builtin) followed by the
        # CompositeImplicitAutograd-view check. For an op the policy admits we
        # accept that one reason and nothing else: every earlier check (tags,
        # lift ops, unsafe view, ...) has already run, and the CIA-view check
        # is part of the policy's structural decision (Note [Structural checks]).
        try:
            super()._validate_cache_key(func, args, kwargs)
        except _BypassDispatchCache as e:
            route = self._routes.get(func)
            if e.reason != "non-builtin" or route is None or route[0] != _POLICY:
                raise

    # --------------------------------------------------------------- helpers

    def _sync_policy(self) -> None:
        policy = self._cache_policy
        identity = policy._identity
        self._partition = self._cache_store._partition(identity)
        self._routes = {}
        self._synced_identity = identity

    def _route(self, func: object) -> tuple[int, str, bool, Any]:
        if not isinstance(func, OpOverload):
            # HOPs and anything else torch routes here: torch's own rules.
            return (_STOCK, "", False, None)
        policy = self._cache_policy
        decision = policy.decide(func)
        route: tuple[int, str, bool, Any]
        if not decision.cacheable:
            route = (_BYPASS, decision.label, False, None)
        elif func.namespace in BUILTIN_NAMESPACES:
            route = (_STOCK, decision.label, decision.explicit, _returns_undeclared_view(func))
        else:
            # find() creates the registry entry if missing, as torch's own
            # _dispatch_impl does for every op, so a fake impl registered
            # later lands in the holder we keep.
            holder = _fake_registry.find(func.name()).fake_impl
            route = (_POLICY, decision.label, decision.explicit, (holder, policy.uses_context(func)))
        if func in policy._decisions:
            self._routes[func] = route
        return route

    def _policy_table(self, func: OpOverload, kernel_and_context: Any, shape_env: Any) -> _Table:
        fake_impl, uses_context = kernel_and_context
        context: Hashable = None
        if uses_context:
            try:
                context = self._cache_policy.context_key()
            except Exception as e:
                raise RuntimeError(
                    f"{self._cache_policy!r}.context_key() raised while dispatching {func}: {e!r}"
                ) from e
        try:
            return self._partition.table((context, _fake_kernel(fake_impl)), shape_env)
        except TypeError:
            raise TypeError(
                f"{self._cache_policy!r}.context_key() returned an unhashable "
                f"{type(context).__name__} while dispatching {func}; return a hashable "
                "value such as a tuple or a string"
            ) from None

    def _crosscheck(
        self,
        output: object,
        func: OpOverload,
        types: Sequence[type],
        args: Sequence[object],
        kwargs: Mapping[str, object],
    ) -> None:
        with _ft.disable_fake_tensor_cache(self):
            try:
                expected = self._dispatch_impl(func, types, args, kwargs)
            except Exception as e:
                raise CrosscheckError(
                    f"FakeTensorMode cache crosscheck: {func} raised when dispatched "
                    f"uncached after a hit: {e!r}"
                ) from e
        try:
            _assert_same_output(expected, output, args)
        except AssertionError as e:
            raise CrosscheckError(
                f"FakeTensorMode cache crosscheck: the cached output of {func} differs "
                f"from an uncached dispatch: {e}"
            ) from e


def _check_policy(api: str, policy: object) -> CachePolicy:
    if policy is None:
        return CachePolicy()
    if not isinstance(policy, CachePolicy):
        raise TypeError(
            f"{api}: expected a torch_cachepolicy.CachePolicy, got {type(policy).__name__}"
        )
    return policy


def _redirects_to_mode(func: object, handler: object) -> bool:
    # Such rules call mode.__torch_dispatch__ straight back (the cached
    # path of HOPs registered with register_fake); forwarding would recurse.
    return func in registered_hop_fake_fns or getattr(handler, "__qualname__", "") == (
        "redirect_to_mode.<locals>.impl"
    )


def _id_hashed_owner(leaf: object) -> object | None:
    """The object whose id torch put in a key (see FakeTensorMode._prep_args_for_hash)."""
    from torch._higher_order_ops.auto_functionalize import FunctionalCallableWithEpilogue
    from torch._higher_order_ops.utils import SubgraphCallableWrapper

    if isinstance(leaf, torch.fx.GraphModule):
        return leaf
    if isinstance(leaf, SubgraphCallableWrapper):
        return leaf.subgraph
    if isinstance(leaf, FunctionalCallableWithEpilogue):
        return leaf.orig_callable
    return None


def _check_backend_op(func: OpOverload, args: Sequence[object], *, explicit: bool) -> None:
    """Safety checks on the schema of an op outside aten/prim/prims.

    Note [Why backend ops need more checks than aten]
    torch's entry validation leans on aten's tags and schemas being right.
    Custom ops carry no tags and their fake kernels are unchecked, so:
    a bare SymInt output is cached as a constant (stock returns early), which
    would replay one unbacked symbol for every call; an output that shares an
    input's storage without the schema saying so (or two outputs sharing one)
    comes back unaliased from a hit; a mutating op returning None would skip
    its kernel (and its checks) on a hit; and a view schema with several
    tensor args trips an assertion in the entry builder. Each raises
    _BypassDispatchCache instead, here (schema) or in _check_backend_output.
    """
    if func._schema.is_mutable and not explicit:
        raise _BypassDispatchCache("mutates an argument (allow it with register_op)")
    if func.is_view and sum(isinstance(a, torch.Tensor) for a in args) != 1:
        raise _BypassDispatchCache("view op with several tensor arguments")


def _check_backend_output(
    state: _CacheKeyState, func: OpOverload, args: Sequence[object], output: object
) -> None:
    """Safety checks on what a backend op's fake kernel returned.

    See Note [Why backend ops need more checks than aten].
    """
    outputs = output if isinstance(output, tuple) else (output,)
    tracing = torch.fx.experimental.proxy_tensor.get_proxy_mode() is not None
    for out in outputs:
        if isinstance(out, _SYM_TYPES):
            if tracing:
                raise _BypassDispatchCache("Proxy mode with SymNode output")
            if not out.node.expr.free_symbols <= state.known_symbols:
                raise _BypassDispatchCache("unbacked symbol in scalar output")
    input_storages = {
        _storage_id(a) for a in pytree.tree_leaves(args) if isinstance(a, FakeTensor)
    }
    returns = func._schema.returns
    output_storages: set[int] = set()
    for i, out in enumerate(outputs):
        if not isinstance(out, FakeTensor):
            continue
        sid = _storage_id(out)
        if sid in output_storages:
            raise _BypassDispatchCache("outputs alias each other")
        output_storages.add(sid)
        if sid in input_storages:
            declared = i < len(returns) and returns[i].alias_info is not None
            if not declared:
                raise _BypassDispatchCache("output aliases an input without a schema annotation")


def _returns_undeclared_view(func: OpOverload) -> bool:
    """Whether ``func`` returns an alias (``Tensor(a)``/``Tensor(a!)``) without being a view op."""
    return not func.is_view and any(r.alias_info is not None for r in func._schema.returns)


def _check_entry_aliasing(
    entry: Any, args: Sequence[object], kwargs: Mapping[str, object], output: object
) -> None:
    """Bypasses unless a hit built from ``entry`` shares storage exactly as ``output`` does.

    Note [Entries that must reproduce aliasing]
    torch's entry reproduces aliasing in two ways only: an in-place output is
    the input object itself, and a view op's output is rebuilt on its single
    tensor argument's storage. Any other output gets fresh storage on a hit.
    Some schemas return an alias without being views (prims.as_strided
    returns ``Tensor(a!)``, a new tensor on its input's storage), so stock
    replays them unaliased, and stock's crosscheck does not notice. We check
    every entry on the miss that creates it. Ops with such schemas keep their
    entries in our store rather than torch's, because a stock mode may have
    put a wrong entry there first; and a verdict of ours is never written into
    torch's storage, where stock modes would read it.
    """
    outputs = output if isinstance(output, tuple) else (output,)
    infos = entry.output_infos
    if len(infos) != len(outputs):
        raise _BypassDispatchCache("entry does not match the output structure")
    input_storages = {
        _storage_id(a) for a in pytree.tree_leaves((args, kwargs)) if isinstance(a, FakeTensor)
    }
    fresh: set[int] = set()
    for out, info in zip(outputs, infos, strict=True):
        if not isinstance(out, FakeTensor) or info.inplace_idx is not None:
            continue
        sid = _storage_id(out)
        if info.view_idx is not None:
            view_arg = args[info.view_idx]
            reproduced = isinstance(view_arg, FakeTensor) and _storage_id(view_arg) == sid
        else:
            reproduced = sid not in input_storages and sid not in fresh
            fresh.add(sid)
        if not reproduced:
            raise _BypassDispatchCache("output aliasing a cache hit would not reproduce")


def _alias_signature(value: object, args: Sequence[object]) -> list[tuple[int, ...]]:
    """For each tensor in ``value``, the positions of inputs sharing its storage."""
    inputs = [(i, a) for i, a in enumerate(pytree.tree_leaves(args)) if isinstance(a, torch.Tensor)]
    signature = []
    for out in pytree.tree_leaves(value):
        if isinstance(out, torch.Tensor):
            sid = _storage_id(out)
            signature.append(tuple(i for i, a in inputs if _storage_id(a) == sid))
    return signature


def _plain(value: object) -> object:
    # A meta kernel may return a namedtuple (aminmax, native_layer_norm, ...)
    # where a hit builds a plain tuple; callers get a plain tuple either way.
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    return value


def _assert_same_output(expected: object, actual: object, args: Sequence[object]) -> None:
    expected, actual = _plain(expected), _plain(actual)
    exp_leaves, exp_spec = pytree.tree_flatten(expected)
    act_leaves, act_spec = pytree.tree_flatten(actual)
    if exp_spec != act_spec:
        raise AssertionError(f"structure {act_spec} != {exp_spec}")
    for e, a in zip(exp_leaves, act_leaves, strict=True):
        if isinstance(e, torch.Tensor):
            if not isinstance(a, torch.Tensor):
                raise AssertionError(f"expected a Tensor, got {type(a).__name__}")
            assert_metadata_eq(assert_eq, e, a)
        elif isinstance(e, _SYM_TYPES):
            if type(e) is not type(a) or e.node is not a.node:  # type: ignore[union-attr]
                raise AssertionError(f"symbolic value {a} != {e}")
        elif type(e) is not type(a) or e != a:
            raise AssertionError(f"value {a!r} != {e!r}")
    exp_alias, act_alias = _alias_signature(expected, args), _alias_signature(actual, args)
    if exp_alias != act_alias:
        raise AssertionError(
            f"aliasing differs: outputs share storage with inputs {act_alias}, "
            f"uncached {exp_alias}"
        )


# Keep mypy honest about the base class we extend.
_: type[TorchDispatchMode] = FakeTensorMode
