"""Checks that keep a cache hit equal to an uncached dispatch; run on a miss or in :func:`crosscheck`, not a hit."""

# Note [Verify every entry on the miss that creates it]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# torch's entry format rebuilds an output in only three shapes: the input itself (in-place), a tensor on a view
# op's single tensor argument's storage, or a fresh empty_strided tensor (offset 0, smallest storage). A fake
# kernel can return anything else (a fresh tensor at an offset or on a larger storage, an undeclared view, outputs
# sharing storage) or change an input's metadata, which a hit would skip. So the miss builds the output a hit would
# (_output_from_cache_entry, the one path hits use), compares it with the real one through describe(), and compares
# every tensor input before and after the kernel (InputSnapshot): a difference makes a negative entry naming it.

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.utils._pytree as pytree
from torch._ops import OpOverload
from torch._subclasses import fake_tensor as _ft
from torch._subclasses._fake_tensor_utils import _CacheKeyState
from torch._subclasses.fake_tensor import _BypassDispatchCache
from torch._subclasses.meta_utils import assert_eq, assert_metadata_eq
from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing

from torch_cachepolicy import _reasons
from torch_cachepolicy._fakes import guard_free_int, is_fake_tensor, output_from_entry, storage_id

if TYPE_CHECKING:
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

_SYM_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)

Fields = Callable[[torch.Tensor], tuple[tuple[str, object], ...]]


def _tensor_fields(t: torch.Tensor, num: Callable[[object], object] = guard_free_int) -> tuple[tuple[str, object], ...]:
    return (
        ("dtype", t.dtype),
        ("device", t.device),
        ("layout", t.layout),
        ("shape", tuple(num(s) for s in t.shape)),
        ("stride", tuple(num(s) for s in t.stride())),
        ("storage_offset", num(t.storage_offset())),
        ("storage size", num(t.untyped_storage().nbytes())),
        ("requires_grad", t.requires_grad),
        ("is_conj", t.is_conj()),
        ("is_neg", t.is_neg()),
        ("is_view", t._is_view()),
        # A rebuilt output is a leaf with no grad; a kernel may change either on an output or input (a hit would not).
        ("is_leaf", t.is_leaf),
        ("grad", _grad(t)),
        ("retains_grad", t.retains_grad),
        # An in-place op inside a kernel bumps an input's or output's version counter; a hit bumps none.
        ("version", _version(t)),
        ("hooks", _hooks(t)),
        # A kernel may hand back a FakeTensor of another mode; a hit builds one of ours.
        ("fake mode", id(getattr(t, "fake_mode", None))),
        # A kernel may tag its output, or memoize on an input (x.nonzero() sets x's nonzero memo); a hit does neither.
        ("python attributes", _python_state(t)),
    )


# Note [What a hit of an aten entry can get wrong]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# For an aten/prim/prims op (a STOCK route) torch's own cache already trusts the schema and tags: an op that is not
# mutable does not write its inputs, views are declared, and the ops whose fake kernels memoize on an input (nonzero,
# unique, item) or return a constant are tagged or checked, so stock bypasses them. An entry copies the output's
# dtype, shape, stride, layout, device, requires_grad and conj/neg bits from this very output, and the synthesis
# that rebuilds it is held to torch's by test_synth. What it cannot carry is where the output lives: a fresh output
# comes back at offset 0 on the smallest storage, sharing none, and a view on its one tensor argument's storage. So
# an aten miss compares only those (STORAGE_FIELDS, plus the version counter an inner in-place op may bump), and
# snapshots its inputs only when the schema lets it write them (resize_, set_ change what a hit would skip).
# Backend ops keep every field: their schemas and fake kernels are nobody's contract.


def _storage_fields(t: torch.Tensor) -> tuple[tuple[str, object], ...]:
    return (
        ("storage_offset", guard_free_int(t.storage_offset())),
        ("storage size", guard_free_int(t.untyped_storage().nbytes())),
        ("is_view", t._is_view()),
        ("version", _version(t)),
    )


