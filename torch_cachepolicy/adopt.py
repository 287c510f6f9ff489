"""``adopt``: move an exported program onto a policy ``FakeTensorMode``.

Exporters build the FakeTensorMode themselves: ``torch.export`` creates a
stock mode, and every later ExportPass and ``run_decompositions`` reuses the
mode of the FakeTensors in the program's node metadata. ``adopt`` replaces
those values with identical FakeTensors of a :class:`FakeTensorMode`, so every
later pass runs, and caches, under that mode's policy.

Example::

    ep = torch.export.export(model, args)
    mode = adopt(ep, cache_policy=CachePolicy(namespaces=["quantized_decomposed"]))
    ep = ep.run_decompositions()  # dispatches through `mode`
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, MutableMapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch._subclasses import fake_tensor as _ft
from torch.export import ExportedProgram
from torch.fx.immutable_collections import immutable_dict, immutable_list
from torch.fx.passes.shape_prop import TensorMetadata
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from torch_cachepolicy._compat import is_fake_tensor
from torch_cachepolicy.arguments import check_cache_arguments
from torch_cachepolicy.mode import FakeTensorMode
from torch_cachepolicy.policy import CachePolicy
from torch_cachepolicy.safety import storage_id
from torch_cachepolicy.store import CacheStore

__all__ = ["adopt"]

_API = "adopt(...)"

# Settings of the original mode the new one inherits, with how to read them
# back from a mode. `export` only lives on the mode's converter.
_INHERITED: dict[str, Callable[[_ft.FakeTensorMode], object]] = {
    "allow_fallback_kernels": lambda m: m.allow_fallback_kernels,
    "allow_non_fake_inputs": lambda m: m.allow_non_fake_inputs,
    "shape_env": lambda m: m.shape_env,
    "static_shapes": lambda m: m.static_shapes,
    "export": lambda m: m.fake_tensor_converter.export,
}
# Every keyword torch_cachepolicy.FakeTensorMode takes besides policy and store.
_MODE_KWARGS = frozenset(_INHERITED) | {"cache_crosscheck"}


@dataclass(frozen=True)
class _Site:
    """One metadata entry that holds fake values (or the mode itself)."""

    meta: MutableMapping[str, Any]
    key: str
    where: str  # for error messages: "node 'x' meta['val']"


def adopt(
    program: ExportedProgram | torch.fx.GraphModule,
    *,
    cache_policy: CachePolicy | None = None,
    cache_store: CacheStore | None = None,
    **mode_kwargs: Any,
) -> FakeTensorMode:
    """Moves a traced program onto a :class:`torch_cachepolicy.FakeTensorMode`.

    Finds the one FakeTensorMode whose FakeTensors fill the program's node
    metadata (``meta["val"]`` and any other meta entry holding FakeTensors,
    in nested containers and in subgraphs of higher-order ops too), creates a
    policy mode that shares its ShapeEnv and settings, and replaces every such
    value with a FakeTensor of the new mode that has the same shape (the same
    symbolic expressions), stride, storage offset, dtype, device and
    ``requires_grad``. Values that shared a storage still share one. The graph
    and its code are not touched. Afterwards ``torch._guards.detect_fake_mode``,
    ``ExportPass`` and ``ExportedProgram.run_decompositions`` find the new mode.

    On a program whose values already belong to a policy mode nothing is
    re-created and that mode is returned: ``cache_policy``, if given and a
    different object, *replaces* ``mode.cache_policy`` (entries are kept per
    policy identity, so none made under the old rules are served under the
    new); ``cache_store`` and ``mode_kwargs`` must then agree with the mode.

    Args:
        program: a ``torch.export.ExportedProgram`` (its ``graph_module`` is
            adopted) or a ``torch.fx.GraphModule`` carrying fake values.
        cache_policy: the new mode's policy; ``None`` means ``CachePolicy()``
            for a new mode, and "keep the current one" for an adopted program.
        cache_store: the new mode's store; ``None`` gives it a private one.
        **mode_kwargs: more keyword arguments of ``FakeTensorMode``
            (``cache_crosscheck``, ``allow_non_fake_inputs``, ...). They
            override the settings copied from the original mode; ``shape_env``
            may only name the original mode's ShapeEnv.

    Returns:
        The policy mode that now owns the program's fake values.

    Raises:
        TypeError: ``program``, ``cache_policy``, ``cache_store`` or
            ``cache_crosscheck`` has the wrong type, or ``mode_kwargs`` names
            no ``FakeTensorMode`` argument.
        ValueError: the program holds no FakeTensor, holds FakeTensors of
            more than one mode, or (already adopted) ``cache_store`` or
            ``mode_kwargs`` disagree with its mode.
        RuntimeError: a re-created value would differ from its original (a
            torch this function does not know). Whenever ``adopt`` raises,
            the program is left unchanged.
    """
    gm = _graph_module(program)
    check_cache_arguments("adopt", cache_policy, cache_store, mode_kwargs.get("cache_crosscheck"))

    unknown = sorted(set(mode_kwargs) - _MODE_KWARGS)
    if unknown:
        raise TypeError(
            f"{_API}: unexpected keyword argument {unknown[0]!r}; torch_cachepolicy.FakeTensorMode "
            f"also takes {', '.join(sorted(_MODE_KWARGS))}"
        )

    sites, mode_refs = _scan(gm)
    old = _single_mode(program, sites, mode_refs)
    if isinstance(old, FakeTensorMode):
        return _readopt(old, cache_policy, cache_store, mode_kwargs)

    if "shape_env" in mode_kwargs and mode_kwargs["shape_env"] is not old.shape_env:
        raise ValueError(
            f"{_API}: shape_env must be the program's own ShapeEnv (or omitted): its values' "
            "symbolic sizes are symbols of that ShapeEnv and mean nothing in another"
        )
    kwargs: dict[str, Any] = {name: read(old) for name, read in _INHERITED.items()}
    kwargs.update(mode_kwargs)
    new = FakeTensorMode(cache_policy=cache_policy, cache_store=cache_store, **kwargs)
    # The epoch joins cache keys that hold symbols and dates unbacked memos;
    # the new mode continues the old mode's trace rather than starting over.
    new.epoch = old.epoch
    # Read from torch's config by the constructor; torch.export creates its
    # mode with it off, so data_ptr() on the program's values keeps raising.
    new._allow_unsafe_data_ptr_access = old._allow_unsafe_data_ptr_access
    _move(sites, mode_refs, old, new)
    return new


# ---------------------------------------------------------------- finding


def _graph_module(program: object) -> torch.fx.GraphModule:
    if isinstance(program, ExportedProgram):
        return program.graph_module
    if isinstance(program, torch.fx.GraphModule):
        return program
    raise TypeError(
        f"{_API}: expected a torch.export.ExportedProgram or a torch.fx.GraphModule, "
        f"got {type(program).__name__}"
        + ("; pass the module through torch.export.export first" if isinstance(program, torch.nn.Module) else "")
    )


def _graph_modules(gm: torch.fx.GraphModule) -> Iterator[tuple[str, torch.fx.GraphModule]]:
    # Subgraphs of higher-order ops (cond branches, while_loop bodies, ...)
    # carry values of the same mode, and ExportPass re-dispatches them too.
    for name, module in gm.named_modules(remove_duplicate=True):
        if isinstance(module, torch.fx.GraphModule):
            yield name, module


def _is_fake(leaf: object) -> bool:
    """A FakeTensor, or a tensor subclass wrapping FakeTensors."""
    if is_fake_tensor(leaf):
        return True
    return is_traceable_wrapper_subclass(leaf) and _ft.maybe_get_fake_mode(leaf) is not None


def _scan(gm: torch.fx.GraphModule) -> tuple[list[tuple[_Site, list[torch.Tensor]]], list[_Site]]:
    """Every meta entry holding fake values, and every entry holding a mode."""
    sites: list[tuple[_Site, list[torch.Tensor]]] = []
    mode_refs: list[_Site] = []
    for prefix, module in _graph_modules(gm):
        graph_name = f"subgraph {prefix!r}" if prefix else "the graph module"
        for key, value in module.meta.items():
            site = _Site(module.meta, key, f"{graph_name} meta[{key!r}]")
            # Some exporters keep the mode itself here (dynamo's functional
            # export: gm.meta["fake_mode"]); it must follow its values.
            if isinstance(value, _ft.FakeTensorMode):
                mode_refs.append(site)
            elif fakes := _fakes_in(value):
                sites.append((site, fakes))
        for node in module.graph.nodes:
            for key, value in node.meta.items():
                if fakes := _fakes_in(value):
                    in_graph = f" of {graph_name}" if prefix else ""
                    sites.append((_Site(node.meta, key, f"node {node.name!r}{in_graph} meta[{key!r}]"), fakes))
    return sites, mode_refs


def _fakes_in(value: object) -> list[torch.Tensor]:
    """The fake leaves pytree finds in ``value``, in pytree's order."""
    out: list[torch.Tensor] = []
    _collect_fakes(value, out)
    return out


