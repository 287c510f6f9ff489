"""``adopt``: move an exported program onto a policy ``FakeTensorMode``.

``torch.export`` creates a stock mode, and later ExportPasses and ``run_decompositions`` reuse the mode of the
FakeTensors in the node metadata; after ``adopt`` they run, and cache, under the policy mode.

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

from torch_cachepolicy._arguments import check_cache_arguments, check_feature
from torch_cachepolicy._compat import Feature
from torch_cachepolicy._fakes import is_fake_tensor
from torch_cachepolicy.mode import FakeTensorMode
from torch_cachepolicy.policy import CachePolicy
from torch_cachepolicy.store import CacheStore

__all__ = ["adopt"]

_API = "torch_cachepolicy.adopt(...)"

# Settings the new mode inherits, and how to read each from a mode (`export` lives on its converter).
_INHERITED: dict[str, Callable[[_ft.FakeTensorMode], object]] = {
    "allow_fallback_kernels": lambda m: m.allow_fallback_kernels,
    "allow_non_fake_inputs": lambda m: m.allow_non_fake_inputs,
    "shape_env": lambda m: m.shape_env,
    "static_shapes": lambda m: m.static_shapes,
    "export": lambda m: m.fake_tensor_converter.export,
}
_MODE_KWARGS = frozenset(_INHERITED) | {"cache_crosscheck"}  # FakeTensorMode's keywords but policy and store


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

    Finds the one FakeTensorMode whose FakeTensors fill the node metadata (HOP subgraphs included), creates a
    policy mode sharing its ShapeEnv and settings, and hands each value to the new mode: the same FakeTensor
    objects, metadata, storage sharing and all, now dispatch through it (Note [Moving values rather than copying
    them]); the graph is untouched. A program already on a policy mode keeps it, under ``cache_policy`` if given.

    Args:
        program: an ``ExportedProgram`` or a ``torch.fx.GraphModule`` carrying fake values.
        cache_policy: the new mode's policy (``None``: ``CachePolicy()``, or keep the adopted mode's).
        cache_store: the new mode's store; ``None`` gives it a private one.
        **mode_kwargs: ``FakeTensorMode`` arguments overriding the copied settings (``shape_env`` only the original's).

    Returns:
        The policy mode that now owns the program's fake values.

    Raises:
        TypeError: an argument has the wrong type or names no ``FakeTensorMode`` argument.
        ValueError: no FakeTensor, several modes, or ``cache_store``/``mode_kwargs`` that contradict an adopted mode.
            The program is unchanged on any error.
        RuntimeError: this torch changed an internal the function needs (Note [Checking torch's internals]).
    """
    check_feature(_API, Feature.EXPORT)
    gm = _graph_module(program)
    check_cache_arguments("torch_cachepolicy.adopt", cache_policy, cache_store, mode_kwargs.get("cache_crosscheck"))
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
    # The epoch is part of keys with symbols and dates unbacked memos: the new mode continues the trace.
    new.epoch = old.epoch
    # The constructor reads it from torch's config; torch.export's mode has it off (data_ptr() raises).
    new._allow_unsafe_data_ptr_access = old._allow_unsafe_data_ptr_access
    _move(sites, mode_refs, old, new)
    return new


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
    # HOP subgraphs (cond branches, while_loop bodies) hold the same mode's values; ExportPass re-dispatches them.
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
            # The mode itself may be here (dynamo's functional export: gm.meta["fake_mode"]); it must follow its values.
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


_ATOMS = frozenset({type(None), str, int, float, bool, torch.dtype, torch.device, torch.layout, torch.Size})
# Exact types whose pytree children are their items (mapping values) in order; TensorMetadata: meta["tensor_meta"].
_SEQUENCES = frozenset({tuple, list, immutable_list, TensorMetadata})
_MAPPINGS = frozenset({dict, immutable_dict})


def _collect_fakes(value: object, out: list[torch.Tensor]) -> None:
    # Most meta values are tensors or plain containers of strings, ints and types (nn_module_stack, tensor_meta):
    # walking those visits pytree's leaves in its order, far cheaper; other containers are left to pytree.
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


def _move(
    sites: list[tuple[_Site, list[torch.Tensor]]],
    mode_refs: list[_Site],
    old: _ft.FakeTensorMode,
    new: FakeTensorMode,
) -> None:
    """Hands every fake value of ``old`` in ``sites`` to ``new``."""
    # Note [Moving values rather than copying them]
    # ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    # A FakeTensor dispatches to the mode its `fake_mode` names; nothing else in it is the mode's. Its meta tensor,
    # storage, view base, requires_grad and leafness are its own, its symbolic sizes are the ShapeEnv's (shared), and
    # its memos are dated by the epoch (continued). So a value moves by setting that one attribute: metadata, storage
    # sharing and identity stay by construction, and no dispatch or symbol is involved. Re-creating each value with
    # torch's converter (new.from_tensor) cost 0.7 ms a value (2.4 with symbolic sizes), a fifth of the export stage.
    # The tensors a value's ops can reach move with it: a wrapper subclass's inner tensors, a view's base, a leaf's
    # .grad. Everything is found before anything is set, so an error leaves the program unchanged; a value the
    # caller also holds elsewhere moves with it. The old mode forgets the moved values (its converter's memo would
    # hand them back for their real tensors): it converts those afresh, into values of its own.
    moved: dict[int, _ft.FakeTensor] = {}
    for _, fakes in sites:
        for value in fakes:
            _fake_tensors(value, moved)
    memo = old.fake_tensor_converter.tensor_memo
    forget = [tid for tid, fake in list(memo.items()) if moved.get(id(fake)) is fake]
    for fake in moved.values():
        fake.fake_mode = new
    for tid in forget:
        memo.pop(tid, None)
    for site in mode_refs:
        if site.meta[site.key] is old:
            site.meta[site.key] = new


def _fake_tensors(value: torch.Tensor, out: dict[int, _ft.FakeTensor]) -> None:
    if isinstance(value, _ft.FakeTensor):
        if id(value) not in out:
            out[id(value)] = value
            # A view's base and a leaf's .grad are tensors of the same mode that an op on the value may reach.
            for other in (value._base, value._grad):
                if isinstance(other, _ft.FakeTensor):
                    _fake_tensors(other, out)
        return
    names, _ = value.__tensor_flatten__()  # type: ignore[attr-defined]  # a traceable wrapper subclass (_is_fake)
    for name in names:
        _fake_tensors(getattr(value, name), out)
