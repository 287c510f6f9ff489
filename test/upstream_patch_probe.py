"""The behaviour tests of the patch series in docs/upstream/, run against patched torch.

Runs in a subprocess, never imported by the test process (importing it
defines the ``tcp_upstream`` operators)::

    TCP_PATCHED_TREE=/tmp/x/site-packages python test/upstream_patch_probe.py probe TestCachePolicy ...
    TCP_PATCHED_TREE= python test/upstream_patch_probe.py workload

``TCP_PATCHED_TREE`` names a tree laid out like site-packages that holds the
patched copies of the files the series touches (``PATCHED_FILES``); those
present are served in place of the installed modules, so the installed torch
is never written. Empty: the installed torch, unpatched.

``probe`` runs the named TestCase classes (one per patch, written as they
would be added to upstream's test/test_fake_tensor.py) and prints
``PROBE-RESULT <json>``: for every test id, ``"ok"`` or the failure's
traceback. ``workload`` prints ``WORKLOAD-RESULT <json>``, the stock cache
counters of a fixed workload that must not change with the series when no
policy is given.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from types import ModuleType

PATCHED_FILES = {
    "torch._subclasses.fake_tensor": "torch/_subclasses/fake_tensor.py",
    "torch._ops": "torch/_ops.py",
    "torch.library": "torch/library.py",
}


class _PatchedFinder(importlib.abc.MetaPathFinder):
    def __init__(self, tree: str) -> None:
        self.tree = tree

    def find_spec(
        self, name: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        rel = PATCHED_FILES.get(name)
        if rel is None or not os.path.exists(os.path.join(self.tree, rel)):
            return None
        return importlib.util.spec_from_file_location(name, os.path.join(self.tree, rel))


def serve_patched_modules(tree: str) -> None:
    """Makes the next imports of the patched modules load the copies in ``tree`` (no-op if empty)."""
    if "torch" in sys.modules:
        raise RuntimeError("serve_patched_modules() must run before torch is imported")
    if tree:
        sys.meta_path.insert(0, _PatchedFinder(tree))


# Before torch is imported, which is why the imports below come after code.
serve_patched_modules(os.environ.get("TCP_PATCHED_TREE", ""))

import inspect  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import unittest  # noqa: E402
from collections.abc import Callable, Hashable  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402
import torch._subclasses.fake_tensor as ft  # noqa: E402
import torch.ao.quantization.fx._decomposed  # noqa: E402, F401  (defines quantized_decomposed)
from torch._higher_order_ops.invoke_subgraph import invoke_subgraph  # noqa: E402
from torch._ops import OpOverload  # noqa: E402
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext  # noqa: E402
from torch.testing._internal.common_utils import TestCase  # noqa: E402

# The patched class: its new API (cache_policy=, policy_cache_info(), ...) is
# unknown to the installed torch's annotations.
FTM: Any = ft.FakeTensorMode
q = torch.ops.quantized_decomposed.quantize_per_tensor.default
calls: dict[str, int] = {}
ambient: dict[str, torch.dtype] = {"dtype": torch.float32}
lib = torch.library.Library("tcp_upstream", "DEF")


def define(schema: str, fn: Callable[..., Any], meta: bool = False, tags: tuple[torch.Tag, ...] = ()) -> None:
    """Defines ``tcp_upstream::<schema>`` with a fake (or Meta) kernel that counts its calls."""
    lib.define(schema, tags=tags)
    name = schema.split("(")[0]

    def kernel(*args: Any) -> Any:
        calls[name] = calls.get(name, 0) + 1
        return fn(*args)

    if meta:
        lib.impl(name, kernel, "Meta")
    else:
        torch.library.register_fake(f"tcp_upstream::{name}", kernel, lib=lib)


def _twins(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    out = x.new_empty(x.shape)
    return out, out.view(-1)


def _unsqueezes(x: torch.Tensor) -> torch.Tensor:
    x.unsqueeze_(0)
    return x.new_empty(2)


define("dyn(Tensor x) -> SymInt", lambda x: torch.library.get_ctx().new_dynamic_size())
define("bad_view(Tensor x) -> Tensor", lambda x: x.view(-1))
define("good_view(Tensor(a) x) -> Tensor(a)", lambda x: x.view(-1))
define("twins(Tensor x) -> (Tensor, Tensor)", _twins)
define("mut(Tensor(a!) x) -> ()", lambda x: None)
define("multi_view(Tensor(a) x, Tensor y) -> Tensor(a)", lambda x, y: x.view(-1))
define("ambient_cast(Tensor x) -> Tensor", lambda x: x.new_empty(x.shape, dtype=ambient["dtype"]))
define("swap.ovl(Tensor x) -> Tensor", lambda x: x.new_empty(x.shape))
define("meta_swap(Tensor x) -> Tensor", lambda x: x.new_empty(x.shape), meta=True)
define("sparse(Tensor x) -> Tensor", lambda x: x.to_sparse())
define("offset(Tensor x) -> Tensor", lambda x: x.new_empty(x.numel() + 2)[2:])
define("roomy(Tensor x) -> Tensor", lambda x: x.new_empty(x.numel() + 2)[: x.numel()])
define("signed(Tensor x, float s) -> Tensor", lambda x, s: x.new_empty(1 if math.copysign(1.0, s) > 0 else 2))
define("scaled(Tensor x, float s) -> Tensor", lambda x, s: x.new_empty(x.shape))
define(
    "pair(Tensor x, Tensor y) -> Tensor",
    lambda x, y: x.new_empty(1 if x is y else 2 if x.untyped_storage()._cdata == y.untyped_storage()._cdata else 3),
)
define("unsqueezes(Tensor x) -> Tensor", _unsqueezes)
define("tagged(Tensor x) -> Tensor", lambda x: x.new_empty(x.shape), tags=(torch.Tag.dynamic_output_shape,))


@torch.library.custom_op("tcp_upstream::co", mutates_args=())
def co(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


co.register_fake(lambda x: x.new_empty(x.shape))


def import_prototype() -> ModuleType:
    """Imports torch_cachepolicy without its check of torch's internals.

    The check refuses this torch on purpose: the series gives
    _validate_cache_key a keyword-only parameter, and the prototype's mode
    overrides that method. Only CachePolicy is used here, which overrides
    nothing.
    """
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "torch_cachepolicy", "_compat.py")
    spec = importlib.util.spec_from_file_location("torch_cachepolicy._compat", path)
    assert spec is not None and spec.loader is not None
    compat = sys.modules["torch_cachepolicy._compat"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(compat)
    compat.check_torch_internals = lambda version=None: None  # type: ignore[attr-defined]
    import torch_cachepolicy

    return torch_cachepolicy


def op(name: str, overload: str = "default") -> OpOverload:
    return getattr(getattr(torch.ops.tcp_upstream, name), overload)  # type: ignore[no-any-return]


@dataclass(frozen=True)
class Decision:
    cacheable: bool
    label: str
    explicit: bool = False


class Policy:
    """The smallest object FakeTensorCachePolicy accepts; counts decide() calls."""

    def __init__(
        self,
        namespaces: Sequence[str] = ("quantized_decomposed", "tcp_upstream"),
        deny: set[OpOverload] | None = None,
        allow: set[OpOverload] | None = None,
        context: Callable[[], Hashable] | None = None,
    ) -> None:
        self.namespaces, self.deny, self.allow, self.context = set(namespaces), deny or set(), allow or set(), context
        self.identity = (frozenset(self.namespaces), frozenset(self.deny), frozenset(self.allow), context)
        self.decided: list[OpOverload] = []

    def decide(self, op: OpOverload) -> Decision:
        self.decided.append(op)
        if op in self.deny:
            return Decision(False, "denied by policy")
        if op in self.allow:
            return Decision(True, "cacheable", explicit=True)
        ok = op.namespace in {"aten", "prim", "prims"} | self.namespaces
        return Decision(ok, "cacheable" if ok else "non-builtin")

    def context_key(self) -> Hashable:
        return None if self.context is None else self.context()


def info(i: Any) -> dict[str, Any]:
    return {"hits": i.hits, "misses": i.misses, "bypasses": i.bypasses, "size": i.size}


def storage(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


class TestCacheClearOnSubclass(TestCase):
    """0001-fake-tensor-cache-clear-on-subclass.patch"""

    def test_cache_clear_on_subclass_does_not_shadow_counters(self) -> None:
        """Subclass.cache_clear() resets FakeTensorMode's counters without creating class attributes."""

        class Sub(FTM):  # type: ignore[misc]
            pass

        with FTM():
            x = torch.empty(2, 3)
            x + x
        Sub.cache_clear()
        self.assertEqual(
            [k for k in ("cache_hits", "cache_misses", "cache_bypasses", "cache") if k in Sub.__dict__], []
        )
        self.assertEqual((FTM.cache_hits, FTM.cache_misses, len(FTM.cache)), (0, 0, 0))

    def test_subclass_cache_info_follows_dispatch(self) -> None:
        """After Subclass.cache_clear(), Subclass.cache_info() counts the hits dispatch records."""

        class Sub(FTM):  # type: ignore[misc]
            pass

        with FTM():
            x = torch.empty(2, 3)
            x + x
            x + x
            Sub.cache_clear()
            x + x
            x + x
        self.assertEqual((Sub.cache_info().hits, Sub.cache_info().misses), (1, 1))
        self.assertEqual(Sub.cache_info(), FTM.cache_info())


