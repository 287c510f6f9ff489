"""The kernel zoo: ``tcp_zoo`` backend operators whose fake kernels each do one unusual but legal thing.

Every case pairs an operator with an input builder and a call sequence (``"F"``: freshly built inputs of equal
metadata, ``"S"``: the same input objects again), so a test can check the cache's guarantee: each call either
bypasses the cache or returns exactly what an uncached dispatch returns. ``test_kernel_zoo.py`` runs the cases;
``test_fuzz.py`` draws from them. The ``tcp_zoo`` namespace is defined once per process. The end of the module holds
what the tests compare calls with: ``describe_call``, ``dispatch_difference`` and ``ZooTestCase.run_case``.

Classes (``ZooCase.kind``):

1. fresh outputs with an odd layout (storage offset, oversized storage, odd or zero strides, channels_last, 0-size,
   two outputs in one storage);
2. float arguments the key may conflate or never match (``-0.0``, NaN, inf, floats in lists, dicts, complex,
   Scalar);
3. tensor arguments that alias each other (same object twice, views of one base, in lists and dicts, a view and
   its base), where the kernel raises or answers differently on aliasing;
4. fake kernels that change an input's metadata, on functional and on (allowed) mutating schemas;
5. fake kernels replaced after the first calls (register_fake, a fragment Library, custom_op, Meta,
   CompositeExplicitAutograd);
6. entries that cover inner ops: ``invoke_subgraph`` (nested too), or a backend kernel dispatching another op,
   where the inner op reads the policy's context, is denied, is replaced, mutates, or sees aliasing;
7. kernels reading ambient state, declared through ``context_key`` or not;
8. everything else: aliasing outputs, views, returning an input, None in tuples, SymInt outputs, symbolic inputs,
   raising kernels, stateful kernels, kwargs, defaults, lists, typed arguments, Python attributes and memos on
   tensors, controls that must be cached.
"""

from __future__ import annotations

import contextlib
import math
import operator
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import cachepolicy_testing as testing
import sympy
import torch
import torch.utils._pytree as pytree
from torch._dispatch.python import enable_python_dispatcher
from torch._ops import OpOverload
from torch._subclasses.fake_tensor import FakeTensor, disable_fake_tensor_cache
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext, free_symbols

import torch_cachepolicy as tcp

# Every zoo kernel counts its runs, so a test can tell a hit (no run) from a miss.
ZOO_OPS = testing.CountedOps("tcp_zoo")
NS = ZOO_OPS.ns
lib = ZOO_OPS.lib
calls = ZOO_OPS.calls
op = ZOO_OPS.op
zoo_op = ZOO_OPS.define

# Ambient state read by fake kernels: AMBIENT is declared through CachePolicy(context_key=...), UNDECLARED is not.
AMBIENT: dict[str, torch.dtype] = {"dtype": torch.float32}
UNDECLARED: dict[str, torch.dtype] = {"dtype": torch.float32}


def ambient_context() -> object:
    """The context_key of the policies whose kernels read AMBIENT."""
    return AMBIENT["dtype"]


# ------------------------------------------------------------------ cases


