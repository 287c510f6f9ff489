"""Mutants of the proposed 0003 (v6.2): each undoes one check in a copy of the patched files and runs 0003's and 0004's tests.

    python docs/upstream/results/v6.2/mutants.py <tree holding torch/ with 0001-0004 applied> <output file>

The tree holds only the files the series touches (as test/test_upstream_patch.py builds them); the tests run in
test/upstream_patch_probe.py, which serves those files in place of the installed modules.
"""

import json
import os
import pathlib
import shutil
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[4]
FT = "torch/_subclasses/fake_tensor.py"
LIB = "torch/library.py"
CO = "torch/_library/custom_ops.py"
FC = "torch/_library/fake_cache.py"
MUTANTS = [
    ("no generation in key", FT, "    key: tuple[object, ...] = (_fake_cache.generation,)\n", "    key: tuple[object, ...] = ()\n"),
    ("no context in key", FT, "        key += (context, value)\n", "        pass\n"),
    (
        "only the op's own namespace's context (v6.1)",
        FT,
        "    for context in list(_fake_cache.contexts.values()):\n",
        "    for context in [c for n, c in _fake_cache.contexts.items() if n == func.namespace]:\n",
    ),
    (
        "HOP keys unchanged (stock)",
        FT,
        "        if func._name in _cacheable_ops or isinstance(\n            func, torch._ops.HigherOrderOperator\n        ):\n",
        "        if func._name in _cacheable_ops:\n",
    ),
    ("no mutable bypass", FT, "            if func._schema.is_mutable:\n", "            if False:\n"),
    (
        "no alias check",
        FT,
        "            _validate_declared_op_aliasing(func, args, kwargs, output)\n",
        "            pass\n",
    ),
    (
        "alias check without kwargs",
        FT,
        "for a in pytree.tree_leaves((args, kwargs))\n",
        "for a in pytree.tree_leaves(args)\n",
    ),
    (
        "no proven-equal check",
        FT,
        "            and func._name in _cacheable_ops\n            and not (\n",
        "            and False\n            and not (\n",
    ),
    ("no bump in Library.impl", LIB, "        fake_cache.kernel_changed()\n", ""),
    ("no bump after a Library's destruction", FC, "    if op_impls:\n        kernel_changed()\n", ""),
    (
        "bump before the kernels go (v6 order)",
        LIB,
        "        for handle in self._registration_handles:\n            handle.destroy()\n        self._registration_handles.clear()\n        global _impls\n        _impls -= self._op_impls\n        _clear_torch_ops_cache(self._op_defs)\n        fake_cache.library_destroyed(self._op_defs, self._op_impls)\n",
        "        fake_cache.library_destroyed(self._op_defs, self._op_impls)\n        for handle in self._registration_handles:\n            handle.destroy()\n        self._registration_handles.clear()\n        global _impls\n        _impls -= self._op_impls\n        _clear_torch_ops_cache(self._op_defs)\n",
    ),
    (
        "declaration outlives its op",
        FC,
        "    for qualname in op_defs:  # a declaration ends with its operator\n        declared.pop(qualname, None)\n",
        "",
    ),
    ("handle ends any declaration (v6.1)", FC, "        if declared.get(qualname) is declaration:\n            declared.pop(qualname, None)\n", "        declared.pop(qualname, None)\n"),
    ("no bump in CustomOpDef.register_fake", CO, "        torch._library.fake_cache.kernel_changed()\n", ""),
    (
        "raising context not caught",
        FT,
        '        except Exception:\n            raise _BypassDispatchCache("cache context raised") from None\n',
        '        except ZeroDivisionError:\n            raise _BypassDispatchCache("cache context raised") from None\n',
    ),
    ("unhashable context not caught", FT, "        if not equal:\n", "        if False:\n"),
    (
        "context API not validated",
        LIB,
        '    if namespace in ("aten", "prim", "prims") or not callable(fn):\n',
        "    if False:\n",
    ),
]

def probe(tree: pathlib.Path) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1", "TCP_PATCHED_TREE": str(tree)}
    cmd = [sys.executable, str(REPO / "test" / "upstream_patch_probe.py"), "probe", "0003", "0004"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True).stdout
    line = next(line for line in out.splitlines() if line.startswith("PROBE-RESULT "))
    return json.loads(line.split(" ", 1)[1])


def main() -> None:
    tree, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    base = probe(tree)
    lines = [f"unmutated: {sum(v == 'ok' for v in base.values())} of {len(base)} pass"]
    for name, rel, old, new in MUTANTS:
        mutant = tree.parent / "mutant"
        shutil.rmtree(mutant, ignore_errors=True)
        shutil.copytree(tree, mutant)
        text = (mutant / rel).read_text()
        assert text.count(old) == 1, (name, text.count(old))
        (mutant / rel).write_text(text.replace(old, new))
        result = probe(mutant)
        failed = sorted(k for k, v in result.items() if v != "ok")
        lines.append(f"{name}: {len(failed)} of {len(result)} fail" + "".join(f"\n    {f}" for f in failed))
        print(lines[-1], flush=True)
    out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