class TestHopRuleAlongMro(TestCase):
    """0002-hop-python-key-rule-along-mro.patch"""

    def test_cond_under_mode_subclass(self) -> None:
        """torch.cond runs under a plain FakeTensorMode subclass, with FakeTensorMode's rule."""

        class Sub(FTM):  # type: ignore[misc]
            pass

        with Sub():
            x = torch.empty(3)
            out = torch.cond(x.sum() > 0, lambda x: x + 1, lambda x: x - 1, (x,))
        self.assertIsInstance(out, ft.FakeTensor)
        self.assertEqual(out.shape, (3,))

    def test_exact_type_rule_wins(self) -> None:
        """A rule registered for the subclass itself is preferred over its base's."""

        class Sub(FTM):  # type: ignore[misc]
            pass

        from torch._higher_order_ops.cond import cond_op

        seen: list[str] = []

        def rule(mode: Any, *args: Any, **kwargs: Any) -> Any:
            seen.append(type(mode).__name__)
            return cond_op.python_key_table[FTM](mode, *args, **kwargs)

        cond_op.python_key_table[Sub] = rule
        cond_op._dispatch_cache.clear()
        try:
            with Sub():
                x = torch.empty(3)
                torch.cond(x.sum() > 0, lambda x: x + 1, lambda x: x - 1, (x,))
        finally:
            del cond_op.python_key_table[Sub]
            cond_op._dispatch_cache.clear()
        self.assertEqual(seen, ["Sub"])


