"""The output of a cache hit, built without dispatch when the entry is plain.

torch builds a hit's output in ``FakeTensorMode._output_from_cache_entry``:
for each output, ``torch.empty_strided(..., device="meta")`` inside
``in_kernel_invocation_manager``, then ``FakeTensor(mode, meta, device)``.
After the key, that is a hit's largest cost, and most of it is the context
manager and the dispatch, not the tensor.

:func:`output_plan` reads an entry once and says whether :func:`build` can
make each of its outputs: a strided tensor, neither conj nor neg, fresh
(``_C.meta_empty_strided``), a view op's output on its argument's storage
(``_C.meta_view_of``), an in-place op's argument itself, or a constant int,
bool or ``None`` (Note [Building a hit's meta tensor without dispatch] in
``csrc/synth.cpp``). Outputs with symbolic sizes, fresh or views, take this
call's SymInts from this call's key, as torch's synthesis does, and a fresh
one the storage size of a template of torch's first synthesis of the entry
(``_C.meta_fresh_like``, ``_C.meta_view_like``; Note [Symbolic hits from a
template]). The FakeTensor is made as torch's constructor makes it
(:class:`FakeTensors`). Anything else (conj/neg bits, other layouts, SymInt
constants, a view that requires grad) goes to torch's path, as does
everything without the C++ extension.

Every entry is verified on the miss that creates it against the output this
module builds (the mode's ``_output_from_cache_entry`` is the one path for
hits and verification). Entries a stock mode wrote to torch's shared storage
were never verified by us, so the first plain hits of each process are also
compared with torch's own synthesis (:func:`checked_build`); a difference
turns this module off for the process, with a warning.

A mode asks one :class:`Synthesizer` for every output it rebuilds from an
entry (Note [One synthesis for hits and their verification]).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Sequence
from typing import Any, TypeAlias

import torch
from torch._ops import OpOverload
from torch._subclasses import fake_tensor as _ft
from torch._subclasses._fake_tensor_utils import _CacheKeyState, _PySymInputStub, _SymIntOutputStub
from torch._subclasses.fake_tensor import (
    FakeTensor,
    _DispatchCacheEntryOutputInfo,
    _DispatchCacheKey,
    _DispatchCacheValidEntry,
)

from torch_cachepolicy import native

__all__ = [
    "TORCH_PATH",
    "FakeTensors",
    "Plan",
    "Synthesizer",
    "available",
    "build",
    "checked_build",
    "output_plan",
    "settled",
    "stub_symint_output",
]

# How build() makes one output, by its first element:
#   (_NEW, shape, stride, dtype, device, requires_grad): a fresh tensor;
#   (_VIEW, arg index, shape, stride, storage offset, dtype, device): a
#       tensor on the storage of that argument (a view op's output);
#   (_INPLACE, arg index): that argument itself (an in-place op's output);
#   (_CONSTANT, value): an int, bool or None;
#   (_SYMBOLIC, [template, its storage size's ShapeEnv], requires_grad,
#       device, shape, stride, storage offset): a fresh tensor with symbolic
#       sizes: this call's SymInts (the entry's shape, stride and offset hold
#       ints and torch's _SymIntOutputStubs) on a fresh storage of the size
#       torch's first synthesis of the entry computed (Note [Symbolic hits
#       from a template] in csrc/synth.cpp), for calls whose SymInts belong
#       to that ShapeEnv; the template is filled in by Synthesizer.output;
#   (_SYMBOLIC_VIEW, [template, unused], arg index, device, shape,
#       stride, storage offset): a view op's output with symbolic sizes:
#       this call's SymInts on the storage of that argument.
_Step: TypeAlias = "tuple[Any, ...]"
Plan: TypeAlias = "tuple[bool, tuple[_Step, ...]]"
"""``(is_output_tuple, steps)``: how :func:`build` rebuilds an entry's output."""

