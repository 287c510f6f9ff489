# Owner(s): ["module: fakeTensor"]
"""OpInfo samples through the policy mode, miss then hit, against stock and an uncached dispatch.

One test per OpInfo in ``op_db`` (upstream's ``@ops`` +
``instantiate_device_type_tests``, CPU only; select with ``-k``, e.g.
``-k test_op_db_nn_functional_conv2d``). For each sample of the op (float32
and one integer dtype) it runs, each calling the sample twice on its own fake
copies:

* stock ``FakeTensorMode`` with its cache; its bypass reasons are deltas of
  torch's class counters (read, never written or cleared);
* stock with the cache off on that one instance: the *uncached* reference;
* ``torch_cachepolicy.FakeTensorMode(cache_crosscheck=True)`` in the
  configurations of ``MODES`` (default policy with a default store, default
  policy and a permissive policy with isolated stores).

A policy mode must return what the uncached dispatch returned (metadata,
values, and which inputs each output aliases), count stock's bypass reasons,
never fail a crosscheck (which re-runs every hit uncached, aliasing
included), and leave torch's class counters, torch's storage (isolated
stores) and ``is_builtin`` alone. A sample whose stock dispatch raises is
skipped for every mode, and counted; the policy modes must raise the same
exception type on it. Ops with a known difference are listed in
``EXPECTED_FAILURES`` (upstream's ``xfail``/``skip`` specs).

The same sweep holds the key builder to torch: the stock mode is a
``cachepolicy_testing.KeyParityMode`` (when ``torch_cachepolicy._C`` is
loaded), so every cache key of the stock calls is also built by
``torch_cachepolicy._key.cache_key`` on a fresh ``_CacheKeyState`` and must
equal torch's (tuple, element types, hash, and the state left behind), and
torch must not bypass a call the builder handled.

Why every OpInfo, though the per-op tests are most of the suite's test count
(a fifth of a second each): what the sweeps found came from particular kernels
of torch, not from code paths of the package. A crosscheck false positive on
namedtuple outputs (``aminmax``, ``native_layer_norm``, ``native_batch_norm``,
``nll_loss``); outputs whose aliasing an entry cannot reproduce
(``prims.as_strided`` under ``nn.functional.bilinear`` and
``nn.functional.unfold``, ``atleast_1d``/``atleast_2d`` under
``multi_margin_loss`` and ``multilabel_margin_loss``); stock entries replayed
on another storage (``resize_``, ``resize_as_``; the upstream series). Twelve
OpInfos reach every line of the package, bypass reason, key element type, key
fallback and skip reason that the whole sweep reaches (traced on torch 2.13),
and only one of them (``nn.functional.unfold``) is among those kernels: a cut
to distinct code paths keeps the known cases and loses the net for the next
one, which a new torch release brings (the full suite runs on the newest torch).

Each test asserts only what it computed itself. The default run takes the
first ``SAMPLES_PER_OP`` samples of each op and dtype; ``TCP_FULL_OPDB=1``
takes them all, and ``TCP_OPDB_SHARD=i/n`` instantiates every n-th OpInfo
from the i-th (to split a sweep over processes). The figures of a whole
sweep (ops, samples, hits, misses, bypass reasons, the builder's share) are
printed by ``python -m benchmarks.opdb_sweep``.
"""

from __future__ import annotations

import collections
import itertools
import os
import unittest
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import cachepolicy_testing as testing
import torch
import torch._library.utils as library_utils
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import FakeTensorMode as StockMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv
from torch.testing._internal.common_device_type import (
    OpDTypes,
    instantiate_device_type_tests,
    ops,
    skipOps,
)
from torch.testing._internal.common_methods_invocations import op_db
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.opinfo.core import OpInfo

import torch_cachepolicy as tcp

FULL = os.environ.get("TCP_FULL_OPDB") == "1"
SAMPLES_PER_OP = None if FULL else 2
# "i/n": only every n-th OpInfo, starting at the i-th (to split a full sweep over processes).
SHARD = tuple(int(x) for x in os.environ.get("TCP_OPDB_SHARD", "0/1").split("/"))
OPS = op_db[SHARD[0] :: SHARD[1]]
INT_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)

