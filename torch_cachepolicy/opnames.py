"""Operator and namespace names: parsing, normalising and describing them.

What a policy's rules are made of. Modeled on ``torch/_library/utils.py``'s
``parse_namespace`` and ``lookup_op``: each function takes what a user may
pass (an ``OpOverload``, a packet, ``"ns::name.overload"``, a ``custom_op``, a
``Library``) and returns the normal form, or raises an error that names the
API (``api``) and the fix.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import torch
from torch._library.custom_ops import CustomOpDef
from torch._ops import OpOverload, OpOverloadPacket

__all__ = [
    "ANY_OPS",
    "HOP_HINT",
    "NAMESPACE_RE",
    "SINGLE_OPS",
    "describe_value",
    "namespace_of",
    "namespace_op_fix",
    "op_rule",
    "overload_name",
    "parse_namespace",
    "require_overload",
    "source_name",
    "type_name",
]


NAMESPACE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _resolve_op_string(api: str, name: str) -> tuple[str, str | None]:
    """Parses ``"ns::name"`` or ``"ns::name.overload"``; the op must exist."""
    ns, sep, rest = name.partition("::")
    if not sep or not NAMESPACE_RE.match(ns) or not rest:
        raise ValueError(
            f"{api}: {name!r} is not an operator name; pass 'ns::name' or "
            "'ns::name.overload', e.g. 'quantized_decomposed::quantize_per_tensor.default'"
        )
    opname, _, overload = rest.partition(".")
    try:
        packet = getattr(getattr(torch.ops, ns), opname)
    except (AttributeError, RuntimeError):
        packet = None
    if not isinstance(packet, OpOverloadPacket):
        raise ValueError(
            f"{api}: no operator {ns}::{opname} is registered; define it (or import the "
            "module that defines it) before naming it in a policy"
        )
    if overload:
        if overload not in packet.overloads():
            raise ValueError(
                f"{api}: {ns}::{opname} has no overload {overload!r}; "
                f"it has {sorted(packet.overloads())}"
            )
        return f"{ns}::{opname}", overload
    return f"{ns}::{opname}", None


def op_rule(api: str, op: object, namespace_fix: str, many_fix: str | None = None) -> str:
    """Normalizes an op-like to a rule string: ``"ns::name"`` (every overload)
    or ``"ns::name.overload"``.

    ``namespace_fix`` is the advice (a format string of ``ns``) for a
    namespace given where an operator belongs; ``many_fix`` the advice for a
    list given to an API that takes one operator.
    """
    if isinstance(op, OpOverload):
        return overload_name(op)
    if isinstance(op, OpOverloadPacket):
        return op._qualified_op_name
    if isinstance(op, str):
        packet, overload = _resolve_op_string(api, op)
        return packet if overload is None else f"{packet}.{overload}"
    if isinstance(op, CustomOpDef):
        return overload_name(op._opoverload)
    ns = namespace_of(op)
    if isinstance(op, torch._ops.HigherOrderOperator):
        hint = f"; {HOP_HINT}"
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
    return f"{op._schema.name}.{op._overloadname}"


def parse_namespace(api: str, ns: object, param: str) -> str:
    """Validates one namespace (a string or a ``Library``) and returns its name.

    ``param`` is where it was given (``"namespaces"``, ``"context_namespaces"``
    or ``"register_namespace"``), which decides the advice for an operator or
    a list given instead.
    """
    if isinstance(ns, torch.library.Library):
        ns = ns.ns
    if not isinstance(ns, str):
        if isinstance(ns, torch._ops._OpNamespace):
            hint = f"; pass its name: {ns.name!r}"
        elif isinstance(ns, ANY_OPS):
            hint = f"; {namespace_op_fix(param, ns)}"
        elif param == "register_namespace" and isinstance(ns, Iterable) and not isinstance(ns, bytes):
            hint = "; call register_namespace once per namespace"
        else:
            hint = ""
        raise TypeError(
            f"{api}: expected a namespace string or a torch.library.Library, got {describe_value(ns)}{hint}"
        )
    if not NAMESPACE_RE.match(ns):
        fix = ns.split("::")[0].strip() if "::" in ns else ""
        hint = f"; pass {fix!r}" if fix and NAMESPACE_RE.match(fix) else ""
        raise ValueError(f"{api}: {ns!r} is not a namespace{hint}")
    return ns


def require_overload(api: str, op: object) -> OpOverload:
    """``op`` if it is an OpOverload; otherwise a TypeError that says which overload to pass."""
    if isinstance(op, OpOverload):
        return op
    if isinstance(op, OpOverloadPacket):
        overloads = op.overloads()
        hint = f"; pick one of its overloads, e.g. {source_name(op)}.{overloads[0]}" if overloads else ""
    elif isinstance(op, CustomOpDef):
        hint = f"; pass its overload, {source_name(op)}"
    elif isinstance(op, torch._ops.HigherOrderOperator):
        hint = f"; {HOP_HINT}"
    else:
        hint = ""
    raise TypeError(
        f"{api}: expected an OpOverload (torch.ops.ns.name.overload), got {describe_value(op)}{hint}"
    )


HOP_HINT = "higher-order operators are cached by torch's own rules, not by a policy"


# The operator objects a policy takes one at a time; with HOPs, every
# operator someone may pass where something else belongs.
SINGLE_OPS = (OpOverload, OpOverloadPacket, CustomOpDef)


ANY_OPS = (OpOverload, OpOverloadPacket, CustomOpDef, torch._ops.HigherOrderOperator)


def namespace_of(value: object) -> str | None:
    """The name of a namespace object (a ``Library`` or ``torch.ops.<ns>``), else None."""
    if isinstance(value, torch.library.Library):
        return value.ns
    if isinstance(value, torch._ops._OpNamespace):
        return value.name
    return None


def source_name(op: OpOverload | OpOverloadPacket | CustomOpDef) -> str:
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


def namespace_op_fix(
    param: str, op: OpOverload | OpOverloadPacket | CustomOpDef | torch._ops.HigherOrderOperator
) -> str:
    """The advice for an operator given where a namespace belongs."""
    if isinstance(op, torch._ops.HigherOrderOperator):
        return HOP_HINT
    if param == "namespaces":
        return f"to cache single operators pass allow=[{source_name(op)}]"
    if param == "register_namespace":
        return f"to cache one operator use register_op({source_name(op)})"
    if isinstance(op, CustomOpDef):
        op = op._opoverload
    ns = op.namespace if isinstance(op, OpOverload) else op._qualified_op_name.partition("::")[0]
    return f"pass its namespace: {param}=[{ns!r}]"


def type_name(obj: object) -> str:
    """``int``, but ``numpy.bool`` for types outside the builtins."""
    cls = type(obj)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
