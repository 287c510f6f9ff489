"""A cache hit's output, built without dispatch when the entry is plain.

A hit's largest cost after the key is ``torch.empty_strided(..., device="meta")`` in ``in_kernel_invocation_manager``
and ``FakeTensor(mode, meta, device)``; a :class:`Plan` per plain entry skips both (:class:`FakeTensors`; see
Note [Building a hit's meta tensor without dispatch] and Note [Symbolic hits from a template] in ``csrc/synth.cpp``).
Others (conj/neg bits, other layouts, SymInt constants, views requiring grad), and all without C++, go to torch.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

import torch
from torch._subclasses import fake_tensor as _ft
from torch._subclasses._fake_tensor_utils import _CacheKeyState, _PySymInputStub, _SymIntOutputStub
from torch._subclasses.fake_tensor import (
    FakeTensor,
    _DispatchCacheEntryOutputInfo,
    _DispatchCacheKey,
    _DispatchCacheValidEntry,
)

from torch_cachepolicy import _native
from torch_cachepolicy._compat import FAKE_TENSOR_CONSTRUCTOR_KNOWN
from torch_cachepolicy._fakes import output_from_entry
from torch_cachepolicy._key import SELF_CHECK, SELF_CHECK_ENV
from torch_cachepolicy._verify import describe, first_difference

if TYPE_CHECKING:
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

# csrc/synth.cpp; fetched once because every plain hit calls them. None (torch's synthesis for every hit) without
# the extension, which a changed internal it rests on also switches off.
_meta_empty_strided = _native.function("meta_empty_strided")
_meta_view_of = _native.function("meta_view_of")
_meta_template = _native.function("meta_template")
_meta_fresh_like = _native.function("meta_fresh_like")

_CONSTANT_TYPES = (int, bool, type(None))

TORCH_PATH: Any = object()
"""What a step returns when this call's arguments need torch's path."""

# new_fake(mode, meta, device): torch's FakeTensor constructor, or FakeTensors.make.
_NewFake = Callable[[Any, torch.Tensor, torch.device], Any]


def _arg(args: Sequence[object], index: int) -> FakeTensor | None:
    arg = args[index] if index < len(args) else None
    # torch's path raises the error for an aliased argument that is not a FakeTensor.
    return arg if isinstance(arg, FakeTensor) else None


def _this_call(values: Sequence[Any], key: _DispatchCacheKey, shape_env: ShapeEnv | None) -> list[Any]:
    # As torch's _get_output_tensor_from_cache_entry: this call's SymInts from this call's key.
    return [v if type(v) is int else v.extract(key, shape_env) for v in values]


@dataclasses.dataclass(slots=True)
class _Fresh:
    """A fresh tensor with static metadata."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device
    requires_grad: bool

    def make(self, mode: _ft.FakeTensorMode, args: Sequence[object], new_fake: _NewFake, key: _DispatchCacheKey, shape_env: ShapeEnv | None) -> object:
        meta = _meta_empty_strided(self.shape, self.stride, self.dtype, self.requires_grad)  # type: ignore[misc]
        return new_fake(mode, meta, self.device)


@dataclasses.dataclass(slots=True)
class _ViewOf:
    """A view op's output on the storage of argument ``index``."""

    index: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    storage_offset: int
    dtype: torch.dtype
    device: torch.device

    def make(self, mode: _ft.FakeTensorMode, args: Sequence[object], new_fake: _NewFake, key: _DispatchCacheKey, shape_env: ShapeEnv | None) -> object:
        base = _arg(args, self.index)
        if base is None:
            return TORCH_PATH
        meta = _meta_view_of(base, self.shape, self.stride, self.storage_offset, self.dtype)  # type: ignore[misc]
        return new_fake(mode, meta, self.device)


@dataclasses.dataclass(slots=True)
class _InPlace:
    """An in-place op's output: argument ``index`` itself."""

    index: int

    def make(self, mode: _ft.FakeTensorMode, args: Sequence[object], new_fake: _NewFake, key: _DispatchCacheKey, shape_env: ShapeEnv | None) -> object:
        arg = _arg(args, self.index)
        return TORCH_PATH if arg is None else arg


@dataclasses.dataclass(slots=True)
class _Constant:
    """An int, bool or None output."""

    value: object

    def make(self, mode: _ft.FakeTensorMode, args: Sequence[object], new_fake: _NewFake, key: _DispatchCacheKey, shape_env: ShapeEnv | None) -> object:
        return self.value


_STATIC_STORAGE: Any = object()  # a template whose storage size is an int serves any ShapeEnv