Counts = collections.Counter[str]


# ---------------------------------------------------------------- comparing


storage_id = testing.storage_id
alias_signature = testing.alias_signature
output_difference = testing.output_difference


ALIAS_BYPASS = "output aliasing a cache hit would not reproduce"


def contains(big: Counts, small: Counts) -> bool:
    return all(big[k] >= n for k, n in small.items())


# ------------------------------------------------------------------ running


def stock_counters() -> tuple[int, int, Counts, int]:
    """torch's class-global hits, misses, bypasses and storage size (read only)."""
    info = StockMode.cache_info()
    return info.hits, info.misses, collections.Counter(info.bypasses), info.size


@dataclass
class Run:
    """Two calls of one sample in one mode."""

    inputs: list[object]
    outputs: list[object] = field(default_factory=list)
    bypasses: list[Counts] = field(default_factory=list)  # per call
    cached: list[int] = field(default_factory=list)  # hits + misses per call
    hits: int = 0
    misses: int = 0
    hits_by_namespace: Counts = field(default_factory=collections.Counter)


def counters_of(mode: Any) -> tuple[int, int, Counts]:
    """This policy mode's counters, or torch's class counters for a stock mode."""
    if isinstance(mode, tcp.FakeTensorMode):
        info = mode.cache_info()
        return info.hits, info.misses, collections.Counter(info.bypasses)
    hits, misses, bypasses, _ = stock_counters()
    return hits, misses, bypasses


def run_calls(mode: Any, fn: Callable[..., Any], sample: Any, calls: int = 2) -> Run:
    """Converts the sample's tensors with ``mode`` and calls ``fn`` on them ``calls`` times in it."""

    def convert(x: object) -> object:
        return mode.from_tensor(x) if isinstance(x, torch.Tensor) else x

    inp, args, kwargs = pytree.tree_map(convert, (sample.input, sample.args, sample.kwargs))
    run = Run(inputs=pytree.tree_leaves((inp, args, kwargs)))
    ours = isinstance(mode, tcp.FakeTensorMode)
    start = mode.cache_report().by_namespace() if ours else {}
    for _ in range(calls):
        h0, m0, b0 = counters_of(mode)
        with mode:
            run.outputs.append(fn(inp, *args, **kwargs))
        h1, m1, b1 = counters_of(mode)
        b1.subtract(b0)
        run.bypasses.append(+b1)
        run.cached.append(h1 - h0 + m1 - m0)
        run.hits += h1 - h0
        run.misses += m1 - m0
    if ours:
        for ns, (hits, _, _) in mode.cache_report().by_namespace().items():
            run.hits_by_namespace[ns] = hits - start.get(ns, (0, 0, 0))[0]
    return run


@dataclass(frozen=True)
class ModeSpec:
    """A policy-mode configuration compared with stock."""

    label: str
    policy: Callable[[], tcp.CachePolicy]
    isolated: bool


# default: aten entries are shared with torch's storage, so both calls find
# what stock's calls left there: stock's second call is the exact reference.
# default-isolated, permissive: the first call computes every entry in the
# isolated store (stock's first call may have found some in torch's storage,
# so stock's counts must be contained in ours), the second hits and must
# match stock's second call exactly.
MODES = (
    ModeSpec("default", tcp.CachePolicy, isolated=False),
    ModeSpec("default-isolated", tcp.CachePolicy, isolated=True),
    ModeSpec("permissive", lambda: tcp.CachePolicy(namespaces=[testing.NS]), isolated=True),
)

# OpInfos whose test is expected to fail (xfail) or cannot run (skip), as
# upstream's OpInfo suites list them: xfail("op"[, "variant"], dtypes=...).
# Empty since both causes the sweeps found were fixed in the core (see
# TestKnownIssues): namedtuple outputs compared as plain tuples, and outputs
# whose aliasing an entry cannot reproduce (prims.as_strided) are no longer
# cached.
EXPECTED_FAILURES: set[Any] = set()


