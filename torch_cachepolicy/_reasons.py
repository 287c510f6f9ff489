"""Every reason a policy mode bypasses its cache, in one table.

``cache_report()`` counts bypasses by these strings (torch's own validation
adds its reasons, such as ``"non-builtin"``, beside them); docs/guide.md lists
them for users, and a test holds the two together.
"""

from __future__ import annotations

# The policy's verdict on an operator (CacheDecision.label of a route that bypasses).
NON_BUILTIN = "non-builtin"  # torch's reason for an op outside aten/prim/prims, kept for the same case
DENIED = "denied by policy"
BUILTIN_EXCLUDED = "builtin excluded by policy"
CIA_VIEW = "CompositeImplicitAutograd"
NO_FAKE_KERNEL = "no fake kernel"
HIGHER_ORDER = "higher-order operator (the ops of its subgraph are cached)"

# Per call, before the key is looked up.
REAL_TENSORS = "propagate_real_tensors"
PROFILED = "a custom-ops profile replaces its fake kernel"
NAN = "NaN argument"
GRAD = "argument with a .grad"
UNKNOWN_SYMBOL = "a symbol of another ShapeEnv than its mode's"
CONTEXT_NEVER_REPEATS = "context_key() values that never repeat (over 64 for this op; return values equal when equal)"

# On the miss that would create an entry.
MUTATES = "mutates an argument (allow it with register_op)"
VIEW_OF_SEVERAL = "view op with several tensor arguments"
BACKEND_FALLBACK = "no fake kernel for static inputs (the Meta backend fallback ran)"
PROXY_SYMNODE = "Proxy mode with SymNode output"
UNBACKED_SCALAR = "unbacked symbol in scalar output"
OUTPUTS_ALIAS = "outputs alias each other"
UNDECLARED_ALIAS = "output aliases an input without a schema annotation"
SHAPE_ENV_CHANGED = "fake kernel changed the ShapeEnv"
RUNS_EXCLUDED = "its kernel dispatches a backend op or an op the policy denies (a hit would not run it)"
ALIAS_NOT_REPRODUCED = "output aliasing a cache hit would not reproduce"


def opaque_argument(type_name: str) -> str:
    """An argument the key holds by identity (Note [Arguments the key cannot see])."""
    return (
        f"argument of type {type_name} whose content the key cannot see "
        "(CachePolicy(immutable_types=[...]) declares it immutable)"
    )


def input_changed(field: str) -> str:
    """The kernel changed ``field`` of a tensor argument (``"shape"``, ``"python attributes"``)."""
    return f"fake kernel changed an input's {field}"


def hit_would_differ(field: str) -> str:
    """The output a hit would build differs from the kernel's in ``field``."""
    return f"a hit would differ in {field}"


def not_described(error: BaseException) -> str:
    """torch's entry builder raised ``error`` describing the output (a value type it never meets for aten)."""
    return f"torch's entry builder cannot describe the output ({type(error).__name__})"


def not_rebuilt(error: BaseException) -> str:
    """Building the output a hit would return raised ``error``."""
    return f"a hit could not rebuild the output ({type(error).__name__})"


def distrusted(names: list[str]) -> str:
    """This torch's fake dispatch consults ``names``, which the package does not list (Note [The kernel in effect])."""
    return f"torch consults kernel sources this package does not list ({', '.join(names)})"