@dataclasses.dataclass(slots=True)
class _SymbolicFresh:
    """A fresh tensor with symbolic sizes: this call's SymInts on a storage sized as torch's first synthesis."""

    requires_grad: bool
    device: torch.device
    shape: tuple[Any, ...]
    stride: tuple[Any, ...]
    storage_offset: Any
    template: torch.Tensor | None = None
    template_env: Any = None

    def make(self, mode: _ft.FakeTensorMode, args: Sequence[object], new_fake: _NewFake, key: _DispatchCacheKey, shape_env: ShapeEnv | None) -> object:
        sizes = _this_call(self.shape, key, shape_env)
        strides = _this_call(self.stride, key, shape_env)
        (offset,) = _this_call((self.storage_offset,), key, shape_env)
        # Keys compare symbols by expression, so other ShapeEnvs' may hit; the template's storage size is its own.
        if self.template_env is not _STATIC_STORAGE and _shape_env_of(sizes, strides, [offset]) is not self.template_env:
            return TORCH_PATH
        meta = _meta_fresh_like(self.template, sizes, strides, offset, self.requires_grad)  # type: ignore[misc]
        return new_fake(mode, meta, self.device)

    def fill(self, output: torch.Tensor) -> None:
        nbytes = output.untyped_storage().nbytes()
        self.template_env = _STATIC_STORAGE if type(nbytes) is int else cast(Any, nbytes).node.shape_env
        self.template = _meta_template(output)  # type: ignore[misc]


_Step = _Fresh | _ViewOf | _InPlace | _Constant | _SymbolicFresh


def _shape_env_of(*groups: list[Any]) -> Any:
    # The first SymInt's ShapeEnv, or None if all are ints (symbols since pinned): torch then sizes storage statically.
    for values in groups:
        for v in values:
            if type(v) is not int:
                return cast(Any, v).node.shape_env
    return None


class Plan:
    """How to rebuild one entry's output without dispatch: a step per output."""

    __slots__ = ("is_tuple", "pending", "single", "steps")

    def __init__(self, is_tuple: bool, steps: tuple[_Step, ...]) -> None:
        self.is_tuple = is_tuple
        self.steps = steps
        self.single = None if is_tuple else steps[0]
        # Symbolic steps still waiting for torch's first synthesis to give their template.
        self.pending = tuple(s for s in steps if isinstance(s, _SymbolicFresh))

    def build(self, mode: _ft.FakeTensorMode, args: Sequence[object], new_fake: _NewFake, key: _DispatchCacheKey, shape_env: ShapeEnv | None) -> object:
        """The output for this call, or :data:`TORCH_PATH`."""
        if self.single is not None:
            return self.single.make(mode, args, new_fake, key, shape_env)
        outputs = []
        for step in self.steps:
            out = step.make(mode, args, new_fake, key, shape_env)
            if out is TORCH_PATH:
                return TORCH_PATH
            outputs.append(out)
        return tuple(outputs) if self.is_tuple else outputs[0]

    def fill_templates(self, output: object) -> None:
        outputs: Any = output if self.is_tuple else (output,)
        for step, out in zip(self.steps, outputs, strict=True):
            if isinstance(step, _SymbolicFresh):
                step.fill(out)
        self.pending = ()


def _ints(values: object) -> bool:
    return type(values) is tuple and all(type(v) is int for v in values)


def _step(info: _DispatchCacheEntryOutputInfo) -> _Step | None:
    m = info.metadata
    if info.inplace_idx is not None:
        return _InPlace(info.inplace_idx)
    if m is None:
        value = info.constant_value
        return _Constant(value) if info.view_idx is None and type(value) in _CONSTANT_TYPES else None
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
    # A view is an entry with a view_idx, as torch 2.15 decides (2.13 and 2.14 set one exactly for schema view ops,
    # which is what they ask); set_ on a leaf that requires grad is autograd's (torch's path).
    if info.view_idx is not None and m.requires_grad:
        return None
    if not (_ints(m.shape) and _ints(m.stride)):
        # Note [Traced graphs are stock's]
        # ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
        # Under a tracer (export, make_fx) a SymInt whose proxy is forced names a node, even one later dead, and
        # proxies are mapped by SymNode: a graph traced under a policy mode names its nodes as stock's does only if
        # every hit hands back the SymNodes stock's hit would and forces what stock's forces. A symbolic view stays
        # torch's (its set_ compares this call's SymInts); a template hit skips only the storage-size arithmetic,
        # whose results nothing traced reads. test_traced_graphs.py compares graphs, names included.
        if info.view_idx is not None:
            return None
        return _SymbolicFresh(bool(m.requires_grad), m.device, tuple(m.shape), tuple(m.stride), m.storage_offset)
    if info.view_idx is None:
        return _Fresh(cast(Any, m.shape), cast(Any, m.stride), m.dtype, m.device, bool(m.requires_grad))
    if type(m.storage_offset) is not int:
        return None
    return _ViewOf(info.view_idx, cast(Any, m.shape), cast(Any, m.stride), m.storage_offset, m.dtype, m.device)


