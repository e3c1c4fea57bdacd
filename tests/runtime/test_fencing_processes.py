"""Fencing with real trainer processes (docs/fencing.md): a trainer frozen mid-run (SIGSTOP: a partition) while a
replacement of a newer epoch resumes from its checkpoint and trains on; thawed, the old trainer trains a step, and
its weight push and its checkpoint commit are refused and counted, it exits ``EXIT_FENCED``, and the replacement
finishes with every step committed once and reports both refusals.

Two ``kubeforge role trainer`` processes from the launcher's own ProcSpecs (attempt 0: epoch 1; attempt 1: epoch
2), one checkpoint folder. This test plays generator-0 and verifier-0 of each: it answers WORK with scored groups
(sampled by no engine), and answers SYNC with the generator's real ``sync`` (one ``PushFence`` for both, as one
generator would hold) joining the real weight broadcast with a real ``WeightReceiver``."""
from __future__ import annotations

import dataclasses
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubeforge.api import contract, load, progress
from kubeforge.runtime import metrics, observe, transport, types, weightsync, wire
from kubeforge.runtime.generator import fence as push_fence
from kubeforge.runtime.generator import loop as generator_role
from kubeforge.runtime.launcher import main as launcher_main
from kubeforge.runtime.launcher import rundir, summary, supervisor
from kubeforge.runtime.learner import checkpoint, fence
from kubeforge.runtime.trainer import start as trainer_start

ROOT = Path(__file__).resolve().parents[2]
STEPS, PROMPTS, GROUP = 7, 2, 4
DEADLINE = 300      # the old trainer is frozen while the replacement starts: its stall clock must outlast that


def consume(tensors: Any) -> None:
    for _ in tensors:
        pass


class Weights:
    """The generator's weight loader with the real receiver (what ``EngineWeights`` does in a vLLM worker)."""

    def __init__(self, loaded: list[tuple[int, int]]) -> None:
        self.loaded = loaded
        self.receivers: dict[tuple[str, int, int], weightsync.WeightReceiver] = {}

    def load(self, sync: wire.Sync) -> generator_role.SyncResult:
        at = (sync.host, sync.port, sync.epoch)
        if at not in self.receivers:
            self.receivers[at] = weightsync.WeightReceiver(host=sync.host, port=sync.port,
                                                           world_size=sync.world_size, rank=1, epoch=sync.epoch,
                                                           backend=sync.backend, timeout=sync.timeout_s,
                                                           join_timeout=DEADLINE)
        stats = self.receivers[at].receive(consume)
        self.loaded.append((sync.trainer_epoch, sync.version))
        return generator_role.SyncResult(seconds=stats.seconds, bytes=stats.bytes)

    def close(self) -> None:
        for r in self.receivers.values():
            r.close()


class Peers:
    """Generator-0 and verifier-0 of one trainer process, played by this test."""

    def __init__(self, specs: dict[str, supervisor.ProcSpec], keys: transport.CurveKeys, push: push_fence.PushFence,
                 loaded: list[tuple[int, int]]) -> None:
        port = {name: int(s.env[contract.ENV_PORT_BASE]) for name, s in specs.items()}
        trainer = port["trainer-0"]
        self.inbox = transport.open_receiver(
            transport.tcp_address("127.0.0.1", port["generator-0"] + contract.PORT_DATA), auth=keys)
        self.control = transport.open_sender([transport.tcp_address("127.0.0.1", trainer + contract.PORT_CONTROL)],
                                             role="generator", index=0, auth=keys, ready_timeout=300)
        self.scored = transport.open_sender([transport.tcp_address("127.0.0.1", trainer + contract.PORT_DATA)],
                                            role="verifier", index=0, auth=keys, ready_timeout=300)
        self.weights_at = ("127.0.0.1", trainer + contract.PORT_WEIGHTS)
        self.push, self.weights = push, Weights(loaded)
        self.version = 0
        self.observer = observe.GeneratorObserver(metrics.Metrics(role="generator", replica=0))
        self.held: list[wire.Work] = []
        self.control.send(wire.Ready(role="generator", index=0))

    def turn(self, *, answer_below: int) -> None:
        """Take one message: SYNC through the generator's own ``sync``; WORK of steps below ``answer_below``
        answered with scored groups, later ones held."""
        msg = self.inbox.recv(timeout=0.2)
        if isinstance(msg, wire.Sync):
            self.version = generator_role.sync(msg, index=0, version=self.version, weights=self.weights,
                                               control=self.control, observer=self.observer, beat=lambda a: None,
                                               trainer_weights=self.weights_at, leave=None, fence=self.push)
        elif isinstance(msg, wire.Work):
            self.held.append(msg)
        for work in [w for w in self.held if w.step < answer_below]:
            self.held.remove(work)
            self.answer(work)

    def answer(self, work: wire.Work) -> None:
        for p in work.prompts:
            comps = [types.Completion(token_ids=[3 + (k + p.index) % 5], logprobs=[-1.5], text="") for k in range(GROUP)]
            group = types.RolloutGroup(prompt=p, prompt_token_ids=[1, 2], completions=comps,
                                       policy_version=work.policy_version, step=work.step,
                                       rewards=[float(k % 2) for k in range(GROUP)])
            self.scored.send(wire.Scored(group=group))

    def close(self) -> None:
        self.weights.close()
        for s in (self.control, self.scored):
            s.close()
        self.inbox.close()


