# Owner(s): ["module: fakeTensor"]
"""Seeded random policies and random sequences of rule changes and dispatches.

For every seed, a ``random.Random(seed)`` builds random policies, gives them
to two modes (sometimes sharing one policy, sometimes one store), and then
interleaves ``register_namespace`` / ``register_op`` / ``deny`` / policy
replacement with dispatches of tcp_test, quantized_decomposed and aten ops
(each drawn call twice in a row).
After every step:

* ``policy.decide(op).cacheable`` (and the label) equals a small reference
  model of the rules: deny > allow > builtins / namespaces > predicate > not
  cacheable, then the two structural exclusions the universe contains (a
  CompositeImplicitAutograd view, an op without a fake kernel);
* every dispatch returns what an uncached dispatch of the same call in the
  same mode returns (metadata, values, aliasing), with crosscheck on;
* the dispatch is counted as the model predicts: a bypass with the decision's
  label, a backend safety bypass (after the key's first sight, a miss), or a
  hit exactly when an equal key was computed before (twice before, for a
  backend op) under an equal policy, in the same store, under the same context
  value (for backend ops of the policy's ``context_namespaces``).

``TestZooFuzz`` draws a dozen kernel-zoo behaviours per seed (``zoo_ops.CASES``, documented limits excluded) and
interleaves their calls with events (context and default dtype changes, re-registered kernels, new subgraphs, denied
ops, ``cache_clear``) in one or two modes sharing a store; every call must match an uncached dispatch of the same call
on identically built inputs (``zoo_ops.describe_call``).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import pathlib
import pickle
import random
import re
import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import cachepolicy_testing as testing
import torch
import zoo_ops as zoo
from torch._ops import OpOverload
from torch._subclasses.fake_tensor import disable_fake_tensor_cache, extract_tensor_metadata
from torch.fx.experimental.symbolic_shapes import ShapeEnv, free_unbacked_symbols
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
)

import torch_cachepolicy as tcp

SEEDS = range(12)
STEPS = 150
BUILTIN = {"aten", "prim", "prims"}
NAMESPACES = [testing.NS, "quantized_decomposed", "aten", "tosa_fuzz_never_defined"]

aten, qd = torch.ops.aten, torch.ops.quantized_decomposed

# The operator universe: name -> (op, argument builder from a pool of fake tensors).
Pool = dict[str, torch.Tensor]
Builder = Callable[[Pool, random.Random], tuple[Any, ...]]


def _2d(p: Pool, r: random.Random) -> torch.Tensor:
    return p[r.choice(["a", "b", "sq"])]


UNIVERSE: dict[str, tuple[OpOverload, Builder]] = {
    "conv": (testing.op("conv"), lambda p, r: (p[r.choice(["c1", "c2"])], r.choice([1, 2]))),
    "pair": (testing.op("pair"), lambda p, r: (_2d(p, r),)),
    "size0": (testing.op("size0"), lambda p, r: (_2d(p, r),)),
    "dyn": (testing.op("dyn"), lambda p, r: (_2d(p, r),)),
    "bad_view": (testing.op("bad_view"), lambda p, r: (_2d(p, r),)),
    "good_view": (testing.op("good_view"), lambda p, r: (_2d(p, r),)),
    "multi_view": (testing.op("multi_view"), lambda p, r: (_2d(p, r), p["v"])),
    "mut": (testing.op("mut"), lambda p, r: (_2d(p, r),)),
    "no_fake": (testing.op("no_fake"), lambda p, r: (_2d(p, r),)),
    "quantize": (qd.quantize_per_tensor.default, lambda p, r: (_2d(p, r), 0.1, 0, -128, 127, torch.int8)),
    "dequantize": (qd.dequantize_per_tensor.default, lambda p, r: (p["i8"], r.choice([0.1, 0.5]), 0, -128, 127, torch.int8)),
    "add": (aten.add.Tensor, lambda p, r: (_2d(p, r),) * 2),
    "sin": (aten.sin.default, lambda p, r: (_2d(p, r),)),
    "t": (aten.t.default, lambda p, r: (_2d(p, r),)),
    "mm": (aten.mm.default, lambda p, r: (p["sq"], p["sq"])),
    "sum": (aten.sum.dim_IntList, lambda p, r: (_2d(p, r), [r.choice([0, 1])])),
}
# Decided on, never dispatched: a CompositeImplicitAutograd view decomposes
# before it reaches any Python mode, so no mode ever counts it.
OPS = [op for op, _ in UNIVERSE.values()] + [aten.view_as.default]
# The structural exclusions present in the universe (checked in test_universe).
CIA_VIEWS = {aten.view_as.default}
NO_FAKE_KERNEL = {testing.op("no_fake")}
# Backend ops that a per-call safety check always bypasses, and the reason.
SAFETY = {
    testing.op("dyn"): "unbacked symbol in scalar output",
    testing.op("bad_view"): "output aliases an input without a schema annotation",
    testing.op("multi_view"): "view op with several tensor arguments",
}
MUTATES = (testing.op("mut"), "mutates an argument (allow it with register_op)")


def make_pool() -> Pool:
    """Called inside a mode: the fake tensors dispatches draw their arguments from."""
    return {
        "a": torch.empty(3, 4),
        "b": torch.empty(2, 5),
        "sq": torch.empty(4, 4),
        "v": torch.empty(4),
        "c1": torch.empty(1, 2, 4, 4),
        "c2": torch.empty(2, 1, 5, 5),
        "i8": torch.empty(3, 4, dtype=torch.int8),
    }


# The ambient state context hooks report; the fuzzer switches it.
CONTEXT = {"spec": "tosa-1.0"}
SPECS = ["tosa-1.0", "tosa-1.1"]


def spec_context() -> Hashable:
    """A context hook shared by policies, so equal rules still mean equal partitions."""
    return CONTEXT["spec"]


class NamePredicate:
    """predicate=: accepts the ops whose name is in ``names``."""

    def __init__(self, names: frozenset[str]) -> None:
        self.names = names

    def __call__(self, op: OpOverload) -> bool:
        return op.name() in self.names

    def __repr__(self) -> str:
        return f"NamePredicate({sorted(self.names)})"


# ----------------------------------------------------------- reference model


def overload_rule(op: OpOverload) -> str:
    return f"{op._schema.name}.{op._overloadname}"


@dataclass
class Model:
    """The rules of one CachePolicy, kept independently of it."""

    policy: tcp.CachePolicy
    include_builtins: bool
    namespaces: set[str] = field(default_factory=set)
    allow: set[str] = field(default_factory=set)
    deny: set[str] = field(default_factory=set)
    predicate: NamePredicate | None = None
    context: Callable[[], Hashable] | None = None
    context_namespaces: frozenset[str] | None = None

    def identity(self) -> Hashable:
        return (
            self.include_builtins,
            frozenset(self.namespaces),
            frozenset(self.allow),
            frozenset(self.deny),
            self.predicate,
            self.context,
            self.context_namespaces,
        )

    def context_value(self, op: OpOverload) -> Hashable:
        """The context an entry of ``op`` is made under: backend ops of a context namespace only."""
        if self.context is None or op.namespace in BUILTIN:
            return None
        if self.context_namespaces is not None and op.namespace not in self.context_namespaces:
            return None
        return self.context()

    def decide(self, op: OpOverload) -> tuple[bool, str, bool]:
        """(cacheable, label, explicit) by the documented rules."""
        rules = {overload_rule(op), op._schema.name}
        if rules & self.deny:
            return False, "denied by policy", False
        explicit = bool(rules & self.allow)
        builtin = op.namespace in BUILTIN
        admitted = (
            explicit
            or (builtin and self.include_builtins)
            or op.namespace in self.namespaces
            or (self.predicate is not None and self.predicate(op))
        )
        if not admitted:
            return False, "builtin excluded by policy" if builtin else "non-builtin", False
        if op in CIA_VIEWS:
            return False, "CompositeImplicitAutograd", False
        if op in NO_FAKE_KERNEL:
            return False, "no fake kernel", False
        return True, "cacheable", explicit


def rule_form(op: OpOverload, r: random.Random) -> tuple[object, str]:
    """A random way to name ``op`` (or its packet) in a rule, and the rule it means."""
    packet = getattr(getattr(torch.ops, op.namespace), op._schema.name.split("::")[1])
    return r.choice(
        [
            (op, overload_rule(op)),
            (overload_rule(op), overload_rule(op)),
            (packet, op._schema.name),
            (op._schema.name, op._schema.name),
        ]
    )


def random_policy(r: random.Random) -> Model:
    include_builtins = r.random() < 0.7
    namespaces = set(r.sample(NAMESPACES, r.randint(0, 2)))
    allow, deny = {}, {}
    for target in (allow, deny):
        for op in r.sample(OPS, r.randint(0, 2)):
            form, rule = rule_form(op, r)
            target[rule] = form
    predicate = NamePredicate(frozenset(op.name() for op in r.sample(OPS, 3))) if r.random() < 0.3 else None
    context = spec_context if r.random() < 0.4 else None
    context_namespaces = frozenset(r.sample(NAMESPACES[:2], r.randint(0, 2))) if r.random() < 0.5 else None
    policy = tcp.CachePolicy(
        namespaces=sorted(namespaces),
        include_builtins=include_builtins,
        allow=list(allow.values()),
        deny=list(deny.values()),
        predicate=predicate,
        context_key=context,
        context_namespaces=None if context_namespaces is None else sorted(context_namespaces),
    )
    return Model(policy, include_builtins, namespaces, set(allow), set(deny), predicate, context, context_namespaces)


# --------------------------------------------------------------------- fuzzer


def metadata_key(value: object) -> object:
    if isinstance(value, torch.Tensor):
        md = extract_tensor_metadata(value)  # what torch's cache key holds for a tensor
        return tuple(getattr(md, f.name) for f in dataclasses.fields(md))
    if isinstance(value, (list, tuple)):
        return tuple(metadata_key(v) for v in value)
    return (type(value), value)


@dataclass
class ModeUnderTest:
    mode: tcp.FakeTensorMode
    model: Model
    seen: collections.Counter[Hashable]  # how often each key was computed in this mode's store (shared by modes sharing it)
    exact: bool  # isolated store: aten hits are predictable too
    pool: Pool


class Fuzzer:
    def __init__(self, seed: int) -> None:
        self.r = random.Random(seed)
        self.log: list[str] = []
        self.outcomes: collections.Counter[str] = collections.Counter()
        self.symbols: dict[int, set[object]] = collections.defaultdict(set)  # per mode (ShapeEnv)
        self.models: list[Model] = []
        shared_store = self.r.random() < 0.5
        isolated = self.r.random() < 0.75
        stores = [tcp.CacheStore(isolated=isolated)] * 2 if shared_store else [tcp.CacheStore(isolated=isolated) for _ in range(2)]
        seen_sets: list[collections.Counter[Hashable]] = (
            [collections.Counter()] * 2 if shared_store else [collections.Counter(), collections.Counter()]
        )
        self.modes = []
        for store, seen in zip(stores, seen_sets, strict=True):
            model = self.new_model()
            # Crosscheck on, as the test class has it (a CrosscheckError fails the run).
            mode = tcp.FakeTensorMode(cache_policy=model.policy, cache_store=store, shape_env=ShapeEnv())
            with mode:
                pool = make_pool()
            self.modes.append(ModeUnderTest(mode, model, seen, isolated, pool))
        self.log.append(f"stores shared={shared_store} isolated={isolated}; policies {[m.model.policy for m in self.modes]}")

    def new_model(self) -> Model:
        if self.models and self.r.random() < 0.3:
            return self.r.choice(self.models)  # the same policy object in several places
        model = random_policy(self.r)
        self.models.append(model)
        return model

    # The actions; each appends a line to the log, which failure messages print.

    def register_namespace(self) -> None:
        model, ns = self.r.choice(self.models), self.r.choice(NAMESPACES)
        self.log.append(f"{model.policy!r}.register_namespace({ns!r})")
        lib_form = testing.TEST_OPS.lib if ns == testing.NS and self.r.random() < 0.5 else ns
        self.check_decorator(model.policy.register_namespace(lib_form))
        model.namespaces.add(ns)

    def register_op(self) -> None:
        model = self.r.choice(self.models)
        form, rule = rule_form(self.r.choice(OPS), self.r)
        self.log.append(f"{model.policy!r}.register_op({form!r})")
        self.check_decorator(model.policy.register_op(form))
        model.allow.add(rule)

    def deny(self) -> None:
        model = self.r.choice(self.models)
        form, rule = rule_form(self.r.choice(OPS), self.r)
        self.log.append(f"{model.policy!r}.deny({form!r})")
        self.check_decorator(model.policy.deny(form))
        model.deny.add(rule)

    def replace_policy(self) -> None:
        target = self.r.choice(self.modes)
        target.model = self.new_model()
        self.log.append(f"mode.cache_policy = {target.model.policy!r}")
        target.mode.cache_policy = target.model.policy

    def switch_context(self) -> None:
        CONTEXT["spec"] = self.r.choice(SPECS)
        self.log.append(f"context -> {CONTEXT['spec']}")

    def check_decorator(self, registrar: Any) -> None:
        sentinel = object()
        if registrar(sentinel) is not sentinel:
            raise AssertionError("a register_* result did not hand the decorated object back")

    def dispatch(self) -> None:
        m = self.r.choice(self.modes)
        name = self.r.choice(list(UNIVERSE))
        op, build = UNIVERSE[name]
        args = build(m.pool, self.r)
        # Twice in a row: a backend key's first sight makes neither an entry nor a verdict, its second does both
        # (Note [An entry on a key's second sight]), and the safety bypasses must show as often as a key is new.
        for _ in range(2):
            self.dispatch_call(m, name, op, args)

    def dispatch_call(self, m: ModeUnderTest, name: str, op: OpOverload, args: tuple[Any, ...]) -> None:
        self.log.append(f"dispatch {name}{tuple(metadata_key(a) if not isinstance(a, torch.Tensor) else tuple(a.shape) for a in args)}")
        cacheable, label, explicit = m.model.decide(op)
        before_row = self.row(m.mode, op)
        with m.mode:
            try:
                out: object = op(*args)
                error: str | None = None
            except tcp.CrosscheckError:
                raise
            except Exception as e:
                out, error = None, type(e).__name__
            with disable_fake_tensor_cache(m.mode):
                try:
                    ref: object = op(*args)
                    ref_error: str | None = None
                except Exception as e:
                    ref, ref_error = None, type(e).__name__
        if error != ref_error:
            raise AssertionError(f"{name}: raised {error}, uncached raised {ref_error}")
        if error is None:
            self.check_output(name, op, args, out, ref, self.symbols[id(m.mode)])
        row = self.row(m.mode, op)
        assert row is not None
        hits = row.hits - (before_row.hits if before_row else 0)
        misses = row.misses - (before_row.misses if before_row else 0)
        bypasses = collections.Counter(row.bypasses)
        bypasses.subtract(before_row.bypasses if before_row else {})
        bypasses = +bypasses
        outcome = f"bypass: {next(iter(bypasses))}" if bypasses else ("hit" if hits else "miss")
        if hits + misses + sum(bypasses.values()) != 1:
            raise AssertionError(f"{name}: one dispatch counted as {hits} hits, {misses} misses, {dict(bypasses)}")
        expected = self.expected_outcome(m, op, args, cacheable, label, explicit)
        if expected is not None and outcome != expected:
            raise AssertionError(f"{name}: {outcome}, the model expected {expected}")
        self.outcomes[outcome if outcome in ("hit", "miss") else "bypass"] += 1

    @staticmethod
    def row(mode: tcp.FakeTensorMode, op: OpOverload) -> tcp.OpReport | None:
        try:
            return mode.cache_report()[op]
        except KeyError:
            return None

    def expected_outcome(
        self, m: ModeUnderTest, op: OpOverload, args: tuple[Any, ...], cacheable: bool, label: str, explicit: bool
    ) -> str | None:
        """'hit', 'miss', 'bypass: reason', or None when it depends on torch's shared storage."""
        if not cacheable:
            return f"bypass: {label}"
        builtin = op.namespace in BUILTIN
        if builtin and not m.exact:
            return None  # torch's class-global storage may already hold it
        key = (m.model.identity(), m.model.context_value(op), op, metadata_key(args))
        sights = m.seen[key]
        m.seen[key] += 1
        if not builtin and sights == 0:
            return "miss"  # a backend key's first sight: the kernel runs, nothing is judged or made
        if op in SAFETY:
            return f"bypass: {SAFETY[op]}"
        if op is MUTATES[0] and not explicit:
            return f"bypass: {MUTATES[1]}"
        # A builtin key's entry is made on its first sight, a backend key's on its second.
        return "hit" if sights > (0 if builtin else 1) else "miss"

    def check_output(
        self, name: str, op: OpOverload, args: tuple[Any, ...], out: object, ref: object, seen_symbols: set[object]
    ) -> None:
        if op is testing.op("dyn"):
            # Each call must get a fresh unbacked symbol, as uncached.
            for value in (out, ref):
                symbols = free_unbacked_symbols(value)
                if not symbols or symbols & seen_symbols:
                    raise AssertionError(f"dyn returned {value}, not a fresh unbacked symbol")
                seen_symbols |= symbols
            return
        why = testing.output_difference(ref, out)
        if why:
            raise AssertionError(f"{name}: differs from an uncached dispatch: {why}")
        inputs = list(args)
        if testing.alias_signature(out, inputs) != testing.alias_signature(ref, inputs):
            raise AssertionError(
                f"{name}: aliases inputs {testing.alias_signature(out, inputs)}, uncached {testing.alias_signature(ref, inputs)}"
            )

    def check_decisions(self) -> None:
        for model in self.models:
            for op in OPS:
                expected = model.decide(op)
                decision = model.policy.decide(op)
                if (decision.cacheable, decision.label, decision.explicit) != expected:
                    raise AssertionError(
                        f"{model.policy!r}.decide({op}) = {decision}, the model says {expected}\n"
                        + model.policy.explain(op)
                    )
                verdict = model.policy.explain(op).splitlines()[0]
                if (": cacheable:" in verdict) != expected[0]:
                    raise AssertionError(f"explain() disagrees with the model: {verdict}")

    def run(self, steps: int) -> None:
        actions = [self.dispatch] * 10 + [
            self.register_namespace,
            self.register_op,
            self.deny,
            self.replace_policy,
            self.switch_context,
        ]
        CONTEXT["spec"] = SPECS[0]
        self.check_decisions()
        for _ in range(steps):
            self.r.choice(actions)()
            self.check_decisions()


