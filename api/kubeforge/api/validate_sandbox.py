"""Cross-field rules of ``spec.sandbox`` (the warm pool of sandbox pods; docs/sandboxes.md), one of ``validate``'s
rule sets.

Neighbours: ``validate.RULES`` lists :func:`problems`; ``validate._roles`` checks the pods' own settings as a role's
(``pod_problems``). Messages follow ``validate``'s wording: ``<field path>: <reason>``.
"""
from __future__ import annotations

from collections.abc import Iterator

from kubeforge.api import rljob

# volume kinds that can carry a secret (a Secret, a projected token or Secret, a ConfigMap, the pod's own fields, a
# CSI secrets-store driver): a sandbox pod runs model-written code and is given none of them
SECRET_VOLUMES = ("secret", "projected", "configMap", "downwardAPI", "csi")


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
    why = "a sandbox pod runs model-written code and is given no secret"
    if box.env_from:
        yield f"spec.sandbox.envFrom: Forbidden: {why} (no envFrom; env with plain values only)"
    for i, e in enumerate(box.env):
        if e.value_from is not None:
            yield f"spec.sandbox.env[{i}].valueFrom: Forbidden: {why} (env with plain values only)"
    for i, vol in enumerate(box.volumes):
        kinds = sorted(k for k in vol if k in SECRET_VOLUMES)
        if kinds:
            yield (f"spec.sandbox.volumes[{i}]: Forbidden: {why} (no {', '.join(kinds)} volume; hostPath, emptyDir "
                   "or a claim for tools and interpreters)")
    for i, v in enumerate(spec.verifiers):
        ce = v.code_execution
        if v.type == rljob.VerifierType.CODE_EXECUTION.value and ce is not None \
                and ce.timeout_seconds > box.max_run_seconds:
            yield (f"spec.verifiers[{i}].codeExecution.timeoutSeconds: Invalid value: {ce.timeout_seconds:g}: should "
                   f"be at most spec.sandbox.maxRunSeconds ({box.max_run_seconds:g}): a sandbox pod cuts a run there")