_NEW, _VIEW, _INPLACE, _CONSTANT, _SYMBOLIC, _SYMBOLIC_VIEW = range(6)

# csrc/synth.cpp; fetched once because every plain hit calls them.
_meta_empty_strided = native.function("meta_empty_strided")
_meta_view_of = native.function("meta_view_of")
_meta_template = native.function("meta_template")
_meta_fresh_like = native.function("meta_fresh_like")
_meta_view_like = native.function("meta_view_like")

_CONSTANT_TYPES = (int, bool, type(None))

TORCH_PATH = object()
"""What :func:`build` returns when the arguments of this call need torch's path."""


def available() -> bool:
    """Whether hits of plain entries are built by the C++ helper."""
    return _meta_empty_strided is not None


def settled() -> bool:
    """Whether a plain hit's output may be built natively with no check by torch's synthesis.

    True once the canary has compared its outputs and the C++ helper is on,
    while FakeTensors may make hits' FakeTensors (:data:`FAST_FAKE_TENSORS`,
    FakeTensorConfig.debug off); ``hitpath`` asks before every native hit.
    """
    return _canary.remaining <= 0 and _meta_empty_strided is not None and FAST_FAKE_TENSORS and not _fake_config.debug


def _ints(values: object) -> bool:
    return type(values) is tuple and all(type(v) is int for v in values)


def _step(info: _DispatchCacheEntryOutputInfo) -> _Step | None:
    m = info.metadata
    if info.inplace_idx is not None:
        return (_INPLACE, info.inplace_idx)
    if m is None:
        value = info.constant_value
        if info.view_idx is None and type(value) in _CONSTANT_TYPES:
            return (_CONSTANT, value)
        return None
    if (
        m.layout is not torch.strided
        or m.is_conj
        or m.is_neg
        or m.is_sparse
        or m.is_quantized
        or type(m.dtype) is not torch.dtype
        or type(m.device) is not torch.device
    ):
        return None
    if not (_ints(m.shape) and _ints(m.stride)):
        sym = (tuple(m.shape), tuple(m.stride), m.storage_offset)
        if info.view_idx is None:
            return None if _meta_fresh_like is None else (_SYMBOLIC, [None, None], bool(m.requires_grad), m.device, *sym)
        # As for a static view: a view that requires grad stays with torch.
        if m.requires_grad or _meta_view_like is None:
            return None
        return (_SYMBOLIC_VIEW, [None, None], info.view_idx, m.device, *sym)
    if info.view_idx is None:
        return (_NEW, m.shape, m.stride, m.dtype, m.device, bool(m.requires_grad))
    # torch's set_ on a leaf that requires grad is autograd's business: its path.
    if m.requires_grad or type(m.storage_offset) is not int or _meta_view_of is None:
        return None
    return (_VIEW, info.view_idx, m.shape, m.stride, m.storage_offset, m.dtype, m.device)


def output_plan(entry: _DispatchCacheValidEntry, func: object = None) -> Plan | None:
    """How :func:`build` rebuilds ``entry``'s output, or ``None`` if it cannot.

    ``func`` is the operator: torch rebuilds a view entry as a view only for
    an ``OpOverload`` whose schema says it is a view, and so do we.
    """
    if _meta_empty_strided is None:
        return None
    steps = []
    for info in entry.output_infos:
        step = _step(info)
        if step is None:
            return None
        if step[0] in (_VIEW, _SYMBOLIC_VIEW) and not (isinstance(func, OpOverload) and func.is_view):
            return None
        steps.append(step)
    if not entry.is_output_tuple and len(steps) != 1:
        return None
    return bool(entry.is_output_tuple), tuple(steps)


def _sym_values(values: tuple[Any, ...], key: _DispatchCacheKey, shape_env: Any) -> list[Any]:
    # As torch's _get_output_tensor_from_cache_entry reads them: this call's
    # SymInts from this call's key.
    return [v if type(v) is int else v.extract(key, shape_env) for v in values]


