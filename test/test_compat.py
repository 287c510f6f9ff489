# Owner(s): ["module: fakeTensor"]
"""Tests for torch_cachepolicy._compat: the torch range, the internals check and its coverage; _fakes.is_fake_tensor.

Drift is simulated on stand-in module objects (copies of torch's classes with
one thing changed, registered in ``sys.modules`` for the duration of a test)
or in a subprocess that changes its own torch before importing the package;
the torch of the test process is never modified.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import json
import os
import pathlib
import re
import subprocess
import sys
import textwrap
import types
import warnings
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import torch
from torch._subclasses import fake_tensor as ft
from torch.testing._internal.common_utils import (
    TestCase,
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
)

import torch_cachepolicy as tcp
from torch_cachepolicy import _compat, _fakes, _kernels

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "torch_cachepolicy"
FT = "torch._subclasses.fake_tensor"
STANDIN = "_tcp_compat_test_fake_tensor"

# Private by name but meant for users of torch's dispatch machinery (their
# documentation points subclass and custom-op authors at them), so not listed
# in _compat._INTERNALS: the pytree utilities, TorchDispatchMode and its
# helpers, and the types of torch.ops.* objects.
PUBLIC_IN_PRACTICE = (
    "torch.utils._pytree",
    "torch.utils._python_dispatch",
    "torch._ops.OpOverload",
    "torch._ops.OpOverloadPacket",
    "torch._C.DispatchKey",
)


def plain_copy(cls: type, **changes: object) -> type:
    """A class with ``cls``'s own attributes, ``changes`` applied (``None`` deletes)."""
    namespace = {k: v for k, v in vars(cls).items() if k not in ("__dict__", "__weakref__")}
    for name, value in changes.items():
        if value is None:
            namespace.pop(name, None)
        else:
            namespace[name] = value
    return type(cls.__name__, (), namespace)


def _init_without_crosscheck(self: Any, *, allow_fallback_kernels: bool = True, allow_non_fake_inputs: bool = False,
                             shape_env: Any = None, static_shapes: Any = None, export: bool = False) -> None:
    self.cache_enabled = True
    self.fake_tensor_converter = None
    self.shape_env = shape_env
    self._allow_unsafe_data_ptr_access = False
    self.allow_fallback_kernels = allow_fallback_kernels
    self.propagate_real_tensors = False
    self.in_kernel_invocation = False


def _init_without_in_kernel_invocation(
    self: Any, *, allow_fallback_kernels: bool = True, allow_non_fake_inputs: bool = False, shape_env: Any = None,
    static_shapes: Any = None, export: bool = False,
) -> None:
    self.cache_enabled = self.cache_crosscheck_enabled = True
    self.fake_tensor_converter = None
    self.shape_env = shape_env
    self._allow_unsafe_data_ptr_access = False
    self.allow_fallback_kernels = allow_fallback_kernels
    self.propagate_real_tensors = False


def _new_keeping_constant_elsewhere(cls: type, fake_mode: Any, elem: Any, device: Any, constant: Any = None,
                                    dispatch_keys: Any = None) -> Any:
    self = object.__new__(cls)
    self.fake_mode, self.dispatch_keys, self._constant = fake_mode, dispatch_keys, constant
    return self


def _init_without_keywords(self: Any, *, allow_fallback_kernels: bool = True, shape_env: Any = None) -> None:
    self.in_kernel_invocation = False


@dataclasses.dataclass(frozen=True)
class _RenamedOutputInfo:
    inplace_idx: int | None
    metadata: object
    view_index: int | None


class _IdentityKey:
    def __init__(self, tup: tuple[object, ...]) -> None:
        self.key = tup

    def strip_shape_env(self) -> None:
        pass