@dataclass(frozen=True)
class Call:
    """The arguments of one call."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class Env:
    """What builders read: the mode and two sizes, symbolic when the case asks for a ShapeEnv."""

    mode: torch._subclasses.fake_tensor.FakeTensorMode
    s0: Any = 5
    s1: Any = 3
    u0: Any = 4  # an unbacked size when symbolic

    @classmethod
    def make(cls, mode: torch._subclasses.fake_tensor.FakeTensorMode, symbolic: bool) -> Env:
        if not symbolic:
            return cls(mode)
        # One template per run, so both worlds (cached and reference) build inputs on the same symbols.
        dynamic = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC, DimDynamic.DYNAMIC])
        template = mode.from_tensor(torch.empty(5, 3, device="meta"), symbolic_context=dynamic)
        assert mode.shape_env is not None
        return cls(mode, template.shape[0], template.shape[1], mode.shape_env.create_unbacked_symint())


Builder = Callable[[Env, int], Call]


def default_policy() -> tcp.CachePolicy:
    return tcp.CachePolicy(namespaces=[NS])


@dataclass(frozen=True)
class ZooCase:
    """One zoo operator and how to call it.

    Attributes:
        name: the test's name.
        kind: the failure class (see the module docstring).
        op: the zoo operator whose kernel runs and cache report are observed.
        build: ``build(env, i)`` makes the arguments of call ``i`` (inside the mode); called once per world.
        doc: one line: the unusual thing the kernel does.
        steps: one letter per call: ``F`` fresh inputs (``build`` again), ``S`` the previous call's inputs.
        target: what is called; ``op`` unless a HOP wraps it.
        policy: makes the run's policy.
        symbolic: give the mode a ShapeEnv (``env.s0``/``env.s1`` become symbols).
        shape_env: give the mode a ShapeEnv, the inputs staying static.
        actions: ``{i: f}``: ``f()`` runs before call ``i`` (swap a kernel, change ambient state).
        reset: runs before and after each run: puts registrations and globals back.
        min_hits: a control: at least this many calls must be served from the cache.
        runs_every_call: the kernel of ``op`` must run on every cached call (a denied op under a HOP).
        limit: a documented limit (the user's responsibility); the test is an expected failure.
        caught_by_crosscheck: with crosscheck on, the limit must raise ``CrosscheckError`` (what catches it).
    """

    name: str
    kind: int
    op: OpOverload
    build: Builder
    doc: str
    steps: str = "FSFSF"
    target: Callable[..., Any] | None = None
    policy: Callable[[], tcp.CachePolicy] = default_policy
    symbolic: bool = False
    shape_env: bool = False
    actions: dict[int, Callable[[], None]] = field(default_factory=dict)
    reset: Callable[[], None] | None = None
    min_hits: int = 0
    runs_every_call: bool = False
    limit: str | None = None
    # The crosscheck settings under which the limit shows (a crosscheck may catch it).
    limit_crosscheck: tuple[bool, ...] = (False, True)
    caught_by_crosscheck: bool = False

    @property
    def callee(self) -> Callable[..., Any]:
        return self.op if self.target is None else self.target

    def __repr__(self) -> str:  # parametrize names tests by it
        return self.name


CASES: list[ZooCase] = []


def case(name: str, kind: int, build: Builder, doc: str, **kwargs: Any) -> None:
    CASES.append(ZooCase(name, kind, kwargs.pop("op", None) or op(name), build, doc, **kwargs))


def t(*shape: Any, **kwargs: Any) -> torch.Tensor:
    return torch.empty(*shape, **kwargs)


def x1(env: Env, i: int) -> Call:
    return Call((t(env.s0),))


def x2(env: Env, i: int) -> Call:
    return Call((t(env.s0, env.s1),))


# ---------------------------------------------------- 1. fresh outputs, odd layouts


@zoo_op("offset_out(Tensor x) -> Tensor")
def _offset_out(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.numel() + 8)[8:]


@zoo_op("big_storage_out(Tensor x) -> Tensor")
def _big_storage_out(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(64)[:6].view(2, 3)


@zoo_op("odd_stride_out(Tensor x) -> Tensor")
def _odd_stride_out(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(4, 6)[:, ::2]  # strides (6, 2); the storage holds one element more than they reach


@zoo_op("expand_out(Tensor x) -> Tensor")
def _expand_out(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape[0], 1).expand(x.shape[0], 4)


@zoo_op("expand_offset_out(Tensor x) -> Tensor")
def _expand_offset_out(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(5)[2:3].expand(6)  # stride 0, offset 2, into a 5-element storage


@zoo_op("channels_last_out(Tensor x) -> Tensor")
def _channels_last_out(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(2, 5, 4, 3).permute(0, 3, 1, 2)


@zoo_op("zero_size_out(Tensor x) -> Tensor")
def _zero_size_out(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(16)[4:4].view(0, 2)


@zoo_op("shared_storage_outs(Tensor x) -> (Tensor, Tensor)")
def _shared_storage_outs(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    base = x.new_empty(10)
    return base[:4], base[4:].view(2, 3)


case("offset_out", 1, x1, "a fresh output at storage offset 8")
case("big_storage_out", 1, x1, "a fresh output whose storage is larger than its shape needs")
case("odd_stride_out", 1, x2, "a fresh output with a step-2 column stride")
case("expand_out", 1, x1, "a fresh expanded output (zero stride)")
case("expand_offset_out", 1, x1, "a fresh expanded output at an offset into a larger storage")
case("channels_last_out", 1, x1, "a fresh channels_last output")
case("zero_size_out", 1, x1, "a fresh 0-size output at an offset into a 16-element storage")
case("shared_storage_outs", 1, x1, "two fresh outputs at different offsets of one storage")


# ------------------------------------------------------------- 2. float arguments


def _sign(v: float) -> float:
    return math.copysign(1.0, v)


@zoo_op("signed_zero(Tensor x, float s) -> Tensor")
def _signed_zero(x: torch.Tensor, s: float) -> torch.Tensor:
    return x.new_empty(2, dtype=torch.float32 if _sign(s) > 0 else torch.float64)


@zoo_op("nan_arg(Tensor x, float s) -> Tensor")
def _nan_arg(x: torch.Tensor, s: float) -> torch.Tensor:
    return x.new_empty(1 if math.isnan(s) else 2, dtype=torch.float32 if _sign(s) > 0 else torch.float64)


@zoo_op("inf_arg(Tensor x, float s) -> Tensor")
def _inf_arg(x: torch.Tensor, s: float) -> torch.Tensor:
    return x.new_empty(3 if s == math.inf else 4 if s == -math.inf else 5)


@zoo_op("float_list(Tensor x, float[] s) -> Tensor")
def _float_list(x: torch.Tensor, s: list[float]) -> torch.Tensor:
    return x.new_empty(1 + sum(_sign(v) < 0 for v in s))


@zoo_op("complex_arg(Tensor x, complex c) -> Tensor")
def _complex_arg(x: torch.Tensor, c: complex) -> torch.Tensor:
    return x.new_empty(2 if _sign(c.real) > 0 else 3, dtype=torch.float32 if _sign(c.imag) > 0 else torch.float64)


@zoo_op("scalar_arg(Tensor x, Scalar s) -> Tensor")
def _scalar_arg(x: torch.Tensor, s: Any) -> torch.Tensor:
    size = 2 if isinstance(s, bool) else 3 if isinstance(s, int) else 4
    return x.new_empty(size, dtype=torch.float32 if _sign(float(s.real if isinstance(s, complex) else s)) > 0 else torch.float64)


@zoo_op("dict_float(Tensor x, Dict(str, float) d) -> Tensor")
def _dict_float(x: torch.Tensor, d: dict[str, float]) -> torch.Tensor:
    return x.new_empty(1 if math.isnan(d["s"]) else 2, dtype=torch.float32 if _sign(d["s"]) > 0 else torch.float64)


ZERO_SIGNS = [0.0, -0.0, 0.0, -0.0, -0.0, 0.0]
case("signed_zero", 2, lambda env, i: Call((t(3), ZERO_SIGNS[i])), "picks the dtype by the sign of a float zero", steps="FFFFFF")
case("nan_arg", 2, lambda env, i: Call((t(3), [math.nan, -math.nan, math.nan, 1.0, -math.nan, 1.0][i])), "picks size by isnan and dtype by the sign of NaN", steps="FSFFFS")
case("inf_arg", 2, lambda env, i: Call((t(3), [math.inf, -math.inf, math.inf, 1.0, -math.inf, 1.0][i])), "picks the size by inf, -inf or finite", steps="FSFFFS")
case("float_list", 2, lambda env, i: Call((t(3), [[0.0, 1.0], [-0.0, 1.0], [0.0, -1.0], [-0.0, -1.0], [0.0, 1.0]][i])), "counts negative-signed floats (zeros included) in a list", steps="FFFFF")
case(
    "complex_arg",
    2,
    lambda env, i: Call((t(3), [complex(0.0, 0.0), complex(0.0, -0.0), complex(-0.0, 0.0), complex(-0.0, -0.0), complex(0.0, 0.0)][i])),
    "picks size and dtype by the signs of a complex zero's parts",
    steps="FFFFF",
)
case("dict_float", 2, lambda env, i: Call((t(3), {"s": ZERO_SIGNS[i]})), "picks the dtype by the sign of a float zero in a Dict(str, float)", steps="FFFFFF")
case("scalar_arg", 2, lambda env, i: Call((t(3), [0.0, -0.0, 0, False, -0.0, 1.5][i])), "picks size by the Scalar's type and dtype by its sign", steps="FFFFFF")


# ---------------------------------------------------------- 3. aliasing arguments


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage()._cdata == b.untyped_storage()._cdata


def _extent(t: torch.Tensor) -> tuple[int, int]:
    """[first, last] element offsets ``t`` can reach in its storage."""
    last = t.storage_offset() + sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True))
    return t.storage_offset(), last


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    if not _same_storage(a, b) or a.numel() == 0 or b.numel() == 0:
        return False
    (a0, a1), (b0, b1) = _extent(a), _extent(b)
    return a0 <= b1 and b0 <= a1


@zoo_op("same_twice(Tensor a, Tensor b) -> Tensor")
def _same_twice(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if a is b:
        raise ValueError("tcp_zoo::same_twice: a and b are the same tensor")
    return a.new_empty(a.shape)


@zoo_op("storage_alias(Tensor a, Tensor b) -> Tensor")
def _storage_alias(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a.new_empty(1 if _same_storage(a, b) else 2)


@zoo_op("overlap_raises(Tensor a, Tensor b) -> Tensor")
def _overlap_raises(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if _overlap(a, b):
        raise RuntimeError("tcp_zoo::overlap_raises: a and b overlap in memory")
    return a.new_empty(a.shape)


@zoo_op("list_dups(Tensor[] xs) -> Tensor")
def _list_dups(xs: list[torch.Tensor]) -> torch.Tensor:
    if len({id(x) for x in xs}) != len(xs):
        raise ValueError("tcp_zoo::list_dups: a tensor appears twice")
    return xs[0].new_empty(len(xs))


@zoo_op("inplace_overlap(Tensor(a!) x, Tensor y) -> Tensor(a!)")
def _inplace_overlap(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    if _same_storage(x, y):
        raise RuntimeError("tcp_zoo::inplace_overlap: y shares x's storage")
    return x


@zoo_op("dict_tensors(Tensor x, Dict(str, Tensor) d) -> Tensor")
def _dict_tensors(x: torch.Tensor, d: dict[str, torch.Tensor]) -> torch.Tensor:
    if d["a"] is d["b"]:
        raise ValueError("tcp_zoo::dict_tensors: d['a'] and d['b'] are the same tensor")
    return x.new_empty(2)


@zoo_op("view_base(Tensor x) -> Tensor")
def _view_base(x: torch.Tensor) -> torch.Tensor:
    base = x._base
    return x.new_empty(0 if base is None else base.dim())  # what the input is a view of


@zoo_op("base_identity(Tensor a, Tensor b) -> Tensor")
def _base_identity(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a.new_empty(1 if a._base is b else 2)  # is b the tensor a is a view of?


@zoo_op("tensor_attr(Tensor x) -> Tensor")
def _tensor_attr(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(getattr(x, "zoo_size", 1))  # a Python attribute a pass attached to the tensor object


def _pair_or_twice(env: Env, i: int) -> Call:
    x = t(4)
    return Call((x, x) if i % 2 else (x, t(4)))


def _views(overlapping: bool) -> Builder:
    """Two views with equal metadata; on odd calls of one base, on even calls of two bases."""
    a_slice, b_slice = (slice(0, 6), slice(2, 8)) if overlapping else (slice(0, 4), slice(4, 8))

    def build(env: Env, i: int) -> Call:
        base, other = t(8), t(8)
        return Call((base[a_slice], (base if i % 2 else other)[b_slice]))

    return build


def _list_with_dups(env: Env, i: int) -> Call:
    x = t(3)
    return Call(([x, x, t(3)] if i % 2 else [x, t(3), t(3)],))


def _inplace_pair(env: Env, i: int) -> Call:
    base = t(8)
    return Call((base[:4], base[4:] if i % 2 else t(8)[4:]))


def _dict_pair(env: Env, i: int) -> Call:
    a = t(3)
    return Call((t(3), {"a": a, "b": a if i % 2 else t(3)}))


def _views_of_bases(env: Env, i: int) -> Call:
    """Equal views (shape 4, offset 0, 32 bytes) of a 2-D base on even calls and of a 1-D base on odd ones."""
    base = t(8) if i % 2 else t(2, 4)
    return Call((base.view(-1)[:4],))


def _base_or_alias(env: Env, i: int) -> Call:
    """(a view, its base) on even calls; (a view, a non-view alias of its base) on odd ones."""
    base = t(8)
    return Call((base[:4], base if i % 2 == 0 else base.detach()))


def _with_attr(env: Env, i: int) -> Call:
    x = t(3)
    x.zoo_size = 1 + i % 2  # type: ignore[attr-defined]
    return Call((x,))


def _allow(name: str) -> Callable[[], tcp.CachePolicy]:
    def make() -> tcp.CachePolicy:
        policy = default_policy()
        policy.register_op(op(name))
        return policy

    return make


case("same_twice", 3, _pair_or_twice, "raises when given the same tensor twice", steps="FFSFF")
case("storage_alias", 3, _views(overlapping=False), "answers by whether two non-overlapping views share a storage", steps="FFSFF")
case("overlap_raises", 3, _views(overlapping=True), "raises when two views overlap in memory", steps="FFSFF")
case("list_dups", 3, _list_with_dups, "raises when a Tensor[] holds one tensor twice", steps="FFSFF")
case("dict_tensors", 3, _dict_pair, "raises when a Dict(str, Tensor) holds one tensor twice", steps="FFSFF")
case("view_base", 3, _views_of_bases, "answers by the rank of the base its input is a view of", steps="FFSFF")
case("base_identity", 3, _base_or_alias, "answers by whether its second argument is the base of its first", steps="FFSFF")
case(
    "tensor_attr",
    3,
    _with_attr,
    "reads a Python attribute attached to its input tensor",
    steps="FFSFF",
    limit="state attached to a tensor object, outside its metadata, is like undeclared ambient state",
)
case("inplace_overlap", 3, _inplace_pair, "an allowed in-place op that raises when its operands share storage", steps="FFSFF", policy=_allow("inplace_overlap"))


# ------------------------------------------------------- 4. kernels that mutate inputs


@zoo_op("func_unsqueeze(Tensor x) -> Tensor")
def _func_unsqueeze(x: torch.Tensor) -> torch.Tensor:
    x.unsqueeze_(0)
    return x.new_empty(2)


@zoo_op("func_resize(Tensor x) -> Tensor")
def _func_resize(x: torch.Tensor) -> torch.Tensor:
    x.resize_(x.numel() + 4)
    return x.new_empty(2)


@zoo_op("func_as_strided(Tensor x) -> Tensor")
def _func_as_strided(x: torch.Tensor) -> torch.Tensor:
    x.as_strided_((1,), (2,), 1)
    return x.new_empty(2)


@zoo_op("func_set(Tensor x) -> Tensor")
def _func_set(x: torch.Tensor) -> torch.Tensor:
    x.set_(x.new_empty(7))
    return x.new_empty(2)


@zoo_op("func_requires_grad(Tensor x) -> Tensor")
def _func_requires_grad(x: torch.Tensor) -> torch.Tensor:
    x.requires_grad_()
    return x.new_empty(2)


@zoo_op("mut_resize(Tensor(a!) x) -> ()")
def _mut_resize(x: torch.Tensor) -> None:
    x.resize_(x.numel() + 4)


@zoo_op("mut_unsqueeze(Tensor(a!) x) -> Tensor(a!)")
def _mut_unsqueeze(x: torch.Tensor) -> torch.Tensor:
    x.unsqueeze_(0)
    return x


case("func_unsqueeze", 4, x1, "a functional schema whose kernel unsqueezes its input in place")
case("func_resize", 4, x1, "a functional schema whose kernel resizes its input")
case("func_as_strided", 4, x1, "a functional schema whose kernel restrides its input (as_strided_)")
case("func_set", 4, x1, "a functional schema whose kernel points its input at another storage (set_)")
case("func_requires_grad", 4, x1, "a functional schema whose kernel sets requires_grad on its input")
case("mut_resize", 4, x1, "an allowed Tensor(a!) -> () op whose kernel resizes its input", policy=_allow("mut_resize"))
case("mut_unsqueeze", 4, x1, "an allowed Tensor(a!) -> Tensor(a!) op whose kernel unsqueezes its input", policy=_allow("mut_unsqueeze"))


# ------------------------------------------------------------ 5. replaced kernels


def _sized(name: str, n: int) -> Callable[..., Any]:
    return ZOO_OPS.counted(name, lambda x: x.new_empty(n))


lib.define("swap_fake(Tensor x) -> Tensor")
lib.define("swap_fragment(Tensor x) -> Tensor")
lib.define("swap_meta(Tensor x) -> Tensor")
lib.define("swap_composite(Tensor x) -> Tensor")


@torch.library.custom_op(f"{NS}::swap_custom_op", mutates_args=())
def swap_custom_op(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


_fragments: list[torch.library.Library] = []


def _quietly(fn: Callable[[], object]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Overriding a previously registered kernel"
        fn()


def _register(name: str, n: int) -> Callable[[], None]:
    """Registers a fake kernel returning an ``n``-element tensor, the way op ``name`` is re-registered."""

    def register() -> None:
        kernel = _sized(name, n)
        if name == "swap_fake":
            torch.library.register_fake(f"{NS}::{name}", kernel, lib=lib, allow_override=True)
        elif name == "swap_fragment":
            if n == 1:
                torch.library.register_fake(f"{NS}::{name}", kernel, lib=lib, allow_override=True)
            else:
                fragment = torch.library.Library(NS, "FRAGMENT")
                _fragments.append(fragment)
                torch.library.register_fake(f"{NS}::{name}", kernel, lib=fragment, allow_override=True)
        elif name == "swap_custom_op":
            swap_custom_op.register_fake(kernel)
        elif name == "swap_meta":
            _quietly(lambda: lib.impl(name, kernel, "Meta", allow_override=True))
        else:
            _quietly(lambda: lib.impl(name, kernel, "CompositeExplicitAutograd", allow_override=True))

    return register


def _destroy_fragments() -> None:
    # Destroying a fragment deregisters the fake kernel it registered: the op's holder falls back to the one
    # registered before (swap_fragment), or to none, after which torch's fake dispatch raises (swap_meta_to_fake).
    while _fragments:
        _fragments.pop()._destroy()


def _reset_fragment() -> None:
    _destroy_fragments()
    _register("swap_fragment", 1)()


for _name, _how in [
    ("swap_fake", "torch.library.register_fake(..., allow_override=True)"),
    ("swap_custom_op", "custom_op.register_fake(new_fn)"),
    ("swap_meta", "Library.impl(name, fn, 'Meta', allow_override=True)"),
    ("swap_composite", "Library.impl(name, fn, 'CompositeExplicitAutograd', allow_override=True)"),
]:
    _register(_name, 1)()
    case(
        _name,
        5,
        x1,
        f"its kernel is replaced after two calls with {_how}",
        steps="FSFSFS",
        actions={2: _register(_name, 2), 4: _register(_name, 3)},
        reset=_register(_name, 1),
    )
_reset_fragment()
lib.define("swap_meta_to_fake(Tensor x) -> Tensor")
_quietly(lambda: lib.impl("swap_meta_to_fake", _sized("swap_meta_to_fake", 1), "Meta", allow_override=True))


def _fake_over_meta() -> None:
    fragment = torch.library.Library(NS, "FRAGMENT")
    _fragments.append(fragment)
    torch.library.register_fake(f"{NS}::swap_meta_to_fake", _sized("swap_meta_to_fake", 2), lib=fragment)


case(
    "swap_meta_to_fake",
    5,
    x1,
    "a Meta kernel, then a fake impl from a FRAGMENT Library (which takes precedence), then the fragment destroyed",
    steps="FSFSFS",
    actions={2: _fake_over_meta, 4: _destroy_fragments},
    reset=_destroy_fragments,
    # torch 2.13 and 2.14 bug, not ours: after the fragment is destroyed the dispatcher's registrations are back to
    # the first Meta kernel (so are the entries we serve), but dispatch still runs the fragment's Meta wrapper, which
    # raises "fake_impl_holder.kernel must not be None". With crosscheck on, the hit is rerun and the error surfaces.
    limit="torch keeps dispatching a destroyed fragment's fake-impl wrapper; the cache serves the registered kernel",
    limit_crosscheck=(False,),
)
lib.define("swap_meta_fragment(Tensor x) -> Tensor")
_quietly(lambda: lib.impl("swap_meta_fragment", _sized("swap_meta_fragment", 1), "Meta", allow_override=True))


def _meta_from_fragment() -> None:
    fragment = torch.library.Library(NS, "FRAGMENT")
    _fragments.append(fragment)
    _quietly(lambda: fragment.impl("swap_meta_fragment", _sized("swap_meta_fragment", 2), "Meta", allow_override=True))


def _reset_meta_fragment() -> None:
    # Registering the first kernel again is what makes torch's fake dispatch forget a destroyed fragment's kernel
    # (destroying it does not), so that each run starts from the same registrations.
    _destroy_fragments()
    _quietly(lambda: lib.impl("swap_meta_fragment", _sized("swap_meta_fragment", 1), "Meta", allow_override=True))


case(
    "swap_meta_fragment",
    5,
    x1,
    "a Meta kernel overridden with Library.impl(..., 'Meta') from a FRAGMENT Library, which is then destroyed",
    steps="FSFSFS",
    actions={2: _meta_from_fragment, 4: _destroy_fragments},
    reset=_reset_meta_fragment,
    # torch 2.13 and 2.14 bug, not ours: once the fragment is destroyed the dispatcher and real meta tensors run the
    # first Meta kernel again (and we serve its entries), but fake dispatch keeps running the destroyed one. With
    # crosscheck on, the hit is rerun uncached and the difference raises CrosscheckError.
    limit="torch's fake dispatch keeps running a destroyed fragment's Meta kernel; the cache serves the restored one",
    limit_crosscheck=(False,),
    caught_by_crosscheck=True,
)
case(
    "swap_fragment",
    5,
    x1,
    "its kernel is overridden from a FRAGMENT Library, which is then destroyed (back to the first kernel)",
    steps="FSFSFS",
    actions={2: _register("swap_fragment", 2), 4: _destroy_fragments},
    reset=_reset_fragment,
)


# ------------------------------------- 6. entries covering inner ops (invoke_subgraph, nested ops)


@zoo_op("hop_inner(Tensor x) -> Tensor")
def _hop_inner(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape, dtype=AMBIENT["dtype"])


@zoo_op("calls_inner(Tensor x) -> Tensor")
def _calls_inner(x: torch.Tensor) -> torch.Tensor:
    return op("hop_inner")(x)  # a backend kernel that dispatches another backend op


@zoo_op("calls_new_empty(Tensor x) -> Tensor")
def _calls_new_empty(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(3)  # aten::new_empty, which a policy may deny


@zoo_op("calls_mutating(Tensor x) -> Tensor")
def _calls_mutating(x: torch.Tensor) -> torch.Tensor:
    op("mut_unsqueeze")(x)  # an allowed in-place backend op, dispatched from a functional one
    return x.new_empty(2)


# A second backend namespace, called from tcp_zoo kernels: its read_ctx reads the context (a policy may declare
# only this namespace as reading it), its swappable is re-registered (a policy may not cache it at all).
# Its kernels count in the zoo's counter: the tests read the runs of either namespace's ops by name.
CTX_NS = "tcp_zoo_ctx"
CTX_OPS = testing.CountedOps(CTX_NS, calls=calls)
ctx_lib = CTX_OPS.lib


@CTX_OPS.define("read_ctx(Tensor x) -> Tensor")
def _read_ctx(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape, dtype=AMBIENT["dtype"])


ctx_lib.define("swappable(Tensor x) -> Tensor")


def _register_ctx_swappable(n: int) -> Callable[[], None]:
    def register() -> None:
        kernel = CTX_OPS.counted("swappable", lambda x: x.new_empty(n))
        torch.library.register_fake(f"{CTX_NS}::swappable", kernel, lib=ctx_lib, allow_override=True)

    return register


_register_ctx_swappable(1)()
_SWAP_OTHER = {2: _register_ctx_swappable(2), 4: _register_ctx_swappable(3)}


@zoo_op("calls_ctx(Tensor x) -> Tensor")
def _calls_ctx(x: torch.Tensor) -> torch.Tensor:
    return torch.ops.tcp_zoo_ctx.read_ctx.default(x)


@zoo_op("calls_other(Tensor x) -> Tensor")
def _calls_other(x: torch.Tensor) -> torch.Tensor:
    return torch.ops.tcp_zoo_ctx.swappable.default(x)


# The GraphModules HOP cases call, by case name; rebuilt per run, so no entry of an earlier run (keyed by the
# module's id) applies.
_SUBGRAPHS: dict[str, torch.fx.GraphModule] = {}


def invoke_subgraph(gm: torch.fx.GraphModule, identifier: str, *operands: Any) -> Any:
    return torch.ops.higher_order.invoke_subgraph(gm, identifier, *operands)


def _subgraph(inner: OpOverload, n_operands: int, nested: bool) -> torch.fx.GraphModule:
    graph = torch.fx.Graph()
    xs = [graph.placeholder(f"x{i}") for i in range(n_operands)]
    graph.output((graph.call_function(inner, tuple(xs)),))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    if not nested:
        return gm
    root = torch.nn.Module()
    root.inner = gm
    outer = torch.fx.Graph()
    ys = [outer.placeholder(f"y{i}") for i in range(n_operands)]
    call = outer.call_function(
        torch.ops.higher_order.invoke_subgraph, (outer.get_attr("inner"), "tcp_zoo_nested_inner", *ys)
    )
    outer.output((outer.call_function(operator.getitem, (call, 0)),))
    return torch.fx.GraphModule(root, outer)


def hop_case(
    name: str,
    kind: int,
    inner: str,
    operands: Callable[[Env, int], tuple[Any, ...]],
    doc: str,
    *,
    nested: bool = False,
    reset: Callable[[], None] | None = None,
    **kwargs: Any,
) -> None:
    """A case calling ``invoke_subgraph`` on a graph of one call of ``tcp_zoo::inner`` (itself in a HOP if nested)."""
    def reset_run() -> None:
        AMBIENT["dtype"] = torch.float32
        if reset is not None:
            reset()
        _SUBGRAPHS[name] = _subgraph(op(inner), len(op(inner)._schema.arguments), nested)

    def build(env: Env, i: int) -> Call:
        return Call((_SUBGRAPHS[name], f"tcp_zoo_{name}", *operands(env, i)))

    case(name, kind, build, doc, op=op(inner), target=invoke_subgraph, reset=reset_run, **kwargs)


def _set_ambient(dtype: torch.dtype) -> Callable[[], None]:
    def action() -> None:
        AMBIENT["dtype"] = dtype

    return action


def _set_undeclared(dtype: torch.dtype) -> Callable[[], None]:
    def action() -> None:
        UNDECLARED["dtype"] = dtype

    return action


def _context_policy() -> tcp.CachePolicy:
    return tcp.CachePolicy(namespaces=[NS], context_key=ambient_context)


def _ctx_namespace_policy() -> tcp.CachePolicy:
    return tcp.CachePolicy(namespaces=[NS, CTX_NS], context_key=ambient_context, context_namespaces=[CTX_NS])


def _denying_policy() -> tcp.CachePolicy:
    policy = _context_policy()
    policy.deny(op("hop_inner"))
    return policy


def _deny_only_policy() -> tcp.CachePolicy:
    policy = default_policy()
    policy.deny(op("hop_inner"))
    return policy


def _one(env: Env, i: int) -> tuple[Any, ...]:
    return (t(env.s0),)


_TOGGLE_AMBIENT = {2: _set_ambient(torch.float64), 4: _set_ambient(torch.float32)}

hop_case(
    "hop_context",
    6,
    "hop_inner",
    _one,
    "invoke_subgraph around an op reading the policy's declared context, which changes between calls",
    policy=_context_policy,
    steps="FSFSFS",
    actions=_TOGGLE_AMBIENT,
)
hop_case(
    "hop_denied",
    6,
    "hop_inner",
    _one,
    "invoke_subgraph around an op the policy denies: its kernel must run on every call",
    policy=_denying_policy,
    runs_every_call=True,
)
hop_case(
    "hop_denied_no_context",
    6,
    "hop_inner",
    _one,
    "invoke_subgraph around a denied op, under a policy without a context",
    policy=_deny_only_policy,
    runs_every_call=True,
)
hop_case(
    "hop_nested_denied",
    6,
    "hop_inner",
    _one,
    "invoke_subgraph inside invoke_subgraph around a denied op: its kernel must run on every call",
    nested=True,
    policy=_deny_only_policy,
    runs_every_call=True,
)
hop_case(
    "hop_nested_context",
    6,
    "hop_inner",
    _one,
    "invoke_subgraph inside invoke_subgraph around an op reading the declared context",
    nested=True,
    policy=_context_policy,
    steps="FSFSFS",
    actions=_TOGGLE_AMBIENT,
)
hop_case(
    "hop_swap",
    6,
    "swap_fake",
    _one,
    "invoke_subgraph around an op whose fake kernel is replaced between calls",
    steps="FSFSFS",
    actions={2: _register("swap_fake", 2), 4: _register("swap_fake", 3)},
    reset=_register("swap_fake", 1),
)
hop_case(
    "hop_alias",
    6,
    "overlap_raises",
    lambda env, i: _views(overlapping=True)(env, i).args,
    "invoke_subgraph around an op that raises when its operands overlap",
    steps="FFSFF",
)
hop_case(
    "hop_same_operand",
    6,
    "same_twice",
    lambda env, i: _pair_or_twice(env, i).args,
    "invoke_subgraph given one operand twice, around an op that raises on it",
    steps="FFSFF",
)
hop_case(
    "hop_unregistered_swap",
    6,
    "calls_other",
    _one,
    "invoke_subgraph around an op calling an uncached op whose fake kernel is replaced between calls",
    steps="FSFSFS",
    actions=_SWAP_OTHER,
    reset=_register_ctx_swappable(1),
)
hop_case("hop_mutates", 6, "func_unsqueeze", _one, "invoke_subgraph around a kernel that unsqueezes its input in place")
hop_case("hop_offset", 6, "offset_out", _one, "invoke_subgraph around a kernel returning a fresh output at an offset")
case(
    "nested_denied",
    6,
    x1,
    "a backend kernel dispatching a denied backend op: the denied kernel must run on every call",
    op=op("hop_inner"),
    target=op("calls_inner"),
    policy=_deny_only_policy,
    runs_every_call=True,
)
def _deny_new_empty() -> tcp.CachePolicy:
    policy = default_policy()
    policy.deny(torch.ops.aten.new_empty.default)
    return policy


case(
    "nested_denied_aten",
    6,
    x1,
    "a backend kernel dispatching an aten op the policy denies: that op must run on every call",
    op=torch.ops.aten.new_empty.default,
    target=op("calls_new_empty"),
    policy=_deny_new_empty,
    runs_every_call=True,
)
case(
    "nested_mutation",
    6,
    x1,
    "a functional backend kernel dispatching an allowed in-place backend op on its input",
    policy=_allow("mut_unsqueeze"),
    op=op("calls_mutating"),
)
def _ctx_unregistered_policy() -> tcp.CachePolicy:
    return tcp.CachePolicy(namespaces=[NS], context_key=ambient_context, context_namespaces=[CTX_NS])


case(
    "nested_context_unregistered",
    6,
    x1,
    "a backend kernel dispatching an op that reads the context, of a namespace the policy does not cache",
    op=op("calls_ctx"),
    policy=_ctx_unregistered_policy,
    steps="FSFSFS",
    actions=_TOGGLE_AMBIENT,
    reset=_set_ambient(torch.float32),
)
case(
    "nested_unregistered_swap",
    6,
    x1,
    "a backend kernel dispatching an op the policy does not cache, whose fake kernel is replaced between calls",
    op=op("calls_other"),
    steps="FSFSFS",
    actions=_SWAP_OTHER,
    reset=_register_ctx_swappable(1),
)
case(
    "nested_context",
    6,
    x1,
    "a backend kernel dispatching an op of the one namespace declared to read the context",
    op=op("calls_ctx"),
    policy=_ctx_namespace_policy,
    steps="FSFSFS",
    actions=_TOGGLE_AMBIENT,
    reset=_set_ambient(torch.float32),
)


# ------------------------------------------------------------- 7. ambient state


@zoo_op("ambient_declared(Tensor x) -> Tensor")
def _ambient_declared(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape, dtype=AMBIENT["dtype"])


@zoo_op("ambient_undeclared(Tensor x) -> Tensor")
def _ambient_undeclared(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape, dtype=UNDECLARED["dtype"])


case(
    "ambient_declared",
    7,
    x1,
    "reads ambient state the policy's context_key declares",
    policy=_context_policy,
    steps="FSFSFS",
    actions={2: _set_ambient(torch.float64), 4: _set_ambient(torch.float32)},
    reset=_set_ambient(torch.float32),
)
case(
    "ambient_undeclared",
    7,
    x1,
    "reads ambient state no context_key declares",
    steps="FSFSFS",
    actions={2: _set_undeclared(torch.float64), 4: _set_undeclared(torch.float32)},
    reset=_set_undeclared(torch.float32),
    limit="a kernel reading state the policy does not declare is the user's responsibility (docs: context_key)",
)


def _lowering_context() -> object:
    """A hook defined only inside its backend's lowering, as ExecuTorch's get_context_spec() outside a TOSA one."""
    raise RuntimeError("no TosaLoweringContext is open")


def _outside_lowering_policy() -> tcp.CachePolicy:
    return tcp.CachePolicy(namespaces=[NS], context_key=_lowering_context, context_namespaces=[CTX_NS])


def _never_repeating(fresh: Callable[[], object]) -> Callable[[], tcp.CachePolicy]:
    def policy() -> tcp.CachePolicy:
        return tcp.CachePolicy(namespaces=[NS], context_key=lambda: (AMBIENT["dtype"], fresh()))

    return policy


case(
    "context_never_repeats",
    7,
    x1,
    "reads ambient state declared by a context_key() that returns a new object() (equal only to itself) each time",
    op=op("ambient_declared"),
    policy=_never_repeating(object),
    steps="FSFSFS",
    actions={2: _set_ambient(torch.float64), 4: _set_ambient(torch.float32)},
    reset=_set_ambient(torch.float32),
)
case(
    "context_nan",
    7,
    x1,
    "reads ambient state declared by a context_key() that returns a new NaN each time",
    op=op("ambient_declared"),
    policy=_never_repeating(lambda: -math.nan),
    steps="FSFSFS",
    actions={2: _set_ambient(torch.float64), 4: _set_ambient(torch.float32)},
    reset=_set_ambient(torch.float32),
)
hop_case(
    "hop_outside_context_namespaces",
    7,
    "offset_out",
    _one,
    "invoke_subgraph around ops outside context_namespaces, under a context_key() that raises outside its lowering",
    policy=_outside_lowering_policy,
)
case(
    "nested_outside_context_namespaces",
    7,
    x1,
    "a backend kernel dispatching an op outside context_namespaces, under a context_key() that raises",
    op=op("calls_inner"),
    policy=_outside_lowering_policy,
)


# -------------------------------------------------------------------- 8. others


@zoo_op("alias_outputs(Tensor x) -> (Tensor, Tensor)")
def _alias_outputs(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    out = x.new_empty(x.shape)
    return out, out.view(-1)


@zoo_op("view_offset(Tensor(a) x) -> Tensor(a)")
def _view_offset(x: torch.Tensor) -> torch.Tensor:
    return x.view(-1)[1:]


@zoo_op("view_dtype(Tensor(a) x) -> Tensor(a)")
def _view_dtype(x: torch.Tensor) -> torch.Tensor:
    return x.view(torch.int32)


@zoo_op("view_fresh(Tensor(a) x) -> Tensor(a)")
def _view_fresh(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape)  # the schema promises a view; the kernel returns fresh storage


@zoo_op("return_input(Tensor x) -> Tensor")
def _return_input(x: torch.Tensor) -> torch.Tensor:
    return x


@zoo_op("return_input_view(Tensor(a) x) -> Tensor(a)")
def _return_input_view(x: torch.Tensor) -> torch.Tensor:
    return x


@zoo_op("tuple_none(Tensor x, bool second) -> (Tensor, Tensor)")
def _tuple_none(x: torch.Tensor, second: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    return x.new_empty(2), x.new_empty(3) if second else None


@zoo_op("unbacked_int(Tensor x) -> SymInt")
def _unbacked_int(x: torch.Tensor) -> Any:
    return torch.library.get_ctx().new_dynamic_size()


@zoo_op("backed_int(Tensor x) -> SymInt")
def _backed_int(x: torch.Tensor) -> Any:
    return x.shape[0]


@zoo_op("sym_expr_int(Tensor x) -> SymInt")
def _sym_expr_int(x: torch.Tensor) -> Any:
    return x.shape[0] * 2 + 1  # a new SymNode on every call, with an equal expression


@zoo_op("unbacked_tensor(Tensor x) -> Tensor")
def _unbacked_tensor(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(torch.library.get_ctx().new_dynamic_size())


@zoo_op("sym_offset_out(Tensor x) -> Tensor")
def _sym_offset_out(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape[0] + 8)[8:]


@zoo_op("sym_tensor_out(Tensor x) -> Tensor")
def _sym_tensor_out(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape[0] * 2, x.shape[1])


@zoo_op("raises_some(Tensor x, int n) -> Tensor")
def _raises_some(x: torch.Tensor, n: int) -> torch.Tensor:
    if n < 0:
        raise ValueError(f"tcp_zoo::raises_some: n must be >= 0, got {n}")
    return x.new_empty(n)


_NTH = {"runs": 0}


@zoo_op("nth_call(Tensor x) -> Tensor")
def _nth_call(x: torch.Tensor) -> torch.Tensor:
    _NTH["runs"] += 1  # the cached and the reference world's runs: the entry is made on the third
    return x.new_empty(2, dtype=torch.float64 if _NTH["runs"] >= 5 else torch.float32)


def _reset_nth() -> None:
    _NTH["runs"] = 0


@zoo_op("kwarg_only(Tensor x, *, int n=2, ScalarType? dtype=None) -> Tensor")
def _kwarg_only(x: torch.Tensor, *, n: int = 2, dtype: torch.dtype | None = None) -> torch.Tensor:
    return x.new_empty(n, dtype=dtype)


@zoo_op("defaults(Tensor x, int n=3, float s=1.0) -> Tensor")
def _defaults(x: torch.Tensor, n: int = 3, s: float = 1.0) -> torch.Tensor:
    return x.new_empty(n, dtype=torch.float32 if s > 0 else torch.float64)


@zoo_op("int_list(Tensor x, int[] sizes) -> Tensor")
def _int_list(x: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    return x.new_empty(sizes)


@zoo_op("typed_args(Tensor x, ScalarType dtype, Device device, Layout layout, MemoryFormat memory_format) -> Tensor")
def _typed_args(
    x: torch.Tensor, dtype: torch.dtype, device: torch.device, layout: torch.layout, memory_format: torch.memory_format
) -> torch.Tensor:
    return torch.empty(2, 3, 4, 5, dtype=dtype, device=device, layout=layout, memory_format=memory_format)


@zoo_op("mut_none(Tensor(a!) x) -> ()")
def _mut_none(x: torch.Tensor) -> None:
    if x.dim() != 1:
        raise ValueError("tcp_zoo::mut_none: expected a 1-D tensor")


@zoo_op("multi_view(Tensor(a) x, Tensor y) -> Tensor(a)")
def _multi_view(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x.view(-1)


@zoo_op("out_kwarg(Tensor x, *, Tensor(a!) out) -> Tensor(a!)")
def _out_kwarg(x: torch.Tensor, *, out: torch.Tensor) -> torch.Tensor:
    out.resize_(x.shape)
    return out


@zoo_op("grad_out(Tensor x) -> Tensor")
def _grad_out(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(2).requires_grad_()


@zoo_op("conj_neg_out(Tensor x) -> (Tensor, Tensor)")
def _conj_neg_out(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x.new_empty(2, dtype=torch.cfloat).conj(), x.new_empty(3, dtype=torch.cfloat)._neg_view()


@zoo_op("default_dtype_out(Tensor x) -> Tensor")
def _default_dtype_out(x: torch.Tensor) -> torch.Tensor:
    return torch.empty(3)


@zoo_op("optional_tensor(Tensor x, Tensor? y) -> Tensor")
def _optional_tensor(x: torch.Tensor, y: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty(1 if y is None else 2)


@zoo_op("control_simple(Tensor x, int n) -> Tensor")
def _control_simple(x: torch.Tensor, n: int) -> torch.Tensor:
    return x.new_empty(x.shape[0], n)


@zoo_op("control_pair(Tensor x) -> (Tensor, Tensor)")
def _control_pair(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x.new_empty(x.shape), x.new_empty(x.shape[0], dtype=torch.int64)


@zoo_op("control_view(Tensor(a) x) -> Tensor(a)")
def _control_view(x: torch.Tensor) -> torch.Tensor:
    return x.view(-1)


@torch.library.custom_op(f"{NS}::control_custom_op", mutates_args=())
def control_custom_op(x: torch.Tensor, n: int) -> torch.Tensor:
    return x.new_empty(n)


control_custom_op.register_fake(ZOO_OPS.counted("control_custom_op", lambda x, n: x.new_empty(n)))


@zoo_op("same_output_twice(Tensor x) -> (Tensor, Tensor)")
def _same_output_twice(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    out = x.new_empty(2)
    return out, out


@zoo_op("kwarg_view_out(Tensor x, *, Tensor y) -> Tensor")
def _kwarg_view_out(x: torch.Tensor, *, y: torch.Tensor) -> torch.Tensor:
    return y.view(-1)  # aliases a kwarg-only input, undeclared


@zoo_op("list_out(Tensor x) -> Tensor[]")
def _list_out(x: torch.Tensor) -> list[torch.Tensor]:
    return [x.new_empty(2), x.new_empty(3)]


@zoo_op("int_tuple_out(Tensor x) -> (Tensor, int)")
def _int_tuple_out(x: torch.Tensor) -> tuple[torch.Tensor, Any]:
    return x.new_empty(2), x.shape[0]


@zoo_op("mut_returns_view(Tensor(a!) x) -> Tensor(a!)")
def _mut_returns_view(x: torch.Tensor) -> torch.Tensor:
    return x.view(-1)  # an in-place schema; the kernel returns a new view rather than x itself


@zoo_op("maybe_view(Tensor(a) x) -> Tensor(a)")
def _maybe_view(x: torch.Tensor) -> torch.Tensor:
    # reshape's contract: a view when the input's strides allow one, else fresh storage.
    return x.view(-1) if x.is_contiguous() else x.new_empty(x.numel())


# A FakeTensor of another mode, made at import: a kernel returning it answers with the same object every time.
_OTHER_MODE = torch._subclasses.fake_tensor.FakeTensorMode()
_OTHER_MODE_TENSOR = torch._subclasses.fake_tensor.FakeTensor(_OTHER_MODE, torch.empty(2, device="meta"), torch.device("cpu"))


@zoo_op("other_mode_out(Tensor x) -> Tensor")
def _other_mode_out(x: torch.Tensor) -> torch.Tensor:
    return _OTHER_MODE_TENSOR


@zoo_op("tags_output(Tensor x) -> Tensor")
def _tags_output(x: torch.Tensor) -> torch.Tensor:
    out = x.new_empty(2)
    out.zoo_tag = "made by tcp_zoo::tags_output"  # type: ignore[attr-defined]  (a pass reads it later)
    return out


@zoo_op("nonzero_inside(Tensor x) -> Tensor")
def _nonzero_inside(x: torch.Tensor) -> torch.Tensor:
    x.nonzero()  # memoizes an unbacked size on x, which later nonzero calls on x reuse
    return x.new_empty(2)


_MEMO: dict[object, torch.Tensor] = {}


@zoo_op("memo_out(Tensor x) -> Tensor")
def _memo_out(x: torch.Tensor) -> torch.Tensor:
    # Returns the tensor it made on its first run for this shape: stateful across calls.
    key = (tuple(x.shape), x.fake_mode if isinstance(x, torch._subclasses.FakeTensor) else None)
    if key not in _MEMO:
        _MEMO[key] = x.new_empty(2)
    return _MEMO[key]


@zoo_op("unbacked_input(Tensor x) -> Tensor")
def _unbacked_input(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape[0] + 1)


def _set_default_dtype(dtype: torch.dtype) -> Callable[[], None]:
    def action() -> None:
        torch.set_default_dtype(dtype)

    return action


case("alias_outputs", 8, x1, "two outputs, the second a view of the first")
case("view_offset", 8, x2, "a declared view at a storage offset")
case("view_of_offset_input", 8, lambda env, i: Call((t(3, 4)[1:],)), "a declared view of an input at a storage offset", op=op("view_offset"))
case("view_dtype", 8, x2, "a declared view reinterpreting the input's dtype")
case("view_fresh", 8, x1, "a declared view whose kernel returns fresh storage")
case("return_input", 8, x1, "a functional schema whose kernel returns its input")
case("return_input_view", 8, x1, "a declared view whose kernel returns its input object")
case("tuple_none", 8, lambda env, i: Call((t(3), i % 2 == 1)), "returns (Tensor, None) or (Tensor, Tensor)", steps="FFSFF")
case("unbacked_int", 8, x2, "returns a fresh unbacked SymInt", symbolic=True)
case("backed_int", 8, x2, "returns its input's symbolic size", symbolic=True)
case("sym_expr_int", 8, x2, "returns a new SymInt expression of its input's size", symbolic=True)
case("unbacked_tensor", 8, x2, "returns a tensor of a fresh unbacked size", symbolic=True)
case("sym_offset_out", 8, x2, "a fresh output at an offset, sized by a symbol", symbolic=True)
case("sym_tensor_out", 8, x2, "a fresh output sized by an expression of the input's symbols", symbolic=True)
case("raises_some", 8, lambda env, i: Call((t(3), [2, -1, 2, -1, 4][i])), "raises for negative n", steps="FSFFF")
case("nth_call", 8, x1, "returns float64 from its fifth run on", reset=_reset_nth, limit="a stateful kernel may legitimately be skipped by a hit")
case(
    "kwarg_only",
    8,
    lambda env, i: [Call((t(3),)), Call((t(3),), {"n": 4}), Call((t(3),), {"dtype": torch.float16}), Call((t(3),), {"n": 2}), Call((t(3),))][i],
    "kwarg-only arguments with defaults, passed or not",
    steps="FFFFF",
)
case(
    "defaults",
    8,
    lambda env, i: [Call((t(3),)), Call((t(3), 3)), Call((t(3), 3, -1.0)), Call((t(3), 4)), Call((t(3),), {"s": -1.0})][i],
    "positional arguments with defaults, passed or not",
    steps="FFFFF",
)
case("int_list", 8, lambda env, i: Call((t(3), [[2, 3], [3, 2], [2, 3], [6], [2, 3]][i])), "sizes from an int[]", steps="FFFFF")
case(
    "typed_args",
    8,
    lambda env, i: Call((t(3), [torch.float16, torch.float32][i % 2], torch.device("cpu"), torch.strided, [torch.channels_last, torch.contiguous_format][i % 3 == 0])),
    "dtype, device, layout and memory_format arguments",
    steps="FFFFF",
)
case("mut_none", 8, lambda env, i: Call((t(3) if i % 2 == 0 else t(3, 1),)), "a Tensor(a!) -> () op whose kernel validates its input", steps="FFFSF")
case(
    "mut_none_allowed",
    8,
    lambda env, i: Call((t(3) if i % 2 == 0 else t(3, 1),)),
    "the same op, allowed by register_op",
    op=op("mut_none"),
    policy=_allow("mut_none"),
    steps="FFFSF",
)
case("multi_view", 8, lambda env, i: Call((t(2, 3), t(4))), "a view schema with two tensor arguments")
case(
    "out_kwarg",
    8,
    lambda env, i: Call((t(2, 3),), {"out": t(0)}),
    "an allowed out= op whose kernel resizes the kwarg-only out tensor",
    policy=_allow("out_kwarg"),
)
case("same_output_twice", 8, x1, "returns one fresh tensor object twice")
case("kwarg_view_out", 8, lambda env, i: Call((t(3),), {"y": t(2, 3)}), "returns a view of a kwarg-only input, undeclared")
case("mut_returns_view", 8, x2, "an allowed Tensor(a!) op whose kernel returns a view of x, not x", policy=_allow("mut_returns_view"))
case("maybe_view", 8, lambda env, i: Call((t(4, 6) if i % 2 == 0 else t(6, 4).t(),)), "a declared view that is fresh storage for non-contiguous inputs", steps="FFSFF")
case("other_mode_out", 8, x1, "returns a FakeTensor of another mode, the same object on every call")
case("tags_output", 8, x1, "attaches a Python attribute to its output")
case("nonzero_inside", 8, x1, "runs nonzero on its input, which memoizes an unbacked size on the input", symbolic=True)
case("list_out", 8, x1, "returns a Tensor[]")
case("int_tuple_out", 8, x2, "returns (Tensor, int)")
case("int_tuple_out_symbolic", 8, x2, "returns (Tensor, SymInt) on symbolic inputs", op=op("int_tuple_out"), symbolic=True)
case("memo_out", 8, x1, "returns the tensor it made on an earlier run", reset=_MEMO.clear, limit="a kernel that keeps and returns a tensor across calls is stateful")
case("unbacked_input", 8, lambda env, i: Call((t(env.u0),)), "a kernel on an input of unbacked size", symbolic=True)
case("grad_out", 8, x1, "a fresh output that requires grad")
case("conj_neg_out", 8, x1, "fresh outputs with the conj and neg bits set")
case(
    "default_dtype_out",
    8,
    x1,
    "a factory output following the default dtype",
    steps="FSFSF",
    actions={2: _set_default_dtype(torch.float64), 4: _set_default_dtype(torch.float32)},
    reset=_set_default_dtype(torch.float32),
)
case("optional_tensor", 8, lambda env, i: Call((t(3), None if i % 2 else t(3))), "answers by whether Tensor? is None", steps="FFFSF")
# Controls: 6 calls, 4 hits (a backend key's first sight and its miss make the entry: Note [An entry on a key's
# second sight]).
case("control_simple", 8, lambda env, i: Call((t(env.s0, env.s1), 4)), "a plain functional kernel (control: must hit)", steps="FSFSFS", min_hits=4)
case("control_pair", 8, x2, "two fresh outputs (control: must hit)", steps="FSFSFS", min_hits=4)
case("control_view", 8, x2, "a declared view of a single input (control: must hit)", steps="FSFSFS", min_hits=4)
# Symbolic: 3 of 7. The first input comes from a miss of aten::empty, later ones from its hits, whose storage
# nbytes torch writes as an equal but different expression, so the key (which holds it) differs once: the first two
# calls make one key's entry, the next two another's.
case(
    "control_symbolic",
    8,
    lambda env, i: Call((t(env.s0, env.s1), 4)),
    "a plain kernel on symbolic inputs (control: must hit)",
    op=op("control_simple"),
    steps="FSFSFSF",
    symbolic=True,
    min_hits=3,
)
case("control_custom_op", 8, lambda env, i: Call((t(3), 4)), "a torch.library.custom_op (control: must hit)", op=control_custom_op._opoverload, steps="FSFSFS", min_hits=4)

# ------------------------------------------------- second adversary: what neither key nor verification sees
# Each case below is a hole found against the design (Note [Verify every entry on the miss that creates it],
# Note [A key that sees what a fake kernel can see], Note [Entries cover inner ops], Note [Entries belong to a
# fake kernel]): a kernel observing or producing something outside those notes.


@zoo_op("grad_attr_out(Tensor x) -> Tensor")
def _grad_attr_out(x: torch.Tensor) -> torch.Tensor:
    out = x.new_empty(2)
    out.grad = x.new_empty(2)  # .grad lives in autograd meta, not in __dict__ nor in the metadata
    return out


@zoo_op("grad_attr_in(Tensor x) -> Tensor")
def _grad_attr_in(x: torch.Tensor) -> torch.Tensor:
    x.grad = x.new_empty(x.shape)  # a side effect on the input that a hit skips
    return x.new_empty(2)


@zoo_op("leaf_input(Tensor x) -> Tensor")
def _leaf_input(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(1 if x.is_leaf else 2)  # equal metadata, but one input has a grad_fn


@zoo_op("base_out(Tensor(a) x) -> Tensor(a)")
def _base_out(x: torch.Tensor) -> torch.Tensor:
    base = x._base  # a declared alias: the input's base object itself, not a new view
    assert base is not None, "tcp_zoo::base_out: expected a view"
    return base


def _leaf_or_not(env: Env, i: int) -> Call:
    leaf = t(3, requires_grad=True)
    return Call((leaf if i % 2 == 0 else leaf * 2,))  # both require grad, shape 3, contiguous


case("grad_attr_out", 8, x1, "sets .grad on its fresh output")
case("grad_attr_in", 4, x1, "sets .grad on its input (a side effect outside the input's metadata)")
case("leaf_input", 3, _leaf_or_not, "answers by whether its input is a leaf (has no grad_fn)", steps="FFSFF")
case("base_out", 8, lambda env, i: Call((t(2, 4)[0],)), "a declared view returning its input's _base object", steps="FSFSF")


# Kernels that fake dispatch runs ahead of the fake impl, registered from Python where neither the fake-impl
# holder nor the C++ kernel watch sees them: OpOverload.py_impl(CompositeImplicitAutograd) (FakeTensorMode's
# decompose() prefers py_kernels) and torch._decomp's decomposition_table (consulted for symbolic inputs).
lib.define("swap_py_cia(Tensor x) -> Tensor")
lib.define("swap_decomp(Tensor x) -> Tensor")
torch.library.register_fake(f"{NS}::swap_py_cia", _sized("swap_py_cia", 1), lib=lib)
torch.library.register_fake(f"{NS}::swap_decomp", _sized("swap_decomp", 1), lib=lib)


def _py_cia(n: int | None) -> Callable[[], None]:
    def register() -> None:
        func = op("swap_py_cia")
        func.py_kernels.pop(torch._C.DispatchKey.CompositeImplicitAutograd, None)
        func._dispatch_cache.clear()
        if n is not None:
            func.py_impl(torch._C.DispatchKey.CompositeImplicitAutograd)(_sized("swap_py_cia", n))

    return register


def _decomp(n: int | None) -> Callable[[], None]:
    def register() -> None:
        from torch._decomp import decomposition_table, register_decomposition

        decomposition_table.pop(op("swap_decomp"), None)
        if n is not None:
            register_decomposition(op("swap_decomp"))(_sized("swap_decomp", n))

    return register


case(
    "swap_py_cia",
    5,
    x1,
    "its kernel is replaced after two calls with OpOverload.py_impl(DispatchKey.CompositeImplicitAutograd)",
    steps="FSFSFS",
    actions={2: _py_cia(2), 4: _py_cia(3)},
    reset=_py_cia(None),
)
case(
    "swap_decomp",
    5,
    x2,
    "on symbolic inputs, a torch._decomp.register_decomposition for it appears after two calls",
    steps="FSFSFS",
    symbolic=True,
    actions={2: _decomp(2), 4: _decomp(3)},
    reset=_decomp(None),
)


# invoke_subgraph under a stock-equivalent policy reads and writes torch's own storage: an entry a stock mode
# wrote there, around a backend kernel since replaced, has no dependencies to check.
def _prime_with_stock_mode(name: str, n: int) -> Callable[[], None]:
    def action() -> None:
        with torch._subclasses.fake_tensor.FakeTensorMode():
            invoke_subgraph(_SUBGRAPHS[name], f"tcp_zoo_{name}", t(5))
        _register("swap_fake", n)()

    return action


hop_case(
    "hop_stock_entry",
    6,
    "swap_fake",
    _one,
    "invoke_subgraph under CachePolicy() after a stock mode cached it around a kernel replaced since",
    policy=tcp.CachePolicy,
    steps="FSFSFS",
    actions={0: _prime_with_stock_mode("hop_stock_entry", 2), 4: _register("swap_fake", 3)},
    reset=_register("swap_fake", 1),
)


# A backend op whose fake rule is a FakeTensorMode py_impl: the mode's dispatch() forwards to the rule without
# passing _cached_dispatch_impl, so an enclosing miss never records it (its denial, its context). Stock consults an
# OpOverload's py_impl rules only under the Python dispatcher (as export and make_fx run), so the kernel calling it
# turns that on.
ctx_lib.define("py_rule(Tensor x) -> Tensor")


def _py_rule(mode: Any, x: torch.Tensor) -> torch.Tensor:
    with mode:
        return x.new_empty(x.shape, dtype=AMBIENT["dtype"])


torch.ops.tcp_zoo_ctx.py_rule.default.py_impl(torch._subclasses.fake_tensor.FakeTensorMode)(
    CTX_OPS.counted("py_rule", _py_rule)
)


@zoo_op("calls_py_rule(Tensor x) -> Tensor")
def _calls_py_rule(x: torch.Tensor) -> torch.Tensor:
    with enable_python_dispatcher():
        return torch.ops.tcp_zoo_ctx.py_rule.default(x)


def _deny_py_rule() -> tcp.CachePolicy:
    policy = default_policy()
    policy.deny(torch.ops.tcp_zoo_ctx.py_rule.default)
    return policy


case(
    "nested_py_rule_denied",
    6,
    x1,
    "a backend kernel dispatching a denied op that has a FakeTensorMode py_impl rule: the rule must run every call",
    op=torch.ops.tcp_zoo_ctx.py_rule.default,
    target=op("calls_py_rule"),
    policy=_deny_py_rule,
    runs_every_call=True,
)
case(
    "nested_py_rule_context",
    6,
    x1,
    "a backend kernel dispatching an op with a FakeTensorMode py_impl rule, of the namespace declared to read the context",
    op=op("calls_py_rule"),
    policy=_ctx_unregistered_policy,
    steps="FSFSFS",
    actions=_TOGGLE_AMBIENT,
    reset=_set_ambient(torch.float32),
)


# What the ShapeEnv knows: a kernel asking without guarding (statically_known_true, guard_or_false, the
# size-oblivious checks aten's own meta kernels use) answers differently once the ShapeEnv has learned a fact,
# while the key (symbols, hints) stays the same.
_ENVS: list[Env] = []


@zoo_op("sym_known(Tensor x) -> Tensor")
def _sym_known(x: torch.Tensor) -> torch.Tensor:
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    return x.new_empty(1 if statically_known_true(x.shape[0] == 5) else 2)


def _remember_env(env: Env, i: int) -> Call:
    _ENVS[:] = [env]
    return x2(env, i)


def _learn_s0() -> None:
    torch._check(_ENVS[0].s0 == 5)  # a user's check (or a guard elsewhere) teaches the ShapeEnv s0 == 5


case(
    "sym_known",
    8,
    _remember_env,
    "asks statically_known_true(s0 == 5), which turns true after the ShapeEnv learns it between calls on one input",
    symbolic=True,
    steps="FSSFS",
    actions={2: _learn_s0},
    reset=_ENVS.clear,
)


# Whether the ShapeEnv records guards is part of what it knows: a probing pass (inductor's error_on_new_guards, an
# analysis under suppress_guards) makes entries that must not serve the calls after it.
_SCOPE: list[str | None] = [None]


@zoo_op("branches(Tensor x) -> Tensor")
def _branches(x: torch.Tensor) -> torch.Tensor:
    try:
        big = bool(x.shape[0] > 4)  # a guard on its own symbol; raises where the ShapeEnv forbids new guards
    except Exception:
        return x.new_empty(1)
    return x.new_empty(x.shape[0] + 1 if big else 1)


def _in_scope(x: torch.Tensor) -> torch.Tensor:
    scope = _SCOPE[0]
    shape_env = x.fake_mode.shape_env  # type: ignore[attr-defined]
    with contextlib.nullcontext() if scope is None or shape_env is None else getattr(shape_env, scope)():
        return op("branches")(x)


def _scope(name: str | None) -> Callable[[], None]:
    def set_scope() -> None:
        _SCOPE[0] = name

    return set_scope


case(
    "branches_in_guard_scope",
    8,
    x1,
    "branches on its symbolic size, falling back where the ShapeEnv raises on a new guard; called in such a scope, "
    "then outside it",
    op=op("branches"),
    target=_in_scope,
    symbolic=True,
    steps="FSSSF",
    actions={0: _scope("error_on_new_guards"), 2: _scope(None)},
    reset=_scope(None),
)


# A kernel may evaluate another op outside the mode (meta tensors, a scratch mode): not an inner dispatch of the
# entry, so re-registering that op's kernel is not seen (docs/guide.md); crosscheck catches the stale hit.
@zoo_op("evaluated_inside(Tensor x) -> Tensor")
def _evaluated_inside(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(2)


@zoo_op("evaluates_outside(Tensor x) -> Tensor")
def _evaluates_outside(x: torch.Tensor) -> torch.Tensor:
    with torch._subclasses.fake_tensor.unset_fake_temporarily():
        n = op("evaluated_inside")(torch.empty(3, device="meta")).shape[0]
    return x.new_empty(n)


def _register_inside(n: int) -> Callable[[], None]:
    def register() -> None:
        torch.library.register_fake(
            f"{NS}::evaluated_inside", lambda x: x.new_empty(n), lib=lib, allow_override=True
        )

    return register


case(
    "evaluates_outside",
    6,
    x1,
    "evaluates another op on meta tensors outside the mode; that op's kernel is re-registered between calls",
    steps="FSFS",
    actions={2: _register_inside(5)},
    reset=_register_inside(2),
    limit="an op a kernel evaluates outside the mode is not a tracked dependency (docs/guide.md)",
    limit_crosscheck=(False,),
    caught_by_crosscheck=True,
)


# ------------------------- 9. what stock's dispatch consults, and what a kernel can touch (issue 19)
# Note [The kernel in effect]: rules for the FakeTensorMode class, the Python dispatcher's choice of py_impl
# kernels, register_op_impl implementations; and side effects a hit would skip (version counters, hooks, the
# ShapeEnv), and arguments the key holds by identity.


@zoo_op("bump_input_version(Tensor x) -> Tensor")
def _bump_input_version(x: torch.Tensor) -> torch.Tensor:
    torch.autograd.graph.increment_version(x)
    return x.new_empty(x.shape)


@zoo_op("bump_output_version(Tensor x) -> Tensor")
def _bump_output_version(x: torch.Tensor) -> torch.Tensor:
    out = x.new_empty(x.shape)
    torch.autograd.graph.increment_version(out)
    return out


@zoo_op("hook_input(Tensor x) -> Tensor")
def _hook_input(x: torch.Tensor) -> torch.Tensor:
    if x.requires_grad:
        x.register_hook(lambda grad: grad)
    return x.new_empty(x.shape)


@zoo_op("discarded_symbol(Tensor x) -> Tensor")
def _discarded_symbol(x: torch.Tensor) -> torch.Tensor:
    torch.library.get_ctx().new_dynamic_size()
    return x.new_empty(x.shape)


@zoo_op("checks_size(Tensor x, SymInt n) -> Tensor")
def _checks_size(x: torch.Tensor, n: Any) -> torch.Tensor:
    torch._check(n >= 2)  # on a backed symbol: a fact for the ShapeEnv
    return x.new_empty(n)


@zoo_op("generator_arg(Tensor x, Generator? g) -> Tensor")
def _generator_arg(x: torch.Tensor, g: torch.Generator | None) -> torch.Tensor:
    return x.new_empty(1 + (0 if g is None else g.initial_seed() % 3))


_GENERATOR = torch.Generator()


def _reseed(seed: int) -> Callable[[], None]:
    return lambda: _GENERATOR.manual_seed(seed)


@zoo_op("ruled_later(Tensor x) -> Tensor")
def _ruled_later(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape)


_RULE_LIBS: list[torch.library.Library] = []


def _add_rule() -> None:
    rule_lib = torch.library.Library(NS, "FRAGMENT")
    _RULE_LIBS.append(rule_lib)
    torch.library.register_torch_dispatch(
        op("ruled_later"),
        torch._subclasses.fake_tensor.FakeTensorMode,
        lambda mode, func, types, args, kwargs: args[0].new_empty(3, dtype=torch.int8),
        lib=rule_lib,
    )


def _drop_rules() -> None:
    while _RULE_LIBS:
        _RULE_LIBS.pop()._destroy()


@zoo_op("calls_ruled(Tensor x) -> Tensor")
def _calls_ruled(x: torch.Tensor) -> torch.Tensor:
    return torch.ops.tcp_zoo.ruled_later(x).new_empty(2, 2)


lib.define("py_meta(Tensor x) -> Tensor")
lib.impl("py_meta", ZOO_OPS.counted("py_meta", lambda x: x.new_empty(x.shape)), "Meta")
op("py_meta").py_impl(torch._C.DispatchKey.Meta)(
    ZOO_OPS.counted("py_meta", lambda x: x.new_empty(x.shape, dtype=torch.float64))
)
_DISPATCHER = {"on": False}


def _python_dispatcher(on: bool) -> Callable[[], None]:
    return lambda: _DISPATCHER.update(on=on)


def _call_py_meta(x: torch.Tensor) -> torch.Tensor:
    if _DISPATCHER["on"]:
        with enable_python_dispatcher():
            return op("py_meta")(x)
    return op("py_meta")(x)


case("bump_input_version", 4, x1, "moves its input's version counter (torch.autograd.graph.increment_version)")
case("bump_output_version", 1, x1, "moves its fresh output's version counter")
case(
    "hook_input",
    4,
    lambda env, i: Call((t(env.s0, requires_grad=True),)),
    "registers a backward hook on its input",
)
case("discarded_symbol", 8, x1, "creates an unbacked symbol from static inputs and drops it", shape_env=True)
case(
    "discarded_symbol_symbolic",
    8,
    x1,
    "creates an unbacked symbol and drops it, its inputs holding symbols",
    op=op("discarded_symbol"),
    symbolic=True,
)


@zoo_op("appends_to_attribute(Tensor x) -> Tensor")
def _appends_to_attribute(x: torch.Tensor) -> torch.Tensor:
    log = getattr(x, "log", None)
    if log is not None:
        log.append(len(log))
    return x.new_empty(x.shape)


def _with_log(env: Env, i: int) -> Call:
    x = t(env.s0)
    x.log = []  # type: ignore[attr-defined]
    return Call((x,))


case(
    "appends_to_attribute",
    4,
    _with_log,
    "appends to a list kept as an attribute of its input",
    steps="FSSFS",
)
case(
    "checks_size",
    8,
    lambda env, i: Call((t(2), env.s0)),
    "torch._check on a size argument: a fact the ShapeEnv learns on the first call",
    symbolic=True,
)
case(
    "generator_arg",
    3,
    lambda env, i: Call((t(2), _GENERATOR)),
    "reads its Generator argument's seed, which changes between calls on the same Generator",
    steps="FSSSF",
    actions={0: _reseed(1), 2: _reseed(2), 4: _reseed(4)},
    reset=_reseed(0),
)
case(
    "ruled_later",
    5,
    x1,
    "gets a register_torch_dispatch rule for FakeTensorMode after its first calls",
    steps="FSFSF",
    actions={2: _add_rule},
    reset=_drop_rules,
)
case(
    "calls_ruled",
    6,
    x1,
    "calls an op that gets a rule for FakeTensorMode after the first calls, and loses it again",
    steps="FSFSFS",
    actions={2: _add_rule, 4: _drop_rules},
    reset=_drop_rules,
)
case(
    "py_meta",
    5,
    x1,
    "has a py_impl(Meta) kernel the Python dispatcher prefers to its Meta kernel; the dispatcher goes on and off",
    target=_call_py_meta,
    steps="FSFSFS",
    actions={0: _python_dispatcher(True), 2: _python_dispatcher(False), 4: _python_dispatcher(True)},
    reset=_python_dispatcher(False),
    min_hits=2,
)


CASES_BY_NAME = {c.name: c for c in CASES}
assert len(CASES_BY_NAME) == len(CASES), "zoo case names must be unique"


# ------------------------------------------------------------ describing a call
# For test_kernel_zoo, test_fuzz (TestZooFuzz) and test_synth (TestSelfCheckZoo): a call reduced to what it did
# (CallDescription), two such descriptions compared (dispatch_difference), and ZooTestCase.run_case, which runs a case
# in a cached and a reference world.

_SYM_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)
_CROSSCHECK_ERROR = f"{tcp.CrosscheckError.__module__}.{tcp.CrosscheckError.__qualname__}"


@dataclass(frozen=True)
class CallDescription:
    """What one call did, in a form two calls on different (identically built) inputs can be compared by.

    Storages and tensor objects are numbered in their world in order of first appearance over the whole run
    (inputs before a call, inputs after it, outputs), so equal numbers mean "shares storage with" / "is the same
    object as", within a call and across calls. Symbols of the inputs keep their names; any other symbol is renamed
    ``fresh<k>`` if no earlier call returned it, ``replayed<k>`` if one did.
    """

    raised: str | None
    structure: str
    outputs: tuple[object, ...]
    inputs_after: tuple[object, ...]
    # The symbols the call created in the ShapeEnv of its inputs' mode (see _symbols_created).
    shape_env_delta: tuple[int, ...] = ()
    message: str = field(default="", compare=False)


class _Numbering:
    """Numbers keys by first appearance, holding their owners so no id is reused while numbered."""

    def __init__(self) -> None:
        self.ids: dict[int, int] = {}
        self.owners: list[object] = []

    def __call__(self, key: int, owner: object) -> int:
        n = self.ids.get(key)
        if n is None:
            n = self.ids[key] = len(self.ids)
            self.owners.append(owner)
        return n


class World:
    """The state ``describe_call`` keeps across the calls of one run in one world (cached or reference):
    the numbering of storages and objects, and the symbols earlier calls returned, so that a replayed unbacked
    symbol differs from a fresh one."""

    def __init__(self) -> None:
        self.objects = _Numbering()
        self.storages = _Numbering()
        self.modes = _Numbering()
        self.seen_symbols: set[sympy.Symbol] = set()

    def tensor(self, t: torch.Tensor, syms: _Symbols) -> dict[str, object]:
        storage = t.untyped_storage()
        return {
            "object": self.objects(id(t), t),
            "storage": self.storages(storage._cdata, storage),
            "type": type(t).__name__,
            "fake_mode": self.modes(id(t.fake_mode), t.fake_mode) if isinstance(t, FakeTensor) else None,
            # dtype first: when it differs, the sizes that differ too are its consequence.
            "dtype": t.dtype,
            "device": t.device,
            "layout": t.layout,
            "shape": tuple(syms.int_like(v) for v in t.shape),
            "stride": tuple(syms.int_like(v) for v in t.stride()),
            "storage_offset": syms.int_like(t.storage_offset()),
            "nbytes": syms.int_like(storage.nbytes()),
            "requires_grad": t.requires_grad,
            "is_conj": t.is_conj(),
            "is_neg": t.is_neg(),
            "is_inference": t.is_inference(),
            "is_leaf": t.is_leaf,
            # .grad lives in autograd meta, outside __dict__ and the metadata; _grad reads it without the
            # warning .grad gives on non-leaves.
            "grad": None if t._grad is None else (t._grad.dtype, tuple(syms.int_like(v) for v in t._grad.shape)),
            "attributes": _attributes(t),
            "version": _version(t),
            "hooks": (len(t._backward_hooks or {}), len(getattr(t, "_post_accumulate_grad_hooks", None) or {})),
        }


def _symbols_created(shape_env: ShapeEnv | None) -> tuple[int, ...]:
    """How many symbols ``shape_env`` has made: an uncached call makes its kernel's every time.

    Facts (guards, replacements) are left out: both worlds share one ShapeEnv, so the second call to need a fact
    finds it there already, and a hit never needs to add one the entry's miss added.
    """
    if shape_env is None:
        return ()
    return (len(shape_env.var_to_range), shape_env.unbacked_symint_counter, shape_env.unbacked_symfloat_counter)


def _version(t: torch.Tensor) -> int | None:
    try:
        return t._version
    except RuntimeError:  # inference tensors have no version counter
        return None


# What every FakeTensor carries in its __dict__; the memos (unbacked sizes an op such as nonzero found for the
# tensor, reused by later calls) are described by whether they are set.
_FAKE_ATTRIBUTES = frozenset({"_fake_device", "constant", "dispatch_keys", "fake_mode", "pytype", "real_tensor"})


def _attributes(t: torch.Tensor) -> tuple[tuple[str, object], ...]:
    """The Python attributes of ``t`` beyond a FakeTensor's own, and which of its memos are set."""
    out: list[tuple[str, object]] = []
    for name, value in sorted(vars(t).items()):
        if name in _FAKE_ATTRIBUTES or (name.startswith("_") and name.endswith(("_epoch", "_vc"))):
            continue
        if name.startswith("_") and name.endswith("_memo"):
            out.append((name, value is not None))
        else:
            out.append((name, type(value).__name__ if isinstance(value, torch.Tensor) else repr(value)))
    return tuple(out)


class _Symbols:
    """Renders symbolic values; see CallDescription."""

    def __init__(self, input_symbols: set[sympy.Symbol], seen: set[sympy.Symbol]) -> None:
        self.input_symbols = input_symbols
        self.seen = seen
        self.renamed: dict[sympy.Symbol, sympy.Symbol] = {}

    def expr(self, value: Any) -> str:
        expr = value.node.expr
        for s in sorted(expr.free_symbols - self.input_symbols, key=str):
            if s not in self.renamed:
                tag = "replayed" if s in self.seen else "fresh"
                self.renamed[s] = sympy.Symbol(f"{tag}{len(self.renamed)}")
        # Expanded: torch's own hit path for aten ops rebuilds a storage's nbytes as an equal but differently
        # written expression (4*s0*s1 vs 4*s1*(s0 - 1) + 4*s1), which is not a difference.
        return str(sympy.expand(expr.xreplace(self.renamed)))

    def int_like(self, value: Any) -> object:
        """Sizes, strides, offsets: an int, or the expression of a SymInt (a constant one as its int)."""
        if isinstance(value, torch.SymInt):
            expr = value.node.expr
            return int(expr) if expr.is_number else self.expr(value)
        return int(value)

    def commit(self) -> None:
        self.seen.update(self.renamed)


def _plain(value: object) -> object:
    # A namedtuple counts as a plain tuple (torch's hits build plain ones); a list stays a list.
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    return value


def _leaf(value: object, world: World, syms: _Symbols) -> object:
    if isinstance(value, torch.Tensor):
        return world.tensor(value, syms)
    if isinstance(value, _SYM_TYPES):
        return (type(value).__name__, syms.expr(value))
    if isinstance(value, float) and math.isnan(value):
        return ("float", "nan" if math.copysign(1.0, value) > 0 else "-nan")
    if isinstance(value, (float, complex)):
        return (type(value).__name__, repr(value))  # repr tells -0.0 from 0.0
    return (type(value).__name__, value)


def _symbols_of(leaves: list[object]) -> set[sympy.Symbol]:
    found: set[sympy.Symbol] = set()
    for a in leaves:
        if isinstance(a, torch.Tensor):
            found |= free_symbols((a, a.untyped_storage().nbytes()))
        elif isinstance(a, _SYM_TYPES):
            found |= free_symbols(a)
    return found


def describe_call(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], world: World) -> CallDescription:
    """Calls ``fn(*args, **kwargs)`` and describes what it returned or raised and what it did to the inputs."""
    leaves = pytree.tree_leaves((args, kwargs))
    inputs = [a for a in leaves if isinstance(a, torch.Tensor)]
    input_symbols = _symbols_of(leaves)
    shape_env = next((a.fake_mode.shape_env for a in inputs if isinstance(a, FakeTensor)), None)
    env_before = _symbols_created(shape_env)
    for a in inputs:
        storage = a.untyped_storage()
        world.objects(id(a), a)
        world.storages(storage._cdata, storage)
    raised: Exception | None = None
    out: object = None
    try:
        out = fn(*args, **kwargs)
    except Exception as e:
        raised = e
    input_symbols |= _symbols_of(leaves)  # a kernel may have changed an input's metadata
    syms = _Symbols(input_symbols, world.seen_symbols)
    inputs_after = tuple(world.tensor(a, syms) for a in inputs)
    out_leaves, spec = pytree.tree_flatten(_plain(out))
    outputs = tuple(_leaf(o, world, syms) for o in out_leaves)
    syms.commit()
    env_after = _symbols_created(shape_env)
    return CallDescription(
        raised=None if raised is None else f"{type(raised).__module__}.{type(raised).__qualname__}",
        structure=str(spec),
        outputs=outputs,
        inputs_after=inputs_after,
        shape_env_delta=tuple(a - b for a, b in zip(env_after, env_before, strict=True)),
        message="" if raised is None else f"{type(raised).__name__}: {raised}".splitlines()[0][:300],
    )


