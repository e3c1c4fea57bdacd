"""``spec.environment.type`` -> a factory of environments (one per episode) and the stop strings of its turns.

Neighbours: ``host`` builds its environments here (in the generator process for unit tests, in each environment
worker process in the roles); ``runner`` reads ``stop``. ``Verifiers`` environments run through the endpoint
(``agents.endpoint``, ``agents.primeintellect``), not here.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib
from collections.abc import Callable
from typing import Any

from kubeforge.api import rljob
from kubeforge.runtime.agents.envs import calculator, tags


@dataclasses.dataclass(frozen=True, kw_only=True)
class Kind:
    make: Callable[[rljob.EnvironmentSpec], Callable[[], Any]]   # spec -> make_env
    stop: tuple[str, ...] = ()                                   # stop strings of a policy turn (toolFormat Tags)
    tools: tuple[dict[str, Any], ...] = ()                       # OpenAI function tools (toolFormat Native)


def _calculator(spec: rljob.EnvironmentSpec) -> Callable[[], Any]:
    return functools.partial(calculator.Calculator, native=spec.tool_format == rljob.ToolFormat.NATIVE.value)


def _guess(spec: rljob.EnvironmentSpec) -> Callable[[], Any]:
    from kubeforge.runtime.agents.envs import guess_number

    top = spec.guess_number.max_value if spec.guess_number is not None else rljob.GuessNumberEnvironment().max_value
    return lambda: guess_number.GuessNumber(max_value=top, max_turns=spec.max_turns)


def _code(spec: rljob.EnvironmentSpec) -> Callable[[], Any]:
    from kubeforge.runtime.agents.envs import code_feedback

    return code_feedback.CodeFeedback


def _python(spec: rljob.EnvironmentSpec) -> Callable[[], Any]:
    assert spec.python is not None
    module, _, name = spec.python.entry_point.partition(":")
    fn = getattr(importlib.import_module(module), name, None)
    if not callable(fn):
        raise ValueError(f"spec.environment.python.entryPoint: {spec.python.entry_point!r} is not a callable")
    return fn   # type: ignore[no-any-return]


KINDS: dict[str, Kind] = {
    rljob.EnvironmentType.CALCULATOR.value: Kind(make=_calculator, stop=tags.STOP, tools=calculator.TOOLS),
    rljob.EnvironmentType.GUESS_NUMBER.value: Kind(make=_guess),
    rljob.EnvironmentType.CODE_FEEDBACK.value: Kind(make=_code),
    rljob.EnvironmentType.PYTHON.value: Kind(make=_python),
}


def kind(spec: rljob.EnvironmentSpec) -> Kind:
    k = KINDS.get(str(spec.type))
    if k is None:
        raise ValueError(f"spec.environment.type: {spec.type!r} does not run in the episode runner")
    return k