@dataclass
class Tally:
    """The figures of one sweep, and every disagreement found."""

    ops: set[str] = field(default_factory=set)
    samples: int = 0
    compared: int = 0
    skipped: int = 0
    skip_reasons: Counts = field(default_factory=collections.Counter)
    hits: Counts = field(default_factory=collections.Counter)
    misses: Counts = field(default_factory=collections.Counter)
    bypasses: Counts = field(default_factory=collections.Counter)
    bypass_reasons: Counts = field(default_factory=collections.Counter)
    hits_by_namespace: Counts = field(default_factory=collections.Counter)
    stock_vs_uncached: int = 0
    failures: list[str] = field(default_factory=list)
    # The stock mode's cache keys against torch_cachepolicy._key.cache_key's (with the C++ key builder only).
    keys: testing.KeyParity = field(default_factory=testing.KeyParity)

    def add(self, other: Tally) -> None:
        """Adds the figures of ``other`` (one op's sweep) to these."""
        self.ops |= other.ops
        self.samples += other.samples
        self.compared += other.compared
        self.skipped += other.skipped
        self.stock_vs_uncached += other.stock_vs_uncached
        self.failures += other.failures
        self.keys.add(other.keys)
        for mine, theirs in (
            (self.skip_reasons, other.skip_reasons),
            (self.hits, other.hits),
            (self.misses, other.misses),
            (self.bypasses, other.bypasses),
            (self.bypass_reasons, other.bypass_reasons),
            (self.hits_by_namespace, other.hits_by_namespace),
        ):
            mine.update(theirs)

    def figures(self) -> dict[str, Any]:
        return {
            "full_sweep": FULL,
            "samples_per_op_and_dtype": SAMPLES_PER_OP,
            "shard": "/".join(map(str, SHARD)),
            "ops": len(self.ops),
            "samples": self.samples,
            "compared": self.compared,
            "skipped": self.skipped,
            "skip_reasons": dict(self.skip_reasons.most_common()),
            "hits": dict(self.hits),
            "misses": dict(self.misses),
            "bypasses": dict(self.bypasses),
            "bypass_reasons": dict(sorted(self.bypass_reasons.items())),
            "hits_by_namespace": dict(sorted(self.hits_by_namespace.items())),
            "stock_cached_vs_uncached_differences": self.stock_vs_uncached,
            "failures": len(self.failures),
            "keys": self.keys.figures() if testing.HAS_KEY_BUILDER else None,
        }


