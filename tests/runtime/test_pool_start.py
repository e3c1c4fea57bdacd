"""The wiring of a pool engine (``generator.pool.start``) over real ZeroMQ with each job's keys, its vLLM parts
replaced by fakes: READY answers the trainer's connection, WORK comes back as rollouts to that job's verifier, a SYNC
is loaded and acked with the job's own loader, a peer holding job B's key is refused on job A's socket, STOP is
passed on, and the engine's summary lands in the run dir. The jobs file changed under the running engine: a job
that went is closed (its port taken at once by one that came), jobs that came are served, a malformed file keeps
the last good set and is counted."""
from __future__ import annotations

import json
import pathlib
import sys
import threading
import types as pytypes
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest
import yaml

from kubeforge.api import contract, load, poolkeys
from kubeforge.runtime import startup, transport, types, wire
from kubeforge.runtime.generator.pool import attach
from kubeforge.runtime.launcher import ports

ROOT = pathlib.Path(__file__).resolve().parents[2]
POOL = ROOT / "examples" / "pool"


class FakeEngine:
    def __init__(self, **kw: Any) -> None:
        self.kwargs, self.start_seconds, self.model_dir = kw, 0.0, kw["model_dir"]
        self.closed = False

    def close(self) -> None:
        self.closed = True


def fake_pool_engine(loads: list[tuple[str, int]]) -> pytypes.ModuleType:
    mod = pytypes.ModuleType("kubeforge.runtime.generator.pool.engine")

    class VllmAdapters:
        def __init__(self, llm: Any) -> None: ...
        def load(self, a: Any) -> None: ...
        def unload(self, a: Any) -> None: ...

    class JobWeights:
        def __init__(self, llm: Any, att: attach.Attached, *, folder: pathlib.Path, index: int,
                     tensor_parallel_size: int) -> None:
            self.att, self.path = att, ""

        def load(self, sync: wire.Sync) -> types.SyncResult:
            loads.append((self.att.name, sync.version))
            self.path = f"/fake/{self.att.name}/v{sync.version}"
            return types.SyncResult(seconds=0.0, bytes=1)

        def close(self) -> None: ...

    class JobSampler:
        def __init__(self, llm: Any, att: attach.Attached, *, index: int) -> None:
            self.group_size = att.spec.algorithm.group_size

        def sample(self, prompts: Sequence[types.Prompt], adapter: Any) -> list[types.RolloutGroup]:
            comp = types.Completion(token_ids=np.asarray([5], dtype=np.int64),
                                    logprobs=np.asarray([-1.0], dtype=types.LOGPROB_DTYPE), text="a",
                                    finish_reason="length")
            return [types.RolloutGroup(prompt=p, prompt_token_ids=types.token_array([1]),
                                       completions=[comp] * self.group_size, policy_version=0) for p in prompts]

    mod.VllmAdapters, mod.JobWeights, mod.JobSampler = VllmAdapters, JobWeights, JobSampler  # type: ignore[attr-defined]
    return mod


POOL_KEY = bytes(range(32))


@pytest.fixture
def layout(tmp_path: pathlib.Path) -> dict[str, Any]:
    bases = ports.allocate(7)
    pool_doc = yaml.safe_load((POOL / "pool.yaml").read_text())
    (tmp_path / "pool.json").write_text(json.dumps(pool_doc))
    keys, entries = {}, []
    for i, name in enumerate(("job-a", "job-b", "job-c")):
        job = yaml.safe_load((POOL / f"job-{'ab'[i % 2]}.yaml").read_text())
        job["metadata"]["name"] = f"pool-{name}"
        (tmp_path / f"{name}.json").write_text(json.dumps(load.dump(load.parse(job))))
        uid = f"uid-{i}"
        keys[f"pool-{name}"] = poolkeys.job_key(POOL_KEY, namespace="ns", job=f"pool-{name}", uid=uid)
        trainer = bases[4 + i] if i < 2 else bases[6]
        entries.append({"name": f"pool-{name}", "namespace": "ns", "uid": uid, "manifest": str(tmp_path / f"{name}.json"),
                        "portBases": [bases[1 + i] if i < 2 else bases[1]],     # job-c: job-a's block, once it went
                        "peers": {"trainer": [f"127.0.0.1:{trainer}"], "verifier": [f"127.0.0.1:{trainer}"]}})
    attach.write(tmp_path / "jobs.json", entries[:2])
    attach.write_key(tmp_path / "pool.key", POOL_KEY)
    env = {contract.ENV_POOL: "shared", contract.ENV_CONFIG: str(tmp_path / "pool.json"), contract.ENV_INDEX: "0",
           contract.ENV_PORT_BASE: str(bases[0]), contract.ENV_BIND_HOST: "127.0.0.1",
           contract.ENV_RUN_DIR: str(tmp_path), contract.ENV_POOL_JOBS: str(tmp_path / "jobs.json"),
           contract.ENV_POOL_KEY: str(tmp_path / "pool.key")}
    return {"env": env, "keys": keys, "entries": entries[:2], "all": entries, "root": tmp_path}