ALL_FIELDS = _tensor_fields
"""Every field :func:`describe` compares (a backend op's miss, the crosscheck)."""
STORAGE_FIELDS = _storage_fields
"""What an aten entry cannot copy from its output (Note [What a hit of an aten entry can get wrong])."""


def _version(t: torch.Tensor) -> int | None:
    try:
        return t._version
    except RuntimeError:  # inference tensors have no version counter
        return None


def _hooks(t: torch.Tensor) -> tuple[int, int]:
    backward = t._backward_hooks
    post = getattr(t, "_post_accumulate_grad_hooks", None)
    return (len(backward) if backward else 0, len(post) if post else 0)


def _grad(t: torch.Tensor) -> object:
    # Reading a non-leaf's .grad warns; it has one only after retain_grad().
    grad = t._grad if t.is_leaf or t.retains_grad else None
    return None if grad is None else (grad.dtype, tuple(guard_free_int(v) for v in grad.shape))


_PLAIN = (type(None), bool, int, float, str, torch.device, torch.dtype)


def _python_state(t: torch.Tensor) -> tuple[tuple[str, object], ...]:
    state = getattr(t, "__dict__", None)
    if not state:
        return ()
    # A FakeTensor carries about twenty attributes, nearly all None: those skip the call.
    return tuple((k, v if v is None else _value_state(v, _STATE_DEPTH)) for k, v in sorted(state.items()))


# How deep _value_state looks into a tensor's Python attributes; beyond it, an object counts by identity.
_STATE_DEPTH = 3


def _value_state(v: object, depth: int) -> object:
    """A comparable picture of a Python attribute's value, contents included.

    A kernel may append to a list kept on an input (``x.log.append(...)``), so lists, tuples, dicts and sets
    are compared by content, down to :data:`_STATE_DEPTH`. Other objects (a ``fake_mode``, a tensor, the
    kernel's own class) count by identity: what they hold is the kernel's undeclared state (docs/guide.md).
    """
    if isinstance(v, _PLAIN):
        return v
    if isinstance(v, torch.SymInt):
        return guard_free_int(v)
    if depth == 0 or isinstance(v, torch.Tensor):
        return (type(v).__name__, id(v))
    if isinstance(v, (list, tuple)):
        return (type(v).__name__, id(v), tuple(_value_state(x, depth - 1) for x in v))
    if isinstance(v, dict):
        return ("dict", id(v), tuple((repr(k), _value_state(x, depth - 1)) for k, x in v.items()))
    if isinstance(v, (set, frozenset)):
        return (type(v).__name__, id(v), len(v), frozenset(x for x in v if isinstance(x, _PLAIN)))
    return (type(v).__name__, id(v))


def _input_tensors(args: Sequence[object], kwargs: Mapping[str, object]) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    _collect_tensors(args, out)
    _collect_tensors(kwargs.values(), out)
    return out


def _collect_tensors(values: Iterable[object], out: list[torch.Tensor]) -> None:
    # pytree.tree_leaves' order for the containers an op's arguments come in, without its per-leaf dispatch.
    for v in values:
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, (list, tuple)):
            _collect_tensors(v, out)
        elif isinstance(v, dict):
            _collect_tensors(v.values(), out)


# "output 3 storage size", built once per position and field: describe() names every field of every output.
_NAMES: dict[tuple[int, str], str] = {}


def _name(i: int, field: str) -> str:
    name = _NAMES.get((i, field))
    if name is None:
        name = _NAMES.setdefault((i, field), f"output {i} {field}")
    return name


