"""One table of invalid RLJob manifests, refused alike by the local launcher and by the API server.

Role: the shared fixture of three tests. ``tests/api/test_invalid_manifests.py`` feeds every case to
``kubeforge.api.load.parse`` (and ``kubeforge validate``); ``e2e/test_crd_validation.py`` creates every
``CASES`` case (what the CRD's schema and CEL rules say) on the real kube-apiserver (server-side dry run, strict
field validation, as ``kubectl apply`` does); ``e2e/test_webhook_admission.py`` creates every ``SEMANTIC_CASES`` case (the
cross-field and semantic rules of ``kubeforge.api.validate``) with the operator's admission webhook installed. All
assert that the refusal names ``case.path`` and contains ``case.message``.

Invariants:
- ``valid()`` is a complete, valid manifest; each case breaks exactly one rule of it, so every error a side
  reports must name the case's path (tests check that too, which keeps cases from passing by accident).
- ``message`` is a fragment both sides' wording shares (compared case-insensitively): the launcher words its
  messages like the API server (``kubeforge.api.load``), CEL rules and pydantic validators share one constant.
- Paths use wire names with ``[i]`` for list items, as both sides print them. The API server names a duplicate
  list-map key by the second item (``spec.verifiers[1]``), the launcher by the list: a path is matched as a
  prefix.
"""
from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from typing import Any

from kubeforge.api import rljob

Manifest = dict[str, Any]


def valid() -> Manifest:
    """A complete valid RLJob touching every section of the spec."""
    return {
        "apiVersion": "kubeforge.dev/v1alpha1",
        "kind": "RLJob",
        "metadata": {"name": "probe"},
        "spec": {
            "model": {"builtin": "tiny", "dtype": "float32"},
            "task": {"arithmetic": {"digits": 2, "operations": ["+", "-"]}, "seed": 0},
            "verifiers": [
                {"name": "answer", "type": "ExactAnswer", "weight": 1.0},
                {"name": "format", "type": "Regex", "regex": {"pattern": r"^\s*-?\d+\s*$"}, "weight": 0.1},
            ],
            "algorithm": {"loss": "GRPO", "groupSize": 4, "promptsPerStep": 8, "steps": 10, "maxNewTokens": 16,
                          "temperature": 1.0, "learningRate": 1e-5, "clipEpsilon": 0.2, "klCoef": 0.0,
                          "maxPolicyLag": 1},
            "weightSync": {"everySteps": 1},
            "checkpoint": {"path": "/checkpoints", "everySteps": 5},
            "roles": {
                "generator": {"replicas": 1, "resources": {"limits": {"nvidia.com/gpu": 1},
                                                           "requests": {"cpu": "500m", "memory": "1.5Gi"}}},
                "verifier": {"replicas": 1},
                "trainer": {"replicas": 1, "env": [{"name": "A", "value": "1"}]},
            },
            "gang": {"backend": "Coscheduling"},
            "placement": {"topologyKey": "topology.kubernetes.io/zone", "mode": "Required"},
            "schedule": {"mode": "Overlapped"},
            "suspend": False,
            "activeDeadlineSeconds": 3600,
            "ttlSecondsAfterFinished": 60,
        },
    }


def _walk(doc: Manifest, dotted: str) -> tuple[Any, str | int]:
    """The container holding the last key of ``dotted`` (``a.b.0.c``: digits index lists)."""
    parts: list[str | int] = [int(p) if p.isdigit() else p for p in dotted.split(".")]
    node: Any = doc
    for part in parts[:-1]:
        node = node[part]
    return node, parts[-1]


def _set(dotted: str, value: Any) -> Callable[[Manifest], None]:
    def apply(doc: Manifest) -> None:
        node, key = _walk(doc, dotted)
        node[key] = copy.deepcopy(value)
    return apply


def _drop(dotted: str) -> Callable[[Manifest], None]:
    def apply(doc: Manifest) -> None:
        node, key = _walk(doc, dotted)
        del node[key]
    return apply


def _all(*steps: Callable[[Manifest], None]) -> Callable[[Manifest], None]:
    def apply(doc: Manifest) -> None:
        for step in steps:
            step(doc)
    return apply


@dataclasses.dataclass(frozen=True, kw_only=True)
class Case:
    """An invalid manifest: ``valid()`` changed by ``change``; refused naming ``path`` with ``message``."""

    id: str
    change: Callable[[Manifest], None]
    path: str
    message: str

    def manifest(self) -> Manifest:
        doc = valid()
        self.change(doc)
        return doc


GE = "should be greater than or equal to"
GT = "should be greater than "
LE = "should be less than or equal to"
ENUM = "Unsupported value"
REQUIRED = "Required value"
UNKNOWN = "unknown field"
DUP = "Duplicate value"

