# Owner(s): ["module: fakeTensor"]
"""Every error and warning message of the package follows one rule.

A message starts with the API as the user calls it (``torch_cachepolicy.CachePolicy.register_namespace(...): ``),
then says what is wrong, then the fix. The scan reads the package's source: every exception it constructs (``raise
X(...)``, or built to be raised elsewhere) and every ``warnings.warn(...)``, and renders the head of the message, the
text before its first ``": "``, with module-level string constants filled in and any other value shown as
``{expression}``. A head that is a function's ``api`` or ``where`` parameter (``{api}``) names the API its caller
passes: every value passed for such a parameter is held to the rule too.
"""

from __future__ import annotations

import ast
import functools
import importlib
import pathlib
import re
from collections.abc import Iterator

from torch.testing._internal.common_utils import TestCase, run_tests

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "torch_cachepolicy"

# `torch_cachepolicy.<api>` with the call as the user writes it: `(...)`, `(param=...)`, `()`, `[...]`, or an
# attribute assignment (`torch_cachepolicy.FakeTensorMode.cache_policy = ...`).
API = r"torch_cachepolicy(\.[A-Za-z_]+)+(\([^()]*\)|\[\.\.\.\])?( = \.\.\.)?"
# The same, in parts: the dotted name, the call, the assignment.
API_PARTS = re.compile(
    r"torch_cachepolicy\.(?P<path>[A-Za-z_]+(?:\.[A-Za-z_]+)*)(?P<call>\([^()]*\)|\[\.\.\.\])?(?P<set> = \.\.\.)?"
)
# An API named by the caller: the function's `api` or `where` parameter, possibly with the parameter appended.
FORWARDED = r"\{(api|where)\}(\([^()]*\))?"
# What the user called is torch's, on an object of ours (`pickle.dumps(torch_cachepolicy.CachePolicy(...))`).
ON_OURS = rf"pickle\.dumps\({API}\)"
RULE = re.compile(rf"^({API}|{FORWARDED}|{ON_OURS})$")
API_PARAMETERS = ("api", "where")

# Messages off the rule on purpose, as `module: head` -> why.
_IMPORT_TIME = "no call of the user's caused it; it names the package and torch's version (or the build)"
_SELF_CHECK = (
    "the developer check the environment variable switches on, which the head names: no API call is at fault, and "
    "the message asks for a report"
)
ALLOWED = {
    "_rules.py: There was no rule registered for HigherOrderOperator {func.name()} and mode {mode} (torch_cachepo...": (
        "torch's own text for a HOP without a rule (raised where stock's HOP dispatch raises), so that code matching "
        "torch's message keeps working with the drop-in"
    ),
    "_compat.py: torch_cachepolicy": f"the import-time checks of torch's internals: {_IMPORT_TIME}",
    "_kernels.py: torch_cachepolicy": f"the import-time check of the kernel sources: {_IMPORT_TIME}",
    "_native.py: torch_cachepolicy": (
        f"the once-per-process warning that the C++ helper is missing or built against another torch: {_IMPORT_TIME}"
    ),
    "_key.py: torch_cachepolicy (TORCH_CACHEPOLICY_SELF_CHECK=1)": _SELF_CHECK,
    "_synth.py: torch_cachepolicy (TORCH_CACHEPOLICY_SELF_CHECK=1)": _SELF_CHECK,
}

# Exceptions the package raises to steer torch's dispatch, never to the user: their argument is a bypass reason.
INTERNAL = {"_BypassDispatchCache"}
HEAD_WIDTH = 100


def api_problem(head: str, *, called: bool = True) -> str | None:
    """Why ``head`` does not name a public API of the package as the user calls it, or None.

    The dotted name must reach a public attribute of ``torch_cachepolicy`` (not a private function the user never
    calls), and with ``called``, a class, function or method must be shown called (``(...)``, ``(param=...)``,
    ``()``, ``[...]``) or assigned (`` = ...``).
    """
    inner = re.fullmatch(rf"pickle\.dumps\(({API})\)", head)
    match = API_PARTS.fullmatch(inner.group(1) if inner else head)
    if match is None:
        return None if re.fullmatch(FORWARDED, head) else "not torch_cachepolicy.<api>"
    obj: object = importlib.import_module("torch_cachepolicy")
    for part in match.group("path").split("."):
        if part.startswith("_"):
            return f"{part} is private"
        try:
            obj = getattr(obj, part)
        except AttributeError:
            try:
                obj = importlib.import_module(f"{obj.__name__}.{part}")  # type: ignore[attr-defined]
            except (AttributeError, ImportError):
                return f"torch_cachepolicy has no public {match.group('path')}"
    if called and callable(obj) and not (match.group("call") or match.group("set")):
        return "name the call as the user writes it: (...)"
    return None


