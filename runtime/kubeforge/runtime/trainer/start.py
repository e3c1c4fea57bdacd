"""Wiring of a trainer rank: data-parallel group, learner, sockets, and on rank 0 the weight push and reporter.

Neighbours: ``role.run`` calls :func:`main`; ``trainer.loop.Loop`` is the loop it runs; ``startup`` has the helpers
every role's start shares. The weight-sync store
lives on trainer 0 at ``contract.PORT_WEIGHTS``, the data-parallel store at ``contract.PORT_DIST``.
"""
from __future__ import annotations

import pathlib
import sys
import threading
from collections.abc import Callable

import torch
import transformers

from kubeforge.api import contract, rljob, roleenv
from kubeforge.runtime import config, hardware, metrics, models, observe, startup, tasks, transport, weightsync
from kubeforge.runtime.learner import fence, parallel, step
from kubeforge.runtime.trainer import episode_eval, evaluate, export_requests, loop, pusher, report
from kubeforge.runtime.verifiers import registry


def backend(spec: rljob.WeightSyncSpec) -> str:
    if spec.backend == rljob.WeightSyncBackend.AUTO.value:
        return "nccl" if torch.cuda.is_available() else "gloo"
    return "nccl" if spec.backend == rljob.WeightSyncBackend.NCCL.value else "gloo"


def settings(cfg: config.RoleConfig) -> loop.Settings:
    spec = cfg.spec
    return loop.Settings(
        rank=cfg.index, world=cfg.replicas("trainer"), steps=spec.algorithm.steps,
        prompts_per_step=spec.algorithm.prompts_per_step, max_policy_lag=spec.algorithm.max_policy_lag,
        sync_every=spec.weight_sync.every_steps, checkpoint_every=spec.checkpoint.every_steps,
        checkpoint_dir=cfg.checkpoint_dir, checkpoint_keep=spec.checkpoint.keep,
        deadline=float(spec.failure_policy.progress_deadline_seconds),
        reissue_after=max(1.0, spec.failure_policy.progress_deadline_seconds / 4),
        peer_silence=float(spec.failure_policy.peer_silence_seconds),
        start_deadline=float(spec.failure_policy.start_deadline_seconds()),
        colocated=spec.schedule.mode == rljob.ScheduleMode.COLOCATED,
        refill_rounds=spec.algorithm.refill_rounds(),
        stop_within=float(contract.STOP_CHECKPOINT_WITHIN_SECONDS))


def reporter(cfg: config.RoleConfig) -> report.Reporter:
    if cfg.report == roleenv.REPORT_POD_ANNOTATION:
        if not cfg.pod_name or not cfg.namespace:
            raise config.ConfigError([f"{contract.ENV_POD_NAME}/{contract.ENV_NAMESPACE}: Required value: "
                                      f"{contract.ENV_REPORT}=pod-annotation needs both"])
        return report.Tee(report.StdoutReporter(),
                          report.PodAnnotationReporter(pod=cfg.pod_name, namespace=cfg.namespace))
    if cfg.report == roleenv.REPORT_JSONL and cfg.run_dir is not None:
        return report.JsonlReporter(path=pathlib.Path(cfg.run_dir) / "metrics.jsonl")
    return report.StdoutReporter()


def _group(cfg: config.RoleConfig) -> parallel.DataParallel:
    dist = parallel.DistConfig.of_role(cfg, backend="nccl" if torch.cuda.is_available() else "gloo")
    return parallel.DataParallel(config=dist, device=device(cfg))


def device(cfg: config.RoleConfig) -> str:
    """``cuda:<local rank>`` with GPUs (one rank per GPU of the pod), else ``cpu``."""
    if not torch.cuda.is_available():
        return "cpu"
    local = cfg.local_rank or 0
    torch.cuda.set_device(local)
    return f"cuda:{local}"


def _rank0(cfg: config.RoleConfig, *, learner: step.Trainer, generators: transport.Sender,
           control: transport.Receiver, beat: Callable[[str], None] | None = None) -> loop.Rank0:
    spec = cfg.spec
    me = cfg.peer("trainer", 0)
    world = weightsync.world_size(generators=cfg.replicas("generator"),
                                  tensor_parallel_size=spec.roles.generator.tensor_parallel_size)
    be = backend(spec.weight_sync)
    sender = weightsync.WeightSender(host=me.host, port=me.port(contract.PORT_WEIGHTS), world_size=world,
                                     timeout=spec.weight_sync.timeout_seconds, backend=be,
                                     join_timeout=float(spec.failure_policy.progress_deadline_seconds),
                                     delta=spec.weight_sync.delta)
    push = pusher.Pusher(generators=generators, control=control, sender=sender, tensors=learner.named_tensors,
                         host=me.host, port=me.port(contract.PORT_WEIGHTS), world_size=world, backend=be,
                         timeout_s=spec.weight_sync.timeout_seconds, trainer_epoch=cfg.trainer_epoch)
    ev = spec.evaluation
    held_out = evaluator(cfg, learner, beat)
    return loop.Rank0(control=control, pusher=push, reporter=reporter(cfg),
                      evaluate=held_out.run if held_out is not None else None,
                      eval_every=ev.every_steps if ev is not None else 0, exports=export_source(cfg))


def export_source(cfg: config.RoleConfig) -> export_requests.Requests | None:
    """Where rank 0 sees export requests: its pod's annotation on a cluster, the run directory locally."""
    if cfg.report == roleenv.REPORT_POD_ANNOTATION and cfg.pod_name and cfg.namespace:
        return export_requests.PodAnnotationRequests(pod=cfg.pod_name, namespace=cfg.namespace)
    if cfg.run_dir is not None:
        return export_requests.FileRequests(pathlib.Path(cfg.run_dir))
    return None


