"""The vLLM worker extension: the generator end of weight sync, running inside each vLLM worker process.

vLLM mixes :class:`WeightSyncExtension` into its worker class (engine option ``worker_extension_cls``); the
``Engine`` reaches its methods with ``llm.collective_rpc("kf_...")``, once per worker. Every method is prefixed
``kf_`` so none collides with the worker's own (``reload_weights``, ``update_weights``, ...); vLLM refuses
collisions at start-up. Arguments and results are plain values (str/int/float/dict): they may cross a process
boundary through vLLM's RPC, which never needs pickle for them.

Loading, swap reload (the default; ``swap_reload.ShadowModel``): while a sync is received in the background, the same
background thread loads it, bucket by bucket as they land, into a model-format shadow of the model through the
model's own ``load_weights`` and builds each layer's packed kernel there (``process_weights_after_loading``) as
soon as that layer is whole, while the engine keeps generating with the old weights; ``kf_receive_weights`` (between batches) swaps the new kernels in and copies the small tensors
(norms, embedding, biases) in place: that swap is the generation pause. A sync that does not fit the model (names,
shapes, dtypes, missing weights) fails its build, ``kf_receive_weights`` raises and the engine keeps the old weights
whole. A model the shadow does not support (quantized or LoRA-wrapped layers) falls back to the in-place reload.

Loading, in-place reload (the fallback, and ``swap=False``; why each step is needed, all checked by
tests/runtime/test_weightsync.py):
1. ``reload_weights(weights_iterator=..., is_checkpoint_format=True)``: HF-named tensors go through the model's
   own ``load_weights`` (name mapping, QKV/gate-up fusion, TP sharding), then vLLM re-runs the post-load
   processing, which on CPU repacks linear weights for oneDNN. A plain ``model.load_weights`` skips that repack
   and leaves the model half-updated.
2. Tied weights: a module that shares its ``weight`` Parameter with another (lm_head tied to the embedding) is not
   "loaded" by name, so its repacked copy stays stale while checksums look right; we re-run its
   ``quant_method.process_weights_after_loading``.
3. The Engine resets the prefix cache after the RPC returns (cached blocks hold keys/values of the old weights).

Prefetch: once joined, and again after every load, the worker's ``WeightReceiver`` receives the next sync in a
background thread (``weightsync.WeightReceiver.prefetch``) into its reusable buffers while the engine keeps
generating; ``kf_receive_weights`` then only waits for whatever has not arrived yet and loads from the buffers, so
the generation pause per sync is the load, not the wire (nor the trainer's snapshot before it).

LoRA (``spec.model.lora``): the base weights never change; a sync carries the adapter tensors only, which
``kf_receive_adapter`` writes as a PEFT folder (``models.adapter``); the Engine then serves it as a new vLLM ``LoRARequest``.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import pathlib
from collections.abc import Iterator
from typing import Any

import torch

from kubeforge.runtime import weightsync
from kubeforge.runtime.generator import aliases, swap_reload
from kubeforge.runtime.models import adapter

log = logging.getLogger(__name__)


class WeightSyncExtension:
    """Mixed into vLLM's worker: ``self`` is the worker (``self.model_runner``, ``self.reload_weights``)."""

    _kf_receiver: weightsync.WeightReceiver | None = None
    _kf_shadow: swap_reload.ShadowModel | None = None
    _kf_swap: bool = True          # swap reload wanted (and supported, as far as known)

    def kf_join_weight_sync(self, host: str, port: int, world_size: int, rank_base: int, timeout: float,
                            join_timeout: float = weightsync.DEFAULT_JOIN_TIMEOUT, backend: str = "gloo",
                            epoch: int = 0, swap: bool = True) -> int:
        """Join epoch ``epoch`` of the weight-sync group as rank ``rank_base + tp_rank``; blocks until the whole
        group has joined (at most ``join_timeout``). ``swap=False``: load every sync with vLLM's in-place reload
        (no shadow, no extra memory)."""
        self.kf_leave_weight_sync()
        rank = rank_base + _tp_rank()
        self._kf_receiver = weightsync.WeightReceiver(
            host=host, port=port, world_size=world_size, rank=rank, timeout=timeout, join_timeout=join_timeout,
            backend=backend, epoch=epoch)
        self._kf_swap = swap
        if not swap:
            self._kf_shadow = None
        self._kf_receiver.prefetch(self._kf_prepare)
        return rank

    def kf_weights_staged(self) -> bool:
        """The next sync has arrived whole in the background and its kernels are built (loading it will not wait
        for the wire nor repack)."""
        return self._kf_receiver is not None and self._kf_receiver.staged

    def _kf_prepare(self, staged: weightsync.Staged) -> swap_reload.ShadowModel | None:
        """In the receiver's background thread: build the staged weights into the shadow (None: in-place reload)."""
        if not self._kf_swap:
            return None
        if self._kf_shadow is None:
            try:
                self._kf_shadow = swap_reload.ShadowModel(self.model_runner.get_model())  # type: ignore[attr-defined]
            except swap_reload.Unsupported as e:
                log.warning("weight sync: swap reload not supported for this model (%s); reloading in place", e)
                self._kf_swap = False
                return None
        try:
            self._kf_shadow.build(staged.tensors(), layout=aliases.layout(staged))
        except swap_reload.Unsupported as e:
            log.warning("weight sync: swap reload not supported for this model (%s); reloading in place", e)
            self._kf_swap, self._kf_shadow = False, None
            return None
        return self._kf_shadow

    def kf_receive_weights(self, refresh_tied: bool = True, load: bool = True, swap: bool = True) -> dict[str, Any]:
        """Receive one sync and load it (swap reload, or in place); returns ``SyncStats.as_dict()``.

        ``swap=False`` loads this sync with the in-place reload even when its kernels were built (benchmarks and
        tests compare the two). ``refresh_tied=False`` (tests only: it shows the stale tied head) implies it and
        skips step 2 above. ``load=False`` receives and discards (the benchmark's split of wire time from loading)."""
        if self._kf_receiver is None:
            raise RuntimeError("kf_receive_weights before kf_join_weight_sync")
        receiver = self._kf_receiver

        def discard(weights: Iterator[tuple[str, torch.Tensor]]) -> None:
            for _ in weights:
                pass

        def reload(weights: Iterator[tuple[str, torch.Tensor]]) -> None:
            self.reload_weights(weights_iterator=weights, is_checkpoint_format=True)  # type: ignore[attr-defined]
            if refresh_tied:
                refresh_shared_weights(self.model_runner.get_model())  # type: ignore[attr-defined]

        try:
            if load and swap and refresh_tied and receiver.prefetching:
                staged = receiver.take()
                if staged.prepare_error is not None:
                    raise weightsync.WeightSyncError(f"weight sync v{staged.version}: refused, the engine keeps "
                                                     f"its weights: {staged.prepare_error}") from staged.prepare_error
                built = staged.prepared
                if isinstance(built, swap_reload.ShadowModel) and built.built:
                    stats = receiver.load_staged(staged, lambda _: self._kf_install(built))
                    return dataclasses.replace(stats, swapped=True).as_dict()
                return receiver.load_staged(staged, reload).as_dict()
            return receiver.receive(reload if load else discard).as_dict()
        finally:
            receiver.prefetch(self._kf_prepare)   # the buffers are free again: the next sync lands while generating

    def _kf_install(self, built: swap_reload.ShadowModel) -> None:
        """The swap (engine thread, between batches), then what vLLM's own reload resets after loading."""
        built.swap()
        runner = self.model_runner  # type: ignore[attr-defined]
        for reset in ("reset_encoder_cache", "reset_mm_cache"):
            getattr(runner, reset, lambda: None)()

    def kf_receive_adapter(self, directory: str, config_json: str) -> dict[str, Any]:
        """Receive one sync of LoRA adapter tensors and write them as a PEFT folder ``directory/v<version>`` (TP
        rank 0 writes; every rank receives); returns ``SyncStats.as_dict()`` plus ``path``."""
        if self._kf_receiver is None:
            raise RuntimeError("kf_receive_adapter before kf_join_weight_sync")
        return _receive_adapter(self._kf_receiver, directory, config_json)

    def kf_leave_weight_sync(self) -> None:
        if self._kf_receiver is not None:
            self._kf_receiver.close()
            self._kf_receiver = None

    # A GeneratorPool's engine (generator.pool): one receiver per attached job, each in that job's own weight-sync
    # group, authenticated with that job's key (never the env contract's: a pool engine has no job key of its own).

    def _kf_pool(self) -> dict[str, weightsync.WeightReceiver]:
        jobs: dict[str, weightsync.WeightReceiver] | None = self.__dict__.get("_kf_pool_receivers")
        if jobs is None:
            jobs = self.__dict__["_kf_pool_receivers"] = {}
        return jobs

    def kf_pool_join(self, job: str, host: str, port: int, world_size: int, rank_base: int, timeout: float,
                     join_timeout: float, backend: str, epoch: int, key_hex: str) -> int:
        """Join epoch ``epoch`` of ``job``'s weight-sync group (leaving its previous one), proving ``job``'s key."""
        self.kf_pool_leave(job)
        if not key_hex:
            raise weightsync.WeightSyncError(f"weight sync: job {job!r}: no key (a pool never joins unauthenticated)")
        rank = rank_base + _tp_rank()
        receiver = weightsync.WeightReceiver(host=host, port=port, world_size=world_size, rank=rank, timeout=timeout,
                                             join_timeout=join_timeout, backend=backend, epoch=epoch,
                                             auth_key=bytes.fromhex(key_hex))
        receiver.prefetch()
        self._kf_pool()[job] = receiver
        return rank

    def kf_pool_receive_adapter(self, job: str, directory: str, config_json: str) -> dict[str, Any]:
        """Receive one adapter sync of ``job`` and write it under ``directory`` (``job``'s own folder)."""
        receiver = self._kf_pool().get(job)
        if receiver is None:
            raise RuntimeError(f"kf_pool_receive_adapter: job {job!r} has not joined")
        return _receive_adapter(receiver, directory, config_json)

    def kf_pool_leave(self, job: str) -> None:
        receiver = self._kf_pool().pop(job, None)
        if receiver is not None:
            receiver.close()


