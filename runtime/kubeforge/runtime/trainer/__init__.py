"""The trainer role: its loop and start-up, and the duties of rank 0 (the data cursor, the weight push, reports,
evaluation, export on request). The learning itself (the train step, the policy, checkpoints) is ``learner/``,
behind ``learner.base.Learner``.

Modules:
- ``loop``       — ``Loop``: one trainer rank's run (collect a step's groups, train, push, report, checkpoint); the
  transport, learner, weight pusher and reporter are injected. It owns one part per concern:
- ``buffer``     — ``RolloutBuffer``: scored groups by step; drops stale (> maxPolicyLag) ones, counted by reason;
  bounded; says which prompts to re-issue.
- ``record``     — the step's record: the learner's figures, then the loop's, the lag and episode figures.
- ``saves``      — the loop's checkpoint writes, and on SIGTERM the stop checkpoint within its bound.
- ``membership`` — rank 0's elastic generators: join, leave, restart, silence after a failed push; epochs follow.
- ``pushes``     — when the loop pushes its weights, the push that overlaps the next step, a failed push.
- ``accuracy``   — rank 0's held-out accuracy through the run, in the step records.
- ``episode_figures`` — the step's episode figures (turns, tool calls, masked environment tokens).
- ``start``      — ``kubeforge role trainer``: the data-parallel group, the learner, the sockets and on rank 0 the
  weight push, reporter and evaluator, wired around the loop.
- ``ranks``      — a trainer pod with several ranks: the pod's process starts and stands for them.
- ``pusher``     — rank 0's weight push over the wire: SYNC notices, the ``weightsync`` broadcast, the ACKs.
- ``report``     — rank 0's progress reporters (JSONL locally, the pod annotation on a cluster).
- ``evaluate``   — held-out evaluation: the policy's greedy answers to held-out prompts, scored.
- ``episode_eval`` — held-out evaluation of a job with ``spec.environment``: greedy episodes.
- ``export_requests`` — export on request: where rank 0 sees a request (run directory, pod annotation), and
  serving it after a step.
"""
