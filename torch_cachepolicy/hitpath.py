"""The common case of a cache hit in one native call.

Once the mode knows an op's route and the table its entries live in, a hit of
a static key is torch's key, the common case of the key extension, the
lookup, the output and the hit counters: ``_C.HitPath.hit`` does them in one
call (Note [The hit in one native call] in ``csrc/hitpath.cpp``) and declines,
having changed nothing, every call it does not take, which the Python path
(``keybuilder``, ``keyparts``, ``synth``) then handles from its start. The
Python path is the reference and the fallback: without the C++ extension,
while a canary of the key builder or of ``synth`` still compares with torch,
or with ``FakeTensorConfig.debug`` on, every hit takes it.

:func:`checking_parity` has every native hit in its scope compared with the
Python path's output for the same call (the tests run the benchmark
workloads and the kernel zoo under it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorConfig, _DispatchCacheKey, _DispatchCacheValidEntry
from torch.fx.experimental.proxy_tensor import get_proxy_mode

from torch_cachepolicy import keybuilder, native, synth

__all__ = ["DECLINED", "Parity", "checking_parity", "compare", "fake_state", "key_slots", "make_hit_path", "native_hits", "parity", "proxy_mode_readable", "ready"]

DECLINED: Any = object()
"""What ``_C.HitPath.hit`` returns for a call the Python path must handle."""


def key_slots() -> bool:
    """Whether ``_DispatchCacheKey(t)`` sets exactly its two slots, ``key`` to ``t`` and ``hashvalue`` to ``hash(t)``.

    Then ``_C.HitPath`` fills the slots itself; otherwise (a torch whose key
    class does more) it calls the class.
    """
    init = _DispatchCacheKey.__init__
    code = getattr(init, "__code__", None)
    return (
        getattr(_DispatchCacheKey, "__slots__", None) == ("key", "hashvalue")
        and code is not None
        and code.co_argcount == 2
        and code.co_names == ("key", "hash", "hashvalue")
    )


def proxy_mode_readable() -> bool:
    """Whether ``_C.HitPath`` may read what ``get_proxy_mode()`` reads instead of calling it.

    It reads the dispatch mode TLS's PROXY slot and slot 0 of
    ``torch._ops``' pre-dispatch mode stack, as ``get_proxy_mode`` does on
    torch 2.13 and 2.14; a torch whose code for it differs has it called.
    """
    ops: Any = torch._ops
    known: dict[object, set[tuple[str, ...]]] = {
        get_proxy_mode: {
            ("torch", "_ops", "_get_dispatch_mode_pre_dispatch", "_C", "_TorchDispatchModeKey", "PROXY",
             "_get_dispatch_mode", "AssertionError"),
            ("torch", "_ops", "_get_dispatch_mode_pre_dispatch", "_C", "_TorchDispatchModeKey", "PROXY",
             "_get_dispatch_mode", "AssertionError", "typing", "cast"),
        },
        getattr(ops, "_get_dispatch_mode_pre_dispatch", None): {
            ("torch", "_C", "_TorchDispatchModeKey", "PROXY", "mode_stack_state_for_pre_dispatch", "get",
             "FUNCTIONAL", "AssertionError"),
        },
        getattr(ops, "mode_stack_state_for_pre_dispatch", None): {("_mode_stack_state_for_pre_dispatch",)},
        getattr(getattr(ops, "_ModeStackStateForPreDispatch", None), "get", None): {
            ("len", "_ModeStackStateForPreDispatch__infra_modes", "AssertionError"),
        },
    }  # fmt: skip
    for fn, names in known.items():
        code = getattr(fn, "__code__", None)
        if code is None or code.co_names not in names:
            return False
    state = getattr(ops, "_mode_stack_state_for_pre_dispatch", None)
    modes = getattr(state, "_ModeStackStateForPreDispatch__infra_modes", None)
    return type(modes) is list and len(modes) == 2


def make_hit_path(**overrides: Any) -> Any:
    """A new ``_C.HitPath`` with the callables the Python path uses, ``overrides`` replacing any; None without ``_C``."""
    hit_path = native.function("HitPath")
    builder = keybuilder.native_builder()
    if hit_path is None or builder is None or not synth.available():
        return None
    arguments = dict(
        key_builder=builder,
        key_type=_DispatchCacheKey,
        key_slots=key_slots(),
        entry_type=_DispatchCacheValidEntry,
        fake_type=FakeTensor,
        make_subclass=torch.Tensor._make_subclass,
        throw_on_data_ptr=torch._C._set_throw_on_mutable_data_ptr,
        warn_on_data_ptr=torch._C._set_warn_deprecated_on_mutable_data_ptr,
        fake_init=FakeTensor.__init__,
        fake_config=FakeTensorConfig,
        # keybuilder.key_prefix's getters.
        default_dtype=torch.get_default_dtype,
        default_device=torch._C._get_default_device,
        inference_mode=torch.is_inference_mode_enabled,
        proxy_mode=get_proxy_mode,
        pre_dispatch_owner=torch._ops if proxy_mode_readable() else None,
        declined=DECLINED,
    )
    arguments.update(overrides)
    return hit_path(**arguments)


native_hits: Any = make_hit_path()
"""The process's ``_C.HitPath``, or None (no C++ extension: every hit takes the Python path)."""