class TestFuzz(testing.CachePolicyTestCase):
    def test_universe(self) -> None:
        """The model's structural exclusions are exactly the universe's CIA views and fake-kernel-less ops."""
        for op in OPS:
            decision = tcp.CachePolicy(namespaces=NAMESPACES[:2]).decide(op)
            self.assertEqual(decision.label == "CompositeImplicitAutograd", op in CIA_VIEWS, msg=str(op))
            self.assertEqual(decision.label == "no fake kernel", op in NO_FAKE_KERNEL, msg=str(op))

    @parametrize("seed", SEEDS)
    def test_random_policies_and_dispatches(self, seed: int) -> None:
        """Random rules and dispatches: decisions match the model, results match uncached dispatch."""
        fuzzer = Fuzzer(seed)
        try:
            fuzzer.run(STEPS)
        except Exception as e:
            raise AssertionError(f"seed {seed}: {e}\nsteps:\n" + "\n".join(fuzzer.log[-25:])) from e
        # Each run exercised every kind of outcome at least once across seeds (see the next test).
        self.assertGreater(sum(fuzzer.outcomes.values()), 0)

    def test_outcomes_are_varied(self) -> None:
        """Across the seeds, dispatches hit, miss and bypass many times each."""
        total: collections.Counter[str] = collections.Counter()
        for seed in SEEDS[:4]:
            fuzzer = Fuzzer(seed)
            fuzzer.run(STEPS)
            total.update(fuzzer.outcomes)
        print(f"\nfuzz outcomes over {len(SEEDS[:4])} seeds x {STEPS} steps: {dict(total)}")
        for outcome in ("hit", "miss", "bypass"):
            self.assertGreater(total[outcome], 20, msg=dict(total))


