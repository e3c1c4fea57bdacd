"""The trainer role: its loop and start-up, and the learning side (rollout buffer, GRPO train step, data-parallel
group, checkpoints).

Role modules:
- ``loop``       — ``Loop``: one trainer rank's run (collect a step's groups, train, push, report, checkpoint); the
  transport, learner, weight pusher and reporter are injected. It owns one part per concern:
- ``membership`` — rank 0's elastic generators: join, leave, restart, silence after a failed push; epochs follow.
- ``pushes``     — when the loop pushes its weights, the push that overlaps the next step, a failed push.
- ``accuracy``   — rank 0's held-out accuracy through the run, in the step records.
- ``start``      — ``kubeforge role trainer``: the data-parallel group, the learner, the sockets and on rank 0 the
  weight push, reporter and evaluator, wired around the loop.
- ``ranks``      — a trainer pod with several ranks: the pod's process starts and stands for them.
- ``pusher``     — rank 0's weight push over the wire: SYNC notices, the ``weightsync`` broadcast, the ACKs.
- ``report``     — rank 0's progress reporters (JSONL locally, the pod annotation on a cluster).
- ``export_requests`` — export on request: where rank 0 sees a request (run directory, pod annotation), and
  serving it after a step.

Learning modules:
- ``buffer``     — ``RolloutBuffer``: scored groups by step; drops stale (> maxPolicyLag) ones, counted by reason;
  bounded; says which prompts to re-issue.
- ``batch``      — ``collate``: groups -> one left/right padded token batch with advantages.
- ``logprobs``   — current-policy logprobs of the completion tokens (completion positions only, chunked LM head).
- ``policy``     — ``Policy``: the trained root module (HF LM whose forward returns completion logprobs).
- ``precision``  — compute dtype vs float32 masters: autocast, FSDP2's mixed precision policy, fused AdamW.
- ``sharding``   — FSDP2 over the trainer ranks, activation checkpointing, full tensors gathered one at a time,
  sharded (DCP) checkpoint I/O.
- ``step``       — ``Trainer``: policy (+ frozen reference), AdamW, ``train_step`` (micro-batches),
  ``named_tensors``, ``follow_sync``, ``save_checkpoint``, ``resume``. Design: docs/trainer.md.
- ``parallel``   — ``DistConfig`` / ``DataParallel``: torch.distributed group (gloo/NCCL), gradient mean.
- ``checkpoint`` — atomic checkpoints with manifest, checksums and a COMPLETE marker; ``latest``, ``load``.
- ``step_metrics`` — ``StepMetrics``: what one optimizer step reports.
- ``compute_copy`` — the bf16/fp16 compute copy of an unsharded policy, cast once per optimizer step.
- ``hf_export``  — the policy written as a Hugging Face folder next to the checkpoints.

Typical role loop (rank r of W)::

    group = parallel.DataParallel(config=parallel.DistConfig(rank=r, world_size=W, master_host=..., master_port=...))
    trainer = step.Trainer(model_path=models.resolve(spec.model), algorithm=spec.algorithm, group=group)
    state = trainer.resume(directory=ckpt_dir)              # None on a fresh start
    buf = buffer.RolloutBuffer(max_policy_lag=lag, capacity=...)
    for s in range(trainer.step, spec.algorithm.steps):
        ... receive groups: buf.add(group=g, policy_version=trainer.policy_version)
        ... until buf.ready(step=s, expected=my_share, policy_version=trainer.policy_version);
        ... forward buf.drain_reissue() to rank 0's data cursor
        m = trainer.train_step(groups=buf.take(step=s, policy_version=trainer.policy_version))
        if r == 0 and trainer.step % every == 0: trainer.save_checkpoint(directory=..., keep=..., data_cursor=...)
"""
