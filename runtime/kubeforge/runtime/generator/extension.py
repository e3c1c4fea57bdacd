"""The vLLM worker extension: the generator end of weight sync, running inside each vLLM worker process.

vLLM mixes :class:`WeightSyncExtension` into its worker class (engine option ``worker_extension_cls``); the
``Engine`` reaches its methods with ``llm.collective_rpc("kf_...")``, once per worker. Every method is prefixed
``kf_`` so none collides with the worker's own (``reload_weights``, ``update_weights``, ...); vLLM refuses
collisions at start-up. Arguments and results are plain values (str/int/float/dict): they may cross a process
boundary through vLLM's RPC, which never needs pickle for them.

Loading (why each step is needed, all checked by tests/runtime/test_weightsync.py):
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
``kf_receive_adapter`` writes as a PEFT folder; the Engine then serves it as a new vLLM ``LoRARequest``.
"""
from __future__ import annotations

import json
import pathlib
from collections.abc import Iterator
from typing import Any

import torch

from kubeforge.runtime import weightsync
from kubeforge.runtime.trainer import lora


class WeightSyncExtension:
    """Mixed into vLLM's worker: ``self`` is the worker (``self.model_runner``, ``self.reload_weights``)."""

    _kf_receiver: weightsync.WeightReceiver | None = None

    def kf_join_weight_sync(self, host: str, port: int, world_size: int, rank_base: int, timeout: float,
                            join_timeout: float = weightsync.DEFAULT_JOIN_TIMEOUT, backend: str = "gloo",
                            epoch: int = 0) -> int:
        """Join epoch ``epoch`` of the weight-sync group as rank ``rank_base + tp_rank``; blocks until the whole
        group has joined (at most ``join_timeout``)."""
        self.kf_leave_weight_sync()
        rank = rank_base + _tp_rank()
        self._kf_receiver = weightsync.WeightReceiver(
            host=host, port=port, world_size=world_size, rank=rank, timeout=timeout, join_timeout=join_timeout,
            backend=backend, epoch=epoch)
        self._kf_receiver.prefetch()
        return rank

    def kf_weights_staged(self) -> bool:
        """The next sync has arrived whole in the background (loading it will not wait for the wire)."""
        return self._kf_receiver is not None and self._kf_receiver.staged

    def kf_receive_weights(self, refresh_tied: bool = True, load: bool = True) -> dict[str, Any]:
        """Receive one sync and load it in place; returns ``SyncStats.as_dict()``.

        ``refresh_tied=False`` skips step 2 above; it exists only so a test can show the stale tied head.
        ``load=False`` receives and discards (the benchmark's split of wire time from vLLM's reload time)."""
        if self._kf_receiver is None:
            raise RuntimeError("kf_receive_weights before kf_join_weight_sync")

        def discard(weights: Iterator[tuple[str, torch.Tensor]]) -> None:
            for _ in weights:
                pass

        def reload(weights: Iterator[tuple[str, torch.Tensor]]) -> None:
            self.reload_weights(weights_iterator=weights, is_checkpoint_format=True)  # type: ignore[attr-defined]
            if refresh_tied:
                refresh_shared_weights(self.model_runner.get_model())  # type: ignore[attr-defined]

        try:
            return self._kf_receiver.receive(reload if load else discard).as_dict()
        finally:
            self._kf_receiver.prefetch()   # the buffers are free again: the next sync lands while generating

    def kf_receive_adapter(self, directory: str, config_json: str) -> dict[str, Any]:
        """Receive one sync of LoRA adapter tensors and write them as a PEFT folder ``directory/v<version>`` (TP
        rank 0 writes; every rank receives); returns ``SyncStats.as_dict()`` plus ``path``."""
        if self._kf_receiver is None:
            raise RuntimeError("kf_receive_adapter before kf_join_weight_sync")
        got: list[tuple[str, torch.Tensor]] = []

        def keep(weights: Iterator[tuple[str, torch.Tensor]]) -> None:
            got.extend((n, t.clone()) for n, t in weights)

        try:
            stats = self._kf_receiver.receive(keep).as_dict()
        finally:
            self._kf_receiver.prefetch()
        path = pathlib.Path(directory) / f"v{int(stats['version'])}"
        if _tp_rank() == 0:
            lora.save_adapter(path, got, config=json.loads(config_json))
        return {**stats, "path": str(path)}

    def kf_leave_weight_sync(self) -> None:
        if self._kf_receiver is not None:
            self._kf_receiver.close()
            self._kf_receiver = None


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
