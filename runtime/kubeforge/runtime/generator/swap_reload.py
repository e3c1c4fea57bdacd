"""Swap reload: build the next weights' kernels beside the serving model, then swap them in between batches.

Role: on CPU vLLM packs every linear weight into an opaque oneDNN handle (``layer.cpu_linear`` closes over it; the
layer's ``weight`` is emptied), so a sync must materialise model-format weights, load them and repack. vLLM's own
layer-wise reload does that on the serving model, in the generation pause. A :class:`ShadowModel` does the same work
on a *shadow* of the model, in the weight receiver's background thread (``weightsync.WeightReceiver.prefetch``)
while the engine keeps generating with the old weights; :meth:`ShadowModel.swap` then installs the result on the
serving model between batches: a reference swap of each layer's attributes that the post-load processing set
(``cpu_linear``: the new packed kernel) and an in-place copy of the small tensors the forward reads directly (norms,
embedding, biases). The pause per sync is that swap.

Neighbours: ``extension.WeightSyncExtension`` owns one per vLLM worker (built lazily in the background, on the first
sync); ``weightsync`` stages the received bytes.

How the shadow is made: a module tree parallel to the model (``copy.copy`` of each module with its own parameter,
buffer and child dicts; shared modules and tied parameters stay shared) whose parameters are real model-format
tensors: shapes, classes and attributes (``weight_loader``, ``output_dim``, ...) come from the metadata vLLM records
for its own reload (``LAYERWISE_INFO[layer].restore_metadata``), so the model's own ``load_weights`` (name mapping,
QKV / gate-up fusion, TP sharding, vocab padding) fills them, and each layer's ``quant_method.
process_weights_after_loading`` builds its kernel from them, as at start-up. Non-persistent buffers (rotary caches,
derived from the config) are shared, not loaded.

Layer by layer: the build runs while the sync is still arriving (``weights`` yields each bucket's tensors once it
has landed). Each packed layer's loaders count the elements they copy (a ``copy_`` counter on the build's thread),
and a layer is built the moment its tensors are whole, so only the last bucket's layers remain once the wire is
done. Layers whose count never completes (vocabulary padding) are built after the load. Shadows of the very same
tensors with the same method (a tied lm_head and the embedding) are twins: one kernel, built once, serves both.

Received in place (``aliases``): given the sync's layout (``build(..., layout=)``), the first build of a layout
records the loaders' copies; shadow tensors that are identity copies of one place of the receive buffers become views
of it, and later builds of that layout hand the loaders only the tensors not routed that way (none for a Llama) and
build each layer made of views as soon as its last tensor has landed: no copy and no Python per tensor.

Invariants:
- Nothing on the serving model changes before :meth:`swap`, which runs on the engine's thread between batches; a
  sync that fails to load (unknown names, wrong shapes, non-float dtypes, missing tensors) raises before the swap and
  leaves the engine serving the old weights whole.
- Memory (bounded): one model-format copy of the weights (allocated on the first sync, reused by every later one:
  no page faults after it; once a layout's plan is learned, only the tensors that are not views of the receive
  buffers keep it), plus, between a sync's build and its swap, the new packed kernels beside the old ones (the
  swap hands the old ones to the next build, which frees them before it packs: freeing is no part of the pause).
- Supported layers: unquantized linear and embedding methods (the ones vLLM packs on CPU) and modules whose tensors
  the forward reads as they are (norms). Anything else (quantized layers, LoRA-wrapped layers) raises
  :class:`Unsupported` at construction; the caller then uses vLLM's in-place reload.
"""
from __future__ import annotations

import contextlib
import copy
import itertools
import time
from collections.abc import Iterator
from types import MethodType
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from kubeforge.runtime import weightsync
from kubeforge.runtime.generator import aliases

SUPPORTED_METHODS = ("UnquantizedLinearMethod", "UnquantizedEmbeddingMethod")
_MODULE_DICTS = ("_parameters", "_buffers", "_modules", "_non_persistent_buffers_set")


