# Owner(s): ["module: fakeTensor"]
"""Drop-in fidelity: the policy mode dispatches as stock wherever it does not cache, and an entry answers for the
kernel stock would actually run.

Each test compares the policy mode with stock ``FakeTensorMode`` on the same call sequence (stock does not cache
backend ops, so it is the uncached reference for them): rules registered for the ``FakeTensorMode`` class, the
Python dispatcher's choice of kernels, copies of modes and their tensors, and everything a fake kernel can change
or read that the key does not hold (Note [The kernel in effect], Note [Arguments the key cannot see]).
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import pickle
import re
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

import cachepolicy_testing as testing
import torch
from torch._dispatch.python import enable_python_dispatcher
from torch._higher_order_ops.invoke_subgraph import invoke_subgraph
from torch._opaque_base import OpaqueBase
from torch._subclasses import fake_impls
from torch._subclasses.fake_tensor import FakeTensor, UnsupportedOperatorException
from torch._subclasses.fake_tensor import FakeTensorMode as StockMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.experimental.symbolic_shapes import ShapeEnv
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
)

import torch_cachepolicy as tcp
from torch_cachepolicy import _compat, _kernels, _reasons
from torch_cachepolicy import store as store_module

NS = "tcp_fidelity"
FID = testing.CountedOps(NS)
calls = FID.calls


@FID.define("plain(Tensor x) -> Tensor")
def _plain(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape)


# A real kernel too: with propagate_real_tensors, stock runs it beside the fake one.
FID.lib.impl("plain", lambda x: x.clone(), "CPU")


@FID.define("ruled(Tensor x) -> Tensor")
def _ruled(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape)


@FID.define("inner(Tensor x) -> Tensor")
def _inner(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape)


@FID.define("outer(Tensor x) -> Tensor")
def _outer(x: torch.Tensor) -> torch.Tensor:
    return torch.ops.tcp_fidelity.inner(x).new_empty(x.shape)


# Ops inside a fake kernel run below autograd, so in-place ops there move no version counter;
# torch.autograd.graph.increment_version does.
@FID.define("bumps_version(Tensor x) -> Tensor")
def _bumps_version(x: torch.Tensor) -> torch.Tensor:
    torch.autograd.graph.increment_version(x)
    return x.new_empty(x.shape)


@FID.define("bumps_output_version(Tensor x) -> Tensor")
def _bumps_output_version(x: torch.Tensor) -> torch.Tensor:
    out = x.new_empty(x.shape)
    torch.autograd.graph.increment_version(out)
    return out


@FID.define("hooks_input(Tensor x) -> Tensor")
def _hooks_input(x: torch.Tensor) -> torch.Tensor:
    if x.requires_grad:
        x.register_hook(lambda grad: grad)
    return x.new_empty(x.shape)


@FID.define("logs_on_input(Tensor x) -> Tensor")
def _logs_on_input(x: torch.Tensor) -> torch.Tensor:
    log = getattr(x, "log", None)
    if log is not None:
        log.append("seen")  # a list the caller keeps on the tensor: the same object, new contents
    return x.new_empty(x.shape)


@FID.define("grows_list(Tensor x, int[] sizes) -> Tensor")
def _grows_list(x: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    sizes.append(len(sizes))  # the dispatcher's copy of the caller's list
    return x.new_empty(sizes)


@FID.define("makes_symbol(Tensor x) -> Tensor")
def _makes_symbol(x: torch.Tensor) -> torch.Tensor:
    torch.library.get_ctx().new_dynamic_size()  # a fresh unbacked symbol, discarded
    return x.new_empty(x.shape)


@FID.define("seeded(Tensor x, Generator? g) -> Tensor")
def _seeded(x: torch.Tensor, g: torch.Generator | None) -> torch.Tensor:
    return x.new_empty(1 + (0 if g is None else g.initial_seed() % 5))


# Ops without a fake impl: fake dispatch runs the dispatcher's kernel for the fake tensor's keys.
FID.lib.define("meta_only(Tensor x) -> Tensor")
FID.lib.impl("meta_only", FID.counted("meta_only", lambda x: x.new_empty(x.shape)), "Meta")
FID.lib.define("composite(Tensor x) -> Tensor")
FID.lib.impl(
    "composite", FID.counted("composite", lambda x: x.new_empty(x.shape)), "CompositeExplicitAutograd"
)

class OpaqueSize(OpaqueBase):
    """A reference-typed opaque object: a size its holder may change."""

    __module__ = "tcp_fidelity_opaque"

    def __init__(self, n: int) -> None:
        self.n = n


plain = torch.ops.tcp_fidelity.plain.default
ruled = torch.ops.tcp_fidelity.ruled.default
inner = torch.ops.tcp_fidelity.inner.default
outer = torch.ops.tcp_fidelity.outer.default
meta_only = torch.ops.tcp_fidelity.meta_only.default
composite = torch.ops.tcp_fidelity.composite.default


def policy() -> tcp.CachePolicy:
    return tcp.CachePolicy(namespaces=[NS])


described = testing.described


@contextmanager
def scoped_library(ns: str = NS) -> Iterator[torch.library.Library]:
    """A FRAGMENT library whose registrations are undone on exit."""
    lib = torch.library.Library(ns, "FRAGMENT")
    try:
        yield lib
    finally:
        lib._destroy()


class FidelityTestCase(testing.CachePolicyTestCase):
    def setUp(self) -> None:
        super().setUp()
        calls.clear()

    def run_both(
        self, sequence: Callable[[Any], list[object]], mode_kwargs: Callable[[], dict[str, Any]] = dict
    ) -> tuple[list[object], Any]:
        """Runs ``sequence(mode)`` under stock and under a policy mode, each made with ``mode_kwargs()``;
        returns the policy mode's results and the mode."""
        stock = sequence(StockMode(**mode_kwargs()))
        mode = tcp.FakeTensorMode(cache_policy=policy(), **mode_kwargs())
        ours = sequence(mode)
        self.assertEqual(ours, stock)
        return ours, mode

    def assertBypassed(self, mode: tcp.FakeTensorMode, op: object, reason: str) -> None:
        report = mode.cache_report()[op]
        self.assertEqual(report.hits, 0, msg=str(mode.cache_report()))
        self.assertIn(reason, report.bypasses, msg=str(mode.cache_report()))


