# Owner(s): ["module: fakeTensor"]
"""Tests of torch_cachepolicy.CachePolicy: rules, identity, explain, bad input."""

from __future__ import annotations

from typing import Any

import cachepolicy_testing as T
import torch
from torch.testing._internal.common_utils import (
    TestCase,
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
)

import torch_cachepolicy as tcp

conv = T.op("conv")
add = torch.ops.aten.add.Tensor
q_per_tensor = torch.ops.quantized_decomposed.quantize_per_tensor.default


class TestRules(TestCase):
    def assertCacheable(self, policy: tcp.CachePolicy, op: Any, expected: bool) -> None:
        self.assertEqual(policy.is_cacheable(op), expected, msg=policy.explain(op))

    def test_default_policy_is_stock(self) -> None:
        """The default policy admits aten/prim/prims and nothing else."""
        policy = tcp.CachePolicy()
        self.assertCacheable(policy, add, True)
        self.assertCacheable(policy, conv, False)
        self.assertEqual(policy.decide(conv).label, "non-builtin")

    def test_include_builtins_false(self) -> None:
        """include_builtins=False turns off aten too."""
        policy = tcp.CachePolicy(namespaces=[T.NS], include_builtins=False)
        self.assertCacheable(policy, add, False)
        self.assertCacheable(policy, conv, True)

    def test_register_namespace_decorator_returns_object(self) -> None:
        """@register_namespace(ns) registers at once and returns the decorated object."""
        policy = tcp.CachePolicy()

        @policy.register_namespace(T.NS)
        def define_ops(lib: Any) -> str:
            return "unchanged"

        self.assertEqual(define_ops(None), "unchanged")
        self.assertCacheable(policy, conv, True)

    def test_register_namespace_accepts_library(self) -> None:
        """A torch.library.Library names its namespace."""
        policy = tcp.CachePolicy()
        lib = torch.library.Library(T.NS, "FRAGMENT")
        try:
            policy.register_namespace(lib)
        finally:
            lib._destroy()
        self.assertIn(T.NS, policy.namespaces)

    @parametrize("form", ["overload", "packet", "string", "packet_string", "custom_op"])
    def test_register_op_forms(self, form: str) -> None:
        """register_op takes an OpOverload, a packet, a name or a custom_op."""
        custom = _custom_op()
        op = {
            "overload": conv,
            "packet": torch.ops.tcp_test.conv,
            "string": "tcp_test::conv.default",
            "packet_string": "tcp_test::conv",
            "custom_op": custom,
        }[form]
        target = custom._opoverload if form == "custom_op" else conv
        policy = tcp.CachePolicy()
        self.assertIs(policy.register_op(op)(len), len)
        self.assertCacheable(policy, target, True)
        self.assertTrue(policy.decide(target).explicit)

    def test_deny_beats_allow_and_namespace(self) -> None:
        """deny wins over register_op, namespaces and builtins."""
        policy = tcp.CachePolicy(namespaces=[T.NS], allow=[conv], deny=[conv, add])
        self.assertCacheable(policy, conv, False)
        self.assertCacheable(policy, add, False)
        self.assertCacheable(policy, torch.ops.aten.mul.Tensor, True)

    def test_predicate(self) -> None:
        """A predicate decides ops no rule covers."""
        policy = tcp.CachePolicy(predicate=lambda op: op.namespace == "quantized_decomposed")
        self.assertCacheable(policy, q_per_tensor, True)
        self.assertCacheable(policy, conv, False)

    def test_structural_cia_view(self) -> None:
        """A view op with a CompositeImplicitAutograd kernel is never cacheable."""
        policy = tcp.CachePolicy()
        op = torch.ops.aten.view_as.default
        self.assertTrue(op.is_view)
        self.assertCacheable(policy, op, False)
        self.assertEqual(policy.decide(op).label, "CompositeImplicitAutograd")

    def test_no_fake_kernel(self) -> None:
        """An admitted op with nothing to run on meta tensors is not cacheable, and not memoized."""
        policy = tcp.CachePolicy(namespaces=[T.NS])
        self.assertEqual(policy.decide(T.op("no_fake")).label, "no fake kernel")
        self.assertNotIn(T.op("no_fake"), policy._decisions)

    def test_explain(self) -> None:
        """explain() states the verdict, the rule and the kernels looked at."""
        policy = tcp.CachePolicy(namespaces=[T.NS])
        self.assertExpectedInline(
            policy.explain(conv),
            """\
tcp_test::conv.default: cacheable: namespace 'tcp_test' is registered
  kernels registered for: Meta
  per call, the mode still bypasses unbacked scalar outputs, undeclared aliasing and argument mutation""",
        )
        self.assertExpectedInline(
            policy.explain(q_per_tensor),
            """\
quantized_decomposed::quantize_per_tensor.default: not cacheable: namespace 'quantized_decomposed' is not registered
  kernels registered for: CompositeExplicitAutograd, Meta""",
        )

    def test_repr(self) -> None:
        """repr() shows the rules."""
        policy = tcp.CachePolicy(namespaces=["tosa_never_defined", T.NS], deny=[add])
        self.assertExpectedInline(
            repr(policy), """CachePolicy(namespaces=['tcp_test', 'tosa_never_defined'], deny=['aten::add.Tensor'])"""
        )


