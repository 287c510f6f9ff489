import sys, pathlib
root = pathlib.Path(sys.argv[1])
def sub(path, old, new, count=1):
    p = root / path
    s = p.read_text()
    assert s.count(old) == count, (path, old[:60], s.count(old))
    p.write_text(s.replace(old, new))

FC = "torch/_library/fake_cache.py"
sub(FC, '''The key of a declared op (and of a higher-order operator, whose body may
dispatch one) also holds:''', '''The key of a declared op (and, while any op is declared, of a higher-order
operator, whose body may dispatch one) also holds:''')
sub(FC, '''  Meta kernel, on any thread) or one a HOP body dispatches. They stay in
  memory until FakeTensorMode.cache_clear(), or until their ShapeEnv dies.''',
'''  Meta kernel, on any thread) or one a HOP body dispatches (so, unlike
  stock's, a HOP's entries see a kernel replaced while an op is declared).
  They stay in memory until FakeTensorMode.cache_clear(), or until their
  ShapeEnv dies.''')
sub(FC, '''- every registered context function and its value, read on every dispatch
  (hit or miss): a declared kernel, and any declared op it dispatches (even
  below the mode, from a Meta kernel), may read the context of any namespace.''',
'''- the context function and value of every namespace that has a declared op,
  read on every dispatch (hit or miss): a declared kernel, and any declared op
  it dispatches (even below the mode, from a Meta kernel), may read them.''')
sub(FC, '''  holding a NaN never hits); a context must not raise: one that raises, or
  whose value's hash or value == value raises or is false, bypasses.''',
'''  holding a NaN never hits); a context must not raise: one that raises an
  Exception (warned once per function), or whose value's hash or
  value == value raises or is false, bypasses; a BaseException propagates.''')
sub(FC, '''from collections.abc import Callable, Hashable, Iterable
''', '''import warnings
from collections.abc import Callable, Hashable, Iterable
''')
sub(FC, '''# namespace -> its context function.
contexts: dict[str, Callable[[], Hashable]] = {}
''', '''# namespace -> how many of its ops are declared; only their contexts are keyed.
namespaces: dict[str, int] = {}
# namespace -> its context function.
contexts: dict[str, Callable[[], Hashable]] = {}
# Context functions that raised (each warned about once).
raised: set[Callable[[], Hashable]] = set()
''')
sub(FC, '''def declare(qualname: str) -> RegistrationHandle:
    declaration = declared[qualname] = object()

    def undeclare() -> None:
        if declared.get(qualname) is declaration:
            declared.pop(qualname, None)

    return RegistrationHandle(undeclare)
''', '''def declare(qualname: str) -> RegistrationHandle:
    namespace = qualname.split("::")[0]
    if qualname not in declared:
        namespaces[namespace] = namespaces.get(namespace, 0) + 1
    declaration = declared[qualname] = object()

    def undeclare() -> None:
        if declared.get(qualname) is declaration:
            end(qualname)

    return RegistrationHandle(undeclare)


def end(qualname: str) -> None:
    if declared.pop(qualname, None) is not None:
        namespace = qualname.split("::")[0]
        namespaces[namespace] -= 1
        if not namespaces[namespace]:
            del namespaces[namespace]
''')
sub(FC, '''def kernel_changed() -> None:''', '''def context_raised(namespace: str, fn: Callable[[], Hashable]) -> None:
    if fn not in raised:
        raised.add(fn)
        warnings.warn(
            f"The fake cache context {fn!r} of namespace {namespace!r} raised; "
            f"FakeTensorMode bypasses its cache while it does (warned once).",
            stacklevel=2,
        )


def kernel_changed() -> None:''')
sub(FC, '''    for qualname in op_defs:  # a declaration ends with its operator
        declared.pop(qualname, None)''', '''    for qualname in op_defs:  # a declaration ends with its operator
        end(qualname)''')

FT = "torch/_subclasses/fake_tensor.py"
sub(FT, '''        if func._name in _cacheable_ops or isinstance(
            func, torch._ops.HigherOrderOperator
        ):
            key_values.append(_declared_op_key())''', '''        # A HOP's key is stock's while nothing is declared.
        if func._name in _cacheable_ops or (
            _cacheable_ops and isinstance(func, torch._ops.HigherOrderOperator)
        ):
            key_values.append(_declared_op_key())''')
sub(FT, '''    for context in list(_fake_cache.contexts.values()):
        try:
            value = context()
        except Exception:
            raise _BypassDispatchCache("cache context raised") from None''', '''    for namespace, context in list(_fake_cache.contexts.items()):
        if namespace not in _fake_cache.namespaces:
            continue
        try:
            value = context()
        except Exception:
            _fake_cache.context_raised(namespace, context)
            raise _BypassDispatchCache("cache context raised") from None''')

LB = "torch/library.py"
sub(LB, '''    FakeTensorMode calls ``fn()`` on every dispatch of an operator declared
    with :func:`register_fake_cacheable` (of any namespace: a declared kernel
    may dispatch this namespace's operators), and keys the cache entry on its
    result (for example, the target specification a''', '''    While an operator of ``namespace`` is declared with
    :func:`register_fake_cacheable`, FakeTensorMode calls ``fn()`` on every
    dispatch of a declared operator of any namespace (its kernel may dispatch
    this namespace's operators) and of a HOP, and keys the cache entry on its
    result (for example, the target specification a''')
sub(LB, '''    at most one context. ``fn`` must not raise; if it does, or if the value's
    ``hash`` or ``value == value`` raises or is false, the dispatch bypasses
    the cache.''', '''    at most one context. ``fn`` must not raise; if it raises an ``Exception``
    (warned once per ``fn``), or if the value's ``hash`` or ``value == value``
    raises or is false, the dispatch bypasses the cache; a ``BaseException``
    propagates.''')