class Unsupported(RuntimeError):
    """The model has layers the swap reload does not know how to rebuild."""


class LoadError(ValueError):
    """The received weights do not fit the model (nothing on the serving model changed)."""


class ShadowModel:
    """A model-format shadow of a vLLM model: :meth:`build` the next weights into it (any thread), :meth:`swap`
    them into the serving model (the engine's thread, between batches)."""

    def __init__(self, model: torch.nn.Module) -> None:
        from vllm.model_executor.model_loader.reload.layerwise import LAYERWISE_INFO

        self.live = model
        self._info: Any = LAYERWISE_INFO
        self._shadows: dict[int, torch.nn.Module] = {}      # id(live module) -> shadow
        self._tensors: dict[int, torch.Tensor] = {}          # id(live tensor) -> shadow tensor (ties stay tied)
        self.pairs: list[tuple[torch.nn.Module, torch.nn.Module]] = []   # (live, shadow), every module once
        self.slots: list[tuple[torch.nn.Module, str, torch.Tensor]] = []  # (shadow, name, persistent tensor)
        self.processed: list[torch.nn.Module] = []           # shadows whose quant method repacks after loading
        self.root = self._shadow(model)
        self.bytes = sum(t.numel() * t.element_size() for t in self._tensors.values())
        self.built = False
        self._plan: tuple[list[tuple[torch.Tensor, torch.Tensor]], list[tuple[torch.nn.Module, str, Any]]] = ([], [])
        # layer by layer: each processed shadow is built as soon as its tensors are loaded (counted per tensor)
        self._owners: dict[int, list[torch.nn.Module]] = {}   # id(shadow tensor) -> processed shadows holding it
        self._need: dict[int, int] = {}                        # id(shadow tensor) -> elements a full load copies
        self._loaded: dict[int, int] = {}                      # ... copied so far in this build
        self._done: set[int] = set()                           # id(shadow) processed in this build
        self._twins: dict[int, torch.nn.Module] = {}           # id(shadow) -> earlier shadow of the same tensors
        self._set_by: dict[int, dict[str, Any]] = {}           # id(shadow) -> attributes its processing set
        self._counting = False
        self.late_layers: list[str] = []                       # last build: layers built after the whole load
        self.aliases: aliases.Plan | None = None               # learned from a build of the current layout
        self._aliased: list[tuple[torch.Tensor, tuple[int, int]]] = []   # shadow tensors viewing the buffers
        self._alias_buffers: list[torch.Tensor] = []
        self.replayed = False                                  # last build followed a learned plan
        self._retired: list[Any] = []                          # what the last swap replaced (old kernels)
        self._layerwise()

    # ------------------------------------------------------------ construction

    def _shadow(self, live: torch.nn.Module) -> torch.nn.Module:
        known = self._shadows.get(id(live))
        if known is not None:
            return known
        method = getattr(live, "quant_method", None)
        has_tensors = any(t is not None for t in live._parameters.values())
        if method is not None and has_tensors and type(method).__name__ not in SUPPORTED_METHODS:
            raise Unsupported(f"{type(live).__name__} uses {type(method).__name__}")
        if type(live).__name__.endswith("WithLoRA"):
            raise Unsupported(f"{type(live).__name__} is LoRA-wrapped")
        shadow = copy.copy(live)
        shadow.__dict__.update({"_parameters": {}, "_buffers": {}, "_modules": {},
                                "_non_persistent_buffers_set": set(live._non_persistent_buffers_set)})
        self._shadows[id(live)] = shadow
        self.pairs.append((live, shadow))
        info = self._info.get(live)
        meta_params, meta_buffers = info.restore_metadata if info is not None else ({}, {})
        for name, child in live._modules.items():
            shadow._modules[name] = None if child is None else self._shadow(child)
        params: dict[str, Any] = shadow._parameters
        for name, param in live._parameters.items():
            params[name] = None if param is None else self._tensor(live, shadow, name, param, meta_params.get(name))
        for name, buffer in live._buffers.items():
            if buffer is None or name in live._non_persistent_buffers_set:
                shadow._buffers[name] = buffer          # derived from the config, never loaded: shared
            else:
                shadow._buffers[name] = self._tensor(live, shadow, name, buffer, meta_buffers.get(name))
        if method is not None and has_tensors and hasattr(method, "process_weights_after_loading"):
            self.processed.append(shadow)
        return shadow

    def _tensor(self, live: torch.nn.Module, shadow: torch.nn.Module, name: str, tensor: torch.Tensor,
                meta: torch.Tensor | None) -> torch.Tensor:
        """The shadow of one live tensor, in model format (the recorded metadata's shape when the live one was
        repacked away), initialised from the live values where they are still there (vocab padding rows)."""
        known = self._tensors.get(id(tensor))
        if known is None:
            like = meta if meta is not None else tensor
            data = torch.zeros(tuple(like.shape), dtype=like.dtype)
            if tuple(tensor.shape) == tuple(like.shape) and tensor.dtype == like.dtype:
                data.copy_(tensor.detach())
            data.__class__ = like.__class__ if isinstance(like, torch.nn.Parameter) else torch.Tensor
            data.__dict__ = dict(like.__dict__)
            _rebind(data, live, shadow)
            self._tensors[id(tensor)] = known = data
        self.slots.append((shadow, name, known))
        return known

    def _layerwise(self) -> None:
        """Count the elements each processed shadow's loaders copy (their ``weight_loader`` wrapped), so a layer
        is built as soon as it is whole, while later layers are still on the wire. Shadows holding the very same
        tensors with the same method (a tied lm_head and embedding) are twins: the second shares the first's
        kernel instead of packing the same weight again."""
        from vllm.model_executor.model_loader.weight_utils import default_weight_loader

        seen: dict[tuple[str, tuple[int, ...]], torch.nn.Module] = {}
        for shadow in self.processed:
            tensors = [t for t in shadow._parameters.values() if t is not None]
            for t in tensors:
                holders = self._owners.setdefault(id(t), [])
                holders.append(shadow)
                if len(holders) == 1:
                    self._need[id(t)] = int(getattr(t, "weight_loader_numel", t.numel()))
                    loader = getattr(t, "weight_loader", None) or default_weight_loader
                    t.weight_loader = self._counted(id(t), loader)  # type: ignore[attr-defined]
            key = (type(getattr(shadow, "quant_method")).__name__, tuple(id(t) for t in tensors))
            if key in seen:
                self._twins[id(shadow)] = seen[key]
            else:
                seen[key] = shadow

    def _counted(self, key: int, loader: Any) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
            if not self._counting:
                return loader(*args, **kwargs)
            built = [owner for owner in self._owners[key] if id(owner) in self._done]
            if built:   # its kernel would not see this load
                raise LoadError(f"{type(built[0]).__name__} was loaded again after it was built")
            with _CopyCount() as count:
                out = loader(*args, **kwargs)
            self._loaded[key] = self._loaded.get(key, 0) + count.numel
            if self._loaded[key] >= self._need[key]:
                for owner in self._owners[key]:
                    if self._whole(owner):
                        with _disable_current_modes():   # a recording build: the packing is not recorded
                            self._process(owner)
            return out

        return counted

    def _whole(self, shadow: torch.nn.Module) -> bool:
        return id(shadow) not in self._done and all(
            self._loaded.get(id(t), 0) >= self._need[id(t)] for t in shadow._parameters.values() if t is not None)

    def _process(self, shadow: torch.nn.Module) -> None:
        """Build one layer's kernel from its loaded shadow tensors (a twin takes its twin's, when that one's
        processing left its tensors in place)."""
        self._done.add(id(shadow))
        twin = self._twins.get(id(shadow))
        if twin is not None and id(twin) not in self._done:
            self._process(twin)
        if twin is not None and id(twin) in self._set_by:
            shadow.__dict__.update(self._set_by[id(twin)])
            return
        before = dict(shadow.__dict__)
        tensors = {k: dict(shadow.__dict__[k]) for k in ("_parameters", "_buffers")}
        _call(getattr(shadow, "quant_method"), "process_weights_after_loading", shadow)
        if hasattr(shadow, "update_param_tp_status"):
            _call(shadow, "update_param_tp_status")
        if all(shadow.__dict__[k].get(n) is t for k, d in tensors.items() for n, t in d.items()):
            self._set_by[id(shadow)] = {k: v for k, v in shadow.__dict__.items()
                                        if k not in _MODULE_DICTS and before.get(k, _MISSING) is not v}

    # ------------------------------------------------------------ build (background) and swap (between batches)

    def build(self, weights: Iterator[tuple[str, torch.Tensor]], *, layout: aliases.Layout | None = None) -> float:
        """Load ``weights`` (HF names, checkpoint format) into the shadow and build every layer's kernels from it,
        each layer as soon as its tensors are loaded (``weights`` may still be arriving: layers build while later
        ones are on the wire); returns the seconds it took. :class:`LoadError` when the weights do not fit (the
        serving model untouched).

        ``layout``: where ``weights`` lie in the receive buffers (they are views of them). The first build of a
        layout records the loaders' copies (:mod:`aliases`); from then on, the shadow tensors that are byte for byte
        one place of the buffers are views of it (the loaders' copies onto them are no-ops), and when the loaders
        only routed bytes, later builds of that layout skip them and build each layer once its last tensor landed."""
        start = time.perf_counter()
        self._retired.clear()           # the kernels the last swap replaced: freed here, off the pause
        with torch.no_grad():           # grad mode is per thread: this runs in the receiver's thread
            for shadow, name, tensor in self.slots:   # processing emptied the packed weights: put ours back
                where: dict[str, Any] = shadow._parameters if name in shadow._parameters else shadow._buffers
                where[name] = tensor
            for shadow in self.processed:
                shadow.__dict__.pop("_already_called_process_weights_after_loading", None)
            before = [dict(shadow.__dict__) for _, shadow in self.pairs]
            self.built = False
            self._loaded, self._done, self._set_by = {}, set(), {}
            plan = self.aliases if layout is not None and self.aliases is not None and (
                self.aliases.key == layout.key) else None
            if plan is None:
                self._unalias()
            self.replayed = plan is not None
            if plan is not None:
                self._replay(weights, plan)
            else:
                self._load(weights, layout)
            self._keep_aliases()
        self._plan = self._swap_plan(before)
        self.built = True
        return time.perf_counter() - start

    def _load(self, weights: Iterator[tuple[str, torch.Tensor]], layout: aliases.Layout | None) -> None:
        """Load through the model's loaders, each layer built once whole; with ``layout``, recorded, and the shadow's
        tensors that turn out to be identity copies of the buffers become views of them (:mod:`aliases`)."""
        own = list(self._tensors.values())
        recorder = aliases.Recorder(targets=own, buffers=layout.buffers) if layout is not None else None
        layers = [(shadow, [t for t in shadow._parameters.values() if t is not None]) for shadow in self.processed]
        where = {id(t): int(t.data_ptr()) for t in own}
        with recorder if recorder is not None else contextlib.nullcontext():
            self._loaders(weights, check=True)
        self._build_late()
        if recorder is not None and layout is not None:
            rebound = {id(t) for t in own if int(t.data_ptr()) != where[id(t)]}   # processing replaced its memory
            self.aliases = aliases.learn(key=layout.key, recorder=recorder, places=layout.places, layers=layers,
                                         rebound=rebound)
            self._alias(layout.buffers)

    def _replay(self, weights: Iterator[tuple[str, torch.Tensor]], plan: aliases.Plan) -> None:
        """A build that follows a learned plan: the routed tensors land in the shadow's own memory (its views of the
        buffers), so only the others go through the loaders; a layer made of aliases only is built once the last
        of its tensors has landed (``weights`` waits for each bucket and applies a delta)."""
        def rest() -> Iterator[tuple[str, torch.Tensor]]:
            for i, item in enumerate(weights):
                for shadow in plan.ready.get(i, ()):
                    if id(shadow) not in self._done:
                        self._process(shadow)
                if i not in plan.routed:
                    yield item

        feed = rest()
        first = next(feed, None)
        if first is not None:   # the plan was learned from a build of this very layout: its checks passed there
            self._loaders(itertools.chain([first], feed), check=False)
        self._build_late()

    def _loaders(self, weights: Iterator[tuple[str, torch.Tensor]], *, check: bool) -> None:
        """The model's ``load_weights`` over ``weights``, counted (each layer built once whole); ``check``: refuse a
        sync that lacks weights or whose loaders wrote elsewhere."""
        seen: list[str] = []
        tensors = {name: id(t) for name, t in self.root.named_parameters()}
        self._counting = True
        try:
            loaded = _call(self.root, "load_weights", _checked(weights, seen))
        except (LoadError, weightsync.WeightSyncError):   # a misfit we named, or the wire broke under the build
            raise
        except Exception as e:      # noqa: BLE001 - vLLM's loaders raise KeyError/AssertionError/ValueError
            at = f" at {seen[-1]!r}" if seen else ""
            raise LoadError(f"the weights do not fit the model{at}: {type(e).__name__}: {e}") from e
        finally:
            self._counting = False
        if loaded is not None and check:
            missing = sorted({n for n, _ in self.root.named_parameters()} - set(loaded))
            if missing:
                raise LoadError(f"the sync lacks {len(missing)} of the model's weights: {', '.join(missing[:5])}"
                                + (" ..." if len(missing) > 5 else ""))
            nothing = [n for n in loaded if tensors.get(n) in self._need and not self._loaded.get(tensors[n])]
            if nothing:     # its loaders wrote elsewhere: a kernel built from this shadow would be stale
                raise Unsupported(f"the loaders of {nothing[0]} copied nothing into the shadow")

    def _build_late(self) -> None:
        """Build the layers not built yet (loads that never reached their count, e.g. padding rows)."""
        late = [shadow for shadow in self.processed if id(shadow) not in self._done]
        for shadow in late:
            if id(shadow) not in self._done:
                self._process(shadow)
        self.late_layers = [type(shadow).__name__ for shadow in late]

    def _alias(self, buffers: list[torch.Tensor]) -> None:
        """Point every aliasable shadow tensor at its place in the buffers (its own memory is freed)."""
        assert self.aliases is not None
        by_id = {id(t): t for t in self._tensors.values()}
        self._aliased = [(by_id[tid], place) for tid, place in self.aliases.views.items()]
        self._alias_buffers = buffers
        for tensor, place in self._aliased:
            aliases.alias(tensor, buffers, place)

    def _keep_aliases(self) -> None:
        """After a build: if the processing replaced an aliased tensor's memory, learn again next time."""
        if any(not aliases.is_alias(t, self._alias_buffers, place) for t, place in self._aliased):
            self._unalias()

    def _unalias(self) -> None:
        """Give every aliased shadow tensor memory of its own again (a new layout, or an alias lost)."""
        for tensor, _ in self._aliased:
            tensor.data = tensor.data.clone()
        self._aliased, self._alias_buffers, self.aliases = [], [], None

    def _swap_plan(self, before: list[dict[str, Any]]) -> tuple[list[tuple[torch.Tensor, torch.Tensor]],
                                                                 list[tuple[torch.nn.Module, str, Any]]]:
        """What :meth:`swap` will do, checked before anything changes: tensors to copy in place (live, new) and
        the attributes this build's loading and processing set (module, name, new value)."""
        copies: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        attrs: list[tuple[torch.nn.Module, str, Any]] = []
        for (live, shadow), was in zip(self.pairs, before):
            for kind in ("_parameters", "_buffers"):
                for name, new in shadow.__dict__[kind].items():
                    old = live.__dict__[kind].get(name)
                    if new is None or old is None or new is old or id(old) in copies:
                        continue
                    if tuple(old.shape) != tuple(new.shape) or old.dtype != new.dtype:
                        raise Unsupported(f"{type(live).__name__}.{name} is {tuple(new.shape)} {new.dtype} after "
                                          f"processing, the engine's is {tuple(old.shape)} {old.dtype}")
                    if old.numel():
                        copies[id(old)] = (old, new)
            for name, value in shadow.__dict__.items():
                if name not in _MODULE_DICTS and was.get(name, _MISSING) is not value:
                    attrs.append((live, name, value))
        return list(copies.values()), attrs

    def swap(self) -> int:
        """Install the built weights on the serving model (engine thread, between batches); returns the bytes
        copied in place."""
        if not self.built:
            raise RuntimeError("swap() without a successful build()")
        copies, attrs = self._plan
        with torch.no_grad():
            for live_tensor, new in copies:
                live_tensor.copy_(new)
        for module, name, value in attrs:   # the old kernels are freed by the next build, not in the pause
            self._retired.append(module.__dict__.get(name))
            module.__dict__[name] = value
        self.built = False
        self._plan = ([], [])
        return sum(t.numel() * t.element_size() for t, _ in copies)


