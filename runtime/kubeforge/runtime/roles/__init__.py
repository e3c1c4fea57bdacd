"""One main loop per role, reading like the data-plane diagram in docs/runtime.md.

Modules: ``generator``, ``verifier``, ``trainer`` (the loops; transport, weight sync and metrics are injected),
``report`` (trainer rank 0's progress reporters), ``main`` (``kubeforge role ROLE``: env contract → wiring →
loop). The loops import no ZeroMQ and no vLLM themselves: ``main`` builds the real parts, unit tests build
in-process ones.
"""
