"""Cross-field and semantic rules of an RLJob: what the schema cannot say, checked alike by every door.

Neighbours: ``kubeforge.api.load.parse`` runs :func:`problems` after the schema (pydantic) accepted a manifest, so
the local launcher, ``kubeforge validate FILE``, every role process and the operator's admission webhook refuse
the same manifests with the same words. The CRD keeps its OpenAPI schema + CEL rules for what a schema can say;
the rules here need arithmetic across sections, a regex engine, Kubernetes' own name and quantity rules, or
knowledge of how kubeforge renders pods (reserved names).

Invariants:
- Pure: no file system, no network (a model ``path`` is a PVC mount on a cluster; the runtime checks that it
  exists, locally, in ``kubeforge.runtime.config``).
- One message per problem, ``<field path>: <message>``, the path in wire (camelCase) names with ``[i]`` for list
  items, worded like the API server (``Invalid value``, ``Forbidden``, ``Not found``, ``Duplicate value``).
- Each rule names the field a user must change; a rule involving two fields names the one listed first in the
  message and mentions the other.
"""
from __future__ import annotations

import decimal
import re
from collections.abc import Callable, Iterator
from typing import Any

from kubeforge.api import builtins, contract, rljob, validate_environment, validate_sandbox

Problems = Iterator[str]

# Kubernetes' own syntax rules (apimachinery validation), so a manifest we accept is one the API server accepts
# when the operator renders it into a StatefulSet.
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
# An image reference: [registry[:port]/]path[:tag][@digest], lowercase path components.
_IMAGE = re.compile(r"^(?:[A-Za-z0-9.-]+(?::[0-9]+)?/)?[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*"
                    r"(?::[\w][\w.-]{0,127})?(?:@[A-Za-z][A-Za-z0-9]*:[0-9a-fA-F]{32,})?$")
_STANDARD_RESOURCES = ("cpu", "memory", "ephemeral-storage")
_TOLERATION_OPERATORS = ("Exists", "Equal")
_TOLERATION_EFFECTS = ("", "NoSchedule", "PreferNoSchedule", "NoExecute")
GPU = "nvidia.com/gpu"
QUEUE_BACKENDS = (rljob.GangBackend.VOLCANO.value, rljob.GangBackend.KAI.value, rljob.GangBackend.KUEUE.value)


def problems(job: rljob.RLJob) -> list[str]:
    """Every cross-field and semantic problem of a schema-valid RLJob, one ``path: message`` each."""
    out: list[str] = []
    for rule in RULES:
        out.extend(rule(job.spec))
    out.extend(_kueue_labels(job))
    return out


def _kueue_labels(job: rljob.RLJob) -> Problems:
    """An RLJob labelled with a Kueue queue is admitted by Kueue as a whole (one Workload); Kueue's plain pod
    groups (``gang.backend: Kueue``) would admit its pods a second time, each group against the same quota."""
    labels = job.metadata.labels or {}
    if labels.get(contract.LABEL_KUEUE_QUEUE) and job.spec.gang.backend == rljob.GangBackend.KUEUE.value:
        yield (f"metadata.labels[{contract.LABEL_KUEUE_QUEUE}]: Forbidden: with spec.gang.backend Kueue (the job "
               "would be admitted twice: as an RLJob and as pod groups); use spec.gang.backend Auto, Coscheduling or "
               "None with the label, or remove the label and set spec.gang.queue")


# ---------------------------------------------------------------- algorithm and sync