def wait_until(pred: Any, *, serve: list[tuple[Peers, int]], timeout: float, why: str,
               alive: tuple[supervisor.Group, ...] = ()) -> None:
    """Serve until ``pred()``; fail at ``timeout`` or as soon as a process of ``alive`` exits."""
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {why}"
        for group in alive:
            exits = group.poll()
            assert not exits, f"{exits} while waiting for {why}: " + " | ".join(
                s.log.read_text()[-1500:] for s in group.specs)
        for peers, below in serve:
            peers.turn(answer_below=below)


def newest_step(root: Path) -> int:
    path = checkpoint.latest(root)
    return checkpoint.step_of(path) if path is not None else 0


@pytest.mark.slow
def test_a_thawed_stale_trainer_is_refused_its_push_and_its_commit_and_the_replacement_counts_both(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    doc = yaml.safe_load((ROOT / "examples" / "tiny.yaml").read_text())
    doc["spec"]["algorithm"].update(steps=STEPS, promptsPerStep=PROMPTS, groupSize=GROUP)
    doc["spec"]["checkpoint"] = {"path": "/checkpoints", "everySteps": 1, "keep": STEPS}
    doc["spec"]["failurePolicy"] = {"progressDeadlineSeconds": DEADLINE, "maxRestarts": 0}
    doc["spec"]["verifiers"][0]["timeoutSeconds"] = DEADLINE
    job = load.parse(doc)
    run = rundir.create(job_name="fence", explicit=str(tmp_path / "run"))
    run.manifest.write_text(yaml.safe_dump(doc))
    key = os.urandom(32)
    monkeypatch.setenv(contract.ENV_JOB_KEY, key.hex())       # the weight receivers prove the job key
    keys = transport.CurveKeys.from_job_key(key)
    specs = [{s.name: s for s in launcher_main.process_specs(job=job, run=run, attempt=a, job_key=key)}
             for a in (0, 1)]
    second = tmp_path / "run-b"                               # its own metrics.jsonl; the same checkpoint folder
    specs[1]["trainer-0"] = dataclasses.replace(
        specs[1]["trainer-0"], name="trainer-0-b", log=second / "trainer-0.log",
        env={**specs[1]["trainer-0"].env, contract.ENV_RUN_DIR: str(second)})
    assert [s["trainer-0"].env[contract.ENV_TRAINER_EPOCH] for s in specs] == ["1", "2"]
    push, loaded = push_fence.PushFence(), []
    old, new = supervisor.Group([specs[0]["trainer-0"]]), supervisor.Group([specs[1]["trainer-0"]])
    peers: list[Peers] = []
    try:
        old.start()
        peers.append(Peers(specs[0], keys, push, loaded))
        wait_until(lambda: newest_step(run.checkpoints) == 2 and peers[0].held and (1, 2) in loaded,
                   serve=[(peers[0], 2)], timeout=600, why="the old trainer's checkpoint of step 2", alive=(old,))
        os.kill(old.procs["trainer-0"].pid, signal.SIGSTOP)  # partitioned: alive, silent
        new.start()
        peers.append(Peers(specs[1], keys, push, loaded))
        wait_until(lambda: newest_step(run.checkpoints) == 4 and peers[1].held and (2, 4) in loaded,
                   serve=[(peers[1], 4)], timeout=600, why="the replacement's checkpoint of step 4",
                   alive=(old, new))
        os.kill(old.procs["trainer-0"].pid, signal.SIGCONT)  # healed: it trains its step 3
        thawed = time.monotonic()
        wait_until(lambda: old.poll(), serve=[(peers[0], STEPS), (peers[1], 4)], timeout=300,
                   why="the old trainer to stop", alive=(new,))
        stopped = time.monotonic()
        wait_until(lambda: new.poll(), serve=[(peers[1], STEPS)], timeout=600, why="the replacement to finish")
    finally:
        for group in (old, new):
            for proc in group.procs.values():
                if proc.poll() is None:
                    os.kill(proc.pid, signal.SIGCONT)
            group.stop(grace=5)
        for p in peers:
            p.close()

    (stale,), (current,) = old.poll(), new.poll()
    old_log = specs[0]["trainer-0"].log.read_text()
    assert stale.code == trainer_start.EXIT_FENCED and "fenced" in old_log, old_log[-2000:]
    assert stopped - thawed < 120, "a fenced trainer leaves at once (no wait for its refused push)"
    assert current.code == 0, specs[1]["trainer-0"].log.read_text()[-2000:]
    # the push: refused before its broadcast, never loaded; nothing of epoch 1 loaded after epoch 2 took over
    assert push.refused == 1 and push.highest == 2
    first_new = next(i for i, (e, _) in enumerate(loaded) if e == 2)
    assert all(e == 2 for e, _ in loaded[first_new:]) and (1, 3) not in loaded
    # the commit: refused and recorded once; every step committed once, 1-2 by epoch 1, 3-7 by epoch 2
    assert fence.count(run.checkpoints) == 1
    assert sorted(f.name for f in (run.checkpoints / fence.DIR).iterdir() if f.name.startswith("fenced-")) == [
        "fenced-e000000001-step000000003"]
    visible = [(checkpoint.step_of(d), fence.epoch_of(d)) for d in checkpoint._complete_dirs(run.checkpoints)]
    assert visible == [(1, 1), (2, 1), (3, 2), (4, 2), (5, 2), (6, 2), (7, 2)]
    # the replacement's records: steps 3..7 once, its epoch, and both refusals reported (and so summarised)
    records = summary.by_step(summary.read_records(second / "metrics.jsonl"))
    assert [r.step for r in records] == [3, 4, 5, 6, 7] and {r.trainer_epoch for r in records} == {2}
    last: progress.StepRecord = records[-1]
    assert (last.fenced_checkpoints, last.fenced_pushes) == (1, 1)
    assert launcher_main.fenced_writes(run, records) == {"checkpoints": 1, "pushes": 1}
