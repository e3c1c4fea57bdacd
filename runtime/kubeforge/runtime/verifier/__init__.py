"""The verifier role: rollout groups in, one batched scoring call per group, scored groups out to the trainers.

Modules: ``loop`` (the role's loop; transport and scoring injected), ``start`` (``kubeforge role verifier``: the
real parts, ZeroMQ and the ``verifiers.Scorer``, wired around the loop). The scorers themselves are the library
``kubeforge.runtime.verifiers``.
"""
