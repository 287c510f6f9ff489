# Owner(s): ["module: fakeTensor"]
"""Nothing outlives its use: modes, stores, GraphModules, ShapeEnv tables; memory stays flat.

torch itself keeps some objects alive that these tests therefore do not
expect to be collected: ShapeEnvs (its lru caches hold them even for stock
modes) and registered fake kernels (the Meta kernel that register_fake
builds wraps them and outlives the Library). For those the tests check that
nothing of ours reaches them (``cachepolicy_testing.reaches``).
"""

from __future__ import annotations

import gc
import tracemalloc
import weakref
from typing import Any

import cachepolicy_testing as testing
import torch
from torch._subclasses.fake_tensor import FakeTensorMode as StockMode
from torch._subclasses.fake_tensor import _DispatchCacheBypassEntry
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext
from torch.testing._internal.common_utils import TestCase, run_tests

import torch_cachepolicy as tcp
import torch_cachepolicy.store as store_module

conv, pair, size0, good_view = testing.op("conv"), testing.op("pair"), testing.op("size0"), testing.op("good_view")
q_per_tensor = torch.ops.quantized_decomposed.quantize_per_tensor.default
dq_per_tensor = torch.ops.quantized_decomposed.dequantize_per_tensor.default

SHORT_LIVED_MODES = 1000
# The replay loop runs REPETITIONS times DISPATCHES_PER_REPETITION dispatches
# under tracemalloc; traced memory at the end of each later repetition may
# exceed that at the end of the first by FLAT_BOUND_BYTES at most. What stays
# alive settles by up to ~16 KiB over these repetitions (structures of torch
# and CPython filling up; the previous release did the same), while a leak of
# one small object per dispatch (every Python object takes at least 16 B,
# typically ~50 B) would add 32-100 KiB per repetition.
REPETITIONS = 3
DISPATCHES_PER_REPETITION = 2_000
FLAT_BOUND_BYTES = 48 * 1024


def replay(x4: torch.Tensor, x2: torch.Tensor) -> int:
    """One short 'graph' of backend and aten ops; returns the number of dispatches made here."""
    conv(x4, 1)
    y = q_per_tensor(x2, 0.1, 0, -128, 127, torch.int8)
    dq_per_tensor(y, 0.1, 0, -128, 127, torch.int8)
    pair(x2)
    good_view(x2)
    torch.ops.aten.add.Tensor(x2, x2)
    return 6


def symbolic(mode: tcp.FakeTensorMode, *shape: int) -> torch.Tensor:
    ctx = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC] * len(shape))
    return mode.from_tensor(torch.empty(*shape), symbolic_context=ctx)


def positive_entries(table: dict[Any, Any], ns: str) -> int:
    return sum(
        1
        for k, v in list(table.items())
        if getattr(k.key[0], "namespace", None) == ns and not isinstance(v, _DispatchCacheBypassEntry)
    )