# Types that never hold a fake value.
_ATOMS = frozenset({type(None), str, int, float, bool, torch.dtype, torch.device, torch.layout, torch.Size})
# Exact types whose pytree children are their items (values, for mappings),
# in iteration order. TensorMetadata is the NamedTuple of meta["tensor_meta"].
_SEQUENCES = frozenset({tuple, list, immutable_list, TensorMetadata})
_MAPPINGS = frozenset({dict, immutable_dict})


def _collect_fakes(value: object, out: list[torch.Tensor]) -> None:
    # Most meta values are a tensor, or strings, ints, types and plain
    # tuples, lists and dicts of them (nn_module_stack, source_fn_stack,
    # stack_trace, tensor_meta, ...). Walking those directly visits the leaves pytree
    # would, in the same order, at a fraction of pytree's cost per node;
    # any other container (namedtuple, OrderedDict, registered classes) is
    # left to pytree, as before.
    kind = type(value)
    if kind in _ATOMS or isinstance(value, type):
        return
    if kind in _SEQUENCES:
        for item in value:  # type: ignore[attr-defined]
            _collect_fakes(item, out)
    elif kind in _MAPPINGS:
        for item in value.values():  # type: ignore[attr-defined]
            _collect_fakes(item, out)
    elif isinstance(value, torch.Tensor):  # a pytree leaf
        if _is_fake(value):
            out.append(value)
    else:
        out.extend(leaf for leaf in pytree.tree_leaves(value) if _is_fake(leaf))