def _sym_offset(value: Any, key: _DispatchCacheKey, shape_env: Any) -> Any:
    return value if type(value) is int else value.extract(key, shape_env)


def _shape_env_of(*groups: list[Any]) -> Any:
    # The ShapeEnv of the first SymInt among this call's values; None if all
    # are ints (a symbol replaced by a constant since), when torch's
    # synthesis computes a static storage size.
    for values in groups:
        for v in values:
            if type(v) is not int:
                return v.node.shape_env
    return None


def build(
    mode: Any,
    plan: Plan,
    args: Sequence[object],
    new_fake: Callable[..., Any] = FakeTensor,
    key: _DispatchCacheKey | None = None,
    shape_env: Any = None,
) -> object:
    """The output of a hit on an entry with this plan, made for ``mode``, or
    :data:`TORCH_PATH` when an aliased argument is not a FakeTensor (torch's
    path raises the error for that) or a symbolic output cannot be made
    here. ``new_fake(mode, meta, device)`` wraps each meta tensor (torch's
    constructor, or :class:`FakeTensors`). Symbolic outputs need this call's
    ``key`` and its state's ``shape_env``."""
    is_tuple, steps = plan
    outputs: list[object] = []
    for step in steps:
        kind = step[0]
        if kind == _NEW:
            meta = _meta_empty_strided(step[1], step[2], step[3], step[5])  # type: ignore[misc]
            outputs.append(new_fake(mode, meta, step[4]))
        elif kind == _SYMBOLIC:
            template, template_env = step[1]
            if template is None or key is None:
                return TORCH_PATH
            sizes = _sym_values(step[4], key, shape_env)
            strides = _sym_values(step[5], key, shape_env)
            offset = [_sym_offset(step[6], key, shape_env)]
            # The template's storage size is a SymInt of its ShapeEnv; keys
            # compare symbols by expression, so a call with symbols of
            # another ShapeEnv (equal names) may hit the entry.
            if template_env is not _STATIC_STORAGE and _shape_env_of(sizes, strides, offset) is not template_env:
                return TORCH_PATH
            meta = _meta_fresh_like(template, sizes, strides, offset[0], step[2])  # type: ignore[misc]
            outputs.append(new_fake(mode, meta, step[3]))
        elif kind == _CONSTANT:
            outputs.append(step[1])
        elif kind == _SYMBOLIC_VIEW:
            template = step[1][0]
            arg = args[step[2]] if step[2] < len(args) else None
            if template is None or key is None or not isinstance(arg, FakeTensor):
                return TORCH_PATH
            meta = _meta_view_like(  # type: ignore[misc]
                template,
                arg,
                _sym_values(step[4], key, shape_env),
                _sym_values(step[5], key, shape_env),
                _sym_offset(step[6], key, shape_env),
            )
            outputs.append(new_fake(mode, meta, step[3]))
        else:
            arg = args[step[1]] if step[1] < len(args) else None
            if not isinstance(arg, FakeTensor):
                return TORCH_PATH
            if kind == _INPLACE:
                outputs.append(arg)
            else:
                meta = _meta_view_of(arg, step[2], step[3], step[4], step[5])  # type: ignore[misc]
                outputs.append(new_fake(mode, meta, step[6]))
    return tuple(outputs) if is_tuple else outputs[0]


_make_subclass = torch.Tensor._make_subclass
_throw_on_data_ptr = torch._C._set_throw_on_mutable_data_ptr
_warn_on_data_ptr = torch._C._set_warn_deprecated_on_mutable_data_ptr
_fake_init = FakeTensor.__init__
_fake_config = _ft.FakeTensorConfig


def _code_names(fn: Any) -> frozenset[str]:
    names: set[str] = set()
    codes = [fn.__code__]
    while codes:
        code = codes.pop()
        names.update(code.co_names)
        codes.extend(c for c in code.co_consts if isinstance(c, type(fn.__code__)))
    return frozenset(names)


