"""What users pass to the package's APIs: parsing, normal forms, and the errors for the rest.

Modeled on ``torch/_library/utils.py``'s ``parse_namespace`` and ``lookup_op``: each function takes what a user
may pass (an ``OpOverload``, a packet, ``"ns::name.overload"``, a ``custom_op``, a ``Library``, a list of them) and
returns the normal form, or raises ``torch_cachepolicy.<api>(...): what is wrong; the fix``, ``api`` being the
full name (``"torch_cachepolicy.CachePolicy(allow=...)"``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import torch
from torch._library.custom_ops import CustomOpDef
from torch._ops import OpOverload, OpOverloadPacket

_NAMESPACE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _check_op_string(api: str, name: str) -> None:
    """Checks that ``name`` is ``"ns::name"`` or ``"ns::name.overload"`` of an existing op (then it is a rule)."""
    ns, sep, rest = name.partition("::")
    if not sep or not _NAMESPACE_RE.match(ns) or not rest:
        raise ValueError(
            f"{api}: {name!r} is not an operator name; pass 'ns::name' or "
            "'ns::name.overload', e.g. 'quantized_decomposed::quantize_per_tensor.default'"
        )
    opname, dot, overload = rest.partition(".")
    if dot and not overload:
        raise ValueError(f"{api}: {name!r} ends with '.'; pass '{ns}::{opname}' (every overload) or '{ns}::{opname}.<overload>'")
    try:
        packet = getattr(getattr(torch.ops, ns), opname)
    except (AttributeError, RuntimeError):
        packet = None
    if not isinstance(packet, OpOverloadPacket):
        raise ValueError(
            f"{api}: no operator {ns}::{opname} is registered; define it (or import the "
            "module that defines it) before naming it in a policy"
        )
    if overload and overload not in packet.overloads():
        raise ValueError(f"{api}: {ns}::{opname} has no overload {overload!r}; it has {sorted(packet.overloads())}")


def op_rule(api: str, op: object, namespace_fix: str, many_fix: str | None = None) -> str:
    """Normalizes an op-like to a rule string: ``"ns::name"`` (every overload) or ``"ns::name.overload"``.

    ``namespace_fix`` (a format string of ``ns``) advises on a namespace given where an operator belongs;
    ``many_fix`` on a list given to an API that takes one operator.
    """
    if isinstance(op, OpOverload):
        return overload_name(op)
    if isinstance(op, OpOverloadPacket):
        return op._qualified_op_name
    if isinstance(op, str):
        _check_op_string(api, op)
        return str(op)  # a str subclass's own __eq__ or __hash__ must not reach the rule sets
    if isinstance(op, CustomOpDef):
        return overload_name(op._opoverload)
    ns = _namespace_of(op)
    if isinstance(op, torch._ops.HigherOrderOperator):
        hint = f"; {_HOP_HINT}"
    elif ns is not None:
        hint = "; " + namespace_fix.format(ns=repr(ns))
    elif many_fix is not None and isinstance(op, Iterable) and not isinstance(op, bytes):
        hint = f"; {many_fix}"
    else:
        hint = ""
    raise TypeError(
        f"{api}: expected an OpOverload, OpOverloadPacket, 'ns::name.overload' string "
        f"or torch.library.custom_op, got {describe_value(op)}{hint}"
    )


def overload_name(op: OpOverload) -> str:
    """``"ns::name.overload"``; ``"ns::name.default"`` for the default overload."""
    return f"{op._schema.name}.{op._overloadname}"


def parse_namespace(api: str, ns: object, param: str) -> str:
    """Validates one namespace (a string or a ``Library``) and returns its name.

    ``param`` (``"namespaces"``, ``"context_namespaces"``, ``"register_namespace"``) decides the advice for an
    operator or a list given instead.
    """
    if isinstance(ns, torch.library.Library):
        ns = ns.ns
    if not isinstance(ns, str):
        if isinstance(ns, torch._ops._OpNamespace):
            hint = f"; pass its name: {ns.name!r}"
        elif isinstance(ns, _ANY_OPS):
            hint = f"; {_namespace_op_fix(param, ns)}"
        elif param == "register_namespace" and isinstance(ns, Iterable) and not isinstance(ns, bytes):
            hint = "; call register_namespace once per namespace"
        else:
            hint = ""
        raise TypeError(
            f"{api}: expected a namespace string or a torch.library.Library, got {describe_value(ns)}{hint}"
        )
    if not _NAMESPACE_RE.match(ns):
        fix = ns.split("::")[0].strip() if "::" in ns else ""
        hint = f"; pass {fix!r}" if fix and _NAMESPACE_RE.match(fix) else ""
        raise ValueError(f"{api}: {ns!r} is not a namespace{hint}")
    return ns


def require_overload(api: str, op: object) -> OpOverload:
    """``op`` if it is an OpOverload; otherwise a TypeError that says which overload to pass."""
    if isinstance(op, OpOverload):
        return op
    if isinstance(op, OpOverloadPacket):
        overloads = op.overloads()
        hint = f"; pick one of its overloads, e.g. {_source_name(op)}.{overloads[0]}" if overloads else ""
    elif isinstance(op, CustomOpDef):
        hint = f"; pass its overload, {_source_name(op)}"
    elif isinstance(op, torch._ops.HigherOrderOperator):
        hint = f"; {_HOP_HINT}"
    else:
        hint = ""
    raise TypeError(f"{api}: expected an OpOverload (torch.ops.ns.name.overload), got {describe_value(op)}{hint}")


_HOP_HINT = "a policy mode never caches higher-order operators, only the ops of their subgraphs"


# Operator objects a policy takes one at a time; with HOPs, any operator one may pass where something else belongs.
_SINGLE_OPS = (OpOverload, OpOverloadPacket, CustomOpDef)
_ANY_OPS = (OpOverload, OpOverloadPacket, CustomOpDef, torch._ops.HigherOrderOperator)


def _namespace_of(value: object) -> str | None:
    """The name of a namespace object (a ``Library`` or ``torch.ops.<ns>``), else None."""
    if isinstance(value, torch.library.Library):
        return value.ns
    if isinstance(value, torch._ops._OpNamespace):
        return value.name
    return None


def _source_name(op: OpOverload | OpOverloadPacket | CustomOpDef) -> str:
    """How to spell ``op`` in Python: ``torch.ops.aten.relu.default``."""
    if isinstance(op, CustomOpDef):
        op = op._opoverload
    if isinstance(op, OpOverload):
        ns, _, name = op._schema.name.partition("::")
        return f"torch.ops.{ns}.{name}.{op._overloadname}"
    ns, _, name = op._qualified_op_name.partition("::")
    return f"torch.ops.{ns}.{name}"


def describe_value(value: object) -> str:
    """Names a wrong argument in an error message: ``None``, ``the string
    'tosa'``, ``the OpOverload aten::relu.default``, else its type (``int``)."""
    if value is None or isinstance(value, bool):
        return repr(value)
    if isinstance(value, str):
        return f"the string {value!r}"
    if isinstance(value, OpOverload):
        return f"the OpOverload {overload_name(value)}"
    if isinstance(value, OpOverloadPacket):
        return f"the OpOverloadPacket {value._qualified_op_name}"
    if isinstance(value, CustomOpDef):
        return f"the custom_op {value._qualname}"
    if isinstance(value, torch._ops.HigherOrderOperator):
        return f"the higher-order operator {value.name()}"
    if isinstance(value, torch._ops._OpNamespace):
        return f"the operator namespace torch.ops.{value.name}"
    if isinstance(value, torch.library.Library):
        return f"the torch.library.Library of {value.ns!r}"
    return type_name(value)


def _namespace_op_fix(
    param: str, op: OpOverload | OpOverloadPacket | CustomOpDef | torch._ops.HigherOrderOperator
) -> str:
    """The advice for an operator given where a namespace belongs."""
    if isinstance(op, torch._ops.HigherOrderOperator):
        return _HOP_HINT
    if param == "namespaces":
        return f"to cache single operators pass allow=[{_source_name(op)}]"
    if param == "register_namespace":
        return f"to cache one operator use register_op({_source_name(op)})"
    if isinstance(op, CustomOpDef):
        op = op._opoverload
    ns = op.namespace if isinstance(op, OpOverload) else op._qualified_op_name.partition("::")[0]
    return f"pass its namespace: {param}=[{ns!r}]"


def type_name(obj: object) -> str:
    """``int``, but ``numpy.bool`` for types outside the builtins."""
    cls = type(obj)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


# --------------------------------------------------------------- lists


ALLOW_NAMESPACE_FIX = "to cache every operator of {ns} pass namespaces=[{ns}]"
DENY_NAMESPACE_FIX = (
    "deny takes single operators; to stop caching a namespace leave it out of namespaces=[...] "
    "(include_builtins=False for aten, prim and prims)"
)


def _as_list(api: str, value: object, what: str, fix: str | None) -> list[Any]:
    """Reads an iterable argument once (a generator is consumed here).

    ``fix`` is set for a single item (or None) given where a list belongs: iterating it would yield characters or
    names, rejected (or, for namespaces, accepted) for the wrong reason, so the caller names the fix instead.
    """
    if fix is not None:
        raise TypeError(f"{api}: expected {what}, got {describe_value(value)}; {fix}")
    if isinstance(value, (bytes, bytearray)) or not isinstance(value, Iterable):
        raise TypeError(f"{api}: expected {what}, got {describe_value(value)}")
    return list(value)


def _list_fix(param: str, value: object) -> str | None:
    """The fix for ``None`` or a bare string where a list belongs."""
    if value is None:
        return f"pass {param}=[] or leave it out"
    if isinstance(value, str):
        return f"wrap it: {param}=[{value!r}]"
    return None


def namespace_list(param: str, value: object) -> list[Any]:
    """``CachePolicy(namespaces=...)`` / ``context_namespaces=``: a list of names or Libraries."""
    fix = _list_fix(param, value)
    if fix is None and (ns := _namespace_of(value)) is not None:
        fix = f"wrap it: {param}=[{ns!r}]"
    elif fix is None and isinstance(value, _ANY_OPS):
        fix = _namespace_op_fix(param, value)
    return _as_list(f"torch_cachepolicy.CachePolicy({param}=...)", value, "a list of namespaces", fix)


def op_list(param: str, value: object, namespace_fix: str) -> list[Any]:
    """``CachePolicy(allow=...)`` / ``deny=``: a list of op-likes."""
    fix = _list_fix(param, value)
    if fix is None and isinstance(value, _SINGLE_OPS):
        fix = f"wrap it: {param}=[{_source_name(value)}]"
    elif fix is None and isinstance(value, torch._ops.HigherOrderOperator):
        fix = _HOP_HINT
    elif fix is None and (ns := _namespace_of(value)) is not None:
        fix = namespace_fix.format(ns=repr(ns))
    return _as_list(f"torch_cachepolicy.CachePolicy({param}=...)", value, "a list of operators", fix)


def type_list(param: str, value: object) -> list[type]:
    """``CachePolicy(immutable_types=...)``: a list of classes."""
    api = f"torch_cachepolicy.CachePolicy({param}=...)"
    fix = f"wrap it: {param}=[{value.__qualname__}]" if isinstance(value, type) else None
    items = _as_list(api, value, "a list of classes", fix)
    for i, item in enumerate(items):
        if not isinstance(item, type):
            raise TypeError(f"{api}: element [{i}]: expected a class, got {describe_value(item)}")
    return items


def callable_hook(param: str, value: object, signature: str) -> Any:
    """``CachePolicy(predicate=...)`` / ``context_key=``: a callable or None."""
    if value is None:
        return None
    # Operators are callable, but a call with an op (or nothing) fails only at the first dispatch, far from the mistake.
    if isinstance(value, _ANY_OPS) or not callable(value):
        hint = ""
        if param == "predicate" and isinstance(value, _SINGLE_OPS):
            hint = f"; to cache single operators pass allow=[{_source_name(value)}]"
        raise TypeError(
            f"torch_cachepolicy.CachePolicy({param}=...): expected a function {signature} or None, "
            f"got {describe_value(value)}{hint}"
        )
    return value


# ------------------------------------------------------ unhashable values


def unhashable_part(value: object) -> str | None:
    """Describes the first part of ``value`` that cannot be hashed, or None if ``value`` hashes.

    For errors about a ``context_key()`` result. Looks into (nested) tuples to name the culprit:
    ``"element [1][0] of the tuple is a dict"``; a non-tuple gives ``"the value is a list"``. (A frozenset
    always hashes: its hash combines element hashes taken when it was built.)
    """
    if _hash_error(value) is None:
        return None
    path: list[str] = []
    culprit = value
    while isinstance(culprit, tuple):
        # A tuple's hash fails only if an element's does (unless a subclass's own __hash__ fails: the culprit).
        index = next((i for i, item in enumerate(culprit) if _hash_error(item) is not None), None)
        if index is None:
            break
        path.append(f"[{index}]")
        culprit = culprit[index]
    what = _unhashable_what(culprit)
    if not path:
        return f"the value is {what}"
    return f"element {''.join(path)} of the {type_name(value)} is {what}"


def _hash_error(value: object) -> Exception | None:
    try:
        hash(value)
    except Exception as e:  # a user's __hash__ may raise anything
        return e
    return None


def _unhashable_what(value: object) -> str:
    """``a list``; for a type whose ``__hash__`` raised, ``a Spec (hash() raised TypeError: ...)``."""
    name = type(value).__name__
    article = "an" if name[:1].lower() in "aeiou" else "a"
    error = _hash_error(value)
    if type(value).__hash__ is None or error is None:
        return f"{article} {name}"
    return f"{article} {name} (hash() raised {type(error).__name__}: {error})"


def unhashable_context(func: object, context: object, error: Exception) -> TypeError:
    """The error for a ``context_key()`` value that cannot key a table (``error``: what hashing or comparing raised)."""
    where = unhashable_part(context)
    if where is None:  # it hashes: comparing it with another context raised
        return TypeError(
            f"torch_cachepolicy.CachePolicy.context_key(): comparing its {type(context).__name__} value raised "
            f"{error!r} while dispatching {func}; return values whose == answers True or False"
        )
    return TypeError(
        f"torch_cachepolicy.CachePolicy.context_key(): returned an unhashable {type(context).__name__} "
        f"while dispatching {func}: {where}; return a hashable value such as a tuple or a string"
    )
