"""Python: a user's function ``package.module:function`` (importable on the image's Python path), called once per
group as ``fn(prompt=str, reference=str, completions=list[str])``; it returns one number per completion (NaN = no
score for that completion).

Neighbours: ``registry`` builds it for ``type: Python``; the API model checks the entryPoint's shape; this module
imports it at build time, so a missing module or attribute fails start-up with an error naming the field. A
function that may hang or burn CPU should run with ``isolation: Process``.
"""
from __future__ import annotations

import importlib
from typing import Any, Callable, Sequence

from kubeforge.runtime import types


class PythonFunction:
    def __init__(self, entry_point: str, *, field: str = "python.entryPoint") -> None:
        module_name, _, attr = entry_point.partition(":")
        try:
            module = importlib.import_module(module_name)
        except Exception as e:
            raise ValueError(f"{field}: cannot import {module_name!r}: {type(e).__name__}: {e}") from None
        fn = getattr(module, attr, None)
        if not callable(fn):
            raise ValueError(f"{field}: {module_name!r} has no function {attr!r}")
        self.entry_point = entry_point
        self._fn: Callable[..., Any] = fn

    def score(self, prompt: types.Prompt, completions: Sequence[str]) -> list[float]:
        got = self._fn(prompt=prompt.text, reference=prompt.answer, completions=list(completions))
        return [float(x) for x in got]
