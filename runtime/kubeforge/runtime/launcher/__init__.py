"""``kubeforge run``: the local launcher. Starts every role as a process, supervises, reports, summarises.

Modules: ``main`` (composition), ``ports`` (free port blocks), ``supervisor`` (process groups, restart policy),
``progress`` (tails the trainer's metrics JSONL into a progress bar), ``rundir`` (layout of a run directory),
``summary`` (pure: metrics records → summary), ``plot`` (reward curve PNG).
"""
