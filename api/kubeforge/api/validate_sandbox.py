"""Cross-field rules of ``spec.sandbox`` (the warm pool of sandbox pods; docs/sandboxes.md), one of ``validate``'s
rule sets.

Neighbours: ``validate.RULES`` lists :func:`problems`; ``validate._roles`` checks the pods' own settings as a role's
(``pod_problems``). Messages follow ``validate``'s wording: ``<field path>: <reason>``.
"""
from __future__ import annotations

from collections.abc import Iterator

from kubeforge.api import rljob

# what a sandbox pod may not be given: each could carry a secret into a pod that runs model-written code
_NO_SECRETS = (("env", "env"), ("env_from", "envFrom"), ("volumes", "volumes"), ("volume_mounts", "volumeMounts"))


def users(spec: rljob.RLJobSpec) -> list[str]:
    """What would claim sandboxes: the CodeFeedback environment, the CodeExecution verifiers (their field paths)."""
    out = []
    env = spec.environment
    if env is not None and env.type == rljob.EnvironmentType.CODE_FEEDBACK.value:
        out.append("spec.environment")
    out += [f"spec.verifiers[{i}]" for i, v in enumerate(spec.verifiers)
            if v.type == rljob.VerifierType.CODE_EXECUTION.value]
    return out


def problems(spec: rljob.RLJobSpec) -> Iterator[str]:
    box = spec.sandbox
    if box is None:
        return
    if not users(spec):
        yield ("spec.sandbox: Invalid value: nothing would claim a sandbox: needs spec.environment.type CodeFeedback "
               "or a verifier of type CodeExecution")
    for attr, name in _NO_SECRETS:
        if getattr(box, attr):
            yield (f"spec.sandbox.{name}: Forbidden: a sandbox pod runs model-written code and is given nothing of "
                   "the job's (no env, envFrom, volumes or volumeMounts)")
    for i, v in enumerate(spec.verifiers):
        ce = v.code_execution
        if v.type == rljob.VerifierType.CODE_EXECUTION.value and ce is not None \
                and ce.timeout_seconds > box.max_run_seconds:
            yield (f"spec.verifiers[{i}].codeExecution.timeoutSeconds: Invalid value: {ce.timeout_seconds:g}: should "
                   f"be at most spec.sandbox.maxRunSeconds ({box.max_run_seconds:g}): a sandbox pod cuts a run there")