class TestRulesForFakeTensorMode(FidelityTestCase):
    """Rules registered for stock's FakeTensorMode class apply to the subclass, in stock's order."""

    @parametrize("with_policy", [False, True])
    @parametrize("python_dispatcher", [False, True])
    def test_register_torch_dispatch_rule(self, with_policy: bool, python_dispatcher: bool) -> None:
        """A register_torch_dispatch rule for FakeTensorMode replaces the fake kernel under the subclass too."""
        def rule(mode: Any, func: Any, types: Any, args: Any, kwargs: Any) -> torch.Tensor:
            calls["rule"] += 1
            return mode.from_tensor(torch.empty(3, dtype=torch.int8))

        def run(mode: Any) -> list[object]:
            with mode, (enable_python_dispatcher() if python_dispatcher else contextlib_null()):
                x = torch.empty(2)
                return [described(ruled(x)) for _ in range(3)]

        with scoped_library() as lib:
            torch.library.register_torch_dispatch(ruled, StockMode, rule, lib=lib)
            stock = run(StockMode())
            mode = tcp.FakeTensorMode(cache_policy=policy() if with_policy else None)
            self.assertEqual(run(mode), stock)
        self.assertEqual(stock[0], (torch.int8, (3,), (1,), 0))
        self.assertEqual(calls["rule"], 6)  # three calls each; the rule is never cached, as under stock
        self.assertEqual(calls["ruled"], 0)

    def test_rule_for_an_aten_op(self) -> None:
        """A rule for an aten op applies before the (shared) aten cache, as under stock."""
        def rule(mode: Any, func: Any, types: Any, args: Any, kwargs: Any) -> torch.Tensor:
            return mode.from_tensor(torch.empty(7))

        def run(mode: Any) -> list[object]:
            with mode:
                x = torch.empty(testing.fresh_size())
                return [described(torch.ops.aten.erfinv.default(x)) for _ in range(2)]

        with scoped_library("aten") as lib:
            torch.library.register_torch_dispatch(torch.ops.aten.erfinv.default, StockMode, rule, lib=lib)
            ours, _ = self.run_both(run)
        self.assertEqual(ours[0], (torch.float32, (7,), (1,), 0))

    def test_python_dispatcher_rule_comes_first(self) -> None:
        """Under the Python dispatcher a py_impl(FakeTensorMode) rule beats a register_torch_dispatch rule, as in stock."""
        FID.lib.define("both_rules(Tensor x) -> Tensor")
        torch.library.register_fake(f"{NS}::both_rules", lambda x: x.new_empty(1), lib=FID.lib)
        op = torch.ops.tcp_fidelity.both_rules.default
        op.py_impl(StockMode)(lambda mode, x: mode.from_tensor(torch.empty(5)))
        torch.library.register_torch_dispatch(
            op, StockMode, lambda mode, func, types, args, kwargs: mode.from_tensor(torch.empty(9)), lib=FID.lib
        )

        def run(mode: Any) -> list[object]:
            out = []
            with mode:
                x = torch.empty(2)
                out.append(described(op(x)))
                with enable_python_dispatcher():
                    out.append(described(op(x)))
            return out

        ours, _ = self.run_both(run)
        self.assertEqual([o[1] for o in ours], [(9,), (5,)])  # type: ignore[index]

    def test_rule_registered_later_reaches_enclosing_entries(self) -> None:
        """A kernel that dispatches a backend op is run on every call, so a rule registered for that op later
        reaches it (Note [Entries cover inner ops])."""
        def run(mode: Any, lib: torch.library.Library) -> list[object]:
            out = []
            with mode:
                x = torch.empty(2)
                out.append(described(outer(x)))
                out.append(described(outer(x)))
                torch.library.register_torch_dispatch(
                    inner, StockMode, lambda m, f, t, a, k: m.from_tensor(torch.empty(4, dtype=torch.int8)), lib=lib
                )
                out.append(described(outer(x)))
                lib._destroy()
                out.append(described(outer(x)))
            return out

        with scoped_library() as lib:
            stock = run(StockMode(), lib)
        with scoped_library() as lib:
            mode = tcp.FakeTensorMode(cache_policy=policy())
            self.assertEqual(run(mode, lib), stock)
        self.assertEqual((mode.cache_report()[outer].hits, mode.cache_report()[outer].misses), (0, 1))  # a first sight
        self.assertEqual(
            mode.cache_report()[outer].bypasses,
            {"its kernel dispatches a backend op or an op the policy denies (a hit would not run it)": 3},
        )


def contextlib_null() -> Any:
    import contextlib

    return contextlib.nullcontext()