# ------------------------------------------------- the wrong-input table


RELIABILITY_MD = pathlib.Path(__file__).resolve().parent.parent / "docs" / "reliability.md"
# | entry point | `call` | `Error` or returns | `` message or repr `` |
TABLE_ROW = re.compile(r"^\| (?P<api>.+?) \| `(?P<call>[^`]+)` \| (?:`(?P<error>\w+)`|returns) \| `` (?P<text>.*) `` \|$", re.M)
ADDRESS = re.compile(r"0x[0-9a-f]+")


def wrong_input_env() -> dict[str, Any]:
    """The names the calls of the table use."""
    import numpy

    def boom(op: OpOverload) -> bool:
        raise KeyError("x")

    def no_spec() -> Hashable:
        raise ValueError("no spec")

    def dispatch(policy: tcp.CachePolicy) -> None:
        with tcp.FakeTensorMode(cache_policy=policy):
            testing.op("conv")(torch.empty(1, 1, 2, 2), 1)

    def untraced() -> torch.fx.GraphModule:
        return torch.fx.symbolic_trace(lambda x: x + 1)

    return {
        "tcp": tcp,
        "torch": torch,
        "numpy": numpy,
        "testing": testing,
        "conv": testing.op("conv"),
        "boom": boom,
        "no_spec": no_spec,
        "dispatch": dispatch,
        "untraced": untraced,
        "pickle": pickle,
    }