_MISSING = object()


class _CopyCount(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Counts the elements that ``copy_`` writes on this thread while active (a loader's narrowing and fusing
    happen before its copy, so this is what it loaded into its parameter)."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.numel = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is torch.ops.aten.copy_.default:
            self.numel += args[0].numel()
        return func(*args, **(kwargs or {}))


def _call(obj: Any, method: str, *args: Any) -> Any:
    """``obj.method(*args)`` for vLLM's untyped module methods."""
    return getattr(obj, method)(*args)


def _checked(weights: Iterator[tuple[str, torch.Tensor]], seen: list[str]) -> Iterator[tuple[str, torch.Tensor]]:
    """The weights as they are, refusing non-float tensors (the model's weights are floating point; a float of
    another width is cast by the loaders, as vLLM's own reload does) and a name sent twice (its layer may be built
    already); records each name for error messages."""
    names: set[str] = set()
    for name, tensor in weights:
        if name in names:
            raise LoadError(f"weight {name!r} is sent twice")
        names.add(name)
        seen.append(name)
        if not tensor.is_floating_point():
            raise LoadError(f"weight {name!r} has dtype {tensor.dtype}; the model's weights are floating point")
        yield name, tensor


def _rebind(tensor: torch.Tensor, live: torch.nn.Module, shadow: torch.nn.Module) -> None:
    """Point the tensor's bound-method attributes (``weight_loader``) at the shadow module: vLLM binds them to the
    layer, or (in recorded metadata) to a sentinel that its reload rebinds the same way. An in-place reload leaves
    its own wrapper on the recorded metadata (it buffers loads for the live layer and drops them once that reload
    is over): unwrapped, or the shadow's loads would go nowhere."""
    from vllm.model_executor.model_loader.reload.sanitize import layer_ref_sentinel

    for key, value in list(tensor.__dict__.items()):
        while callable(value) and getattr(value, "__name__", "") == "online_process_loader":
            value = tensor.__dict__[key] = value.__wrapped__   # vLLM's reload wrapper, left on its metadata
        if isinstance(value, MethodType) and (value.__self__ is live or value.__self__ is layer_ref_sentinel):
            tensor.__dict__[key] = value.__func__.__get__(shadow)