class TestIdentity(TestCase):
    def test_equal_rules_equal_identity(self) -> None:
        """Two policies with the same rules share identity; order does not matter."""
        a = tcp.CachePolicy(namespaces=["x", T.NS], deny=[add])
        b = tcp.CachePolicy(namespaces=[T.NS, "x"], deny=["aten::add.Tensor"])
        self.assertEqual(a.identity, b.identity)
        self.assertEqual(hash(a.identity), hash(b.identity))

    def test_hooks_count_by_object(self) -> None:
        """A predicate or context hook contributes its object identity."""
        def f(op: Any) -> bool:
            return False

        def g(op: Any) -> bool:
            return False

        self.assertEqual(tcp.CachePolicy(predicate=f).identity, tcp.CachePolicy(predicate=f).identity)
        self.assertNotEqual(tcp.CachePolicy(predicate=f).identity, tcp.CachePolicy(predicate=g).identity)
        self.assertNotEqual(tcp.CachePolicy().identity, tcp.CachePolicy(context_key=lambda: 1).identity)

    def test_rule_change_changes_identity_and_decisions(self) -> None:
        """Registering after use changes identity and refreshes memoized decisions."""
        policy = tcp.CachePolicy()
        before = policy.identity
        self.assertFalse(policy.is_cacheable(conv))
        policy.register_namespace(T.NS)
        self.assertNotEqual(policy.identity, before)
        self.assertTrue(policy.is_cacheable(conv))

    def test_rule_change_during_decide(self) -> None:
        """A deny() issued while decide() runs is never lost to the memo."""
        import threading

        entered, release = threading.Event(), threading.Event()

        def slow(op: Any) -> bool:
            entered.set()
            release.wait(10)
            return True

        policy = tcp.CachePolicy(predicate=slow, include_builtins=False)
        thread = threading.Thread(target=policy.decide, args=(add,))
        thread.start()
        entered.wait(10)
        policy.deny(add)
        release.set()
        thread.join()
        self.assertFalse(policy.is_cacheable(add))

    def test_subclass_identity_differs(self) -> None:
        """A subclass with the same rules is another identity."""
        class Sub(tcp.CachePolicy):
            pass

        self.assertNotEqual(Sub().identity, tcp.CachePolicy().identity)


