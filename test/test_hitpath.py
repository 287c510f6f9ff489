"""The hit in one native call (``torch_cachepolicy.hitpath``, ``csrc/hitpath.cpp``) against the Python path."""

from __future__ import annotations

import contextlib
import sys
import unittest
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import cachepolicy_testing  # noqa: F401  (defines quantized_decomposed and tcp_test ops)
import torch
import zoo_ops as zoo
from test_kernel_zoo import ZooTestCase
from torch._dispatch.python import enable_python_dispatcher
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorConfig
from torch.fx.experimental.proxy_tensor import get_proxy_mode
from torch.fx.experimental.symbolic_shapes import ShapeEnv
from torch.testing._internal.common_utils import instantiate_parametrized_tests, parametrize, run_tests
from torch.utils._python_dispatch import TorchDispatchMode

import torch_cachepolicy as tcp
from benchmarks.replay.configs import Policy
from benchmarks.replay.runner import run_series
from benchmarks.replay.workloads import BACKEND_NAMESPACES, WORKLOAD_NAMES, build_workload
from torch_cachepolicy import hitpath, synth
from torch_cachepolicy import mode as mode_module
from torch_cachepolicy.safety import describe, first_difference

HAS_NATIVE = hitpath.native_hits is not None
NO_NATIVE = "torch_cachepolicy._C is not loaded (USE_CPP=0 or TORCH_CACHEPOLICY_FORCE_PYTHON=1)"
aten = torch.ops.aten
qd = torch.ops.quantized_decomposed


def _quantize(x: torch.Tensor) -> torch.Tensor:
    return qd.quantize_per_tensor.default(x, 0.02, 0, -128, 127, torch.int8)


class _PassThroughProxy(TorchDispatchMode):
    """Sits where make_fx's proxy mode sits (the PROXY slot) and dispatches on."""

    def __init__(self) -> None:
        super().__init__()
        self._mode_key = torch._C._TorchDispatchModeKey.PROXY

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return func(*args, **(kwargs or {}))


def portable_state(t: Any) -> tuple[object, ...]:
    """An output's FakeTensor state comparable across modes: attribute kinds, dispatch keys, data-pointer guard, trace."""
    attrs = sorted(
        (k, "mode" if v is t.fake_mode else v if v is None or isinstance(v, (bool, int, str, torch.device)) else type(v))
        for k, v in vars(t).items()
    )
    try:
        t.untyped_storage().data_ptr()
        data_ptr = "allowed"
    except RuntimeError:
        data_ptr = "raises"
    return (type(t), attrs, str(torch._C._dispatch_keys(t)), data_ptr, hasattr(t, "_debug_trace"))