class TestPythonDispatcher(FidelityTestCase):
    """Under the Python dispatcher py_impl kernels beat the dispatcher's; entries keep the two apart."""

    def test_entry_made_under_the_python_dispatcher_is_not_served_without(self) -> None:
        """A py_impl(Meta) kernel chosen under the Python dispatcher is not replayed once it is off, nor the reverse."""
        FID.lib.define("pd_meta(Tensor x) -> Tensor")
        FID.lib.impl("pd_meta", lambda x: x.new_empty(x.shape), "Meta")
        op = torch.ops.tcp_fidelity.pd_meta.default
        op.py_impl(torch._C.DispatchKey.Meta)(lambda x: x.new_empty(x.shape, dtype=torch.float64))

        def run(mode: Any) -> list[object]:
            out = []
            with mode:
                x = torch.empty(2)
                for on in (True, True, True, False, False, False, True):
                    with enable_python_dispatcher() if on else contextlib_null():
                        out.append(described(op(x)))
            return out

        ours, mode = self.run_both(run)
        self.assertEqual([o[0] for o in ours], [torch.float64] * 3 + [torch.float32] * 3 + [torch.float64])  # type: ignore[index]
        self.assertEqual(mode.cache_report()[op].hits, 3)  # each entry after its key's first sight and miss

    def test_without_py_impl_kernels_entries_serve_both(self) -> None:
        """An op with no py_impl kernel runs the same kernel either way: one entry serves calls with and without."""
        op = torch.ops.tcp_fidelity.plain.default
        self.assertFalse(op.py_kernels)

        def run(mode: Any) -> list[object]:
            out = []
            with mode:
                x = torch.empty(2, 3)
                for on in (True, False, True, False):
                    with enable_python_dispatcher() if on else contextlib_null():
                        out.append(described(op(x)))
            return out

        _, mode = self.run_both(run)
        # One key: its first sight (on), the miss making the entry (off), then hits either way.
        self.assertEqual((mode.cache_report()[op].hits, mode.cache_report()[op].misses), (2, 2))

    def test_py_impl_added_for_another_key_is_noticed(self) -> None:
        """A py_impl kernel added after the first calls, for a key an entry did not depend on before, starts afresh."""
        FID.lib.define("pd_late(Tensor x) -> Tensor")
        FID.lib.impl("pd_late", lambda x: x.new_empty(x.shape), "CompositeExplicitAutograd")
        op = torch.ops.tcp_fidelity.pd_late.default

        def never(x: torch.Tensor) -> torch.Tensor:
            raise AssertionError("fake tensors never reach the CUDA key")

        op.py_impl(torch._C.DispatchKey.CUDA)(never)  # a py_impl kernel from the start, for a key not reached

        def run(mode: Any, step: Callable[[], None]) -> list[object]:
            out = []
            with mode, enable_python_dispatcher():
                x = torch.empty(2)
                out += [described(op(x)), described(op(x))]
                step()
                out += [described(op(x)), described(op(x))]
            return out

        def add_py_impl() -> None:
            op.py_impl(torch._C.DispatchKey.CompositeExplicitAutograd)(
                lambda x: x.new_empty(x.shape, dtype=torch.int32)
            )

        stock = run(StockMode(), lambda: None)
        mode = tcp.FakeTensorMode(cache_policy=policy())
        ours = run(mode, add_py_impl)
        try:
            stock_after = run(StockMode(), lambda: None)
            self.assertEqual(ours[:2], stock[:2])
            self.assertEqual(ours[2:], stock_after[2:])
            self.assertEqual(ours[2][0], torch.int32)  # type: ignore[index]
        finally:
            op.py_kernels.pop(torch._C.DispatchKey.CompositeExplicitAutograd, None)
            op._dispatch_cache.clear()