def ready() -> bool:
    """Whether hits may take ``_C.HitPath`` now (its Python-side preconditions)."""
    return keybuilder.settled() and synth.settled()


@dataclasses.dataclass
class Parity:
    """What :func:`checking_parity` saw.

    Attributes:
        checked: native hits compared with the Python path.
        declined: calls ``_C.HitPath`` declined (the Python path handled them).
        differences: one line per native hit that differed.
    """

    checked: int = 0
    declined: int = 0
    differences: list[str] = dataclasses.field(default_factory=list)


_parity: Parity | None = None


def parity() -> Parity | None:
    """The :class:`Parity` of the enclosing :func:`checking_parity`, or None."""
    return _parity


@contextlib.contextmanager
def checking_parity() -> Iterator[Parity]:
    """Compares every native hit in the scope with the Python path's output for the same call.

    For the tests: each native hit also runs the Python path's key, lookup
    and synthesis and records any difference in what the two outputs are
    (metadata, aliasing with the arguments, symbols, the FakeTensor's type,
    attributes and dispatch keys) and in the counters the hit incremented.
    Not thread-safe (one scope at a time).
    """
    global _parity
    if _parity is not None:
        raise RuntimeError("torch_cachepolicy.hitpath.checking_parity(): already checking; do not nest the scopes")
    _parity = Parity()
    try:
        yield _parity
    finally:
        _parity = None


def fake_state(t: object) -> object:
    """What :func:`compare` compares of an output beyond ``describe``: type, attributes, dispatch keys, guards."""
    if not isinstance(t, FakeTensor):
        return None
    attrs = sorted((k, v if v is None or isinstance(v, (bool, int, str, torch.device)) else id(v)) for k, v in vars(t).items())
    # The guard FakeTensors.make installs: raise, or warn (torch warns once
    # per process, so only whether it raises is compared).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            t.untyped_storage().data_ptr()
            data_ptr = "allowed"
        except Exception as e:
            data_ptr = type(e).__name__
    return (type(t), attrs, str(torch._C._dispatch_keys(t)), t.requires_grad, t.is_leaf, data_ptr)


def compare(
    parity: Parity,
    func: object,
    native_output: object,
    python_output: Callable[[], object],
    args: Sequence[object],
    kwargs: Mapping[str, object],
    counted: bool,
) -> None:
    """Records in ``parity`` how ``native_output`` differs from the Python path's output for this call."""
    from torch_cachepolicy.safety import describe, first_difference

    parity.checked += 1
    if not counted:
        parity.differences.append(f"{func}: the native hit did not count exactly one hit and one built key")
        return
    try:
        reference = python_output()
    except Exception as e:
        parity.differences.append(f"{func}: the Python path raised {e!r}")
        return
    diff = first_difference(describe(native_output, args, kwargs), describe(reference, args, kwargs))
    if diff is not None:
        parity.differences.append(f"{func}: {diff}")
        return
    natives = native_output if isinstance(native_output, tuple) else (native_output,)
    references = reference if isinstance(reference, tuple) else (reference,)
    for i, (a, b) in enumerate(zip(natives, references, strict=True)):
        if type(a) is not type(b) or fake_state(a) != fake_state(b):
            parity.differences.append(f"{func}: output {i}: {fake_state(a)} != {fake_state(b)}")
            return