def output_plan(entry: _DispatchCacheValidEntry) -> Plan | None:
    """How to rebuild ``entry``'s output without dispatch, or ``None`` if it cannot be."""
    if _meta_empty_strided is None:
        return None
    steps = []
    for info in entry.output_infos:
        step = _step(info)
        if step is None:
            return None
        steps.append(step)
    if not entry.is_output_tuple and len(steps) != 1:
        return None
    return Plan(bool(entry.is_output_tuple), tuple(steps))


_make_subclass = torch.Tensor._make_subclass
_throw_on_data_ptr = torch._C._set_throw_on_mutable_data_ptr
_warn_on_data_ptr = torch._C._set_warn_deprecated_on_mutable_data_ptr
_fake_init = FakeTensor.__init__
_fake_config = _ft.FakeTensorConfig
_UNSEEN: Any = object()


class FakeTensors:
    """Makes the FakeTensors of one mode's hits, as torch's constructor makes them."""

    # Note [A hit's FakeTensor]
    # ~~~~~~~~~~~~~~~~~~~~~~~~~
    # FakeTensor(mode, meta, device) takes ~10 us: it parses its arguments, normalizes the device and sets twenty
    # attributes via descriptors. make() does only what it does for a hit: _make_subclass with the fake device's
    # backend keys, the mode's mutable-data-pointer guard, the attributes of torch's first tensor for the device,
    # FakeTensor.__init__. torch's constructor stays if that tensor set more than mode and device, for a meta
    # device, under FakeTensorConfig.debug, or if it is not the known one (_compat.FAKE_TENSOR_CONSTRUCTOR_KNOWN).

    __slots__ = ("bases",)

    def __init__(self) -> None:
        # device -> the __dict__ of torch's first FakeTensor of it (None: torch's constructor).
        self.bases: dict[torch.device, dict[str, Any] | None] = {}

    def make(self, mode: _ft.FakeTensorMode, meta: torch.Tensor, device: torch.device) -> Any:
        """``FakeTensor(mode, meta, device)``."""
        base = self.bases.get(device, _UNSEEN)
        if base is None or _fake_config.debug or not FAKE_TENSOR_CONSTRUCTOR_KNOWN:
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

    def _first(self, mode: _ft.FakeTensorMode, meta: torch.Tensor, device: torch.device) -> Any:
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


_torch_synthesis: Any = _ft.FakeTensorMode._output_from_cache_entry


def _torch_output(
    mode: _ft.FakeTensorMode,
    state: _CacheKeyState,
    entry: _DispatchCacheValidEntry,
    key: _DispatchCacheKey,
    args: Sequence[object],
) -> Any:
    """torch's synthesis, with a bare SymInt output rebuilt from its stub (:func:`stub_symint_output`)."""
    output = output_from_entry(functools.partial(_torch_synthesis, mode), state, entry, key, args)
    if type(output) is _SymIntOutputStub:
        # Stubs are made only for entries kept on a ShapeEnv, which a hit's state has.
        return output.extract(key, state.shape_env)  # type: ignore[arg-type]
    return output


def stub_symint_output(
    entry: _DispatchCacheValidEntry, state: _CacheKeyState, key: _DispatchCacheKey
) -> _DispatchCacheValidEntry:
    """``entry``, a bare SymInt output stubbed (``_SymIntOutputStub``): tracers need this call's SymNode from hits."""
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


def from_captured(entry: _DispatchCacheValidEntry, captured: list[object], args: Sequence[object]) -> Any:
    """The output a hit of ``entry`` gives, from the outputs torch's entry builder had built for its tensors
    (Note [One synthesis for hits and their verification]); :data:`TORCH_PATH` if they do not make it up."""
    built = iter(captured)
    outputs: list[object] = []
    for info in entry.output_infos:
        if info.inplace_idx is not None:
            outputs.append(args[info.inplace_idx])
        elif info.metadata is not None:
            outputs.append(next(built, TORCH_PATH))
        elif type(info.constant_value) is _SymIntOutputStub:
            return TORCH_PATH  # a hit extracts this call's SymInt
        else:
            outputs.append(info.constant_value)
    if next(built, None) is not None or any(o is TORCH_PATH for o in outputs):
        return TORCH_PATH
    return tuple(outputs) if entry.is_output_tuple else outputs[0]