def run_row(call: str) -> tuple[str | None, str]:
    """(error type name or None, message or repr of the value), addresses elided."""
    try:
        value = eval(call, wrong_input_env())
    except Exception as e:
        message = e.args[0] if isinstance(e, KeyError) else str(e)
        return type(e).__name__, ADDRESS.sub("0x…", message.replace("\n", " "))
    return None, ADDRESS.sub("0x…", repr(value))


class TestWrongInputTable(testing.CachePolicyTestCase):
    def test_table_matches_code(self) -> None:
        """Every row of docs/reliability.md's wrong-input table gives the error and message it shows."""
        text = RELIABILITY_MD.read_text()
        section = text[text.index("## 5. Entry points and wrong input") :]
        end = section.find("\n## ", 1)
        if end != -1:
            section = section[:end]  # the table's section only
        rows = TABLE_ROW.findall(section)
        table_lines = [line for line in section.splitlines() if line.startswith("| ")]
        self.assertEqual(len(rows), len(table_lines) - 2)  # every row but the header parses
        self.assertGreater(len(rows), 40)
        with testing.logging_disabled():
            for _, call, error, text in rows:
                self.assertEqual(run_row(call), (error or None, text), msg=call)


instantiate_parametrized_tests(TestFuzz)


# ------------------------------------------------------ zoo behaviours, random call sequences

