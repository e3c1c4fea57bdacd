"""Probe: what the agents endpoint adds per call (HTTP, validation, chat template, delta tokenisation, record),
measured with the ``openai`` client against a sampler that answers at once (the tests' ScriptedSampler), so the
figure is the endpoint's own cost, not vLLM's. Baseline in the same run: the same client against a bare
``http.server`` that returns a canned completion (HTTP + the client's own work only).

    PYTHONPATH=api:operator:runtime:tests/runtime .venv/bin/python bench/probes/endpoint_overhead.py --turns 8 --episodes 20

JSON on the last line: ms per call for both and their difference, per turn position (later turns render longer
conversations).
"""
from __future__ import annotations

import argparse
import http.server
import json
import statistics
import threading
import time
from typing import Any

import openai

from kubeforge.runtime.agents import endpoint
from kubeforge.runtime.models import tiny
from test_agents_endpoint import ScriptedSampler

CANNED = {"id": "x", "object": "chat.completion", "created": 0, "model": "policy",
          "choices": [{"index": 0, "message": {"role": "assistant", "content": "r1"}, "finish_reason": "stop",
                       "logprobs": None}], "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}


class Bare(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True          # as the endpoint's handler: no delayed-ACK stall in the baseline

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        return

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers["Content-Length"]))
        data = json.dumps(CANNED).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def episode(base_url: str, turns: int) -> list[float]:
    c = openai.OpenAI(base_url=base_url, api_key="x", max_retries=0, timeout=30)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Guess a number between 1 and 100."}]
    out = []
    for t in range(turns):
        start = time.perf_counter()
        r = c.chat.completions.create(model="policy", messages=messages)  # type: ignore[arg-type]
        out.append(time.perf_counter() - start)
        messages += [{"role": "assistant", "content": r.choices[0].message.content},
                     {"role": "user", "content": f"higher than {t}"}]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--episodes", type=int, default=20)
    args = ap.parse_args()
    tok = tiny.tokenizer()
    ep = endpoint.server.Endpoint(sampler=ScriptedSampler(tok), chat=endpoint.chat.ChatTemplate(tok),
                                  config=endpoint.server.EndpointConfig(max_calls_per_episode=args.turns))
    bare = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Bare)
    threading.Thread(target=bare.serve_forever, daemon=True).start()
    ours: list[list[float]] = []
    base: list[list[float]] = []
    for _ in range(args.episodes):
        eid = ep.open_episode()
        ours.append(episode(ep.base_url(eid), args.turns))
        ep.close_episode(eid)
        base.append(episode(f"http://127.0.0.1:{bare.server_address[1]}/v1", args.turns))
    ep.close()
    bare.shutdown()
    per_turn = [{"turn": t + 1, "endpoint_ms": 1e3 * statistics.median(e[t] for e in ours),
                 "bare_ms": 1e3 * statistics.median(b[t] for b in base)} for t in range(args.turns)]
    for row in per_turn:
        row["added_ms"] = row["endpoint_ms"] - row["bare_ms"]
    print(json.dumps({"episodes": args.episodes, "turns": args.turns, "per_turn": per_turn,
                      "refused": dict(ep.refused), "branches": dict(ep.branches)}))


if __name__ == "__main__":
    main()