CASES: tuple[Case, ...] = (
    # ---- metadata (root CEL rules at .metadata.name)
    Case(id="name-too-long", change=_set("metadata.name", "a" * 41), path="metadata.name",
         message=rljob.MSG_NAME_TOO_LONG),
    Case(id="name-starts-with-digit", change=_set("metadata.name", "1job"), path="metadata.name",
         message=rljob.MSG_NAME_NOT_DNS1035),
    Case(id="name-with-dot", change=_set("metadata.name", "my.job"), path="metadata.name",
         message=rljob.MSG_NAME_NOT_DNS1035),
    # ---- spec and unknown fields
    Case(id="spec-missing", change=_drop("spec"), path="spec", message=REQUIRED),
    Case(id="unknown-spec-field", change=_set("spec.learningRate", 0.1), path="spec.learningRate", message=UNKNOWN),
    Case(id="unknown-algorithm-field", change=_set("spec.algorithm.lr", 0.1), path="spec.algorithm.lr",
         message=UNKNOWN),
    Case(id="unknown-role", change=_set("spec.roles.worker", {"replicas": 1}), path="spec.roles.worker",
         message=UNKNOWN),
    # ---- model: exactly one source, closed enums
    Case(id="model-no-source", change=_drop("spec.model.builtin"), path="spec.model", message=rljob.MSG_ONE_MODEL),
    Case(id="model-two-sources", change=_set("spec.model.path", "/models/x"), path="spec.model",
         message=rljob.MSG_ONE_MODEL),
    Case(id="model-unknown-builtin", change=_set("spec.model.builtin", "gpt-9"), path="spec.model.builtin",
         message=ENUM),
    Case(id="model-dtype", change=_set("spec.model.dtype", "int8"), path="spec.model.dtype", message=ENUM),
    Case(id="model-missing", change=_drop("spec.model"), path="spec.model", message=REQUIRED),
    Case(id="model-path-empty", change=_all(_drop("spec.model.builtin"), _set("spec.model.path", "")),
         path="spec.model.path", message="should be at least 1 chars long"),
    # ---- task: exactly one source
    Case(id="task-no-source", change=_drop("spec.task.arithmetic"), path="spec.task", message=rljob.MSG_ONE_TASK),
    Case(id="task-two-sources", change=_set("spec.task.copy", {"length": 1}), path="spec.task",
         message=rljob.MSG_ONE_TASK),
    Case(id="task-seed-negative", change=_set("spec.task.seed", -1), path="spec.task.seed", message=f"{GE} 0"),
    Case(id="arithmetic-digits-zero", change=_set("spec.task.arithmetic.digits", 0),
         path="spec.task.arithmetic.digits", message=f"{GE} 1"),
    Case(id="arithmetic-digits-huge", change=_set("spec.task.arithmetic.digits", 7),
         path="spec.task.arithmetic.digits", message=f"{LE} 6"),
    Case(id="arithmetic-operation", change=_set("spec.task.arithmetic.operations", ["/"]),
         path="spec.task.arithmetic.operations[0]", message=ENUM),
    Case(id="arithmetic-no-operations", change=_set("spec.task.arithmetic.operations", []),
         path="spec.task.arithmetic.operations", message="should have at least 1 items"),
    Case(id="jsonl-no-path", change=_all(_drop("spec.task.arithmetic"), _set("spec.task.jsonl", {})),
         path="spec.task.jsonl.path", message=REQUIRED),
    Case(id="copy-alphabet-short", change=_all(_drop("spec.task.arithmetic"), _set("spec.task.copy",
         {"alphabet": "a"})), path="spec.task.copy.alphabet", message="should be at least 2 chars long"),
    # ---- verifiers: a list-map keyed by name
    Case(id="verifiers-missing", change=_drop("spec.verifiers"), path="spec.verifiers", message=REQUIRED),
    Case(id="verifiers-empty", change=_set("spec.verifiers", []), path="spec.verifiers",
         message="should have at least 1 items"),
    Case(id="verifiers-too-many", change=_set("spec.verifiers", [{"name": f"v{i}", "type": "ExactAnswer"}
         for i in range(65)]), path="spec.verifiers", message="must have at most 64 items"),
    Case(id="verifier-duplicate-name", change=_set("spec.verifiers.1.name", "answer"), path="spec.verifiers",
         message=DUP),
    Case(id="verifier-unknown-type", change=_set("spec.verifiers.0.type", "LLMJudge"), path="spec.verifiers[0].type",
         message=ENUM),
    Case(id="verifier-no-type", change=_drop("spec.verifiers.0.type"), path="spec.verifiers[0].type",
         message=REQUIRED),
    Case(id="verifier-regex-settings", change=_drop("spec.verifiers.1.regex"), path="spec.verifiers[1]",
         message=rljob.MSG_REGEX_NEEDS_SETTINGS),
    Case(id="verifier-name-pattern", change=_set("spec.verifiers.0.name", "Answer_1"), path="spec.verifiers[0].name",
         message="should match"),
    Case(id="verifier-weight", change=_set("spec.verifiers.0.weight", 1000), path="spec.verifiers[0].weight",
         message=f"{LE} 100"),
    Case(id="verifier-python-settings", change=_set("spec.verifiers.0", {"name": "mine", "type": "Python"}),
         path="spec.verifiers[0]", message=rljob.MSG_PYTHON_NEEDS_SETTINGS),
    Case(id="verifier-python-entry-point", change=_set("spec.verifiers.0", {
        "name": "mine", "type": "Python", "python": {"entryPoint": "my_rewards.score"}}),
         path="spec.verifiers[0].python", message=rljob.MSG_ENTRY_POINT),
    Case(id="verifier-length-range", change=_set("spec.verifiers.0", {
        "name": "len", "type": "Length", "length": {"minChars": 9, "maxChars": 3}}),
         path="spec.verifiers[0].length", message=rljob.MSG_LENGTH_RANGE),
    Case(id="verifier-code-timeout", change=_set("spec.verifiers.0", {
        "name": "tests", "type": "CodeExecution", "codeExecution": {"timeoutSeconds": 0}}),
         path="spec.verifiers[0].codeExecution.timeoutSeconds", message=GT),
    Case(id="reward-aggregation", change=_set("spec.reward", {"aggregation": "Mean"}),
         path="spec.reward.aggregation", message=ENUM),
    Case(id="reward-positive-rates", change=_set("spec.reward", {
        "aggregation": "WeakSupervision", "weakSupervision": {"minPositiveRate": 0.5, "maxPositiveRate": 0.4}}),
         path="spec.reward.weakSupervision", message=rljob.MSG_POSITIVE_RATES),
    # ---- algorithm: bounded counts and rates
    Case(id="loss-unknown", change=_set("spec.algorithm.loss", "PPO"), path="spec.algorithm.loss", message=ENUM),
    Case(id="group-size-one", change=_set("spec.algorithm.groupSize", 1), path="spec.algorithm.groupSize",
         message=f"{GE} 2"),
    Case(id="prompts-per-step-zero", change=_set("spec.algorithm.promptsPerStep", 0),
         path="spec.algorithm.promptsPerStep", message=f"{GE} 1"),
    Case(id="steps-zero", change=_set("spec.algorithm.steps", 0), path="spec.algorithm.steps", message=f"{GE} 1"),
    Case(id="steps-not-integer", change=_set("spec.algorithm.steps", "many"), path="spec.algorithm.steps",
         message="integer"),
    Case(id="max-new-tokens-zero", change=_set("spec.algorithm.maxNewTokens", 0), path="spec.algorithm.maxNewTokens",
         message=f"{GE} 1"),
    Case(id="temperature-negative", change=_set("spec.algorithm.temperature", -0.5),
         path="spec.algorithm.temperature", message=f"{GE} 0"),
    Case(id="top-p-above-one", change=_set("spec.algorithm.topP", 1.5), path="spec.algorithm.topP",
         message=f"{LE} 1"),
    Case(id="top-p-zero", change=_set("spec.algorithm.topP", 0), path="spec.algorithm.topP", message=f"{GT}0"),
    Case(id="top-k-below-minus-one", change=_set("spec.algorithm.topK", -2), path="spec.algorithm.topK",
         message=f"{GE} -1"),
    Case(id="top-k-not-integer", change=_set("spec.algorithm.topK", 2.5), path="spec.algorithm.topK",
         message="integer"),
    Case(id="importance-cap-below-one", change=_set("spec.algorithm.importanceCap", 0.5),
         path="spec.algorithm.importanceCap", message=f"{GE} 1"),
    Case(id="mismatch-mask-threshold-zero", change=_set("spec.algorithm.mismatchMask", {"threshold": 0}),
         path="spec.algorithm.mismatchMask.threshold", message=f"{GT}0"),
    Case(id="mismatch-mask-level-unknown", change=_set("spec.algorithm.mismatchMask", {"level": "Median"}),
         path="spec.algorithm.mismatchMask.level", message=ENUM),
    Case(id="learning-rate-zero", change=_set("spec.algorithm.learningRate", 0), path="spec.algorithm.learningRate",
         message=f"{GT}0"),
    Case(id="clip-epsilon-zero", change=_set("spec.algorithm.clipEpsilon", 0), path="spec.algorithm.clipEpsilon",
         message=f"{GT}0"),
    Case(id="clip-high-below-clip", change=_set("spec.algorithm.clipEpsilonHigh", 0.1), path="spec.algorithm",
         message=rljob.MSG_CLIP_HIGH),
    Case(id="kl-negative", change=_set("spec.algorithm.klCoef", -1), path="spec.algorithm.klCoef",
         message=f"{GE} 0"),
    Case(id="policy-lag-negative", change=_set("spec.algorithm.maxPolicyLag", -1), path="spec.algorithm.maxPolicyLag",
         message=f"{GE} 0"),
    # ---- weight sync and checkpoints
    Case(id="sync-every-zero", change=_set("spec.weightSync.everySteps", 0), path="spec.weightSync.everySteps",
         message=f"{GE} 1"),
    Case(id="sync-backend", change=_set("spec.weightSync.backend", "MPI"), path="spec.weightSync.backend",
         message=ENUM),
    Case(id="checkpoint-every-zero", change=_set("spec.checkpoint.everySteps", 0), path="spec.checkpoint.everySteps",
         message=f"{GE} 1"),
    Case(id="checkpoint-keep-zero", change=_set("spec.checkpoint.keep", 0), path="spec.checkpoint.keep",
         message=f"{GE} 1"),
    Case(id="checkpoint-path-relative", change=_set("spec.checkpoint.path", "checkpoints"),
         path="spec.checkpoint.path", message=rljob.MSG_CHECKPOINT_ABSOLUTE),
    Case(id="checkpoint-claim-and-template", change=_all(_set("spec.checkpoint.claimName", "ckpt"),
         _set("spec.checkpoint.volumeClaimTemplate", {"storage": "1Gi"})), path="spec.checkpoint",
         message=rljob.MSG_CHECKPOINT_ONE_VOLUME),
    Case(id="checkpoint-claim-name", change=_set("spec.checkpoint.claimName", "Not_A_Name"),
         path="spec.checkpoint.claimName", message="should match"),
    Case(id="checkpoint-template-storage", change=_set("spec.checkpoint.volumeClaimTemplate", {"storage": "big"}),
         path="spec.checkpoint.volumeClaimTemplate.storage", message="should match"),
    # ---- roles
    Case(id="generator-replicas-zero", change=_set("spec.roles.generator.replicas", 0),
         path="spec.roles.generator.replicas", message=f"{GE} 1"),
    Case(id="trainer-replicas-zero", change=_set("spec.roles.trainer.replicas", 0), path="spec.roles.trainer.replicas",
         message=f"{GE} 1"),
    Case(id="verifier-replicas-zero", change=_set("spec.roles.verifier.replicas", 0),
         path="spec.roles.verifier.replicas", message=f"{GE} 1"),
    Case(id="tensor-parallel-zero", change=_set("spec.roles.generator.tensorParallelSize", 0),
         path="spec.roles.generator.tensorParallelSize", message=f"{GE} 1"),
    Case(id="gpu-memory-zero", change=_set("spec.roles.generator.gpuMemoryUtilization", 0),
         path="spec.roles.generator.gpuMemoryUtilization", message=f"{GT}0"),
    Case(id="env-duplicate", change=_set("spec.roles.trainer.env", [{"name": "A"}, {"name": "A", "value": "2"}]),
         path="spec.roles.trainer.env", message=DUP),
    # env sources (issue 37 item 5): the CEL rules of EnvVar, EnvVarSource and EnvFromSource
    Case(id="env-value-and-value-from", change=_set("spec.roles.trainer.env", [
        {"name": "A", "value": "1", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]),
        path="spec.roles.trainer.env[0]", message="value and valueFrom are mutually exclusive"),
    Case(id="env-value-from-two-sources", change=_set("spec.roles.trainer.env", [
        {"name": "A", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"},
                                    "configMapKeyRef": {"name": "c", "key": "k"}}}]),
        path="spec.roles.trainer.env[0].valueFrom", message="exactly one of secretKeyRef or configMapKeyRef"),
    Case(id="env-from-no-source", change=_set("spec.roles.trainer.envFrom", [{"prefix": "X_"}]),
         path="spec.roles.trainer.envFrom[0]", message="exactly one of secretRef or configMapRef"),
    Case(id="env-secret-key-invalid", change=_set("spec.roles.trainer.env", [
        {"name": "A", "valueFrom": {"secretKeyRef": {"name": "s", "key": "a/b"}}}]),
        path="spec.roles.trainer.env[0].valueFrom.secretKeyRef.key", message="should match"),
    Case(id="gang-scheduler-name-invalid", change=_set("spec.gang.schedulerName", "Not_A_Name"),
         path="spec.gang.schedulerName", message="should match"),
    Case(id="resource-quantity", change=_set("spec.roles.generator.resources.limits.cpu", "lots"),
         path="spec.roles.generator.resources.limits.cpu", message="should match"),
    Case(id="node-selector-not-string", change=_set("spec.roles.generator.nodeSelector", {"zone": 1}),
         path="spec.roles.generator.nodeSelector.zone", message="string"),
    # ---- cluster-only fields
    Case(id="gang-backend", change=_set("spec.gang.backend", "Slurm"), path="spec.gang.backend", message=ENUM),
    Case(id="gang-timeout-zero", change=_set("spec.gang.scheduleTimeoutSeconds", 0),
         path="spec.gang.scheduleTimeoutSeconds", message=f"{GE} 1"),
    Case(id="placement-mode", change=_set("spec.placement.mode", "Maybe"), path="spec.placement.mode", message=ENUM),
    Case(id="schedule-mode", change=_set("spec.schedule.mode", "Sideways"), path="spec.schedule.mode", message=ENUM),
    Case(id="schedule-cpus-not-disaggregated", change=_set("spec.schedule.generatorCpus", 1), path="spec.schedule",
         message=rljob.MSG_GENERATOR_CPUS_MODE),
    # ---- spec.generatorPool: a pool serves LoRA adapters (docs/generator-pool.md)
    Case(id="pool-without-lora", change=_set("spec.generatorPool", {"name": "shared"}), path="spec",
         message=rljob.MSG_POOL_NEEDS_LORA),
    Case(id="pool-name-not-dns", change=_all(_set("spec.model.lora", {"rank": 8}),
                                             _set("spec.generatorPool", {"name": "Shared"})),
         path="spec.generatorPool.name", message="should match"),
    Case(id="schedule-cpus-zero", change=_all(_set("spec.schedule.mode", "Disaggregated"),
         _set("spec.schedule.generatorCpus", 0)), path="spec.schedule.generatorCpus", message=GE),
    Case(id="placement-exclusive-no-key", change=_all(_drop("spec.placement.topologyKey"),
         _set("spec.placement.exclusive", True)), path="spec.placement", message=rljob.MSG_EXCLUSIVE_NEEDS_KEY),
    Case(id="generator-min-replicas-above-replicas", change=_set("spec.roles.generator.minReplicas", 2),
         path="spec.roles.generator", message=rljob.MSG_MIN_REPLICAS),
    Case(id="weak-min-items-above-window", change=_set("spec.reward", {"aggregation": "WeakSupervision",
         "weakSupervision": {"minItems": 64, "window": 32}}), path="spec.reward.weakSupervision",
         message=rljob.MSG_MIN_ITEMS_WINDOW),
    Case(id="max-restarts-negative", change=_set("spec.failurePolicy", {"maxRestarts": -1}),
         path="spec.failurePolicy.maxRestarts", message=f"{GE} 0"),
    Case(id="suspend-not-bool", change=_set("spec.suspend", "maybe"), path="spec.suspend", message="boolean"),
    Case(id="deadline-zero", change=_set("spec.activeDeadlineSeconds", 0), path="spec.activeDeadlineSeconds",
         message=f"{GE} 1"),
    Case(id="ttl-negative", change=_set("spec.ttlSecondsAfterFinished", -1), path="spec.ttlSecondsAfterFinished",
         message=f"{GE} 0"),
    # ---- environment: closed type enum, settings per type
    Case(id="environment-unknown-type", change=_set("spec.environment", {"type": "Chess"}),
         path="spec.environment.type", message=ENUM),
    Case(id="environment-zero-turns", change=_set("spec.environment", {"type": "Calculator", "maxTurns": 0}),
         path="spec.environment.maxTurns", message=GE),
    Case(id="environment-python-without-settings", change=_set("spec.environment", {"type": "Python"}),
         path="spec.environment", message=rljob.MSG_ENV_PYTHON),
    Case(id="environment-python-settings-on-calculator", change=_set("spec.environment", {
         "type": "Calculator", "python": {"entryPoint": "my_envs:make_env"}}), path="spec.environment",
         message=rljob.MSG_ENV_PYTHON),
    Case(id="environment-native-on-guess-number", change=_set("spec.environment", {"type": "GuessNumber",
         "toolFormat": "Native"}), path="spec.environment", message=rljob.MSG_ENV_NATIVE),
    Case(id="environment-unknown-tool-format", change=_set("spec.environment", {"type": "Calculator",
         "toolFormat": "Json"}), path="spec.environment.toolFormat", message=ENUM),
    Case(id="environment-verifiers-without-settings", change=_set("spec.environment", {"type": "Verifiers"}),
         path="spec.environment", message=rljob.MSG_ENV_VERIFIERS),
    Case(id="environment-python-entry-point-shape", change=_set("spec.environment", {
         "type": "Python", "python": {"entryPoint": "not an entry point"}}), path="spec.environment.python",
         message=rljob.MSG_ENTRY_POINT),
    # ---- spec.agent (the user's agent in pods of its own) and environment.type Agent need each other
    Case(id="agent-without-environment-type", change=_set("spec.agent", {"program": ["python", "agent.py"]}),
         path="spec", message=rljob.MSG_AGENT_TYPE),
    Case(id="environment-agent-without-agent", change=_set("spec.environment", {"type": "Agent",
         "reward": "Verifiers"}), path="spec", message=rljob.MSG_AGENT_TYPE),
    Case(id="environment-agent-reward-environment", change=_all(_set("spec.environment", {"type": "Agent"}),
         _set("spec.agent", {"program": ["python", "agent.py"]})), path="spec.environment",
         message=rljob.MSG_ENV_AGENT_REWARD),
    Case(id="agent-no-program", change=_all(_set("spec.environment", {"type": "Agent", "reward": "Verifiers"}),
         _set("spec.agent", {"program": []})), path="spec.agent.program", message="should have at least 1"),
    Case(id="agent-zero-concurrency", change=_all(_set("spec.environment", {"type": "Agent",
         "reward": "Verifiers"}), _set("spec.agent", {"program": ["a"], "concurrency": 0})),
         path="spec.agent.concurrency", message=GE),
    Case(id="sandbox-zero-slots", change=_set("spec.sandbox", {"slots": 0}), path="spec.sandbox.slots", message=GE),
    Case(id="sandbox-run-seconds-zero", change=_set("spec.sandbox", {"maxRunSeconds": 0}),
         path="spec.sandbox.maxRunSeconds", message=GT),
)