def _algorithm(spec: rljob.RLJobSpec) -> Problems:
    algo, trainer = spec.algorithm, spec.roles.trainer
    if algo.prompts_per_step < trainer.world():
        ranks = "" if trainer.ranks() == 1 else f" x {trainer.ranks()} ranks per pod"
        yield (f"spec.algorithm.promptsPerStep: Invalid value: {algo.prompts_per_step}: should be at least "
               f"spec.roles.trainer.replicas ({trainer.replicas}){ranks}, so every trainer rank gets a share of "
               "each step")
    gpus = trainer.gpus()
    if trainer.ranks_per_pod is not None and gpus and trainer.ranks_per_pod != gpus:
        yield (f"spec.roles.trainer.ranksPerPod: Invalid value: {trainer.ranks_per_pod}: should equal the pod's "
               f"GPU count ({gpus}): one rank per GPU")
    lag, every = algo.max_policy_lag, spec.weight_sync.every_steps
    if lag < every - 1:
        yield (f"spec.algorithm.maxPolicyLag: Invalid value: {lag}: should be at least spec.weightSync.everySteps - 1 "
               f"({every - 1}): generators sample with weights up to everySteps - 1 versions old, so a smaller lag "
               "would drop every group")
    if algo.temperature == 0:
        yield ("spec.algorithm.temperature: Invalid value: 0: should be greater than 0: greedy sampling makes every "
               "completion of a group identical, so every advantage (and every gradient) is 0")
    yield from _partial_rollouts(spec)
    if algo.steps < spec.weight_sync.every_steps:
        yield (f"spec.weightSync.everySteps: Invalid value: {spec.weight_sync.every_steps}: should be at most "
               f"spec.algorithm.steps ({algo.steps}): the generators would never receive new weights")