# name -> (what to change in the stand-in fake_tensor module, the drift it is reported as, or None)
DRIFTS: dict[str, tuple[Callable[[], dict[str, object]], str | None]] = {
    "method_removed": (
        lambda: {"FakeTensorMode": plain_copy(ft.FakeTensorMode, _cache_key=None)},
        "FakeTensorMode._cache_key cannot be used (AttributeError(\"type object 'FakeTensorMode' has no "
        "attribute '_cache_key'\"))",
    ),
    "called_gains_required_param": (
        lambda: {
            "FakeTensorMode": plain_copy(
                ft.FakeTensorMode,
                _make_cache_entry=lambda self, state, key, func, args, kwargs, output, extra: None,
            )
        },
        "FakeTensorMode._make_cache_entry takes (self, state, key, func, args, kwargs, output, extra), "
        "expected (self, state, key, func, args, kwargs, output, ...)",
    ),
    "called_reorders_params": (
        lambda: {
            "FakeTensorMode": plain_copy(
                ft.FakeTensorMode, _output_from_cache_entry=lambda self, entry, state, key, func, args: None
            )
        },
        "FakeTensorMode._output_from_cache_entry takes (self, entry, state, key, func, args), expected exactly "
        "(self, state, entry, key, func, args) or (self, state, entry, key, args) (the package overrides it)",
    ),
    "called_gains_optional_param": (
        lambda: {
            "FakeTensorMode": plain_copy(
                ft.FakeTensorMode, _cache_key=lambda self, state, func, args, kwargs, extra=None: None
            )
        },
        None,
    ),
    "overridden_gains_optional_param": (
        lambda: {
            "FakeTensorMode": plain_copy(
                ft.FakeTensorMode, _validate_cache_key=lambda self, func, args, kwargs, strict=False: None
            )
        },
        "FakeTensorMode._validate_cache_key takes (self, func, args, kwargs, strict), "
        "expected exactly (self, func, args, kwargs) (the package overrides it)",
    ),
    "keyword_removed": (
        lambda: {
            "FakeTensorMode": plain_copy(
                ft.FakeTensorMode,
                __init__=_init_without_keywords,
            )
        },
        "FakeTensorMode.__init__ takes (self, allow_fallback_kernels, shape_env), without the keyword "
        "arguments (allow_non_fake_inputs, static_shapes, export)",
    ),
    "attribute_no_longer_set": (
        lambda: {"FakeTensorMode": plain_copy(ft.FakeTensorMode, __init__=_init_without_crosscheck)},
        "FakeTensorMode.__init__ no longer uses the attributes (cache_crosscheck_enabled)",
    ),
    "field_renamed": (
        lambda: {"_DispatchCacheEntryOutputInfo": _RenamedOutputInfo},
        "_DispatchCacheEntryOutputInfo has the fields (inplace_idx, metadata, view_index), "
        "expected (inplace_idx, metadata, view_idx, constant_value, ...)",
    ),
    "key_compares_by_identity": (
        lambda: {"_DispatchCacheKey": _IdentityKey},
        "_DispatchCacheKey keys of equal tuples are not equal (or hash differently), or .key is not the tuple",
    ),
    "exception_no_longer_an_exception": (
        lambda: {"_BypassDispatchCache": ft._DispatchCacheBypassEntry},
        "_BypassDispatchCache is not an Exception",
    ),
}


# name -> (what to change in the stand-in fake_tensor module, the drift it is reported as): renames of what csrc/
# reads by name, each switching the C++ helper off (Feature.NATIVE) and nothing else.
CPP_RENAMES: dict[str, tuple[Callable[[], dict[str, object]], str]] = {
    "in_kernel_invocation": (
        lambda: {"FakeTensorMode": plain_copy(ft.FakeTensorMode, __init__=_init_without_in_kernel_invocation)},
        "FakeTensorMode.__init__ no longer uses the attributes (in_kernel_invocation)",
    ),
    "constant": (
        lambda: {"FakeTensor": plain_copy(ft.FakeTensor, __new__=_new_keeping_constant_elsewhere)},
        "FakeTensor.__new__ no longer uses the attributes (constant)",
    ),
    "_fake_device": (
        lambda: {"FakeTensor": plain_copy(ft.FakeTensor, fake_device=property(lambda self: self._device))},
        "FakeTensor.fake_device.fget no longer uses the attributes (_fake_device)",
    ),
}

# An attribute name csrc/ hands to Python: a py::str("name"), or a literal passed to .attr() (but m.attr(...), which
# defines the extension's own), getattr or *AttrString.
CPP_ATTRIBUTE = re.compile(r'py::str\("(\w+)"\)|(?<!\bm)\.attr\("(\w+)"\)|(?:getattr|hasattr|AttrString)\([^;"]*"(\w+)"')
# Names csrc/ reads of objects that are not torch's.
NOT_TORCHS = {"update": "set.update, of a key state's known_symbols"}


def cpp_attribute_names() -> set[str]:
    """Every attribute name the C++ sources read (or set) on Python objects."""
    sources = "\n".join(p.read_text() for p in sorted((ROOT / "csrc").iterdir()))
    return {next(name for name in m.groups() if name) for m in CPP_ATTRIBUTE.finditer(sources)}


@contextlib.contextmanager
def drifted(changes: dict[str, object]) -> Iterator[None]:
    """Points the checks of torch._subclasses.fake_tensor at a stand-in module with ``changes``."""
    standin = types.ModuleType(STANDIN)
    standin.__dict__.update({k: v for k, v in vars(ft).items() if not k.startswith("__")})
    standin.__dict__.update(changes)
    internals = tuple(dataclasses.replace(i, module=STANDIN) if i.module == FT else i for i in _compat._INTERNALS)
    with mock.patch.dict(sys.modules, {STANDIN: standin}), mock.patch.object(_compat, "_INTERNALS", internals):
        yield


