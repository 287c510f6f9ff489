# Owner(s): ["module: fakeTensor"]
"""Symbolic entries are filed under what the ShapeEnv knows about their own symbols (Note [What the ShapeEnv knows]).

Each test runs one call sequence twice on fresh ShapeEnvs, cached (a policy mode) and uncached (the same mode with
its cache off), and compares the outputs and the ShapeEnv afterwards: its guards, replacements and value ranges. A
hit must never stand for a kernel run that would have taught the ShapeEnv something; a fact about other symbols must
not make an entry unreachable.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from unittest import mock

import cachepolicy_testing as testing
import torch
from torch._dynamo.source import ConstantSource
from torch.fx.experimental.symbolic_shapes import (
    DimDynamic,
    ShapeEnv,
    StatelessSymbolicContext,
    guard_or_false,
    statically_known_true,
)
from torch.testing._internal.common_utils import instantiate_parametrized_tests, parametrize, run_tests

import torch_cachepolicy as tcp
from torch_cachepolicy import _reasons, _symbols
from torch_cachepolicy._symbols import knowledge

NS = "tcp_symbols"
OPS = testing.CountedOps(NS)


@OPS.define("ne_guard(Tensor x) -> Tensor")
def _ne_guard(x: torch.Tensor) -> torch.Tensor:
    torch._check(x.shape[0] != 1)  # a guard on its own symbol, added on the first run only
    return x.new_empty(x.shape[0] * 2)


@OPS.define("mod_guard(Tensor x) -> Tensor")
def _mod_guard(x: torch.Tensor) -> torch.Tensor:
    torch._check(x.shape[0] % 2 == 0)  # a divisibility fact (it moves the ShapeEnv's version)
    return x.new_empty(x.shape[0] // 2)


@OPS.define("asks_range(Tensor x) -> Tensor")
def _asks_range(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(1 if statically_known_true(x.shape[0] > 7) else 2)


@OPS.define("plain(Tensor x) -> Tensor")
def _plain(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape)


@OPS.define("learns(Tensor x) -> Tensor")
def _learns(x: torch.Tensor) -> torch.Tensor:
    if statically_known_true(x.shape[0] > 4):
        return x.new_empty(1)
    torch._check(x.shape[0] > 4)  # teaches the ShapeEnv the fact it asked about: the next run answers otherwise
    return x.new_empty(2)


@OPS.define("doubles(Tensor x) -> Tensor")
def _doubles(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape[0] * 2)  # an output expression the entry stores itself


@OPS.define("branches(Tensor x) -> Tensor")
def _branches(x: torch.Tensor) -> torch.Tensor:
    # A guard on its own symbol, or, where the ShapeEnv raises on a new guard, the fallback a probing pass takes.
    try:
        big = bool(x.shape[0] > 4)
    except Exception:
        return x.new_empty(1)
    return x.new_empty(x.shape[0] + 1 if big else 1)


@OPS.define("asks_then_guards(Tensor x) -> Tensor")
def _asks_then_guards(x: torch.Tensor) -> torch.Tensor:
    # Once the ShapeEnv knows x is even, a second guard refuses: a run with that knowledge raises.
    if statically_known_true(x.shape[0] % 2 == 0):
        raise ValueError("asked again after learning")
    torch._check(x.shape[0] % 2 == 0)
    return x.new_empty(x.shape[0] // 2)


@OPS.define("allocates_once_taught(Tensor x) -> Tensor")
def _allocates_once_taught(x: torch.Tensor) -> torch.Tensor:
    # With what its first run taught, a run would allocate an unbacked size.
    if statically_known_true(x.shape[0] > 2):
        ctx = torch.library.get_ctx()
        return x.new_empty(ctx.new_dynamic_size())
    torch._check(x.shape[0] > 2)
    return x.new_empty(x.shape[0])


@OPS.define("specializes(Tensor x) -> Tensor")
def _specializes(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape) if x.shape[0] == 8 else x.new_empty(1)  # guards s0 == 8: a replacement


@OPS.define("unifies(Tensor x, Tensor y) -> Tensor")
def _unifies(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    torch._check(x.shape[0] == y.shape[0])  # unifies the two symbols
    return x.new_empty(x.shape)


@OPS.define("shrink(Tensor x, SymInt n) -> Tensor")
def _shrink(x: torch.Tensor, n: Any) -> torch.Tensor:
    return x.new_empty(n - 3)  # a size not provably non-zero: rebuilding it unsuppressed guards Ne(n - 3, 0)


@OPS.define("makes_symbol(Tensor x, SymInt n) -> Tensor")
def _makes_symbol(x: torch.Tensor, n: Any) -> torch.Tensor:
    n.node.shape_env.create_unbacked_symint()  # a symbol in its argument's ShapeEnv, not in the output
    return x.new_empty(2)


@OPS.define("oblivious(Tensor x) -> Tensor")
def _oblivious(x: torch.Tensor) -> torch.Tensor:
    # Under backed_size_oblivious a backed size is reasoned about as unbacked: no guard, the other branch.
    return x.new_empty(1) if guard_or_false(x.shape[0] == 8) else x.new_empty(x.shape[0])


ne_guard = OPS.op("ne_guard")
mod_guard = OPS.op("mod_guard")
asks_range = OPS.op("asks_range")
plain = OPS.op("plain")


def symbolic(mode: Any, n: int) -> torch.Tensor:
    """A fake tensor of size ``n`` whose size is a fresh backed symbol."""
    context = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC])
    return mode.from_tensor(torch.empty(n), symbolic_context=context)


def backed(shape_env: ShapeEnv, hint: int = 4) -> torch.SymInt:
    """A backed SymInt ``n`` of ``shape_env`` (equal names and hints in every ShapeEnv: equal keys)."""
    source = ConstantSource("n")
    return shape_env.create_symintnode(shape_env.create_symbol(hint, source), hint=hint, source=source)


def shape_env_facts(shape_env: ShapeEnv) -> dict[str, object]:
    """What a ShapeEnv has learned, comparable across ShapeEnvs with the same symbol names."""
    return {
        "guards": [str(g.expr) for g in shape_env.guards],
        "replacements": sorted(f"{k}={v}" for k, v in shape_env.replacements.items()),
        "ranges": sorted(f"{k}:{v}" for k, v in shape_env.var_to_range.items()),
        "divisible": sorted(str(d) for d in shape_env.divisible),
    }


class TestSymbols(testing.CachePolicyTestCase):
    def run_sequence(self, sequence: Callable[[Any], list[object]]) -> tcp.FakeTensorMode:
        """Runs ``sequence`` cached and uncached, each on a fresh ShapeEnv; asserts equal results and ShapeEnvs.

        Crosscheck off: what the cached run's kernels taught its ShapeEnv is compared, and a crosscheck would run
        every hit's kernel again in that ShapeEnv (teaching it what the hit skipped); the tests count kernel runs too.
        """
        results, facts = [], []
        modes = []
        for cache in (True, False):
            mode = tcp.FakeTensorMode(
                cache_policy=tcp.CachePolicy(namespaces=[NS]), shape_env=ShapeEnv(), cache_crosscheck=False
            )
            mode.cache_enabled = cache
            results.append(sequence(mode))
            facts.append(shape_env_facts(mode.shape_env))
            modes.append(mode)
        self.assertEqual(results[0], results[1])
        self.assertEqual(facts[0], facts[1])
        return modes[0]

    def test_guard_about_other_symbols_keeps_entries(self) -> None:
        """Facts learned about another symbol (a divisibility fact moves the version) leave an entry reachable."""
        def sequence(mode: Any) -> list[object]:
            x, y = symbolic(mode, 6), symbolic(mode, 8)
            out = []
            with mode:
                for k in (2, 4, 8):
                    out.append(str(plain(x).shape))
                    torch._check(y.shape[0] % k == 0)  # about y's symbol only
            return out

        mode = self.run_sequence(sequence)
        # The first sight and the miss that makes the entry (after the fact for 2), then a hit (after the fact for 4).
        self.assertEqual((mode.cache_report()[plain].misses, mode.cache_report()[plain].hits), (2, 1))

    def test_own_guards_are_never_skipped(self) -> None:
        """A kernel adding a guard on its own symbol runs until it adds nothing; the ShapeEnv ends as uncached."""
        def sequence(mode: Any) -> list[object]:
            x = symbolic(mode, 6)
            with mode:
                ops = (ne_guard, ne_guard, ne_guard, mod_guard, mod_guard, mod_guard, mod_guard, ne_guard, mod_guard)
                return [str(op(x).shape) for op in ops]

        OPS.calls.clear()
        mode = self.run_sequence(sequence)
        # The first run of mod_guard (its first sight) taught the ShapeEnv a fact about its symbol, so the second call
        # looks under the new knowledge, where its key is new: a first sight, then a miss that teaches nothing; that
        # entry serves the fourth and fifth.
        self.assertEqual((mode.cache_report()[mod_guard].misses, mode.cache_report()[mod_guard].hits), (3, 2))
        # ne_guard's symbol learned mod_guard's fact between its third and fourth call: a first sight, rightly.
        self.assertEqual((mode.cache_report()[ne_guard].misses, mode.cache_report()[ne_guard].hits), (3, 1))
        self.assertEqual(OPS.calls["mod_guard"], 3 + 5)  # cached run: the three misses; uncached run: 5

    def test_a_kernel_that_answers_differently_once_taught_is_not_shared(self) -> None:
        """A kernel whose answer changes with what it taught the ShapeEnv keeps missing until it stops teaching."""
        def sequence(mode: Any) -> list[object]:
            x = symbolic(mode, 9)
            with mode:
                return [str(OPS.op("learns")(x).shape) for _ in range(4)]

        mode = self.run_sequence(sequence)
        learns = OPS.op("learns")
        # The first sight teaches; under the new knowledge the key is new: a first sight, the miss, a hit.
        self.assertEqual((mode.cache_report()[learns].misses, mode.cache_report()[learns].hits), (3, 1))

    @parametrize("scope", ["suppress_guards", "error_on_new_guards"])
    def test_an_entry_made_where_guards_are_not_recorded_serves_no_call_where_they_are(self, scope: str) -> None:
        """A miss inside a guard-free ShapeEnv scope (a probing pass) is not a hit outside it: the guard is recorded."""
        def sequence(mode: Any) -> list[object]:
            x = symbolic(mode, 8)
            with mode:
                with getattr(mode.shape_env, scope)():
                    inside = [str(OPS.op("branches")(x).shape) for _ in range(3)]
                outside = [str(OPS.op("branches")(x).shape) for _ in range(2)]
            return inside + outside

        mode = self.run_sequence(sequence)
        # Inside: the first sight, the miss that makes the entry, then a hit; outside: a first sight that records the
        # guard, then a first sight under that knowledge.
        report = mode.cache_report()[OPS.op("branches")]
        self.assertEqual((report.misses, report.hits), (4, 1))
        self.assertEqual(len(mode.shape_env.guards), 1)  # recorded as by the uncached run (run_sequence compares them)

    @parametrize("scope", ["suppress_guards", "error_on_new_guards", "frozen"])
    def test_a_guard_free_scope_keeps_its_own_entries(self, scope: str) -> None:
        """Entries made while the ShapeEnv records guards do not serve calls inside a guard-free scope (export's
        frozen ShapeEnv, a probing pass): the scope's first two calls run the kernel, its next ones hit."""
        def sequence(mode: Any) -> list[object]:
            x = symbolic(mode, 8)
            with mode:
                # A first sight that records the guard, a first sight under that knowledge, the miss, a hit.
                outside = [str(OPS.op("branches")(x).shape) for _ in range(4)]
                shape_env = mode.shape_env
                if scope == "frozen":
                    shape_env.freeze()
                    inside = [str(OPS.op("branches")(x).shape) for _ in range(3)]
                    shape_env.frozen = False
                else:
                    with getattr(shape_env, scope)():
                        inside = [str(OPS.op("branches")(x).shape) for _ in range(3)]
            return outside + inside

        mode = self.run_sequence(sequence)
        report = mode.cache_report()[OPS.op("branches")]
        self.assertEqual((report.misses, report.hits), (5, 2))

    @parametrize("op_name", ["specializes", "unifies"])
    def test_a_kernel_guarding_on_an_input_symbol_did_not_change_the_input(self, op_name: str) -> None:
        """Specializing or unifying an input's symbol is what the ShapeEnv learns, not a change to the input: the
        calls after it are cached (no "changed an input's" bypass)."""
        def sequence(mode: Any) -> list[object]:
            x, y = symbolic(mode, 8), symbolic(mode, 8)
            args = (x,) if op_name == "specializes" else (x, y)
            with mode:
                return [str(OPS.op(op_name)(*args).shape) for _ in range(4)]

        mode = self.run_sequence(sequence)
        report = mode.cache_report()[OPS.op(op_name)]
        # The first sight learns; under the new knowledge: a first sight, the miss that makes the entry, a hit.
        self.assertEqual((report.misses, report.hits, report.bypasses), (3, 1, {}))

    def test_an_entry_made_under_backed_size_oblivious_serves_no_call_without_it(self) -> None:
        """The configs that change how backed symbols are reasoned about (backed_size_oblivious) are part of what the
        ShapeEnv knows: a call after the config is switched off runs the kernel, which guards."""
        def sequence(mode: Any) -> list[object]:
            x = symbolic(mode, 8)
            with mode:
                with torch.fx.experimental._config.patch(backed_size_oblivious=True):
                    out = [str(OPS.op("oblivious")(x).shape) for _ in range(2)]  # the first sight, the entry's miss
                out.append(str(OPS.op("oblivious")(x).shape))
            return out

        mode = self.run_sequence(sequence)  # outputs and guards equal to the uncached run's
        self.assertEqual(mode.cache_report()[OPS.op("oblivious")].misses, 3)

    def test_crosscheck_catches_a_hit_that_skipped_a_guard(self) -> None:
        """With crosscheck on, a hit whose uncached rerun adds a guard raises: here a config the key is made blind to."""
        mode = tcp.FakeTensorMode(cache_policy=tcp.CachePolicy(namespaces=[NS]), shape_env=ShapeEnv(), cache_crosscheck=True)
        x = symbolic(mode, 8)
        with mock.patch.object(_symbols, "_SEMANTICS", ()), mode:
            with torch.fx.experimental._config.patch(backed_size_oblivious=True):
                OPS.op("oblivious")(x)  # the first sight
                OPS.op("oblivious")(x)  # the miss that makes the entry
            with self.assertRaisesRegex(tcp.CrosscheckError, "taught the ShapeEnv a guard or fact; the cache hit did not"):
                OPS.op("oblivious")(x)

    def test_no_second_run_of_a_kernel_that_taught(self) -> None:
        """A kernel that taught the ShapeEnv is never run again for the caller's miss (it could raise there)."""
        def sequence(mode: Any) -> list[object]:
            x = symbolic(mode, 8)
            with mode:
                return [str(OPS.op("asks_then_guards")(x).shape)]

        OPS.calls.clear()
        self.run_sequence(sequence)
        self.assertEqual(OPS.calls["asks_then_guards"], 2)  # once cached, once uncached

    def test_no_symbols_left_pending_by_a_miss(self) -> None:
        """A miss leaves no unbacked symbol the caller's output does not hold (export checks that none is pending)."""
        def sequence(mode: Any) -> list[object]:
            x = symbolic(mode, 8)
            with mode:
                out: list[object] = [str(OPS.op("allocates_once_taught")(x).shape)]
            out.append(list(map(str, mode.shape_env.pending_fresh_unbacked_symbols)))
            return out

        mode = self.run_sequence(sequence)  # equal to the uncached run, which leaves none pending
        self.assertEqual(mode.shape_env.pending_fresh_unbacked_symbols, [])

    def test_a_narrowed_range_is_seen(self) -> None:
        """A kernel asking what the ShapeEnv can prove answers afresh once the symbol's range narrows."""
        def sequence(mode: Any) -> list[object]:
            x = symbolic(mode, 9)
            out = []
            with mode:
                out += [str(asks_range(x).shape) for _ in range(3)]
                torch._check(x.shape[0] > 7)
                out += [str(asks_range(x).shape) for _ in range(3)]
            return out

        mode = self.run_sequence(sequence)
        # Before and after the check: the first sight, the miss that makes the entry, a hit.
        self.assertEqual((mode.cache_report()[asks_range].misses, mode.cache_report()[asks_range].hits), (4, 2))

    def test_symbols_of_another_shape_env_bypass(self) -> None:
        """Inputs whose symbols belong to other ShapeEnvs than the mode's bypass (stock bypasses them too), never crash."""
        def run(cache: bool, mode_has_the_name: bool) -> tuple[list[object], list[list[str]]]:
            mode = tcp.FakeTensorMode(cache_policy=tcp.CachePolicy(namespaces=[NS]), shape_env=ShapeEnv())
            mode.cache_enabled = cache
            envs = [ShapeEnv(), ShapeEnv()]
            if mode_has_the_name:  # the mode's own ShapeEnv has a symbol of that name too
                mode.shape_env.create_symbol(6, ConstantSource("n"))
            seen = []
            with mode:
                for env in envs:  # equal symbol names and hints: equal keys
                    n = env.create_symintnode(env.create_symbol(6, ConstantSource("n")), hint=6)
                    out = OPS.op("doubles")(torch.empty(n, 3))
                    seen.append((str(out.shape), out.shape[0].node.shape_env is env, bool(out.shape[0] > 5)))
            if cache:
                self.assertEqual(
                    mode.cache_report()[OPS.op("doubles")].bypasses, {_reasons.UNKNOWN_SYMBOL: 2}
                )
            return seen, [[str(g.expr) for g in env.guards] for env in [*envs, mode.shape_env]]

        for mode_has_the_name in (False, True):
            self.assertEqual(run(True, mode_has_the_name), run(False, mode_has_the_name), msg=str(mode_has_the_name))

    @parametrize("store", ["default", "isolated"])
    def test_aten_keys_with_symbols_of_another_shape_env_bypass(self, store: str) -> None:
        """An aten key holding another ShapeEnv's symbols bypasses, so that ShapeEnv gets its guards (stock's does not)."""
        def run(cache: bool) -> list[list[str]]:
            cache_store = tcp.CacheStore(isolated=store == "isolated")
            mode = tcp.FakeTensorMode(cache_store=cache_store, shape_env=ShapeEnv())
            mode.cache_enabled = cache
            envs = [mode.shape_env, ShapeEnv()]
            with mode:
                x = torch.empty(2)
                for env in envs:  # equal symbol names and hints: equal keys by expression
                    n, m = (env.create_symintnode(env.create_symbol(v, ConstantSource(k)), hint=v) for k, v in (("n", 7), ("m", 3)))
                    x.new_empty(n - m)  # guards n - m >= 0 in the ShapeEnv of n and m
            if cache:
                self.assertEqual(mode.cache_report()[torch.ops.aten.new_empty.default].bypasses, {_reasons.UNKNOWN_SYMBOL: 1})
            return [[str(g.expr) for g in env.guards] for env in envs]

        guards = run(cache=True)
        self.assertEqual(guards, run(cache=False))
        self.assertTrue(all(guards), msg=str(guards))

    def test_knowledge_follows_replacements(self) -> None:
        """Once a symbol is replaced by another, facts about the other count for it."""
        mode = tcp.FakeTensorMode(shape_env=ShapeEnv())
        x, y = symbolic(mode, 5), symbolic(mode, 5)
        sx = x.shape[0].node.expr
        before = knowledge(mode.shape_env, {sx})
        torch._check(y.shape[0] > 3)  # about y's symbol only
        self.assertEqual(knowledge(mode.shape_env, {sx}), before)
        torch._check(x.shape[0] == y.shape[0])  # sx is replaced by sy (or the reverse)
        after = knowledge(mode.shape_env, {sx})
        self.assertNotEqual(after, before)
        torch._check(y.shape[0] < 9)
        self.assertNotEqual(knowledge(mode.shape_env, {sx}), after)