def compare_sample(
    tally: Tally,
    name: str,
    fn: Callable[..., Any],
    sample: Any,
    *,
    shape_env: bool = False,
    compare_bypasses: bool = True,
    calls: int = 2,
) -> bool:
    """Runs one sample ``calls`` times through stock, uncached stock and every policy mode; records
    disagreements in ``tally``. Returns whether the sample was compared (not skipped)."""
    tally.samples += 1

    def env() -> dict[str, Any]:
        return {"shape_env": ShapeEnv()} if shape_env else {}

    def policy_mode(spec: ModeSpec, crosscheck: bool) -> tcp.FakeTensorMode:
        # Explicit, not the test class's setting: benchmarks.opdb_sweep runs the sweep outside the tests.
        return tcp.FakeTensorMode(
            cache_policy=spec.policy(),
            cache_store=tcp.CacheStore(isolated=spec.isolated),
            cache_crosscheck=crosscheck,
            **env(),
        )

    def stock_mode() -> StockMode:
        # The stock calls' keys are also built by cache_key and compared, into tally.keys.
        mode = testing.KeyParityMode(tally.keys, **env()) if testing.HAS_KEY_BUILDER else StockMode(**env())
        # Crosscheck off for the reference (the test class turns it on): stock's cached outputs are compared with the
        # uncached ones below (stock_vs_uncached); its own crosscheck would repeat that and make a difference a skip.
        mode.cache_crosscheck_enabled = False
        return mode

    try:
        stock = run_calls(stock_mode(), fn, sample, calls)
        uncached_mode = StockMode(**env())
        uncached_mode.cache_enabled = False  # this instance only
        uncached = run_calls(uncached_mode, fn, sample, calls)
    except Exception as stock_error:
        tally.skipped += 1
        tally.skip_reasons[type(stock_error).__name__] += 1
        for spec in MODES:
            try:
                run_calls(policy_mode(spec, crosscheck=True), fn, sample, calls)
            except Exception as e:
                if type(e) is not type(stock_error):
                    tally.failures.append(f"{name} [{spec.label}]: raised {e!r} where stock raised {stock_error!r}")
            else:
                tally.failures.append(f"{name} [{spec.label}]: did not raise; stock raised {stock_error!r}")
        return False
    tally.compared += 1
    for call in range(calls):
        if output_difference(uncached.outputs[call], stock.outputs[call]) or alias_signature(
            uncached.outputs[call], uncached.inputs
        ) != alias_signature(stock.outputs[call], stock.inputs):
            tally.stock_vs_uncached += 1

    for spec in MODES:
        where = f"{name} [{spec.label}]"
        before = stock_counters()
        is_builtin = library_utils.is_builtin
        try:
            ours = run_calls(policy_mode(spec, crosscheck=True), fn, sample, calls)
        except tcp.CrosscheckError as e:
            tally.failures.append(f"{where}: crosscheck failed: {e}")
            continue
        except Exception as e:
            tally.failures.append(f"{where}: raised where stock did not: {e!r}")
            continue
        after = stock_counters()
        if after[:3] != before[:3]:
            tally.failures.append(f"{where}: torch's class counters changed: {before[:3]} -> {after[:3]}")
        if spec.isolated and after[3] != before[3]:
            tally.failures.append(f"{where}: an isolated store wrote to FakeTensorMode.cache")
        if library_utils.is_builtin is not is_builtin:
            tally.failures.append(f"{where}: torch._library.utils.is_builtin was replaced")
        tally.hits[spec.label] += ours.hits
        tally.misses[spec.label] += ours.misses
        tally.hits_by_namespace.update({f"{spec.label}/{ns}": n for ns, n in ours.hits_by_namespace.items()})
        for call in range(calls):
            tally.bypasses[spec.label] += sum(ours.bypasses[call].values())
            tally.bypass_reasons.update({f"{spec.label}/{k}": n for k, n in ours.bypasses[call].items()})
            if compare_bypasses:
                # Intended deviation from stock: an output whose aliasing the
                # entry cannot reproduce (prims.as_strided) is bypassed where
                # stock caches it wrongly; count those as cached for the
                # comparison. And ops returning a non-view alias (in-place
                # ops, prims.as_strided) keep entries in our store, so a first
                # call may miss where stock hit torch's warmed storage.
                ob = collections.Counter(ours.bypasses[call])
                cached = ours.cached[call] + ob.pop(ALIAS_BYPASS, 0)
                ref = 0 if spec.isolated and call == 0 else 1  # see MODES
                if call == 0:
                    same = contains(ob, stock.bypasses[ref]) and cached >= stock.cached[ref]
                else:
                    same = ob == stock.bypasses[1] and cached == stock.cached[1]
                if not same:
                    tally.failures.append(
                        f"{where} call {call + 1}: bypasses {dict(ours.bypasses[call])}, {ours.cached[call]} "
                        f"cached; stock call {ref + 1}: {dict(stock.bypasses[ref])}, {stock.cached[ref]} cached"
                    )
            why = output_difference(uncached.outputs[call], ours.outputs[call])
            if why:
                tally.failures.append(f"{where} call {call + 1}: output differs from uncached: {why}")
            expected_alias = alias_signature(uncached.outputs[call], uncached.inputs)
            actual_alias = alias_signature(ours.outputs[call], ours.inputs)
            if expected_alias != actual_alias:
                tally.failures.append(
                    f"{where} call {call + 1}: outputs alias inputs {actual_alias}, uncached {expected_alias}"
                )
    return True


# -------------------------------------------------------------------- sweeps


def dtypes_for(opinfo: Any) -> list[torch.dtype]:
    supported = opinfo.supported_dtypes("cpu")
    found = [torch.float32] if torch.float32 in supported else []
    return found + [d for d in INT_DTYPES if d in supported][:1]