def describe(
    output: object, args: Sequence[object], kwargs: Mapping[str, object], fields: Fields = ALL_FIELDS
) -> list[tuple[str, object]]:
    """Everything a caller can observe of ``output``, as comparable (name, value) pairs.

    Tensors give their aliasing (which inputs they are, which inputs and earlier outputs share their storage)
    and ``fields`` of their metadata; SymInts their expression; other values their type and value. A namedtuple
    counts as a plain tuple (stock hits return plain tuples).
    """
    inputs = _input_tensors(args, kwargs)
    input_storages = [storage_id(t) for t in inputs]
    leaves, structure = pytree.tree_flatten(_plain(output))
    out: list[tuple[str, object]] = [("structure", structure)]
    seen_storages: list[int] = []
    for i, leaf in enumerate(leaves):
        if isinstance(leaf, torch.Tensor):
            # Aliasing first: when a hit loses it, differing storage size or offset is a consequence, not the cause.
            sid = storage_id(leaf)
            out.append((_name(i, "identity with inputs"), tuple(j for j, t in enumerate(inputs) if t is leaf)))
            out.append((_name(i, "identity with input bases"), tuple(j for j, t in enumerate(inputs) if t._base is leaf)))
            shared = tuple(j for j, s in enumerate(input_storages) if s == sid)
            out.append((_name(i, "storage sharing with inputs"), shared))
            out.append((_name(i, "storage sharing with outputs"), tuple(j for j, s in enumerate(seen_storages) if s == sid)))
            # An output on an input's storage is a declared alias (else it bypasses), and autograd gives it the
            # input's version counter on the way back to the caller: its own counter here is never seen.
            out.extend((_name(i, name), None if shared and name == "version" else value) for name, value in fields(leaf))
            seen_storages.append(sid)
        elif isinstance(leaf, torch.SymInt):
            out.append((_name(i, "value"), ("SymInt", guard_free_int(leaf))))
            seen_storages.append(-1)
        elif isinstance(leaf, (torch.SymFloat, torch.SymBool)):
            out.append((_name(i, "value"), (type(leaf).__name__, leaf.node.expr)))
            seen_storages.append(-1)
        else:
            out.append((_name(i, "value"), (type(leaf), leaf)))
            seen_storages.append(-1)
    return out


def first_difference(actual: list[tuple[str, object]], expected: list[tuple[str, object]]) -> str | None:
    """The name of the first field where two :func:`describe` results differ."""
    for (name, a), (_, e) in zip(actual, expected, strict=False):
        if _differs(a, e):
            return name
    if len(actual) != len(expected):
        return "structure"
    return None


def _differs(a: object, e: object) -> bool:
    try:
        return bool(a != e)
    except Exception:
        # Values whose comparison raises (a tensor constant) count as different: we only ever bypass on that answer.
        return a is not e


def _plain(value: object) -> object:
    # A meta kernel may return a namedtuple (aminmax, ...) where a hit builds a plain tuple; callers get the latter.
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    return value


class _SameNode:
    """A symbolic size of an input, equal to another only if it is the same SymNode: a kernel that guards on it
    (specializing or unifying its symbol) leaves the node, and what it reads as, to the ShapeEnv; one that changes the
    input's metadata in place makes new nodes."""

    __slots__ = ("node",)

    def __init__(self, node: object) -> None:
        self.node = node  # held, so that its id is not reused

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _SameNode) and other.node is self.node

    def __hash__(self) -> int:
        return id(self.node)


def _as_node(v: object) -> object:
    return _SameNode(v.node) if isinstance(v, torch.SymInt) else v


class InputSnapshot:
    """What a kernel can change about its tensor arguments, taken before it runs.

    Every tensor argument's :func:`describe` fields (version counter, hooks and Python attributes included), its
    symbolic sizes by SymNode (:class:`_SameNode`). Lists and dicts need none: the dispatcher hands the kernel its own
    copies. Other objects are not compared; an argument whose content the key cannot see bypasses first
    (Note [Arguments the key cannot see]).
    """

    __slots__ = ("_before", "_tensors")

    def __init__(self, args: Sequence[object], kwargs: Mapping[str, object]) -> None:
        self._tensors = _input_tensors(args, kwargs)
        self._before = [self._state(t) for t in self._tensors]

    @staticmethod
    def _state(t: torch.Tensor) -> tuple[int, tuple[tuple[str, object], ...]]:
        return (storage_id(t), _tensor_fields(t, _as_node))

    def changed(self) -> str | None:
        """Which input field changed since the snapshot (``"shape"``), or None."""
        for t, (storage, fields) in zip(self._tensors, self._before, strict=True):
            if storage_id(t) != storage:
                return "storage"
            for (name, before), (_, after) in zip(fields, _tensor_fields(t, _as_node), strict=True):
                if _differs(after, before):
                    return name
        return None


