"""Dispatcher questions a cache policy asks about an operator.

Two questions: which dispatch keys have a kernel registered directly for an
operator (:func:`kernel_keys`), and which kernels fake dispatch would run for it
right now (:func:`kernel_watch`), so that cache entries can belong to the
kernel that computed them.

The native half is ``csrc/keyset.cpp``, loaded by
:mod:`torch_cachepolicy.native`. When the extension is missing (built with
``USE_CPP=0``, no compiler, an import error) or
``TORCH_CACHEPOLICY_FORCE_PYTHON=1`` is set, the answers come from torch's
Python bindings instead and a warning says why once: :func:`kernel_keys` gives
the same answers, only slower; :func:`kernel_watch` is slower and weaker (see
:class:`_DumpKernelWatch`).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Final, Protocol

import torch
from torch._C import DispatchKey

from torch_cachepolicy import native

__all__ = [
    "FAKE_KERNEL_KEYS",
    "KEYS",
    "MISSING",
    "NO_KERNEL",
    "KernelWatch",
    "backend",
    "kernel_keys",
    "kernel_keys_many",
    "kernel_watch",
    "keys_from_mask",
]

# The keys a policy looks at, in bit order: bit ``i`` of a mask stands for
# ``KEYS[i]``. The C++ side receives this order from Python, so the two can
# never disagree about it.
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

# The keys whose per-operator kernels fake dispatch can run: a Meta kernel, or
# a Composite* kernel that the Meta slot of the dispatch table falls back to
# (CompositeImplicitAutograd also for FakeTensorMode's own decompose()).
# Backend fallbacks are deliberately left out: they belong to a key, not to
# the operator, and torch's Meta fallback only raises NotImplementedError
# (Note [Kernel fingerprints] in csrc/keyset.cpp).
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

def backend() -> str:
    """Returns ``"cpp"`` when the C++ helper answers, ``"python"`` otherwise."""
    return native.backend()


_FALLBACK_CONSEQUENCES = (
    "keyset.kernel_keys answers are the same, only slower; kernel_watch fingerprints cost "
    "microseconds, not a fraction of one, and miss a kernel re-registered from the same source "
    "line after its Library was destroyed (they compare registration debug strings, not kernels)."
)


def _qualified_name(op: object) -> str:
    if isinstance(op, torch._ops.OpOverload):
        return op.name()
    if isinstance(op, str):
        return op
    raise TypeError(
        "torch_cachepolicy.keyset: expected an OpOverload or a 'ns::name.overload' "
        f"string, got {type(op).__name__}"
    )


def _python_mask(name: str) -> int:
    # Raises RuntimeError for unknown operators, like the C++ side.
    torch._C._dispatch_find_schema_or_throw(*_split(name))
    mask = 0
    for bit, key in enumerate(KEYS):
        if torch._C._dispatch_has_kernel_for_dispatch_key(name, key):
            mask |= 1 << bit
    return mask


def _split(name: str) -> tuple[str, str]:
    base, _, overload = name.partition(".")
    return base, overload


def keys_from_mask(mask: int) -> frozenset[DispatchKey]:
    """Turns a bitmask over :data:`KEYS` into a set of dispatch keys."""
    return frozenset(key for bit, key in enumerate(KEYS) if mask >> bit & 1)


def kernel_keys(op: torch._ops.OpOverload | str) -> frozenset[DispatchKey]:
    """The keys of :data:`KEYS` that have a kernel registered directly for ``op``.

    Args:
        op: an ``OpOverload`` or its qualified name, ``"aten::add.Tensor"``
            (``"aten::relu"`` for the default overload).

    Raises:
        TypeError: ``op`` is neither an ``OpOverload`` nor a string.
        ValueError: no such operator or overload is registered.
    """
    return kernel_keys_many([_qualified_name(op)])[0]


def kernel_keys_many(names: Sequence[str]) -> list[frozenset[DispatchKey]]:
    """Batched :func:`kernel_keys` for qualified operator names, in one call."""
    if isinstance(names, str) or not all(isinstance(n, str) for n in names):
        raise TypeError(
            "torch_cachepolicy.keyset.kernel_keys_many: expected a sequence of "
            "'ns::name.overload' strings"
        )
    try:
        ext = native.extension()
        if ext is not None:
            # ``.value`` rather than ``int(k)``: torch's stub types DispatchKey
            # as a plain Enum, so mypy rejects int() though pybind allows it.
            masks = ext.kernel_masks(list(names), [k.value for k in KEYS])
        else:
            native.warn_fallback_once(_FALLBACK_CONSEQUENCES)
            masks = [_python_mask(n) for n in names]
    except RuntimeError as e:
        raise ValueError(f"torch_cachepolicy.keyset: {e}") from None
    return [keys_from_mask(m) for m in masks]


class KernelWatch(Protocol):
    """Tells whether the kernels fake dispatch runs for one operator changed.

    Made by :func:`kernel_watch`; both backends implement this protocol.
    """

    @property
    def name(self) -> str:
        """The watched operator, ``"ns::name.overload"``."""
        ...

    def fingerprint(self) -> int:
        """An int naming the operator's kernels under :data:`FAKE_KERNEL_KEYS` right now.

        Equal across calls while those registrations are unchanged, different
        once any of them is overridden, added or removed. :data:`MISSING` if
        the operator has no schema, :data:`NO_KERNEL` if it has no such kernel.
        """
        ...


def kernel_watch(op: torch._ops.OpOverload | str) -> KernelWatch:
    """Watches the kernels that fake dispatch would run for ``op``.

    A cache of fake dispatch results keys its entries on
    ``watch.fingerprint()`` so that entries computed by a kernel are never
    served once that kernel is replaced: by ``Library.impl(..., "Meta")`` or a
    Composite* key overriding it, by another ``Library`` registering for the
    op, by the overriding ``Library`` being destroyed, by a C++ library
    (re)loading. Registrations under other keys (CPU, Autograd, ...) do not
    change it.

    With the C++ helper a fingerprint names the registered kernel objects
    themselves, so a kernel destroyed and registered again, from the same line
    and even at the same address, is a new kernel. Values are process-wide:
    two watches of the same operator agree, and a value is never reused for
    other kernels; going back to kernels that stayed alive (an overriding
    ``Library`` destroyed) gives the earlier value again. A call costs a
    dispatcher lookup and a few hash probes, 0.1-0.4 us from Python; the
    operator is looked up on every call, so a watch never dangles. The pure-Python
    fallback is weaker and slower: see :class:`_DumpKernelWatch`.

    Fingerprints are only comparable between watches of the same operator.

    Args:
        op: an ``OpOverload`` or its qualified name, ``"aten::add.Tensor"``.
            The operator need not exist yet: until it has a schema the
            fingerprint is :data:`MISSING`.

    Raises:
        TypeError: ``op`` is neither an ``OpOverload`` nor a string.
    """
    name = _qualified_name(op)
    ext = native.extension()
    if ext is not None:
        watch: KernelWatch = ext.KernelWatch(name, [k.value for k in FAKE_KERNEL_KEYS])
        return watch
    native.warn_fallback_once(_FALLBACK_CONSEQUENCES)
    return _DumpKernelWatch(name)


# Note [Fallback kernel fingerprints]
# Without the C++ helper nothing in Python names a registered kernel:
# torch._C._dispatch_get_computed_kernel_for_dispatch_key registers a new token
# with the kernel on every call (a leak if asked per cache hit) and looks at the
# computed table, not the registrations. What is left is the dispatcher's state
# dump, one line per registration, newest first, each naming the source line of
# the Library that registered it. Filtered to FAKE_KERNEL_KEYS, those lines
# change on an override (a line is added), a new Library from another line, or
# a destroyed Library (a line goes away), but not when a Library is destroyed
# and another one registers again from the same source line.
_FAKE_KEY_NAMES: Final = frozenset(k.name for k in FAKE_KERNEL_KEYS)
# Filtered dump lines -> fingerprint, process-wide like the C++ table, so that
# two watches of an operator agree. next() on a count is atomic under the GIL;
# a value lost to a race is only a gap.
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
    """The pure-Python :class:`KernelWatch`, built on ``torch._C._dispatch_dump``.

    Weaker than the C++ one (Note [Fallback kernel fingerprints]): the
    fingerprint follows the registration lines of the dispatcher's state dump,
    which name the source line that created the registering ``Library``, not
    the kernel. Overrides, new and destroyed libraries are seen; a ``Library``
    destroyed and created again at the same source line, registering again
    (a loop, a re-run notebook cell, a reloaded C++ library), is not: no ABA
    detection. Slower too: the dump costs 2-70 us per call, growing with the
    number of kernels the operator has under any key (aten ops are the slow
    end).
    """

    __slots__ = ("_dump", "_fingerprint", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self._dump: str | None = None
        self._fingerprint = MISSING

    def fingerprint(self) -> int:
        try:
            dump = torch._C._dispatch_dump(self.name)
        except RuntimeError:
            # A name the dispatcher's parser rejects ("", "aten::add.a.b")
            # cannot be registered either.
            return MISSING
        if dump != self._dump:
            lines = _fake_kernel_lines(dump)
            if lines is None:
                fingerprint = MISSING
            else:
                fingerprint = _dump_states.setdefault(lines, next(_dump_serials))
            self._dump, self._fingerprint = dump, fingerprint
        return self._fingerprint

    def __repr__(self) -> str:
        return f"<torch_cachepolicy.keyset._DumpKernelWatch '{self.name}'>"