_MAX_PLANS = 4096


class Synthesizer:
    """Builds a mode's outputs from cache entries; one per mode."""

    # Note [One synthesis for hits and their verification]
    # ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    # Plain entries' hits are built by a Plan, the rest by torch's _output_from_cache_entry. Hits, miss-time
    # verification and crosscheck all call output(): each entry is checked, on its miss, by the function hits use.
    # torch's _make_cache_entry already builds, through the mode, the output a hit would give for each tensor it
    # stores (to compare dispatch keys), on copies of the entry it then drops: while it runs (`captured` is a list)
    # those outputs are kept for the miss's verification, which then builds none again (a symbolic output costs
    # about a millisecond), and their plans are not memoized: an entry's plan is made at its first hit, so a key
    # that never comes back costs none.

    __slots__ = ("captured", "fakes", "plans")

    def __init__(self) -> None:
        # id(entry) -> (entry, plan); holding the entry keeps its id from naming another.
        self.plans: dict[int, tuple[object, Plan | None]] = {}
        self.fakes = FakeTensors()
        self.captured: list[object] | None = None

    @property
    def transient(self) -> bool:
        """Whether torch's entry builder is running (its outputs are captured, their plans not kept)."""
        return self.captured is not None

    def output(
        self,
        mode: _ft.FakeTensorMode,
        state: _CacheKeyState,
        entry: _DispatchCacheValidEntry,
        key: _DispatchCacheKey,
        args: Sequence[object],
    ) -> Any:
        """The output of a hit on ``entry`` for this call (whose op is ``key``'s first item), made for ``mode``."""
        output = self._build(mode, state, entry, key, args)
        if self.captured is not None:
            self.captured.append(output)
        return output

    def _build(
        self,
        mode: _ft.FakeTensorMode,
        state: _CacheKeyState,
        entry: _DispatchCacheValidEntry,
        key: _DispatchCacheKey,
        args: Sequence[object],
    ) -> Any:
        """The output of a hit on ``entry`` for this call (whose op is ``key``'s first item), made for ``mode``."""
        if _meta_empty_strided is None:
            return _torch_output(mode, state, entry, key, args)
        planned = self.plans.get(id(entry))
        if planned is None or planned[0] is not entry:
            planned = (entry, output_plan(entry))
            if self.captured is None:
                # Bounded: torch's storage may drop entries whose plans we keep.
                if len(self.plans) >= _MAX_PLANS:
                    self.plans.clear()
                self.plans[id(entry)] = planned
        plan = planned[1]
        if plan is not None:
            if plan.pending:
                first = _torch_output(mode, state, entry, key, args)
                plan.fill_templates(first)
                return first
            output = plan.build(mode, args, self.fakes.make, key, state.shape_env)
            if output is not TORCH_PATH:
                if SELF_CHECK:
                    _check_against_torch(output, _torch_output(mode, state, entry, key, args), key.key[0], args)
                return output
        return _torch_output(mode, state, entry, key, args)

    def __len__(self) -> int:
        """The number of entries with a memoized plan."""
        return len(self.plans)

    def clear(self) -> None:
        """Forgets every plan."""
        self.plans.clear()
        self.fakes.clear()


def _fake_state(t: object) -> object:
    """What ``describe`` leaves out of a hit's FakeTensor: its type, dispatch keys and data-pointer guard."""
    if not isinstance(t, torch.Tensor):
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the warning guard warns once per process
            t.untyped_storage().data_ptr()
        guard = "allowed"
    except Exception as e:
        guard = type(e).__name__
    return (type(t), str(torch._C._dispatch_keys(t)), guard)


def _check_against_torch(ours: object, theirs: object, func: object, args: Sequence[object]) -> None:
    diff = first_difference(describe(ours, args, {}), describe(theirs, args, {}))
    if diff is None:
        pairs = zip(*(o if isinstance(o, tuple) else (o,) for o in (ours, theirs)), strict=True)
        diff = next((f"output {i} {_fake_state(a)}" for i, (a, b) in enumerate(pairs) if _fake_state(a) != _fake_state(b)), None)
    if diff is not None:
        raise RuntimeError(
            f"torch_cachepolicy ({SELF_CHECK_ENV}=1): a cache hit of {func} built without dispatch differs "
            f"from torch's _output_from_cache_entry on torch {torch.__version__} in {diff}; please report this "
            "with your torch version"
        )