def shape_env_state(shape_env: ShapeEnv, *, symbols_only: bool = False) -> tuple[object, ...]:
    """What a kernel can add to a ShapeEnv: symbols, and guards, replacements and assertions.

    Compared around a backend kernel: a hit cannot replay one that created a symbol (even a dropped one). With
    ``symbols_only`` (inputs with symbols) only created symbols count, since what it taught about its inputs'
    symbols is what the sub-table holds (Note [What the ShapeEnv knows]); otherwise any fact taught counts.
    """
    created = (len(shape_env.var_to_range), shape_env.unbacked_symint_counter, shape_env.unbacked_symfloat_counter)
    if symbols_only:
        return created
    return (
        *created, len(shape_env.guards), len(shape_env.replacements), len(shape_env.divisible),
        shape_env.num_deferred_runtime_asserts, shape_env._version_counter,
    )


def check_backend_op(func: OpOverload, args: Sequence[object], *, explicit: bool) -> None:
    """Safety checks on the schema of an op outside aten/prim/prims."""
    # Note [Why backend ops need more checks than aten]
    # ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    # torch's entry validation trusts aten's tags and schemas. Custom ops carry no tags and unchecked fake kernels:
    # a bare SymInt output would be cached as a constant (stock returns early), replaying one unbacked symbol for
    # every call; a mutating op returning None would skip its kernel (and checks) on a hit; a view schema with
    # several tensor args trips an entry-builder assertion. Each bypasses, here (schema) or in check_backend_output.
    # Other aliasing and metadata are caught by Note [Verify every entry on the miss that creates it].
    if func._schema.is_mutable and not explicit:
        raise _BypassDispatchCache(_reasons.MUTATES)
    if func.is_view and sum(isinstance(a, torch.Tensor) for a in args) != 1:
        raise _BypassDispatchCache(_reasons.VIEW_OF_SEVERAL)


def check_backend_output(state: _CacheKeyState, func: OpOverload, args: Sequence[object], output: object) -> None:
    """The output checks torch skips for scalars (Note [Why backend ops need more checks than aten])."""
    outputs = output if isinstance(output, tuple) else (output,)
    tracing = torch.fx.experimental.proxy_tensor.get_proxy_mode() is not None
    for out in outputs:
        if isinstance(out, _SYM_TYPES):
            if tracing:
                raise _BypassDispatchCache(_reasons.PROXY_SYMNODE)
            if not out.node.expr.free_symbols <= state.known_symbols:
                raise _BypassDispatchCache(_reasons.UNBACKED_SCALAR)
    # Named reasons for the two commonest aliasing mistakes; the entry verification catches the rest.
    returns = func._schema.returns
    input_storages = {storage_id(a) for a in pytree.tree_leaves(args) if is_fake_tensor(a)}
    output_storages: set[int] = set()
    for i, out in enumerate(outputs):
        if not is_fake_tensor(out):
            continue
        sid = storage_id(out)
        if sid in output_storages:
            raise _BypassDispatchCache(_reasons.OUTPUTS_ALIAS)
        output_storages.add(sid)
        if sid in input_storages:
            declared = i < len(returns) and returns[i].alias_info is not None
            if not declared:
                raise _BypassDispatchCache(_reasons.UNDECLARED_ALIAS)


_NOT_BUILT = object()


