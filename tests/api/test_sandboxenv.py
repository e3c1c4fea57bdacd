"""The sandbox process's env contract (``api.sandboxenv``): what is rendered reads back, and each bad variable is
named."""
from __future__ import annotations

from kubeforge.api import contract, roleenv, sandboxenv

KEY = bytes(range(32))


def test_read_gives_back_what_render_wrote() -> None:
    env = {k: str(v) for k, v in sandboxenv.render(index=0, job_name="j", port_base=30000, bind_host="127.0.0.1",
                                                   key=KEY, slots=3, max_run_seconds=12.5,
                                                   idle_seconds=90.0).items()}
    got, problems = sandboxenv.read(env)
    assert problems == []
    assert got == sandboxenv.SandboxEnv(index=0, job_name="j", port_base=30000, bind_host="127.0.0.1", key=KEY,
                                        slots=3, max_run_seconds=12.5, idle_seconds=90.0)
    assert contract.ENV_JOB_KEY not in env


def test_each_bad_variable_is_named() -> None:
    _, problems = sandboxenv.read({contract.ENV_ROLE: "verifier", contract.ENV_INDEX: "-1",
                                   sandboxenv.ENV_SLOTS: "0", sandboxenv.ENV_IDLE: "soon",
                                   contract.ENV_SANDBOX_KEY: "zz"})
    named = [p.split(":")[0] for p in problems]
    assert named == [contract.ENV_ROLE, contract.ENV_INDEX, sandboxenv.ENV_SLOTS, sandboxenv.ENV_IDLE,
                     contract.ENV_SANDBOX_KEY]


def test_the_client_side() -> None:
    assert sandboxenv.read_client({}) is None
    peers = [roleenv.Peer(host="a", port_base=1), roleenv.Peer(host="b", port_base=2)]
    env = {k: str(v) for k, v in sandboxenv.client_env(sandboxes=peers, key=KEY).items()}
    assert sandboxenv.read_client(env) == (tuple(peers), KEY)