class TestCollected(TestCase):
    def assertCollected(self, ref: weakref.ref[Any], what: str) -> None:
        gc.collect()
        self.assertIsNone(ref(), msg=f"{what} is still alive: {[type(r).__name__ for r in gc.get_referrers(ref())] if ref() is not None else ''}")

    def test_mode_and_store_collected_after_every_feature(self) -> None:
        """A mode that used crosscheck, a context hook, HOPs and symbolic shapes is freed with its store."""
        def use() -> tuple[weakref.ref[Any], weakref.ref[Any], weakref.ref[Any]]:
            policy = testing.backend_policy(context_key=lambda: "spec")
            mode = tcp.FakeTensorMode(cache_policy=policy, shape_env=ShapeEnv(), cache_crosscheck=True)
            x = symbolic(mode, 2, 3, 4, 4)
            with mode:
                for _ in range(2):
                    replay(x, torch.empty(3, 5))
                    size0(x)
                    torch.cond(torch.tensor(True), lambda t: t.sin(), lambda t: t.cos(), (torch.empty(3),))
            self.assertGreater(mode.cache_info().hits, 0)
            return weakref.ref(mode), weakref.ref(mode.cache_store), weakref.ref(policy)

        mode_ref, store_ref, policy_ref = use()
        self.assertCollected(mode_ref, "the mode")
        self.assertCollected(store_ref, "the store")
        self.assertCollected(policy_ref, "the policy")

    def test_shared_store_lives_as_long_as_a_mode_using_it(self) -> None:
        """A store shared by two modes is freed after the last of them, not before."""
        store = tcp.CacheStore()
        modes = [tcp.FakeTensorMode(cache_policy=testing.backend_policy(), cache_store=store) for _ in range(2)]
        for m in modes:
            with m:
                replay(torch.empty(1, 1, 4, 4), torch.empty(2, 3))
        del m
        store_ref, first_ref = weakref.ref(store), weakref.ref(modes[0])
        del store
        modes.pop(0)
        self.assertCollected(first_ref, "the first mode")
        self.assertIsNotNone(store_ref())
        modes.clear()
        self.assertCollected(store_ref, "the shared store")

    def test_graph_modules_collected_while_mode_lives(self) -> None:
        """GraphModules dispatched through invoke_subgraph die with their last user reference; the store keeps nothing
        of them (higher-order ops bypass)."""
        from torch._higher_order_ops.invoke_subgraph import invoke_subgraph

        store = tcp.CacheStore(isolated=True)
        mode = tcp.FakeTensorMode(cache_policy=testing.backend_policy(), cache_store=store)
        refs = []
        with mode:
            x = torch.empty(3, 4)
            conv(torch.empty(1, 1, 3, 3), 1)
            x.sin()  # the subgraph's own op: its entry is not the graph's to remove
            baseline = len(store)
            for _ in range(50):
                gm = torch.fx.symbolic_trace(lambda x: (x.sin(),))
                invoke_subgraph(gm, "sub", x)
                invoke_subgraph(gm, "sub", x)
                refs.append(weakref.ref(gm))
                del gm
        gc.collect()
        self.assertEqual(sum(r() is not None for r in refs), 0)
        self.assertEqual(len(store), baseline)
        self.assertEqual(sum(mode.cache_report()["invoke_subgraph"].bypasses.values()), 100)

    def test_store_never_reaches_shape_env(self) -> None:
        """Symbolic backend entries hang off the ShapeEnv: the store reaches none of them, and they go with the store."""
        shape_env = ShapeEnv()
        store = tcp.CacheStore()
        mode = tcp.FakeTensorMode(cache_policy=testing.backend_policy(), shape_env=shape_env, cache_store=store)
        x = symbolic(mode, 2, 2, 5, 5)
        with mode:
            for _ in range(3):
                conv(x, 1)
                size0(x)
        self.assertGreater(len(store), 0)
        self.assertFalse(testing.reaches(store, shape_env))
        tables = shape_env.__dict__[store_module._SHAPE_ENV_ATTR]
        self.assertEqual(len(tables), 1)
        del mode, store, x
        gc.collect()
        self.assertEqual(len(tables), 0)  # the partition died, its tables with it

    def test_store_holds_a_fake_kernel_only_while_it_lives(self) -> None:
        """Entries of a replaced fake kernel stay reachable from the store until the store dies."""
        store = tcp.CacheStore()
        mode = tcp.FakeTensorMode(cache_policy=testing.backend_policy(), cache_store=store)
        holder = torch._library.simple_registry.singleton.find(f"{testing.NS}::swappable")
        lib = torch.library.Library(testing.NS, "FRAGMENT")
        try:
            with mode:
                x = torch.empty(2, 3)
                testing.op("swappable")(x)
                old = holder.fake_impl.kernel.func
                torch.library.register_fake(f"{testing.NS}::swappable", testing.swappable_v2, lib=lib)
                self.assertEqual(testing.op("swappable")(x).shape, (2, 1))
                new = holder.fake_impl.kernel.func
        finally:
            lib._destroy()
        self.assertTrue(testing.reaches(store, old))
        self.assertTrue(testing.reaches(store, new))
        store_ref = weakref.ref(store)
        del mode, store, x
        self.assertCollected(store_ref, "the store")