class TestCopies(FidelityTestCase):
    """copy.deepcopy of modes, their FakeTensors and GraphModules holding them works as for stock."""

    def assertWorkingMode(self, mode: Any, original: tcp.FakeTensorMode) -> None:
        self.assertIsInstance(mode, tcp.FakeTensorMode)
        self.assertIsNot(mode, original)
        self.assertEqual(mode.cache_policy.identity, original.cache_policy.identity)
        self.assertIsNot(mode.cache_policy, original.cache_policy)
        with mode:
            x = torch.empty(2, 3)
            outs = [plain(x) for _ in range(3)]  # the first sight, the miss that makes the entry, a hit
        self.assertTrue(all(isinstance(o, FakeTensor) and o.fake_mode is mode for o in outs))
        self.assertEqual(mode.cache_report()[plain].hits, 1 + original.cache_report()[plain].hits)

    def filled_mode(self, **kwargs: Any) -> tcp.FakeTensorMode:
        mode = tcp.FakeTensorMode(cache_policy=policy(), **kwargs)
        with mode:
            x = torch.empty(2, 3)
            plain(x), plain(x), plain(x)  # an entry and a hit
        return mode

    def test_deepcopy_mode(self) -> None:
        """A deep copy is a working policy mode with copied counters, an independent policy and a fresh private store."""
        mode = self.filled_mode()
        clone = copy.deepcopy(mode)
        self.assertEqual(clone.cache_report(), mode.cache_report())
        self.assertIsNot(clone.cache_store, mode.cache_store)
        self.assertEqual(len(clone.cache_store), 0)
        self.assertWorkingMode(clone, mode)

    def test_deepcopy_fake_tensor(self) -> None:
        """A FakeTensor of a policy mode deep-copies with a copy of its mode, as stock's does."""
        mode = self.filled_mode()
        x = mode.from_tensor(torch.empty(4, 2))
        clone = copy.deepcopy(x)
        self.assertEqual(described(clone), described(x))
        self.assertWorkingMode(clone.fake_mode, mode)

    def test_deepcopy_graph_metadata(self) -> None:
        """A make_fx GraphModule of a policy mode deep-copies, and so does its node metadata, sharing one copied mode."""
        # Passes deep-copy node.meta, whose "val"s are FakeTensors of the mode.
        mode = self.filled_mode(allow_non_fake_inputs=True)
        with mode:
            gm = make_fx(lambda a: plain(a).relu())(torch.empty(2, 3))
        copy.deepcopy(gm)
        metas = copy.deepcopy([n.meta for n in gm.graph.nodes])
        vals = [m["val"] for m in metas if isinstance(m.get("val"), FakeTensor)]
        self.assertEqual(len(vals), 3)
        self.assertEqual(len({id(v.fake_mode) for v in vals}), 1)
        self.assertWorkingMode(vals[0].fake_mode, mode)

    def test_deepcopy_shares_a_store_passed_in(self) -> None:
        """A store the user passed stays shared with the copy; the copy hits on the original's entries."""
        store = tcp.CacheStore()
        mode = self.filled_mode(cache_store=store)
        clone = copy.deepcopy(mode)
        self.assertIs(clone.cache_store, store)
        with clone:
            plain(torch.empty(2, 3))
        self.assertEqual(clone.cache_report()[plain].hits, 2)

    def test_copy_shares_the_policy(self) -> None:
        """copy.copy shares the policy and the store and copies the counters."""
        mode = self.filled_mode()
        clone = copy.copy(mode)
        self.assertIs(clone.cache_policy, mode.cache_policy)
        self.assertIs(clone.cache_store, mode.cache_store)
        with clone:
            plain(torch.empty(2, 3))
        self.assertEqual(clone.cache_report()[plain].hits, 2)
        self.assertEqual(mode.cache_report()[plain].hits, 1)

    @parametrize("what", ["mode", "tensor"])
    def test_pickle_as_stock(self, what: str) -> None:
        """Pickling a policy mode or its FakeTensor fails exactly as pickling stock's does."""
        def error(mode: Any) -> tuple[str, str]:
            target = mode if what == "mode" else mode.from_tensor(torch.empty(2))
            with self.assertRaises(Exception) as ctx:
                pickle.dumps(target)
            return type(ctx.exception).__name__, str(ctx.exception)

        self.assertEqual(error(self.filled_mode()), error(StockMode()))

    @parametrize("what", ["symint", "shape_env", "mode", "graph_module"])
    def test_deepcopy_after_symbolic_backend_entries(self, what: str) -> None:
        """After symbolic backend dispatches (one whose kernel dispatches another backend op among them), a SymInt,
        the ShapeEnv, the mode and a GraphModule whose meta holds the mode deep-copy as stock's do; the ShapeEnv's
        copy holds none of the package's tables."""
        from torch.fx.experimental.symbolic_shapes import DimDynamic, StatelessSymbolicContext

        shape_env = ShapeEnv()
        mode = tcp.FakeTensorMode(cache_policy=policy(), shape_env=shape_env)
        x = mode.from_tensor(torch.empty(4, 3), symbolic_context=StatelessSymbolicContext([DimDynamic.DYNAMIC] * 2))
        with mode:
            for _ in range(2):
                plain(x), outer(x)
        self.assertGreater(len(shape_env.__dict__.get(store_module._SHAPE_ENV_ATTR, {})), 0)
        gm = torch.fx.GraphModule(torch.nn.Module(), torch.fx.Graph())
        gm.meta["fake_mode"] = mode
        target = {"symint": x.shape[0], "shape_env": shape_env, "mode": mode, "graph_module": gm}[what]
        clone = copy.deepcopy(target)
        if what == "shape_env":
            self.assertEqual(len(clone.__dict__[store_module._SHAPE_ENV_ATTR]), 0)
            self.assertEqual(len(shape_env.__dict__[store_module._SHAPE_ENV_ATTR]), 1)
        if what == "mode":
            self.assertEqual(len(clone.shape_env.__dict__.get(store_module._SHAPE_ENV_ATTR, {})), 0)
            with clone:
                y = clone.from_tensor(torch.empty(4, 3))
                self.assertEqual(described(plain(y)), described(plain(y)))

    def test_store_copies_start_empty(self) -> None:
        """copy, deepcopy and pickle of a CacheStore give an empty store of the same isolation."""
        store = self.filled_mode(cache_store=tcp.CacheStore(isolated=True)).cache_store
        self.assertGreater(len(store), 0)
        for clone in (copy.copy(store), copy.deepcopy(store), pickle.loads(pickle.dumps(store))):
            self.assertEqual((len(clone), clone.isolated), (0, True))