def fake_vllm(monkeypatch: pytest.MonkeyPatch, layout: dict[str, Any], loads: list[tuple[str, int]]) -> None:
    from kubeforge.runtime import generator as generator_pkg
    from kubeforge.runtime.generator import pool as pool_pkg
    from kubeforge.runtime.generator.pool import start

    fake = fake_pool_engine(loads)
    monkeypatch.setitem(sys.modules, "kubeforge.runtime.generator.pool.engine", fake)
    monkeypatch.setattr(pool_pkg, "engine", fake, raising=False)
    engine_mod = pytypes.ModuleType("kubeforge.runtime.generator.engine")
    engine_mod.Engine = FakeEngine  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "kubeforge.runtime.generator.engine", engine_mod)
    monkeypatch.setattr(generator_pkg, "engine", engine_mod, raising=False)
    monkeypatch.setattr(start.models, "resolve", lambda spec: layout["root"])


def ends_of(entry: dict[str, Any], key: bytes) -> dict[str, Any]:
    """A job's trainer 0 (control) and verifier (data) ends, with the job's keys, and where the pool serves it."""
    keys = transport.CurveKeys.from_job_key(key)
    base = int(entry["peers"]["trainer"][0].rsplit(":", 1)[1])
    return {"control": transport.open_receiver(f"tcp://127.0.0.1:{base + contract.PORT_CONTROL}", auth=keys),
            "verifier": transport.open_receiver(f"tcp://127.0.0.1:{base + contract.PORT_DATA}", auth=keys),
            "pool": f"tcp://127.0.0.1:{entry['portBases'][0] + contract.PORT_DATA}", "keys": keys,
            "weights": base + contract.PORT_WEIGHTS}


def after_start(control: transport.Receiver, *, timeout: float) -> wire.Message | None:
    """The first message on a trainer's control end that is not a "starting" beat (an engine sends those while it
    loads: ``test_a_starting_engine_tells_each_listed_job_s_trainer_that_it_is_starting``)."""
    msg = control.recv(timeout=timeout)
    while isinstance(msg, wire.Ack) and msg.of == wire.Kind.READY and not msg.ok:
        msg = control.recv(timeout=timeout)
    return msg


def run_engine(layout: dict[str, Any], trainer_side: Callable[[], None], ends: dict[str, Any]) -> None:
    """Run the engine (``start.run``) until ``trainer_side``, in a thread, sets the stop flag; then close the
    jobs' ends."""
    from kubeforge.runtime.generator.pool import start

    t = threading.Thread(target=trainer_side, daemon=True)
    t.start()
    try:
        assert start.run(layout["env"]) == 0
    finally:
        t.join(30)
        for e in ends.values():
            e["control"].close()
            e["verifier"].close()