class TestBadInput(TestCase):
    @parametrize(
        "ns, error, message",
        [
            ("tosa::", ValueError, r"CachePolicy.register_namespace\(...\): 'tosa::' is not a namespace; pass 'tosa'"),
            ("", ValueError, r"'' is not a namespace"),
            ("tosa.ops", ValueError, r"'tosa.ops' is not a namespace"),
            (None, TypeError, r"expected a namespace string or a torch.library.Library, got NoneType"),
            (3, TypeError, r"got int"),
        ],
    )
    def test_register_namespace(self, ns: Any, error: type[Exception], message: str) -> None:
        """Malformed namespaces raise errors that name the API and the fix."""
        with self.assertRaisesRegex(error, message):
            tcp.CachePolicy().register_namespace(ns)

    @parametrize(
        "op, error, message",
        [
            ("tcp_test::nope", ValueError, r"no operator tcp_test::nope is registered"),
            ("tcp_test::conv.nope", ValueError, r"tcp_test::conv has no overload 'nope'"),
            ("conv", ValueError, r"'conv' is not an operator name; pass 'ns::name'"),
            (None, TypeError, r"CachePolicy.register_op\(...\): expected an OpOverload.*got NoneType"),
            (len, TypeError, r"got builtin_function_or_method"),
            (torch.ops.higher_order.cond, TypeError, r"higher-order operators are cached by torch's own rules"),
        ],
    )
    def test_register_op(self, op: Any, error: type[Exception], message: str) -> None:
        """Unknown or wrong-typed ops raise errors that name the API and the fix."""
        with self.assertRaisesRegex(error, message):
            tcp.CachePolicy().register_op(op)

    def test_constructor(self) -> None:
        """Constructor arguments are validated."""
        with self.assertRaisesRegex(TypeError, r"wrap it: namespaces=\['tosa'\]"):
            tcp.CachePolicy(namespaces="tosa")  # type: ignore[arg-type]
        with self.assertRaisesRegex(TypeError, r"include_builtins=...\): expected a bool"):
            tcp.CachePolicy(include_builtins="yes")  # type: ignore[arg-type]
        with self.assertRaisesRegex(TypeError, r"predicate=...\): expected a callable"):
            tcp.CachePolicy(predicate=True)  # type: ignore[arg-type]
        with self.assertRaisesRegex(TypeError, r"context_key=...\): expected a callable"):
            tcp.CachePolicy(context_key=1)  # type: ignore[arg-type]
        with self.assertRaisesRegex(TypeError, r"wrap it: context_namespaces=\['tosa'\]"):
            tcp.CachePolicy(context_namespaces="tosa")  # type: ignore[arg-type]
        with self.assertRaisesRegex(ValueError, r"CachePolicy\(context_namespaces=...\): 'tosa::' is not a namespace"):
            tcp.CachePolicy(context_namespaces=["tosa::"])
        with self.assertRaisesRegex(ValueError, r"CachePolicy\(deny=...\): no operator"):
            tcp.CachePolicy(deny=["aten::no_such_op"])

    def test_decide_rejects_non_overloads(self) -> None:
        """decide() takes an OpOverload only."""
        with self.assertRaisesRegex(TypeError, r"CachePolicy.decide\(...\): expected an OpOverload"):
            tcp.CachePolicy().decide(torch.ops.aten.add)  # type: ignore[arg-type]

    def test_predicate_errors(self) -> None:
        """A predicate that raises or returns a non-bool names the policy and op."""
        def boom(op: Any) -> bool:
            raise KeyError("x")

        with self.assertRaisesRegex(RuntimeError, r"the predicate .*boom.* raised for tcp_test.conv.default"):
            tcp.CachePolicy(predicate=boom).decide(conv)
        with self.assertRaisesRegex(TypeError, r"returned int for tcp_test.conv.default; it must return a Python bool"):
            tcp.CachePolicy(predicate=lambda op: 1).decide(conv)  # type: ignore[arg-type,return-value]

    def test_context_key_errors(self) -> None:
        """A context hook that raises or returns an unhashable fails loudly at dispatch."""
        def raising() -> Any:
            raise ValueError("no spec")

        for hook, error, message in (
            (raising, RuntimeError, r"context_key\(\) raised while dispatching tcp_test.conv.default"),
            (lambda: [1], TypeError, r"returned an unhashable list while dispatching tcp_test.conv.default"),
        ):
            mode = tcp.FakeTensorMode(cache_policy=tcp.CachePolicy(namespaces=[T.NS], context_key=hook))
            with mode, self.assertRaisesRegex(error, message):
                conv(torch.empty(1, 1, 2, 2), 1)

    def test_mode_arguments(self) -> None:
        """FakeTensorMode validates its own keyword arguments."""
        with self.assertRaisesRegex(TypeError, r"FakeTensorMode\(cache_policy=...\): expected a torch_cachepolicy.CachePolicy, got list"):
            tcp.FakeTensorMode(cache_policy=["tosa"])  # type: ignore[arg-type]
        with self.assertRaisesRegex(TypeError, r"FakeTensorMode\(cache_store=...\): expected a torch_cachepolicy.CacheStore, got dict"):
            tcp.FakeTensorMode(cache_store={})  # type: ignore[arg-type]
        with self.assertRaisesRegex(TypeError, r"cache_crosscheck=...\): expected a bool"):
            tcp.FakeTensorMode(cache_crosscheck="on")  # type: ignore[arg-type]
        with self.assertRaisesRegex(TypeError, r"CacheStore\(isolated=...\): expected a bool"):
            tcp.CacheStore(isolated=1)  # type: ignore[arg-type]


_CUSTOM: Any = None


def _custom_op() -> Any:
    global _CUSTOM
    if _CUSTOM is None:

        @torch.library.custom_op("tcp_test::custom_double", mutates_args=())
        def custom_double(x: torch.Tensor) -> torch.Tensor:
            return x * 2

        @custom_double.register_fake
        def _(x: torch.Tensor) -> torch.Tensor:
            return torch.empty_like(x)

        _CUSTOM = custom_double
    return _CUSTOM


instantiate_parametrized_tests(TestRules)
instantiate_parametrized_tests(TestBadInput)


if __name__ == "__main__":
    run_tests()