# The names torch 2.13/2.14's FakeTensor.__new__ uses. FakeTensors.make does
# what that constructor does for a hit's arguments; a torch whose constructor
# uses any other name (a new step) keeps its own constructor for every hit.
_CONSTRUCTOR_NAMES = frozenset(
    {
        "AssertionError", "CapturedTraceback", "FakeTensor", "FakeTensorConfig", "FakeTensorMode", "Tensor",
        "TypeError", "ValueError", "_C", "_FAKE_TENSOR_CONSTRUCTOR_IGNORED_STATE_ATTRS",
        "_allow_unsafe_data_ptr_access", "_debug_trace", "_is_param", "_make_subclass", "_normalize_fake_device",
        "_set_throw_on_mutable_data_ptr", "_set_warn_deprecated_on_mutable_data_ptr", "allow_meta", "cast",
        "constant", "debug", "device", "dict", "dispatch_keys", "extract", "fake_device", "fake_mode",
        "isinstance", "item_memo", "iter", "nested_int_memo", "next", "nonzero_memo", "object", "pop", "pytype",
        "real_tensor", "requires_grad", "str", "torch", "type", "unique_consecutive_memo", "unique_memo",
    }
)  # fmt: skip
FAST_FAKE_TENSORS = _code_names(FakeTensor.__new__) == _CONSTRUCTOR_NAMES
"""Whether :class:`FakeTensors` may make a hit's FakeTensor itself (this torch's constructor is the known one)."""


class FakeTensors:
    """Makes the FakeTensors of one mode's hits, as torch's constructor makes them.

    Note [A hit's FakeTensor]
    torch's ``FakeTensor(mode, meta, device)`` takes about 10 us: it parses
    its arguments (a general constructor), normalizes the device, and sets
    twenty attributes one by one, through descriptors. A hit's output always
    comes with the same few arguments, so :meth:`make` does what the
    constructor does for them: ``Tensor._make_subclass`` with the fake
    device's backend keys, the mutable-data-pointer guard the mode asks for,
    the instance attributes, and ``FakeTensor.__init__``. The attributes are
    not written out here: the first tensor a mode makes for a device is
    torch's own, and its ``__dict__`` (everything None but the mode and the
    device) is the one every later tensor starts from; any other value
    (a torch that sets one) keeps torch's constructor for that device. A
    meta fake device, or FakeTensorConfig.debug, always takes torch's
    constructor. The canary compares the first outputs with torch's, Python
    attributes included, and a torch whose constructor refers to names the
    known one does not (:data:`FAST_FAKE_TENSORS`) keeps its constructor.
    """

    __slots__ = ("bases",)

    def __init__(self) -> None:
        self.bases: dict[torch.device, dict[str, Any] | None] = {}
        """device -> the ``__dict__`` of torch's first FakeTensor of it (None: torch's constructor).
        Cleared in place, never replaced (``_C.HitPath`` reads it)."""

    def make(self, mode: Any, meta: torch.Tensor, device: torch.device) -> Any:
        """``FakeTensor(mode, meta, device)``."""
        base = self.bases.get(device, _UNSEEN)
        if base is None or _fake_config.debug or not FAST_FAKE_TENSORS:
            return FakeTensor(mode, meta, device)
        if base is _UNSEEN:
            return self._first(mode, meta, device)
        t = _make_subclass(FakeTensor, meta, meta.requires_grad, dispatch_device=True, device_for_backend_keys=device)
        if mode._allow_unsafe_data_ptr_access:
            _warn_on_data_ptr(t)
        else:
            _throw_on_data_ptr(t)
        t.__dict__.update(base)  # type: ignore[arg-type]
        _fake_init(t)
        return t

    def _first(self, mode: Any, meta: torch.Tensor, device: torch.device) -> Any:
        t = FakeTensor(mode, meta, device)
        state = dict(vars(t))
        plain = (
            device.type != "meta"
            and state.get("fake_mode") is mode
            and state.get("_fake_device") == device
            and all(v is None for k, v in state.items() if k not in ("fake_mode", "_fake_device"))
        )
        self.bases[device] = state if plain else None
        return t

    def clear(self) -> None:
        """Forgets the attributes it learned (they hold the mode)."""
        self.bases.clear()