def _first_difference(path: str, a: object, b: object) -> str | None:
    if _pairs(a) and _pairs(b) and len(a) != len(b):  # type: ignore[arg-type]
        only_cached = sorted(set(a) - set(b), key=str)  # type: ignore[arg-type]
        only_uncached = sorted(set(b) - set(a), key=str)  # type: ignore[arg-type]
        return f"{path}: only cached has {only_cached}, only uncached has {only_uncached}"
    if isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys():
        for k in a:
            why = _first_difference(f"{path}.{k}", a[k], b[k])
            if why:
                return why
        return None
    if isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b) and not (a and isinstance(a[0], str)):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            why = _first_difference(f"{path}[{i}]", x, y)
            if why:
                return why
        return None
    return None if a == b else f"{path}: cached {a!r}, uncached {b!r}"


def _pairs(value: object) -> bool:
    return isinstance(value, tuple) and all(isinstance(v, tuple) and len(v) == 2 for v in value)


def dispatch_difference(cached: CallDescription, uncached: CallDescription) -> str | None:
    """None if the two descriptions are equal; else one line saying where they first differ.

    A ``CrosscheckError`` from the cached call is always a difference: the crosscheck caught a wrong hit, and
    the target is that none happens.
    """
    if cached.raised == _CROSSCHECK_ERROR:
        return f"the cache made a wrong hit that crosscheck caught: {cached.message}"
    if cached == uncached:
        return None
    if cached.raised != uncached.raised:
        got = f"raised {cached.message}" if cached.raised else "returned"
        want = f"raised {uncached.message}" if uncached.raised else "returned"
        return f"cached call {got}; uncached call {want}"
    if cached.structure != uncached.structure:
        return f"output structure: cached {cached.structure}, uncached {uncached.structure}"
    if cached.shape_env_delta != uncached.shape_env_delta:
        return f"symbols created: {cached.shape_env_delta} (cached), {uncached.shape_env_delta} (uncached)"
    for name in ("outputs", "inputs_after"):
        why = _first_difference(name, getattr(cached, name), getattr(uncached, name))
        if why:
            return why
    return f"descriptions differ: {cached} != {uncached}"