def sweep_op(opinfo: OpInfo, device: str) -> Tally:
    """Compares the first SAMPLES_PER_OP samples of ``opinfo`` per dtype (all with TCP_FULL_OPDB=1)."""
    tally = Tally()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for dtype in dtypes_for(opinfo):
            try:
                samples = list(
                    itertools.islice(opinfo.sample_inputs(device, dtype, requires_grad=False), SAMPLES_PER_OP)
                )
            except Exception as e:
                tally.skip_reasons[f"sample generation: {type(e).__name__}"] += 1
                continue
            for i, sample in enumerate(samples):
                if compare_sample(tally, f"{opinfo.full_name}[{dtype}][{i}]", opinfo.op, sample):
                    tally.ops.add(opinfo.full_name)
    return tally


@dataclass
class Sample:
    """The shape of an OpInfo SampleInput, for hand-written cases."""

    input: Any
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


def backend_cases() -> list[tuple[str, Callable[..., Any], Sample]]:
    """Every tcp_test op, and two quantized_decomposed ops, on a few inputs."""
    x2, x4 = torch.empty(3, 5), torch.empty(2, 3, 8, 8)
    cases: list[tuple[str, Callable[..., Any], Sample]] = [
        (f"conv/{stride}", testing.op("conv"), Sample(x4, (stride,))) for stride in (1, 2)
    ]
    for name in ("pair", "dyn", "size0", "bad_view", "good_view", "mut", "ambient_cast", "swappable", "no_fake"):
        cases += [(f"{name}/{x.dim()}d", testing.op(name), Sample(x)) for x in (x2, x4)]
    cases.append(("multi_view", testing.op("multi_view"), Sample(x2, (torch.empty(3),))))
    qd = torch.ops.quantized_decomposed
    cases.append(("quantize_per_tensor", qd.quantize_per_tensor.default, Sample(x2, (0.1, 0, -128, 127, torch.int8))))
    cases.append(
        (
            "dequantize_per_tensor",
            qd.dequantize_per_tensor.default,
            Sample(x2.to(torch.int8), (0.1, 0, -128, 127, torch.int8)),
        )
    )
    return cases


def sweep_backend_ops() -> Tally:
    tally = Tally()
    for name, fn, sample in backend_cases():
        # Bypass reasons of backend ops differ from stock's "non-builtin" by
        # design under the permissive policy; outputs and aliasing must not.
        # Three calls: a backend key's first sight, the miss that makes its
        # entry, a hit (Note [An entry on a key's second sight]).
        if compare_sample(tally, name, fn, sample, shape_env=True, compare_bypasses=False, calls=3):
            tally.ops.add(name.split("/")[0])
    return tally


# --------------------------------------------------------------------- tests


def assert_no_failures(test: unittest.TestCase, tally: Tally) -> None:
    """Fails ``test`` on any crosscheck failure or key difference of ``tally``."""
    test.assertEqual(len(tally.failures), 0, msg="\n".join(tally.failures[:30]))
    test.assertEqual(len(tally.keys.differences), 0, msg="key parity:\n" + "\n".join(tally.keys.differences[:30]))


class TestOpInfoCrosscheck(testing.CachePolicyTestCase):
    @ops(OPS, dtypes=OpDTypes.none)
    @skipOps(EXPECTED_FAILURES)
    def test_op_db(self, device: str, op: OpInfo) -> None:
        """Every sample of the op gives the uncached outputs, aliasing, stock's bypasses and torch's cache keys."""
        tally = sweep_op(op, device)
        assert_no_failures(self, tally)
        self.assertEqual(tally.stock_vs_uncached, 0)


instantiate_device_type_tests(TestOpInfoCrosscheck, globals(), only_for="cpu")

# A fixed handful of common OpInfos whose samples all dispatch, for TestSweepReach.
REACH_OPS = ("add", "mul", "sum", "cat", "mm", "view", "transpose", "softmax", "index_select", "nn.functional.relu")