# ---- cross-field and semantic rules (kubeforge.api.validate): the schema accepts these, the webhook refuses them
TRAINER, GENERATOR = "spec.roles.trainer", "spec.roles.generator"
# a code task scored by CodeExecution: a job a sandbox pool would serve
_CODE = (_drop("spec.task.arithmetic"), _set("spec.task.code", {}), _set("spec.verifiers.0", {
    "name": "tests", "type": "CodeExecution", "codeExecution": {"timeoutSeconds": 5}}))

SEMANTIC_CASES: tuple[Case, ...] = (
    Case(id="prompts-below-trainer-replicas", change=_all(_set("spec.roles.trainer.replicas", 2),
         _set("spec.algorithm.promptsPerStep", 1)), path="spec.algorithm.promptsPerStep",
         message="should be at least spec.roles.trainer.replicas"),
    Case(id="policy-lag-below-sync-interval", change=_set("spec.weightSync.everySteps", 3),
         path="spec.algorithm.maxPolicyLag", message="should be at least spec.weightSync.everySteps - 1"),
    Case(id="partial-rollouts-with-lora", change=_all(_set("spec.algorithm.partialRollouts", True),
         _set("spec.model.lora", {"targetModules": ["q_proj"]})), path="spec.algorithm.partialRollouts",
         message="cannot be used with spec.model.lora"),
    Case(id="partial-rollouts-colocated", change=_all(_set("spec.algorithm.partialRollouts", True),
         _set("spec.schedule.mode", "Colocated")), path="spec.algorithm.partialRollouts",
         message="cannot be used with spec.schedule.mode Colocated"),
    Case(id="partial-rollouts-on-policy", change=_all(_set("spec.algorithm.partialRollouts", True),
         _set("spec.algorithm.maxPolicyLag", 0)), path="spec.algorithm.maxPolicyLag",
         message="with spec.algorithm.partialRollouts"),
    Case(id="temperature-zero", change=_set("spec.algorithm.temperature", 0), path="spec.algorithm.temperature",
         message="greedy sampling"),
    Case(id="sync-interval-beyond-steps", change=_all(_set("spec.weightSync.everySteps", 20),
         _set("spec.algorithm.maxPolicyLag", 19)), path="spec.weightSync.everySteps",
         message="never receive new weights"),
    Case(id="nccl-without-gpus", change=_set("spec.weightSync.backend", "NCCL"), path="spec.weightSync.backend",
         message="NCCL needs GPUs"),
    Case(id="max-model-len-below-new-tokens", change=_set("spec.roles.generator.maxModelLen", 16),
         path="spec.roles.generator.maxModelLen", message="should be greater than spec.algorithm.maxNewTokens"),
    Case(id="tensor-parallel-beyond-gpus", change=_set("spec.roles.generator.tensorParallelSize", 2),
         path="spec.roles.generator.tensorParallelSize", message="one GPU per tensor-parallel rank"),
    Case(id="jsonl-answer-is-prompt", change=_all(_drop("spec.task.arithmetic"), _set("spec.task.jsonl",
         {"path": "/data/train.jsonl", "promptField": "q", "answerField": "q"})),
         path="spec.task.jsonl.answerField", message="should differ from spec.task.jsonl.promptField"),
    Case(id="regex-does-not-compile", change=_set("spec.verifiers.1.regex.pattern", "(ab"),
         path="spec.verifiers[1].regex.pattern", message=rljob.MSG_REGEX_INVALID),
    Case(id="regex-on-exact-answer", change=_set("spec.verifiers.0.regex", {"pattern": "x"}),
         path="spec.verifiers[0].regex", message="may only be set when type is Regex"),
    Case(id="every-weight-zero", change=_all(_set("spec.verifiers.0.weight", 0), _set("spec.verifiers.1.weight", 0)),
         path="spec.verifiers", message="every verifier has weight 0"),
    Case(id="kueue-without-queue", change=_set("spec.gang.backend", "Kueue"), path="spec.gang.queue",
         message="Required value"),
    Case(id="queue-with-coscheduling", change=_set("spec.gang.queue", "team-a"), path="spec.gang.queue",
         message="may only be set when backend is"),
    Case(id="length-settings-on-regex", change=_set("spec.verifiers.1.length", {"maxChars": 10}),
         path="spec.verifiers[1].length", message="may only be set when type is Length"),
    Case(id="image-reference-invalid", change=_set("spec.roles.generator.image", "My Image:latest"),
         path=f"{GENERATOR}.image", message="not a valid image reference"),
    Case(id="command-empty", change=_set("spec.roles.trainer.command", []), path=f"{TRAINER}.command",
         message="must be a non-empty list"),
    Case(id="resource-name-invalid", change=_set("spec.roles.generator.resources.limits.gpu", 1),
         path=f"{GENERATOR}.resources.limits.gpu", message="must be a standard resource"),
    Case(id="cpu-request-above-limit", change=_set("spec.roles.verifier.resources", {"requests": {"cpu": "2"},
         "limits": {"cpu": "1500m"}}), path="spec.roles.verifier.resources.requests.cpu",
         message="must be less than or equal to cpu limit"),
    Case(id="gpu-fraction", change=_set("spec.roles.generator.resources.limits", {"nvidia.com/gpu": "500m"}),
         path=f"{GENERATOR}.resources.limits.nvidia.com/gpu", message="must be an integer"),
    Case(id="gpu-request-not-limit", change=_set("spec.roles.generator.resources", {
         "limits": {"nvidia.com/gpu": 1}, "requests": {"nvidia.com/gpu": 2}}),
         path=f"{GENERATOR}.resources.requests.nvidia.com/gpu", message="must be equal to nvidia.com/gpu limit"),
    Case(id="env-name-invalid", change=_set("spec.roles.trainer.env", [{"name": "1A", "value": "x"}]),
         path=f"{TRAINER}.env[0].name", message="a valid environment variable name"),
    Case(id="env-name-reserved", change=_set("spec.roles.trainer.env", [{"name": "KUBEFORGE_ROLE", "value": "x"}]),
         path=f"{TRAINER}.env[0].name", message="are set by kubeforge itself"),
    Case(id="node-selector-key-invalid", change=_set("spec.roles.generator.nodeSelector", {"bad key!": "x"}),
         path=f"{GENERATOR}.nodeSelector.bad key!", message="not a valid label key"),
    Case(id="node-selector-value-invalid", change=_set("spec.roles.generator.nodeSelector", {"zone": "a b"}),
         path=f"{GENERATOR}.nodeSelector.zone", message="a valid label value"),
    Case(id="toleration-operator", change=_set("spec.roles.generator.tolerations", [{"key": "k", "operator": "Maybe"}]),
         path=f"{GENERATOR}.tolerations[0].operator", message="Unsupported value"),
    Case(id="toleration-exists-with-value", change=_set("spec.roles.generator.tolerations", [
         {"key": "k", "operator": "Exists", "value": "v"}]), path=f"{GENERATOR}.tolerations[0].value",
         message="must be empty when operator is 'Exists'"),
    Case(id="toleration-seconds-without-noexecute", change=_set("spec.roles.generator.tolerations", [
         {"key": "k", "operator": "Exists", "effect": "NoSchedule", "tolerationSeconds": 5}]),
         path=f"{GENERATOR}.tolerations[0].tolerationSeconds", message="only be set when effect is 'NoExecute'"),
    Case(id="volume-without-name", change=_set("spec.roles.trainer.volumes", [{"emptyDir": {}}]),
         path=f"{TRAINER}.volumes[0].name", message="Required value"),
    Case(id="volume-reserved-name", change=_set("spec.roles.trainer.volumes", [{"name": "kubeforge-config",
         "emptyDir": {}}]), path=f"{TRAINER}.volumes[0].name", message="are kubeforge's own"),
    Case(id="volume-duplicate-name", change=_set("spec.roles.trainer.volumes", [{"name": "data", "emptyDir": {}},
         {"name": "data", "emptyDir": {}}]), path=f"{TRAINER}.volumes[1].name", message="Duplicate value"),
    Case(id="mount-of-unknown-volume", change=_set("spec.roles.trainer.volumeMounts", [{"name": "data",
         "mountPath": "/data"}]), path=f"{TRAINER}.volumeMounts[0].name", message="Not found"),
    Case(id="mount-over-kubeforge-config", change=_all(_set("spec.roles.trainer.volumes", [{"name": "data",
         "emptyDir": {}}]), _set("spec.roles.trainer.volumeMounts", [{"name": "data", "mountPath": "/etc/kubeforge"}])),
         path=f"{TRAINER}.volumeMounts[0].mountPath", message="is kubeforge's own"),
    Case(id="mount-path-relative", change=_all(_set("spec.roles.trainer.volumes", [{"name": "data",
         "emptyDir": {}}]), _set("spec.roles.trainer.volumeMounts", [{"name": "data", "mountPath": "data"}])),
         path=f"{TRAINER}.volumeMounts[0].mountPath", message="must be an absolute path"),
    # ---- fields added since the admission work (docs/validation.md: every pair examined, and the verdict)
    Case(id="lora-target-not-a-layer", change=_set("spec.model.lora", {"targetModules": ["q_proj", "qkv"]}),
         path="spec.model.lora.targetModules[1]", message="has no such layer"),
    Case(id="max-new-tokens-beyond-context", change=_set("spec.algorithm.maxNewTokens", 512),
         path="spec.algorithm.maxNewTokens", message="context length of the built-in model tiny"),
    Case(id="eval-max-new-tokens-beyond-context", change=_set("spec.evaluation", {"maxNewTokens": 600}),
         path="spec.evaluation.maxNewTokens", message="context length of the built-in model tiny"),
    Case(id="max-model-len-beyond-context", change=_set("spec.roles.generator.maxModelLen", 1024),
         path=f"{GENERATOR}.maxModelLen", message="vLLM refuses a longer one"),
    Case(id="eval-first-index-in-training", change=_set("spec.evaluation", {"firstIndex": 10}),
         path="spec.evaluation.firstIndex", message="the held-out prompts would be trained on"),
    Case(id="eval-task-too-small", change=_all(_drop("spec.task.arithmetic"),
         _set("spec.task.copy", {"length": 1, "alphabet": "ab"}), _set("spec.evaluation", {})),
         path="spec.evaluation", message="nearly every held-out prompt is a training prompt"),
    Case(id="warmup-beyond-steps", change=_set("spec.algorithm.learningRateSchedule", {"warmupSteps": 11}),
         path="spec.algorithm.learningRateSchedule.warmupSteps", message="the warm-up would outlast the run"),
    Case(id="min-ratio-with-constant", change=_set("spec.algorithm.learningRateSchedule", {"minRatio": 0.1}),
         path="spec.algorithm.learningRateSchedule.minRatio", message="applies only to type Cosine"),
    Case(id="weak-settings-without-weak", change=_set("spec.reward", {"weakSupervision": {"window": 1024}}),
         path="spec.reward.weakSupervision", message="may only be set when spec.reward.aggregation is WeakSupervision"),
    Case(id="weight-with-majority-vote", change=_set("spec.reward", {"aggregation": "MajorityVote"}),
         path="spec.verifiers[1].weight", message="MajorityVote ignores verifier weights"),
    Case(id="weak-with-two-verifiers", change=_all(_set("spec.reward", {"aggregation": "WeakSupervision"}),
         _set("spec.verifiers.1.weight", 1.0)), path="spec.reward.aggregation", message="needs at least 3 verifiers"),
    Case(id="code-execution-on-arithmetic", change=_set("spec.verifiers.0", {"name": "tests",
         "type": "CodeExecution"}), path="spec.verifiers[0].type", message="answers are not tests"),
    Case(id="exact-answer-on-code-task", change=_all(_drop("spec.task.arithmetic"), _set("spec.task.code", {})),
         path="spec.verifiers[0].type", message="it never matches; use CodeExecution"),
    Case(id="code-timeout-above-group-timeout", change=_all(_drop("spec.task.arithmetic"),
         _set("spec.task.code", {}), _set("spec.verifiers.0", {"name": "tests", "type": "CodeExecution",
         "timeoutSeconds": 30, "codeExecution": {"timeoutSeconds": 60}})),
         path="spec.verifiers[0].codeExecution.timeoutSeconds", message="the group's limit ends every run first"),
    Case(id="verifier-timeout-beyond-progress-deadline", change=_set("spec.verifiers.0.timeoutSeconds", 900),
         path="spec.verifiers[0].timeoutSeconds", message="should be at most spec.failurePolicy.progressDeadlineSeconds"),
    Case(id="compile-with-fsdp", change=_all(_set("spec.roles.trainer.sharding", "FSDP"),
         _set("spec.roles.trainer.compile", True)), path=f"{TRAINER}.compile", message="not applied with"),
    Case(id="min-replicas-without-gang", change=_all(_set("spec.gang.backend", "None"),
         _set("spec.roles.generator.minReplicas", 1)), path=f"{GENERATOR}.minReplicas",
         message="may only be set when spec.gang.backend is one of"),
    Case(id="importance-cap-with-gspo", change=_all(_set("spec.algorithm.loss", "GSPO"),
         _set("spec.algorithm.importanceCap", 2.0)), path="spec.algorithm.importanceCap",
         message="not applied with spec.algorithm.loss GSPO"),
    Case(id="mismatch-mask-with-gspo", change=_all(_set("spec.algorithm.loss", "GSPO"),
         _set("spec.algorithm.mismatchMask", {"threshold": 2.0})), path="spec.algorithm.mismatchMask",
         message="not applied with spec.algorithm.loss GSPO"),
    Case(id="priority-class-invalid", change=_set("spec.roles.trainer.priorityClassName", "High_Priority"),
         path=f"{TRAINER}.priorityClassName", message="must be a lowercase RFC 1123 subdomain"),
    # ---- multi-turn environments (validate_environment)
    Case(id="episode-tokens-below-new-tokens", change=_set("spec.environment", {"type": "Calculator",
         "maxTokensPerEpisode": 8}), path="spec.environment.maxTokensPerEpisode",
         message="should be at least spec.algorithm.maxNewTokens"),
    Case(id="environment-with-partial-rollouts", change=_all(_set("spec.environment", {"type": "GuessNumber"}),
         _set("spec.algorithm.partialRollouts", True)), path="spec.algorithm.partialRollouts",
         message="cannot be used with spec.environment"),
    Case(id="environment-verifier-name-reserved", change=_all(_set("spec.environment", {"type": "GuessNumber"}),
         _set("spec.verifiers.1.name", "environment")), path="spec.verifiers[1].name",
         message="reserved with spec.environment"),
    Case(id="environment-turn-timeout-beyond-deadline", change=_all(_set("spec.environment", {"type": "Calculator",
         "turnTimeoutSeconds": 500}), _set("spec.failurePolicy", {"progressDeadlineSeconds": 400})), path="spec.environment.turnTimeoutSeconds",
         message="should be at most spec.failurePolicy.progressDeadlineSeconds"),
    Case(id="environment-native-on-a-model-without-template", change=_set("spec.environment", {"type": "Calculator",
         "toolFormat": "Native"}), path="spec.environment.toolFormat",
         message="has no chat template with a tool-call format"),
    Case(id="environment-native-without-chat-template", change=_all(_set("spec.environment", {"type": "Calculator",
         "toolFormat": "Native"}), _set("spec.model.builtin", "smollm2-135m-instruct"),
         _set("spec.task.chatTemplate", False)), path="spec.environment.toolFormat",
         message="spec.task.chatTemplate is false"),
    Case(id="environment-verifiers-with-evaluation", change=_all(_set("spec.environment", {"type": "Verifiers",
         "verifiers": {"environment": "my_vf_env"}}), _set("spec.evaluation", {"everySteps": 5})),
         path="spec.evaluation", message="cannot be used with spec.environment.type 'Verifiers'"),
    Case(id="agent-with-evaluation", change=_all(_set("spec.environment", {"type": "Agent", "reward": "Verifiers"}), _set("spec.agent", {"program": ["a"]}),
         _set("spec.evaluation", {"everySteps": 5})), path="spec.evaluation",
         message="cannot be used with spec.environment.type 'Agent'"),
    Case(id="agent-program-empty-argument", change=_all(_set("spec.environment", {"type": "Agent", "reward": "Verifiers"}), _set("spec.agent", {"program": ["python", ""]})),
         path="spec.agent.program", message="non-empty strings"),
    Case(id="agent-image-invalid", change=_all(_set("spec.environment", {"type": "Agent", "reward": "Verifiers"}),
         _set("spec.agent", {"program": ["a"], "image": "Not An Image"})),
         path="spec.agent.image", message="not a valid image reference"),
    # ---- spec.sandbox (a warm pool of sandbox pods; docs/sandboxes.md)
    Case(id="sandbox-without-a-user", change=_set("spec.sandbox", {"replicas": 1}), path="spec.sandbox",
         message="nothing would claim a sandbox"),
    Case(id="sandbox-env-from-a-secret", change=_all(*_CODE, _set("spec.sandbox", {"env": [
         {"name": "A", "value": "b"}, {"name": "T", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]})),
         path="spec.sandbox.env[1].valueFrom", message="is given no secret"),
    Case(id="sandbox-env-from", change=_all(*_CODE, _set("spec.sandbox", {"envFrom": [{"secretRef": {"name": "s"}}]})),
         path="spec.sandbox.envFrom", message="is given no secret"),
    Case(id="sandbox-secret-volume", change=_all(*_CODE, _set("spec.sandbox", {
         "volumes": [{"name": "tools", "hostPath": {"path": "/opt/tools"}}, {"name": "v", "secret": {"secretName": "s"}}],
         "volumeMounts": [{"name": "v", "mountPath": "/v"}]})), path="spec.sandbox.volumes[1]",
         message="is given no secret"),
    Case(id="sandbox-run-below-code-timeout", change=_all(*_CODE, _set("spec.sandbox", {"maxRunSeconds": 2})),
         path="spec.verifiers[0].codeExecution.timeoutSeconds", message="should be at most spec.sandbox.maxRunSeconds"),
    Case(id="sandbox-image-invalid", change=_all(*_CODE, _set("spec.sandbox", {"image": "Not An Image"})),
         path="spec.sandbox.image", message="not a valid image reference"),
    # ---- spec.generatorPool (the pool itself unknown here: what only the job says)
    Case(id="pool-job-generator-min-replicas", change=_all(_set("spec.model.lora", {"rank": 8}),
         _set("spec.generatorPool", {"name": "shared"}), _set("spec.roles.generator.minReplicas", 1)),
         path=f"{GENERATOR}.minReplicas", message="are the engines of GeneratorPool 'shared'"),
)

ALL_CASES: tuple[Case, ...] = CASES + SEMANTIC_CASES


def compact(value: Any) -> Any:
    """Drop empty lists and maps (the CRD leaves them absent; the model fills them in)."""
    if isinstance(value, dict):
        out = {k: compact(v) for k, v in value.items()}
        return {k: v for k, v in out.items() if v not in ({}, [])}
    if isinstance(value, list):
        return [compact(v) for v in value]
    return value
