"""Dispatcher questions a cache policy asks about an operator.

:func:`kernel_keys`: which keys have a kernel registered directly for it (asked once per op); :func:`kernel_watch`:
which kernels fake dispatch would run for it now (per backend dispatch), so entries belong to the kernel that
computed them (``csrc/keyset.cpp``, or the weaker :class:`_DumpKernelWatch` with a one-time warning).
"""

from __future__ import annotations

import itertools
from typing import Final, Protocol

import torch
from torch._C import DispatchKey

from torch_cachepolicy import _native

KEYS: tuple[DispatchKey, ...] = (
    DispatchKey.CompositeImplicitAutograd,
    DispatchKey.CompositeExplicitAutograd,
    DispatchKey.CompositeExplicitAutogradNonFunctional,
    DispatchKey.Meta,
    DispatchKey.CPU,
    DispatchKey.CUDA,
    DispatchKey.Autograd,
    DispatchKey.AutogradCPU,
    DispatchKey.ADInplaceOrView,
    DispatchKey.Functionalize,
    DispatchKey.BackendSelect,
    DispatchKey.Python,
    DispatchKey.PrivateUse1,
)

# Keys of per-op kernels fake dispatch runs: Meta, a Composite* kernel the Meta slot falls back to, and decompose()'s
# CompositeImplicitAutograd. Backend fallbacks belong to a key, not an op (Note [Kernel fingerprints], keyset.cpp).
FAKE_KERNEL_KEYS: tuple[DispatchKey, ...] = (
    DispatchKey.Meta,
    DispatchKey.CompositeExplicitAutograd,
    DispatchKey.CompositeExplicitAutogradNonFunctional,
    DispatchKey.CompositeImplicitAutograd,
)

MISSING: Final = -1
"""Fingerprint of an operator with no schema: unknown, ``impl()``-only, or deregistered."""

NO_KERNEL: Final = 0
"""Fingerprint of an operator with a schema but no kernel under :data:`FAKE_KERNEL_KEYS`."""

_FALLBACK_CONSEQUENCES = (
    "Kernel fingerprints cost microseconds, not a fraction of one, and miss a kernel re-registered from "
    "the same source line after its Library was destroyed (they compare registration debug strings, "
    "not kernels)."
)


def _qualified_name(op: object, api: str) -> str:
    if isinstance(op, torch._ops.OpOverload):
        return op.name()
    if isinstance(op, str):
        return op
    raise TypeError(f"{api}: expected an OpOverload or a 'ns::name.overload' string, got {type(op).__name__}")


def kernel_keys(op: torch._ops.OpOverload | str) -> frozenset[DispatchKey]:
    """The :data:`KEYS` with a kernel registered directly for ``op`` (an OpOverload or name); ValueError if unknown."""
    name = _qualified_name(op, "torch_cachepolicy.CachePolicy.decide(...)")
    base, _, overload = name.partition(".")
    try:
        torch._C._dispatch_find_schema_or_throw(base, overload)
    except RuntimeError as e:
        raise ValueError(
            f"torch_cachepolicy.CachePolicy.decide(...): {e}; decide on an operator that is registered (destroying "
            "its Library unregisters it)"
        ) from None
    return frozenset(key for key in KEYS if torch._C._dispatch_has_kernel_for_dispatch_key(name, key))


class KernelWatch(Protocol):
    """Tells whether the kernels fake dispatch runs for one operator changed (made by :func:`kernel_watch`)."""

    @property
    def name(self) -> str:
        """The watched operator, ``"ns::name.overload"``."""
        ...

    def fingerprint(self) -> int:
        """An int naming the op's kernels under :data:`FAKE_KERNEL_KEYS` now (or :data:`MISSING`, :data:`NO_KERNEL`)."""
        ...


def kernel_watch(op: torch._ops.OpOverload | str) -> KernelWatch:
    """Watches the kernels fake dispatch would run for ``op`` (which need not exist yet).

    The fingerprint changes when one is replaced (``Library.impl`` under Meta or Composite*, another ``Library``
    registering, the overriding one destroyed, a C++ library reloaded), not for other keys. The C++ watch names
    kernel objects (Note [Kernel fingerprints] in ``csrc/keyset.cpp``: re-registered is new, even at the same
    address), with process-wide values, at 0.1-0.4 us a call. TypeError unless ``op`` is an ``OpOverload`` or a str.
    """
    name = _qualified_name(op, "torch_cachepolicy.FakeTensorMode.dispatch(...)")
    ext = _native.extension()
    if ext is not None:
        watch: KernelWatch = ext.KernelWatch(name, [k.value for k in FAKE_KERNEL_KEYS])
        return watch
    _native.warn_fallback_once(_FALLBACK_CONSEQUENCES)
    return _DumpKernelWatch(name)


_FAKE_KEY_NAMES: Final = frozenset(k.name for k in FAKE_KERNEL_KEYS)
# Dump lines -> fingerprint, process-wide like C++'s so watches agree; next() on a count is atomic under the GIL.
_dump_states: dict[tuple[str, ...], int] = {(): NO_KERNEL}
_dump_serials = itertools.count(NO_KERNEL + 1)


def _fake_kernel_lines(dump: str) -> tuple[str, ...] | None:
    """The registration lines of ``dump`` for FAKE_KERNEL_KEYS, None without a schema."""
    # An unknown operator dumps as ""; an impl()-only one as "schema: (none)".
    if not dump or "\nschema: (none)\n" in dump:
        return None
    lines = []
    for line in dump.splitlines():
        # "Meta: ...", "Meta (inactive): ...", "CompositeImplicitAutograd[alias]: ..."
        head, sep, _ = line.partition(": ")
        if sep and head.removesuffix(" (inactive)").removesuffix("[alias]") in _FAKE_KEY_NAMES:
            lines.append(line)
    return tuple(lines)


class _DumpKernelWatch:
    """The pure-Python :class:`KernelWatch`, built on ``torch._C._dispatch_dump``: slower and weaker."""

    # Note [Fallback kernel fingerprints]
    # ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    # Nothing in Python names a registered kernel: _dispatch_get_computed_kernel_for_dispatch_key registers a new
    # token per call (a leak per hit) and reads the computed table. The dispatcher's dump names each registration's
    # Library source line; filtered to FAKE_KERNEL_KEYS it changes on an override, a new or destroyed Library, but
    # not when one from the same line registers again (a loop, a re-run cell): no ABA detection. 2-70 us a call.

    __slots__ = ("_dump", "_fingerprint", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self._dump: str | None = None
        self._fingerprint = MISSING

    def fingerprint(self) -> int:
        try:
            dump = torch._C._dispatch_dump(self.name)
        except RuntimeError:
            # A name the parser rejects ("", "aten::add.a.b") cannot be registered either.
            return MISSING
        if dump != self._dump:
            lines = _fake_kernel_lines(dump)
            fingerprint = MISSING if lines is None else _dump_states.setdefault(lines, next(_dump_serials))
            self._dump, self._fingerprint = dump, fingerprint
        return self._fingerprint

    def __repr__(self) -> str:
        return f"<torch_cachepolicy._keyset._DumpKernelWatch '{self.name}'>"