_UNSEEN: Any = object()


class _Canary:
    """Compares the first plain hits of the process with torch's synthesis."""

    def __init__(self, checks: int = 8) -> None:
        self.remaining = checks


_canary = _Canary()


def checked_build(
    mode: Any,
    plan: Plan,
    torch_build: Callable[[], object],
    args: Sequence[object],
    new_fake: Callable[..., Any] = FakeTensor,
    key: _DispatchCacheKey | None = None,
    shape_env: Any = None,
) -> object:
    """:func:`build`, compared with ``torch_build()`` while the canary lasts.

    A difference (a torch release that synthesizes outputs differently)
    switches the fast path off for the process, warns, and returns torch's
    output: correct, only slower.
    """
    ours = build(mode, plan, args, new_fake, key, shape_env)
    if ours is TORCH_PATH or _canary.remaining <= 0:
        return ours
    from torch_cachepolicy.safety import describe, first_difference

    theirs = torch_build()
    diff = first_difference(describe(ours, args, {}), describe(theirs, args, {}))
    if diff is None:
        _canary.remaining -= 1
        return ours
    global _meta_empty_strided, _meta_view_of
    _meta_empty_strided = _meta_view_of = None
    _canary.remaining = 0
    warnings.warn(
        f"torch_cachepolicy.synth: a cache hit built without dispatch differs from torch's "
        f"_output_from_cache_entry on torch {torch.__version__} ({diff}); every hit of this "
        "process now uses torch's synthesis (correct, only slower). Please report this with "
        "your torch version.",
        stacklevel=2,
    )
    return theirs


# Output plans a synthesizer keeps (see Synthesizer.output).
_MAX_PLANS = 4096

_torch_synthesis = _ft.FakeTensorMode._output_from_cache_entry


def _torch_output(
    mode: Any,
    state: _CacheKeyState,
    entry: _DispatchCacheValidEntry,
    key: _DispatchCacheKey,
    func: Any,
    args: Sequence[object],
) -> Any:
    """torch's synthesis, with a bare SymInt output rebuilt from its stub (:func:`stub_symint_output`)."""
    output: Any = _torch_synthesis(mode, state, entry, key, func, args)
    if type(output) is _SymIntOutputStub:
        # Stubs are made only for entries kept on a ShapeEnv, which a hit's state has.
        return output.extract(key, state.shape_env)  # type: ignore[arg-type]
    return output


def stub_symint_output(
    entry: _DispatchCacheValidEntry, state: _CacheKeyState, key: _DispatchCacheKey
) -> _DispatchCacheValidEntry:
    """``entry`` with a bare SymInt output replaced by torch's ``_SymIntOutputStub``.

    torch's entry keeps a bare SymInt output as it is, so every hit would hand
    back the SymNode of the call that made the entry. An uncached run returns
    an input's SymInt (its very SymNode, for a kernel returning
    ``x.shape[0]``) or a new SymNode (``x.shape[0] * 2``); a tracer maps
    proxies by SymNode, so the difference shows in a traced graph. The stub
    does what torch does for a tensor output's sizes: a back reference to this
    call's input SymInt in the key, or the expression, rebuilt as a new SymNode.
    """
    if entry.is_output_tuple or len(entry.output_infos) != 1 or not state.cache_on_shape_env():
        return entry
    info = entry.output_infos[0]
    value = info.constant_value
    if type(value) is not torch.SymInt:
        return entry
    index = state.sym_node_lookup.get(id(value.node))
    items: tuple[Any, ...] = key.key
    if index is not None and not (
        index < len(items)
        and type(items[index]) is _PySymInputStub
        and getattr(items[index].value, "node", None) is value.node
    ):
        # A position outside torch's part of the key: rebuild from the expression.
        index = None
    stub = _SymIntOutputStub(value, index)
    return dataclasses.replace(entry, output_infos=(dataclasses.replace(info, constant_value=stub),))