@functools.cache
def _parsed() -> tuple[tuple[str, ast.Module], ...]:
    return tuple(
        (str(path.relative_to(PACKAGE)), ast.parse(path.read_text(), filename=str(path)))
        for path in sorted(PACKAGE.rglob("*.py"))
    )


def _modules() -> Iterator[tuple[str, ast.Module]]:
    """Every module of the package, by path relative to it, parsed."""
    yield from _parsed()


def _module_constants(tree: ast.Module) -> dict[str, str]:
    """The module-level string constants of one module, by name."""
    found = {}
    for node in tree.body:
        target = value = None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign):
            target, value = node.target, node.value
        if isinstance(target, ast.Name) and isinstance(value, ast.Constant) and isinstance(value.value, str):
            found[target.id] = value.value
    return found


def _constants(module: ast.Module) -> dict[str, str]:
    """The string constants a module's code can name: its own, then those of the package bound to one value only
    (an imported name, such as ``SELF_CHECK_ENV``)."""
    values: dict[str, set[str]] = {}
    for _, tree in _modules():
        for name, value in _module_constants(tree).items():
            values.setdefault(name, set()).add(value)
    unique = {name: next(iter(v)) for name, v in values.items() if len(v) == 1}
    return {**unique, **_module_constants(module)}


class _Renderer:
    """Renders a message expression as text: literals as written, module constants filled in, the rest as
    ``{expression}``; a name assigned in the enclosing function is followed to its value."""

    def __init__(self, constants: dict[str, str]) -> None:
        self.constants = constants

    def __call__(self, node: ast.expr, scope: ast.AST | None) -> str:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.JoinedStr):
            return "".join(self(part, scope) for part in node.values)
        if isinstance(node, ast.FormattedValue):
            if isinstance(node.value, ast.Name) and node.value.id in self.constants:
                return self.constants[node.value.id]
            return "{" + ast.unparse(node.value) + "}"
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            return self(node.left, scope) + self(node.right, scope)
        if isinstance(node, ast.Name):
            assigned = _assigned_in(scope, node.id)
            if assigned is not None:
                return self(assigned, None)
            if node.id in self.constants:
                return self.constants[node.id]
        return "{" + ast.unparse(node) + "}"


def _assigned_in(scope: ast.AST | None, name: str) -> ast.expr | None:
    """The value a function assigns to ``name`` (its only assignment), or None."""
    if scope is None:
        return None
    values = [
        node.value
        for node in ast.walk(scope)
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
    ]
    return values[0] if len(values) == 1 else None


def _head(text: str) -> str:
    head = text.split(": ", 1)[0]
    return head if len(head) <= HEAD_WIDTH else head[: HEAD_WIDTH - 3] + "..."


def _called_name(call: ast.Call) -> str | None:
    func = call.func
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def _functions(tree: ast.AST) -> Iterator[tuple[ast.FunctionDef | ast.AsyncFunctionDef | None, ast.AST]]:
    """Every node of ``tree`` with its innermost enclosing function (None at module or class level)."""
    todo: list[tuple[ast.AST, ast.FunctionDef | ast.AsyncFunctionDef | None]] = [(tree, None)]
    while todo:
        node, function = todo.pop()
        yield function, node
        inner = node if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
        todo.extend((child, inner) for child in ast.iter_child_nodes(node))


