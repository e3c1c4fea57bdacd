"""One bounded JSON POST with a bearer token: the client side of the job's small HTTP protocols (an agent pod's
claims, ``agents/pods/worker.py``; the sandbox pool's, ``sandboxes/client.py``).

Standard library only (an agent pod's or an environment worker's process imports it). Invariant: the answer is a
JSON object read up to ``max_bytes``, or ``OSError`` (refused, timed out, an HTTP error, not HTTP, not JSON).
"""
from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request
from typing import Any


def post(base: str, path: str, token: str, body: dict[str, Any], *, timeout: float,
         max_bytes: int = 1 << 20) -> dict[str, Any]:
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            out = json.loads(resp.read(max_bytes))
    except urllib.error.HTTPError as exc:
        raise OSError(f"HTTP {exc.code} from {base}{path}") from None
    except http.client.HTTPException as exc:
        # e.g. BadStatusLine: before a server listens, a local connect to its port may connect to itself
        # (TCP simultaneous open on an ephemeral port) and read its own request back
        raise OSError(f"no HTTP answer from {base}{path}: {exc!r}") from None
    except ValueError as exc:
        raise OSError(f"not JSON from {base}{path}: {exc}") from None
    if not isinstance(out, dict):
        raise OSError(f"not a JSON object from {base}{path}")
    return out
