"""VerifierType -> verifier constructor: the only place that looks at ``VerifierSpec.type``.

Neighbours: ``score.Scorer`` builds one verifier per spec at start-up (configuration errors surface then, naming the
field, not while scoring).
"""
from __future__ import annotations

from typing import Callable

from kubeforge.api import rljob
from kubeforge.runtime.verifiers import base, exact, math_equivalence, regex

Constructor = Callable[[rljob.VerifierSpec], base.Verifier]


def _regex(spec: rljob.VerifierSpec) -> base.Verifier:
    if spec.regex is None:
        raise ValueError(f"verifier {spec.name}: {rljob.MSG_REGEX_NEEDS_SETTINGS}")
    return regex.Regex(pattern=spec.regex.pattern, full_match=spec.regex.full_match,
                       field=f"verifier {spec.name}: regex.pattern")


REGISTRY: dict[str, Constructor] = {
    rljob.VerifierType.EXACT_ANSWER.value: lambda spec: exact.ExactAnswer(),
    rljob.VerifierType.MATH_EQUIVALENCE.value: lambda spec: math_equivalence.MathEquivalence(),
    rljob.VerifierType.REGEX.value: _regex,
}


def build(spec: rljob.VerifierSpec) -> base.Verifier:
    """The verifier a spec describes; ValueError names the verifier and field when it cannot be built."""
    kind = rljob.VerifierType(spec.type).value
    return REGISTRY[kind](spec)