class TestSweepReach(testing.CachePolicyTestCase):
    """The sweep's comparisons are not vacuous, on a fixed subset of op_db computed here."""

    def test_reach(self) -> None:
        """Common ops are compared, missed and hit in every mode, and all their keys are built by the C++ builder."""
        by_name = {o.full_name: o for o in op_db}
        tally = Tally()
        for name in REACH_OPS:
            tally.add(sweep_op(by_name[name], "cpu"))
        assert_no_failures(self, tally)
        self.assertEqual(tally.stock_vs_uncached, 0)
        self.assertEqual(tally.ops, set(REACH_OPS), msg=str(tally.figures()))
        self.assertEqual(tally.skipped, 0, msg=str(tally.skip_reasons))
        self.assertGreaterEqual(tally.compared, 2 * len(REACH_OPS))
        for spec in MODES:
            self.assertGreaterEqual(tally.hits[spec.label], tally.compared, msg=spec.label)
        for spec in MODES[1:]:
            # Isolated stores: every sample's first call misses.
            self.assertGreaterEqual(tally.misses[spec.label], tally.compared, msg=spec.label)
        if testing.HAS_KEY_BUILDER:
            # Every stock call's keys were compared, and the builder built every one of them.
            self.assertGreaterEqual(tally.keys.keys, tally.compared * 2)
            self.assertEqual((tally.keys.built, dict(tally.keys.fallbacks)), (tally.keys.keys, {}))


class TestBackendOpsCrosscheck(testing.CachePolicyTestCase):
    def test_backend_ops(self) -> None:
        """tcp_test and quantized_decomposed ops give the uncached outputs, aliasing and torch's keys under every policy."""
        tally = sweep_backend_ops()
        assert_no_failures(self, tally)
        self.assertEqual(tally.skip_reasons, {"UnsupportedOperatorException": 2})  # no_fake only
        self.assertEqual(tally.hits_by_namespace["default/tcp_test"], 0)
        self.assertGreater(tally.hits_by_namespace["permissive/tcp_test"], 0)
        # Each safety check of the permissive mode fired at least once.
        for reason in (
            "unbacked symbol in scalar output",
            "output aliases an input without a schema annotation",
            "mutates an argument (allow it with register_op)",
            "view op with several tensor arguments",
        ):
            self.assertGreater(tally.bypass_reasons[f"permissive/{reason}"], 0, msg=reason)
        if testing.HAS_KEY_BUILDER:
            # Symbolic shapes (each mode has a ShapeEnv): the stock calls' symbolic keys were compared too.
            self.assertGreater(tally.keys.built, 0, msg=str(tally.keys.figures()))


class TestKnownIssues(testing.CachePolicyTestCase):
    """The two causes of crosscheck failures the sweeps found, both fixed (see EXPECTED_FAILURES)."""

    def test_stock_crosscheck_accepts_namedtuple_outputs(self) -> None:
        """Control: stock's own crosscheck accepts a hit of aten.aminmax."""
        mode = StockMode()
        mode.cache_crosscheck_enabled = True  # this instance only
        with mode:
            x = torch.empty(3, testing.fresh_size())
            first = torch.ops.aten.aminmax.default(x)
            second = torch.ops.aten.aminmax.default(x)
        self.assertEqual([t.shape for t in first], [t.shape for t in second])

    def test_crosscheck_accepts_namedtuple_outputs(self) -> None:
        """A hit whose uncached dispatch returned a namedtuple passes the crosscheck."""
        mode = tcp.FakeTensorMode(cache_crosscheck=True, cache_store=tcp.CacheStore(isolated=True))
        with mode:
            x = torch.empty(3, 4)
            torch.ops.aten.aminmax.default(x)
            torch.ops.aten.aminmax.default(x)
        self.assertEqual(mode.cache_report()[torch.ops.aten.aminmax.default].hits, 1)

    def test_prims_as_strided_is_never_replayed_unaliased(self) -> None:
        """prims.as_strided (returns Tensor(a!), not a view) bypasses, so every output aliases its input."""
        mode = tcp.FakeTensorMode(cache_store=tcp.CacheStore(isolated=True))
        with mode:
            x = torch.empty(2, 3)
            outs = [torch.ops.prims.as_strided.default(x, [3, 2], [1, 3], 0) for _ in range(2)]
        self.assertEqual(mode.cache_report()[torch.ops.prims.as_strided.default].hits, 0)
        self.assertEqual([storage_id(o) for o in outs], [storage_id(x)] * 2)


if __name__ == "__main__":
    run_tests()
