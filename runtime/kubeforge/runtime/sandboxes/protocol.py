"""The sandbox protocol's messages: HTTP + JSON, a bearer key on every call, every field checked before use.

```
 POST /sandbox/claim                 {"wait": s}                       -> {"lease": id | null, "idle": s, "pod": i}
 POST /sandbox/leases/<id>/run       {"source", "tests", "limits"}     -> {"passed", "total", "status", "error",
                                                                           "seconds", "open"}
 POST /sandbox/leases/<id>/release   {}                                -> {"released": true}
```

Neighbours: ``server`` decodes requests with :func:`claim_request` / :func:`run_request` and answers
``Refused.reason`` with its HTTP code; ``client`` decodes answers with :func:`run_answer`. Nothing here does I/O.

Invariants: a body is at most ``MAX_BODY`` bytes of a JSON object; a string field has a bound, a list a length
bound, a number a range; anything else is a :class:`Refused` with a reason from ``REASONS`` (the refusals metric's
label values), never a partial request. No pickle, no eval: JSON only.
"""
from __future__ import annotations

import dataclasses
import json
import math
import re
from typing import Any

from kubeforge.runtime.verifiers import sandbox

MAX_BODY = 1 << 20                  # a request's body: source and tests of one run
MAX_ANSWER = 1 << 16                # an answer's body (a run's error is cut to ERROR_CHARS)
MAX_SOURCE = 512 * 1024
MAX_TESTS, MAX_TEST_CHARS = 256, 4096
ERROR_CHARS = 2000
MAX_CLAIM_WAIT = 10.0               # a claim's long poll at one pod, seconds
LEASE_ID = re.compile(r"^[0-9a-f]{32}$")
# the caps a pod puts on a run's own limits (the pod's own limits bound it all the same)
CAP_MEMORY_MIB, CAP_PROCESSES, CAP_FILE_MIB = 4096, 64, 256

CLAIM, LEASES = "/sandbox/claim", "/sandbox/leases/"
REASONS = ("unauthorized", "malformed", "too_large", "not_found", "unknown_lease", "busy")
STATUS = {"unauthorized": 401, "malformed": 400, "too_large": 413, "not_found": 404, "unknown_lease": 404,
          "busy": 409}


class Refused(Exception):
    """A request not acted on: ``reason`` is one of ``REASONS``."""

    def __init__(self, reason: str, detail: str) -> None:
        assert reason in REASONS
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail = reason, detail


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunRequest:
    source: str
    tests: list[str]
    limits: sandbox.Limits


def body(raw: bytes) -> dict[str, Any]:
    """A request body: one JSON object."""
    if len(raw) > MAX_BODY:
        raise Refused("too_large", f"{len(raw)} bytes, at most {MAX_BODY}")
    try:
        out = json.loads(raw or b"{}")
    except (ValueError, UnicodeDecodeError) as exc:
        raise Refused("malformed", f"not JSON: {exc}") from None
    if not isinstance(out, dict):
        raise Refused("malformed", "not a JSON object")
    return out


def _number(d: dict[str, Any], key: str, *, default: float, low: float, high: float) -> float:
    v = d.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not low <= v <= high:
        raise Refused("malformed", f"{key}: must be a number in [{low:g}, {high:g}]")
    return float(v)


def claim_request(d: dict[str, Any]) -> float:
    """The claim's long poll, seconds (cut to ``MAX_CLAIM_WAIT``)."""
    return min(_number(d, "wait", default=0.0, low=0.0, high=3600.0), MAX_CLAIM_WAIT)


def run_request(d: dict[str, Any], *, max_run_seconds: float) -> RunRequest:
    src, tests, lim = d.get("source"), d.get("tests"), d.get("limits", {})
    if not isinstance(src, str) or len(src) > MAX_SOURCE:
        raise Refused("malformed", f"source: must be a string of at most {MAX_SOURCE} characters")
    if not isinstance(tests, list) or len(tests) > MAX_TESTS or any(
            not isinstance(t, str) or len(t) > MAX_TEST_CHARS for t in tests):
        raise Refused("malformed", f"tests: must be a list of at most {MAX_TESTS} strings of at most "
                      f"{MAX_TEST_CHARS} characters")
    if not isinstance(lim, dict):
        raise Refused("malformed", "limits: must be an object")
    limits = sandbox.Limits(
        timeout_s=min(_number(lim, "timeoutSeconds", default=5.0, low=0.01, high=3600.0), max_run_seconds),
        memory_mib=int(_number(lim, "memoryMiB", default=256, low=16, high=CAP_MEMORY_MIB)),
        max_processes=int(_number(lim, "maxProcesses", default=8, low=1, high=CAP_PROCESSES)),
        max_file_mib=int(_number(lim, "maxFileMiB", default=16, low=1, high=CAP_FILE_MIB)))
    return RunRequest(source=src, tests=list(tests), limits=limits)


def limits_body(limits: sandbox.Limits) -> dict[str, Any]:
    return {"timeoutSeconds": limits.timeout_s, "memoryMiB": limits.memory_mib,
            "maxProcesses": limits.max_processes, "maxFileMiB": limits.max_file_mib}


def run_body(result: sandbox.Result, *, open_: bool) -> dict[str, Any]:
    return {"passed": result.passed, "total": result.total, "status": result.status,
            "error": None if result.error is None else result.error[:ERROR_CHARS],
            "seconds": round(result.seconds, 4), "open": open_}


def run_answer(d: dict[str, Any]) -> tuple[sandbox.Result, bool]:
    """A run's answer (client side): the result and whether the lease is still open. Raises ``ValueError``."""
    try:
        passed, total, status = d["passed"], d["total"], d["status"]
        error, seconds, open_ = d.get("error"), d["seconds"], d["open"]
    except KeyError as exc:
        raise ValueError(f"run answer without {exc}") from None
    if not (isinstance(passed, int) and isinstance(total, int) and 0 <= passed <= total <= MAX_TESTS
            and status in ("ok", "timeout", "crashed") and (error is None or isinstance(error, str))
            and isinstance(seconds, (int, float)) and isinstance(open_, bool)):
        raise ValueError("run answer: a field out of its type or range")
    return sandbox.Result(passed=passed, total=total, status=status, error=error, seconds=float(seconds)), open_


def lease_route(path: str) -> tuple[str, str]:
    """``/sandbox/leases/<id>/<op>`` -> (id, op); ``Refused("not_found")`` for any other path."""
    rest = path[len(LEASES):] if path.startswith(LEASES) else ""
    lease, _, op = rest.partition("/")
    if not LEASE_ID.match(lease) or op not in ("run", "release"):
        raise Refused("not_found", path[:100])
    return lease, op