class TestCachePolicy(TestCase):
    """0003-fake-tensor-cache-policy.patch"""

    def call(
        self, name: str, *scalars: Any, n: int = 2, policy: Policy | None = None, **kw: Any
    ) -> tuple[Any, list[Any]]:
        """Calls ``tcp_upstream::name`` ``n`` times on one (4, 4) fake and ``scalars`` in a new mode."""
        mode = FTM(cache_policy=policy or Policy(), **kw)
        calls.pop(name, None)
        with mode:
            x = torch.empty(4, 4)
            outs = [op(name)(x, *scalars) for _ in range(n)]
        return mode, outs

    # ------------------------------------------------------------ the hook

    def test_signature(self) -> None:
        """cache_policy is keyword-only, defaults to None, and the protocols are public."""
        p = inspect.signature(FTM.__init__).parameters["cache_policy"]
        self.assertEqual((p.kind, p.default), (inspect.Parameter.KEYWORD_ONLY, None))
        self.assertTrue(hasattr(ft, "FakeTensorCachePolicy") and hasattr(ft, "FakeTensorCacheDecision"))

    def test_no_policy_bypasses_as_non_builtin(self) -> None:
        """Without a policy a backend op bypasses as 'non-builtin' in the shared counters, as stock does."""
        before = FTM.cache_info().bypasses.get("non-builtin", 0)
        mode = FTM()
        with mode:
            x = torch.empty(2, 8)
            for _ in range(3):
                q(x, 0.1, 0, -128, 127, torch.int8)
        self.assertIsNone(mode.cache_policy)
        self.assertEqual(FTM.cache_info().bypasses.get("non-builtin", 0) - before, 3)
        self.assertEqual(info(mode.policy_cache_info()), {"hits": 0, "misses": 0, "bypasses": {}, "size": 0})

    def test_policy_admits_backend_op(self) -> None:
        """An admitted quantized_decomposed op hits in the mode's own storage, never in FakeTensorMode.cache."""
        FTM.cache_clear()
        mode = FTM(cache_policy=Policy())
        with mode:
            x = torch.empty(2, 8)
            outs = [q(x, 0.1, 0, -128, 127, torch.int8) for _ in range(3)]
        self.assertEqual(info(mode.policy_cache_info()), {"hits": 2, "misses": 1, "bypasses": {}, "size": 1})
        self.assertEqual([(o.shape, o.dtype) for o in outs], [((2, 8), torch.int8)] * 3)
        self.assertFalse(any(getattr(k.key[0], "namespace", None) == "quantized_decomposed" for k in list(FTM.cache)))

    def test_decide_called_once_per_dispatch(self) -> None:
        """decide() is asked once per dispatch: on misses, hits and bypasses alike."""
        policy = Policy(deny={torch.ops.aten.mul.Tensor})
        with FTM(cache_policy=policy):
            x = torch.empty(3, 5)
            policy.decided.clear()
            for _ in range(3):
                q(x, 0.1, 0, -128, 127, torch.int8)
                x + x
                x * x
        self.assertEqual(policy.decided, [q, torch.ops.aten.add.Tensor, torch.ops.aten.mul.Tensor] * 3)

    def test_denied_builtin_never_reaches_shared_cache(self) -> None:
        """A builtin op the policy rejects bypasses before lookup and writes nothing to FakeTensorMode.cache."""
        add = torch.ops.aten.add.Tensor
        mode = FTM(cache_policy=Policy(deny={add}))
        with mode:
            x = torch.empty(3, 7)
            size = len(FTM.cache)
            add(x, x)
            add(x, x)
            self.assertEqual(len(FTM.cache), size)
        self.assertEqual(mode.policy_cache_info().bypasses, {"denied by policy": 2})

    def test_admitted_builtin_takes_stock_path(self) -> None:
        """A builtin op the policy admits is counted and stored as stock would."""
        mode = FTM(cache_policy=Policy())
        with mode:
            x = torch.empty(3, 9)
            FTM.cache_clear()
            x + x
            x + x
        self.assertEqual((FTM.cache_info().hits, FTM.cache_info().misses), (1, 1))
        self.assertEqual(info(mode.policy_cache_info())["size"], 0)

    def test_policy_cache_clear(self) -> None:
        """policy_cache_clear() empties this mode's policy entries and counters."""
        mode, _ = self.call("scaled", 1.0)
        self.assertEqual(mode.policy_cache_info().size, 1)
        mode.policy_cache_clear()
        self.assertEqual(info(mode.policy_cache_info()), {"hits": 0, "misses": 0, "bypasses": {}, "size": 0})

    def test_cachepolicy_fits_the_protocol(self) -> None:
        """torch_cachepolicy.CachePolicy can be passed as the native cache_policy."""
        tcp = import_prototype()

        mode = FTM(cache_policy=tcp.CachePolicy(namespaces=["quantized_decomposed"]))
        with mode:
            x = torch.empty(2, 8)
            for _ in range(3):
                q(x, 0.1, 0, -128, 127, torch.int8)
        self.assertEqual((mode.policy_cache_info().hits, mode.policy_cache_info().misses), (2, 1))

    # --------------------------------------------------------- schema checks

    def test_mutable_schema_bypasses_unless_explicit(self) -> None:
        """A Tensor(a!) op bypasses (its kernel runs every time), unless the policy allowed it by name."""
        mode, _ = self.call("mut")
        self.assertEqual(mode.policy_cache_info().bypasses, {"mutable schema": 2})
        self.assertEqual(calls["mut"], 2)
        explicit, _ = self.call("mut", n=3, policy=Policy(allow={op("mut")}))
        self.assertEqual((explicit.policy_cache_info().hits, explicit.policy_cache_info().misses), (2, 1))

    def test_view_with_several_tensor_args_bypasses(self) -> None:
        """A view schema with two tensor args bypasses instead of raising AssertionError."""
        x = torch.empty(4, 4)
        mode = FTM(cache_policy=Policy())
        with mode:
            x = torch.empty(4, 4)
            op("multi_view")(x, x)
            op("multi_view")(x, x)
        self.assertEqual(mode.policy_cache_info().bypasses, {"view op with several tensor args": 2})

    def test_owner_tags_bind_under_a_policy(self) -> None:
        """An admitted backend op its owner tagged dynamic_output_shape bypasses with stock's reason."""
        mode, _ = self.call("tagged", n=3)
        self.assertEqual(mode.policy_cache_info().bypasses, {"dynamic output shape": 3})
        self.assertEqual(calls["tagged"], 3)

    # --------------------------------------------------------- output checks

    def test_unbacked_scalar_output_bypasses(self) -> None:
        """A bare SymInt output with a fresh unbacked symbol is never replayed."""
        mode, outs = self.call("dyn", shape_env=ShapeEnv())
        self.assertEqual(mode.policy_cache_info().bypasses, {"unrepresented symbol in output": 2})
        self.assertNotEqual(str(outs[0]), str(outs[1]))

    def test_undeclared_alias_bypasses(self) -> None:
        """An output sharing an input's storage without an alias annotation bypasses and stays aliased."""
        mode = FTM(cache_policy=Policy())
        with mode:
            x = torch.empty(4, 4)
            outs = [op("bad_view")(x) for _ in range(2)]
        self.assertEqual(mode.policy_cache_info().bypasses, {"output aliases an undeclared input": 2})
        self.assertEqual([storage(o) == storage(x) for o in outs], [True, True])

    def test_declared_view_is_cached(self) -> None:
        """A Tensor(a) -> Tensor(a) backend view hits and the hit still aliases its input."""
        mode = FTM(cache_policy=Policy())
        with mode:
            x = torch.empty(4, 4)
            outs = [op("good_view")(x) for _ in range(3)]
        self.assertEqual((mode.policy_cache_info().hits, mode.policy_cache_info().misses), (2, 1))
        self.assertEqual([storage(o) == storage(x) for o in outs], [True, True, True])

    def test_outputs_aliasing_each_other_bypass(self) -> None:
        """Two outputs sharing one storage bypass, so a hit cannot split them."""
        mode, outs = self.call("twins")
        self.assertEqual(mode.policy_cache_info().bypasses, {"outputs alias each other": 2})
        self.assertEqual([storage(a) == storage(b) for a, b in outs], [True, True])

    def test_output_storage_offset_bypasses(self) -> None:
        """A fresh output at a storage offset bypasses: a hit would synthesize it at offset 0."""
        mode, outs = self.call("offset")
        self.assertEqual(mode.policy_cache_info().bypasses, {"a hit would differ in storage_offset": 2})
        self.assertEqual([o.storage_offset() for o in outs], [2, 2])

    def test_output_storage_size_bypasses(self) -> None:
        """A fresh output on a storage larger than it needs bypasses: a hit would size the storage to fit."""
        mode, outs = self.call("roomy")
        self.assertEqual(mode.policy_cache_info().bypasses, {"a hit would differ in storage size": 2})
        self.assertEqual([o.untyped_storage().nbytes() for o in outs], [72, 72])

    def test_sparse_output_bypasses(self) -> None:
        """A sparse output bypasses with the stock reason (the stock checks run first)."""
        mode, outs = self.call("sparse")
        self.assertEqual(mode.policy_cache_info().bypasses, {"sparse output": 2})
        self.assertEqual([o.layout for o in outs], [torch.sparse_coo] * 2)

    def test_input_metadata_mutation_bypasses(self) -> None:
        """A kernel that changes an input's metadata (unsqueeze_) under a functional schema bypasses."""
        mode = FTM(cache_policy=Policy())
        shapes = []
        with mode:
            for _ in range(2):
                x = torch.empty(3)
                op("unsqueezes")(x)
                shapes.append(tuple(x.shape))
        self.assertEqual(mode.policy_cache_info().bypasses, {"fake kernel changed an input's metadata": 2})
        self.assertEqual(shapes, [(1, 3), (1, 3)])

    # ------------------------------------------------------------- the key

    def test_signed_zero_is_keyed(self) -> None:
        """0.0 and -0.0 (equal, same hash) get separate entries."""
        mode = FTM(cache_policy=Policy())
        with mode:
            x = torch.empty(2)
            shapes = [tuple(op("signed")(x, s).shape) for s in (0.0, -0.0, 0.0, -0.0)]
        self.assertEqual(shapes, [(1,), (2,), (1,), (2,)])
        self.assertEqual((mode.policy_cache_info().hits, mode.policy_cache_info().misses), (2, 2))

    def test_nan_argument_bypasses(self) -> None:
        """A NaN argument bypasses before anything is stored (NaN != NaN would add an entry per call)."""
        mode = FTM(cache_policy=Policy())
        calls.pop("scaled", None)
        with mode:
            x = torch.empty(2)
            for _ in range(3):
                op("scaled")(x, float("nan"))
        self.assertEqual(mode.policy_cache_info().bypasses, {"NaN argument": 3})
        self.assertEqual((mode.policy_cache_info().size, calls["scaled"]), (0, 3))

    def test_aliased_tensor_arguments_are_keyed(self) -> None:
        """The same tensor twice, two tensors sharing a storage, and two unrelated ones get separate entries."""
        mode = FTM(cache_policy=Policy())
        with mode:
            x, y = torch.empty(4), torch.empty(4)
            shapes = [tuple(op("pair")(x, b).shape) for b in (x, x[:], y, x, x[:], y)]
        self.assertEqual(shapes, [(1,), (2,), (3,)] * 2)
        self.assertEqual((mode.policy_cache_info().hits, mode.policy_cache_info().misses), (3, 3))

    def test_context_key_partitions_entries(self) -> None:
        """A context_key() change selects another partition; going back hits the old one."""
        mode = FTM(cache_policy=Policy(context=lambda: ambient["dtype"]))
        calls.pop("ambient_cast", None)
        dtypes = []
        try:
            with mode:
                x = torch.empty(2)
                for dtype in (torch.float32, torch.float32, torch.float16, torch.float16, torch.float32):
                    ambient["dtype"] = dtype
                    dtypes.append(op("ambient_cast")(x).dtype)
        finally:
            ambient["dtype"] = torch.float32
        self.assertEqual(dtypes, [torch.float32] * 2 + [torch.float16] * 2 + [torch.float32])
        self.assertEqual(
            (mode.policy_cache_info().hits, mode.policy_cache_info().misses, calls["ambient_cast"]), (3, 2, 2)
        )

    # ------------------------------------------------- kernel re-registration

    def test_reregistered_fake_impl(self) -> None:
        """Re-registering the fake impl (register_fake) of an overload selects a fresh partition."""
        fragment = torch.library.Library("tcp_upstream", "FRAGMENT")
        mode = FTM(cache_policy=Policy())
        with mode:
            x = torch.empty(4, 4)
            shapes = [tuple(op("swap", "ovl")(x).shape)]
            torch.library.register_fake("tcp_upstream::swap.ovl", lambda x: x.new_empty(7), lib=fragment)
            shapes += [tuple(op("swap", "ovl")(x).shape) for _ in range(2)]
        fragment._destroy()
        self.assertEqual(shapes, [(4, 4), (7,), (7,)])
        self.assertEqual((mode.policy_cache_info().hits, mode.policy_cache_info().misses), (1, 2))

    def test_reregistered_custom_op_fake(self) -> None:
        """A custom_op's register_fake (one fixed registered wrapper, a new function behind it) is seen."""
        mode = FTM(cache_policy=Policy())
        with mode:
            x = torch.empty(3)
            shapes = [tuple(co(x).shape)]
            co.register_fake(lambda x: x.new_empty(5))
            shapes += [tuple(co(x).shape) for _ in range(2)]
        co.register_fake(lambda x: x.new_empty(x.shape))
        self.assertEqual(shapes, [(3,), (5,), (5,)])
        self.assertEqual((mode.policy_cache_info().hits, mode.policy_cache_info().misses), (1, 2))

    def test_reregistered_meta_kernel(self) -> None:
        """Overriding a dispatcher Meta kernel (Library.impl) is seen, and so is its removal."""
        mode = FTM(cache_policy=Policy())
        fragment = torch.library.Library("tcp_upstream", "FRAGMENT")
        with mode:
            x = torch.empty(3)
            shapes = [tuple(op("meta_swap")(x).shape)]
            fragment.impl("meta_swap", lambda x: x.new_empty(7), "Meta")
            shapes += [tuple(op("meta_swap")(x).shape) for _ in range(2)]
            fragment._destroy()
            lib.impl("meta_swap", lambda x: x.new_empty(x.shape), "Meta")
            shapes.append(tuple(op("meta_swap")(x).shape))
        self.assertEqual(shapes, [(3,), (7,), (7,), (3,)])
        self.assertEqual(mode.policy_cache_info().hits, 1)

    # ---------------------------------------------------- higher-order ops

    def _invoke_subgraph_dtypes(self, mode: Any) -> list[torch.dtype]:
        def f(x: torch.Tensor) -> torch.Tensor:
            return op("ambient_cast")(x) + 1

        gm = torch.fx.symbolic_trace(f)
        dtypes = []
        try:
            with mode:
                x = torch.empty(3)
                for dtype in (torch.float32, torch.float16):
                    ambient["dtype"] = dtype
                    out = invoke_subgraph(gm, "tcp_sub", x)
                    dtypes.append((out[0] if isinstance(out, (tuple, list)) else out).dtype)
        finally:
            ambient["dtype"] = torch.float32
        return dtypes

    def test_hop_bypasses_under_policy_context(self) -> None:
        """With a context_key, invoke_subgraph bypasses: its entry would replay a context-dependent kernel."""
        mode = FTM(cache_policy=Policy(context=lambda: ambient["dtype"]))
        self.assertEqual(self._invoke_subgraph_dtypes(mode), [torch.float32, torch.float16])
        self.assertEqual(mode.policy_cache_info().bypasses.get("higher-order op under a policy context"), 2)

    def test_hop_takes_stock_path_without_context(self) -> None:
        """Without a context_key, invoke_subgraph is cached by the stock path, as without a policy."""
        FTM.cache_clear()
        mode = FTM(cache_policy=Policy())
        self._invoke_subgraph_dtypes(mode)
        self.assertGreaterEqual(FTM.cache_info().hits, 1)
        self.assertNotIn("higher-order op under a policy context", mode.policy_cache_info().bypasses)