def test_the_engine_serves_each_job_on_its_own_socket(layout: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    from kubeforge.runtime.generator.pool import start

    loads: list[tuple[str, int]] = []
    fake_vllm(monkeypatch, layout, loads)
    stop = startup.StopFlag()
    monkeypatch.setattr(start.startup, "_stop_flag", lambda: stop)

    keys = {n: transport.CurveKeys.from_job_key(k) for n, k in layout["keys"].items()}
    ends = {}
    for e in layout["entries"]:    # each job's trainer 0 (control) and verifier (data), with the job's keys
        base = int(e["peers"]["trainer"][0].rsplit(":", 1)[1])
        ends[e["name"]] = {
            "control": transport.open_receiver(f"tcp://127.0.0.1:{base + contract.PORT_CONTROL}", auth=keys[e["name"]]),
            "verifier": transport.open_receiver(f"tcp://127.0.0.1:{base + contract.PORT_DATA}", auth=keys[e["name"]]),
            "pool": f"tcp://127.0.0.1:{e['portBases'][0] + contract.PORT_DATA}", "weights": base + contract.PORT_WEIGHTS}
    seen: dict[str, Any] = {}

    def trainer_side() -> None:
        try:
            a, b = "pool-job-a", "pool-job-b"
            tx = {n: transport.open_sender([ends[n]["pool"]], role="trainer", index=0, auth=keys[n], ready_timeout=60)
                  for n in (a, b)}
            seen["ready"] = [after_start(ends[n]["control"], timeout=60) for n in (a, b)]
            tx[a].send(wire.Work(step=1, policy_version=0, prompts=(types.Prompt(index=0, text="a", answer="a"),)))
            seen["rollout"] = ends[a]["verifier"].recv(timeout=30)
            tx[a].send(wire.Sync(version=1, step=1, host="127.0.0.1", port=ends[a]["weights"], world_size=2))
            seen["ack"] = ends[a]["control"].recv(timeout=30)
            intruder = transport.open_sender([ends[a]["pool"]], role="trainer", index=0, auth=keys[b],
                                             ready_timeout=None)
            try:                         # b's key on a's socket: the handshake fails, nothing is delivered
                intruder.send(wire.Stop(reason="forged"), timeout=2.0)
            except transport.TransportError:
                pass
            intruder.close()
            tx[a].send(wire.Stop(reason="done"))
            seen["stop"] = ends[a]["verifier"].recv(timeout=30)
            seen["b_quiet"] = ends[b]["verifier"].recv(timeout=0.5)
        finally:
            stop.set()

    run_engine(layout, trainer_side, ends)
    assert [type(r).__name__ for r in seen["ready"]] == ["Ready", "Ready"]
    assert isinstance(seen["rollout"], wire.Rollout) and seen["rollout"].group.step == 1
    assert isinstance(seen["ack"], wire.Ack) and seen["ack"].ok and seen["ack"].version == 1
    assert seen["stop"] == wire.Stop(reason="done") and seen["b_quiet"] is None    # the forged STOP never arrived
    assert loads == [("pool-job-a", 1)]
    summary = json.loads((layout["root"] / "pool-0.json").read_text())
    assert summary["pool"] == "shared" and summary["jobs"]["pool-job-a"]["stopped"]
    assert summary["jobs"]["pool-job-a"]["completions"] == 8 and summary["jobs"]["pool-job-b"]["completions"] == 0


def swap_jobs_file(root: pathlib.Path, text: str) -> None:
    """Replace the jobs file at once, as the kubelet swaps a projected folder's contents."""
    tmp = root / "jobs.json.new"
    tmp.write_text(text)
    tmp.replace(root / "jobs.json")


def test_the_engine_follows_its_jobs_file_without_a_restart(layout: dict[str, Any],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """job-a goes and job-c comes on the port block job-a held, in one change: a's socket is closed before c's is
    bound there; job-b, listed all along, is served throughout; a malformed file changes nothing and is counted."""
    from kubeforge.runtime.generator.pool import start

    loads: list[tuple[str, int]] = []
    fake_vllm(monkeypatch, layout, loads)
    monkeypatch.setattr(attach, "WATCH_SECONDS", 0.2)
    stop = startup.StopFlag()
    monkeypatch.setattr(start.startup, "_stop_flag", lambda: stop)
    a, b, c = "pool-job-a", "pool-job-b", "pool-job-c"
    ends = {e["name"]: ends_of(e, layout["keys"][e["name"]]) for e in layout["all"]}
    prompt = (types.Prompt(index=0, text="p", answer="a"),)
    seen: dict[str, Any] = {}

    def trainer_side() -> None:
        tx: dict[str, transport.Sender] = {}
        try:
            for n in (a, b):
                tx[n] = transport.open_sender([ends[n]["pool"]], role="trainer", index=0, auth=ends[n]["keys"],
                                              ready_timeout=60)
                assert isinstance(after_start(ends[n]["control"], timeout=60), wire.Ready)
            tx[a].send(wire.Work(step=1, policy_version=0, prompts=prompt))
            seen["a_served"] = ends[a]["verifier"].recv(timeout=30)
            # a goes, c comes at a's port block (the operator frees a block and gives it to the next newcomer)
            swap_jobs_file(layout["root"], json.dumps({"jobs": [layout["all"][1], layout["all"][2]]}))
            tx[c] = transport.open_sender([ends[c]["pool"]], role="trainer", index=0, auth=ends[c]["keys"],
                                          ready_timeout=60)
            seen["c_ready"] = ends[c]["control"].recv(timeout=60)
            tx[c].send(wire.Work(step=1, policy_version=0, prompts=prompt))
            seen["c_served"] = ends[c]["verifier"].recv(timeout=30)
            tx[b].send(wire.Work(step=1, policy_version=0, prompts=prompt))
            seen["b_served"] = ends[b]["verifier"].recv(timeout=30)
            swap_jobs_file(layout["root"], "{not json")     # kept: the last good set goes on being served
            threading.Event().wait(1.0)
            tx[b].send(wire.Work(step=2, policy_version=0, prompts=prompt))
            seen["b_after_bad"] = ends[b]["verifier"].recv(timeout=30)
        finally:
            for s in tx.values():
                s.close()
            stop.set()

    run_engine(layout, trainer_side, ends)
    assert isinstance(seen.get("a_served"), wire.Rollout)
    assert isinstance(seen.get("c_ready"), wire.Ready), "c served at the block a left, with c's key"
    assert isinstance(seen.get("c_served"), wire.Rollout) and isinstance(seen.get("b_served"), wire.Rollout)
    assert isinstance(seen.get("b_after_bad"), wire.Rollout) and seen["b_after_bad"].group.step == 2
    summary = json.loads((layout["root"] / "pool-0.json").read_text())
    assert summary["jobs_file_unread"] == 1
    assert summary["jobs"][a]["detached"] == 1 and summary["jobs"][b]["detached"] == 0
    assert [summary["jobs"][n]["completions"] for n in (a, b, c)] == [8, 16, 8]


def test_a_starting_engine_tells_each_listed_job_s_trainer_that_it_is_starting(
        layout: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """While its vLLM engine loads (no heartbeat of its own), the engine sends each job its jobs file lists a
    "starting" beat (an ACK of READY, not ok) every few seconds, then READY once it is up: a trainer whose engine
    restarts under it waits for its groups by the start deadline, not as for a stalled step (docs/recovery.md)."""
    from kubeforge.runtime.generator.pool import start

    fake_vllm(monkeypatch, layout, [])
    monkeypatch.setattr(start, "START_BEAT_SECONDS", 0.2)
    loaded = threading.Event()

    class SlowEngine(FakeEngine):
        def __init__(self, **kw: Any) -> None:
            loaded.wait(60)            # the engine loads until both trainers heard it is starting
            super().__init__(**kw)

    monkeypatch.setattr(sys.modules["kubeforge.runtime.generator.engine"], "Engine", SlowEngine)
    stop = startup.StopFlag()
    monkeypatch.setattr(start.startup, "_stop_flag", lambda: stop)
    ends = {e["name"]: ends_of(e, layout["keys"][e["name"]]) for e in layout["entries"]}
    seen: dict[str, list[Any]] = {n: [] for n in ends}

    def trainer_side() -> None:
        try:
            for n in ends:
                seen[n] += [ends[n]["control"].recv(timeout=30) for _ in range(2)]
            loaded.set()
            for n in ends:             # the beats still on the wire, then READY
                seen[n].append(after_start(ends[n]["control"], timeout=30))
        finally:
            loaded.set()
            stop.set()

    run_engine(layout, trainer_side, ends)
    for n, msgs in seen.items():
        assert [type(m).__name__ for m in msgs] == ["Ack", "Ack", "Ready"], (n, msgs)
        assert all(m.of == wire.Kind.READY and not m.ok and m.detail == "starting" for m in msgs[:2]), msgs


def test_a_listed_job_whose_pods_are_gone_does_not_hold_the_others(layout: dict[str, Any],
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The jobs file lists job b, whose trainer and verifier are not there (it ended, or its pods restart): job a is
    served all the same, within the bound of one READY to b (seen in real pods: a restarted engine waited on the
    verifiers of a job that had Succeeded, and the other job's step stalled)."""
    from kubeforge.runtime.generator.pool import serve, start

    fake_vllm(monkeypatch, layout, [])
    stop = startup.StopFlag()
    monkeypatch.setattr(start.startup, "_stop_flag", lambda: stop)
    a = "pool-job-a"
    ends = {a: ends_of(layout["entries"][0], layout["keys"][a])}      # nothing listens at job b's pods' ports
    seen: dict[str, Any] = {}

    def trainer_side() -> None:
        try:
            tx = transport.open_sender([ends[a]["pool"]], role="trainer", index=0, auth=ends[a]["keys"],
                                       ready_timeout=60)
            seen["ready"] = after_start(ends[a]["control"], timeout=60)
            tx.send(wire.Work(step=1, policy_version=0, prompts=(types.Prompt(index=0, text="a", answer="a"),)))
            seen["rollout"] = ends[a]["verifier"].recv(timeout=3 * serve.ANNOUNCE_SECONDS)
            tx.close()
        finally:
            stop.set()

    run_engine(layout, trainer_side, ends)
    assert isinstance(seen.get("ready"), wire.Ready)
    assert isinstance(seen.get("rollout"), wire.Rollout), "job a waited on job b's absent pods"
