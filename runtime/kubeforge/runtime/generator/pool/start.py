"""Wiring of a pool engine (``kubeforge role generator`` with ``KUBEFORGE_POOL`` set): the attached jobs' sockets,
then the vLLM engine with LoRA for ``maxAdapters`` adapters, then ``generator.pool.serve``.

```
 env (KUBEFORGE_CONFIG: the pool's manifest; KUBEFORGE_POOL_JOBS / _KEYS: attach.read) ──▶ metrics server
   per job: bind its inbox at its own port (CURVE with its key, a ZAP domain of its own)
   vLLM engine (generatorpool.engine_args) ──▶ ready
   per job: control sender to its trainer 0, sender to its verifiers (its keys) ──▶ serve.serve until SIGTERM
 ──▶ <run dir>/pool-<index>.json: serve.summary (what the local launcher reports as the pool's summary)
```

Why one socket per job (not one socket whose CURVE server tells jobs apart by their public keys): a job's roles
already speak CURVE with the job's own key pair as client *and* server key (``transport.CurveKeys``), so a job's
trainer reaches a pool socket exactly as it reaches a generator of its own, unchanged; and the job a frame belongs
to is the socket it came in on, so no frame can claim to be another job's. Each socket's ZAP domain admits only its
job's public key, so job B's key is refused on job A's socket even by a client that knows A's public key.

Neighbours: ``role.run`` dispatches here; ``generator.pool.engine`` is the vLLM glue; ``attach`` the job files.
"""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import sys
import tempfile
from collections.abc import Mapping

from kubeforge.api import contract, generatorpool, load, rljob
from kubeforge.runtime import metrics, models, observe, startup, transport
from kubeforge.runtime.generator.pool import adapters, attach, serve


class PoolObserver(observe.GeneratorObserver):
    """The generator's series plus the pool's, by job."""

    def served(self, *, job: str, seconds: float, queue_wait: float, completions: int) -> None:
        self.m.pool_engine_seconds.labels(rljob=job).inc(seconds)
        self.m.pool_completions.labels(rljob=job).inc(completions)
        self.m.pool_queue_wait_seconds.labels(rljob=job).observe(queue_wait)

    def swapped(self, job: str, seconds: float) -> None:
        self.m.pool_adapter_swaps.labels(rljob=job).inc()
        self.m.pool_adapter_swap_seconds.labels(rljob=job).observe(seconds)


def _fail(pool: str, problems: list[str]) -> int:
    for p in problems:
        print(f"kubeforge role generator (pool {pool}): {p}", file=sys.stderr, flush=True)
    return startup.EXIT_CONFIG


def _read(env: Mapping[str, str]) -> tuple[generatorpool.GeneratorPool, list[attach.Attached], int]:
    name = env.get(contract.ENV_POOL, "")
    path = env.get(contract.ENV_CONFIG, "")
    try:
        pool = load.parse_any_text(pathlib.Path(path).read_text())
    except (OSError, load.InvalidRLJob) as exc:
        raise attach.AttachError([f"{contract.ENV_CONFIG}: {path}: {exc}"]) from exc
    if not isinstance(pool, generatorpool.GeneratorPool):
        raise attach.AttachError([f"{contract.ENV_CONFIG}: {path}: Invalid value: not a GeneratorPool manifest"])
    if pool.metadata.name != name:
        raise attach.AttachError([f"{contract.ENV_POOL}: Invalid value: {name!r}: the manifest is GeneratorPool "
                                  f"{pool.metadata.name!r}"])
    index = int(env.get(contract.ENV_INDEX) or 0)
    missing = [k for k in (contract.ENV_POOL_JOBS, contract.ENV_POOL_KEYS) if not env.get(k)]
    if missing:
        raise attach.AttachError([f"{k}: Required value: a pool engine needs its attached jobs' file" for k in missing])
    jobs = attach.read(jobs_path=env[contract.ENV_POOL_JOBS], keys_path=env[contract.ENV_POOL_KEYS], pool=name,
                       index=index)
    return pool, jobs, index


def run(environ: Mapping[str, str] | None = None) -> int:
    env = os.environ if environ is None else environ
    try:
        pool, jobs, index = _read(env)
    except (attach.AttachError, ValueError) as exc:
        return _fail(env.get(contract.ENV_POOL, "?"), getattr(exc, "problems", [str(exc)]))
    port_base = int(env.get(contract.ENV_PORT_BASE) or contract.DEFAULT_PORT_BASE)
    bind_host = env.get(contract.ENV_BIND_HOST) or "0.0.0.0"
    m = metrics.Metrics(role="generator", replica=index)
    server = metrics.serve(m, host=bind_host, port_base=port_base)
    deadline = max((float(a.spec.failure_policy.progress_deadline_seconds) for a in jobs),
                   default=float(rljob.FailurePolicySpec().progress_deadline_seconds))
    start_deadline = float(rljob.FailurePolicySpec().start_deadline_seconds())
    server.deadline, server.start_deadline = deadline, start_deadline
    stop = startup._stop_flag()
    print(f"pool-{pool.metadata.name}-{index}: pid {os.getpid()} metrics on {bind_host}:{server.port} serving "
          f"{', '.join(a.name for a in jobs)}", flush=True)
    try:
        return _main(pool, jobs, index=index, bind_host=bind_host, m=m, server=server, stop=stop,
                     deadline=deadline, start_deadline=start_deadline,
                     run_dir=env.get(contract.ENV_RUN_DIR) or None)
    finally:
        server.stop()


