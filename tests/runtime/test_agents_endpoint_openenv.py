"""The OpenEnv adapter against a real HTTP server speaking OpenEnv's routes (/reset, /step, /schema), written here
with the standard library: a number-guessing game whose /step refuses a non-integer guess with 422, as OpenEnv's
server does for an action outside its schema. Bad servers: hanging, flooding, answering garbage, erroring."""
from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from kubeforge.runtime.agents.envs import openenv_http

SECRET = 6
SCHEMA = {"type": "object", "properties": {"guess": {"type": "integer"}}, "required": ["guess"]}


class Game(http.server.BaseHTTPRequestHandler):
    mode = "ok"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        return

    def do_GET(self) -> None:  # noqa: N802
        self._send(200, {"action": SCHEMA, "observation": {}, "state": {}})

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        if self.mode == "hang":
            time.sleep(3)
        if self.mode == "error":
            return self._send(500, {"detail": "boom"})
        if self.mode == "garbage":
            return self._send(200, {"obs": 1})
        if self.mode == "flood":
            return self._send(200, {"observation": {"text": "x" * 5000}, "reward": None, "done": False})
        if self.path == "/reset":
            return self._send(200, {"observation": {"text": "guess 1-9"}, "reward": None, "done": False})
        guess = body.get("action", {}).get("guess")
        if not isinstance(guess, int):
            return self._send(422, {"detail": [{"loc": ["body", "action", "guess"], "msg": "not an integer"}]})
        hint = "right" if guess == SECRET else "higher" if guess < SECRET else "lower"
        self._send(200, {"observation": {"text": hint}, "reward": 1.0 if guess == SECRET else -0.1,
                         "done": guess == SECRET})

    def _send(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        try:
            self.wfile.write(data)
        except BrokenPipeError:         # the "hang" case: the client gave up first, as it should
            pass


@pytest.fixture
def server() -> Iterator[http.server.ThreadingHTTPServer]:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), type("G", (Game,), {"mode": "ok"}))
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


def url(srv: http.server.ThreadingHTTPServer) -> str:
    return f"http://127.0.0.1:{srv.server_address[1]}"


def test_an_episode_of_guesses(server: http.server.ThreadingHTTPServer) -> None:
    env = openenv_http.OpenEnvHttp(url(server), timeout=5)
    first = env.reset()
    assert json.loads(first[0]["content"]) == {"observation": {"text": "guess 1-9"}, "action_schema": SCHEMA}
    s1 = env.step("3")                                   # plain text: the one required field
    assert not s1.done and json.loads(s1.observation[0]["content"])["observation"] == {"text": "higher"}
    s2 = env.step('{"guess": "seven"}')                  # refused by the server (422): feedback, not the end
    assert not s2.done and s2.tool_errors == 1 and "refused" in s2.observation[0]["content"]
    s3 = env.step("")                                    # no action at all
    assert s3.tool_errors == 1 and "not an action" in s3.observation[0]["content"]
    s4 = env.step('{"guess": 6}')
    assert s4.done and s4.reward == pytest.approx(0.9)   # -0.1 + 1.0: the steps' rewards summed


@pytest.mark.parametrize(("mode", "reason"), [("hang", "env_timeout"), ("flood", "env_flood"),
                                              ("garbage", "env_garbage"), ("error", "env_error")])
def test_bad_servers_fail_the_episode_with_a_reason(server: http.server.ThreadingHTTPServer, mode: str,
                                                    reason: str) -> None:
    server.RequestHandlerClass.mode = mode  # type: ignore[attr-defined]
    env = openenv_http.OpenEnvHttp(url(server), timeout=1, max_bytes=2000)
    start = time.monotonic()
    with pytest.raises(openenv_http.OpenEnvError) as info:
        env.reset()
    assert info.value.reason == reason
    assert time.monotonic() - start < 3                  # bounded by the timeout, not the server


def test_no_server_is_an_env_error() -> None:
    with pytest.raises(openenv_http.OpenEnvError) as info:
        openenv_http.OpenEnvHttp("http://127.0.0.1:9", timeout=1).reset()
    assert info.value.reason == "env_error"
