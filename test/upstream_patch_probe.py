"""The scenarios test_upstream_patch.py runs against torch patched with docs/upstream/.

Runs in a subprocess, never imported by the test process (importing it
defines the ``tcp_upstream`` operators)::

    TCP_PATCHED_TREE=/tmp/x/site-packages python test/upstream_patch_probe.py probe
    TCP_PATCHED_TREE= python test/upstream_patch_probe.py workload

``TCP_PATCHED_TREE`` names a tree laid out like site-packages that holds the
patched copies of ``torch/_subclasses/fake_tensor.py`` and ``torch/_ops.py``;
they are served in place of the installed modules, so the installed torch is
never written. Empty: the installed torch, unpatched. ``probe`` prints
``PROBE-RESULT <json>``, one dict per scenario (``s_*`` function), or its
traceback; ``workload`` prints ``WORKLOAD-RESULT <json>``, the stock cache
counters of a fixed workload that must not change with the patch when no
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
}


class _PatchedFinder(importlib.abc.MetaPathFinder):
    def __init__(self, tree: str) -> None:
        self.tree = tree

    def find_spec(
        self, name: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        rel = PATCHED_FILES.get(name)
        return None if rel is None else importlib.util.spec_from_file_location(name, os.path.join(self.tree, rel))


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
import traceback  # noqa: E402
from collections.abc import Callable, Hashable  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402
import torch._subclasses.fake_tensor as ft  # noqa: E402
import torch.ao.quantization.fx._decomposed  # noqa: E402, F401  (defines quantized_decomposed)
from torch._ops import OpOverload  # noqa: E402
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext  # noqa: E402

# The patched class: its new API (cache_policy=, policy_cache_info(), ...) is
# unknown to the installed torch's annotations.
FTM: Any = ft.FakeTensorMode
q = torch.ops.quantized_decomposed.quantize_per_tensor.default
calls: dict[str, int] = {}
ambient: dict[str, torch.dtype] = {"dtype": torch.float32}
lib = torch.library.Library("tcp_upstream", "DEF")

Result = dict[str, Any]


def define(schema: str, fn: Callable[..., Any]) -> None:
    """Defines ``tcp_upstream::<schema>`` with a fake kernel that counts its calls."""
    lib.define(schema)
    name = schema.split("(")[0]

    def kernel(*args: Any) -> Any:
        calls[name] = calls.get(name, 0) + 1
        return fn(*args)

    torch.library.register_fake(f"tcp_upstream::{name}", kernel, lib=lib)


def _twins(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    out = x.new_empty(x.shape)
    return out, out.view(-1)


define("dyn(Tensor x) -> SymInt", lambda x: torch.library.get_ctx().new_dynamic_size())
define("bad_view(Tensor x) -> Tensor", lambda x: x.view(-1))
define("good_view(Tensor(a) x) -> Tensor(a)", lambda x: x.view(-1))
define("twins(Tensor x) -> (Tensor, Tensor)", _twins)
define("mut(Tensor(a!) x) -> ()", lambda x: None)
define("multi_view(Tensor(a) x, Tensor y) -> Tensor(a)", lambda x, y: x.view(-1))
define("ambient_cast(Tensor x) -> Tensor", lambda x: x.new_empty(x.shape, dtype=ambient["dtype"]))
define("swap.ovl(Tensor x) -> Tensor", lambda x: x.new_empty(x.shape))
define("sparse(Tensor x) -> Tensor", lambda x: x.to_sparse())


def op(name: str, overload: str = "default") -> OpOverload:
    return getattr(getattr(torch.ops.tcp_upstream, name), overload)  # type: ignore[no-any-return]


@dataclass(frozen=True)
class Decision:
    cacheable: bool
    label: str
    explicit: bool = False


class Policy:
    """The smallest object FakeTensorCachePolicy accepts."""

    def __init__(
        self,
        namespaces: Sequence[str] = ("quantized_decomposed", "tcp_upstream"),
        deny: set[OpOverload] | None = None,
        allow: set[OpOverload] | None = None,
        context: Callable[[], Hashable] | None = None,
    ) -> None:
        self.namespaces, self.deny, self.allow, self.context = set(namespaces), deny or set(), allow or set(), context
        self.identity = (frozenset(self.namespaces), frozenset(self.deny), frozenset(self.allow), context)

    def decide(self, op: OpOverload) -> Decision:
        if op in self.deny:
            return Decision(False, "denied by policy")
        if op in self.allow:
            return Decision(True, "cacheable", explicit=True)
        ok = op.namespace in {"aten", "prim", "prims"} | self.namespaces
        return Decision(ok, "cacheable" if ok else "non-builtin")

    def context_key(self) -> Hashable:
        return None if self.context is None else self.context()


def info(i: Any) -> Result:
    return {"hits": i.hits, "misses": i.misses, "bypasses": i.bypasses, "size": i.size}


def global_keys(ns: str) -> int:
    return sum(1 for k in list(FTM.cache) if getattr(k.key[0], "namespace", None) == ns)


def run_q(mode: Any, n: int = 3) -> list[torch.Tensor]:
    with mode:
        x = torch.empty(2, 8)
        return [q(x, 0.1, 0, -128, 127, torch.int8) for _ in range(n)]


def storage(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


def bypass_case(name: str, n: int = 2, policy: Policy | None = None, **kw: Any) -> tuple[Any, torch.Tensor, list[Any]]:
    """Calls ``tcp_upstream::name`` ``n`` times in a new patched mode."""
    mode = FTM(cache_policy=policy or Policy(), **kw)
    calls.pop(name, None)
    with mode:
        x = torch.empty(4, 4)
        outs = [op(name)(*([x, x] if name == "multi_view" else [x])) for _ in range(n)]
    return mode, x, outs


# ------------------------------------------------------------- scenarios


def s_loaded() -> Result:
    sig = inspect.signature(FTM.__init__).parameters["cache_policy"]
    return {
        "fake_tensor": ft.__file__,
        "ops": torch._ops.__file__,
        "kind": sig.kind.name,
        "default": repr(sig.default),
        "protocol": hasattr(ft, "FakeTensorCachePolicy"),
    }


def s_admitted() -> Result:
    before = info(FTM.cache_info())
    mode = FTM(cache_policy=Policy())
    outs = run_q(mode)
    after = info(FTM.cache_info())
    return {
        "policy": info(mode.policy_cache_info()),
        "shapes": [list(o.shape) for o in outs],
        "dtypes": [str(o.dtype) for o in outs],
        "global_qd_keys": global_keys("quantized_decomposed"),
        "global_bypass_delta": {k: v - before["bypasses"].get(k, 0) for k, v in after["bypasses"].items()},
        "partitions": [list(map(repr, k[:2])) for k in mode.policy_cache],
    }


def s_default() -> Result:
    before = FTM.cache_info().bypasses.get("non-builtin", 0)
    mode = FTM()
    run_q(mode)
    return {
        "non_builtin_delta": FTM.cache_info().bypasses.get("non-builtin", 0) - before,
        "policy": info(mode.policy_cache_info()),
        "cache_policy": repr(mode.cache_policy),
    }


def s_denied_builtin() -> Result:
    add = torch.ops.aten.add.Tensor
    mode = FTM(cache_policy=Policy(deny={add}))
    with mode:
        x = torch.empty(3, 5)
        size = len(FTM.cache)
        add(x, x)
        add(x, x)
        grown = len(FTM.cache) - size
    return {"policy": info(mode.policy_cache_info()), "global_growth": grown}


def s_unbacked() -> Result:
    mode, _, outs = bypass_case("dyn", shape_env=ShapeEnv())
    return {"policy": info(mode.policy_cache_info()), "distinct": len({str(o) for o in outs}), "calls": calls["dyn"]}


def s_alias() -> Result:
    mode, x, outs = bypass_case("bad_view")
    return {"policy": info(mode.policy_cache_info()), "aliased": [storage(o) == storage(x) for o in outs]}


def s_declared_view() -> Result:
    mode, x, outs = bypass_case("good_view", n=3)
    return {"policy": info(mode.policy_cache_info()), "aliased": [storage(o) == storage(x) for o in outs]}


def s_twins() -> Result:
    mode, _, outs = bypass_case("twins")
    return {"policy": info(mode.policy_cache_info()), "shared": [storage(a) == storage(b) for a, b in outs]}


def s_mutable() -> Result:
    mode, _, _ = bypass_case("mut")
    explicit, _, _ = bypass_case("mut", n=3, policy=Policy(allow={op("mut")}))
    return {
        "policy": info(mode.policy_cache_info()),
        "explicit": info(explicit.policy_cache_info()),
        "calls": calls["mut"],
    }


def s_multi_view() -> Result:
    mode, _, _ = bypass_case("multi_view")
    return {"policy": info(mode.policy_cache_info())}


def s_sparse() -> Result:
    mode, _, outs = bypass_case("sparse")
    return {"policy": info(mode.policy_cache_info()), "layouts": [str(o.layout) for o in outs]}


def s_context() -> Result:
    mode = FTM(cache_policy=Policy(context=lambda: ambient["dtype"]))
    calls.pop("ambient_cast", None)
    dtypes = []
    with mode:
        x = torch.empty(2)
        for dtype in (torch.float32, torch.float32, torch.float16, torch.float16, torch.float32):
            ambient["dtype"] = dtype
            dtypes.append(str(op("ambient_cast")(x).dtype))
    ambient["dtype"] = torch.float32
    return {"policy": info(mode.policy_cache_info()), "dtypes": dtypes, "calls": calls["ambient_cast"]}


def s_kernel_swap() -> Result:
    swap = op("swap", "ovl")
    mode = FTM(cache_policy=Policy())
    fragment = torch.library.Library("tcp_upstream", "FRAGMENT")
    shapes = []
    with mode:
        x = torch.empty(4, 4)
        shapes.append(list(swap(x).shape))
        torch.library.register_fake("tcp_upstream::swap.ovl", lambda x: x.new_empty(7), lib=fragment)
        shapes.append(list(swap(x).shape))
        shapes.append(list(swap(x).shape))
    fragment._destroy()
    return {"policy": info(mode.policy_cache_info()), "shapes": shapes}


def s_policy_cache_clear() -> Result:
    mode = FTM(cache_policy=Policy())
    run_q(mode)
    mode.policy_cache_clear()
    return {"policy": info(mode.policy_cache_info())}


def s_cache_clear_subclass() -> Result:
    class Sub(FTM):  # type: ignore[misc]
        pass

    Sub.cache_clear()
    shadowed = sorted(k for k in ("cache_hits", "cache_misses", "cache_bypasses", "cache") if k in Sub.__dict__)
    with FTM():
        x = torch.empty(2, 3)
        x + x
        x + x
    return {"shadowed": shadowed, "sub_hits_follow_base": Sub.cache_info().hits == FTM.cache_info().hits >= 1}


def s_hop_subclass() -> Result:
    class Sub(FTM):  # type: ignore[misc]
        pass

    with Sub():
        x = torch.empty(3)
        out = torch.cond(x.sum() > 0, lambda x: x + 1, lambda x: x - 1, (x,))
    return {"shape": list(out.shape), "fake": isinstance(out, ft.FakeTensor)}


def s_cachepolicy_protocol() -> Result:
    import torch_cachepolicy as tcp

    mode = FTM(cache_policy=tcp.CachePolicy(namespaces=["quantized_decomposed"]))
    run_q(mode)
    return {"policy": info(mode.policy_cache_info())}


def probe() -> dict[str, Result]:
    """Runs every ``s_*`` scenario; a failing one reports its traceback under "error"."""
    results: dict[str, Result] = {}
    for name, fn in list(globals().items()):
        if name.startswith("s_") and callable(fn):
            try:
                results[name[2:]] = fn()
            except BaseException:
                results[name[2:]] = {"error": traceback.format_exc()}
    return results


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
                log.append([str(t.shape) for t in (y, v, z, n)] + [str(z.dtype)])
        log.append(str(len(mode.shape_env.fake_tensor_cache) if mode.shape_env else None))
    stats = FTM.cache_info()
    return [stats.hits, stats.misses, dict(sorted(stats.bypasses.items())), stats.size, log]


def main(argv: Sequence[str]) -> None:
    if argv == ["probe"]:
        print("PROBE-RESULT " + json.dumps(probe()))
    elif argv == ["workload"]:
        print("WORKLOAD-RESULT " + json.dumps(workload()))
    else:
        raise SystemExit(f"usage: {sys.argv[0]} probe|workload")


if __name__ == "__main__":
    main(sys.argv[1:])