class TestManyModes(TestCase):
    def test_short_lived_modes_leave_nothing(self) -> None:
        """1,000 short-lived policy modes leave no mode, store, ShapeEnv table or torch cache entry behind."""
        modes: weakref.WeakSet[tcp.FakeTensorMode] = weakref.WeakSet()
        stores: weakref.WeakSet[tcp.CacheStore] = weakref.WeakSet()
        shape_envs: list[weakref.ref[ShapeEnv]] = []
        before = (
            positive_entries(StockMode.cache, testing.NS),
            positive_entries(StockMode.cache, "quantized_decomposed"),
        )
        for i in range(SHORT_LIVED_MODES):
            symbolic_mode = i % 10 == 0
            mode = tcp.FakeTensorMode(
                cache_policy=testing.backend_policy(), shape_env=ShapeEnv() if symbolic_mode else None
            )
            x4 = symbolic(mode, 1, 2, 4, 4) if symbolic_mode else torch.empty(1, 2, 4, 4 + i % 7)
            with mode:
                if not symbolic_mode:
                    x4 = mode.from_tensor(x4)
                for _ in range(3):
                    replay(x4, torch.empty(2, 3))
            self.assertEqual(mode.cache_report()[conv].hits, 1)  # 3 replays: the first sight, the miss, a hit
            modes.add(mode)
            stores.add(mode.cache_store)
            if symbolic_mode:
                assert mode.shape_env is not None
                shape_envs.append(weakref.ref(mode.shape_env))
            del mode, x4
        gc.collect()
        print(f"\n{SHORT_LIVED_MODES} modes: {len(modes)} modes and {len(stores)} stores alive after gc")
        self.assertEqual(len(modes), 0)
        self.assertEqual(len(stores), 0)
        leftover_tables = sum(
            len(env.__dict__.get(store_module._SHAPE_ENV_ATTR, {})) for env in (r() for r in shape_envs) if env is not None
        )
        self.assertEqual(leftover_tables, 0)
        after = (
            positive_entries(StockMode.cache, testing.NS),
            positive_entries(StockMode.cache, "quantized_decomposed"),
        )
        self.assertEqual(after, before)


class TestFlatMemory(TestCase):
    def measure(self, mode: Any, dispatches: int = DISPATCHES_PER_REPETITION) -> list[int]:
        """Traced memory at the end of each of REPETITIONS replay loops of ``dispatches`` dispatches."""
        readings: list[int] = []
        with mode:
            x4, x2 = torch.empty(1, 2, 6, 6), torch.empty(3, 4)
            replay(x4, x2)  # warm up: every entry exists from here on
            rounds = dispatches // replay(x4, x2)
            gc.collect()
            tracemalloc.start()
            try:
                for _ in range(REPETITIONS):
                    for _ in range(rounds):
                        replay(x4, x2)
                    gc.collect()
                    readings.append(tracemalloc.get_traced_memory()[0])
            finally:
                tracemalloc.stop()
        return readings

    def assertFlat(self, readings: list[int]) -> None:
        self.assertEqual(len(readings), REPETITIONS)
        growth = [r - readings[0] for r in readings[1:]]
        self.assertLess(max(growth), FLAT_BOUND_BYTES, msg=f"traced bytes after each repetition: {readings}")

    def test_long_replay_keeps_memory_flat(self) -> None:
        """Repeated replay loops on one policy mode (crosscheck off) leave traced memory flat between repetitions."""
        mode = tcp.FakeTensorMode(cache_policy=testing.backend_policy(), cache_crosscheck=False)
        readings = self.measure(mode)
        print(f"\npolicy mode, {REPETITIONS} x {DISPATCHES_PER_REPETITION} dispatches, traced bytes: {readings}")
        self.assertFlat(readings)
        self.assertGreater(mode.cache_info().hits, REPETITIONS * DISPATCHES_PER_REPETITION * 0.9)
        self.assertEqual(len(mode.cache_store), 5)  # conv, q, dq, pair, good_view: one entry each

    def test_long_replay_on_stock_for_comparison(self) -> None:
        """Control: the same loops on stock FakeTensorMode leave traced memory flat as well."""
        readings = self.measure(StockMode())
        print(f"\nstock mode, {REPETITIONS} x {DISPATCHES_PER_REPETITION} dispatches, traced bytes: {readings}")
        self.assertFlat(readings)

    def test_long_replay_with_crosscheck_and_shapes_keeps_memory_flat(self) -> None:
        """Half as many dispatches per repetition with crosscheck and a ShapeEnv leave traced memory flat too."""
        mode = tcp.FakeTensorMode(cache_policy=testing.backend_policy(), cache_crosscheck=True, shape_env=ShapeEnv())
        readings = self.measure(mode, DISPATCHES_PER_REPETITION // 2)
        dispatches = f"{REPETITIONS} x {DISPATCHES_PER_REPETITION // 2} dispatches"
        print(f"\npolicy mode with crosscheck and ShapeEnv, {dispatches}, traced bytes: {readings}")
        self.assertFlat(readings)
        self.assertGreater(mode.cache_info().hits, REPETITIONS * DISPATCHES_PER_REPETITION // 2 * 0.9)


if __name__ == "__main__":
    run_tests()