def _dynamic_sampling(spec: rljob.RLJobSpec) -> Problems:
    """Refill prompts (runtime ``learner/dynamic_sampling.py``) are drawn at ``slot + round * stride`` of the task
    stream, ``stride`` = promptsPerStep * steps rounded up to the trainer ranks: evaluation prompts must lie above."""
    algo, ev = spec.algorithm, spec.evaluation
    rounds = algo.refill_rounds()
    if rounds == 0 or ev is None:
        return
    ranks = spec.roles.trainer.world()
    n = algo.prompts_per_step * algo.steps
    last = n - 1 + rounds * (-(-n // ranks) * ranks)
    if ev.first_index <= last:
        yield (f"spec.evaluation.firstIndex: Invalid value: {ev.first_index}: should be above {last}, the last prompt "
               f"index spec.algorithm.dynamicSampling may draw (maxRounds {rounds} refills of promptsPerStep x steps "
               "prompts): evaluation prompts must not be trained on")


#: The losses built on the per-token surrogate (runtime ``grpo/surrogate.py``), where TIS and the mismatch mask apply.
TOKEN_SURROGATE_LOSSES = ("GRPO", "DAPO", "DrGRPO")


def _mismatch_corrections(spec: rljob.RLJobSpec) -> Problems:
    """TIS and the sequence mask act on the token surrogate; GSPO takes one clipped ratio per sequence instead."""
    algo = spec.algorithm
    loss = str(getattr(algo.loss, "value", algo.loss))
    if loss in TOKEN_SURROGATE_LOSSES:
        return
    for field, value in (("importanceCap", algo.importance_cap), ("mismatchMask", algo.mismatch_mask)):
        if value is not None:
            yield (f"spec.algorithm.{field}: Forbidden: not applied with spec.algorithm.loss {loss} (its sequence "
                   f"ratio is clipped per sequence); it applies to {', '.join(TOKEN_SURROGATE_LOSSES)}")


def _partial_rollouts(spec: rljob.RLJobSpec) -> Problems:
    """Partial rollouts need a weight update that can land while requests are in flight, and weights that an
    in-flight request can switch to (docs/runtime.md, "Partial rollouts")."""
    if not spec.algorithm.partial_rollouts:
        return
    if spec.model.lora is not None:
        yield ("spec.algorithm.partialRollouts: Invalid value: true: cannot be used with spec.model.lora: a request "
               "keeps the adapter it started with, so a new adapter never reaches the requests in flight")
    if spec.schedule.mode == rljob.ScheduleMode.COLOCATED.value:
        yield ("spec.algorithm.partialRollouts: Invalid value: true: cannot be used with spec.schedule.mode "
               "Colocated: a step's work goes out only after the push, so no update ever lands mid-generation")
    lag, every = spec.algorithm.max_policy_lag, spec.weight_sync.every_steps
    if every - 1 <= lag < every:
        yield (f"spec.algorithm.maxPolicyLag: Invalid value: {lag}: should be at least spec.weightSync.everySteps "
               f"({every}) with spec.algorithm.partialRollouts: with less, work is handed out only after the push, "
               "so no update ever lands mid-generation")


def gpu_limit(role: rljob.PodSettings) -> int:
    raw = role.resources.limits.get(GPU, role.resources.requests.get(GPU, 0))
    try:
        return int(parse_quantity(raw))
    except ValueError:
        return 0


def _sync(spec: rljob.RLJobSpec) -> Problems:
    if spec.weight_sync.backend == rljob.WeightSyncBackend.NCCL.value:
        missing = [r for r in ("generator", "trainer")
                   if r in spec.own_roles() and gpu_limit(getattr(spec.roles, r)) < 1]
        if missing:
            yield (f"spec.weightSync.backend: Invalid value: 'NCCL': NCCL needs GPUs, but "
                   f"{', '.join(f'spec.roles.{r}' for r in missing)} requests no {GPU} (use Gloo or Auto)")


def _generator(spec: rljob.RLJobSpec) -> Problems:
    gen = spec.roles.generator
    if gen.max_model_len is not None and gen.max_model_len <= spec.algorithm.max_new_tokens:
        yield (f"spec.roles.generator.maxModelLen: Invalid value: {gen.max_model_len}: should be greater than "
               f"spec.algorithm.maxNewTokens ({spec.algorithm.max_new_tokens}): the prompt and the completion must "
               "both fit")
    gpus = gpu_limit(gen)
    if gpus and gen.tensor_parallel_size > gpus:
        yield (f"spec.roles.generator.tensorParallelSize: Invalid value: {gen.tensor_parallel_size}: should be at "
               f"most the generator's {GPU} limit ({gpus}): one GPU per tensor-parallel rank")


# ---------------------------------------------------------------- task, verifiers, gang


def _task(spec: rljob.RLJobSpec) -> Problems:
    j = spec.task.jsonl
    if j is not None and j.prompt_field == j.answer_field:
        yield (f"spec.task.jsonl.answerField: Invalid value: {j.answer_field!r}: should differ from "
               "spec.task.jsonl.promptField: the reference answer would be the prompt itself")


_SETTINGS_OF = {"regex": "Regex", "length": "Length", "codeExecution": "CodeExecution",
                "rewardModel": "RewardModel", "python": "Python"}


def _verifiers(spec: rljob.RLJobSpec) -> Problems:
    for i, v in enumerate(spec.verifiers):
        for field, kind in _SETTINGS_OF.items():
            if v.type != kind and getattr(v, _snake(field), None) is not None:
                yield f"spec.verifiers[{i}].{field}: Forbidden: may only be set when type is {kind} (type is {v.type})"
    if spec.reward.aggregation == rljob.Aggregation.WEIGHTED_SUM.value and all(v.weight == 0 for v in spec.verifiers):
        yield ("spec.verifiers: Invalid value: every verifier has weight 0: every WeightedSum reward would be 0, so "
               "nothing is learned")


def _snake(name: str) -> str:
    return re.sub(r"([A-Z])", lambda m: "_" + m.group(1).lower(), name)


def _gang(spec: rljob.RLJobSpec) -> Problems:
    g = spec.gang
    if g.backend == rljob.GangBackend.KUEUE.value and g.queue is None:
        yield "spec.gang.queue: Required value: Kueue admits only workloads that name a LocalQueue"
    if g.queue is not None and g.backend not in QUEUE_BACKENDS:
        yield (f"spec.gang.queue: Forbidden: may only be set when backend is one of {', '.join(QUEUE_BACKENDS)} "
               f"(backend is {g.backend})")


# ---------------------------------------------------------------- roles: what the rendered pods must satisfy


def parse_quantity(value: int | str) -> decimal.Decimal:
    """A Kubernetes resource quantity as a number (``"500m"`` → 0.5, ``"1Gi"`` → 1073741824); ValueError if not."""
    if isinstance(value, int):
        return decimal.Decimal(value)
    m = re.fullmatch(r"([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(.*)", value)
    if not m:
        raise ValueError(f"not a quantity: {value!r}")
    number, suffix = decimal.Decimal(m.group(1)), m.group(2)
    binary = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
    decimal_si = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
    if suffix in binary:
        return number * (decimal.Decimal(1024) ** binary[suffix])
    if suffix in decimal_si:
        return number.scaleb(decimal_si[suffix])
    if re.fullmatch(r"[eE][+-]?[0-9]+", suffix):
        return number.scaleb(int(suffix[1:]))
    raise ValueError(f"not a quantity: {value!r}")


def _resource_name_ok(name: str) -> bool:
    if name in _STANDARD_RESOURCES or name.startswith("hugepages-"):
        return True
    prefix, sep, rest = name.partition("/")
    return bool(sep) and bool(_DNS1123_SUBDOMAIN.match(prefix)) and bool(_QUALIFIED_NAME.match(rest)) \
        and len(rest) <= 63 and "kubernetes.io" not in prefix


def _resources(path: str, role: rljob.PodSettings) -> Problems:
    res = role.resources
    for kind, values in (("limits", res.limits), ("requests", res.requests)):
        for name, raw in values.items():
            here = f"{path}.resources.{kind}.{name}"
            if not _resource_name_ok(name):
                yield (f"{here}: Invalid value: {name!r}: must be a standard resource (cpu, memory, "
                       "ephemeral-storage, hugepages-*) or a fully qualified name such as nvidia.com/gpu")
                continue
            q = parse_quantity(raw)
            if q < 0:
                yield f"{here}: Invalid value: {raw!r}: must be greater than or equal to 0"
            elif name not in _STANDARD_RESOURCES and not name.startswith("hugepages-") and q != q.to_integral():
                yield f"{here}: Invalid value: {raw!r}: must be an integer (extended resources are whole devices)"
    for name, raw in res.requests.items():
        if name not in res.limits or not _resource_name_ok(name):
            continue
        req, lim = parse_quantity(raw), parse_quantity(res.limits[name])
        extended = name not in _STANDARD_RESOURCES and not name.startswith("hugepages-")
        if extended and req != lim:
            yield (f"{path}.resources.requests.{name}: Invalid value: {raw!r}: must be equal to {name} limit "
                   f"({res.limits[name]!r}): extended resources cannot be overcommitted")
        elif req > lim:
            yield (f"{path}.resources.requests.{name}: Invalid value: {raw!r}: must be less than or equal to {name} "
                   f"limit ({res.limits[name]!r})")


def _env(path: str, role: rljob.PodSettings) -> Problems:
    for i, e in enumerate(role.env):
        here = f"{path}.env[{i}].name"
        if not _ENV_NAME.match(e.name):
            yield (f"{here}: Invalid value: {e.name!r}: a valid environment variable name must consist of "
                   "alphabetic characters, digits, '_', '-', or '.', and must not start with a digit")
        elif e.name.startswith(contract.ENV_PREFIX):
            yield f"{here}: Forbidden: {e.name!r}: {contract.ENV_PREFIX}* variables are set by kubeforge itself"
    for i, src in enumerate(role.env_from):
        if src.prefix is not None and src.prefix.startswith(contract.ENV_PREFIX):
            yield (f"{path}.envFrom[{i}].prefix: Forbidden: {src.prefix!r}: {contract.ENV_PREFIX}* variables are set "
                   "by kubeforge itself")


def _label_key_ok(key: str) -> bool:
    prefix, sep, name = key.rpartition("/")
    if sep and (not prefix or len(prefix) > 253 or not _DNS1123_SUBDOMAIN.match(prefix)):
        return False
    return 0 < len(name) <= 63 and bool(_QUALIFIED_NAME.match(name))


def _scheduling(path: str, role: rljob.PodSettings) -> Problems:
    for key, value in role.node_selector.items():
        if not _label_key_ok(key):
            yield f"{path}.nodeSelector.{key}: Invalid value: {key!r}: not a valid label key"
        elif len(value) > 63 or not _LABEL_VALUE.match(value):
            yield (f"{path}.nodeSelector.{key}: Invalid value: {value!r}: a valid label value must be 63 characters "
                   "or less, empty or beginning and ending with an alphanumeric character")
    for i, t in enumerate(role.tolerations):
        yield from _toleration(f"{path}.tolerations[{i}]", t)
    if role.priority_class_name is not None and (len(role.priority_class_name) > 253
                                                 or not _DNS1123_SUBDOMAIN.match(role.priority_class_name)):
        yield (f"{path}.priorityClassName: Invalid value: {role.priority_class_name!r}: must be a lowercase RFC 1123 "
               "subdomain")


_TOLERATION_KEYS = ("key", "operator", "value", "effect", "tolerationSeconds")


def _toleration(path: str, t: dict[str, Any]) -> Problems:
    unknown = sorted(set(t) - set(_TOLERATION_KEYS))
    if unknown:
        yield f"{path}.{unknown[0]}: Unknown field: field not declared in schema"
        return
    op, effect = t.get("operator", "Equal"), t.get("effect", "")
    if op not in _TOLERATION_OPERATORS:
        yield f"{path}.operator: Unsupported value: {op!r}: supported values: {', '.join(_TOLERATION_OPERATORS)}"
    elif op == "Exists" and t.get("value"):
        yield f"{path}.value: Invalid value: {t['value']!r}: value must be empty when operator is 'Exists'"
    elif op == "Equal" and not t.get("key"):
        yield f"{path}.key: Required value: operator 'Equal' needs a key"
    if effect not in _TOLERATION_EFFECTS:
        yield (f"{path}.effect: Unsupported value: {effect!r}: supported values: "
               f"{', '.join(repr(e) for e in _TOLERATION_EFFECTS)}")
    if "tolerationSeconds" in t and effect != "NoExecute":
        yield f"{path}.tolerationSeconds: Forbidden: may only be set when effect is 'NoExecute'"


def _storage(path: str, role: rljob.PodSettings) -> Problems:
    declared: list[str] = []
    for i, v in enumerate(role.volumes):
        name = v.get("name")
        here = f"{path}.volumes[{i}].name"
        if not isinstance(name, str) or not name:
            yield f"{here}: Required value"
        elif len(name) > 63 or not _DNS1123_LABEL.match(name):
            yield f"{here}: Invalid value: {name!r}: must be a lowercase RFC 1123 label"
        elif name.startswith(contract.RESERVED_NAME_PREFIX):
            yield f"{here}: Forbidden: {name!r}: names starting with {contract.RESERVED_NAME_PREFIX!r} are kubeforge's own"
        elif name in declared:
            yield f"{here}: Duplicate value: {name!r}"
        else:
            declared.append(name)
    paths: list[str] = []
    for i, m in enumerate(role.volume_mounts):
        here = f"{path}.volumeMounts[{i}]"
        name, mount = m.get("name"), m.get("mountPath")
        if not isinstance(name, str) or not name:
            yield f"{here}.name: Required value"
        elif name not in declared:
            yield f"{here}.name: Not found: {name!r}: no volume of this role has that name"
        if not isinstance(mount, str) or not mount:
            yield f"{here}.mountPath: Required value"
        elif not mount.startswith("/"):
            yield f"{here}.mountPath: Invalid value: {mount!r}: must be an absolute path"
        elif _under(mount, contract.RESERVED_MOUNT_DIR):
            yield f"{here}.mountPath: Forbidden: {mount!r}: {contract.RESERVED_MOUNT_DIR} is kubeforge's own"
        elif mount.rstrip("/") in paths:
            yield f"{here}.mountPath: Duplicate value: {mount!r}"
        else:
            paths.append(mount.rstrip("/"))


def _under(path: str, root: str) -> bool:
    p = path.rstrip("/")
    return p == root or p.startswith(root + "/")


def _image(path: str, role: rljob.PodSettings) -> Problems:
    if role.image is not None and (len(role.image) > 4096 or not _IMAGE.match(role.image)):
        yield (f"{path}.image: Invalid value: {role.image!r}: not a valid image reference "
               "([registry/]name[:tag][@digest], lowercase name)")
    if role.command is not None and (not role.command or any(not c for c in role.command)):
        yield f"{path}.command: Invalid value: {role.command!r}: must be a non-empty list of non-empty strings"


def pod_problems(path: str, pods: rljob.PodSettings) -> Problems:
    """What the pods rendered from ``pods`` (a role's, or a generator pool's engines at ``path``) must satisfy."""
    for check in (_image, _resources, _env, _scheduling, _storage):
        yield from check(path, pods)


def _roles(spec: rljob.RLJobSpec) -> Problems:
    for name in contract.ROLES:
        yield from pod_problems(f"spec.roles.{name}", getattr(spec.roles, name))
    if spec.agent is not None:      # the agent pods render like the roles' (render/agent.py)
        yield from pod_problems("spec.agent", spec.agent)
        if any(not a for a in spec.agent.program):
            yield (f"spec.agent.program: Invalid value: {spec.agent.program!r}: must be a non-empty list of non-empty "
                   "strings")
    if spec.sandbox is not None:    # the sandbox pods render like the roles' (render/sandbox.py)
        yield from pod_problems("spec.sandbox", spec.sandbox)


# ---------------------------------------------------------------- fields added since the admission work
# (docs/validation.md lists every pair examined, with the verdict of each)


def _builtin_model(spec: rljob.RLJobSpec) -> Problems:
    """What a built-in model cannot honour: an adapter on a layer it does not have, a length beyond its context."""
    found = builtins.of(spec.model)
    if found is None:
        return      # a path model: its folder is a volume, checked by the roles before any engine starts
    name, facts = found
    if spec.model.lora is not None:
        for i, layer in enumerate(spec.model.lora.target_modules):
            if layer not in facts.lora_layers:
                yield (f"spec.model.lora.targetModules[{i}]: Unsupported value: {layer!r}: the built-in model {name} "
                       f"has no such layer; supported values: {', '.join(facts.lora_layers)}")
    if spec.algorithm.max_new_tokens >= facts.context:
        yield (f"spec.algorithm.maxNewTokens: Invalid value: {spec.algorithm.max_new_tokens}: should be less than "
               f"the context length of the built-in model {name} ({facts.context}): the prompt and the completion "
               "must both fit")
    ev = spec.evaluation
    if ev is not None and ev.max_new_tokens is not None and ev.max_new_tokens >= facts.context:
        yield (f"spec.evaluation.maxNewTokens: Invalid value: {ev.max_new_tokens}: should be less than the context "
               f"length of the built-in model {name} ({facts.context}): the prompt and the answer must both fit")
    gen = spec.roles.generator
    if gen.max_model_len is not None and gen.max_model_len > facts.context:
        yield (f"spec.roles.generator.maxModelLen: Invalid value: {gen.max_model_len}: should be at most the context "
               f"length of the built-in model {name} ({facts.context}): vLLM refuses a longer one at start")


def distinct_prompts(task: rljob.TaskSpec) -> int | None:
    """How many different prompts a procedural task can draw (None: unknown or too many to matter)."""
    if task.copy_ is not None:
        return int(len(set(task.copy_.alphabet)) ** task.copy_.length)
    if task.arithmetic is not None:
        d = task.arithmetic.digits
        numbers = 10 if d == 1 else 9 * 10 ** (d - 1)
        return numbers * numbers * len(set(task.arithmetic.operations))
    return None


def _evaluation(spec: rljob.RLJobSpec) -> Problems:
    ev, algo = spec.evaluation, spec.algorithm
    if ev is None:
        return
    trained = algo.prompts_per_step * algo.steps
    if ev.first_index < trained:
        yield (f"spec.evaluation.firstIndex: Invalid value: {ev.first_index}: should be at least "
               f"spec.algorithm.promptsPerStep x spec.algorithm.steps ({trained}): training uses the prompts below "
               "it, so the held-out prompts would be trained on (leave it unset for the default)")
        return
    n = distinct_prompts(spec.task)
    if n is not None and n <= trained:
        kind = "copy" if spec.task.copy_ is not None else "arithmetic"
        yield (f"spec.evaluation: Invalid value: the {kind} task has only {n} distinct prompts and training draws "
               f"{trained} (spec.algorithm.promptsPerStep x steps): nearly every held-out prompt is a training prompt, "
               f"so the accuracy measures nothing held out; widen spec.task.{kind} or remove spec.evaluation")


def _lr_schedule(spec: rljob.RLJobSpec) -> Problems:
    sched, steps = spec.algorithm.learning_rate_schedule, spec.algorithm.steps
    if sched.warmup_steps > steps:
        yield (f"spec.algorithm.learningRateSchedule.warmupSteps: Invalid value: {sched.warmup_steps}: should be at "
               f"most spec.algorithm.steps ({steps}): the warm-up would outlast the run, so no step would train at "
               "learningRate")
    if sched.type == rljob.LRScheduleType.CONSTANT.value and sched.min_ratio != 0:
        yield (f"spec.algorithm.learningRateSchedule.minRatio: Forbidden: applies only to type Cosine (type is "
               "Constant): remove it or set type: Cosine")


NEEDS_ALL_WEIGHTS = rljob.Aggregation.WEIGHTED_SUM.value
MIN_WEAK_VERIFIERS = 3


def _reward(spec: rljob.RLJobSpec) -> Problems:
    agg = spec.reward.aggregation
    if agg != rljob.Aggregation.WEAK_SUPERVISION.value and spec.reward.weak_supervision != rljob.WeakSupervisionSpec():
        yield (f"spec.reward.weakSupervision: Forbidden: may only be set when spec.reward.aggregation is "
               f"WeakSupervision (aggregation is {agg}): its settings would be ignored")
    if agg != NEEDS_ALL_WEIGHTS:
        for i, v in enumerate(spec.verifiers):
            if v.weight != 1.0:
                yield (f"spec.verifiers[{i}].weight: Forbidden: {v.weight}: {agg} ignores verifier weights (only "
                       "WeightedSum weighs verifiers): remove it or use aggregation WeightedSum")
    if agg == rljob.Aggregation.WEAK_SUPERVISION.value and len(spec.verifiers) < MIN_WEAK_VERIFIERS:
        yield (f"spec.reward.aggregation: Invalid value: 'WeakSupervision': needs at least {MIN_WEAK_VERIFIERS} "
               f"verifiers ({len(spec.verifiers)} given): its label model estimates each verifier's accuracy from "
               "the agreements of three or more; add verifiers or use WeightedSum or MajorityVote")


# Verifiers that compare the completion with the reference answer as text (a code task's reference is its tests).
_COMPARES_ANSWER = (rljob.VerifierType.EXACT_ANSWER.value, rljob.VerifierType.MATH_EQUIVALENCE.value)


def _verifiers_and_task(spec: rljob.RLJobSpec) -> Problems:
    task = spec.task
    kind = "arithmetic" if task.arithmetic is not None else "copy" if task.copy_ is not None else None
    deadline = spec.failure_policy.progress_deadline_seconds
    for i, v in enumerate(spec.verifiers):
        if v.type == rljob.VerifierType.CODE_EXECUTION.value and kind is not None:
            yield (f"spec.verifiers[{i}].type: Invalid value: 'CodeExecution': runs the reference answer as tests, "
                   f"but the {kind} task's answers are not tests; use it with a code or jsonl task")
        if v.type in _COMPARES_ANSWER and task.code is not None:
            yield (f"spec.verifiers[{i}].type: Invalid value: {v.type!r}: compares the completion with the reference "
                   "answer, which for the code task is its tests, so it never matches; use CodeExecution")
        ce = v.code_execution
        if ce is not None and ce.timeout_seconds > v.timeout_seconds:
            yield (f"spec.verifiers[{i}].codeExecution.timeoutSeconds: Invalid value: {ce.timeout_seconds:g}: should "
                   f"be at most spec.verifiers[{i}].timeoutSeconds ({v.timeout_seconds:g}): the group's limit ends "
                   "every run first")
        if v.timeout_seconds > deadline:
            yield (f"spec.verifiers[{i}].timeoutSeconds: Invalid value: {v.timeout_seconds:g}: should be at most "
                   f"spec.failurePolicy.progressDeadlineSeconds ({deadline}): a verifier busy that long on one group "
                   "makes no progress and is restarted as hung first")


# Auto is among them: it resolves to a gang (Coscheduling, or Kueue's admission of the job, whose generators' minCount
# is minReplicas) or to None, where minReplicas still starts the job with what fits (docs/operator.md "Auto").
GANG_MINIMUM_BACKENDS = (rljob.GangBackend.AUTO.value, rljob.GangBackend.COSCHEDULING.value,
                         rljob.GangBackend.VOLCANO.value, rljob.GangBackend.KAI.value)


def _trainer_and_elastic(spec: rljob.RLJobSpec) -> Problems:
    trainer = spec.roles.trainer
    if trainer.compile and trainer.sharding == rljob.Sharding.FSDP.value:
        yield ("spec.roles.trainer.compile: Forbidden: not applied with spec.roles.trainer.sharding FSDP (the trainer "
               "compiles DDP replicas only): remove it or use sharding DDP")
    gen = spec.roles.generator
    if gen.min_replicas is not None and spec.gang.backend not in GANG_MINIMUM_BACKENDS:
        why = "Kueue admits the exact pod count" if spec.gang.backend == rljob.GangBackend.KUEUE.value else \
            "there is no gang to hold"
        yield (f"spec.roles.generator.minReplicas: Forbidden: may only be set when spec.gang.backend is one of "
               f"{', '.join(GANG_MINIMUM_BACKENDS)} (backend is {spec.gang.backend}: {why}); remove it")


def _peer_silence(spec: rljob.RLJobSpec) -> Problems:
    fp = spec.failure_policy
    if fp.peer_silence_seconds > fp.progress_deadline_seconds:
        yield (f"spec.failurePolicy.peerSilenceSeconds: Invalid value: {fp.peer_silence_seconds}: should be at most "
               f"spec.failurePolicy.progressDeadlineSeconds ({fp.progress_deadline_seconds}): a generator silent "
               "that long is restarted as hung before the trainer would leave it out")


def _generator_pool(spec: rljob.RLJobSpec) -> Problems:
    """On a pool the job has no generators: a setting only they read would be silently ignored (``replicas`` and the
    engine settings have defaults, so only what is unset by default can be told apart)."""
    ref, gen = spec.generator_pool, spec.roles.generator
    if ref is not None and gen.min_replicas is not None:
        yield (f"spec.roles.generator.minReplicas: Forbidden: the job's generators are the engines of GeneratorPool "
               f"{ref.name!r} (spec.generatorPool), which the pool sizes itself: remove it")


RULES: tuple[Callable[[rljob.RLJobSpec], Problems], ...] = (
    _algorithm, _sync, _generator, _task, _verifiers, _gang, _roles, _dynamic_sampling,
    _builtin_model, _evaluation, _lr_schedule, _reward, _verifiers_and_task, _trainer_and_elastic,
    _mismatch_corrections, validate_environment.problems, _generator_pool, _peer_silence, validate_sandbox.problems,
)