def _receive_adapter(receiver: weightsync.WeightReceiver, directory: str, config_json: str) -> dict[str, Any]:
    """One sync of LoRA adapter tensors written as a PEFT folder ``directory/v<version>`` (TP rank 0 writes; every
    rank receives); ``SyncStats.as_dict()`` plus ``path``."""
    got: list[tuple[str, torch.Tensor]] = []

    def keep(weights: Iterator[tuple[str, torch.Tensor]]) -> None:
        got.extend((n, t.clone()) for n, t in weights)

    try:
        stats = receiver.receive(keep).as_dict()
    finally:
        receiver.prefetch()   # adapters: nothing to build in the background
    path = pathlib.Path(directory) / f"v{int(stats['version'])}"
    if _tp_rank() == 0:
        adapter.save_adapter(path, got, config=json.loads(config_json))
    return {**stats, "path": str(path)}


def refresh_shared_weights(model: torch.nn.Module) -> list[str]:
    """Re-run post-load processing for modules whose ``weight`` Parameter is shared (tied); returns their names."""
    owners: dict[int, list[tuple[str, torch.nn.Module]]] = {}
    for name, module in model.named_modules():
        weight = module.__dict__.get("_parameters", {}).get("weight")
        if weight is not None and hasattr(module, "quant_method"):
            owners.setdefault(id(weight), []).append((name, module))
    refreshed = []
    for group in owners.values():
        if len(group) < 2:
            continue
        for name, module in group:
            method = getattr(module, "quant_method", None)
            if method is not None and hasattr(method, "process_weights_after_loading"):
                method.process_weights_after_loading(module)
                refreshed.append(name)
    return refreshed


def _tp_rank() -> int:
    from vllm.distributed import parallel_state

    return int(parallel_state.get_tensor_model_parallel_rank())
