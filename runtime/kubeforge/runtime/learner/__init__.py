"""The learner: everything that computes a training step of the policy, behind ``base.Learner``.

The trainer role (``trainer/``) drives it: its loop hands each step's scored groups to
``Learner.train_step`` and gets back the step's figures (``progress.StepMetrics``, the first part of the step's
record); pushes, checkpoints and exports go through the same face. Nothing here talks to a peer: no transport, no
wire, no weight sync, no Kubernetes (an import-linter contract in pyproject.toml). Design: docs/trainer.md.

Modules:
- ``base``       — ``Learner``: what the trainer role needs of a learner.
- ``step``       — ``Trainer``: policy (+ frozen reference), AdamW, ``train_step`` (micro-batches),
  ``named_tensors``, ``follow_sync``, ``save_checkpoint``, ``resume``, ``export``.
- ``batch``      — ``collate``: groups -> one left/right padded token batch with advantages.
- ``staleness``  — partial rollouts: per-token masks of stale tokens, the step's token-lag figures.
- ``dynamic_sampling`` — DAPO's dynamic sampling: which groups a step trains on, refills, the step's counts.
- ``policy``     — ``Policy``: the trained root module (HF LM whose forward returns completion logprobs).
- ``logprobs``   — current-policy logprobs of the completion tokens (completion positions only, chunked LM head).
- ``lmhead``     — the LM head's completion logprobs and the input embedding, in chunks.
- ``truncation`` — top-k / top-p truncation of the trainer's logits, as the sampler's.
- ``precision``  — compute dtype vs float32 masters: autocast, FSDP2's mixed precision policy, fused AdamW.
- ``compute_copy`` — the bf16/fp16 compute copy of an unsharded policy, cast once per optimizer step.
- ``compiled``   — ``spec.roles.trainer.compile``: decoder blocks through torch.compile.
- ``schedule``   — the learning-rate schedule.
- ``lora``       — LoRA adapters in the trained model (the adapter format itself: ``models.adapter``).
- ``sharding``   — FSDP2 over the trainer ranks, activation checkpointing, full tensors gathered one at a time,
  sharded (DCP) checkpoint I/O.
- ``materialise`` — a sharded model built without ever holding the whole model.
- ``parallel``   — ``DistConfig`` / ``DataParallel``: torch.distributed group (gloo/NCCL), gradient mean.
- ``checkpoint`` — atomic checkpoints with manifest, checksums and a COMPLETE marker; ``latest``, ``load``.
- ``persist``    — the learner's state in and out of a checkpoint: rank 0 alone (replicated) or every rank its shards.
- ``fence``      — the checkpoint store's fence: trainer epochs claim it, stale commits refused and never read.
- ``hf_export``  — the policy written as a Hugging Face folder next to the checkpoints.
- ``malloc``     — freed tensor memory goes back to the system.

One rank of W::

    group = parallel.DataParallel(config=parallel.DistConfig(rank=r, world_size=W, master_host=..., master_port=...))
    learner = step.Trainer(model_path=models.resolve(spec.model), algorithm=spec.algorithm, group=group)
    state = learner.resume(directory=ckpt_dir)              # None on a fresh start
    for s in range(learner.step, spec.algorithm.steps):
        metrics = learner.train_step(groups=my_groups_of(s))     # progress.StepMetrics
        if learner.step % every == 0: learner.save_checkpoint(directory=..., keep=..., data_cursor=...)
"""