ZOO_SEEDS = range(4)
ZOO_STEPS = 120
# Documented limits are expected to differ; the fuzz draws from the rest.
ZOO_CASES = [c for c in zoo.CASES if c.limit is None]
# Ops that mutate their arguments opt in by name, as their cases do.
ZOO_ALLOWED = ["inplace_overlap", "mut_resize", "mut_unsqueeze", "mut_none", "out_kwarg", "mut_returns_view"]
# Kernels the events re-register (each version returns a 1-, 2- or 3-element tensor).
ZOO_SWAPPABLE = ["swap_fake", "swap_custom_op", "swap_meta", "swap_composite", f"{zoo.CTX_NS}::swappable"]
# The fuzz policies' context_key(): for the next _FRESH_CONTEXT[0] calls (an event sets it), values that never repeat.
_FRESH_CONTEXT = [0]


def _fuzz_context() -> object:
    if _FRESH_CONTEXT[0] > 0:
        _FRESH_CONTEXT[0] -= 1
        return (zoo.ambient_context(), object())
    return zoo.ambient_context()


@dataclass
class ZooWorlds:
    """One mode under test and the per-case inputs of its cached and reference worlds."""

    mode: tcp.FakeTensorMode
    env: zoo.Env
    cached: zoo.World
    reference: zoo.World
    last: dict[str, tuple[zoo.Call, zoo.Call]] = field(default_factory=dict)


