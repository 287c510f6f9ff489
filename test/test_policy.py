# Owner(s): ["module: fakeTensor"]
"""Tests of torch_cachepolicy.CachePolicy: rules, identity, explain, bad input."""

from __future__ import annotations

import copy
import functools
import pickle
from collections.abc import Callable
from typing import Any

import cachepolicy_testing as testing
import numpy as np
import torch
from torch.testing._internal.common_utils import (
    TestCase,
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
)

import torch_cachepolicy as tcp
from torch_cachepolicy._names import unhashable_part

conv = testing.op("conv")
add = torch.ops.aten.add.Tensor
q_per_tensor = torch.ops.quantized_decomposed.quantize_per_tensor.default


# Module-level, so pickle can find them by name.
def quantized_only(op: Any) -> bool:
    return bool(op.namespace == "quantized_decomposed")


def fixed_context() -> str:
    return "ctx"


class SpecPolicy(tcp.CachePolicy):
    """A backend's policy: the context is a spec the policy holds."""

    def __init__(self, spec: list[str], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.spec = spec

    def context_key(self) -> Any:
        return tuple(self.spec)


class SlottedPolicy(tcp.CachePolicy):
    __slots__ = ("level",)


def _pickled(protocol: int) -> Callable[[Any], Any]:
    return lambda policy: pickle.loads(pickle.dumps(policy, protocol=protocol))


COPIERS: dict[str, Callable[[Any], Any]] = {
    "copy": copy.copy,
    "deepcopy": copy.deepcopy,
    **{f"pickle{p}": _pickled(p) for p in range(2, pickle.HIGHEST_PROTOCOL + 1)},
}


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
        policy = tcp.CachePolicy(namespaces=[testing.NS], include_builtins=False)
        self.assertCacheable(policy, add, False)
        self.assertCacheable(policy, conv, True)

    def test_register_namespace_decorator_returns_object(self) -> None:
        """@register_namespace(ns) registers at once and returns the decorated object."""
        policy = tcp.CachePolicy()

        @policy.register_namespace(testing.NS)
        def define_ops(lib: Any) -> str:
            return "unchanged"

        self.assertEqual(define_ops(None), "unchanged")
        self.assertCacheable(policy, conv, True)

    def test_register_namespace_accepts_library(self) -> None:
        """A torch.library.Library names its namespace."""
        policy = tcp.CachePolicy()
        lib = torch.library.Library(testing.NS, "FRAGMENT")
        try:
            policy.register_namespace(lib)
        finally:
            lib._destroy()
        self.assertIn(testing.NS, policy.namespaces)

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
        policy = tcp.CachePolicy(namespaces=[testing.NS], allow=[conv], deny=[conv, add])
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
        policy = tcp.CachePolicy(namespaces=[testing.NS])
        self.assertEqual(policy.decide(testing.op("no_fake")).label, "no fake kernel")
        self.assertNotIn(testing.op("no_fake"), policy._decisions)

    def test_explain(self) -> None:
        """explain() states the verdict, the rule and the kernels looked at."""
        policy = tcp.CachePolicy(namespaces=[testing.NS])
        self.assertExpectedInline(
            policy.explain(conv),
            """\
tcp_test::conv.default: cacheable: namespace 'tcp_test' is registered
  kernels registered for: Meta
  per call, the mode still bypasses unbacked scalar outputs, NaN arguments, argument mutation, and any output or input metadata a hit would not reproduce (docs/guide.md)""",
        )
        self.assertExpectedInline(
            policy.explain(q_per_tensor),
            """\
quantized_decomposed::quantize_per_tensor.default: not cacheable: namespace 'quantized_decomposed' is not registered
  kernels registered for: CompositeExplicitAutograd, Meta""",
        )

    def test_repr(self) -> None:
        """repr() shows the rules."""
        policy = tcp.CachePolicy(namespaces=["tosa_never_defined", testing.NS], deny=[add])
        self.assertExpectedInline(
            repr(policy), """CachePolicy(namespaces=['tcp_test', 'tosa_never_defined'], deny=['aten::add.Tensor'])"""
        )


class TestIdentity(TestCase):
    def test_equal_rules_equal_identity(self) -> None:
        """Two policies with the same rules share identity; order does not matter."""
        a = tcp.CachePolicy(namespaces=["x", testing.NS], deny=[add])
        b = tcp.CachePolicy(namespaces=[testing.NS, "x"], deny=["aten::add.Tensor"])
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
        policy.register_namespace(testing.NS)
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


class TestCopy(TestCase):
    def assertIndependent(self, original: tcp.CachePolicy, clone: tcp.CachePolicy) -> None:
        self.assertIs(type(clone), type(original))
        self.assertEqual(repr(clone), repr(original))
        self.assertEqual(clone.identity, original.identity)
        self.assertIsNot(clone._lock, original._lock)
        self.assertIsNot(clone._decisions, original._decisions)
        self.assertEqual(clone._decisions, {})

    @parametrize("how", list(COPIERS))
    def test_copy_is_independent(self, how: str) -> None:
        """A copy has its own lock, memo and rules; identities agree until either side changes a rule."""
        policy = tcp.CachePolicy(
            namespaces=["quantized_decomposed"], deny=[add], predicate=quantized_only, context_key=fixed_context
        )
        self.assertFalse(policy.is_cacheable(conv))  # memoized before the copy
        clone = COPIERS[how](policy)
        self.assertIndependent(policy, clone)

        clone.register_namespace(testing.NS)
        self.assertTrue(clone.is_cacheable(conv))
        self.assertFalse(policy.is_cacheable(conv))
        self.assertNotIn(testing.NS, policy.namespaces)
        self.assertNotEqual(clone.identity, policy.identity)

        policy.register_namespace(testing.NS)
        self.assertEqual(clone.identity, policy.identity)
        policy.deny(conv)
        self.assertNotEqual(clone.identity, policy.identity)
        self.assertTrue(clone.is_cacheable(conv))

    @parametrize("how", list(COPIERS))
    def test_subclass_attributes_are_copied(self, how: str) -> None:
        """A subclass's own attributes, __slots__ included, travel with the copy."""
        policy = SpecPolicy(["TOSA-1.0+INT"], namespaces=[testing.NS])
        clone = COPIERS[how](policy)
        self.assertIndependent(policy, clone)
        self.assertEqual(clone.spec, ["TOSA-1.0+INT"])
        self.assertEqual(clone.context_key(), ("TOSA-1.0+INT",))
        self.assertEqual(clone.spec is policy.spec, how == "copy")

        slotted = SlottedPolicy()
        slotted.level = 3
        clone = COPIERS[how](slotted)
        self.assertIndependent(slotted, clone)
        self.assertEqual(clone.level, 3)

    def test_deepcopy_shares_hooks(self) -> None:
        """deepcopy keeps the predicate and context_key objects, so the identity stays equal."""

        class Spec:
            def key(self) -> str:
                return "ctx"

            def admits(self, op: Any) -> bool:
                return True

        spec = Spec()
        policy = tcp.CachePolicy(predicate=spec.admits, context_key=spec.key)
        clone = copy.deepcopy(policy)
        self.assertIs(clone._predicate, policy._predicate)
        self.assertIs(clone._context_hook, policy._context_hook)
        self.assertEqual(clone.identity, policy.identity)

    def test_lambda_hooks_copy_but_do_not_pickle(self) -> None:
        """copy and deepcopy take any hook; pickle names the hook it cannot pickle and the fix."""

        def local_context() -> str:
            return "ctx"

        class LocalPolicy(tcp.CachePolicy):
            pass

        cases = {
            "predicate=lambda": tcp.CachePolicy(predicate=lambda op: True),
            "context_key=local function": tcp.CachePolicy(context_key=local_context),
            "context_key=partial(local function)": tcp.CachePolicy(context_key=functools.partial(local_context)),
            "local subclass": LocalPolicy(),
        }
        lines = []
        for name, policy in cases.items():
            self.assertEqual(copy.copy(policy).identity, policy.identity)
            self.assertEqual(copy.deepcopy(policy).identity, policy.identity)
            with self.assertRaises(pickle.PicklingError) as caught:
                pickle.dumps(policy)
            lines.append(f"{name}: {caught.exception}")
        self.assertExpectedInline("\n".join(lines), """\
predicate=lambda: pickle.dumps(torch_cachepolicy.CachePolicy(...)): cannot pickle the predicate <lambda>, a lambda in TestCopy.test_lambda_hooks_copy_but_do_not_pickle; pass a module-level function
context_key=local function: pickle.dumps(torch_cachepolicy.CachePolicy(...)): cannot pickle the context_key local_context, a function defined inside TestCopy.test_lambda_hooks_copy_but_do_not_pickle; pass a module-level function
context_key=partial(local function): pickle.dumps(torch_cachepolicy.CachePolicy(...)): cannot pickle the context_key local_context, a function defined inside TestCopy.test_lambda_hooks_copy_but_do_not_pickle; pass a module-level function
local subclass: pickle.dumps(torch_cachepolicy.CachePolicy(...)): cannot pickle a LocalPolicy, a class defined inside TestCopy.test_lambda_hooks_copy_but_do_not_pickle; define the subclass at module level""")


class TestBadInput(TestCase):
    def render_errors(self, calls: list[str], **names: Any) -> str:
        """Runs each call (source text, evaluated with ``P = tcp.CachePolicy``,
        ``ops = torch.ops``, ``names``) and renders ``call -> Error: message``;
        every call must raise."""
        scope = {"P": tcp.CachePolicy, "ops": torch.ops, "conv": conv, **names}
        lines = []
        for call in calls:
            try:
                eval(call, scope)
            except (TypeError, ValueError) as e:
                lines.append(f"{call}\n    -> {type(e).__name__}: {e}")
            else:
                self.fail(f"{call} did not raise")
        return "\n".join(lines)

    @parametrize(
        "ns, error, message",
        [
            (
                "tosa::",
                ValueError,
                r"^torch_cachepolicy\.CachePolicy\.register_namespace\(\.\.\.\): 'tosa::' is not a namespace; pass 'tosa'$",
            ),
            ("", ValueError, r"'' is not a namespace"),
            ("tosa.ops", ValueError, r"'tosa.ops' is not a namespace"),
            (None, TypeError, r"expected a namespace string or a torch.library.Library, got None$"),
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
            (None, TypeError, r"^torch_cachepolicy\.CachePolicy\.register_op\(\.\.\.\): expected an OpOverload.*got None$"),
            (len, TypeError, r"got builtin_function_or_method"),
            (torch.ops.higher_order.cond, TypeError, r"a policy mode never caches higher-order operators"),
        ],
    )
    def test_register_op(self, op: Any, error: type[Exception], message: str) -> None:
        """Unknown or wrong-typed ops raise errors that name the API and the fix."""
        with self.assertRaisesRegex(error, message):
            tcp.CachePolicy().register_op(op)

    def test_constructor_arguments(self) -> None:
        """Each constructor argument of the wrong type names the parameter and what to pass."""
        lib = torch.library.Library(testing.NS, "FRAGMENT")
        try:
            report = self.render_errors(
                [
                    "P(namespaces=None)",
                    "P(namespaces=5)",
                    "P(namespaces='tosa')",
                    "P(namespaces=b'tosa')",
                    "P(namespaces=lib)",
                    "P(namespaces=ops.tcp_test)",
                    "P(namespaces=ops.aten.relu)",
                    "P(namespaces=['tosa', 3])",
                    "P(namespaces=[ops.tcp_test])",
                    "P(namespaces=[ops.aten.relu.default])",
                    "P(namespaces=['tosa::'])",
                    "P(include_builtins='yes')",
                    "P(include_builtins=None)",
                    "P(allow=None)",
                    "P(allow='ns::op')",
                    "P(allow=ops.tcp_test)",
                    "P(allow=custom)",
                    "P(allow=ops.higher_order.cond)",
                    "P(allow=3)",
                    "P(allow=['ns::op'])",
                    "P(allow=[ops.aten.relu, [ops.aten.add]])",
                    "P(allow=[lib])",
                    "P(allow=['tcp_test::conv.'])",
                    "P(deny=ops.aten.relu)",
                    "P(deny=ops.aten.relu.default)",
                    "P(deny=ops.aten)",
                    "P(deny=[ops.higher_order.cond])",
                    "P(deny=['aten::no_such_op'])",
                    "P(deny=['tcp_test::conv.'])",
                    "P(predicate=True)",
                    "P(predicate=ops.aten.relu.default)",
                    "P(context_key='TOSA-1.0+INT')",
                    "P(context_key=ops.aten.relu)",
                    "P(context_namespaces=5)",
                    "P(context_namespaces='tosa')",
                    "P(context_namespaces=conv)",
                    "P(context_namespaces=[custom])",
                    "P(context_namespaces=['tosa::'])",
                ],
                lib=lib,
                custom=_custom_op(),
            )
        finally:
            lib._destroy()
        self.assertExpectedInline(report, """\
P(namespaces=None)
    -> TypeError: torch_cachepolicy.CachePolicy(namespaces=...): expected a list of namespaces, got None; pass namespaces=[] or leave it out
P(namespaces=5)
    -> TypeError: torch_cachepolicy.CachePolicy(namespaces=...): expected a list of namespaces, got int
P(namespaces='tosa')
    -> TypeError: torch_cachepolicy.CachePolicy(namespaces=...): expected a list of namespaces, got the string 'tosa'; wrap it: namespaces=['tosa']
P(namespaces=b'tosa')
    -> TypeError: torch_cachepolicy.CachePolicy(namespaces=...): expected a list of namespaces, got bytes
P(namespaces=lib)
    -> TypeError: torch_cachepolicy.CachePolicy(namespaces=...): expected a list of namespaces, got the torch.library.Library of 'tcp_test'; wrap it: namespaces=['tcp_test']
P(namespaces=ops.tcp_test)
    -> TypeError: torch_cachepolicy.CachePolicy(namespaces=...): expected a list of namespaces, got the operator namespace torch.ops.tcp_test; wrap it: namespaces=['tcp_test']
P(namespaces=ops.aten.relu)
    -> TypeError: torch_cachepolicy.CachePolicy(namespaces=...): expected a list of namespaces, got the OpOverloadPacket aten::relu; to cache single operators pass allow=[torch.ops.aten.relu]
P(namespaces=['tosa', 3])
    -> TypeError: torch_cachepolicy.CachePolicy(namespaces=...): element [1]: expected a namespace string or a torch.library.Library, got int
P(namespaces=[ops.tcp_test])
    -> TypeError: torch_cachepolicy.CachePolicy(namespaces=...): element [0]: expected a namespace string or a torch.library.Library, got the operator namespace torch.ops.tcp_test; pass its name: 'tcp_test'
P(namespaces=[ops.aten.relu.default])
    -> TypeError: torch_cachepolicy.CachePolicy(namespaces=...): element [0]: expected a namespace string or a torch.library.Library, got the OpOverload aten::relu.default; to cache single operators pass allow=[torch.ops.aten.relu.default]
P(namespaces=['tosa::'])
    -> ValueError: torch_cachepolicy.CachePolicy(namespaces=...): element [0]: 'tosa::' is not a namespace; pass 'tosa'
P(include_builtins='yes')
    -> TypeError: torch_cachepolicy.CachePolicy(include_builtins=...): expected True or False, got the string 'yes'
P(include_builtins=None)
    -> TypeError: torch_cachepolicy.CachePolicy(include_builtins=...): expected True or False, got None
P(allow=None)
    -> TypeError: torch_cachepolicy.CachePolicy(allow=...): expected a list of operators, got None; pass allow=[] or leave it out
P(allow='ns::op')
    -> TypeError: torch_cachepolicy.CachePolicy(allow=...): expected a list of operators, got the string 'ns::op'; wrap it: allow=['ns::op']
P(allow=ops.tcp_test)
    -> TypeError: torch_cachepolicy.CachePolicy(allow=...): expected a list of operators, got the operator namespace torch.ops.tcp_test; to cache every operator of 'tcp_test' pass namespaces=['tcp_test']
P(allow=custom)
    -> TypeError: torch_cachepolicy.CachePolicy(allow=...): expected a list of operators, got the custom_op tcp_test::custom_double; wrap it: allow=[torch.ops.tcp_test.custom_double.default]
P(allow=ops.higher_order.cond)
    -> TypeError: torch_cachepolicy.CachePolicy(allow=...): expected a list of operators, got the higher-order operator cond; a policy mode never caches higher-order operators, only the ops of their subgraphs
P(allow=3)
    -> TypeError: torch_cachepolicy.CachePolicy(allow=...): expected a list of operators, got int
P(allow=['ns::op'])
    -> ValueError: torch_cachepolicy.CachePolicy(allow=...): element [0]: no operator ns::op is registered; define it (or import the module that defines it) before naming it in a policy
P(allow=[ops.aten.relu, [ops.aten.add]])
    -> TypeError: torch_cachepolicy.CachePolicy(allow=...): element [1]: expected an OpOverload, OpOverloadPacket, 'ns::name.overload' string or torch.library.custom_op, got list
P(allow=[lib])
    -> TypeError: torch_cachepolicy.CachePolicy(allow=...): element [0]: expected an OpOverload, OpOverloadPacket, 'ns::name.overload' string or torch.library.custom_op, got the torch.library.Library of 'tcp_test'; to cache every operator of 'tcp_test' pass namespaces=['tcp_test']
P(allow=['tcp_test::conv.'])
    -> ValueError: torch_cachepolicy.CachePolicy(allow=...): element [0]: 'tcp_test::conv.' ends with '.'; pass 'tcp_test::conv' (every overload) or 'tcp_test::conv.<overload>'
P(deny=ops.aten.relu)
    -> TypeError: torch_cachepolicy.CachePolicy(deny=...): expected a list of operators, got the OpOverloadPacket aten::relu; wrap it: deny=[torch.ops.aten.relu]
P(deny=ops.aten.relu.default)
    -> TypeError: torch_cachepolicy.CachePolicy(deny=...): expected a list of operators, got the OpOverload aten::relu.default; wrap it: deny=[torch.ops.aten.relu.default]
P(deny=ops.aten)
    -> TypeError: torch_cachepolicy.CachePolicy(deny=...): expected a list of operators, got the operator namespace torch.ops.aten; deny takes single operators; to stop caching a namespace leave it out of namespaces=[...] (include_builtins=False for aten, prim and prims)
P(deny=[ops.higher_order.cond])
    -> TypeError: torch_cachepolicy.CachePolicy(deny=...): element [0]: expected an OpOverload, OpOverloadPacket, 'ns::name.overload' string or torch.library.custom_op, got the higher-order operator cond; a policy mode never caches higher-order operators, only the ops of their subgraphs
P(deny=['aten::no_such_op'])
    -> ValueError: torch_cachepolicy.CachePolicy(deny=...): element [0]: no operator aten::no_such_op is registered; define it (or import the module that defines it) before naming it in a policy
P(deny=['tcp_test::conv.'])
    -> ValueError: torch_cachepolicy.CachePolicy(deny=...): element [0]: 'tcp_test::conv.' ends with '.'; pass 'tcp_test::conv' (every overload) or 'tcp_test::conv.<overload>'
P(predicate=True)
    -> TypeError: torch_cachepolicy.CachePolicy(predicate=...): expected a function f(op) -> bool or None, got True
P(predicate=ops.aten.relu.default)
    -> TypeError: torch_cachepolicy.CachePolicy(predicate=...): expected a function f(op) -> bool or None, got the OpOverload aten::relu.default; to cache single operators pass allow=[torch.ops.aten.relu.default]
P(context_key='TOSA-1.0+INT')
    -> TypeError: torch_cachepolicy.CachePolicy(context_key=...): expected a function f() -> Hashable or None, got the string 'TOSA-1.0+INT'
P(context_key=ops.aten.relu)
    -> TypeError: torch_cachepolicy.CachePolicy(context_key=...): expected a function f() -> Hashable or None, got the OpOverloadPacket aten::relu
P(context_namespaces=5)
    -> TypeError: torch_cachepolicy.CachePolicy(context_namespaces=...): expected a list of namespaces, got int
P(context_namespaces='tosa')
    -> TypeError: torch_cachepolicy.CachePolicy(context_namespaces=...): expected a list of namespaces, got the string 'tosa'; wrap it: context_namespaces=['tosa']
P(context_namespaces=conv)
    -> TypeError: torch_cachepolicy.CachePolicy(context_namespaces=...): expected a list of namespaces, got the OpOverload tcp_test::conv.default; pass its namespace: context_namespaces=['tcp_test']
P(context_namespaces=[custom])
    -> TypeError: torch_cachepolicy.CachePolicy(context_namespaces=...): element [0]: expected a namespace string or a torch.library.Library, got the custom_op tcp_test::custom_double; pass its namespace: context_namespaces=['tcp_test']
P(context_namespaces=['tosa::'])
    -> ValueError: torch_cachepolicy.CachePolicy(context_namespaces=...): element [0]: 'tosa::' is not a namespace; pass 'tosa'""")

    def test_method_arguments(self) -> None:
        """Each method argument of the wrong type names the method and what to pass."""
        report = self.render_errors(
            [
                "P().register_namespace(['tosa', 'cortex_m'])",
                "P().register_namespace(ops.tcp_test)",
                "P().register_namespace(ops.aten.relu)",
                "P().register_op([conv])",
                "P().register_op(ops.tcp_test)",
                "P().register_op('tcp_test::conv.')",
                "P().deny(op for op in [conv])",
                "P().deny(ops.aten)",
                "P().decide(ops.aten.add)",
                "P().decide([conv])",
                "P().is_cacheable(custom)",
                "P().explain('tcp_test::conv.default')",
                "P().explain(ops.higher_order.cond)",
            ],
            custom=_custom_op(),
        )
        self.assertExpectedInline(report, """\
P().register_namespace(['tosa', 'cortex_m'])
    -> TypeError: torch_cachepolicy.CachePolicy.register_namespace(...): expected a namespace string or a torch.library.Library, got list; call register_namespace once per namespace
P().register_namespace(ops.tcp_test)
    -> TypeError: torch_cachepolicy.CachePolicy.register_namespace(...): expected a namespace string or a torch.library.Library, got the operator namespace torch.ops.tcp_test; pass its name: 'tcp_test'
P().register_namespace(ops.aten.relu)
    -> TypeError: torch_cachepolicy.CachePolicy.register_namespace(...): expected a namespace string or a torch.library.Library, got the OpOverloadPacket aten::relu; to cache one operator use register_op(torch.ops.aten.relu)
P().register_op([conv])
    -> TypeError: torch_cachepolicy.CachePolicy.register_op(...): expected an OpOverload, OpOverloadPacket, 'ns::name.overload' string or torch.library.custom_op, got list; call register_op once per operator
P().register_op(ops.tcp_test)
    -> TypeError: torch_cachepolicy.CachePolicy.register_op(...): expected an OpOverload, OpOverloadPacket, 'ns::name.overload' string or torch.library.custom_op, got the operator namespace torch.ops.tcp_test; to cache every operator of 'tcp_test' use register_namespace('tcp_test')
P().register_op('tcp_test::conv.')
    -> ValueError: torch_cachepolicy.CachePolicy.register_op(...): 'tcp_test::conv.' ends with '.'; pass 'tcp_test::conv' (every overload) or 'tcp_test::conv.<overload>'
P().deny(op for op in [conv])
    -> TypeError: torch_cachepolicy.CachePolicy.deny(...): expected an OpOverload, OpOverloadPacket, 'ns::name.overload' string or torch.library.custom_op, got generator; call deny once per operator
P().deny(ops.aten)
    -> TypeError: torch_cachepolicy.CachePolicy.deny(...): expected an OpOverload, OpOverloadPacket, 'ns::name.overload' string or torch.library.custom_op, got the operator namespace torch.ops.aten; deny takes single operators; to stop caching a namespace leave it out of namespaces=[...] (include_builtins=False for aten, prim and prims)
P().decide(ops.aten.add)
    -> TypeError: torch_cachepolicy.CachePolicy.decide(...): expected an OpOverload (torch.ops.ns.name.overload), got the OpOverloadPacket aten::add; pick one of its overloads, e.g. torch.ops.aten.add.Tensor
P().decide([conv])
    -> TypeError: torch_cachepolicy.CachePolicy.decide(...): expected an OpOverload (torch.ops.ns.name.overload), got list
P().is_cacheable(custom)
    -> TypeError: torch_cachepolicy.CachePolicy.is_cacheable(...): expected an OpOverload (torch.ops.ns.name.overload), got the custom_op tcp_test::custom_double; pass its overload, torch.ops.tcp_test.custom_double.default
P().explain('tcp_test::conv.default')
    -> TypeError: torch_cachepolicy.CachePolicy.explain(...): expected an OpOverload (torch.ops.ns.name.overload), got the string 'tcp_test::conv.default'
P().explain(ops.higher_order.cond)
    -> TypeError: torch_cachepolicy.CachePolicy.explain(...): expected an OpOverload (torch.ops.ns.name.overload), got the higher-order operator cond; a policy mode never caches higher-order operators, only the ops of their subgraphs""")

    def test_generators_are_read_once(self) -> None:
        """Any iterable works, a generator included: it is read once, checked and stored."""
        policy = tcp.CachePolicy(
            namespaces=(ns for ns in ["quantized_decomposed"]),
            allow=(op for op in [conv]),
            deny=(op for op in [add]),
            context_namespaces=(ns for ns in [testing.NS]),
        )
        self.assertExpectedInline(
            repr(policy),
            """CachePolicy(namespaces=['quantized_decomposed'], allow=['tcp_test::conv.default'], deny=['aten::add.Tensor'], context_namespaces=['tcp_test'])""",
        )
        self.assertTrue(policy.is_cacheable(conv))
        self.assertFalse(policy.is_cacheable(add))

    def test_predicate_errors(self) -> None:
        """A predicate that raises or returns a non-bool names the policy and op."""
        def boom(op: Any) -> bool:
            raise KeyError("x")

        with self.assertRaisesRegex(
            RuntimeError,
            r"^torch_cachepolicy\.CachePolicy\(predicate=\.\.\.\): the predicate .*boom.* raised for "
            r"tcp_test\.conv\.default: KeyError\('x'\); make it return True or False for every operator$",
        ):
            tcp.CachePolicy(predicate=boom).decide(conv)
        with self.assertRaisesRegex(
            TypeError,
            r"^torch_cachepolicy\.CachePolicy\(predicate=\.\.\.\): the predicate .* returned int for "
            r"tcp_test\.conv\.default; make it return a Python bool$",
        ):
            tcp.CachePolicy(predicate=lambda op: 1).decide(conv)  # type: ignore[arg-type,return-value]

    def test_context_key_errors(self) -> None:
        """A context hook that raises, or returns a value whose hash raises anything, fails naming the hook."""
        def raising() -> Any:
            raise ValueError("no spec")

        class Unhashable:
            def __hash__(self) -> int:
                raise ValueError("no hash")

        for hook, error, message in (
            (
                raising,
                RuntimeError,
                r"^torch_cachepolicy\.CachePolicy\.context_key\(\): raised ValueError\('no spec'\) while dispatching "
                r"tcp_test\.conv\.default; it must return a value in every context the policy's modes dispatch a "
                r"backend operator in$",
            ),
            (
                lambda: (Unhashable(),),
                TypeError,
                r"^torch_cachepolicy\.CachePolicy\.context_key\(\): returned an unhashable tuple while dispatching "
                r"tcp_test\.conv\.default: element \[0\] of the tuple is an Unhashable \(hash\(\) raised ValueError: "
                r"no hash\); return a hashable value such as a tuple or a string$",
            ),
            (
                lambda: [1],
                TypeError,
                r"^torch_cachepolicy\.CachePolicy\.context_key\(\): returned an unhashable list while dispatching "
                r"tcp_test\.conv\.default: the value is a list; return a hashable value such as a tuple or a string$",
            ),
        ):
            mode = tcp.FakeTensorMode(cache_policy=tcp.CachePolicy(namespaces=[testing.NS], context_key=hook))
            with mode, self.assertRaisesRegex(error, message):
                conv(torch.empty(1, 1, 2, 2), 1)

    def test_unhashable_part(self) -> None:
        """unhashable_part() points into nested tuples at the first part that does not hash."""

        class Spec:
            def __init__(self, extensions: list[str]) -> None:
                self.extensions = extensions

            def __hash__(self) -> int:
                return hash(tuple(self.extensions)) if self.extensions else hash(self.extensions)

        values: dict[str, object] = {
            "'TOSA-1.0+INT'": "TOSA-1.0+INT",
            "('TOSA', frozenset({'int16'}))": ("TOSA", frozenset({"int16"})),
            "['TOSA']": ["TOSA"],
            "('TOSA', ['int16'])": ("TOSA", ["int16"]),
            "('TOSA', ('INT', {'int16': True}), [])": ("TOSA", ("INT", {"int16": True}), []),
            "(Spec([]),)": (Spec([]),),
        }
        self.assertExpectedInline(
            "\n".join(f"{name}: {unhashable_part(value)}" for name, value in values.items()),
            """\
'TOSA-1.0+INT': None
('TOSA', frozenset({'int16'})): None
['TOSA']: the value is a list
('TOSA', ['int16']): element [1] of the tuple is a list
('TOSA', ('INT', {'int16': True}), []): element [1][1] of the tuple is a dict
(Spec([]),): element [0] of the tuple is a Spec (hash() raised TypeError: unhashable type: 'list')""",
        )

    @parametrize("entry", ["FakeTensorMode", "adopt", "torch_cachepolicy.export"])
    def test_cache_arguments(self, entry: str) -> None:
        """FakeTensorMode, adopt and export check cache_policy, cache_store and cache_crosscheck alike."""
        module, inputs = torch.nn.ReLU(), (torch.randn(2),)
        calls: dict[str, Callable[..., object]] = {
            "FakeTensorMode": tcp.FakeTensorMode,
            "adopt": functools.partial(tcp.adopt, torch.export.export(module, inputs)),
            "torch_cachepolicy.export": functools.partial(tcp.export, module, inputs),
        }
        call = calls[entry]
        messages = []
        for kwargs in (
            {"cache_policy": ["tosa"]},
            {"cache_policy": tcp.CacheStore()},
            {"cache_store": {}},
            {"cache_store": tcp.CachePolicy()},
            {"cache_crosscheck": "on"},
        ):
            with self.assertRaises(TypeError) as ctx:
                call(**kwargs)
            api = "torch_cachepolicy." + entry.removeprefix("torch_cachepolicy.")
            messages.append(str(ctx.exception).replace(f"{api}(", "torch_cachepolicy.<entry>(", 1))
        self.assertExpectedInline(
            "\n".join(messages),
            """\
torch_cachepolicy.<entry>(cache_policy=...): expected a torch_cachepolicy.CachePolicy or None, got list; build one from namespaces: CachePolicy(namespaces=[...])
torch_cachepolicy.<entry>(cache_policy=...): expected a torch_cachepolicy.CachePolicy or None, got torch_cachepolicy.store.CacheStore; pass a CacheStore as cache_store=...
torch_cachepolicy.<entry>(cache_store=...): expected a torch_cachepolicy.CacheStore or None, got dict
torch_cachepolicy.<entry>(cache_store=...): expected a torch_cachepolicy.CacheStore or None, got torch_cachepolicy.policy.CachePolicy; pass a CachePolicy as cache_policy=...
torch_cachepolicy.<entry>(cache_crosscheck=...): expected True, False or None, got the string 'on'""",
        )

    def test_store_arguments(self) -> None:
        """CacheStore validates its own keyword argument."""
        with self.assertRaisesRegex(
            TypeError, r"^torch_cachepolicy\.CacheStore\(isolated=\.\.\.\): expected True or False, got int$"
        ):
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


class TestDecisionsMustBeBools(TestCase):
    """A decision is a CacheDecision of bools; anything else raises TypeError instead of admitting or denying."""

    @parametrize("value", ["int", "np_bool", "str"])
    def test_cache_decision_takes_bools_only(self, value: str) -> None:
        """CacheDecision(cacheable=...) and (explicit=...) reject truthy non-bools at construction."""
        bad = {"int": 1, "np_bool": np.bool_(True), "str": "no"}[value]
        with self.assertRaisesRegex(TypeError, r"CacheDecision\(\.\.\.\): cacheable and explicit must be bool"):
            tcp.CacheDecision(bad, "user rule", "cacheable")  # type: ignore[arg-type]
        with self.assertRaisesRegex(TypeError, r"CacheDecision\(\.\.\.\): cacheable and explicit must be bool"):
            tcp.CacheDecision(True, "user rule", "cacheable", bad)  # type: ignore[arg-type]

    @parametrize("answer", ["bare_bool", "np_bool", "none"])
    def test_decide_override_must_return_a_cache_decision(self, answer: str) -> None:
        """A decide() override returning anything but a CacheDecision raises TypeError naming decide."""
        value = {"bare_bool": True, "np_bool": np.bool_(True), "none": None}[answer]

        class Overriding(tcp.CachePolicy):
            def decide(self, op: Any) -> Any:
                return value

        mode = tcp.FakeTensorMode(cache_policy=Overriding(namespaces=[testing.NS]))
        with self.assertRaisesRegex(TypeError, r"CachePolicy\.decide\(\.\.\.\): Overriding\.decide\(.*\) returned"):
            with mode:
                testing.op("pair")(torch.empty(2))


class TestWhoDecides(TestCase):
    """Note [Who decides about builtins]: decide() is asked about backend ops only, once per op and policy identity."""

    def test_builtins_follow_the_static_rules_whatever_decide_says(self) -> None:
        """A decide() override is never asked about aten ops: they follow deny() and include_builtins."""
        asked: list[str] = []

        class DeniesEverything(tcp.CachePolicy):
            def decide(self, op: Any) -> tcp.CacheDecision:
                asked.append(op.namespace)
                return tcp.CacheDecision(False, "this override denies everything", "denied by policy")

        policy = DeniesEverything(namespaces=[testing.NS])
        policy.deny(torch.ops.aten.sin.default)
        mode = tcp.FakeTensorMode(cache_policy=policy, cache_store=tcp.CacheStore(isolated=True))
        with mode:
            x = torch.empty(3)
            for _ in range(2):
                x.add(1), x.sin(), testing.op("pair")(x)
        report = mode.cache_report()
        self.assertEqual((report[torch.ops.aten.add.Tensor].hits, report[torch.ops.aten.add.Tensor].misses), (1, 1))
        self.assertEqual(report[torch.ops.aten.sin.default].bypasses, {"denied by policy": 2})
        self.assertEqual(report[testing.op("pair")].bypasses, {"denied by policy": 2})
        self.assertEqual(asked, [testing.NS])  # once per op and policy identity, backend ops only


instantiate_parametrized_tests(TestRules)
instantiate_parametrized_tests(TestCopy)
instantiate_parametrized_tests(TestBadInput)
instantiate_parametrized_tests(TestDecisionsMustBeBools)
instantiate_parametrized_tests(TestWhoDecides)


if __name__ == "__main__":
    run_tests()
