"""Operators and helpers shared by the torch_cachepolicy tests.

Test operators are defined through :class:`CountedOps`, whose fake kernels count their runs, so a test can tell a
cache hit (no run) from a miss. This module defines the ``tcp_test`` namespace, once per process; ``zoo_ops``
defines ``tcp_zoo`` the same way.

:class:`CachePolicyTestCase` is the base of every test class in the files that hold a hit to an uncached dispatch
(test_mode, test_kernel_zoo, test_fuzz, test_symbols, test_fidelity, test_synth, test_opinfo_crosscheck): it turns
the cache crosscheck on for the whole class, as torch's test_fake_tensor.py does for its file.
"""

from __future__ import annotations

import collections
import contextlib
import gc
import itertools
import json
import logging
import math
import pathlib
import subprocess
import sys
import types
import unittest
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import torch
import torch._dynamo.config
import torch.ao.quantization.fx._decomposed  # noqa: F401  (defines quantized_decomposed ops)
import torch.utils._pytree as pytree
from torch._ops import OpOverload
from torch._subclasses.meta_utils import assert_eq, assert_metadata_eq
from torch.testing._internal.common_utils import TestCase

import torch_cachepolicy as tcp
from torch_cachepolicy import _compat

KernelT = TypeVar("KernelT", bound=Callable[..., Any])
REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent


class CountedOps:
    """The operators of one test namespace, each with a fake kernel that counts its runs.

    Attributes:
        ns: the namespace.
        lib: its ``DEF`` library, which owns the definitions and registrations made here.
        calls: how often each fake kernel ran, by operator name without the namespace (``calls["conv"]``).
    """

    def __init__(self, ns: str, calls: collections.Counter[str] | None = None) -> None:
        """Defines the namespace ``ns``.

        Args:
            ns: a namespace no library has defined yet.
            calls: the counter to count into, when the kernels of another namespace count in the same one
                (the tests read the runs of either by operator name); a new counter by default.
        """
        self.ns = ns
        self.lib = torch.library.Library(ns, "DEF")
        self.calls: collections.Counter[str] = collections.Counter() if calls is None else calls

    def op(self, name: str) -> OpOverload:
        """The default overload of ``ns::name``."""
        return getattr(getattr(torch.ops, self.ns), name).default

    def counted(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """A kernel that counts a run in ``calls[name]``, then runs ``fn``.

        For kernels registered by hand: replacements of a kernel, other dispatch keys, other namespaces' rules.
        """

        def kernel(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            return fn(*args, **kwargs)

        return kernel

    def define(self, schema: str, tags: Sequence[torch.Tag] = ()) -> Callable[[KernelT], KernelT]:
        """Defines ``ns::<schema>`` and registers the decorated function, counted, as its fake kernel.

        Args:
            schema: the operator's schema, name first (``"conv(Tensor x, int stride) -> Tensor"``).
            tags: torch tags the operator's owner declares.

        Returns:
            A decorator that returns the function unchanged (it does not count when called directly).
        """

        def wrap(fn: KernelT) -> KernelT:
            name = schema.split("(", 1)[0]
            self.lib.define(schema, tags=tags)
            torch.library.register_fake(f"{self.ns}::{name}", self.counted(name, fn), lib=self.lib)
            return fn

        return wrap


# ------------------------------------------------------------------ tcp_test

TEST_OPS = CountedOps("tcp_test")
NS = TEST_OPS.ns
calls = TEST_OPS.calls
op = TEST_OPS.op

# Fake kernels that read ambient state read this (like TOSA's active spec).
ambient: dict[str, Any] = {"dtype": torch.float32}


@TEST_OPS.define("conv(Tensor x, int stride) -> Tensor")
def _conv(x: torch.Tensor, stride: int) -> torch.Tensor:
    n, c, h, w = x.shape
    return x.new_empty(n, c * 2, (h - 1) // stride + 1, (w - 1) // stride + 1)


@TEST_OPS.define("pair(Tensor x) -> (Tensor, Tensor)")
def _pair(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x.new_empty(x.shape), x.new_empty(x.shape[0])


@TEST_OPS.define("dyn(Tensor x) -> SymInt")
def _dyn(x: torch.Tensor) -> Any:
    return torch.library.get_ctx().new_dynamic_size()


@TEST_OPS.define("size0(Tensor x) -> SymInt")
def _size0(x: torch.Tensor) -> Any:
    return x.shape[0]


@TEST_OPS.define("sym_double(Tensor x) -> SymInt")
def _sym_double(x: torch.Tensor) -> Any:
    return x.shape[0] * 2  # a new SymNode on every run


@TEST_OPS.define("bad_view(Tensor x) -> Tensor")
def _bad_view(x: torch.Tensor) -> torch.Tensor:
    return x.view(-1)  # aliases x, but the schema says it does not


@TEST_OPS.define("good_view(Tensor(a) x) -> Tensor(a)")
def _good_view(x: torch.Tensor) -> torch.Tensor:
    return x.view(-1)


@TEST_OPS.define("multi_view(Tensor(a) x, Tensor y) -> Tensor(a)")
def _multi_view(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x.view(-1)


@TEST_OPS.define("twins(Tensor x) -> (Tensor, Tensor)")
def _twins(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    out = x.new_empty(x.shape)
    return out, out.view(-1)  # the two outputs share a storage, undeclared


@TEST_OPS.define("mut(Tensor(a!) x) -> ()")
def _mut(x: torch.Tensor) -> None:
    return None


@TEST_OPS.define("ambient_cast(Tensor x) -> Tensor")
def _ambient_cast(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape, dtype=ambient["dtype"])


TEST_OPS.lib.define("no_fake(Tensor x) -> Tensor")  # no fake kernel at all

# Two versions of one kernel, for tests that replace it: both count as "swappable", on either overload.
TEST_OPS.lib.define("swappable(Tensor x) -> Tensor")
TEST_OPS.lib.define("swappable.ovl(Tensor x, int n) -> Tensor")


def _swappable_v1(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape)


def _swappable_v2(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape[0], 1)


swappable_v1 = TEST_OPS.counted("swappable", _swappable_v1)
swappable_v2 = TEST_OPS.counted("swappable", _swappable_v2)
torch.library.register_fake(f"{NS}::swappable", swappable_v1, lib=TEST_OPS.lib)
torch.library.register_fake(f"{NS}::swappable.ovl", lambda x, n: swappable_v1(x), lib=TEST_OPS.lib)


# ------------------------------------------------------------------ helpers

_unique = itertools.count(101)


def synthesis_call(args: tuple[Any, ...]) -> tuple[Any, Any, Any, Any, Any]:
    """``(state, entry, key, func, call_args)`` of ``_output_from_cache_entry``'s arguments on any torch.

    torch 2.13 and 2.14 pass ``(state, entry, key, func, args)``, 2.15 ``(state, entry, key, args)``; a ``self``
    before them (a function patched on the class) is dropped. The op is the key's first item either way.
    """
    width = 5 if _compat.SYNTHESIS_TAKES_FUNC else 4
    state, entry, key = args[-width : -width + 3]
    return state, entry, key, key.key[0], args[-1]


def synthesis_args(func: Any, call_args: Any) -> tuple[Any, ...]:
    """What follows ``(state, entry, key)`` in a call of ``_output_from_cache_entry`` on the installed torch."""
    return (func, call_args) if _compat.SYNTHESIS_TAKES_FUNC else (call_args,)


def fresh_size() -> int:
    """A size no other test used, so torch's shared cache holds nothing for it."""
    return next(_unique)


def stock_info() -> tuple[int, int, dict[str, int], int]:
    """Stock FakeTensorMode's class-wide cache counters: (hits, misses, bypasses by reason, size)."""
    info = torch._subclasses.fake_tensor.FakeTensorMode.cache_info()
    return info.hits, info.misses, dict(info.bypasses), info.size


def backend_policy(**kwargs: Any) -> tcp.CachePolicy:
    """A policy caching the tcp_test and quantized_decomposed backend ops; ``kwargs`` go to CachePolicy."""
    return tcp.CachePolicy(namespaces=[NS, "quantized_decomposed"], **kwargs)


def qdq(x: torch.Tensor) -> torch.Tensor:
    """Quantizes ``x`` to int8 and back, as a backend's explicit q/dq pair does."""
    q = torch.ops.quantized_decomposed.quantize_per_tensor(x, 0.05, 0, -128, 127, torch.int8)
    return torch.ops.quantized_decomposed.dequantize_per_tensor(q, 0.05, 0, -128, 127, torch.int8)


def size_key(v: object) -> object:
    """A size as its expression: comparing it installs no guard."""
    if isinstance(v, torch.SymInt):
        expr = v.node.expr
        return int(expr) if expr.is_number else expr
    return v


def sharing(values: list[torch.Tensor]) -> list[tuple[int, ...]]:
    """For each value, the indices of the values sharing its storage."""
    ids = [v.untyped_storage()._cdata for v in values]
    return [tuple(j for j, other in enumerate(ids) if other == mine) for mine in ids]


def reaches(root: object, target: object, limit: int = 200_000) -> bool:
    """Whether ``target`` is reachable from ``root`` through containers and plain objects.

    Not through operators, modules, types or functions, which lead into torch's global state.
    """
    stop = (torch._ops.OperatorBase, types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType)
    seen, todo = {id(root)}, [root]
    while todo and len(seen) < limit:
        for ref in gc.get_referents(todo.pop()):
            if ref is target:
                return True
            if id(ref) not in seen and not isinstance(ref, stop):
                seen.add(id(ref))
                todo.append(ref)
    return False


@contextlib.contextmanager
def logging_disabled() -> Iterator[None]:
    """torch logs every exception a fake kernel raises at ERROR level; test kernels raise some on purpose."""
    logging.disable(logging.ERROR)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)


# ------------------------------------------------------------------ the test case


# Note [Crosscheck in the tests]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# As in torch's test_fake_tensor.py, every hit of these tests is re-run uncached and compared: a mode made with
# cache_crosscheck=None (the default) follows torch._dynamo.config, which the class patch below turns on for each test
# class (stock FakeTensorModes made in a test crosscheck their hits too). A test that needs a hit alone says why and
# passes cache_crosscheck=False (or patches the config off): one that counts kernel runs (a crosscheck runs the
# kernel again), or compares what kernels leave behind (ShapeEnv facts, symbol counters) between a cached and an
# uncached run (the crosscheck's rerun would do for the hit what the hit skipped), or shows a limit crosscheck catches.
@torch._dynamo.config.patch(fake_tensor_cache_crosscheck_enabled=True)
class CachePolicyTestCase(TestCase):
    """The tests' base: crosscheck on for the class (Note [Crosscheck in the tests]), test op runs counted afresh."""

    def setUp(self) -> None:
        super().setUp()
        # A subclass overriding setUpClass without super() would run without the patch.
        self.assertTrue(torch._dynamo.config.fake_tensor_cache_crosscheck_enabled, "crosscheck is off for the class")
        calls.clear()

    def assertHitsMisses(self, mode: tcp.FakeTensorMode, hits: int, misses: int) -> None:
        info = mode.cache_info()
        self.assertEqual((info.hits, info.misses), (hits, misses), msg=str(mode.cache_report()))

    def assertBypassed(self, mode: tcp.FakeTensorMode, op: Any, reason: str, count: int) -> None:
        self.assertEqual(mode.cache_report()[op].bypasses.get(reason, 0), count, msg=str(mode.cache_report()))

    def assertNotAliased(self, a: torch.Tensor, b: torch.Tensor) -> None:
        self.assertNotEqual(a.untyped_storage()._cdata, b.untyped_storage()._cdata)


def crosscheck_off() -> Any:
    """torch._dynamo.config's crosscheck off: modes made inside (stock ones too) serve hits without rerunning them.

    For a control that must show a wrong hit, which the crosscheck would raise on (Note [Crosscheck in the tests]).
    """
    return torch._dynamo.config.patch(fake_tensor_cache_crosscheck_enabled=False)


def run_json_script(test: unittest.TestCase, script: str, env: dict[str, str], *python_flags: str) -> Any:
    """Runs ``script`` with ``python -c`` in a fresh interpreter, from the repository root.

    Args:
        test: the test that fails, showing the script's stderr, if the interpreter exits non-zero.
        script: the code; its last line of output is JSON.
        env: the interpreter's whole environment.
        python_flags: interpreter options before ``-c``.

    Returns:
        The JSON value of the script's last line of output.
    """
    proc = subprocess.run(
        [sys.executable, *python_flags, "-c", script],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        check=False,
        text=True,
        timeout=300,
    )
    test.assertEqual(proc.returncode, 0, proc.stderr)
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------ key parity
# Used by test_keybuilder and test_opinfo_crosscheck (the op_db sweep records key parity beside its crosscheck).

import collections.abc as _abc  # noqa: E402

from torch._subclasses._fake_tensor_utils import _CacheKeyState  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode as _StockMode  # noqa: E402
from torch._subclasses.fake_tensor import _BypassDispatchCache, _DispatchCacheKey  # noqa: E402

from torch_cachepolicy import _key  # noqa: E402
from torch_cachepolicy.report import KeyStats  # noqa: E402

HAS_KEY_BUILDER = _key._builder is not None
NO_KEY_BUILDER_REASON = (
    "torch_cachepolicy._C is not loaded (USE_CPP=0 or TORCH_CACHEPOLICY_FORCE_PYTHON=1): no C++ key builder"
)


def key_difference(built: tuple[object, ...], expected: tuple[object, ...]) -> str | None:
    """Where two key tuples differ (length, a value, or a value's type), or None if they and their hashes are equal."""
    if len(built) != len(expected):
        return f"length {len(built)} != {len(expected)}"
    for i, (b, e) in enumerate(zip(built, expected, strict=True)):
        # `is` first, as tuple equality does: a NaN argument is the same object in both.
        if b is not e and (type(b) is not type(e) or b != e):
            return f"[{i}]: {b!r} ({type(b).__name__}) != {e!r} ({type(e).__name__})"
    if hash(_DispatchCacheKey(built)) != hash(_DispatchCacheKey(expected)):
        return "hash"
    return None


def key_state_difference(built: _CacheKeyState | None, expected: _CacheKeyState) -> str | None:
    """How the state a key builder left differs from the one torch's ``_cache_key`` left, or None.

    ``built`` is None for a builder that was given no state: then torch's must have recorded no symbol either.
    """
    if built is None:
        return None if not expected.sym_node_lookup else "a builder without a state handled symbols"
    for name in ("sym_node_lookup", "known_symbols"):
        if getattr(built, name) != getattr(expected, name):
            return f"state.{name}: {getattr(built, name)} != {getattr(expected, name)}"
    if built.shape_env is not expected.shape_env:
        return "state.shape_env"
    return None


class KeyParity:
    """Keys of ``torch_cachepolicy._key.cache_key`` compared with torch's ``FakeTensorMode._cache_key``.

    Attributes:
        built: keys the C++ builder built (each compared with torch's).
        fallbacks: ``{reason: count}`` of the keys ``cache_key`` left to torch (a bypass included).
        differences: one line per key that differed (tuple, an element's type, hash or state), or that one side
            refused and the other built.
    """

    def __init__(self) -> None:
        self.built = 0
        self.fallbacks: collections.Counter[str] = collections.Counter()
        self.differences: list[str] = []

    @property
    def keys(self) -> int:
        return self.built + sum(self.fallbacks.values())

    def add(self, other: KeyParity) -> None:
        """Adds the counts and differences of ``other``."""
        self.built += other.built
        self.fallbacks.update(other.fallbacks)
        self.differences += other.differences

    def figures(self) -> dict[str, Any]:
        return {
            "keys": self.keys,
            "built": self.built,
            "built_share": round(self.built / self.keys, 4) if self.keys else None,
            "fallbacks": dict(self.fallbacks.most_common()),
            "differences": len(self.differences),
        }

    def check(
        self,
        mode: Any,
        state: _CacheKeyState,
        func: Any,
        args: _abc.Sequence[object],
        kwargs: _abc.Mapping[str, object],
        torch_cache_key: Callable[..., _DispatchCacheKey],
    ) -> _DispatchCacheKey:
        """torch's key of the call, on ``state``, after comparing it with ``cache_key``'s on a fresh state of its own.

        ``torch_cache_key`` is torch's own ``_cache_key`` bound to ``mode`` (``cache_key`` falls back to
        ``mode._cache_key``, which must be torch's while it runs). Ours comes first: its guards, if any, must come
        first to be seen (Note [Symbolic keys] in csrc/keybuilder.cpp).

        Raises:
            _BypassDispatchCache: as torch's ``_cache_key`` does.
        """
        stats = KeyStats()
        ours_state = _CacheKeyState(mode.shape_env)
        ours: _DispatchCacheKey | None = None
        try:
            ours = _key.cache_key(mode, ours_state, func, args, kwargs, stats)
        except _BypassDispatchCache:
            pass
        self.built += stats.built
        self.fallbacks.update(stats.fallbacks)
        try:
            expected = torch_cache_key(state, func, args, kwargs)
        except _BypassDispatchCache as e:
            if ours is not None:
                self.differences.append(f"{func}: cache_key built a key, torch bypassed ({e.reason})")
            raise
        if ours is None:
            self.differences.append(f"{func}: cache_key bypassed, torch built a key")
            return expected
        diff = key_difference(ours.key, expected.key) or key_state_difference(ours_state, state)
        if diff is None and hash(ours) != hash(expected):
            diff = "hash of the _DispatchCacheKey"
        if diff is not None:
            how = "built" if stats.built else f"left to torch ({', '.join(stats.fallbacks)})"
            self.differences.append(f"{func}: key {how} differs at {diff}")
        return expected


class KeyParityMode(_StockMode):
    """A stock FakeTensorMode that records, in ``parity``, every cache key of ours against torch's."""

    def __init__(self, parity: KeyParity, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.parity = parity
        self._in_cache_key = False

    def _cache_key(
        self, state: _CacheKeyState, func: Any, args: _abc.Sequence[object], kwargs: _abc.Mapping[str, object]
    ) -> _DispatchCacheKey:
        if self._in_cache_key:
            # cache_key falling back to torch's key.
            return super()._cache_key(state, func, args, kwargs)
        if state.known_symbols or state.sym_node_lookup:
            # Not a dispatch's own fresh state (torch's key would hold the epoch): nothing to compare.
            return super()._cache_key(state, func, args, kwargs)
        self._in_cache_key = True
        try:
            return self.parity.check(self, state, func, args, kwargs, super()._cache_key)
        finally:
            self._in_cache_key = False


# ------------------------------------------------ comparing outputs (the sweeps, the fuzz)


def storage_id(t: torch.Tensor) -> int | None:
    try:
        return t.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError):  # sparse and other storage-less layouts
        return None


def alias_signature(output: object, inputs: list[object]) -> list[tuple[int, ...]]:
    """For each tensor output, the positions of the input tensors sharing its storage."""
    ins = [(i, storage_id(a)) for i, a in enumerate(inputs) if isinstance(a, torch.Tensor)]
    signature = []
    for out in pytree.tree_leaves(output):
        if isinstance(out, torch.Tensor):
            sid = storage_id(out)
            signature.append(tuple(i for i, s in ins if s is not None and s == sid))
    return signature


def tensor_difference(expected: torch.Tensor, actual: torch.Tensor) -> str | None:
    """None if the tensors have the same metadata (torch's own comparison for strided ones)."""
    if expected.layout != actual.layout:
        return f"layout {actual.layout} != {expected.layout}"
    if expected.layout == torch.strided:
        try:
            assert_metadata_eq(assert_eq, expected, actual)
        except AssertionError as e:
            return str(e)
        return None

    # assert_metadata_eq asks compressed sparse tensors for strides; compare what they have.
    def sparse_meta(t: torch.Tensor) -> tuple[object, ...]:
        return (t.dtype, t.shape, t.requires_grad, t.is_inference(), t.sparse_dim(), t.dense_dim())

    if sparse_meta(expected) != sparse_meta(actual):
        return f"sparse metadata {sparse_meta(actual)} != {sparse_meta(expected)}"
    return None


def described(out: object) -> object:
    """Output metadata in a form equal across modes."""
    if isinstance(out, torch.Tensor):
        return (out.dtype, tuple(out.shape), out.stride(), out.storage_offset())
    if isinstance(out, (tuple, list)):
        return tuple(described(o) for o in out)
    return out


def output_difference(expected: object, actual: object) -> str | None:
    """None if both outputs have the same structure, tensor metadata and values; else why not."""
    exp_leaves, exp_spec = pytree.tree_flatten(expected)
    act_leaves, act_spec = pytree.tree_flatten(actual)
    if exp_spec != act_spec:
        return f"structure {act_spec} != {exp_spec}"
    for i, (e, a) in enumerate(zip(exp_leaves, act_leaves, strict=True)):
        if isinstance(e, torch.Tensor):
            why = tensor_difference(e, a) if isinstance(a, torch.Tensor) else f"got {type(a).__name__}"
            if why:
                return f"output {i}: {why}"
        elif isinstance(e, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            # Modes of one sample have separate ShapeEnvs: compare expressions.
            if type(e) is not type(a) or str(e) != str(a):
                return f"output {i}: symbolic {a} != {e}"
        elif type(e) is not type(a) or not (e == a or (isinstance(e, float) and math.isnan(e) and math.isnan(a))):
            return f"output {i}: value {a!r} != {e!r}"
    return None