class ZooFuzzer:
    """Random sequences of zoo calls and events (context, default dtype, kernel swaps, new subgraphs, contexts that
    never repeat).

    Each call runs in a cached world under the mode and in a reference world under
    ``disable_fake_tensor_cache(mode)``, on identically built inputs (or on the inputs the previous call of that
    case used, in both worlds), and the two ``describe_call`` results must be equal. Each drawn call is made twice.
    """

    def __init__(self, seed: int) -> None:
        self.r = random.Random(seed)
        self.log: list[str] = []
        self.calls = 0
        self.cleared_hits = 0
        self.scope: str | None = None  # a guard-free ShapeEnv scope the calls run in ("guard scope" events)
        self.thread_calls = 0  # calls still to run in a thread of their own ("thread" events)
        # A dozen behaviours per seed, the controls always among them, so calls repeat and hits happen.
        controls = [c for c in ZOO_CASES if c.min_hits]
        self.cases = controls + self.r.sample([c for c in ZOO_CASES if not c.min_hits], 10)
        deny_inner = self.r.random() < 0.3
        # Off for about half the seeds, on purpose: the hits alone must match the reference world.
        crosscheck = self.r.random() < 0.5
        symbolic = self.r.random() < 0.5
        shared_store = tcp.CacheStore()
        self.modes: list[ZooWorlds] = []
        for _ in range(2 if self.r.random() < 0.5 else 1):
            mode = tcp.FakeTensorMode(
                cache_policy=self.policy(deny_inner), cache_store=shared_store, cache_crosscheck=crosscheck, shape_env=ShapeEnv()
            )
            self.modes.append(ZooWorlds(mode, zoo.Env.make(mode, symbolic), zoo.World(), zoo.World()))
        self.log.append(
            f"modes={len(self.modes)} (one store) deny hop_inner={deny_inner} crosscheck={crosscheck} "
            f"symbolic={symbolic}; cases {[c.name for c in self.cases]}"
        )

    @staticmethod
    def policy(deny_inner: bool) -> tcp.CachePolicy:
        # Equal rules and the same context hook: modes sharing the store share entries.
        policy = tcp.CachePolicy(namespaces=[zoo.NS, zoo.CTX_NS], context_key=_fuzz_context)
        for name in ZOO_ALLOWED:
            policy.register_op(zoo.op(name))
        if deny_inner:
            policy.deny(zoo.op("hop_inner"))
        return policy

    def reset(self) -> None:
        for c in zoo.CASES:
            if c.reset is not None:
                c.reset()
        torch.set_default_dtype(torch.float32)
        _FRESH_CONTEXT[0] = 0

    def event(self) -> None:
        kind = self.r.choice(
            ["ambient", "default dtype", "swap", "subgraphs", "deny", "clear", "fresh context", "guard scope", "thread"]
        )
        if kind == "guard scope":
            self.scope = self.r.choice([None, "suppress_guards", "error_on_new_guards"])
            self.log.append(f"the next calls run in shape_env.{self.scope}()" if self.scope else "no guard scope")
        elif kind == "thread":
            self.thread_calls = self.r.randint(1, 4)
            self.log.append(f"the next {self.thread_calls} calls run in a new thread, a reader thread beside them")
        elif kind == "fresh context":
            _FRESH_CONTEXT[0] = self.r.randint(1, 8)
            self.log.append(f"the next {_FRESH_CONTEXT[0]} context_key() values never repeat")
        elif kind == "ambient":
            zoo.AMBIENT["dtype"] = self.r.choice([torch.float32, torch.float64, torch.float16])
            self.log.append(f"AMBIENT -> {zoo.AMBIENT['dtype']}")
        elif kind == "default dtype":
            dtype = self.r.choice([torch.float32, torch.float64])
            torch.set_default_dtype(dtype)
            self.log.append(f"default dtype -> {dtype}")
        elif kind == "swap":
            name, n = self.r.choice(ZOO_SWAPPABLE), self.r.randint(1, 3)
            (zoo._register_ctx_swappable(n) if name.startswith(zoo.CTX_NS) else zoo._register(name, n))()
            self.log.append(f"re-register {name} -> size {n}")
        elif kind == "deny":
            m = self.r.choice(self.modes)
            c = self.r.choice(self.cases)
            m.mode.cache_policy.deny(c.op)  # a new identity: the mode moves to another partition
            self.log.append(f"mode {self.modes.index(m)}: policy.deny({c.op})")
        elif kind == "clear":
            m = self.r.choice(self.modes)
            self.cleared_hits += self.hits([m])  # cache_clear() resets the counters too
            m.mode.cache_clear()
            self.log.append(f"mode {self.modes.index(m)}: cache_clear()")
        elif kind == "subgraphs":
            c = self.r.choice([c for c in zoo.CASES if c.target is zoo.invoke_subgraph])
            assert c.reset is not None
            c.reset()  # a new GraphModule for that case (and the ambient dtype back to float32)
            self.log.append(f"new subgraph for {c.name}, AMBIENT -> float32")

    def call(self) -> None:
        if self.thread_calls:
            self.thread_calls -= 1
            self.in_threads()
            return
        m = self.r.choice(self.modes)
        c = self.r.choice(self.cases)
        i = self.r.randrange(len(c.steps))
        reuse = c.name in m.last and self.r.random() < 0.3
        # Twice in a row: a backend key's first sight makes neither an entry nor a verdict, its second does both
        # (Note [An entry on a key's second sight]).
        for _ in range(2):
            self.call_once(m, c, i, reuse)

    def call_once(self, m: ZooWorlds, c: zoo.ZooCase, i: int, reuse: bool) -> None:
        self.log.append(f"mode {self.modes.index(m)}: {c.name} " + ("same inputs again" if reuse else f"build {i}"))
        shape_env = m.mode.shape_env
        scope = contextlib.nullcontext() if self.scope is None or shape_env is None else getattr(shape_env, self.scope)()
        with m.mode, scope:
            if not reuse:
                m.last[c.name] = (c.build(m.env, i), c.build(m.env, i))
            cached, reference = m.last[c.name]
            got = zoo.describe_call(c.callee, cached.args, cached.kwargs, m.cached)
            with disable_fake_tensor_cache(m.mode):
                want = zoo.describe_call(c.callee, reference.args, reference.kwargs, m.reference)
        why = zoo.dispatch_difference(got, want)
        if why:
            raise AssertionError(f"{c.name}: {why}")
        self.calls += 1

    def in_threads(self) -> None:
        """One call in a new thread, while another reads the class's and the store's counts."""
        errors: list[BaseException] = []
        done = threading.Event()

        def call() -> None:
            try:
                self.call()
            except BaseException as e:
                errors.append(e)
            finally:
                done.set()

        def read() -> None:
            try:
                while not done.is_set():
                    tcp.FakeTensorMode.cache_info()
                    len(self.modes[0].mode.cache_store)
                    self.modes[0].mode.cache_info()
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=call), threading.Thread(target=read)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]

    def run(self, steps: int) -> None:
        self.reset()
        try:
            with testing.logging_disabled():
                for _ in range(steps):
                    (self.event if self.r.random() < 0.15 else self.call)()
        finally:
            self.reset()

    def hits(self, modes: list[ZooWorlds] | None = None) -> int:
        """Hits of zoo ops so far (in ``modes``, default all, plus those counted before a cache_clear())."""
        if modes is not None:
            return sum(r.hits for m in modes for r in m.mode.cache_report().ops if r.namespace in (zoo.NS, zoo.CTX_NS))
        return self.cleared_hits + self.hits(self.modes)


class TestZooFuzz(testing.CachePolicyTestCase):
    @parametrize("seed", ZOO_SEEDS)
    def test_random_zoo_calls(self, seed: int) -> None:
        """Random zoo calls between random events bypass or match an uncached dispatch, and some hit."""
        fuzzer = ZooFuzzer(seed)
        try:
            fuzzer.run(ZOO_STEPS)
        except Exception as e:
            raise AssertionError(f"seed {seed}: {e}\nsteps:\n" + "\n".join(fuzzer.log[-20:])) from e
        self.assertGreater(fuzzer.calls, ZOO_STEPS // 2)
        self.assertGreaterEqual(fuzzer.hits(), 5, msg="the zoo fuzz must exercise cache hits")


instantiate_parametrized_tests(TestZooFuzz)


if __name__ == "__main__":
    run_tests()