def message_heads() -> list[str]:
    """``module: head`` of every message the package constructs, sorted, one line per distinct pair."""
    heads = set()
    for module, tree in _modules():
        render = _Renderer(_constants(tree))
        for function, node in _functions(tree):
            if not isinstance(node, ast.Call):
                continue
            name = _called_name(node)
            is_warning = ast.unparse(node.func) == "warnings.warn"
            is_exception = name is not None and name.endswith(("Error", "Exception", "Warning")) and name not in INTERNAL
            if not (is_warning or is_exception):
                continue
            message = node.args[0] if node.args else next((k.value for k in node.keywords if k.arg == "message"), None)
            if message is None:
                continue  # a bare exception (re-raised type): no message of ours
            heads.add(f"{module}: {_head(render(message, function))}")
    return sorted(heads)


def api_arguments() -> list[str]:
    """``module: head`` of every argument the package passes for a function's ``api`` or ``where`` parameter."""
    positions: dict[str, set[tuple[str, int]]] = {}
    trees = list(_modules())
    for _, tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                params = [a.arg for a in (*node.args.posonlyargs, *node.args.args)]
                offset = 1 if params[:1] in (["self"], ["cls"]) else 0
                for i, param in enumerate(params):
                    if param in API_PARAMETERS:
                        positions.setdefault(node.name, set()).add((param, i - offset))
    values = set()
    for module, tree in trees:
        render = _Renderer(_constants(tree))
        for function, node in _functions(tree):
            if not isinstance(node, ast.Call) or _called_name(node) not in positions:
                continue
            for param, index in positions[_called_name(node)]:  # type: ignore[index]
                arg = next((k.value for k in node.keywords if k.arg == param), None)
                if arg is None and 0 <= index < len(node.args):
                    arg = node.args[index]
                if arg is not None:
                    values.add(f"{module}: {_head(render(arg, function))}")
    return sorted(values)