_TEMPLATED = (_SYMBOLIC, _SYMBOLIC_VIEW)


def _templates_filled(plan: Plan) -> bool:
    return all(step[0] not in _TEMPLATED or step[1][0] is not None for step in plan[1])


# A template whose storage size is an int serves calls of any ShapeEnv.
_STATIC_STORAGE = object()


def _fill_templates(plan: Plan, output: object) -> None:
    """Keeps, for each symbolic step, a template of torch's synthesis of that
    output, and the ShapeEnv its storage size's SymNode belongs to."""
    outputs: Any = output if plan[0] else (output,)
    for step, out in zip(plan[1], outputs, strict=True):
        if step[0] in _TEMPLATED and step[1][0] is None:
            nbytes = out.untyped_storage().nbytes()
            step[1][1] = _STATIC_STORAGE if type(nbytes) is int else nbytes.node.shape_env
            step[1][0] = _meta_template(out)  # type: ignore[misc]


class Synthesizer:
    """Builds a mode's outputs from cache entries; one per mode.

    Note [One synthesis for hits and their verification]
    Hits of plain entries are built by :func:`build` (no dispatch, torch's
    FakeTensor constructor), everything else by torch's
    ``_output_from_cache_entry``. The mode's ``_output_from_cache_entry``
    calls :meth:`output`, and so do the miss-time verification and the
    crosscheck, so every entry is checked, on the miss that creates it,
    against the very function its hits use.
    """

    __slots__ = ("fakes", "plans")

    def __init__(self) -> None:
        self.plans: dict[int, tuple[object, Plan | None]] = {}
        """id(entry) -> (entry, plan). The entry is held so that its id cannot
        name another entry while mapped. Cleared in place, never replaced
        (``_C.HitPath`` reads it)."""
        self.fakes = FakeTensors()
        """Makes this mode's hits' FakeTensors."""

    def output(
        self,
        mode: Any,
        state: _CacheKeyState,
        entry: _DispatchCacheValidEntry,
        key: _DispatchCacheKey,
        func: Any,
        args: Sequence[object],
    ) -> Any:
        """The output of a hit on ``entry`` for this call, made for ``mode``."""
        if _meta_empty_strided is None:
            return _torch_output(mode, state, entry, key, func, args)
        planned = self.plans.get(id(entry))
        if planned is None or planned[0] is not entry:
            # Bounded: torch also calls this on entries it builds and drops
            # on every miss (to check each output), and torch's storage may
            # drop entries we still hold. Plans are cheap to rebuild.
            if len(self.plans) >= _MAX_PLANS:
                self.plans.clear()
            planned = self.plans[id(entry)] = (entry, output_plan(entry, func))
        plan = planned[1]
        if plan is not None:
            if not _templates_filled(plan):
                first = _torch_output(mode, state, entry, key, func, args)
                _fill_templates(plan, first)
                return first
            output: object
            if _canary.remaining > 0:
                output = checked_build(
                    mode,
                    plan,
                    lambda: _torch_output(mode, state, entry, key, func, args),
                    args,
                    self.fakes.make,
                    key,
                    state.shape_env,
                )
            else:
                output = build(mode, plan, args, self.fakes.make, key, state.shape_env)
            if output is not TORCH_PATH:
                return output
        return _torch_output(mode, state, entry, key, func, args)

    def __len__(self) -> int:
        """The number of entries with a memoized plan."""
        return len(self.plans)

    def clear(self) -> None:
        """Forgets every plan."""
        self.plans.clear()
        self.fakes.clear()
