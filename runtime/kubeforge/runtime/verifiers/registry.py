"""VerifierType -> verifier constructor: the only place that looks at ``VerifierSpec.type``.

Neighbours: ``score.Scorer`` builds one verifier per spec at start-up (configuration errors surface then, naming the
field, not while scoring); ``pool.ProcessVerifier`` rebuilds the inner verifier in its worker with ``build_inner``
(handed to it, so ``pool`` imports nothing of this module). Heavy dependencies (torch for RewardModel) are imported
by their constructor only.
"""
from __future__ import annotations

from typing import Callable

from kubeforge.api import rljob
from kubeforge.runtime.verifiers import base, code, exact, length, math_equivalence, pool, python_fn, regex

Constructor = Callable[[rljob.VerifierSpec], base.Verifier]

# Rule verifiers bounded by themselves, scored inline in the role's (main) thread, no hop to the pool: Regex and
# MathEquivalence use SIGALRM-based time limits, which work on the main thread only.
INLINE = {rljob.VerifierType.EXACT_ANSWER.value, rljob.VerifierType.REGEX.value, rljob.VerifierType.LENGTH.value,
          rljob.VerifierType.MATH_EQUIVALENCE.value}


def _need(spec: rljob.VerifierSpec, value: object, msg: str) -> None:
    if value is None:
        raise ValueError(f"verifier {spec.name}: {msg}")


def _regex(spec: rljob.VerifierSpec) -> base.Verifier:
    _need(spec, spec.regex, rljob.MSG_REGEX_NEEDS_SETTINGS)
    assert spec.regex is not None
    return regex.Regex(pattern=spec.regex.pattern, full_match=spec.regex.full_match,
                       field=f"verifier {spec.name}: regex.pattern", timeout_s=spec.timeout_seconds)


def _length(spec: rljob.VerifierSpec) -> base.Verifier:
    _need(spec, spec.length, rljob.MSG_LENGTH_NEEDS_SETTINGS)
    assert spec.length is not None
    return length.Length(min_chars=spec.length.min_chars, max_chars=spec.length.max_chars,
                         slope_chars=spec.length.slope_chars)


def _code(spec: rljob.VerifierSpec) -> base.Verifier:
    return code.CodeExecution(spec.code_execution or rljob.CodeExecutionVerifier())


def _reward_model(spec: rljob.VerifierSpec) -> base.Verifier:
    _need(spec, spec.reward_model, rljob.MSG_REWARD_MODEL_NEEDS_SETTINGS)
    assert spec.reward_model is not None
    from kubeforge.runtime.verifiers import reward_model
    v: base.Verifier = reward_model.RewardModel(spec.reward_model, field=f"verifier {spec.name}: rewardModel.path")
    return v


def _python(spec: rljob.VerifierSpec) -> base.Verifier:
    _need(spec, spec.python, rljob.MSG_PYTHON_NEEDS_SETTINGS)
    assert spec.python is not None
    return python_fn.PythonFunction(spec.python.entry_point, field=f"verifier {spec.name}: python.entryPoint")


REGISTRY: dict[str, Constructor] = {
    rljob.VerifierType.EXACT_ANSWER.value: lambda spec: exact.ExactAnswer(),
    rljob.VerifierType.MATH_EQUIVALENCE.value: lambda spec: math_equivalence.MathEquivalence(),
    rljob.VerifierType.REGEX.value: _regex,
    rljob.VerifierType.LENGTH.value: _length,
    rljob.VerifierType.CODE_EXECUTION.value: _code,
    rljob.VerifierType.REWARD_MODEL.value: _reward_model,
    rljob.VerifierType.PYTHON.value: _python,
}


def build_inner(spec: rljob.VerifierSpec) -> base.Verifier:
    """The verifier itself, in this process, whatever its isolation."""
    return REGISTRY[rljob.VerifierType(spec.type).value](spec)


def build(spec: rljob.VerifierSpec) -> base.Verifier:
    """The verifier a spec describes (a process worker for ``isolation: Process``); ValueError names the verifier
    and field when it cannot be built."""
    if spec.isolation == rljob.Isolation.PROCESS.value:
        if spec.type != rljob.VerifierType.REWARD_MODEL.value:  # a model is loaded by the worker only
            build_inner(spec)  # configuration errors surface here, at start-up, not in the worker
        return pool.ProcessVerifier(spec.model_dump_json(by_alias=True), timeout_s=spec.timeout_seconds,
                                    build=build_inner)
    return build_inner(spec)


def is_inline(spec: rljob.VerifierSpec) -> bool:
    return spec.type in INLINE and spec.isolation == rljob.Isolation.THREAD.value
