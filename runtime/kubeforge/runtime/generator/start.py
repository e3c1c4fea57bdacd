"""Wiring of a generator: sockets first, then the vLLM engine, then the loop.

Neighbours: ``role.run`` calls :func:`main`; ``generator.engine.Engine`` is the vLLM wrapper; the adapters below
turn it into the loop's ``Sampler`` and ``WeightLoader`` (``generator.loop``); ``startup`` has the helpers every
role's start shares.

The data port is bound before the engine starts (about a minute on 2 CPU cores), so trainer 0's sender handshakes
at once and its WORK waits, bounded by the high-water mark, in this process's queue. The weight-sync group is
joined on the first SYNC (``weightsync`` world = trainer 0 + every generator worker).
"""
from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from kubeforge.api import contract, rljob
from kubeforge.runtime import config, hardware, metrics, models, observe, startup, transport, types, weightsync, wire
from kubeforge.runtime.generator import fence, join, loop, partial

if TYPE_CHECKING:
    from kubeforge.runtime.agents.hosts import host as agents_host


class EngineSampler:
    """``generator.loop.Sampler`` over the vLLM engine: one request per prompt, ``groupSize`` samples each."""

    def __init__(self, engine: object, cfg: config.RoleConfig) -> None:
        self.engine = engine
        self.algo = cfg.spec.algorithm
        self.chat_template = cfg.spec.task.chat_template
        self.seed = cfg.spec.task.seed * 7919 + cfg.attempt * 104729 + cfg.index
        self.calls = 0

    def sample(self, prompts: Sequence[types.Prompt]) -> list[types.RolloutGroup]:
        self.calls += 1
        out = self.engine.generate(  # type: ignore[attr-defined]
            list(prompts), n=self.algo.group_size, max_tokens=self.algo.max_new_tokens,
            temperature=self.algo.temperature, top_p=self.algo.top_p, top_k=self.algo.top_k,
            seed=self.seed + self.calls * 31,
            chat_template=self.chat_template)
        return [types.RolloutGroup(prompt=p, prompt_token_ids=ids, completions=comps, policy_version=0)
                for p, (ids, comps) in zip(prompts, out)]


class EngineTurns:
    """``agents.runner.TurnEngine`` over the vLLM engine: an episode's next policy turn, the job's sampling knobs
    (sampled with the engine's seeded generator, not per-request seeds: ``Engine.continue_ids``)."""

    def __init__(self, engine: object, cfg: config.RoleConfig) -> None:
        self.engine = engine
        self.tokenizer = engine.tokenizer  # type: ignore[attr-defined]
        self.algo = cfg.spec.algorithm

    def sample_turns(self, contexts: Sequence[Sequence[int]], *, max_tokens: Sequence[int], seeds: Sequence[int],
                     stop: Sequence[str]) -> list[types.Completion]:
        return self.engine.continue_ids(  # type: ignore[attr-defined, no-any-return]
            [list(c) for c in contexts], max_tokens=list(max_tokens), seeds=None, stop=list(stop),
            temperature=self.algo.temperature, top_p=self.algo.top_p, top_k=self.algo.top_k)


def episode_sampler(llm: object, cfg: config.RoleConfig, m: metrics.Metrics) -> loop.Sampler:
    """The loop's sampler when ``spec.environment`` is set: episodes, their environments in the verifiers'
    environment servers (``env_host``; docs/agents.md, "Where environments run")."""
    from kubeforge.runtime.agents import runner

    env = cfg.spec.environment
    assert env is not None
    if env.type == rljob.EnvironmentType.VERIFIERS.value:   # an agent drives the sampling (agents.primeintellect)
        from kubeforge.runtime.agents import primeintellect

        return primeintellect.sampler.from_engine(llm, spec=cfg.spec, metrics=m,
                                                  on_sampled=lambda stats: observe.episodes(m, stats))
    if env.type == rljob.EnvironmentType.AGENT.value:   # the user's agent in agent pods drives (agents.pods)
        from kubeforge.runtime.agents.pods import sampler as pods_sampler

        return pods_sampler.from_engine(llm, cfg=cfg, metrics=m, on_sampled=lambda stats: observe.episodes(m, stats))
    host = env_host(cfg, m)
    sampler = runner.EpisodeSampler(engine=EngineTurns(llm, cfg), host=host, spec=env, algorithm=cfg.spec.algorithm,
                                    chat_template=cfg.spec.task.chat_template,
                                    seed=EngineSampler(llm, cfg).seed,
                                    max_context=int(llm.kwargs["max_model_len"]),  # type: ignore[attr-defined]
                                    on_sampled=lambda stats: observe.episodes(m, stats))
    return sampler