class TestMessages(TestCase):
    def test_message_heads(self) -> None:
        """The head of every message the package constructs, each on the rule or allowed with a reason."""
        heads = message_heads()
        self.assertExpectedInline("\n".join(heads), """\
_arguments.py: {api}
_arguments.py: {where}
_compat.py: torch_cachepolicy
_kernels.py: torch_cachepolicy
_kernels.py: torch_cachepolicy.CachePolicy.context_key()
_key.py: torch_cachepolicy (TORCH_CACHEPOLICY_SELF_CHECK=1)
_keyset.py: torch_cachepolicy.CachePolicy.decide(...)
_keyset.py: {api}
_names.py: torch_cachepolicy.CachePolicy({param}=...)
_names.py: torch_cachepolicy.CachePolicy.context_key()
_names.py: {api}
_native.py: torch_cachepolicy
_routes.py: torch_cachepolicy.CachePolicy.decide(...)
_rules.py: There was no rule registered for HigherOrderOperator {func.name()} and mode {mode} (torch_cachepo...
_synth.py: torch_cachepolicy (TORCH_CACHEPOLICY_SELF_CHECK=1)
_verify.py: torch_cachepolicy.FakeTensorMode(cache_crosscheck=True)
adopt.py: torch_cachepolicy.adopt(...)
export.py: torch_cachepolicy.export(...)
policy.py: pickle.dumps(torch_cachepolicy.CachePolicy(...))
policy.py: torch_cachepolicy.CacheDecision(...)
policy.py: torch_cachepolicy.CachePolicy(include_builtins=...)
policy.py: torch_cachepolicy.CachePolicy(predicate=...)
policy.py: torch_cachepolicy.CachePolicy.register_immutable_type(...)
recipes/executorch.py: torch_cachepolicy.recipes.executorch.tosa_context_key()
report.py: torch_cachepolicy.CacheReport[...]
store.py: torch_cachepolicy.CacheStore(isolated=...)""")
        off_rule = [
            f"{line} ({api_problem(head) or 'off the rule'})"
            for line, head in ((line, line.split(": ", 1)[1]) for line in heads)
            if line not in ALLOWED and (not RULE.match(head) or api_problem(head))
        ]
        self.assertEqual(off_rule, [], msg="start the message with the API as the user calls it, then say what is "
                         "wrong and the fix; or list it in ALLOWED with the reason")
        self.assertEqual(set(ALLOWED) - set(heads), set(), msg="ALLOWED lists a message the package no longer has")

    def test_apis_messages_name(self) -> None:
        """Every API a caller passes to be named in a message (an ``api`` or ``where`` argument) is on the rule."""
        values = api_arguments()
        self.assertExpectedInline("\n".join(values), """\
_arguments.py: {api}(cache_crosscheck=...)
_arguments.py: {api}(cache_policy=...)
_arguments.py: {api}(cache_store=...)
_arguments.py: {where}
_keyset.py: torch_cachepolicy.CachePolicy.decide(...)
_keyset.py: torch_cachepolicy.FakeTensorMode.dispatch(...)
_names.py: torch_cachepolicy.CachePolicy({param}=...)
_names.py: {api}
adopt.py: torch_cachepolicy.adopt
adopt.py: torch_cachepolicy.adopt(...)
export.py: torch_cachepolicy.export
export.py: torch_cachepolicy.export(...)
mode.py: torch_cachepolicy.FakeTensorMode
mode.py: torch_cachepolicy.FakeTensorMode.cache_policy = ...
policy.py: torch_cachepolicy.CachePolicy(allow=...)
policy.py: torch_cachepolicy.CachePolicy(context_namespaces=...)
policy.py: torch_cachepolicy.CachePolicy(deny=...)
policy.py: torch_cachepolicy.CachePolicy(namespaces=...)
policy.py: torch_cachepolicy.CachePolicy.decide(...)
policy.py: torch_cachepolicy.CachePolicy.deny(...)
policy.py: torch_cachepolicy.CachePolicy.explain(...)
policy.py: torch_cachepolicy.CachePolicy.is_cacheable(...)
policy.py: torch_cachepolicy.CachePolicy.register_namespace(...)
policy.py: torch_cachepolicy.CachePolicy.register_op(...)
policy.py: {api}""")
        # The callee adds the call (`{api}(cache_policy=...)`), so a bare class or function is fine here.
        off_rule = [
            v for v in values
            if not RULE.match(v.split(": ", 1)[1]) or api_problem(v.split(": ", 1)[1], called=False)
        ]
        self.assertEqual(off_rule, [])

    def test_scan_sees_each_form(self) -> None:
        """The scan's own check: raise, a constructed exception, warnings.warn, f-strings, constants, locals."""
        source = '''
import warnings
_API = "torch_cachepolicy.thing(...)"
def f(api, e):
    raise TypeError(f"{api}: bad {e!r}; fix it")
def g():
    message = f"{_API}: bad; fix it"
    warnings.warn(message)
    return ValueError("torch_cachepolicy.Thing[...]: missing; pass another")
def h():
    raise _BypassDispatchCache(REASON)
'''
        tree = ast.parse(source)
        render = _Renderer({"_API": "torch_cachepolicy.thing(...)"})
        found = sorted(
            _head(render((node.args[0]), function))
            for function, node in _functions(tree)
            if isinstance(node, ast.Call) and _called_name(node) in ("TypeError", "warn", "ValueError")
        )
        self.assertEqual(found, ["torch_cachepolicy.Thing[...]", "torch_cachepolicy.thing(...)", "{api}"])
        self.assertTrue(all(RULE.match(h) for h in found))
        self.assertIsNone(RULE.match("torch_cachepolicy.kernel_keys(...) oops"))
        self.assertIsNone(RULE.match("FakeTensorMode cache crosscheck"))
        # On the rule's pattern, but not an API the user calls, or not as called.
        private = "torch_cachepolicy.kernel_keys(...)"
        self.assertEqual(api_problem(private), "torch_cachepolicy has no public kernel_keys")
        self.assertEqual(api_problem("torch_cachepolicy._keyset.kernel_keys(...)"), "_keyset is private")
        self.assertEqual(api_problem("torch_cachepolicy.CachePolicy"), "name the call as the user writes it: (...)")
        self.assertIsNone(api_problem("torch_cachepolicy.CachePolicy", called=False))
        for head in ("torch_cachepolicy.CachePolicy.decide(...)", "torch_cachepolicy.CacheReport[...]",
                     "torch_cachepolicy.FakeTensorMode.cache_policy = ...", "{api}(cache_store=...)",
                     "pickle.dumps(torch_cachepolicy.CachePolicy(...))"):
            self.assertIsNone(api_problem(head), msg=head)


if __name__ == "__main__":
    run_tests()
