"""An environment that looks for the pod's secrets where environment code could, and reports what it found as its
observation: its environment variables (values and secret-looking names), ``/proc/self/environ``, its parent's and
PID 1's ``/proc/<pid>/environ``, a token file; also its process group and rlimits. The prompt's text is JSON naming
the token file and the secret values to look for. ``search`` is also run by a plain child (the control)."""
from __future__ import annotations

import json
import os
import re
import resource
from typing import Any

from kubeforge.runtime import types
from kubeforge.runtime.agents.protocol import StepResult

SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL|^AWS_|^GOOGLE_|^AZURE_|^KUBERNETES_SERVICE")


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def search(token: str, needles: list[str]) -> dict[str, Any]:
    found: list[str] = [f"env:{k}" for k, v in os.environ.items() if any(n in v for n in needles)]
    found += [f"name:{k}" for k in os.environ if SECRET_NAME.search(k)]
    readable: dict[str, bool] = {}
    for where, path in (("self", "/proc/self/environ"), ("parent", f"/proc/{os.getppid()}/environ"),
                        ("pid1", "/proc/1/environ"), ("token", token)):
        data = _read(path)
        readable[where] = data is not None
        if data is not None and any(n.encode() in data for n in needles):
            found.append(where)
    limits = {name: resource.getrlimit(getattr(resource, name))[1] for name in ("RLIMIT_AS", "RLIMIT_NOFILE",
                                                                                 "RLIMIT_CORE")}
    return {"found": found, "readable": readable, "pgid": os.getpgid(0), "parent_pgid": os.getpgid(os.getppid()),
            "limits": limits, "home": os.environ.get("HOME", "")}


class Snoop:
    def reset(self, prompt: types.Prompt) -> list[dict[str, str]]:
        ask = json.loads(prompt.text)
        return [{"role": "user", "content": json.dumps(search(ask["token"], ask["needles"]))}]

    def step(self, text: str) -> StepResult:
        return StepResult(observation="", done=True)


def make_env() -> Snoop:
    return Snoop()