def _single_mode(
    program: object,
    sites: list[tuple[_Site, list[torch.Tensor]]],
    mode_refs: list[_Site],
) -> _ft.FakeTensorMode:
    kind = "ExportedProgram" if isinstance(program, ExportedProgram) else "GraphModule"
    if not sites:
        raise ValueError(
            f"{_API}: the {kind} holds no FakeTensor in any node's meta (e.g. meta['val']), so "
            "there is no FakeTensorMode to move. Pass a program made by torch.export.export, or "
            "fill the metadata with torch.fx.passes.fake_tensor_prop.FakeTensorProp(gm, mode)"
            ".propagate(*args), using a torch_cachepolicy.FakeTensorMode as `mode` (then "
            "adopt() is not needed)"
        )
    found: dict[int, tuple[_ft.FakeTensorMode, str]] = {}
    for site, fakes in sites:
        for fake in fakes:
            mode = _ft.maybe_get_fake_mode(fake)
            assert mode is not None  # _is_fake said so
            found.setdefault(id(mode), (mode, site.where))
    for site in mode_refs:
        mode = site.meta[site.key]
        found.setdefault(id(mode), (mode, site.where))
    if len(found) > 1:
        (_, where1), (_, where2) = list(found.values())[:2]
        raise ValueError(
            f"{_API}: the {kind} mixes {len(found)} FakeTensorModes ({where1} belongs to one, "
            f"{where2} to another); adopt() moves a program that has exactly one. Re-export "
            "the program, or re-run the pass that introduced the second mode with the "
            "program's own mode (an ExportPass whose inputs hold no FakeTensor, e.g. only "
            "lifted constants, creates a fresh one)"
        )
    return next(iter(found.values()))[0]


# ------------------------------------------------------------- re-adopting


def _readopt(
    mode: FakeTensorMode,
    cache_policy: CachePolicy | None,
    cache_store: CacheStore | None,
    mode_kwargs: dict[str, Any],
) -> FakeTensorMode:
    """The program is already on a policy mode: check the request, maybe swap the policy."""
    if cache_store is not None and cache_store is not mode.cache_store:
        raise ValueError(
            f"{_API}: the program already belongs to a torch_cachepolicy.FakeTensorMode with "
            "another CacheStore, and a mode's store cannot be replaced. Omit cache_store "
            "(mode.cache_store is the current one), or re-export the program to start over"
        )
    mismatched = []
    for name, value in mode_kwargs.items():
        if name == "cache_crosscheck":
            current: object = mode.cache_crosscheck_enabled
            if value is None:
                continue  # "follow torch's config": nothing to compare
        else:
            current = _INHERITED[name](mode)
        same = value is current if name == "shape_env" else value == current
        if not same:
            mismatched.append(f"{name}={value!r} (the mode has {current!r})")
    if mismatched:
        raise ValueError(
            f"{_API}: the program already belongs to a torch_cachepolicy.FakeTensorMode whose "
            f"settings differ: {', '.join(mismatched)}. adopt() does not change a mode's "
            "settings; set the attribute on the returned mode, or re-export the program"
        )
    if cache_policy is not None and cache_policy is not mode.cache_policy:
        mode.cache_policy = cache_policy
    return mode


# ----------------------------------------------------------------- moving