class TestSymbolsWithoutAModeShapeEnv(testing.CachePolicyTestCase):
    """A mode without a ShapeEnv given SymInts of a ShapeEnv bypasses, so hits never skip that ShapeEnv's guards."""

    def run_both(self, sequence: Any) -> list[tuple[object, object]]:
        """``sequence(mode, shape_env)`` cached and uncached, each on a fresh ShapeEnv the mode does not own.

        Crosscheck off: the ShapeEnv's guards and symbol counter after the cached run are compared, and a crosscheck
        would run every hit's kernel again in that ShapeEnv.
        """
        seen = []
        for cache in (True, False):
            shape_env = ShapeEnv()
            # No shape_env.
            mode = tcp.FakeTensorMode(cache_policy=tcp.CachePolicy(namespaces=[NS]), cache_crosscheck=False)
            mode.cache_enabled = cache
            with mode:
                result = sequence(mode, shape_env)
            seen.append((result, [str(g.expr) for g in shape_env.guards], shape_env.unbacked_symint_counter))
        return seen

    def test_mode_without_shape_env_adds_no_guard_of_its_own(self) -> None:
        """A miss in a mode without a ShapeEnv leaves the SymInts' ShapeEnv with exactly the uncached run's guards."""
        def sequence(mode: Any, shape_env: ShapeEnv) -> list[str]:
            n = backed(shape_env)
            return [str(OPS.op("shrink")(torch.empty(3), n).shape) for _ in range(3)]

        cached, uncached = self.run_both(sequence)
        # Before the fix: cached guards ['s.. - 3 >= 0', 'Ne(s.. - 3, 0)'], uncached ['s.. - 3 >= 0'].
        self.assertEqual(cached, uncached)

    def test_mode_without_shape_env_watches_its_inputs_shape_env(self) -> None:
        """A kernel creating a symbol in its SymInt argument's ShapeEnv is not skipped by hits in a mode without one."""
        def sequence(mode: Any, shape_env: ShapeEnv) -> list[str]:
            n = backed(shape_env)
            return [str(OPS.op("makes_symbol")(torch.empty(3), n).shape) for _ in range(3)]

        cached, uncached = self.run_both(sequence)
        # Before the fix: unbacked_symint_counter 1 cached (two hits skipped the kernel), 3 uncached.
        self.assertEqual(cached, uncached)


instantiate_parametrized_tests(TestSymbols)


if __name__ == "__main__":
    run_tests()