@contextlib.contextmanager
def during_first_fake_tensor_init(action: Callable[[], None]) -> Iterator[None]:
    """Runs ``action()`` once, when ``FakeTensor.__init__`` is first entered in the scope.

    That is the Python code a native hit runs between a tuple's outputs: the
    window another thread could act in.
    """

    def hook(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code is FakeTensor.__init__.__code__:
            sys.setprofile(None)
            action()

    sys.setprofile(hook)
    try:
        yield
    finally:
        sys.setprofile(None)


def tuple_hit_mode() -> tuple[tcp.FakeTensorMode, torch.Tensor]:
    """A mode whose next ``aten.max.dim(x, 1)`` (a 2-tuple of fresh outputs) is a native hit."""
    mode = tcp.FakeTensorMode(cache_store=tcp.CacheStore(isolated=True))
    x = mode.from_tensor(torch.randn(4, 6))
    with mode:
        for _ in range(2):  # a miss (its verification memoizes the plan), then a hit
            aten.max.dim(x, 1)
    return mode, x


def settle_canaries() -> None:
    """Runs hits until the canaries of keybuilder and synth have compared theirs with torch's (as early hits of a process do)."""
    mode = tcp.FakeTensorMode()
    x = mode.from_tensor(torch.randn(3))
    with mode:
        for _ in range(64):
            if hitpath.ready():
                return
            torch.relu(x)
    raise AssertionError("the canaries did not settle in 64 hits")


class TestHitPath(ZooTestCase):
    def setUp(self) -> None:
        super().setUp()
        if HAS_NATIVE:
            settle_canaries()

    def assertParity(self, parity: hitpath.Parity, *, at_least: int = 1) -> None:
        """No native hit differed from the Python path, and at least ``at_least`` were compared."""
        self.assertEqual(parity.differences, [])
        self.assertGreaterEqual(parity.checked, at_least, msg=str(parity))

    @unittest.skipIf(not HAS_NATIVE, NO_NATIVE)
    @parametrize("name", WORKLOAD_NAMES)
    def test_benchmark_workloads(self, name: str) -> None:
        """Every native hit of a replay workload equals the Python path's output for the same call."""
        workload = build_workload(name, size=8)
        with hitpath.checking_parity() as parity:
            series, _ = run_series(Policy(BACKEND_NAMESPACES), workload, replays=3)
        # Static keys hit natively from the second replay on (a first hit memoizes the entry's plan).
        self.assertParity(parity, at_least=1 if workload.dynamic_batch else series.counts.hits // 2)

    @unittest.skipIf(not HAS_NATIVE, NO_NATIVE)
    def test_kernel_zoo(self) -> None:
        """Every native hit of the kernel zoo's call sequences equals the Python path's output for the same call."""
        with hitpath.checking_parity() as parity:
            for case in zoo.CASES:
                if case.limit:
                    continue  # documented limits: their own tests in test_kernel_zoo
                self.run_case(case, crosscheck=False)
        self.assertParity(parity, at_least=20)

    @unittest.skipIf(not HAS_NATIVE, NO_NATIVE)
    def test_outputs_of_every_step_kind(self) -> None:
        """Fresh, view, in-place, tuple and constant outputs hit natively as the Python path builds them."""
        mode = tcp.FakeTensorMode()
        x = mode.from_tensor(torch.randn(4, 6))
        calls = [
            (aten.relu.default, (x,)),
            (aten.view.default, (x, [6, 4])),
            (aten.split.Tensor, (x, 2)),
            (aten.add_.Tensor, (x, 1.0)),
            (aten.is_same_size.default, (x, x)),
            (aten.max.dim, (x, 1)),
        ]
        with mode:
            for _ in range(2):  # a miss, then a hit that memoizes the plan
                for op, args in calls:
                    op(*args)
            with hitpath.checking_parity() as parity:
                for op, args in calls:
                    op(*args)
        self.assertParity(parity, at_least=len(calls))

    @unittest.skipIf(not HAS_NATIVE, NO_NATIVE)
    @parametrize("unsafe", [False, True])
    def test_backend_op_under_python_dispatcher(self, unsafe: bool) -> None:
        """A backend op's hits under the Python dispatcher, with either data-pointer guard, match the Python path."""
        mode = tcp.FakeTensorMode(cache_policy=tcp.CachePolicy(namespaces=["quantized_decomposed"]))
        mode._allow_unsafe_data_ptr_access = unsafe
        x = mode.from_tensor(torch.randn(2, 3))
        with mode, enable_python_dispatcher():
            _quantize(x)
            _quantize(x)
            with hitpath.checking_parity() as parity:
                for _ in range(3):
                    _quantize(x)
        self.assertParity(parity, at_least=3)
        report = mode.cache_report()[qd.quantize_per_tensor.default]
        self.assertEqual((report.hits, report.misses), (4, 1))

    @unittest.skipIf(not HAS_NATIVE, NO_NATIVE)
    def test_counters_as_the_python_path(self) -> None:
        """Hits, misses, bypasses and built keys count the same with and without the native hit."""

        def counts() -> tuple[object, ...]:
            mode = tcp.FakeTensorMode(
                cache_policy=tcp.CachePolicy(namespaces=["quantized_decomposed"]),
                cache_store=tcp.CacheStore(isolated=True),
                shape_env=ShapeEnv(),
            )
            x = mode.from_tensor(torch.randn(2, 3), static_shapes=True)
            with mode:
                for _ in range(4):
                    _quantize(x)
                    torch.relu(x)
                    aten.nonzero.default(x)  # a bypass
            return (repr(mode.cache_report()), repr(mode.cache_key_stats()), mode.cache_info())

        with hitpath.checking_parity() as parity:
            native = counts()
        with mock.patch.object(mode_module, "_NATIVE_HITS", None):
            python = counts()
        self.assertEqual(native, python)
        self.assertParity(parity, at_least=4)

    @unittest.skipIf(not HAS_NATIVE, NO_NATIVE)
    @parametrize("where", ["dispatch_mode", "pre_dispatch"])
    def test_proxy_mode_in_the_key(self, where: str) -> None:
        """A proxy mode where get_proxy_mode looks (either place) keys hits apart from the rest, as the Python path does."""

        @contextlib.contextmanager
        def proxy() -> Iterator[None]:
            if where == "pre_dispatch":
                state = torch._ops.mode_stack_state_for_pre_dispatch()
                state.set(0, _PassThroughProxy())
                try:
                    yield
                finally:
                    state.set(0, None)
            else:
                with _PassThroughProxy():
                    yield

        def counts() -> tuple[int, int, int]:
            mode = tcp.FakeTensorMode(cache_store=tcp.CacheStore(isolated=True))
            x = mode.from_tensor(torch.randn(4, 6))
            with mode:
                for _ in range(2):
                    mode.dispatch(aten.relu.default, (), (x,), {})
                with proxy():
                    self.assertIsNotNone(get_proxy_mode())
                    for _ in range(3):
                        mode.dispatch(aten.relu.default, (), (x,), {})
                mode.dispatch(aten.relu.default, (), (x,), {})
            info = mode.cache_info()
            return info.hits, info.misses, mode.cache_key_stats().built

        with hitpath.checking_parity() as parity:
            native = counts()
        with mock.patch.object(mode_module, "_NATIVE_HITS", None):
            python = counts()
        self.assertEqual(native, python)
        self.assertEqual(native[:2], (4, 2))  # one entry without the proxy mode, one with it
        self.assertParity(parity, at_least=4)

    @unittest.skipIf(not HAS_NATIVE, NO_NATIVE)
    def test_reads_proxy_mode_as_get_proxy_mode(self) -> None:
        """On this torch HitPath reads get_proxy_mode's state itself (the code it mirrors is the known one)."""
        self.assertTrue(hitpath.proxy_mode_readable())

    @unittest.skipIf(not HAS_NATIVE, NO_NATIVE)
    def test_parity_sees_a_wrong_native_output(self) -> None:
        """The parity check is not vacuous: a native path installing the wrong data-pointer guard shows as a difference."""
        swapped = hitpath.make_hit_path(
            throw_on_data_ptr=torch._C._set_warn_deprecated_on_mutable_data_ptr,
            warn_on_data_ptr=torch._C._set_throw_on_mutable_data_ptr,
        )
        mode = tcp.FakeTensorMode(cache_store=tcp.CacheStore(isolated=True))
        x = mode.from_tensor(torch.randn(4, 6))
        with mode:
            torch.relu(x)
            torch.relu(x)
            with mock.patch.object(mode_module, "_NATIVE_HITS", swapped), hitpath.checking_parity() as parity:
                torch.relu(x)
        self.assertEqual(parity.checked, 1)
        self.assertEqual(len(parity.differences), 1, msg=str(parity))
        self.assertIn("RuntimeError", parity.differences[0])

    @unittest.skipIf(not HAS_NATIVE, NO_NATIVE)
    def test_declined_calls_change_nothing(self) -> None:
        """Calls the native path declines (no entry, no plan) and those it is not asked (crosscheck) take the Python path."""
        mode = tcp.FakeTensorMode(cache_store=tcp.CacheStore(isolated=True))
        x = mode.from_tensor(torch.randn(4, 6))
        with mode, hitpath.checking_parity() as parity:
            torch.relu(x)  # a miss: declined (no entry); its verification memoizes the plan
            torch.relu(x)  # native
            mode._synth.plans.clear()
            torch.relu(x)  # declined (no plan): the Python path memoizes it again
            torch.relu(x)  # native
        self.assertEqual((parity.declined, parity.checked), (2, 2))
        self.assertEqual(mode.cache_info().hits, 3)
        mode.cache_crosscheck_enabled = True
        with mode, hitpath.checking_parity() as parity:
            torch.relu(x)
        self.assertEqual((parity.declined, parity.checked), (0, 0))

    @unittest.skipIf(not HAS_NATIVE, NO_NATIVE)
    def test_waits_for_the_canaries(self) -> None:
        """While synth's canary still compares with torch's synthesis, hits take the Python path."""
        mode = tcp.FakeTensorMode()
        x = mode.from_tensor(torch.randn(4, 6))
        with mode:
            torch.relu(x)
            torch.relu(x)
            self.assertTrue(hitpath.ready())
            with mock.patch.object(synth._canary, "remaining", 1), hitpath.checking_parity() as parity:
                self.assertFalse(hitpath.ready())
                torch.relu(x)
            self.assertEqual((parity.declined, parity.checked), (0, 0))

    @unittest.skipIf(not HAS_NATIVE, NO_NATIVE)
    @parametrize("where", ["subclass", "class", "instance"])
    def test_own_synthesis_keeps_the_python_path(self, where: str) -> None:
        """_output_from_cache_entry overridden by a subclass, or patched on the class or on one mode, sees every hit."""
        seen: list[object] = []

        class Subclass(tcp.FakeTensorMode):
            def _output_from_cache_entry(self, *args: Any) -> Any:
                seen.append(args[3])
                return super()._output_from_cache_entry(*args)

        def run() -> list[object]:
            seen.clear()
            mode = (Subclass if where == "subclass" else tcp.FakeTensorMode)(cache_store=tcp.CacheStore(isolated=True))
            original = tcp.FakeTensorMode._output_from_cache_entry

            def wrapper(*args: Any) -> Any:
                seen.append(args[-2])
                return original(mode, *args[-5:])

            patched: Any = contextlib.nullcontext()
            if where != "subclass":
                target: object = tcp.FakeTensorMode if where == "class" else mode
                patched = mock.patch.object(target, "_output_from_cache_entry", wrapper)
            x = mode.from_tensor(torch.randn(4, 6))
            with patched, mode:
                for _ in range(4):
                    torch.relu(x)
            self.assertEqual(mode.cache_info().hits, 3)
            return list(seen)

        with hitpath.checking_parity() as parity:
            native = run()
        self.assertEqual((parity.checked, parity.declined), (0, 0))
        with mock.patch.object(mode_module, "_NATIVE_HITS", None):
            python = run()
        self.assertEqual(native, python)
        self.assertGreaterEqual(len(native), 3)  # at least one per hit

    @unittest.skipIf(not HAS_NATIVE, NO_NATIVE)
    def test_cache_clear_while_a_tuple_hit_is_built(self) -> None:
        """A cache_clear() landing between a tuple hit's outputs (another thread's) leaves the hit as the Python path's."""
        mode, x = tuple_hit_mode()
        fired: list[int] = []
        served: list[bool] = []

        def clear() -> None:
            fired.append(1)
            tcp.FakeTensorMode.cache_clear()

        class Counting:
            def hit(self, *args: Any) -> Any:
                out = hitpath.native_hits.hit(*args)
                served.append(out is not hitpath.DECLINED)
                return out

        with mode:
            reference = aten.max.dim(x, 1)
            with mock.patch.object(mode_module, "_NATIVE_HITS", Counting()), during_first_fake_tensor_init(clear):
                out = aten.max.dim(x, 1)
        self.assertEqual((fired, served), ([1], [True]))
        self.assertEqual(first_difference(describe(out, (x,), {}), describe(reference, (x,), {})), None)
        self.assertTrue(all(t.fake_mode is mode and t.device == x.device for t in out))

    def assertSameWithoutNative(self, run: Callable[[], object]) -> None:
        """``run()`` returns the same with the native hit on and off."""
        native = run()
        with mock.patch.object(mode_module, "_NATIVE_HITS", None):
            python = run()
        self.assertEqual(native, python)

    @unittest.skipIf(not HAS_NATIVE, NO_NATIVE)
    def test_counters_when_a_dispatch_raises(self) -> None:
        """An unhashable context, or an error raised while a hit's output is built, counts as on the Python path."""
        context = {"value": 0}
        policy = tcp.CachePolicy(namespaces=["quantized_decomposed"], context_key=lambda: context["value"])

        def unhashable_context() -> tuple[object, ...]:
            mode = tcp.FakeTensorMode(cache_policy=policy, cache_store=tcp.CacheStore(isolated=True))
            x = mode.from_tensor(torch.randn(4))
            errors = []
            with mode:
                for value in (0, 0, 0, [1], [1], 0):
                    context["value"] = value
                    try:
                        _quantize(x)
                    except TypeError as e:
                        errors.append(str(e))
            return mode.cache_info(), mode.cache_key_stats().built, errors

        def interrupt() -> None:
            raise RuntimeError("interrupted")

        def raise_in_fake_tensor_init() -> tuple[object, ...]:
            mode, x = tuple_hit_mode()
            with mode, self.assertRaisesRegex(RuntimeError, "interrupted"), during_first_fake_tensor_init(interrupt):
                aten.max.dim(x, 1)
            return mode.cache_info(), mode.cache_key_stats().built

        self.assertSameWithoutNative(unhashable_context)
        self.assertSameWithoutNative(raise_in_fake_tensor_init)
        self.assertEqual(len(unhashable_context()[2]), 2)

    @unittest.skipIf(not HAS_NATIVE, NO_NATIVE)
    @parametrize("flag", ["data_ptr", "debug"])
    def test_flags_read_for_each_output(self, flag: str) -> None:
        """A data-pointer setting or FakeTensorConfig.debug changed between a tuple hit's outputs applies to the later ones."""

        def run() -> list[object]:
            mode, x = tuple_hit_mode()

            def flip() -> None:  # while output 0 is made
                if flag == "data_ptr":
                    mode._allow_unsafe_data_ptr_access = not mode._allow_unsafe_data_ptr_access
                else:
                    FakeTensorConfig.debug = True

            try:
                with mode, during_first_fake_tensor_init(flip):
                    out = aten.max.dim(x, 1)
            finally:
                FakeTensorConfig.debug = False
            return [portable_state(t) for t in out]

        self.assertSameWithoutNative(run)

    def test_key_slots_on_this_torch(self) -> None:
        """torch's _DispatchCacheKey still sets exactly its two slots (else HitPath calls the class)."""
        self.assertTrue(hitpath.key_slots())

    def test_parity_scopes_do_not_nest(self) -> None:
        """checking_parity() inside checking_parity() is an error naming the API."""
        with hitpath.checking_parity():
            with self.assertRaisesRegex(RuntimeError, r"checking_parity\(\): already checking"):
                with hitpath.checking_parity():
                    pass
        self.assertIsNone(hitpath.parity())

    @unittest.skipIf(HAS_NATIVE, "the C++ extension is loaded")
    def test_without_extension(self) -> None:
        """Without torch_cachepolicy._C every hit takes the Python path."""
        mode = tcp.FakeTensorMode()
        x = mode.from_tensor(torch.randn(4, 6))
        with mode, hitpath.checking_parity() as parity:
            for _ in range(3):
                torch.relu(x)
        self.assertEqual((parity.declined, parity.checked), (0, 0))
        self.assertEqual(mode.cache_info().hits, 2)


instantiate_parametrized_tests(TestHitPath)

if __name__ == "__main__":
    run_tests()
