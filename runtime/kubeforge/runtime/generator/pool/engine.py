"""A pool engine's vLLM glue: adapter slots over vLLM's ``add_lora``/``remove_lora``, each job's adapter pushes
through its own weight-sync group, each job's sampling with its own ``LoRARequest``.

Neighbours: ``generator.engine.Engine`` owns the ``vllm.LLM`` (started with the pool's ``engine_args``: LoRA for
``maxAdapters`` adapters); ``generator.extension`` holds one weight receiver per job inside the worker(s)
(``kf_pool_*``); ``generator.pool.serve`` drives these through its ``adapters.Backend``, ``AdapterLoader`` and
``JobSampler`` protocols. Import only where vLLM is installed (the pool engine's process, tests marked ``vllm``).

Invariants: a job's adapters are written under that job's own folder (``<root>/job-<slot>``, the slot from the
attachment file, never a name from the wire) and only the newest version's folder is kept; the ``lora_id`` of every
``LoRARequest`` is the one ``adapters.Slots`` drew; the job's key travels to the worker only to prove it at the
job's weight-sync rendezvous.
"""
from __future__ import annotations

import json
import pathlib
import shutil
from collections.abc import Sequence
from typing import Any

from kubeforge.runtime import types, weightsync, wire
from kubeforge.runtime.generator import engine as engine_mod
from kubeforge.runtime.generator.pool import adapters, attach
from kubeforge.runtime.models import adapter as adapter_files


def lora_request(a: adapters.Adapter) -> Any:
    from vllm.lora.request import LoRARequest

    return LoRARequest(a.name, a.lora_id, a.path)


class VllmAdapters:
    """``adapters.Backend`` over the engine: resident = registered with vLLM (its CPU cache holds ``maxAdapters``,
    as many as its GPU slots, so vLLM itself never evicts one that ``adapters.Slots`` counts resident)."""

    def __init__(self, llm: engine_mod.Engine) -> None:
        self.llm = llm

    def load(self, a: adapters.Adapter) -> None:
        if not self.llm.llm.llm_engine.add_lora(lora_request(a)):
            raise RuntimeError(f"vLLM refused adapter {a.name} ({a.path})")

    def unload(self, a: adapters.Adapter) -> None:
        self.llm.llm.llm_engine.remove_lora(a.lora_id)


class JobWeights:
    """``serve.AdapterLoader`` of one job: join the job's weight-sync group (with its key) when the SYNC names a new
    epoch, receive the adapter into the job's folder."""

    def __init__(self, llm: engine_mod.Engine, att: attach.Attached, *, folder: pathlib.Path, index: int,
                 tensor_parallel_size: int) -> None:
        assert att.spec.model.lora is not None        # attach.read refuses a job without one
        self.llm, self.att, self.folder = llm, att, folder
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.rank_base = weightsync.rank_base(generator_index=index, tensor_parallel_size=tensor_parallel_size)
        self.config = json.dumps(adapter_files.adapter_config(att.spec.model.lora, base=str(llm.model_dir)))
        self.joined_at: tuple[str, int, int] | None = None
        self.path = ""

    def load(self, sync: wire.Sync) -> types.SyncResult:
        rpc = self.llm.llm.collective_rpc
        job = self.att.name
        try:
            if self.joined_at != (sync.host, sync.port, sync.epoch):
                self.joined_at = None
                rpc("kf_pool_join", args=(job, sync.host, sync.port, sync.world_size, self.rank_base,
                                          float(sync.timeout_s),
                                          float(self.att.spec.failure_policy.progress_deadline_seconds),
                                          sync.backend, int(sync.epoch), self.att.key.hex()))
                self.joined_at = (sync.host, sync.port, sync.epoch)
            first = rpc("kf_pool_receive_adapter", args=(job, str(self.folder), self.config))[0]
        except Exception as exc:
            self.joined_at = None
            try:
                rpc("kf_pool_leave", args=(job,))
            except Exception:  # noqa: BLE001 - the group is broken already; leaving is best effort
                pass
            raise weightsync.WeightSyncError(str(exc)) from exc
        self.path = str(first["path"])
        for old in self.folder.iterdir():     # superseded versions are never loaded again (adapters.Slots)
            if str(old) != self.path and not old.name.startswith("."):
                shutil.rmtree(old, ignore_errors=True)
        return types.SyncResult(seconds=float(first["seconds"]), bytes=int(first["bytes"]))

    def close(self) -> None:
        try:
            self.llm.llm.collective_rpc("kf_pool_leave", args=(self.att.name,))
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)


class JobSampler:
    """``serve.JobSampler`` of one job: its sampling knobs, seeds of its own, the adapter it is handed."""

    def __init__(self, llm: engine_mod.Engine, att: attach.Attached, *, index: int) -> None:
        self.llm, self.algo = llm, att.spec.algorithm
        self.chat_template = att.spec.task.chat_template
        self.seed = att.spec.task.seed * 7919 + index       # as the job's own generator (attempt 0)
        self.calls = 0

    def sample(self, prompts: Sequence[types.Prompt], adapter: adapters.Adapter | None) -> list[types.RolloutGroup]:
        self.calls += 1
        out = self.llm.generate(list(prompts), n=self.algo.group_size, max_tokens=self.algo.max_new_tokens,
                                temperature=self.algo.temperature, top_p=self.algo.top_p, top_k=self.algo.top_k,
                                seed=self.seed + self.calls * 31, chat_template=self.chat_template,
                                lora_request=None if adapter is None else lora_request(adapter))
        return [types.RolloutGroup(prompt=p, prompt_token_ids=types.token_array(ids), completions=comps,
                                   policy_version=0)
                for p, (ids, comps) in zip(prompts, out)]
