"""An environment worker process: ``python -m kubeforge.runtime.agents.hosts.worker SPEC_JSON``.

Started by ``workers.SubprocessHost``; holds the environments of the episodes it is given and answers one request at
a time over its stdin/stdout (``pipe`` frames). The environment's own prints go to stderr (stdout is the channel).
An exception in ``reset``/``step`` is answered as an error and the worker goes on; a worker that hangs, floods or
dies is killed and replaced by its host. Its host starts it through ``isolation`` (``confine`` runs first): its
rlimits, minimal environment and Landlock domain are in place before this module runs.

Requests: ``{"op": "reset", "id", "prompt": {index, text, answer}}`` -> ``{"ok", "messages"}``;
``{"op": "step", "id", "text"}`` -> ``{"ok", "result": StepResult fields}``; ``{"op": "close", "id"}`` (no answer).
"""
from __future__ import annotations

import os
import sys
from typing import Any

from kubeforge.api import rljob
from kubeforge.runtime import types
from kubeforge.runtime.agents import protocol
from kubeforge.runtime.agents.hosts import pipe
from kubeforge.runtime.agents.envs import registry

def serve(spec: rljob.EnvironmentSpec, rfd: int, wfd: int) -> None:
    make = registry.kind(spec).make(spec)
    envs: dict[int, Any] = {}
    while True:
        try:
            req = pipe.read(rfd, deadline=None, max_bytes=1 << 24)
        except pipe.Closed:
            return
        op, i = req.get("op"), int(req.get("id", -1))
        if op == "close":
            protocol.close(envs.pop(i, None))
            continue
        pipe.write(wfd, _answer(op, i, req, envs, make))


def _answer(op: Any, i: int, req: dict[str, Any], envs: dict[int, Any], make: Any) -> dict[str, Any]:
    try:
        if op == "reset":
            protocol.close(envs.pop(i, None))
            envs[i] = make()
            out: dict[str, Any] = {"ok": True, "messages": envs[i].reset(types.Prompt(**req["prompt"]))}
        elif op == "step":
            value = envs[i].step(str(req["text"]))
            out = {"ok": True, "result": protocol.as_dict(value) if isinstance(value, protocol.StepResult) else value}
        else:
            return {"ok": False, "error": f"unknown request {op!r}"}
    except Exception as e:  # noqa: BLE001 - the environment's failure goes back as data
        return {"ok": False, "error": f"{type(e).__name__}: {e}"[:1000]}
    try:
        import msgpack

        msgpack.packb(out, use_bin_type=True)
    except Exception as e:  # noqa: BLE001 - not plain data: garbage
        return {"ok": False, "garbage": f"{op}: not plain data ({type(e).__name__})"}
    return out


def main() -> None:
    spec = rljob.EnvironmentSpec.model_validate_json(sys.argv[1])
    rfd, wfd = os.dup(sys.stdin.fileno()), os.dup(sys.stdout.fileno())
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())   # an environment's print() must not corrupt the channel
    serve(spec, rfd, wfd)


if __name__ == "__main__":
    main()