def probe(names: Sequence[str]) -> dict[str, str]:
    """Runs the named TestCase classes; maps each test id to "ok" or its failure."""
    suite = unittest.TestSuite(unittest.defaultTestLoader.loadTestsFromTestCase(globals()[n]) for n in names)
    outcome = {t.id().split(".", 1)[1]: "ok" for t in _tests(suite)}
    result = unittest.TestResult()
    suite.run(result)
    for test, trace in result.failures + result.errors:
        outcome[test.id().split(".", 1)[1]] = trace
    for test, why in result.skipped:
        outcome[test.id().split(".", 1)[1]] = "skipped: " + why
    return outcome


def _tests(suite: unittest.TestSuite) -> list[unittest.TestCase]:
    out: list[unittest.TestCase] = []
    for t in suite:
        out.extend(_tests(t) if isinstance(t, unittest.TestSuite) else [t])  # type: ignore[list-item]
    return out


def workload() -> list[Any]:
    """Stock counters and outputs of a fixed workload, without a policy."""
    FTM.cache_clear()
    log: list[Any] = []
    for mode in (FTM(), FTM(shape_env=ShapeEnv())):
        dynamic: StatelessSymbolicContext[..., Any] | None = (
            StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC] * 2) if mode.shape_env else None
        )
        x = mode.from_tensor(torch.empty(3, 4), symbolic_context=dynamic)
        with mode:
            for _ in range(3):
                y = x + x
                y.add_(1)
                v = y.view(-1)
                z = q(y, 0.1, 0, -128, 127, torch.int8)
                n = torch.ops.aten.nonzero.default(y) if mode.shape_env else y.sum()
                s = op("scaled")(y, -0.0)
                log.append([str(t.shape) for t in (y, v, z, n, s)] + [str(z.dtype)])
        log.append(str(len(mode.shape_env.fake_tensor_cache) if mode.shape_env else None))
    stats = FTM.cache_info()
    return [stats.hits, stats.misses, dict(sorted(stats.bypasses.items())), stats.size, log]


def main(argv: Sequence[str]) -> None:
    if argv[:1] == ["probe"] and len(argv) > 1:
        print("PROBE-RESULT " + json.dumps(probe(argv[1:])))
    elif argv == ["workload"]:
        print("WORKLOAD-RESULT " + json.dumps(workload()))
    else:
        raise SystemExit(f"usage: {sys.argv[0]} probe TestClass... | workload")


if __name__ == "__main__":
    main(sys.argv[1:])