ENV_WORKERS = 2     # environment worker processes per generator, when no verifier serves them (docs/agents.md)


def env_host(cfg: config.RoleConfig, m: metrics.Metrics) -> agents_host.EnvironmentHost:
    """The verifiers' environment servers (``agents.hosts.remote_host``) whenever the job has verifiers to serve them;
    else worker processes beside this generator (``agents.hosts.workers``)."""
    from kubeforge.runtime import rpc
    from kubeforge.runtime.agents.hosts import env_server, host, remote_host, workers

    env = cfg.spec.environment
    assert env is not None
    servers = [transport.tcp_address(p.host, p.port(contract.PORT_ENV)) for p in cfg.peers.get("verifier", ())]
    if not servers or not env_server.serves(cfg.spec):
        return workers.SubprocessHost(env, workers=ENV_WORKERS)
    return remote_host.RemoteHost(rpc.connect(servers, name=cfg.name), total_s=startup.role_deadline(cfg),
                                  on_drop=m.drop_hook(),
                                  bounds=host.Bounds(timeout_s=env.turn_timeout_seconds,
                                                     max_observation_bytes=env.max_observation_bytes))


class EngineWeights:
    """``generator.loop.WeightLoader``: join the group on the first SYNC, then receive and load in place."""

    def __init__(self, engine: object, *, index: int, tensor_parallel_size: int,
                 join_timeout: float = weightsync.DEFAULT_JOIN_TIMEOUT) -> None:
        self.engine = engine
        self.rank_base = weightsync.rank_base(generator_index=index, tensor_parallel_size=tensor_parallel_size)
        self.joined_at: tuple[str, int, int] | None = None
        self.join_timeout = join_timeout

    def load(self, sync: wire.Sync) -> loop.SyncResult:
        """Join the epoch's group when it is a new one (a re-formed membership), then receive; on any failure the
        group is left, so the next SYNC joins afresh."""
        try:
            if self.joined_at != (sync.host, sync.port, sync.epoch):
                self.joined_at = None
                self.engine.join_weight_sync(  # type: ignore[attr-defined]
                    host=sync.host, port=sync.port, world_size=sync.world_size,
                    rank_base=sync.rank_base or self.rank_base,     # renumbered while a peer is left out
                    timeout=sync.timeout_s, backend=sync.backend, epoch=sync.epoch, join_timeout=self.join_timeout)
                self.joined_at = (sync.host, sync.port, sync.epoch)
            stats = self.engine.receive_weights()  # type: ignore[attr-defined]
        except Exception as exc:
            self.joined_at = None
            try:
                self.engine.leave_weight_sync()  # type: ignore[attr-defined]
            except Exception:  # noqa: BLE001 - the group is broken already; leaving is best effort
                pass
            raise weightsync.WeightSyncError(str(exc)) from exc
        return loop.SyncResult(seconds=stats.seconds, bytes=stats.bytes)


EXIT_GRACE_SECONDS = 5.0
START_BEAT_SECONDS = 20.0      # "starting" notices to trainer 0 while the engine loads (at most deadline/4 apart)


def leave_then_exit(leave: loop.LeaveNotice, done: threading.Event, *, grace: float = EXIT_GRACE_SECONDS) -> None:
    """SIGTERM (signal watcher thread): send the leave notice at once, give the loop ``grace`` seconds to end at its
    next turn, then exit 0 whatever the main thread is doing (a long batch, a weight receive). Trainer 0 re-issues
    this generator's work, so nothing is lost, and the pod ends well inside its grace period: the kubelet's SIGKILL
    (exit 137) would otherwise read as a failure."""
    leave.send()
    if not done.wait(grace):
        print(f"generator-{leave.index}: SIGTERM: leave notice sent; exiting now (the loop was busy)", flush=True)
        sys.stdout.flush()
        os._exit(0)