# --------------------------------------------------------------- running a case


def _kernel_runs(mode: tcp.FakeTensorMode, op: torch._ops.OpOverload) -> int:
    """How often ``op``'s kernel ran: zoo kernels count themselves; for others, the dispatches that were not hits."""
    if op.namespace in (NS, CTX_NS):
        return calls[op.name().split("::")[1]]
    try:
        row = mode.cache_report()[op]
    except KeyError:
        return 0
    return row.calls - row.hits


class ZooTestCase(testing.CachePolicyTestCase):
    """Runs zoo cases, each in a cached and a reference world (``run_case``); zoo op runs are counted afresh."""

    def setUp(self) -> None:
        super().setUp()
        calls.clear()

    def assertSameDispatch(self, cached: CallDescription, uncached: CallDescription, msg: str = "") -> None:
        """The cached call did exactly what the uncached call did (and raised no CrosscheckError)."""
        why = dispatch_difference(cached, uncached)
        if why:
            self.fail(f"{msg}: {why}")

    def run_case(self, case: ZooCase, crosscheck: bool, *, cache: bool = True) -> tcp.FakeTensorMode:
        """Runs ``case``'s call sequence in a cached and a reference world; returns the mode.

        ``cache=False`` disables the cache in the "cached" world too (the harness's own check).
        """
        if case.reset is not None:
            case.reset()
        try:
            mode = tcp.FakeTensorMode(
                cache_policy=case.policy(),
                cache_crosscheck=crosscheck,
                shape_env=ShapeEnv() if case.symbolic or case.shape_env else None,
            )
            if not cache:
                mode.cache_enabled = False
            env = Env.make(mode, case.symbolic)
            cached_world, reference_world = World(), World()
            cached = reference = None
            caught = 0
            with mode, testing.logging_disabled():
                for i, step in enumerate(case.steps):
                    action = case.actions.get(i)
                    if action is not None:
                        action()
                    if step == "F" or cached is None:
                        cached, reference = case.build(env, i), case.build(env, i)
                    runs = _kernel_runs(mode, case.op)
                    got = describe_call(case.callee, cached.args, cached.kwargs, cached_world)
                    ran = _kernel_runs(mode, case.op) - runs
                    if crosscheck and case.caught_by_crosscheck and got.raised == _CROSSCHECK_ERROR:
                        caught += 1
                        continue
                    with disable_fake_tensor_cache(mode):
                        want = describe_call(case.callee, reference.args, reference.kwargs, reference_world)
                    self.assertSameDispatch(got, want, msg=f"{case.name} call {i} ({step})")
                    # The report counts only dispatches that take the cached path: a crosscheck's re-run of a
                    # hit, or any run with the cache off, is invisible there for non-zoo ops (zoo kernels count
                    # their runs themselves), so those are checked only when every run is visible.
                    observable = (cache and not crosscheck) or case.op.namespace in (NS, CTX_NS)
                    if case.runs_every_call and observable and not ran:
                        self.fail(f"{case.name} call {i} ({step}): the kernel of {case.op} did not run")
            if crosscheck and case.caught_by_crosscheck:
                self.assertGreater(caught, 0, msg=f"{case.name}: crosscheck did not catch the limit")
        finally:
            if case.reset is not None:
                case.reset()
        return mode