def _main(pool: generatorpool.GeneratorPool, jobs: list[attach.Attached], *, index: int, bind_host: str,
          m: metrics.Metrics, server: metrics.MetricsServer, stop: startup.StopFlag, deadline: float,
          start_deadline: float, run_dir: str | None) -> int:
    from kubeforge.runtime.generator import engine as engine_mod     # vLLM: this process only
    from kubeforge.runtime.generator.pool import engine as pool_engine

    keys = {a.name: transport.CurveKeys.from_job_key(a.key, domain=f"{transport.ZAP_DOMAIN}/{a.name}") for a in jobs}
    inboxes = {a.name: transport.open_receiver(transport.tcp_address(bind_host, a.port_base + contract.PORT_DATA),
                                               auth=keys[a.name], on_drop=m.drop_hook()) for a in jobs}
    spec = pool.spec
    role = rljob.GeneratorRole(tensor_parallel_size=spec.tensor_parallel_size, kv_cache_gib=spec.kv_cache_gib,
                               gpu_memory_utilization=spec.gpu_memory_utilization,
                               max_model_len=spec.max_model_len, enforce_eager=spec.enforce_eager)
    model = rljob.ModelSpec.model_validate(spec.model.model_dump(by_alias=True, exclude_none=True))
    llm = engine_mod.Engine(model_dir=models.resolve(model), dtype=str(getattr(model.dtype, "value", model.dtype)),
                            role=role, seed=index,
                            engine_args={**generatorpool.engine_args(spec), "max_cpu_loras": spec.max_adapters})
    print(f"pool-{pool.metadata.name}-{index}: vLLM engine up in {llm.start_seconds:.1f}s "
          f"(maxAdapters {spec.max_adapters})", flush=True)
    server.set_ready(True)
    observer = PoolObserver(m)
    root = pathlib.Path(tempfile.mkdtemp(prefix="kubeforge-pool-"))
    channels: list[serve.Channel] = []
    loaders: list[pool_engine.JobWeights] = []
    slots = adapters.Slots(capacity=spec.max_adapters, backend=pool_engine.VllmAdapters(llm),
                           on_swap=observer.swapped)
    ledger = serve.Ledger()
    try:
        for slot, a in enumerate(jobs):
            trainer0 = a.trainers[0]
            control = transport.open_sender(
                [transport.tcp_address(trainer0.host, trainer0.port(contract.PORT_CONTROL))], role="generator",
                index=index, auth=keys[a.name], ready_timeout=start_deadline, send_timeout=deadline)
            verifiers = transport.open_sender(
                [transport.tcp_address(p.host, p.port(contract.PORT_DATA)) for p in a.verifiers], role="generator",
                index=index, auth=keys[a.name], ready_timeout=start_deadline, send_timeout=deadline)
            loader = pool_engine.JobWeights(llm, a, folder=root / f"job-{slot}", index=index,
                                            tensor_parallel_size=spec.tensor_parallel_size)
            loaders.append(loader)
            channels.append(serve.Channel(
                name=a.name, weight=a.weight, group_size=a.spec.algorithm.group_size, inbox=inboxes[a.name],
                verifiers=verifiers, control=control, weights=loader,
                sampler=pool_engine.JobSampler(llm, a, index=index),
                trainer_weights=(trainer0.host, trainer0.port(contract.PORT_WEIGHTS)),
                max_policy_lag=a.spec.algorithm.max_policy_lag))
        serve.serve(index=index, channels=channels, slots=slots, observer=observer, should_stop=stop.is_set,
                    ledger=ledger, beat=server.heartbeat)
    finally:
        result = {"pool": pool.metadata.name, "engine": index, "max_adapters": spec.max_adapters,
                  "jobs": serve.summary(ledger, slots)}
        print(f"pool-{pool.metadata.name}-{index}: {json.dumps(result)}", flush=True)
        if run_dir:
            (pathlib.Path(run_dir) / f"pool-{index}.json").write_text(json.dumps(result, indent=1))
        for ch in channels:
            ch.verifiers.close()
            ch.control.close()
        for inbox in inboxes.values():
            inbox.close()
        for loader in loaders:
            try:
                loader.close()
            except Exception:  # noqa: BLE001 - shutting down: the engine goes next anyway
                pass
        llm.close()
        shutil.rmtree(root, ignore_errors=True)
    return 0