class TestWhatAKernelCanTouch(FidelityTestCase):
    """What a fake kernel changes about its arguments (or the ShapeEnv) is never skipped by a hit."""

    def test_input_version_counter(self) -> None:
        """A kernel that bumps an input's version counter runs on every call."""
        def run(mode: Any) -> list[object]:
            with mode:
                x = torch.empty(3)
                outs = [torch.ops.tcp_fidelity.bumps_version(x) for _ in range(3)]
                return [x._version, *[described(o) for o in outs]]

        _, mode = self.run_both(run)
        self.assertBypassed(mode, torch.ops.tcp_fidelity.bumps_version.default, "fake kernel changed an input's version")

    def test_output_version_counter(self) -> None:
        """An output the kernel modified in place keeps its version counter on every call."""
        def run(mode: Any) -> list[object]:
            with mode:
                x = torch.empty(3)
                return [o._version for o in (torch.ops.tcp_fidelity.bumps_output_version(x) for _ in range(3))]

        _, mode = self.run_both(run)
        self.assertBypassed(mode, torch.ops.tcp_fidelity.bumps_output_version.default, "a hit would differ in version")

    def test_hook_registered_on_an_input(self) -> None:
        """A kernel that registers a hook on an input runs on every call."""
        def run(mode: Any) -> list[object]:
            with mode:
                x = torch.empty(3, requires_grad=True)
                for _ in range(3):
                    torch.ops.tcp_fidelity.hooks_input(x)
                return [len(x._backward_hooks or {})]

        _, mode = self.run_both(run)
        self.assertBypassed(mode, torch.ops.tcp_fidelity.hooks_input.default, "fake kernel changed an input's hooks")

    def test_contents_of_an_attribute_changed(self) -> None:
        """A kernel appending to a list kept as an attribute of its input runs on every call."""
        def run(mode: Any) -> list[object]:
            with mode:
                x = torch.empty(3)
                x.log = []  # type: ignore[attr-defined]
                for _ in range(3):
                    torch.ops.tcp_fidelity.logs_on_input(x)
                return [len(x.log)]  # type: ignore[attr-defined]

        _, mode = self.run_both(run)
        self.assertBypassed(
            mode, torch.ops.tcp_fidelity.logs_on_input.default, "fake kernel changed an input's python attributes"
        )

    def test_symbol_created_on_symbolic_inputs(self) -> None:
        """A kernel that creates and drops an unbacked symbol runs on every call, also when its inputs hold symbols."""
        def run(mode: Any) -> list[object]:
            with mode:
                x = mode.from_tensor(torch.empty(3))  # symbolic: the mode has a ShapeEnv
                for _ in range(3):
                    torch.ops.tcp_fidelity.makes_symbol(x)
            return [str(mode.shape_env.create_unbacked_symint())]

        _, mode = self.run_both(run, lambda: {"shape_env": ShapeEnv()})
        self.assertBypassed(mode, torch.ops.tcp_fidelity.makes_symbol.default, "fake kernel changed the ShapeEnv")

    def test_list_argument_mutated(self) -> None:
        """A kernel appending to a list argument changes its own copy: the caller's list, and hits, are as stock."""
        def run(mode: Any) -> list[object]:
            out = []
            with mode:
                x = torch.empty(3)
                for _ in range(3):
                    sizes = [2]
                    out += [described(torch.ops.tcp_fidelity.grows_list(x, sizes)), list(sizes)]
            return out

        ours, mode = self.run_both(run)
        self.assertEqual(ours[1], [2])
        self.assertEqual(mode.cache_report()[torch.ops.tcp_fidelity.grows_list.default].hits, 1)  # the third call

    def test_shape_env_changed_on_static_inputs(self) -> None:
        """A kernel that creates a symbol from static inputs runs on every call: later symbols keep stock's names."""
        def run(mode: Any) -> list[object]:
            with mode:
                x = torch.empty(3)
                for _ in range(3):
                    torch.ops.tcp_fidelity.makes_symbol(x)
            return [str(mode.shape_env.create_unbacked_symint())]

        _, mode = self.run_both(run, lambda: {"shape_env": ShapeEnv()})
        self.assertBypassed(mode, torch.ops.tcp_fidelity.makes_symbol.default, "fake kernel changed the ShapeEnv")

    def test_argument_the_key_cannot_see(self) -> None:
        """A Generator argument, keyed by identity, bypasses: a kernel may read its state."""
        op = torch.ops.tcp_fidelity.seeded.default

        def run(mode: Any) -> list[object]:
            g = torch.Generator()
            out = []
            with mode:
                x = torch.empty(3)
                for seed in (1, 1, 3, None):
                    if seed is not None:
                        g.manual_seed(seed)
                    out.append(described(op(x, g if seed is not None else None)))
            return out

        _, mode = self.run_both(run)
        self.assertEqual(mode.cache_report()[op].bypasses, {
            "argument of type Generator whose content the key cannot see "
            "(CachePolicy(immutable_types=[...]) declares it immutable)": 3,
        })
        self.assertEqual(mode.cache_report()[op].misses, 1)  # g=None is visible

    @parametrize("held_by", ["operand", "subgraph"])
    def test_invoke_subgraph_around_an_op_reading_its_generator_is_not_replayed(self, held_by: str) -> None:
        """An op bypassing for an argument the key cannot see keeps invoke_subgraph around it from being cached."""
        op = torch.ops.tcp_fidelity.seeded.default
        g = torch.Generator()
        if held_by == "operand":
            gm = torch.fx.symbolic_trace(lambda a, gen: (op(a, gen),))
            operands: tuple[object, ...] = (g,)
        else:  # the subgraph holds the Generator (get_attr): the HOP's key cannot see it at all
            root = torch.nn.Module()
            root.g = g
            graph = torch.fx.Graph()
            a = graph.placeholder("a")
            graph.output((graph.call_function(op, (a, graph.get_attr("g"))),))
            gm = torch.fx.GraphModule(root, graph)
            operands = ()
        seen = []
        for cache in (True, False):
            mode = tcp.FakeTensorMode(cache_policy=policy())
            mode.cache_enabled = cache
            sizes = []
            with mode:
                x = torch.empty(2)
                for seed in (1, 1, 2, 2, 1):
                    g.manual_seed(seed)
                    sizes.append(invoke_subgraph(gm, "seeded", x, *operands)[0].shape[0])
            seen.append(sizes)
        # Before the fix: cached [2, 2, 2, 2, 2] (4 invoke_subgraph hits), uncached [2, 2, 3, 3, 2].
        self.assertEqual(seen[0], seen[1])

    @parametrize("held", ["script object", "opaque reference", "recompiled body"])
    def test_invoke_subgraph_operand_that_changes_behind_its_identity(self, held: str) -> None:
        """An invoke_subgraph operand whose content changes while its identity stays (a FakeScriptObject, a
        reference-typed opaque object, the body rewritten in place and recompiled) gives what an uncached dispatch
        gives, under the default policy (Note [Higher-order ops bypass])."""
        from torch._library.fake_class_registry import FakeScriptObject
        from torch._library.opaque_object import is_opaque_type, register_opaque_type

        if not is_opaque_type(OpaqueSize):  # registration is never undone: once per process
            register_opaque_type(OpaqueSize, typ="reference")

        def run(mode: Any) -> list[tuple[int, ...]]:
            state = OpaqueSize(2)
            operand: tuple[object, ...] = ()
            if held == "script object":
                operand = (FakeScriptObject(state, "__torch__.torch.classes.tcp.Thing", None),)
                body = torch.fx.symbolic_trace(lambda a, o: (a.new_empty(o.wrapped_obj.n),))
            elif held == "opaque reference":
                operand = (state,)
                body = torch.fx.symbolic_trace(lambda a, o: (a.new_empty(o.n),))
            else:
                body = torch.fx.symbolic_trace(lambda a: (a.new_empty(3),))
            x = mode.from_tensor(torch.empty(3))
            shapes = []
            with mode:
                for n in (2, 5, 7):
                    state.n = n
                    if held == "recompiled body" and n == 5:
                        (node,) = (nd for nd in body.graph.nodes if nd.op == "call_method")
                        node.args = (node.args[0], 6)
                        body.recompile()
                    shapes.append(tuple(invoke_subgraph(body, "body", x, *operand)[0].shape))
            return shapes

        uncached = StockMode()
        uncached.cache_enabled = False
        expected = run(uncached)
        self.assertEqual(expected, [(3,), (6,), (6,)] if held == "recompiled body" else [(2,), (5,), (7,)])
        self.assertEqual(run(tcp.FakeTensorMode()), expected)

    def test_argument_declared_immutable(self) -> None:
        """A type the policy declares immutable is keyed by the object, and served from the cache."""
        op = torch.ops.tcp_fidelity.seeded.default
        mode = tcp.FakeTensorMode(cache_policy=tcp.CachePolicy(namespaces=[NS], immutable_types=[torch.Generator]))
        g = torch.Generator()
        with mode:
            x = torch.empty(3)
            op(x, g), op(x, g), op(x, g)
        self.assertEqual((mode.cache_report()[op].misses, mode.cache_report()[op].hits), (2, 1))

    def test_propagate_real_tensors(self) -> None:
        """With propagate_real_tensors a backend op is dispatched uncached (real kernels may replace its output)."""
        # Crosscheck off: set after construction, propagate_real_tensors leaves aten ops cached (stock's mode too; made
        # with it, stock caches nothing), and their hits carry no real tensor, which a crosscheck reports.
        mode = tcp.FakeTensorMode(cache_policy=policy(), cache_crosscheck=False)
        mode.propagate_real_tensors = True
        with mode:
            x = torch.empty(2)
            plain(x), plain(x)
        self.assertEqual(mode.cache_report()[plain].bypasses, {"propagate_real_tensors": 2})

    def test_custom_ops_profile(self) -> None:
        """A custom-ops profile covering an op replaces its fake kernel: that op bypasses while it is active."""
        @dataclasses.dataclass
        class Profile:
            data: dict[object, object]

            def generic_fake_kernel(self, func: Any, mode: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
                return mode.from_tensor(torch.empty(6, dtype=torch.int16))

        def run(mode: Any) -> list[object]:
            out = []
            with mode:
                x = torch.empty(2)
                out += [described(plain(x)), described(plain(x))]  # the first sight, the miss that makes the entry
                with torch._dynamo.config.patch(_custom_ops_profile=Profile({plain: None})):
                    out += [described(plain(x)), described(plain(x))]
                out.append(described(plain(x)))
            return out

        ours, mode = self.run_both(run)
        self.assertEqual(ours[2], (torch.int16, (6,), (1,), 0))
        self.assertEqual(mode.cache_report()[plain].bypasses, {_reasons.PROFILED: 2})
        self.assertEqual(mode.cache_report()[plain].hits, 1)

    def test_op_impl_registered_later(self) -> None:
        """An implementation registered with fake_impls.register_op_impl after the first calls is used at once."""
        def run(mode: Any, step: Callable[[], None]) -> list[object]:
            out = []
            with mode:
                x = torch.empty(2)
                out += [described(meta_only(x)), described(meta_only(x))]
                step()
                out += [described(meta_only(x)), described(meta_only(x))]
            return out

        def register() -> None:
            fake_impls.register_op_impl(meta_only)(
                lambda fake_mode, func, x: fake_mode.from_tensor(torch.empty(8, dtype=torch.int64))
            )

        try:
            stock = run(StockMode(), register)
            fake_impls._deregister_op_impl(meta_only)
            ours = run(tcp.FakeTensorMode(cache_policy=policy()), register)
        finally:
            fake_impls._deregister_op_impl(meta_only)
        self.assertEqual(ours, stock)
        self.assertEqual(ours[2], (torch.int64, (8,), (1,), 0))

    def test_fallback_kernels_setting_of_a_shared_store(self) -> None:
        """Where stock may run a real kernel, a mode that forbids it does not hit on an entry made by one that allows it."""
        lib = torch.library.Library("torchtext", "FRAGMENT")
        try:
            lib.define("tcp_fallback(Tensor x) -> Tensor")

            def meta(x: torch.Tensor) -> torch.Tensor:
                raise NotImplementedError("no meta")

            lib.impl("tcp_fallback", meta, "Meta")
            lib.impl("tcp_fallback", lambda x: x.clone(), "CPU")
            op = torch.ops.torchtext.tcp_fallback.default
            store = tcp.CacheStore()
            pol = tcp.CachePolicy(namespaces=["torchtext"])
            allowing = tcp.FakeTensorMode(cache_policy=pol, cache_store=store, allow_fallback_kernels=True)
            forbidding = tcp.FakeTensorMode(cache_policy=pol, cache_store=store, allow_fallback_kernels=False)
            with allowing:
                op(torch.empty(2)), op(torch.empty(2))
            with self.assertRaises(UnsupportedOperatorException), StockMode(allow_fallback_kernels=False):
                op(torch.empty(2))
            with self.assertRaises(UnsupportedOperatorException), forbidding:
                op(torch.empty(2))
        finally:
            lib._destroy()


class TestCacheApiOnTheClass(FidelityTestCase):
    """Note [The cache API on the class]: cache_info() and cache_clear() called on the class mean what stock's do."""

    @parametrize("cls", [StockMode, tcp.FakeTensorMode], name_fn=lambda c: c.__module__.split(".")[0])
    def test_clear_then_count_on_the_class(self, cls: Any) -> None:
        """Stock's cache-test idiom (clear on the class, dispatch, read the class's counters) reads alike for both."""
        with cls():
            x, y = torch.randn(4, 3), torch.randn(4, 3)
            cls.cache_clear()
            x + y
            x + y
            info = cls.cache_info()
        self.assertEqual((info.hits, info.misses), (1, 1))

    def test_class_clear_empties_what_stock_clears(self) -> None:
        """After a class-level clear an aten op misses even if an earlier mode put its entry in torch's storage."""
        with tcp.FakeTensorMode():
            torch.randn(4, 3) + torch.randn(4, 3)
        mode = tcp.FakeTensorMode()
        with mode:
            x, y = torch.randn(4, 3), torch.randn(4, 3)
            tcp.FakeTensorMode.cache_clear()
            x + y
        report = mode.cache_report()[torch.ops.aten.add.Tensor]
        self.assertEqual((report.hits, report.misses), (0, 1))

    def test_instance_calls_stay_per_instance(self) -> None:
        """On an instance, cache_info() and cache_clear() see only that mode; torch's counters stay as they were."""
        before = StockMode.cache_info()
        a, b = tcp.FakeTensorMode(cache_policy=policy()), tcp.FakeTensorMode(cache_policy=policy())
        for mode in (a, b):
            with mode:
                x = torch.empty(2)
                plain(x), plain(x), plain(x)  # the first sight, the miss, a hit
        b_hits = b.cache_info().hits
        a.cache_clear()
        self.assertEqual((a.cache_info().hits, b.cache_info().hits), (0, b_hits))
        self.assertEqual(b.cache_report()[plain].hits, 1)
        after = StockMode.cache_info()  # its size may grow: aten entries go where a stock mode puts them
        self.assertEqual((after.hits, after.misses, after.bypasses), (before.hits, before.misses, before.bypasses))
        total = tcp.FakeTensorMode.cache_info()
        self.assertGreaterEqual(total.hits, before.hits + 1)

    def test_class_counters_read_as_cache_info(self) -> None:
        """FakeTensorMode.cache_hits/misses/bypasses read on the class (torch's tests do) are cache_info()'s; on a
        mode, the mode's; torch's own class counters move only by stock modes' dispatches."""
        before = StockMode.cache_hits
        mode = tcp.FakeTensorMode(cache_policy=policy())
        with mode:
            x = torch.empty(2)
            plain(x), plain(x)
        info, cls = tcp.FakeTensorMode.cache_info(), tcp.FakeTensorMode
        self.assertEqual((cls.cache_hits, cls.cache_misses, cls.cache_bypasses), (info.hits, info.misses, info.bypasses))
        mine = mode.cache_info()
        self.assertEqual((mode.cache_hits, mode.cache_misses, mode.cache_bypasses), (mine.hits, mine.misses, mine.bypasses))
        self.assertGreater(mode.cache_hits, 0)
        self.assertEqual(StockMode.cache_hits, before)


class TestHigherOrderOps(FidelityTestCase):
    def test_hop_without_a_rule_raises_as_stock(self) -> None:
        """A higher-order op with no rule for FakeTensorMode raises NotImplementedError, as under stock."""
        hop = _NoRuleHop()

        def run(mode: Any) -> list[object]:
            with mode:
                x = torch.empty(2)
                try:
                    hop(x)
                except NotImplementedError as e:
                    return ["NotImplementedError", "There was no rule registered for HigherOrderOperator" in str(e)]
            return ["returned"]

        ours, _ = self.run_both(run)
        self.assertEqual(ours, ["NotImplementedError", True])


class _NoRuleHop(torch._ops.HigherOrderOperator):
    def __init__(self) -> None:
        super().__init__("tcp_fidelity_no_rule_hop")
        # Without it the call raises at the autograd key, before any mode sees it.
        self.fallthrough(torch._C.DispatchKey.AutogradCPU)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return super().__call__(x)


class TestKernelSources(testing.CachePolicyTestCase):
    """Note [The kernel in effect]: the list of sources is held to torch's code."""

    def test_every_source_is_listed(self) -> None:
        """Every name the consulted functions of this torch use is a listed source or plumbing."""
        self.assertEqual(_kernels.unlisted_names(), {})
        self.assertTrue(_kernels.trusted())

    @parametrize("index", range(len(_kernels.SOURCES)), name_fn=lambda i: _kernels.SOURCES[i].names[0])
    def test_removing_a_source_is_noticed(self, index: int) -> None:
        """Without any one source, the check reports the names torch consults for it."""
        source = _kernels.SOURCES[index]
        consulted = set().union(*_kernels.consulted_names().values())
        if not consulted & set(source.names):
            self.skipTest(f"torch {torch.__version__} does not consult {source.names}")
        others = [s for s in _kernels.SOURCES if s is not source]
        unlisted = _kernels.unlisted_names(others)
        self.assertEqual(
            sorted({n for found in unlisted.values() for n in found}), sorted(consulted & set(source.names))
        )

    def test_an_unlisted_source_turns_caching_off_for_backend_ops(self) -> None:
        """On a torch consulting an unlisted name the source check warns and backend dispatches bypass."""
        others = tuple(s for s in _kernels.SOURCES if "fake_impl" not in s.names)
        try:
            with mock.patch.object(_kernels, "SOURCES", others), warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                _kernels.check_sources()
            self.assertTrue(any(issubclass(w.category, _compat.UnlistedKernelSourceWarning) for w in caught))
            self.assertFalse(_kernels.trusted())
            mode = tcp.FakeTensorMode(cache_policy=policy())
            gm = torch.fx.symbolic_trace(lambda t: (t.sin(),))
            with mode:
                x = torch.empty(2)
                plain(x), plain(x), torch.relu(x), torch.relu(x)
                invoke_subgraph(gm, "sub", x), invoke_subgraph(gm, "sub", x)
                torch.cond(torch.tensor(True), lambda t: t.sin(), lambda t: t.cos(), (x,))
            reason = "torch consults kernel sources this package does not list (fake_impl, kernel)"
            self.assertEqual(mode.cache_report()[plain].bypasses, {reason: 2})
            self.assertEqual(mode.cache_report()[torch.ops.aten.relu.default].bypasses, {})
        finally:
            _kernels.check_sources()
        self.assertTrue(_kernels.trusted())

    def test_explicit_sources_are_checked(self) -> None:
        """check_sources(sources) holds the given list to torch's code, and the default list passes again after it."""
        others = tuple(s for s in _kernels.SOURCES if "fake_impl" not in s.names)
        try:
            with self.assertWarnsRegex(_compat.UnlistedKernelSourceWarning, r"fake_impl, kernel"):
                _kernels.check_sources(others)
            self.assertFalse(_kernels.trusted())
            self.assertEqual(_kernels.distrusted_reason(), _reasons.distrusted(["fake_impl", "kernel"]))
        finally:
            with warnings.catch_warnings():
                warnings.simplefilter("error", _compat.UnlistedKernelSourceWarning)
                _kernels.check_sources()
        self.assertTrue(_kernels.trusted())

    def test_custom_ops_profile_read(self) -> None:
        """_kernels.custom_ops_profile reads the config as torch._dynamo.config does, overrides included."""
        marker = object()
        self.assertIs(_kernels.custom_ops_profile(), torch._dynamo.config._custom_ops_profile)
        with torch._dynamo.config.patch(_custom_ops_profile=marker):
            self.assertIs(_kernels.custom_ops_profile(), marker)
            self.assertIs(torch._dynamo.config._custom_ops_profile, marker)
        self.assertIsNone(_kernels.custom_ops_profile())

    def test_sources_name_code_that_exists(self) -> None:
        """Every piece of the package a source's ``how`` names (``_rules.dispatch``, ``KernelDeps.table_key``) exists."""
        pattern = re.compile(r"\b(_[a-z_]+\.[A-Za-z_][\w.]*\w|KernelDeps\.\w+|symbolic_table_key|profiled)\b")
        missing = []
        for source in _kernels.SOURCES:
            for ref in pattern.findall(source.how):
                head, *rest = ref.split(".")
                obj: object = importlib.import_module(f"torch_cachepolicy.{head}") if head.startswith("_") else _kernels
                for part in rest if head.startswith("_") else [head, *rest]:
                    obj = getattr(obj, part, None)
                if obj is None:
                    missing.append(ref)
        self.assertEqual(missing, [])
        self.assertIn("KernelDeps.table_key", " ".join(s.how for s in _kernels.SOURCES))

    def test_guide_shows_the_list(self) -> None:
        """docs/guide.md's table of the kernel in effect is the list in _kernels.py."""
        guide = (testing.REPO_ROOT / "docs" / "guide.md").read_text()
        start, end = "<!-- _kernels.render_table() -->\n", "\n<!-- end _kernels.render_table() -->"
        shown = guide[guide.index(start) + len(start) : guide.index(end)]
        self.assertEqual(shown, _kernels.render_table(), msg="regenerate the table with _kernels.render_table()")
        self.assertEqual(len(_kernels.SOURCES), shown.count("\n| ") - 1)


instantiate_parametrized_tests(TestRulesForFakeTensorMode)
instantiate_parametrized_tests(TestCopies)
instantiate_parametrized_tests(TestWhatAKernelCanTouch)
instantiate_parametrized_tests(TestCacheApiOnTheClass)
instantiate_parametrized_tests(TestKernelSources)

if __name__ == "__main__":
    run_tests()