def verify_entry(
    mode: _ft.FakeTensorMode, state: _CacheKeyState, entry: Any, key: Any, func: OpOverload, args: Sequence[object],
    kwargs: Mapping[str, object], output: object, fields: Fields = ALL_FIELDS, rebuilt: object = _NOT_BUILT,
) -> None:
    """Bypasses unless a hit built from ``entry`` (``rebuilt``, if already built as a hit would) equals ``output`` in
    ``fields`` and aliasing (Note [Verify every entry on the miss that creates it])."""
    if rebuilt is _NOT_BUILT:
        try:
            # Through the mode, as a hit (Note [One synthesis for hits and their verification]).
            rebuilt = output_from_entry(mode._output_from_cache_entry, state, entry, key, args)
        except _BypassDispatchCache:
            raise
        except Exception as e:
            raise _BypassDispatchCache(_reasons.not_rebuilt(e)) from None
    diff = first_difference(describe(rebuilt, args, kwargs, fields), describe(output, args, kwargs, fields))
    if diff is not None:
        # "output 1 storage_offset" -> "storage_offset": reasons are counted by name, not per output position.
        field = diff.split(" ", 2)[2] if diff.startswith("output ") else diff
        if field.startswith(("identity", "storage sharing")):
            raise _BypassDispatchCache(_reasons.ALIAS_NOT_REPRODUCED)
        raise _BypassDispatchCache(_reasons.hit_would_differ(field))


# ------------------------------------------------------------- crosscheck


class CrosscheckError(RuntimeError):
    """A cache hit differed from an uncached dispatch of the same call."""


def crosscheck(
    mode: _ft.FakeTensorMode, output: object, func: Any, types: Sequence[type], args: Sequence[object], kwargs: Mapping[str, object],
    *, shape_env: bool = False,
) -> None:
    """Re-runs a hit's call uncached on ``mode`` and compares it with ``output``.

    Compares :func:`describe` (as the miss-time verification does), torch's ``assert_metadata_eq`` per tensor
    pair, the inputs against a snapshot taken before the rerun (a kernel changing them was skipped by the hit), and,
    with ``shape_env`` (a backend or higher-order op: a hit must never skip a guard), the mode's ShapeEnv.

    Raises:
        CrosscheckError: the two differ, or the uncached dispatch raised.
    """
    # Describe the hit before the rerun, which may change the inputs.
    hit = describe(output, args, kwargs)
    snapshot = InputSnapshot(args, kwargs)
    env = mode.shape_env if shape_env else None
    env_before = None if env is None else shape_env_state(env)
    # Proxy tracing off, as torch 2.15's own crosscheck: the rerun must not add nodes to a graph being traced.
    with _ft.disable_fake_tensor_cache(mode), disable_proxy_modes_tracing():
        try:
            expected = mode._dispatch_impl(func, types, args, kwargs)
        except Exception as e:
            raise _crosscheck_error(f"{func} raised when dispatched uncached after a cache hit: {e!r}", _UNSEEN) from e
    if env is not None and shape_env_state(env) != env_before:
        raise _crosscheck_error(
            f"an uncached dispatch of {func} taught the ShapeEnv a guard or fact; the cache hit did not",
            "if its kernel reads a config the cache key cannot see, declare it with CachePolicy(context_key=...); "
            "otherwise " + _DENY,
        )
    changed = snapshot.changed()
    if changed is not None:
        raise _crosscheck_error(f"an uncached dispatch of {func} changed an input's {changed}; the cache hit did not", _DENY)
    diff = first_difference(hit, describe(expected, args, kwargs))
    if diff is None:
        try:
            _assert_same_tensors(expected, output)
        except AssertionError as e:
            diff = str(e)
    if diff is not None:
        raise _crosscheck_error(f"the cached output of {func} differs from an uncached dispatch in {diff}", _UNSEEN)


_DENY = "deny the op with CachePolicy.deny(...) and report this with your torch version"
_UNSEEN = (
    "if its kernel reads state the cache key cannot see, declare that state with CachePolicy(context_key=...); "
    "otherwise " + _DENY
)


def _crosscheck_error(what: str, fix: str) -> CrosscheckError:
    return CrosscheckError(f"torch_cachepolicy.FakeTensorMode(cache_crosscheck=True): {what}; {fix}")


def _assert_same_tensors(expected: object, actual: object) -> None:
    # torch's own metadata comparison (view bases, leafness, grads) on top of describe(), as stock's crosscheck does.
    for e, a in zip(pytree.tree_leaves(_plain(expected)), pytree.tree_leaves(_plain(actual)), strict=False):
        if isinstance(e, torch.Tensor) and isinstance(a, torch.Tensor):
            assert_metadata_eq(assert_eq, e, a)
