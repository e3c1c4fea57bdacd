"""GRPO maths: group-normalised advantages, the loss variants (GRPO, DrGRPO, DAPO, GSPO) and the k3 KL penalty.

Role: pure tensor functions, no model, no I/O. The trainer (``kubeforge.runtime.learner.step``) collates scored
rollout groups into :class:`~kubeforge.runtime.grpo.inputs.LossInputs`, asks :func:`registry.loss_for` for the
variant named by ``spec.algorithm.loss`` and calls it.

Modules:
- ``advantages`` — (r - mean) / (std + eps) per group (GRPO, DAPO); r - mean (DrGRPO).
- ``inputs``     — ``LossInputs`` (padded token tensors), ``LossSettings`` (clip range, KL coefficient, length
  budget), ``LossOutput`` (sum, denominator, metrics).
- ``surrogate``  — the per-token clipped surrogate against the BEHAVIOUR logprobs, shared by every variant.
- ``kl``         — the k3 estimator of KL(policy || reference).
- ``grpo``, ``drgrpo``, ``dapo`` — one file per variant: only how per-token terms are reduced differs.
- ``gspo``       — GSPO: one importance ratio per sequence (the length-normalised sequence likelihood ratio).
- ``overlong``   — DAPO's soft overlong punishment, added to the rewards before the advantages.
- ``registry``   — ``LossType`` -> loss function; no if-chains.

Invariant: every loss returns a *sum* and a *denominator* (sequences or tokens) instead of a mean, so data-parallel
ranks can all-reduce the denominators first and get exactly the loss of one big batch.
"""
