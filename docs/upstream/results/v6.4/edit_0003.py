import sys, pathlib
root = pathlib.Path(sys.argv[1])
def sub(path, old, new, count=1):
    p = root / path
    s = p.read_text()
    assert s.count(old) == count, (path, old[:60], s.count(old))
    p.write_text(s.replace(old, new))

FC = "torch/_library/fake_cache.py"
sub(FC, '''state. The key of a declared op (and, while any op is declared, of a higher-order
operator, whose body may dispatch one) also holds:
- the kernel generation,''', '''state. The key of a declared op also holds:
- the kernel generation,''')
sub(FC, '''  Meta kernel, on any thread) or one a HOP body dispatches (so, unlike
  stock's, a HOP's entries see a kernel replaced while an op is declared).
  They stay in memory until FakeTensorMode.cache_clear(), or until their''', '''  Meta kernel, on any thread). A higher-order operator's key holds no
  generation: as stock's, its entries do not see a kernel replaced in its
  body, declared op or aten's (FakeTensorMode.cache_clear() does). They
  stay in memory until FakeTensorMode.cache_clear(), or until their''')
sub(FC, '''- the context function and value of every namespace that has a declared op,
  read on every dispatch (hit or miss): a declared kernel, and any declared op
  it dispatches (even below the mode, from a Meta kernel), may read them.''',
'''- the context function and value of every namespace that has a declared op
  (also in a HOP's key while one is declared), read on every dispatch (hit or
  miss): a declared kernel, and any declared op it dispatches (even below the
  mode, from a Meta kernel), may read them; a kernel must not depend on the
  context of a namespace without a declared op (its author's responsibility).''')
sub(FC, '''import warnings
from collections.abc''', '''import warnings
import weakref
from collections.abc''')
sub(FC, '''# Context functions that raised (each warned about once).
raised: set[Callable[[], Hashable]] = set()''', '''# Context functions that raised (each warned about once), not kept alive.
raised: weakref.WeakSet[Callable[[], Hashable]] = weakref.WeakSet()''')
sub(FC, '''    if fn not in raised:
        raised.add(fn)
        warnings.warn(''', '''    if fn not in raised:
        try:
            raised.add(fn)
        except TypeError:  # not weak-referenceable: warned every time
            pass
        warnings.warn(''')
sub(FC, '''            f"FakeTensorMode bypasses its cache while it does (warned once).",''',
'''            f"FakeTensorMode bypasses its cache while it does (warned once "
            f"per function).",''')

FT = "torch/_subclasses/fake_tensor.py"
sub(FT, '''        # A HOP's key is stock's while nothing is declared.
        if func._name in _cacheable_ops or (
            _cacheable_ops and isinstance(func, torch._ops.HigherOrderOperator)
        ):
            key_values.append(_declared_op_key())''', '''        if func._name in _cacheable_ops:
            key_values.append((_fake_cache.generation, *_cache_context_key()))
        # A HOP body may dispatch a declared op; its key holds no generation.
        elif _cacheable_ops and isinstance(func, torch._ops.HigherOrderOperator):
            key_values.append(_cache_context_key())''')
sub(FT, '''def _declared_op_key() -> tuple[object, ...]:
    # The part of a declared op's (or a HOP's) key that aten's lacks: Note
    # [Cacheable fake kernels] in torch/_library/fake_cache.py.
    key: tuple[object, ...] = (_fake_cache.generation,)''', '''def _cache_context_key() -> tuple[object, ...]:
    # The contexts in a declared op's (or a HOP's) key: Note [Cacheable fake
    # kernels] in torch/_library/fake_cache.py.
    key: tuple[object, ...] = ()''')

LB = "torch/library.py"
sub(LB, '''    dispatch of a declared operator of any namespace (its kernel may dispatch
    this namespace's operators) and of a HOP, and keys''', '''    dispatch of a declared operator of any namespace (its kernel may dispatch
    this namespace's operators) and of a HOP (whose body may), and
    keys''')
sub(LB, '''    if namespace in ("aten", "prim", "prims") or not callable(fn):
        raise ValueError(
            f"register_fake_cache_context({namespace!r}, {fn!r}): fn must be a "
            f"callable returning the context, for a namespace other than "
            f"aten/prim/prims (whose operators FakeTensorMode caches without one)."
        )''', '''    try:
        hash(fn)  # fn is part of cache keys
        valid = callable(fn)
    except TypeError:
        valid = False
    if namespace in ("aten", "prim", "prims") or not valid:
        raise ValueError(
            f"register_fake_cache_context({namespace!r}, {fn!r}): fn must be a "
            f"hashable callable (wrap an unhashable one in a function) returning "
            f"the context, for a namespace other than aten/prim/prims (whose "
            f"operators FakeTensorMode caches without one)."
        )''')