def main(cfg: config.RoleConfig, m: metrics.Metrics, server: metrics.MetricsServer, stop: threading.Event) -> int:
    # vLLM: imported by the generator's process alone (tests import this module where vLLM is not installed)
    from kubeforge.runtime.generator import engine, stepper, vllm_steps

    spec = cfg.spec
    inbox = transport.open_receiver(startup.bind(cfg, contract.PORT_DATA), on_drop=m.drop_hook())
    trainer0 = cfg.peer("trainer", 0)
    control_address = transport.tcp_address(trainer0.host, trainer0.port(contract.PORT_CONTROL))
    control = transport.open_sender([control_address], role="generator", index=cfg.index,
                                    send_timeout=startup.role_deadline(cfg))
    leave = loop.LeaveNotice(index=cfg.index, open_control=lambda timeout: transport.open_sender(
        [control_address], role="generator", index=cfg.index, ready_timeout=timeout, send_timeout=timeout))
    done = threading.Event()
    startup.watch_signals(lambda: leave_then_exit(leave, done))   # at SIGTERM, even mid weight receive
    to_verifiers = transport.open_sender(startup.data_addresses(cfg, "verifier"), role="generator", index=cfg.index,
                                    send_timeout=startup.role_deadline(cfg))
    # the engine load makes no heartbeat: /healthz allows it start_deadline (role.run), and trainer 0 hears that
    # this generator is starting, so its wait for our groups is not a stall (a restart in place at step N)
    beats = loop.StartBeats(index=cfg.index, control=control,
                            every=min(START_BEAT_SECONDS, startup.role_deadline(cfg) / 4)).start()
    slow = None if _on_gpu() else hardware.slow_dtype_warning(str(spec.model.dtype))
    if slow is not None:
        print(f"{cfg.name}: warning: {slow}", file=sys.stderr, flush=True)
    try:
        llm = engine.Engine(model_dir=models.resolve(spec.model), dtype=spec.model.dtype,
                                   role=spec.roles.generator, seed=spec.task.seed + cfg.index, lora=spec.model.lora)
    finally:
        beats.stop()
    print(f"{cfg.name}: vLLM engine up in {llm.start_seconds:.1f}s", flush=True)
    server.set_ready(True)
    weights = EngineWeights(llm, index=cfg.index, tensor_parallel_size=spec.roles.generator.tensor_parallel_size,
                            join_timeout=float(spec.failure_policy.progress_deadline_seconds))
    common = dict(index=cfg.index, inbox=inbox, verifiers=to_verifiers, control=control, weights=weights,
                  observer=observe.GeneratorObserver(m), should_stop=stop.is_set,
                  max_policy_lag=spec.algorithm.max_policy_lag, beat=server.heartbeat,
                  trainer_weights=(trainer0.host, trainer0.port(contract.PORT_WEIGHTS)), leave=leave,
                  fence=fence.PushFence(on_refused=lambda sync, highest: _fenced(cfg, m, sync, highest)))
    common["joining"] = join.Joining(on_current=lambda version, seconds: print(
        f"{cfg.name}: {join.CURRENT_LINE} {json.dumps({'version': version, 'seconds': round(seconds, 3)})}",
        flush=True))
    alive = join.AliveBeats(index=cfg.index, every=startup.peer_beat_seconds(cfg), version=lambda: leave.version,
                            open_control=lambda timeout: transport.open_sender(
                                [control_address], role="generator", index=cfg.index, ready_timeout=timeout,
                                send_timeout=timeout)).start()
    activity = partial.Activity()
    closers: list[Callable[[], None]] = [alive.stop]
    try:
        if spec.algorithm.partial_rollouts:   # requests in flight across weight updates (generator.partial)
            sampler = EngineSampler(llm, cfg)
            steps = vllm_steps.VllmSteps(llm, max_tokens=spec.algorithm.max_new_tokens,
                                         temperature=spec.algorithm.temperature, top_p=spec.algorithm.top_p,
                                         chat_template=spec.task.chat_template)
            partial.run(**common, pool=stepper.Pool(steps, group_size=spec.algorithm.group_size),  # type: ignore[arg-type]
                        seed=lambda step: sampler.seed + (step + 1) * 31, synced=steps.synced, activity=activity)
        else:
            chosen = episode_sampler(llm, cfg, m) if spec.environment is not None else EngineSampler(llm, cfg)
            closers.append(getattr(getattr(chosen, "host", None), "shutdown", lambda: None))
            closers.append(getattr(chosen, "close", lambda: None))     # the Verifiers endpoint
            loop.run(**common, sampler=chosen, activity=activity)  # type: ignore[arg-type]
            print(activity.line(cfg.index), flush=True)
    finally:
        done.set()
        for close in closers:
            close()
        to_verifiers.close()
        control.close()
        inbox.close()
        llm.close()
    return 0


def _fenced(cfg: config.RoleConfig, m: metrics.Metrics, sync: wire.Sync, highest: int) -> None:
    m.fenced_pushes.inc()
    print(f"{cfg.name}: refused the push of policy v{sync.version} from trainer epoch {sync.trainer_epoch} "
          f"(epoch {highest} took over)", file=sys.stderr, flush=True)


def _on_gpu() -> bool:
    """Whether vLLM serves on a GPU here (vllm's CUDA build with a device), not on the CPU."""
    import torch

    return bool(torch.cuda.is_available())
