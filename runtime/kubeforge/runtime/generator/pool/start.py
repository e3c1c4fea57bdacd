"""Wiring of a pool engine (``kubeforge role generator`` with ``KUBEFORGE_POOL`` set): the attached jobs' sockets,
then the vLLM engine with LoRA for ``maxAdapters`` adapters, then ``generator.pool.serve``.

```
 env (KUBEFORGE_CONFIG: the pool's manifest; KUBEFORGE_POOL_JOBS / _KEY: attach.Watch) ──▶ metrics server
   per job: bind its inbox at its own port (CURVE with its key, a ZAP domain of its own)
   vLLM engine (generatorpool.engine_args) ──▶ ready
   serve.serve until SIGTERM, with a JobsRoster: per job that came, a control sender to its trainer 0 and a sender
   to its verifiers (its keys), its loader and sampler; per job that went, those closed
 ──▶ <run dir>/pool-<index>.json: serve.summary (what the local launcher reports as the pool's summary)
```

The jobs file is re-read while the engine runs (``attach.Watch``: its content polled every
``attach.WATCH_SECONDS``; the kubelet swaps the projected folder when the operator changes the ConfigMap): jobs
that came are opened, jobs that went closed and their adapters unloaded (``serve.regroup``), with no restart. A file
that does not read well keeps the last good set, is logged and counted (``jobs_file_unread`` in the summary).

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
from collections.abc import Callable, Mapping

from kubeforge.api import contract, generatorpool, load, rljob
from kubeforge.runtime import metrics, models, observe, startup, transport
from kubeforge.runtime.generator import loop
from kubeforge.runtime.generator.pool import adapters, attach, serve

#: "starting" notices to each listed job's trainer 0 while the engine loads (at most the deadline / 4 apart), as a
#: job's own generator sends them (``generator.start.START_BEAT_SECONDS``).
START_BEAT_SECONDS = 20.0
BEAT_SEND_SECONDS = 1.0


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


class JobsRoster:
    """``serve.Roster`` over the jobs file (``attach.Watch``): the jobs it lists now (``wanted``), each opened by
    ``opener`` (sockets with its own key, loader, sampler) and closed by ``closer``. A job whose record changed
    (a new key, port or peers) is closed and opened again; one that could not be opened is offered again after
    ``watch.interval``."""

    def __init__(self, *, watch: attach.Watch, wanted: list[attach.Attached],
                 opener: Callable[[attach.Attached], serve.Channel], closer: Callable[[serve.Channel], None],
                 say: Callable[[str], None] = lambda line: None) -> None:
        self.watch = watch
        self.wanted = {a.name: a for a in wanted}
        self.serving: dict[str, attach.Attached] = {}
        self.channels: dict[str, serve.Channel] = {}
        self._opener, self._closer, self._say = opener, closer, say
        self._bad = watch.bad
        self._retry_at: float | None = 0.0      # the first poll opens the jobs listed at start

    def poll(self) -> serve.Change | None:
        got = self.watch.poll()
        if self.watch.bad != self._bad:
            self._bad = self.watch.bad
            self._say(f"jobs file not applied, the last good set is kept: {self.watch.last_error}")
        if got is not None:
            self.wanted = {a.name: a for a in got}
        elif self._retry_at is None or self.watch.clock() < self._retry_at:
            return None
        self._retry_at = None
        went = tuple(sorted(n for n, a in self.serving.items() if self.wanted.get(n) != a))
        came = tuple(sorted(n for n, a in self.wanted.items() if self.serving.get(n) != a))
        return serve.Change(went=went, came=came) if went or came else None

    def close(self, ch: serve.Channel) -> None:
        self.serving.pop(ch.name, None)
        self.channels.pop(ch.name, None)
        self._closer(ch)
        self._say(f"job {ch.name} went: its sockets closed, its adapter unloaded")

    def open(self, name: str) -> serve.Channel | None:
        a = self.wanted.get(name)
        if a is None:
            return None
        try:
            ch = self._opener(a)
        except (transport.TransportError, OSError) as exc:     # e.g. its port still held: offered again later
            self._say(f"job {name} not served yet: {exc}")
            self._retry_at = self.watch.clock() + self.watch.interval
            return None
        self.serving[name], self.channels[name] = a, ch
        self._say(f"job {name} served at port base {a.port_base}")
        return ch

    def close_all(self) -> None:
        for ch in list(self.channels.values()):
            self.serving.pop(ch.name, None)
            self.channels.pop(ch.name, None)
            self._closer(ch)


def _read(env: Mapping[str, str]) -> tuple[generatorpool.GeneratorPool, attach.Watch, list[attach.Attached], int]:
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
    missing = [k for k in (contract.ENV_POOL_JOBS, contract.ENV_POOL_KEY) if not env.get(k)]
    if missing:
        raise attach.AttachError([f"{k}: Required value: a pool engine needs its attached jobs' file and the "
                                  "pool's key" for k in missing])
    watch = attach.Watch(jobs_path=env[contract.ENV_POOL_JOBS], key_path=env[contract.ENV_POOL_KEY], pool=name,
                         index=index, interval=attach.WATCH_SECONDS)
    return pool, watch, watch.first(), index


def _start_beats(a: attach.Attached, *, index: int, keys: transport.CurveKeys, every: float,
                 send_timeout: float) -> loop.StartBeats:
    """Start notices to job ``a``'s trainer 0 from a thread of their own, on a control sender to it (the job's
    channel takes it over once the engine is up; ``send_timeout``: its default bound, the channel's), not waiting
    for the trainer (at a first start it may not be up yet: a beat it misses is simply not heard)."""
    trainer0 = a.trainers[0]
    control = transport.open_sender([transport.tcp_address(trainer0.host, trainer0.port(contract.PORT_CONTROL))],
                                    role="generator", index=index, auth=keys, ready_timeout=None,
                                    send_timeout=send_timeout)
    # a beat the trainer cannot take within a second is dropped (the next one follows): the engine's start is
    # never held by a trainer that is not up, and stopping the beats once it is up costs a second at most per job
    return loop.StartBeats(index=index, control=control, every=every, send_timeout=BEAT_SEND_SECONDS).start()


def run(environ: Mapping[str, str] | None = None) -> int:
    env = os.environ if environ is None else environ
    try:
        pool, watch, jobs, index = _read(env)
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
        return _main(pool, watch, jobs, index=index, bind_host=bind_host, m=m, server=server, stop=stop,
                     deadline=deadline,
                     run_dir=env.get(contract.ENV_RUN_DIR) or None)
    finally:
        server.stop()


def _main(pool: generatorpool.GeneratorPool, watch: attach.Watch, jobs: list[attach.Attached], *, index: int,
          bind_host: str, m: metrics.Metrics, server: metrics.MetricsServer, stop: startup.StopFlag, deadline: float,
          run_dir: str | None) -> int:
    from kubeforge.runtime.generator import engine as engine_mod     # vLLM: this process only
    from kubeforge.runtime.generator.pool import engine as pool_engine

    tag = f"pool-{pool.metadata.name}-{index}"

    def keys(a: attach.Attached) -> transport.CurveKeys:
        return transport.CurveKeys.from_job_key(a.key, domain=f"{transport.ZAP_DOMAIN}/{a.name}")

    def bind(a: attach.Attached) -> transport.Receiver:
        return transport.open_receiver(transport.tcp_address(bind_host, a.port_base + contract.PORT_DATA),
                                       auth=keys(a), on_drop=m.drop_hook())

    # the jobs listed at start are bound before the engine starts (their trainers may connect meanwhile)
    prebound = {a.name: (a, bind(a)) for a in jobs}
    # the engine load makes no heartbeat: each listed job's trainer 0 hears that this engine is starting (an ACK of
    # READY, not ok), so a trainer whose engine restarts under it waits for its groups by the start deadline, not as
    # for a stalled step (a job's own generator does the same: generator.start). Each job's beats go on the control
    # sender its channel then takes over, so its READY can never overtake a "starting" beat on the way.
    beating = {a.name: (a, _start_beats(a, index=index, keys=keys(a), every=min(START_BEAT_SECONDS, deadline / 4),
                                        send_timeout=deadline)) for a in jobs}
    spec = pool.spec
    role = rljob.GeneratorRole(tensor_parallel_size=spec.tensor_parallel_size, kv_cache_gib=spec.kv_cache_gib,
                               gpu_memory_utilization=spec.gpu_memory_utilization,
                               max_model_len=spec.max_model_len, enforce_eager=spec.enforce_eager)
    model = rljob.ModelSpec.model_validate(spec.model.model_dump(by_alias=True, exclude_none=True))
    try:
        llm = engine_mod.Engine(model_dir=models.resolve(model), dtype=str(getattr(model.dtype, "value", model.dtype)),
                                role=role, seed=index,
                                engine_args={**generatorpool.engine_args(spec), "max_cpu_loras": spec.max_adapters})
    except BaseException:
        for _, beats in beating.values():
            beats.stop()
            beats.control.close()
        raise
    for _, beats in beating.values():
        beats.stop()
    print(f"{tag}: vLLM engine up in {llm.start_seconds:.1f}s (maxAdapters {spec.max_adapters})", flush=True)
    server.set_ready(True)
    observer = PoolObserver(m)
    root = pathlib.Path(tempfile.mkdtemp(prefix="kubeforge-pool-"))
    loaders: dict[str, pool_engine.JobWeights] = {}
    folders = iter(range(1 << 30))
    slots = adapters.Slots(capacity=spec.max_adapters, backend=pool_engine.VllmAdapters(llm),
                           on_swap=observer.swapped)
    ledger = serve.Ledger()

    def opener(a: attach.Attached) -> serve.Channel:
        was, inbox = prebound.pop(a.name, (None, None))
        if inbox is not None and was != a:       # its record changed before it was first served
            inbox.close()
            inbox = None
        inbox = inbox or bind(a)
        trainer0 = a.trainers[0]
        beat, beats = beating.pop(a.name, (None, None))
        control = beats.control if beats is not None and beat == a else None
        if beats is not None and control is None:      # its record changed while the engine loaded
            beats.control.close()
        # not waiting for the job's trainer and verifiers to be there: the loop that opens a job serves the others,
        # and a job whose pods are gone (it ended, or restarts) must not hold them (seen in real pods: a restarted
        # engine whose jobs file still listed a job that had Succeeded waited on its verifiers). Its READY then
        # goes out within the announce bound or with its trainer's HELLO; its groups wait ROLLOUT_SEND_SECONDS.
        opened: list[transport.Sender] = []
        try:
            opened.append(control or transport.open_sender(
                [transport.tcp_address(trainer0.host, trainer0.port(contract.PORT_CONTROL))], role="generator",
                index=index, auth=keys(a), ready_timeout=None, send_timeout=deadline))
            opened.append(transport.open_sender(
                [transport.tcp_address(p.host, p.port(contract.PORT_DATA)) for p in a.verifiers], role="generator",
                index=index, auth=keys(a), ready_timeout=None, send_timeout=deadline))
        except BaseException:
            for s in opened:
                s.close()
            inbox.close()
            raise
        control, verifiers = opened
        loader = pool_engine.JobWeights(llm, a, folder=root / f"job-{next(folders)}", index=index,
                                        tensor_parallel_size=spec.tensor_parallel_size)
        loaders[a.name] = loader
        return serve.Channel(
            name=a.name, weight=a.weight, group_size=a.spec.algorithm.group_size, inbox=inbox,
            verifiers=verifiers, control=control, weights=loader,
            sampler=pool_engine.JobSampler(llm, a, index=index),
            trainer_weights=(trainer0.host, trainer0.port(contract.PORT_WEIGHTS)),
            max_policy_lag=a.spec.algorithm.max_policy_lag)

    def closer(ch: serve.Channel) -> None:
        ch.verifiers.close()
        ch.control.close()
        ch.inbox.close()
        loader = loaders.pop(ch.name, None)
        if loader is not None:
            try:
                loader.close()
            except Exception as exc:  # noqa: BLE001 - the job is gone: its loader's trouble is logged, not raised
                print(f"{tag}: closing job {ch.name}'s loader: {exc!r}", file=sys.stderr, flush=True)

    roster = JobsRoster(watch=watch, wanted=jobs, opener=opener, closer=closer,
                        say=lambda line: print(f"{tag}: {line}", flush=True))
    try:
        serve.serve(index=index, channels=[], slots=slots, observer=observer, should_stop=stop.is_set,
                    ledger=ledger, beat=server.heartbeat, roster=roster)
    finally:
        result = {"pool": pool.metadata.name, "engine": index, "max_adapters": spec.max_adapters,
                  "jobs": serve.summary(ledger, slots), "jobs_file_unread": watch.bad}
        print(f"{tag}: {json.dumps(result)}", flush=True)
        if run_dir:
            (pathlib.Path(run_dir) / f"pool-{index}.json").write_text(json.dumps(result, indent=1))
        roster.close_all()
        for _, inbox in prebound.values():
            inbox.close()
        for _, beats in beating.values():
            beats.control.close()
        llm.close()
        shutil.rmtree(root, ignore_errors=True)
    return 0