def _move(
    sites: list[tuple[_Site, list[torch.Tensor]]],
    mode_refs: list[_Site],
    old: _ft.FakeTensorMode,
    new: FakeTensorMode,
) -> None:
    """Replaces every fake value of ``old`` in ``sites`` by its twin in ``new``.

    Note [Re-fakeifying through torch's converter]
    ``new.from_tensor(old_fake)`` is the path dynamo uses to re-fakeify a
    FakeTensor of another mode. With the ShapeEnv shared, torch's meta
    converter reuses the SymInts of the old value as they are (no new
    symbols, no guards), keeps requires_grad and leafness, and memoizes per
    storage, so two values sharing a storage get one shared meta storage
    (and one value reached twice, such as a tuple element and the getitem
    that reads it, becomes one new value). That memo is weak, so every new
    value is kept alive until all are made. Export's values are plain
    tensors; a value that is an autograd view of another (``_base`` set) is
    rebuilt as a view, which dispatches ``as_strided`` to ``new``.
    The result is checked against the contract anyway: a future torch that
    re-symbolized or un-aliased would fail loudly here instead of quietly
    changing the program.
    """
    made: list[tuple[torch.Tensor, torch.Tensor, str]] = []

    def twin(where: str) -> Callable[[torch.Tensor], torch.Tensor]:
        def convert(t: torch.Tensor) -> torch.Tensor:
            out = new.from_tensor(t)
            constant = getattr(t, "constant", None)
            if constant is not None and isinstance(out, _ft.FakeTensor) and out.constant is None:
                # Constant propagation (e.g. `.item()` on a lifted scalar)
                # must behave as it did under the original mode.
                out.constant = constant
            made.append((t, out, where))
            return out

        return convert

    # Outside any active fake mode: the converter must see plain FakeTensors,
    # not dispatch into whichever mode the caller happens to be inside. With
    # the new mode's cache off, rebuilding a view leaves no entry and no
    # statistic behind: cache_report() starts empty.
    with _ft.unset_fake_temporarily(), _ft.disable_fake_tensor_cache(new):
        replaced = [(site, _replace(site.meta[site.key], twin(site.where))) for site, _ in sites]
    _check_twins(made)
    for site, value in replaced:
        site.meta[site.key] = value
    for site in mode_refs:
        if site.meta[site.key] is old:
            site.meta[site.key] = new


def _replace(value: object, convert: Callable[[torch.Tensor], torch.Tensor]) -> object:
    # Most sites hold one value (meta["val"]); a tensor is a pytree leaf, so
    # converting it directly is what tree_map_only would do, without the
    # flatten/unflatten round trip.
    if isinstance(value, torch.Tensor):
        return convert(value)
    return pytree.tree_map_only(_is_fake, convert, value)


def _check_twins(made: list[tuple[torch.Tensor, torch.Tensor, str]]) -> None:
    """Raises RuntimeError unless each new value matches its original and the
    storage-sharing pattern is unchanged (see Note [Re-fakeifying through torch's converter])."""
    new_for_old: dict[int, int] = {}
    old_for_new: dict[int, int] = {}
    for old, new, where in made:
        diffs = [
            f"{what} {b} (original {a})"
            for what, a, b in (
                ("dtype", old.dtype, new.dtype),
                ("device", old.device, new.device),
                ("layout", old.layout, new.layout),
                ("requires_grad", old.requires_grad, new.requires_grad),
            )
            if a != b
        ]
        for what, a_seq, b_seq in (
            ("shape", old.shape, new.shape),
            ("stride", old.stride(), new.stride()),
            ("storage_offset", (old.storage_offset(),), (new.storage_offset(),)),
        ):
            if len(a_seq) != len(b_seq) or not all(map(_same_int, a_seq, b_seq)):
                diffs.append(f"{what} {tuple(b_seq)} (original {tuple(a_seq)})")
        if diffs:
            raise RuntimeError(f"{_API}: the re-created value of {where} differs from the original: {'; '.join(diffs)}")
        if not is_fake_tensor(old):
            continue  # a wrapper subclass: its inner tensors carry the storages
        o, n = storage_id(old), storage_id(new)
        if new_for_old.setdefault(o, n) != n or old_for_new.setdefault(n, o) != o:
            raise RuntimeError(
                f"{_API}: the re-created value of {where} does not share storage with the "
                "same values as the original"
            )


def _same_int(a: object, b: object) -> bool:
    return _int_key(a) == _int_key(b)


def _int_key(v: object) -> object:
    # Compare symbolic sizes by expression: `a == b` on SymInts would ask
    # the ShapeEnv and could install a guard. A SymInt the ShapeEnv has
    # since pinned to a number (a guard replaced its symbol) compares equal
    # to that int: the converter hands such sizes back as plain ints.
    if isinstance(v, torch.SymInt):
        expr = v.node.expr
        return int(expr) if expr.is_number else expr
    return v