def evaluator(cfg: config.RoleConfig, learner: step.Trainer,
              beat: Callable[[str], None] | None = None) -> evaluate.Evaluator | episode_eval.EpisodeEvaluator | None:
    """Rank 0's held-out evaluator on the trainer's own model (None with a sharded model: its forward needs every
    rank, and evaluation runs on rank 0 alone); ``beat`` (the role's heartbeat) hears of every decoding step."""
    spec = cfg.spec
    ev = spec.evaluation
    if ev is None:
        return None
    if learner.sharded:
        print("trainer: spec.evaluation is skipped with FSDP sharding (evaluation runs on rank 0 alone)",
              file=sys.stderr, flush=True)
        return None
    tok = transformers.AutoTokenizer.from_pretrained(str(learner.model_path))
    base = evaluate.Evaluator(
        model=learner.model, tokenizer=tok, prompts=evaluate.held_out(tasks.stream(spec.task), ev),
        verifier=registry.build_inner(evaluate.verifier_spec(spec)),
        max_new_tokens=ev.max_new_tokens or spec.algorithm.max_new_tokens, chat_template=spec.task.chat_template,
        compute_dtype=learner.compute_dtype, device=learner.device,
        progress=(lambda: beat("evaluate")) if beat is not None else None)
    if spec.environment is None:
        return base
    from kubeforge.runtime.agents.hosts import workers

    return episode_eval.EpisodeEvaluator(
        base=base, spec=spec, host=workers.SubprocessHost(spec.environment, workers=1),
        verifier=base.verifier, max_context=int(getattr(learner.model.config, "max_position_embeddings", 2048)))


EXIT_TERMINATED = 143   # 128 + SIGTERM, as if the signal had ended the process
EXIT_FENCED = 75        # a newer trainer epoch claimed the checkpoints: this trainer is stale (docs/fencing.md)


def generator_address(cfg: config.RoleConfig) -> Callable[[int], str | None]:
    """Where generator ``i`` listens, for a generator that joins a running job (elastic replicas): its stable DNS
    name on a cluster; locally the launcher's processes are fixed, so none can join."""
    namespace = cfg.namespace
    if cfg.report != roleenv.REPORT_POD_ANNOTATION or namespace is None:
        return lambda index: None
    held = cfg.spec.roles.generator.gang_held()      # beyond it: the surplus StatefulSet's pods
    return lambda index: transport.tcp_address(
        contract.peer_host(cfg.job_name, "generator", index, namespace, gang_held=held),
        contract.DEFAULT_PORT_BASE + contract.PORT_DATA)


def main(cfg: config.RoleConfig, m: metrics.Metrics, server: metrics.MetricsServer,
         stop: threading.Event | None = None) -> int:
    spec = cfg.spec
    s = settings(cfg)
    inbox = transport.open_receiver(startup.bind(cfg, contract.PORT_DATA), on_drop=m.drop_hook(),
                                    hwm=(s.max_policy_lag + 2) * s.prompts_per_step + 64)
    control = (transport.open_receiver(startup.bind(cfg, contract.PORT_CONTROL), on_drop=m.drop_hook())
               if cfg.index == 0 else None)     # bound before the slow parts: generators connect to it at start
    # Built-ins are built before joining the group: once a process group exists, transformers' save_pretrained
    # writes nothing on ranks other than 0, and a trainer pod has its own model cache (models/cache.py).
    model_path = models.resolve(spec.model)
    group = _group(cfg)
    learner = step.Trainer(model_path=model_path, algorithm=spec.algorithm, dtype=spec.model.dtype,
                           group=group, device=str(group.device),
                           logit_temperature=spec.algorithm.temperature or 1.0,
                           scale=step.Scale.from_spec(spec.roles.trainer), lora=spec.model.lora,
                           trainer_epoch=cfg.trainer_epoch)
    generators = transport.open_sender(startup.data_addresses(cfg, "generator"), role="trainer", index=cfg.index,
                                       send_timeout=startup.role_deadline(cfg))
    slow = hardware.slow_dtype_warning(str(spec.model.dtype)) if learner.device.type == "cpu" else None
    if slow is not None:
        print(f"{cfg.name}: warning: {slow}", file=sys.stderr, flush=True)
    rank0 = (_rank0(cfg, learner=learner, generators=generators, control=control, beat=server.heartbeat)
             if control is not None else None)
    server.set_ready(True)
    stream = tasks.stream(spec.task)
    fenced = False
    try:
        loop.Loop(settings=s, inbox=inbox, generators=generators, learner=learner, prompt_at=stream.prompt_at,
                  observer=observe.TrainerObserver(m), rank0=rank0, beat=server.heartbeat,
                  should_stop=stop.is_set if stop is not None else lambda: False,
                  stopped_at=lambda: getattr(stop, "at", None),
                  generator_address=generator_address(cfg)).run()
    except loop.Terminated as exc:
        print(f"{cfg.name}: {exc}", flush=True)
        return EXIT_TERMINATED
    except fence.Fenced as exc:      # a newer trainer epoch owns the job: stop writing at once (docs/fencing.md)
        print(f"{cfg.name}: fenced: {exc}", file=sys.stderr, flush=True)
        fenced = True
        return EXIT_FENCED
    finally:
        if rank0 is not None and not fenced:   # fenced: a push in flight waits for generators that refused it
            rank0.pusher.close()  # type: ignore[attr-defined]
        if control is not None:
            control.close()
        generators.close()
        inbox.close()
        group.close()
    return 0