class TestCompat(TestCase):
    def check(self, version: str, drift: tuple[_compat.Drift, ...] = ()) -> list[str]:
        """Runs the import-time judgement for ``version`` (and ``drift``); returns the warnings it gave."""
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _compat.check_torch_internals(version, drift)
        return [str(w.message) for w in caught if issubclass(w.category, UserWarning)]

    # ----------------------------------------------------------- releases

    def test_installed_torch_passes_silently(self) -> None:
        """The installed torch is a tested release, its internals check out, and nothing warns."""
        self.assertEqual(_compat.DRIFT, ())
        self.assertEqual(self.check(str(torch.__version__)), [])
        self.assertIn(_compat.torch_minor(str(torch.__version__)), [(2, 13), (2, 14), (2, 15)])

    def test_every_gate_is_on_for_a_tested_torch(self) -> None:
        """On a tested release no fast path is switched off (a gate turning off would silently cost speed)."""
        gates = {
            "FAKE_TENSOR_CONSTRUCTOR_KNOWN": _compat.FAKE_TENSOR_CONSTRUCTOR_KNOWN,
            "SYMBOLIC_KEYS": _compat.SYMBOLIC_KEYS,
        }
        self.assertEqual([name for name, on in gates.items() if not on], [])
        self.assertEqual({feature: _compat.off(feature) for feature in _compat.Feature if _compat.off(feature)}, {})
        # Release-dependent, not a fast path: which of the two releases' key the builder reproduces.
        minor = _compat.torch_minor(str(torch.__version__))
        self.assertEqual(_compat.SYMBOLIC_MEMORY_FORMAT_GUARDS, minor == (2, 13))
        self.assertEqual(_compat.SYNTHESIS_TAKES_FUNC, minor in [(2, 13), (2, 14)])

    def test_requirement_is_version_py_s(self) -> None:
        """setup.py reads version.py's torch requirement, pyproject.toml's build requirement equals it, no upper cap."""
        from torch_cachepolicy import version

        self.assertEqual(version.TORCH_REQUIREMENT, ">=2.13")
        self.assertIn('TORCH_REQUIREMENT = "torch" + _VERSION_PY["TORCH_REQUIREMENT"]', (ROOT / "setup.py").read_text())
        self.assertIn(f'"torch{version.TORCH_REQUIREMENT}"', (ROOT / "pyproject.toml").read_text())
        self.assertEqual(version.TESTED_TORCH, ("2.13.0", "2.14.1", "2.15.0"))
        for release in version.TESTED_TORCH:
            self.assertEqual(self.check(release), [], msg=release)

    @parametrize("version", ["2.13.0", "2.13.1+cpu", "2.14.1+cu130", "2.14.0a0+git1234567", "2.15.0+cu132", "2.15.1"])
    def test_tested_minors_do_not_warn(self, version: str) -> None:
        """Every release of a tested major.minor, local and pre-release builds included, imports silently."""
        self.assertEqual(self.check(version), [])

    @parametrize("version", ["2.12.1", "2.16.0", "2.16.0.dev20270101+cpu", "3.0.0", "unknown"])
    def test_untested_warns(self, version: str) -> None:
        """A torch of no tested major.minor whose internals check out imports with one UntestedTorchWarning."""
        (message,) = self.check(version)
        self.assertIn(f"torch {version} is none of the releases the package is tested on", message)

    def test_warning_text(self) -> None:
        """The warning names the version, the tested releases and what to do."""
        self.assertExpectedInline(
            self.check("2.16.0")[0],
            """torch_cachepolicy: torch 2.16.0 is none of the releases the package is tested on (2.13.0, 2.14.1, 2.15.0). The private internals it uses were checked at import, but their behaviour is untested on this version; run the package's tests before relying on it.""",  # noqa: B950
        )

    # ----------------------------------------------------------- drift

    @parametrize("drift", list(DRIFTS))
    def test_drift(self, drift: str) -> None:
        """A changed internal is found and named; a compatible change is not."""
        changes, expected = DRIFTS[drift]
        with drifted(changes()):
            found = _compat.find_drift()
        if expected is None:
            self.assertEqual(found, ())
            return
        self.assertEqual([str(d) for d in found], [f"{STANDIN}.{expected}"])
        self.assertEqual(found[0].feature, _compat.Feature.CACHE)

    def test_drift_warns_and_names_what_is_off(self) -> None:
        """A changed internal of the cache warns once, naming it and everything switched off; no ImportError."""
        with drifted(DRIFTS["called_gains_required_param"][0]()):
            drift = _compat.find_drift()
        (message,) = self.check("2.15.0", drift)
        self.assertExpectedInline(
            message,
            """torch_cachepolicy: torch 2.15.0 changed private internals this package builds on (_tcp_compat_test_fake_tensor.FakeTensorMode._make_cache_entry takes (self, state, key, func, args, kwargs, output, extra), expected (self, state, key, func, args, kwargs, output, ...)). Switched off: the policy cache (the mode dispatches as torch's FakeTensorMode: aten ops cached as stock caches them, backend ops uncached); caching of backend and higher-order operators (they bypass; aten ops stay cached); the C++ helper torch_cachepolicy._C (as with USE_CPP=0: torch's key and synthesis, a weaker kernel watch). Everything else works as stock FakeTensorMode does. torch_cachepolicy is tested on torch 2.13.0, 2.14.1, 2.15.0; please report this with your torch version (pip install "torch==2.15.0" gives a tested release)""",  # noqa: B950
        )

    @parametrize("name", list(CPP_RENAMES))
    def test_renamed_attribute_the_cpp_reads(self, name: str) -> None:
        """A renamed attribute that csrc/ reads by name is found, and switches off the C++ helper and nothing else."""
        changes, expected = CPP_RENAMES[name]
        with drifted(changes()):
            found = _compat.find_drift()
        self.assertEqual([str(d) for d in found], [f"{STANDIN}.{expected}"])
        self.assertEqual(set(_compat.switched_off(found)), {_compat.Feature.NATIVE})

    def test_features_rest_on_the_cache(self) -> None:
        """Switching the cache off switches its parts off; a part alone leaves the others on."""
        cache = _compat.Drift("x", "changed", _compat.Feature.CACHE)
        self.assertEqual(
            set(_compat.switched_off((cache,))),
            {_compat.Feature.CACHE, _compat.Feature.BACKEND, _compat.Feature.NATIVE},
        )
        backend = _compat.Drift("y", "changed", _compat.Feature.BACKEND)
        self.assertEqual(set(_compat.switched_off((backend,))), {_compat.Feature.BACKEND})

    def test_rules_drift_is_an_import_error(self) -> None:
        """A change to what the subclass needs to be a FakeTensorMode at all raises ImportError naming it."""
        drift = (_compat.Drift("torch._ops.OperatorBase", "has no python_key_table", _compat.Feature.RULES),)
        with self.assertRaisesRegex(ImportError, r"changed a private internal this package builds on: "
                                    r"torch\._ops\.OperatorBase has no python_key_table\. Without it"):
            self.check("2.15.0", drift)

    def test_every_internal_belongs_to_a_feature(self) -> None:
        """Each internal names the feature it switches off; RULES only for what rule lookups and op types need."""
        by_feature: dict[_compat.Feature, list[str]] = {}
        for internal in _compat._INTERNALS:
            by_feature.setdefault(internal.feature, []).append(internal.name)
        self.assertEqual(set(by_feature), set(_compat.Feature))
        self.assertExpectedInline(
            "\n".join(sorted(by_feature[_compat.Feature.RULES])),
            """\
torch._C.DispatchKey
torch._C._dispatch_has_kernel_for_dispatch_key
torch._C._dispatch_tls_is_dispatch_key_included
torch._higher_order_ops.utils.redirect_to_mode
torch._higher_order_ops.utils.registered_hop_fake_fns
torch._library.custom_ops.CustomOpDef
torch._library.simple_registry.GenericTorchDispatchRuleHolder.find
torch._library.simple_registry.GenericTorchDispatchRuleHolder.register
torch._library.simple_registry.SimpleLibraryRegistry.find
torch._library.simple_registry.SimpleLibraryRegistry.get
torch._library.simple_registry.SimpleOperatorEntry.__init__
torch._library.simple_registry.find_torch_dispatch_rule
torch._library.simple_registry.singleton
torch._ops.HigherOrderOperator
torch._ops.OpOverload
torch._ops.OperatorBase
torch._ops.OperatorBase.__init__
torch._ops._OpNamespace
torch._subclasses.fake_tensor.FakeTensorMode.dispatch""",
        )

    def test_stand_in_without_drift_passes(self) -> None:
        """Control for test_drift: the stand-in module with no change has no drift."""
        with drifted({}):
            self.assertEqual(_compat.find_drift(), ())

    def test_import_in_subprocess(self) -> None:
        """`import torch_cachepolicy` on a drifted torch works and warns once, attributed to the importing line."""
        code = textwrap.dedent(
            """
            import json, warnings
            import torch
            import torch._subclasses.fake_tensor as ft

            ft.FakeTensorMode._cache_key = lambda self, state, func, args: None
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                import torch_cachepolicy
            out = {"warnings": [(w.category.__name__, w.filename, str(w.message)) for w in caught]}
            out["imported"] = hasattr(torch_cachepolicy, "FakeTensorMode")
            print("RESULT " + json.dumps(out))
            """
        )
        result = run_python(code)
        ((category, filename, message),) = result["warnings"]
        self.assertEqual((category, filename), ("TorchDriftWarning", "<string>"))
        self.assertIn("FakeTensorMode._cache_key takes (self, state, func, args), expected "
                      "(self, state, func, args, kwargs, ...)", message)
        self.assertTrue(result["imported"])

    # ---------------------------------------------------- coverage of the list

    def test_every_private_torch_name_is_checked(self) -> None:
        """Each private torch name the package's source refers to is listed in _compat._INTERNALS."""
        listed = {i.name for i in _compat._INTERNALS}
        # Instance attributes an __init__ sets, listed in its refers_to
        # ("FakeTensorMode._allow_unsafe_data_ptr_access").
        attributes = {
            f"{i.module}.{i.path.removesuffix('.__init__')}.{a}"
            for i in _compat._INTERNALS
            if i.path.endswith(".__init__")
            for a in i.refers_to
        }

        def covered(ref: str) -> bool:
            return ref in attributes or any(
                ref == name or name.startswith(ref + ".") or ref.startswith(name + ".")
                for name in (*listed, *PUBLIC_IN_PRACTICE)
            )

        refs = set().union(*private_torch_references().values())
        self.assertGreater(len(refs), 20)  # the scan sees the package's references
        self.assertEqual(sorted(r for r in refs if not covered(r)), [])

    def test_every_name_the_cpp_reads_is_checked(self) -> None:
        """Each attribute name csrc/ reads of torch's objects is listed under Feature.NATIVE (refers_to, or the
        attribute an internal is), so that its rename switches the C++ helper off instead of failing each dispatch."""
        native = [i for i in _compat._INTERNALS if i.feature is _compat.Feature.NATIVE]
        listed = {name for i in native for name in (*i.refers_to, i.path.rpartition(".")[2])}
        read = cpp_attribute_names()
        # The scan sees what keybuilder.cpp reads.
        self.assertLessEqual({"in_kernel_invocation", "_fake_device", "constant", "dispatch_keys", "node", "expr"}, read)
        self.assertEqual(sorted(read - listed - set(NOT_TORCHS)), [])

    def test_scan_reads_every_module(self) -> None:
        """The scan reads every Python file of the package directory but _compat.py, and sees what each refers to."""
        by_file = private_torch_references()
        everything = {p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py")}
        self.assertEqual(set(by_file), everything - {"_compat.py"})
        # Modules without a FakeTensorMode class: their calls on the mode they are given count.
        mode = f"{FT}.FakeTensorMode"
        self.assertLessEqual({f"{mode}._make_cache_entry", f"{mode}._dispatch_impl"}, by_file["_driver.py"])
        self.assertIn(f"{mode}._cache_key", by_file["_key.py"])
        self.assertIn(f"{mode}._output_from_cache_entry", by_file["_synth.py"])
        self.assertIn(f"{mode}._allow_unsafe_data_ptr_access", by_file["_synth.py"])
        self.assertIn("torch._C._dispatch_find_schema_or_throw", by_file["_keyset.py"])
        self.assertIn(f"{mode}._cached_dispatch_impl", by_file["mode.py"])
        for name in ("_driver.py", "_synth.py", "_verify.py", "_kernels.py", "_routes.py", "_rules.py", "_fakes.py"):
            self.assertNotEqual(by_file[name], set(), msg=name)

    def test_compat_is_a_leaf(self) -> None:
        """_compat imports nothing of the package but the import-free version.py, not even lazily."""
        tree = ast.parse((PACKAGE / "_compat.py").read_text())
        imports = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                imports += [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                imports.append("." * node.level + (node.module or ""))
            elif isinstance(node, ast.Call) and _chain_name(node.func) in ("importlib.import_module", "__import__"):
                # A lazy import of a constant name: importlib.import_module("torch_cachepolicy...").
                if node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                    imports.append(node.args[0].value)
        self.assertIn("torch", imports)  # the walk sees _compat's imports
        package = [m for m in imports if m.startswith(".") or m.partition(".")[0] == "torch_cachepolicy"]
        self.assertEqual(package, ["torch_cachepolicy.version"])
        version = ast.parse((PACKAGE / "version.py").read_text())
        self.assertEqual([n for n in ast.walk(version) if isinstance(n, (ast.Import, ast.ImportFrom))], [])

    def test_kernel_sources_are_not_checked_here(self) -> None:
        """check_torch_internals ignores kernel sources: an unlisted one neither warns nor changes trusted()."""
        # _kernels.check_sources does both, at import.
        others = tuple(s for s in _kernels.SOURCES if "fake_impl" not in s.names)
        self.assertNotEqual(_kernels.unlisted_names(others), {})  # control: there is something to notice
        self.assertTrue(_kernels.trusted())
        with mock.patch.object(_kernels, "SOURCES", others), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _compat.check_torch_internals("2.14.1", ())
        self.assertEqual([str(w.message) for w in caught], [])
        self.assertTrue(_kernels.trusted())

    # -------------------------------------------------------- is_fake_tensor

    def test_is_fake_tensor_is_torchs_when_present(self) -> None:
        """torch 2.14's and 2.15's fake_tensor.is_fake_tensor is used as is; 2.13 gets the isinstance check."""
        expected = getattr(ft, "is_fake_tensor", _fakes._is_python_fake_tensor)
        self.assertIs(_fakes.is_fake_tensor, expected)
        self.assertEqual(hasattr(ft, "is_fake_tensor"), _compat.torch_minor(str(torch.__version__)) >= (2, 14))

    def test_is_fake_tensor(self) -> None:
        """True for fake tensors of any mode, the policy mode's included; False for everything else."""
        stock = ft.FakeTensorMode()
        with stock:
            fake = torch.empty(2)
        with tcp.FakeTensorMode():
            ours = torch.empty(2)
        fakes: list[object] = [fake, ours, stock.from_tensor(torch.empty(3))]
        for value in fakes:
            self.assertTrue(_fakes.is_fake_tensor(value))
        others: list[object] = [torch.empty(2), torch.empty(2, device="meta"), torch.nn.Parameter(torch.empty(1)), 1]
        for value in [*others, None]:
            self.assertFalse(_fakes.is_fake_tensor(value), msg=repr(value))


# Each drift keeps torch itself working (a renamed parameter torch passes positionally, a list made a tuple) and is
# applied in a fresh interpreter before the package is imported; the run compares a policy mode with stock's.
DEGRADE_SCENARIOS = {
    "cache": "ft.FakeTensorMode._make_cache_entry = rename_param(ft.FakeTensorMode._make_cache_entry, 'func', 'op')",
    "backend": "fake_impls.op_implementations_checks = tuple(fake_impls.op_implementations_checks)",
    "rules": "GenericTorchDispatchRuleHolder.find = rename_param(GenericTorchDispatchRuleHolder.find, "
    "'torch_dispatch_class', 'cls')",
    # A real rename of what keybuilder.cpp reads: fake_device kept in another attribute.
    "native": "ft.FakeTensor.fake_device = property(lambda self: self._device, "
    "lambda self, device: setattr(self, '_device', ft.FakeTensor._normalize_fake_device(device)))",
    "export": "export_trace._is_bogus_const_name = rename_param(export_trace._is_bogus_const_name, 'name', 'n')",
}

# What a scenario reads besides the run's outputs, warnings and report.
DEGRADE_READS = {
    "native": """
from torch_cachepolicy import _native
out["native"] = [_native.backend(), _native.fallback_reason(), list(mode.cache_key_stats().fallbacks)]
""",
    "export": """
class Relu(torch.nn.Module):
    def forward(self, x):
        return x.relu()

program = torch.export.export(Relu(), (torch.randn(2, 3),))
out["export"] = {"torch": type(program).__name__}
for api, call in (("export", lambda: tcp.export(Relu(), (torch.randn(2, 3),))), ("adopt", lambda: tcp.adopt(program))):
    try:
        out["export"][api] = type(call()).__name__
    except RuntimeError as e:
        out["export"][api] = str(e)
""",
}

DEGRADE_RUN = """
import functools, inspect, json, warnings
import torch
import torch.ao.quantization.fx._decomposed
import torch._subclasses.fake_tensor as ft
import torch._subclasses.fake_impls as fake_impls
import torch.export._trace as export_trace
from torch._library.simple_registry import GenericTorchDispatchRuleHolder

def rename_param(fn, old, new):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs)
    sig = inspect.signature(fn)
    wrapper.__signature__ = sig.replace(
        parameters=[p.replace(name=new) if p.name == old else p for p in sig.parameters.values()]
    )
    return wrapper

SCENARIO
out = {}
try:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import torch_cachepolicy as tcp
except ImportError as e:
    print("RESULT " + json.dumps({"import_error": str(e)}))
    raise SystemExit(0)
out["warnings"] = [(w.category.__name__, str(w.message)) for w in caught]

def run(mode):
    with mode:
        x = torch.empty(4, 8)
        outs = []
        for _ in range(3):
            outs.append(torch.ops.quantized_decomposed.quantize_per_tensor(x, 0.1, 0, -128, 127, torch.int8))
            outs.append(x.view(-1).add(1))
    return [(str(t.dtype), tuple(t.shape), t.stride(), t.storage_offset(), t._is_view()) for t in outs]

ft.FakeTensorMode.cache_clear()
stock = run(ft.FakeTensorMode(allow_non_fake_inputs=True))
stock_hits = ft.FakeTensorMode.cache_info().hits
ft.FakeTensorMode.cache_clear()
mode = tcp.FakeTensorMode(cache_policy=tcp.CachePolicy(namespaces=["quantized_decomposed"]), allow_non_fake_inputs=True)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    out["same_outputs"] = run(mode) == stock
out["run_warnings"] = [str(w.message) for w in caught]
out["torch_class_hits"] = (stock_hits, ft.FakeTensorMode.cache_info().hits)
out["report"] = {r.op: [r.hits, r.misses, r.bypasses] for r in mode.cache_report().ops}
READS
print("RESULT " + json.dumps(out))
"""


class TestDegrade(TestCase):
    """On a torch whose internals drifted, the package imports, says what it switched off, and equals stock."""

    def test_every_feature_has_a_scenario(self) -> None:
        """Each level of the drift ladder (a Feature) has a scenario here: no level goes untested."""
        self.assertEqual(sorted(DEGRADE_SCENARIOS), sorted(feature.name.lower() for feature in _compat.Feature))

    def degrade(self, scenario: str) -> Any:
        code = DEGRADE_RUN.replace("SCENARIO", DEGRADE_SCENARIOS[scenario])
        return run_python(code.replace("READS", DEGRADE_READS.get(scenario, "")))

    def test_cache_drift_dispatches_as_stock(self) -> None:
        """A changed internal of the cache: one warning naming it; the mode caches as stock (torch's counters)."""
        result = self.degrade("cache")
        ((category, message),) = result["warnings"]
        self.assertEqual(category, "TorchDriftWarning")
        self.assertIn("FakeTensorMode._make_cache_entry takes (self, state, key, op, args, kwargs, output)", message)
        self.assertIn("Switched off: the policy cache", message)
        self.assertTrue(result["same_outputs"])
        # Stock caches view+add (4 aten ops over 3 rounds: 2 hits each after the first); the policy mode the same,
        # in torch's storage and counters; its own report is empty, backend ops uncached as under stock.
        stock_hits, policy_hits = result["torch_class_hits"]
        self.assertGreater(stock_hits, 0)
        self.assertEqual(policy_hits, stock_hits)
        self.assertEqual(result["report"], {})

    def test_backend_drift_bypasses_backend_ops(self) -> None:
        """A changed internal backend entries rest on: backend ops bypass naming it, aten stays cached."""
        result = self.degrade("backend")
        ((category, message),) = result["warnings"]
        self.assertEqual(category, "TorchDriftWarning")
        self.assertIn("torch._subclasses.fake_impls.op_implementations_checks is a tuple", message)
        self.assertIn("Switched off: caching of backend and higher-order operators", message)
        self.assertTrue(result["same_outputs"])
        hits, misses, bypasses = result["report"]["quantized_decomposed::quantize_per_tensor.default"]
        self.assertEqual((hits, misses), (0, 0))
        ((reason, count),) = bypasses.items()
        self.assertEqual(count, 3)
        self.assertRegex(reason, r"^torch \S+ changed torch\._subclasses\.fake_impls\.op_implementations_checks is a tuple$")
        self.assertEqual(result["report"]["aten::add.Tensor"][:2], [2, 1])
        self.assertEqual(result["torch_class_hits"][1], 0)  # the policy mode's own counters, not torch's

    def test_native_drift_runs_the_python_paths(self) -> None:
        """A renamed attribute the C++ helper reads: one warning naming it; the Python paths serve (as with
        USE_CPP=0), with stock's outputs and the same hits, where each dispatch would raise AttributeError."""
        result = self.degrade("native")
        ((category, message),) = result["warnings"]
        self.assertEqual(category, "TorchDriftWarning")
        drift = "torch._subclasses.fake_tensor.FakeTensor.fake_device.fget no longer uses the attributes (_fake_device)"
        self.assertIn(f"({drift}). Switched off: the C++ helper torch_cachepolicy._C (as with USE_CPP=0", message)
        self.assertEqual(result["run_warnings"], [])  # the drift warning was the fallback's too
        self.assertTrue(result["same_outputs"])
        self.assertEqual(result["report"]["quantized_decomposed::quantize_per_tensor.default"], [1, 2, {}])  # 3 rounds: the first sight, the miss, a hit
        self.assertEqual(result["report"]["aten::add.Tensor"], [2, 1, {}])
        backend, reason, keys = result["native"]
        self.assertEqual((backend, keys), ("python", ["no C++ key builder"]))
        self.assertRegex(reason, rf"^torch \S+ changed {re.escape(drift)}$")

    def test_export_drift_leaves_the_mode(self) -> None:
        """A changed internal export and adopt rest on: both raise naming it and the way out; torch.export.export and
        the mode's cache work."""
        result = self.degrade("export")
        ((category, message),) = result["warnings"]
        self.assertEqual(category, "TorchDriftWarning")
        drift = "torch.export._trace._is_bogus_const_name takes (n), expected (name, ...)"
        self.assertIn(f"({drift}). Switched off: torch_cachepolicy.export and adopt (they raise;", message)
        self.assertEqual(result["export"]["torch"], "ExportedProgram")
        for api in ("export", "adopt"):
            self.assertRegex(
                result["export"][api],
                rf"^torch_cachepolicy\.{api}\(\.\.\.\): unavailable on this torch: torch \S+ changed "
                rf"{re.escape(drift)}\. Use torch\.export\.export",
            )
        self.assertTrue(result["same_outputs"])
        self.assertEqual(result["report"]["quantized_decomposed::quantize_per_tensor.default"], [1, 2, {}])  # 3 rounds: the first sight, the miss, a hit

    def test_rules_drift_is_an_import_error(self) -> None:
        """A changed internal the subclass needs to apply stock's rules: ImportError naming it."""
        result = self.degrade("rules")
        self.assertIn(
            "changed a private internal this package builds on: "
            "torch._library.simple_registry.GenericTorchDispatchRuleHolder.find takes (self, cls)",
            result["import_error"],
        )


def run_python(code: str) -> Any:
    """Runs ``code`` in a fresh interpreter with the repository importable; returns what it printed after RESULT."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))}
    env.pop("TORCH_CACHEPOLICY_FORCE_PYTHON", None)  # what switches the C++ helper off is the drift
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if len(lines) != 1:
        raise AssertionError(proc.stdout + proc.stderr)
    return json.loads(lines[0][len("RESULT ") :])


def private_torch_references() -> dict[str, set[str]]:
    """Dotted names of private torch objects the package's source refers to, by file (relative to the package).

    Every ``*.py`` under the package directory is read, ``_compat.py`` (the
    list itself) excepted. Seen: ``from torch._x import y`` (and ``import
    torch._x``), attribute chains on a name bound to a torch module
    (``torch._C.x``, ``_ft.y``), in the FakeTensorMode subclass the stock
    methods it calls on ``self`` or overrides, and anywhere the stock
    FakeTensorMode attributes read on a parameter named ``mode`` (the modules
    the mode hands itself to: ``mode._cache_key``). Attributes of other objects
    torch hands us (``state.known_symbols``) are not visible to a scan;
    _INTERNALS covers them by fields and behaviour.
    """
    by_file: dict[str, set[str]] = {}
    # object's own methods (__getstate__, ...) are Python's, not torch's; the
    # instance attributes stock's __init__ sets are torch's too.
    stock = (set(dir(ft.FakeTensorMode)) | set(ft.FakeTensorMode.__init__.__code__.co_names)) - set(dir(object))
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "_compat.py" and path.parent == PACKAGE:
            continue
        refs = by_file[path.relative_to(PACKAGE).as_posix()] = set()
        tree = ast.parse(path.read_text(), filename=str(path))
        # Imports for type checking and annotations (never evaluated, the
        # package uses `from __future__ import annotations`) do not run:
        # torch may drop those names freely.
        typing_only = {id(n) for root in _typing_only_roots(tree) for n in ast.walk(root)}
        modules: dict[str, str] = {}  # local name -> torch module path
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name == "torch" or alias.name.startswith("torch."):
                        modules[alias.asname or "torch"] = alias.name if alias.asname else "torch"
                        refs.add(alias.name)
            elif isinstance(node, ast.ImportFrom) and (node.module == "torch" or (node.module or "").startswith("torch.")):
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    refs.add(full)
                    modules[alias.asname or alias.name] = full
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and id(node) not in typing_only:
                chain = _chain(node)
                if chain and chain[0] in modules:
                    refs.add(".".join([modules[chain[0]], *chain[1:]]))
                if (
                    isinstance(node.value, ast.Name)
                    and node.value.id == "mode"
                    and _is_private_attr(node.attr)
                    and node.attr in stock
                ):
                    refs.add(f"{FT}.FakeTensorMode.{node.attr}")
            if isinstance(node, ast.ClassDef) and node.name == "FakeTensorMode":
                for item in ast.walk(node):
                    if isinstance(item, ast.FunctionDef) and item.name in stock and item.name != "__init__":
                        refs.add(f"{FT}.FakeTensorMode.{item.name}")
                    if (
                        isinstance(item, ast.Attribute)
                        and isinstance(item.value, ast.Name)
                        and item.value.id in ("self", "super")
                        and _is_private_attr(item.attr)
                        and item.attr in stock
                    ):
                        refs.add(f"{FT}.FakeTensorMode.{item.attr}")
                    if (
                        isinstance(item, ast.Attribute)
                        and isinstance(item.value, ast.Call)
                        and isinstance(item.value.func, ast.Name)
                        and item.value.func.id == "super"
                    ):
                        refs.add(f"{FT}.FakeTensorMode.{item.attr}")
        by_file[path.relative_to(PACKAGE).as_posix()] = {r for r in refs if _is_private(r)}
    return by_file


def _is_private_attr(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _chain_name(node: ast.expr) -> str | None:
    """``a.b.c`` for the expression ``a.b.c``, or None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        chain = _chain(node)
        return None if chain is None else ".".join(chain)
    return None


def _typing_only_roots(tree: ast.AST) -> Iterator[ast.AST]:
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            yield node
        elif isinstance(node, ast.arg) and node.annotation is not None:
            yield node.annotation
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns is not None:
            yield node.returns
        elif isinstance(node, ast.AnnAssign):
            yield node.annotation


def _chain(node: ast.Attribute) -> list[str] | None:
    parts: list[str] = []
    current: ast.expr = node
    while isinstance(current, ast.Attribute):
        parts.append(current.attr)
        current = current.value
    if not isinstance(current, ast.Name):
        return None
    return [current.id, *reversed(parts)]


def _is_private(ref: str) -> bool:
    return any(part.startswith("_") and not part.startswith("__") for part in ref.split(".")[1:])


instantiate_parametrized_tests(TestCompat)

if __name__ == "__main__":
    run_tests()
