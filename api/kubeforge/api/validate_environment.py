"""Cross-field rules of ``spec.environment`` (multi-turn episodes), one of ``validate``'s rule sets.

Neighbours: ``validate.RULES`` lists :func:`problems` with the other rules, so ``kubeforge validate``, the
launcher, the roles and the admission webhook refuse the same mistakes; ``rljob.EnvironmentSpec`` holds the
one-section rules (settings per type). Messages follow ``validate``'s wording: ``<field path>: <reason>``.
"""
from __future__ import annotations

from collections.abc import Iterator

from kubeforge.api import builtins, rljob

ENV_SCORE = "environment"   # the score name the verifier role gives the environment's reward


def problems(spec: rljob.RLJobSpec) -> Iterator[str]:
    env = spec.environment
    if env is None:
        return
    algo = spec.algorithm
    if env.max_tokens_per_episode is not None and env.max_tokens_per_episode < algo.max_new_tokens:
        yield (f"spec.environment.maxTokensPerEpisode: Invalid value: {env.max_tokens_per_episode}: should be at "
               f"least spec.algorithm.maxNewTokens ({algo.max_new_tokens}): the first policy turn alone may take that")
    if algo.partial_rollouts:
        yield ("spec.algorithm.partialRollouts: Invalid value: true: cannot be used with spec.environment: an "
               "episode's turns are sampled whole, between weight updates")
    if algo.overlong_buffer is not None:
        yield ("spec.algorithm.overlongBuffer: Forbidden: cannot be used with spec.environment: its penalty reads a "
               "completion's length against maxNewTokens, but an episode is several turns long")
    for i, v in enumerate(spec.verifiers):
        if v.name == ENV_SCORE:
            yield (f"spec.verifiers[{i}].name: Invalid value: {ENV_SCORE!r}: reserved with spec.environment (the "
                   "environment's reward travels as the score of that name)")
    gen_len = spec.roles.generator.max_model_len
    if gen_len is not None and gen_len <= env.episode_tokens(algo.max_new_tokens):
        yield (f"spec.roles.generator.maxModelLen: Invalid value: {gen_len}: should be greater than the episode "
               f"bound ({env.episode_tokens(algo.max_new_tokens)} tokens: spec.environment.maxTokensPerEpisode, or "
               "maxTurns x maxNewTokens + 256 per environment turn) plus the prompt")
    if env.turn_timeout_seconds > spec.failure_policy.progress_deadline_seconds:
        yield (f"spec.environment.turnTimeoutSeconds: Invalid value: {env.turn_timeout_seconds:g}: should be at "
               f"most spec.failurePolicy.progressDeadlineSeconds ({spec.failure_policy.progress_deadline_seconds}): a "
               "generator waiting that long on one step makes no progress and is restarted as hung first")
    if env.type == rljob.EnvironmentType.AGENT.value and spec.evaluation is not None:
        yield ("spec.evaluation: Forbidden: cannot be used with spec.environment.type 'Agent' yet (held-out "
               "episodes run the built-in episode runner on the trainer; the agent pods sample through the "
               "generators' endpoint)")
    if env.type == rljob.EnvironmentType.VERIFIERS.value and spec.evaluation is not None:
        # held-out episodes run the built-in episode runner over the trainer's HF model (trainer/episode_eval.py); a
        # Verifiers agent samples through the generator's endpoint, which the trainer does not have
        yield ("spec.evaluation: Forbidden: cannot be used with spec.environment.type 'Verifiers' yet (held-out "
               "episodes run the built-in episode runner; the library's agents sample through a generator's endpoint)")
    yield from _native(spec, env)
    if env.type == rljob.EnvironmentType.CODE_FEEDBACK.value and spec.task.code is None and spec.task.jsonl is None:
        yield ("spec.environment.type: Invalid value: 'CodeFeedback': runs the task's reference answer as tests; "
               "use it with a code or jsonl task")


def _native(spec: rljob.RLJobSpec, env: rljob.EnvironmentSpec) -> Iterator[str]:
    """Native tool calls are written in the chat template's format: a model without one cannot take them (a
    ``path`` model's template is read by the launcher and the roles' start, ``runtime.config.local_problems``)."""
    if env.tool_format != rljob.ToolFormat.NATIVE.value:
        return
    if not spec.task.chat_template:
        yield ("spec.environment.toolFormat: Invalid value: 'Native': needs the model's chat template, and "
               "spec.task.chatTemplate is false; use toolFormat Tags, or set chatTemplate true")
    built = builtins.of(spec.model)
    if built is not None and built[1].tool_format is None:
        yield (f"spec.environment.toolFormat: Invalid value: 'Native': the built-in model {built[0]!r} has no chat "
               "template with a tool-call format; use toolFormat Tags, or a model whose template writes tool calls "
               "(smollm2-135m-instruct, the Qwen2.5 / Hermes families)")
