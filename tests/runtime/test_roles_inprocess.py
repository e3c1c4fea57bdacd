"""The three role loops running together in one process over the in-process (``mem://``) transport.

Real parts: the tiny built-in model, the real ``Trainer`` (GRPO step, checkpoints), the real verifiers, the real
wire encoding. In-process parts (the injection points of the loops): the transport, a small HF sampler standing
in for the vLLM engine (same Protocol: completions with behaviour logprobs) and a weight loader that copies the
learner's tensors (the vLLM broadcast path is covered by the multi-process tests in test_launcher.py).
"""
from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

from kubeforge.api import load, progress, rljob
from kubeforge.runtime import metrics, models, observe, tasks, transport, types, verifiers, wire
from kubeforge.runtime.generator import join as generator_join
from kubeforge.runtime.generator import loop as generator_role
from kubeforge.runtime.trainer import loop as trainer_role
from kubeforge.runtime.trainer import report
from kubeforge.runtime.verifier import loop as verifier_role
from kubeforge.runtime.learner import step

_ids = itertools.count()
# transformers' from_pretrained swaps process-wide torch state while it loads (parameter creation on the meta device,
# no-op initialisers): two loads at once (generator threads starting together) leave it swapped for the rest of the
# process (later models come back untied, their lm_head on meta). One load at a time.
_loading = threading.Lock()

MANIFEST = {
    "apiVersion": "kubeforge.dev/v1alpha1", "kind": "RLJob", "metadata": {"name": "inproc"},
    "spec": {
        "model": {"builtin": "tiny"},
        "task": {"copy": {"length": 1, "alphabet": "ab"}, "seed": 0},
        "verifiers": [{"name": "answer", "type": "ExactAnswer"},
                      {"name": "format", "type": "Regex", "regex": {"pattern": "^[ab]"}, "weight": 0.5}],
        "algorithm": {"groupSize": 4, "promptsPerStep": 4, "steps": 3, "maxNewTokens": 2, "learningRate": 1e-3,
                      "maxPolicyLag": 1},
        "checkpoint": {"everySteps": 2},
    },
}


def job(*, sync_every: int = 1, **algorithm: object) -> rljob.RLJob:
    doc = json.loads(json.dumps(MANIFEST))
    doc["spec"]["algorithm"].update(algorithm)
    doc["spec"]["weightSync"] = {"everySteps": sync_every}
    return load.parse(doc)


class HFSampler:
    """Samples ``n`` completions per prompt from an HF model with their raw logprobs (the engine's contract)."""

    def __init__(self, *, path: Path, n: int, max_new: int) -> None:
        with _loading:
            self.tok = transformers.AutoTokenizer.from_pretrained(str(path))
            self.model = transformers.AutoModelForCausalLM.from_pretrained(str(path)).eval()
        self.n, self.max_new = n, max_new
        self.gen = torch.Generator().manual_seed(0)

    @torch.no_grad()
    def sample(self, prompts: Sequence[types.Prompt]) -> list[types.RolloutGroup]:
        out = []
        for p in prompts:
            ids = self.tok(p.text)["input_ids"]
            x = torch.tensor([ids] * self.n)
            lps = []
            for _ in range(self.max_new):
                logsm = torch.log_softmax(self.model(input_ids=x).logits[:, -1, :].float(), dim=-1)
                nxt = torch.multinomial(logsm.exp(), 1, generator=self.gen)
                lps.append(logsm.gather(-1, nxt).squeeze(-1))
                x = torch.cat([x, nxt], dim=1)
            comps = [types.Completion(token_ids=x[i, len(ids):].tolist(), logprobs=[float(lp[i]) for lp in lps],
                                      text=self.tok.decode(x[i, len(ids):])) for i in range(self.n)]
            out.append(types.RolloutGroup(prompt=p, prompt_token_ids=ids, completions=comps, policy_version=0))
        return out


class CopyWeights:
    """In-process weight loader: copies the learner's current tensors into the sampler's model."""

    def __init__(self, sampler: HFSampler) -> None:
        self.sampler = sampler
        self.learner: step.Trainer | None = None
        self.versions: list[int] = []

    def load(self, sync: wire.Sync) -> generator_role.SyncResult:
        assert self.learner is not None
        state = dict(self.learner.named_tensors())
        self.sampler.model.load_state_dict(state, strict=False)
        self.versions.append(sync.version)
        return generator_role.SyncResult(seconds=0.0, bytes=sum(t.numel() * t.element_size() for t in state.values()))


class InProcessPusher:
    """Rank 0's push in one process: SYNC notices through the transport, ACKs awaited on the control inbox."""

    def __init__(self, generators: transport.Sender, control: transport.Receiver) -> None:
        self.generators, self.control = generators, control

    def push(self, *, version: int, step: int) -> generator_role.SyncResult:
        for g in range(self.generators.peers):
            self.generators.send(wire.Sync(version=version, step=step, host="mem", port=1, world_size=2), to=g)
        acked: set[int] = set()
        while len(acked) < self.generators.peers:
            msg = self.control.recv(timeout=30)
            assert msg is not None, "no ACK from the generator"
            if isinstance(msg, wire.Ack) and msg.version == version:
                acked.add(msg.index)
        return generator_role.SyncResult(seconds=0.01, bytes=1)


def run_job(spec_job: rljob.RLJob, tmp: Path, *, inject: Sequence[bytes] = (),
            evaluate: trainer_role.Evaluate | None = None, eval_every: int = 0,
            colocated: bool = False, pusher: Callable[..., Any] | None = None,
            log: list[tuple[str, int]] | None = None) -> dict[str, object]:
    """Run generator, verifier and trainer loops to completion; returns observations."""
    n = next(_ids)
    a = {k: f"mem://t{n}-{k}" for k in ("gen", "ver", "trn", "ctl")}
    spec = spec_job.spec
    path = models.resolve(spec.model)
    m = {r: metrics.Metrics(role=r, replica=0) for r in ("generator", "verifier", "trainer")}
    gen_in = transport.open_receiver(a["gen"], on_drop=m["generator"].drop_hook())
    ver_in = transport.open_receiver(a["ver"], on_drop=m["verifier"].drop_hook())
    trn_in = transport.open_receiver(a["trn"], on_drop=m["trainer"].drop_hook(), hwm=256)
    ctl_in = transport.open_receiver(a["ctl"], on_drop=m["trainer"].drop_hook())
    sampler = HFSampler(path=path, n=spec.algorithm.group_size, max_new=spec.algorithm.max_new_tokens)
    weights = CopyWeights(sampler)
    stop = threading.Event()
    scorer = verifiers.Scorer(spec.verifiers)

    def generator() -> None:
        generator_role.run(index=0, inbox=gen_in, verifiers=transport.open_sender([a["ver"]], role="generator", index=0),
                           control=transport.open_sender([a["ctl"]], role="generator", index=0), sampler=sampler,
                           weights=weights, observer=observe.GeneratorObserver(m["generator"]),
                           should_stop=stop.is_set)

    def verifier() -> None:
        verifier_role.run(inbox=ver_in, trainers=transport.open_sender([a["trn"]], role="verifier", index=0),
                          score=scorer.apply, observer=observe.VerifierObserver(m["verifier"], scorer.errors),
                          should_stop=stop.is_set)

    threads = [threading.Thread(target=f, daemon=True) for f in (generator, verifier)]
    for t in threads:
        t.start()
    raw = transport.open_sender([a["gen"], a["ver"], a["trn"], a["ctl"]], role="fuzz", index=0)
    for frame in inject:                      # malformed frames into every receiver of every role
        for i in range(4):
            raw.send_frame(frame, to=i)       # type: ignore[attr-defined]
    learner = step.Trainer(model_path=path, algorithm=spec.algorithm)
    weights.learner = learner
    if log is not None:   # record when each step trains (the overlap test orders it against the pushes)
        train = learner.train_step

        def logged_train(**kw: Any) -> Any:
            log.append(("train", learner.step + 1))
            return train(**kw)
        learner.train_step = logged_train  # type: ignore[method-assign]
    to_gen = transport.open_sender([a["gen"]], role="trainer", index=0)
    records = tmp / "metrics.jsonl"
    loop = trainer_role.Loop(
        settings=trainer_role.Settings(rank=0, world=1, steps=spec.algorithm.steps,
                                       prompts_per_step=spec.algorithm.prompts_per_step,
                                       max_policy_lag=spec.algorithm.max_policy_lag,
                                       sync_every=spec.weight_sync.every_steps,
                                       checkpoint_every=spec.checkpoint.every_steps, checkpoint_dir=str(tmp / "ckpt"),
                                       checkpoint_keep=2, colocated=colocated),
        inbox=trn_in, generators=to_gen, learner=learner, prompt_at=tasks.stream(spec.task).prompt_at,
        observer=observe.TrainerObserver(m["trainer"]),
        rank0=trainer_role.Rank0(control=ctl_in, pusher=(pusher or InProcessPusher)(to_gen, ctl_in),
                                 reporter=report.JsonlReporter(path=records, echo=False),
                                 evaluate=evaluate, eval_every=eval_every))
    loop.run()
    for t in threads:
        t.join(timeout=30)
        assert not t.is_alive(), "a role loop did not stop on STOP"
    stop.set()
    for r in (gen_in, ver_in, trn_in, ctl_in):
        r.close()
    return {"records": [json.loads(x) for x in records.read_text().splitlines()], "versions": weights.versions,
            "dropped": {"gen": dict(gen_in.dropped), "ver": dict(ver_in.dropped), "trn": dict(trn_in.dropped),
                        "ctl": dict(ctl_in.dropped)},
            "learner": learner, "buffer": loop.buffer, "metrics": m}


def test_three_loops_train_sync_checkpoint_and_resume(tmp_path: Path) -> None:
    out = run_job(job(steps=3), tmp_path)
    records = out["records"]
    assert [r["step"] for r in records] == [1, 2, 3]
    assert [r["policy_version"] for r in records] == [1, 2, 3]
    assert all(r["completions"] == 16 for r in records)
    assert out["versions"] == [1, 2]                 # a push after each step but the last
    assert all(r["weight_sync_seconds"] is not None for r in records[:2])
    assert sum(out["buffer"].lag_counts.values()) == 12 and max(out["buffer"].lag_counts) <= 1
    ckpts = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert ckpts == ["export-step-000000003", "step-000000002", "step-000000003"]   # + the HF export at the end
    # resume: the same job with 5 steps continues at step 4 with contiguous records, after pushing v3 first
    out2 = run_job(job(steps=5), tmp_path)
    assert [r["step"] for r in out2["records"]] == [1, 2, 3, 4, 5]
    assert out2["versions"][0] == 3
    assert out2["learner"].policy_version == 5
    assert b"kubeforge_step" in out2["metrics"]["trainer"].render()


def test_receivers_of_every_role_survive_malformed_frames(tmp_path: Path) -> None:
    good_other = wire.encode(wire.Ready(role="x", index=0))        # valid but unexpected everywhere but control
    junk = [b"\x00" * 3, b"GET / HTTP/1.1\r\n\r\n", wire.MAGIC + b"\x02\x00\x10garbage",
            wire.encode(wire.Stop())[:7] + b"\xc1\xc1", bytes(range(256)), good_other]
    out = run_job(job(steps=2), tmp_path, inject=junk)
    assert [r["step"] for r in out["records"]] == [1, 2]
    for name, dropped in out["dropped"].items():
        assert sum(dropped.values()) == len(junk) - 1, (name, dropped)   # all but the valid READY
    rendered = out["metrics"]["verifier"].render().decode()
    assert 'reason="malformed"' in rendered


@pytest.mark.parametrize("lag,every", [(0, 1), (2, 1), (1, 2)])
def test_window_never_lets_a_group_go_stale(tmp_path: Path, lag: int, every: int) -> None:
    spec = job(steps=4, maxPolicyLag=lag, sync_every=every)
    out = run_job(spec, tmp_path)
    assert [r["step"] for r in out["records"]] == [1, 2, 3, 4]
    assert out["buffer"].drops.get("stale", 0) == 0
    assert max(out["buffer"].lag_counts) <= lag


def test_colocated_hands_out_a_step_only_after_the_last_is_trained_and_pushed(tmp_path: Path) -> None:
    """spec.schedule Colocated: work of step s leaves after step s-1's push, so every group is sampled by the
    current policy (lag 0) although maxPolicyLag 1 would allow sampling ahead (which the generator, faster than
    the trainer here, does in the overlapped schedule: see the lag-1 groups below)."""
    out = run_job(job(steps=4, maxPolicyLag=1), tmp_path / "colocated", colocated=True)
    assert [r["step"] for r in out["records"]] == [1, 2, 3, 4]
    assert out["versions"] == [1, 2, 3]
    assert dict(out["buffer"].lag_counts) == {0: 16}
    overlapped = run_job(job(steps=4, maxPolicyLag=1), tmp_path / "overlapped")
    assert overlapped["buffer"].lag_counts.get(1, 0) > 0


class OverlapPusher(InProcessPusher):
    """The ``start``/``finish`` protocol of ``trainer.pusher.Pusher``: SYNC notices at ``start``, the push completes in
    the background (here: once every generator ACKed; ACKs the trainer's loop reads arrive through ``acked``), and
    ``finish`` joins it. Logs the order of starts and finishes."""

    def __init__(self, generators: transport.Sender, control: transport.Receiver, log: list[tuple[str, int]]) -> None:
        super().__init__(generators, control)
        self.log = log
        self.flight: int | None = None
        self.acks: set[int] = set()

    @property
    def in_flight(self) -> bool:
        return self.flight is not None

    def start(self, *, version: int, step: int) -> None:
        assert self.flight is None, "a push started while another was in flight"
        self.log.append(("start", version))
        for g in range(self.generators.peers):
            self.generators.send(wire.Sync(version=version, step=step, host="mem", port=1, world_size=2), to=g)
        self.flight, self.acks = version, set()

    def acked(self, msg: wire.Ack) -> None:
        if msg.version == self.flight:
            self.acks.add(msg.index)

    def finish(self) -> generator_role.SyncResult | None:
        version, self.flight = self.flight, None
        while len(self.acks) < self.generators.peers:
            msg = self.control.recv(timeout=30)
            assert msg is not None, "no ACK from the generator"
            if isinstance(msg, wire.Ack) and msg.of == wire.Kind.SYNC and msg.version == version:
                self.acks.add(msg.index)
        self.log.append(("finish", int(version or 0)))
        return generator_role.SyncResult(seconds=0.02, bytes=1)

    def push(self, *, version: int, step: int) -> generator_role.SyncResult:
        self.start(version=version, step=step)
        result = self.finish()
        assert result is not None
        return result

    def reform(self, *, members: int | None = None, left_out: frozenset[int] = frozenset()) -> int:
        return 0


def test_an_overlapped_push_runs_while_the_next_step_trains_and_keeps_versions_in_order(tmp_path: Path) -> None:
    """With a pusher that can ``start``, the trainer starts the push of v after step v and trains step v+1 before
    joining it; pushes never overlap each other, the generator loads versions in order, nothing goes stale, and
    each record carries the figures of the push that completed during its step."""
    log: list[tuple[str, int]] = []
    out = run_job(job(steps=4, maxPolicyLag=1), tmp_path, pusher=lambda g, c: OverlapPusher(g, c, log), log=log)
    assert [r["step"] for r in out["records"]] == [1, 2, 3, 4]
    assert out["versions"] == [1, 2, 3]
    assert out["buffer"].drops.get("stale", 0) == 0 and max(out["buffer"].lag_counts) <= 1
    assert log == [("train", 1), ("start", 1), ("train", 2), ("finish", 1), ("start", 2), ("train", 3),
                   ("finish", 2), ("start", 3), ("train", 4), ("finish", 3)]
    assert [r["weight_sync_seconds"] for r in out["records"]] == [None, 0.02, 0.02, None]


def test_split_and_share_are_exact() -> None:
    prompts = [types.Prompt(index=i, text="", answer="") for i in range(5)]
    parts = trainer_role.split(prompts, 3)
    assert [len(p) for p in parts] == [1, 2, 2] and sum(parts, []) == prompts
    s = trainer_role.Settings(rank=1, world=3, steps=1, prompts_per_step=7, max_policy_lag=0, sync_every=1,
                              checkpoint_every=1, checkpoint_dir="", checkpoint_keep=1)
    assert trainer_role.my_share(step=2, settings=s) == sum(1 for k in range(14, 21) if k % 3 == 1)


def test_jsonl_reporter_rewrites_to_the_resumed_step(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    rep = report.JsonlReporter(path=path, echo=False)
    rep.resumed(step=0)
    for s in range(1, 6):
        rep.step(progress.StepRecord(**{"step": s, "mean_reward": 0.1 * s, "policy_version": s}))
    with path.open("a") as f:
        f.write('{"step": 6, "mean_rew')                      # a torn line from a killed writer
    rep.resumed(step=3)
    assert [json.loads(x)["step"] for x in path.read_text().splitlines()] == [1, 2, 3]


def test_pod_annotation_reporter_patches_its_pod() -> None:
    class Api:          # a podapi.Pod
        def __init__(self) -> None:
            self.calls: list[dict[str, str]] = []

        def annotations(self) -> dict[str, str]:
            return {}

        def patch_annotations(self, annotations: Mapping[str, str]) -> None:
            self.calls.append(dict(annotations))

    api = Api()
    rep = report.PodAnnotationReporter(pod="tiny-trainer-0", namespace="ns", api=api)
    rep.step(progress.StepRecord(**{"step": 4, "mean_reward": 0.5, "policy_version": 4}))
    rep.done(progress.StepRecord(**{"step": 5, "policy_version": 5}))
    from kubeforge.api import contract
    assert all(set(c) == {contract.ANNOTATION_PROGRESS} for c in api.calls)
    values = [json.loads(c[contract.ANNOTATION_PROGRESS]) for c in api.calls]
    assert values == [{"step": 4, "meanReward": 0.5, "policyVersion": 4, "logprobMismatchKl": None, "done": False},
                      {"step": 5, "meanReward": None, "policyVersion": 5, "logprobMismatchKl": None, "done": True}]


def test_pod_annotation_done_keeps_the_last_steps_reward() -> None:
    """The trainer's done record has no reward: the final annotation (hence status.progress) keeps step N's."""
    calls: list[dict[str, str]] = []

    class Api:          # a podapi.Pod
        def annotations(self) -> dict[str, str]:
            return {}

        def patch_annotations(self, annotations: Mapping[str, str]) -> None:
            calls.append(dict(annotations))

    rep = report.PodAnnotationReporter(pod="tiny-trainer-0", namespace="ns", api=Api())
    rep.step(progress.StepRecord(**{"step": 40, "mean_reward": 0.75, "policy_version": 40,
                                    "logprob_mismatch_kl": 1e-5}))
    rep.done(progress.StepRecord(**{"step": 40, "policy_version": 40}))
    from kubeforge.api import contract
    last = json.loads(calls[-1][contract.ANNOTATION_PROGRESS])
    assert last == {"step": 40, "meanReward": 0.75, "policyVersion": 40, "logprobMismatchKl": 1e-5, "done": True}


def test_verifier_stops_on_sigterm_while_its_send_to_a_dead_trainer_blocks() -> None:
    """In a pod, SIGTERM (``should_stop``) must end the verifier even when the trainer it sends to is gone."""
    stop = threading.Event()

    class DeadTrainer:
        peers = 1
        tries = 0

        def send_frame(self, frame: bytes, *, to: int | None = None, timeout: float | None = None) -> None:
            assert timeout is not None, "a send without timeout would block forever"
            self.tries += 1
            if self.tries == 2:
                stop.set()                                  # SIGTERM arrives while the send is blocked
            raise transport.TransportTimeout("no peer")

    class Inbox:
        pending = 0

        def recv(self, timeout: float | None = None) -> wire.Message | None:
            prompt = types.Prompt(index=3, text="copy: a", answer="a")
            comp = types.Completion(token_ids=[5], logprobs=[-0.5], text="a", finish_reason="stop")
            return wire.Rollout(group=types.RolloutGroup(prompt=prompt, prompt_token_ids=[1], completions=[comp],
                                                         policy_version=0, rewards=[1.0]))

    class Observer:
        def scored(self, **_: object) -> None: ...
        def unexpected(self, **_: object) -> None: ...
        def failed(self, **_: object) -> None: ...

    dead = DeadTrainer()
    done = threading.Event()
    t = threading.Thread(target=lambda: (verifier_role.run(inbox=Inbox(), trainers=dead, score=lambda g: g,  # type: ignore[arg-type]
                                                           observer=Observer(), should_stop=stop.is_set), done.set()))
    t.start()
    t.join(10)
    assert done.is_set() and dead.tries == 2


class DropFirstScored:
    """A trainer inbox that loses the first SCORED frame on purpose (as a frame dies with a killed verifier)."""

    def __init__(self, inner: transport.Receiver) -> None:
        self.inner, self.lost = inner, 0

    def recv(self, timeout: float | None = None) -> wire.Message | None:
        msg = self.inner.recv(timeout=timeout)
        if isinstance(msg, wire.Scored) and not self.lost:
            self.lost = 1
            return None
        return msg

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


def _loop(tmp: Path, spec_job: rljob.RLJob, inbox: transport.Receiver, *, deadline: float, reissue_after: float,
          generators: transport.Sender, control: transport.Receiver, checkpoint_every: int = 10) -> trainer_role.Loop:
    spec = spec_job.spec
    learner = step.Trainer(model_path=models.resolve(spec.model), algorithm=spec.algorithm)
    return trainer_role.Loop(
        settings=trainer_role.Settings(rank=0, world=1, steps=spec.algorithm.steps,
                                       prompts_per_step=spec.algorithm.prompts_per_step,
                                       max_policy_lag=spec.algorithm.max_policy_lag, sync_every=1,
                                       checkpoint_every=checkpoint_every, checkpoint_dir=str(tmp / "ckpt"),
                                       checkpoint_keep=1,
                                       deadline=deadline, reissue_after=reissue_after),
        inbox=inbox, generators=generators, learner=learner, prompt_at=tasks.stream(spec.task).prompt_at,
        observer=observe.TrainerObserver(metrics.Metrics(role="trainer", replica=0)),
        rank0=trainer_role.Rank0(control=control, pusher=InProcessPusher(generators, control),
                                 reporter=report.JsonlReporter(path=tmp / "m.jsonl", echo=False)))


def _serve(spec_job: rljob.RLJob, name: str, weights: list[CopyWeights] | None = None
           ) -> tuple[dict[str, str], threading.Event, list[transport.Receiver]]:
    """A generator and a verifier loop serving in threads; the trainer's inboxes to hand to a Loop."""
    a = {k: f"mem://{name}-{k}" for k in ("gen", "ver", "trn", "ctl")}
    gen_in, ver_in = transport.open_receiver(a["gen"]), transport.open_receiver(a["ver"])
    trn_in, ctl_in = transport.open_receiver(a["trn"], hwm=256), transport.open_receiver(a["ctl"])
    sampler = HFSampler(path=models.resolve(spec_job.spec.model), n=spec_job.spec.algorithm.group_size,
                        max_new=spec_job.spec.algorithm.max_new_tokens)
    stop = threading.Event()
    scorer = verifiers.Scorer(spec_job.spec.verifiers)
    m = metrics.Metrics(role="x", replica=0)
    loader = CopyWeights(sampler)
    if weights is not None:
        weights.append(loader)
    threads = [
        threading.Thread(target=lambda: generator_role.run(
            index=0, inbox=gen_in, verifiers=transport.open_sender([a["ver"]], role="generator", index=0),
            control=transport.open_sender([a["ctl"]], role="generator", index=0), sampler=sampler,
            weights=loader, observer=observe.GeneratorObserver(m), should_stop=stop.is_set),
            daemon=True),
        threading.Thread(target=lambda: verifier_role.run(
            inbox=ver_in, trainers=transport.open_sender([a["trn"]], role="verifier", index=0), score=scorer.apply,
            observer=observe.VerifierObserver(m, scorer.errors), should_stop=stop.is_set), daemon=True)]
    for t in threads:
        t.start()
    return a, stop, [gen_in, ver_in, trn_in, ctl_in]


def test_sigterm_stops_the_trainer_after_a_complete_checkpoint(tmp_path: Path) -> None:
    """SIGTERM (``should_stop``) during step 2 of 3: the step and its due checkpoint finish, then ``Terminated``;
    the newest checkpoint is complete and a resume continues at step 3."""
    spec_job = job(steps=3)
    n = next(_ids)
    loaders: list[CopyWeights] = []
    a, stop, recv = _serve(spec_job, f"term{n}", loaders)
    loop = _loop(tmp_path, spec_job, recv[2], deadline=60, reissue_after=30,
                 generators=transport.open_sender([a["gen"]], role="trainer", index=0), control=recv[3],
                 checkpoint_every=2)
    loaders[0].learner = loop.learner  # type: ignore[assignment]
    term = threading.Event()
    train = loop.learner.train_step

    def train_and_get_sigterm(**kw: object) -> object:
        if loop.learner.step == 1:
            term.set()                                               # SIGTERM arrives during step 2
        return train(**kw)  # type: ignore[arg-type]

    loop.learner.train_step = train_and_get_sigterm  # type: ignore[method-assign]
    loop.should_stop = term.is_set
    with pytest.raises(trainer_role.Terminated, match="after step 2"):
        loop.run()
    stop.set()
    ckpts = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert ckpts == ["step-000000002"] and (tmp_path / "ckpt" / ckpts[0] / "COMPLETE").exists()
    for r in recv:
        r.close()


class StopInbox:
    """The trainer's inbox; sets ``term`` (SIGTERM) at the first receive while the learner has ``at`` steps done:
    the stop arrives while the trainer collects step ``at + 1``."""

    def __init__(self, inner: transport.Receiver, term: threading.Event, at: int) -> None:
        self.inner, self.term, self.at, self.learner = inner, term, at, None

    def recv(self, timeout: float | None = None) -> wire.Message | None:
        if self.learner is not None and self.learner.step == self.at:
            self.term.set()
        return self.inner.recv(timeout=timeout)

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


def _stop_run(tmp: Path, spec_job: rljob.RLJob, *, stop_when: str | None, trained: list[int],
              pushed: list[int] | None = None) -> str | None:
    """One attempt of ``spec_job`` in ``tmp`` (resuming from its checkpoints); ``stop_when``: SIGTERM arrives
    while step 3 is trained ("training") or collected ("collecting"), or never (None). Appends the learner's
    step before every ``train_step`` to ``trained``; returns the ``Terminated`` message, None on a full run."""
    n = next(_ids)
    loaders: list[CopyWeights] = []
    a, stop, recv = _serve(spec_job, f"stop{n}", loaders)
    term = threading.Event()
    inbox = StopInbox(recv[2], term, at=2 if stop_when == "collecting" else -1)
    loop = _loop(tmp, spec_job, inbox, deadline=60, reissue_after=30,  # type: ignore[arg-type]
                 generators=transport.open_sender([a["gen"]], role="trainer", index=0), control=recv[3],
                 checkpoint_every=100)
    loaders[0].learner = loop.learner  # type: ignore[assignment]
    inbox.learner = loop.learner  # type: ignore[assignment]
    train = loop.learner.train_step

    def counted(**kw: object) -> object:
        trained.append(loop.learner.step)
        if stop_when == "training" and loop.learner.step == 2:
            term.set()                                               # SIGTERM arrives during step 3
        return train(**kw)  # type: ignore[arg-type]

    loop.learner.train_step = counted  # type: ignore[method-assign]
    loop.should_stop = term.is_set
    if pushed is not None and loop.rank0 is not None:
        push = loop.rank0.pusher.push

        def recorded(**kw: Any) -> Any:
            pushed.append(int(kw["step"]))
            return push(**kw)

        loop.rank0.pusher.push = recorded  # type: ignore[method-assign]
    try:
        loop.run()
        return None
    except trainer_role.Terminated as exc:
        return str(exc)
    finally:
        stop.set()
        for r in recv:
            r.close()


@pytest.mark.parametrize("when", ["training", "collecting"])
def test_sigterm_writes_a_stop_checkpoint_and_the_resume_repeats_and_loses_no_step(tmp_path: Path,
                                                                                   when: str) -> None:
    """Eviction/preemption (the pod deleted: SIGTERM) with no periodic checkpoint due: the trainer finishes the
    step it trains (or abandons the one it collects), writes a stop checkpoint of the trained steps, and the next
    attempt resumes there: every step trained exactly once, the records contiguous."""
    spec_job = job(steps=5)
    trained: list[int] = []
    pushed: list[int] = []
    stopped = _stop_run(tmp_path, spec_job, stop_when=when, trained=trained, pushed=pushed)
    done = 3 if when == "training" else 2
    # the policies of steps 1 and 2 went out; the stop agreed after step 3 skips its push (the generators stop too:
    # a push to a peer gone would wait out its send timeout within the stop checkpoint's bound)
    assert pushed == [1, 2], pushed
    assert stopped is not None and f"stop checkpoint of step {done} written" in stopped, stopped
    assert stopped.startswith("SIGTERM after step 3" if when == "training" else "SIGTERM while collecting step 2")
    ckpts = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert ckpts == [f"step-00000000{done}"] and (tmp_path / "ckpt" / ckpts[0] / "COMPLETE").exists()
    assert trained == list(range(done))                       # the abandoned step was never trained
    assert _stop_run(tmp_path, spec_job, stop_when=None, trained=trained) is None
    assert trained == [0, 1, 2, 3, 4]                          # each step trained once, none repeated or lost
    records = [progress.StepRecord.decode(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert [r.step for r in records if r is not None] == [1, 2, 3, 4, 5]


def test_a_stop_checkpoint_that_would_overrun_its_bound_is_skipped(tmp_path: Path) -> None:
    """SIGTERM long ago (beyond ``stop_within``): no stop checkpoint is started (the kubelet would kill it half
    way); the trainer still stops, and the resume starts from the last complete checkpoint (here: none)."""
    spec_job = job(steps=5)
    n = next(_ids)
    loaders: list[CopyWeights] = []
    a, stop, recv = _serve(spec_job, f"late{n}", loaders)
    loop = _loop(tmp_path, spec_job, recv[2], deadline=60, reissue_after=30,
                 generators=transport.open_sender([a["gen"]], role="trainer", index=0), control=recv[3],
                 checkpoint_every=100)
    loaders[0].learner = loop.learner  # type: ignore[assignment]
    import time as _time
    loop.stopped_at = lambda: _time.monotonic() - 1000.0
    loop.should_stop = lambda: loop.learner.step >= 1
    try:
        with pytest.raises(trainer_role.Terminated, match="no stop checkpoint: SIGTERM 1000"):
            loop.run()
    finally:
        stop.set()
        for r in recv:
            r.close()
    assert not (tmp_path / "ckpt").exists() or not any((tmp_path / "ckpt").iterdir())


def test_a_lost_frame_is_reissued_and_a_step_that_never_completes_stalls_within_the_deadline(tmp_path: Path) -> None:
    """Drop a SCORED frame on purpose: the trainer re-issues the missing prompt after ``reissue_after`` and the
    step completes (nothing lost). With nobody serving the work at all, the trainer raises ``Stalled`` within the
    deadline (its process exits non-zero and the failure policy restarts it) instead of waiting forever."""
    import time as _time

    spec_job = job(steps=1)
    n = next(_ids)
    a, stop, (gen_in, ver_in, trn_in, ctl_in) = _serve(spec_job, f"drop{n}")
    inbox = DropFirstScored(trn_in)
    loop = _loop(tmp_path, spec_job, inbox, deadline=60, reissue_after=1.0,  # type: ignore[arg-type]
                 generators=transport.open_sender([a["gen"]], role="trainer", index=0), control=ctl_in)
    loop.run()
    stop.set()
    assert inbox.lost == 1 and loop.reissued >= 1 and loop.learner.step == 1
    assert [json.loads(x)["step"] for x in (tmp_path / "m.jsonl").read_text().splitlines()] == [1]

    # nobody serves: READY arrives, then no group ever does
    b = {k: f"mem://dead{n}-{k}" for k in ("gen", "trn", "ctl")}
    dead_gen, trn2, ctl2 = (transport.open_receiver(b[k]) for k in ("gen", "trn", "ctl"))
    transport.open_sender([b["ctl"]], role="generator", index=0).send(wire.Ready(role="generator", index=0))
    loop2 = _loop(tmp_path / "2", spec_job, trn2, deadline=3.0, reissue_after=1.0,
                  generators=transport.open_sender([b["gen"]], role="trainer", index=0), control=ctl2)
    started = _time.monotonic()
    with pytest.raises(trainer_role.Stalled, match="progressDeadlineSeconds"):
        loop2.run()
    assert 3.0 <= _time.monotonic() - started < 10.0 and loop2.reissued >= 4
    for r in (gen_in, ver_in, trn_in, ctl_in, dead_gen, trn2, ctl2):
        r.close()


class ElasticPusher(InProcessPusher):
    """``InProcessPusher`` over the generators in the group now (``reform(members=...)`` changes it)."""

    ack_timeout = 5.0

    def __init__(self, generators: transport.Sender, control: transport.Receiver) -> None:
        super().__init__(generators, control)
        self.members, self.epoch, self.pushes, self.failed = generators.peers, 0, [], 0
        self.pushed_to: list[tuple[int, tuple[int, ...]]] = []     # (version, the generators it went to)
        self.on_other: Any = lambda msg: None
        self.gone: Any = lambda generators: set()     # as sync.Pusher: the membership's liveness

    def reform(self, *, members: int | None = None, left_out: frozenset[int] = frozenset()) -> int:
        self.members = members or self.members
        self.left_out = left_out
        self.epoch += 1
        return self.epoch

    left_out: frozenset[int] = frozenset()

    def push(self, *, version: int, step: int) -> generator_role.SyncResult:
        targets = [g for g in range(self.members) if g not in self.left_out]
        try:                         # bounded, as sync.Pusher: a generator gone fails the push
            for g in targets:
                self.generators.send(wire.Sync(version=version, step=step, host="mem", port=1, world_size=2,
                                               epoch=self.epoch), to=g, timeout=5)
        except transport.TransportError:
            self.failed += 1
            raise
        acked: set[int] = set()
        deadline = time.monotonic() + self.ack_timeout    # each ACK bounded (other messages keep coming: beats)
        while len(acked) < len(targets):
            msg = self.control.recv(timeout=0)      # as sync.Pusher: what waits is read before silence is judged
            if msg is None and self.gone(set(targets) - acked):   # ... and a silent generator's ACK not awaited
                self.failed += 1
                raise RuntimeError(f"generators {self.gone(set(targets) - acked)} silent")
            if msg is None:
                msg = self.control.recv(timeout=min(0.5, max(0.0, deadline - time.monotonic())))
            if msg is None and time.monotonic() < deadline:
                continue
            if msg is None:          # as the broadcast fails when a member is gone: the trainer re-forms
                self.failed += 1
                raise RuntimeError(f"no ACK from generators {set(targets) - acked}")
            if isinstance(msg, wire.Ack) and msg.of == wire.Kind.SYNC and msg.version == version:
                acked.add(msg.index)
                deadline = time.monotonic() + self.ack_timeout
            else:
                self.on_other(msg)
        self.pushes.append((version, self.members))
        self.pushed_to.append((version, tuple(targets)))
        return generator_role.SyncResult(seconds=0.01, bytes=1)


def _elastic_loop(tmp: Path, spec_job: rljob.RLJob, learner: step.Trainer, *, inbox: transport.Receiver,
                  generators: transport.Sender, control: transport.Receiver, pusher: ElasticPusher,
                  generator_address: Callable[[int], str | None] = lambda i: None, **settings: Any
                  ) -> trainer_role.Loop:
    """Trainer rank 0 alone over in-process generators (``settings`` override the Settings below)."""
    return trainer_role.Loop(
        settings=trainer_role.Settings(**{
            "rank": 0, "world": 1, "steps": spec_job.spec.algorithm.steps, "prompts_per_step": 4,
            "max_policy_lag": 1, "sync_every": 1, "checkpoint_every": 10, "checkpoint_dir": str(tmp / "ckpt"),
            "checkpoint_keep": 1, **settings}),
        inbox=inbox, generators=generators, learner=learner, prompt_at=tasks.stream(spec_job.spec.task).prompt_at,
        observer=observe.TrainerObserver(metrics.Metrics(role="trainer", replica=0)),
        rank0=trainer_role.Rank0(control=control, pusher=pusher,
                                 reporter=report.JsonlReporter(path=tmp / "m.jsonl", echo=False)),
        generator_address=generator_address)


def test_generators_join_and_leave_while_the_trainer_runs(tmp_path: Path) -> None:
    """Generators 1 -> 2 -> 1 during a run: the joiner gets the current policy before it samples anything, the
    leaver's work goes to the other, every step is trained once with its full share, the trainer never restarts."""
    spec_job = job(steps=6)
    n = next(_ids)
    base = f"mem://elastic{n}"
    trn_in, ctl_in = transport.open_receiver(f"{base}-trn", hwm=256), transport.open_receiver(f"{base}-ctl")
    ver_in = transport.open_receiver(f"{base}-ver")
    scorer = verifiers.Scorer(spec_job.spec.verifiers)
    m = metrics.Metrics(role="x", replica=0)
    stop_all = threading.Event()
    events: list[tuple[int, str, int]] = []      # (generator, "sync"|"sample", version)

    class Logged(CopyWeights):
        def __init__(self, sampler: HFSampler, index: int) -> None:
            super().__init__(sampler)
            self.index = index

        def load(self, sync: wire.Sync) -> generator_role.SyncResult:
            events.append((self.index, "sync", sync.version))
            return super().load(sync)

    loaders: dict[int, Logged] = {}
    stops = {0: threading.Event(), 1: threading.Event()}

    def start_generator(i: int) -> threading.Thread:
        inbox = transport.open_receiver(f"{base}-gen{i}")
        sampler = HFSampler(path=models.resolve(spec_job.spec.model), n=4, max_new=2)
        sample = sampler.sample

        def logged_sample(prompts: Sequence[types.Prompt]) -> list[types.RolloutGroup]:
            events.append((i, "sample", len(prompts)))
            return sample(prompts)

        sampler.sample = logged_sample  # type: ignore[method-assign]
        loaders[i] = Logged(sampler, i)
        loaders[i].learner = learner_box[0]
        t = threading.Thread(target=lambda: generator_role.run(
            index=i, inbox=inbox, verifiers=transport.open_sender([f"{base}-ver"], role="generator", index=i),
            control=transport.open_sender([f"{base}-ctl"], role="generator", index=i), sampler=sampler,
            weights=loaders[i], observer=observe.GeneratorObserver(m), max_policy_lag=1,
            should_stop=lambda: stops[i].is_set() or stop_all.is_set()), daemon=True)
        t.start()
        return t

    learner = step.Trainer(model_path=models.resolve(spec_job.spec.model), algorithm=spec_job.spec.algorithm)
    learner_box = [learner]
    start_generator(0)
    to_gen = transport.open_sender([f"{base}-gen0"], role="trainer", index=0)
    pusher = ElasticPusher(to_gen, ctl_in)
    loop = _elastic_loop(tmp_path, spec_job, learner, inbox=trn_in, generators=to_gen, control=ctl_in, pusher=pusher,
                         generator_address=lambda i: f"{base}-gen{i}", deadline=60, reissue_after=20)
    threading.Thread(target=lambda: verifier_role.run(
        inbox=ver_in, trainers=transport.open_sender([f"{base}-trn"], role="verifier", index=0), score=scorer.apply,
        observer=observe.VerifierObserver(m, scorer.errors), should_stop=stop_all.is_set), daemon=True).start()
    train = learner.train_step
    members_seen: list[int] = []

    def train_and_scale(**kw: object) -> object:
        members_seen.append(loop.members)
        if learner.step == 1:
            start_generator(1)                        # scale up while step 2 trains
        if learner.step == 3:
            stops[1].set()                            # scale down while step 4 trains
        return train(**kw)  # type: ignore[arg-type]

    learner.train_step = train_and_scale  # type: ignore[method-assign]
    loop.run()
    stop_all.set()
    records = [json.loads(x) for x in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
    assert [r["policy_version"] for r in records] == [1, 2, 3, 4, 5, 6]
    assert all(r["completions"] == 16 for r in records)
    assert max(members_seen) == 2 and members_seen[-1] == 1 and loop.members == 1
    assert {mem for _, mem in pusher.pushes} == {1, 2}
    joined = [e for e in events if e[0] == 1]
    assert joined and joined[0][1] == "sync" and joined[0][2] >= 2      # the current policy before any sample
    assert any(e[1] == "sample" for e in joined)                        # and it did take work
    for r in (trn_in, ctl_in, ver_in):
        r.close()


@pytest.mark.parametrize("how", ["mid-receive", "notice-lost", "idle"])
def test_a_generator_scaled_down_leaves_without_stalling(tmp_path: Path, how: str) -> None:
    """Generators 2 -> 1, three ways seen in real pods. ``mid-receive``: generator 1 sits inside the receive of a
    sync when deleted (SIGKILLed after its grace period); its push fails, and the leave notice (sent by the signal
    watcher while the receive blocks) shrinks the group to generator 0. ``notice-lost``: the same without the notice:
    generator 1's silence after the failed push drops it within ``answer_within``. ``idle``: generator 1 stops
    between syncs, sends its notice and is gone (its inbox closed) before the next push: the notice is applied before
    any SYNC goes out, so no push fails (the real trainer used to block on the SYNC send to the vanished pod). Every
    way: a new epoch over generator 0, generator 1's work re-issued, every step trained once with its full share,
    no Stalled, no restart."""
    spec_job = job(steps=6)
    n = next(_ids)
    base = f"mem://shrink{n}"
    trn_in, ctl_in = transport.open_receiver(f"{base}-trn", hwm=256), transport.open_receiver(f"{base}-ctl")
    ver_in = transport.open_receiver(f"{base}-ver")
    scorer = verifiers.Scorer(spec_job.spec.verifiers)
    m = metrics.Metrics(role="x", replica=0)
    stop_all, stuck, release, stop1 = threading.Event(), threading.Event(), threading.Event(), threading.Event()
    learner = step.Trainer(model_path=models.resolve(spec_job.spec.model), algorithm=spec_job.spec.algorithm)
    leave1 = generator_role.LeaveNotice(index=1, open_control=lambda timeout: transport.open_sender(
        [f"{base}-ctl"], role="generator", index=1, ready_timeout=timeout))

    class StuckAt3(CopyWeights):
        """Generator 1's receive of v3 never ends: the broadcast waits on a peer being deleted."""

        def load(self, sync: wire.Sync) -> generator_role.SyncResult:
            if sync.version >= 3 and how != "idle":
                stuck.set()
                release.wait(120)
                raise RuntimeError("killed mid-receive")
            return super().load(sync)

    gen_threads, inboxes = [], []
    for i in (0, 1):
        sampler = HFSampler(path=models.resolve(spec_job.spec.model), n=4, max_new=2)
        loader = (StuckAt3 if i == 1 else CopyWeights)(sampler)
        loader.learner = learner
        inboxes.append(transport.open_receiver(f"{base}-gen{i}"))
        gen_threads.append(threading.Thread(target=generator_role.run, kwargs=dict(
            index=i, inbox=inboxes[i], verifiers=transport.open_sender([f"{base}-ver"], role="generator", index=i),
            control=transport.open_sender([f"{base}-ctl"], role="generator", index=i), sampler=sampler,
            weights=loader, observer=observe.GeneratorObserver(m), max_policy_lag=1,
            should_stop=(lambda i=i: stop_all.is_set() or (i == 1 and stop1.is_set())),
            leave=leave1 if i == 1 else None), daemon=True))
        gen_threads[-1].start()
    to_gen = transport.open_sender([f"{base}-gen0", f"{base}-gen1"], role="trainer", index=0)
    pusher = ElasticPusher(to_gen, ctl_in)
    loop = _elastic_loop(tmp_path, spec_job, learner, inbox=trn_in, generators=to_gen, control=ctl_in, pusher=pusher,
                         generator_address=lambda i: f"{base}-gen{i}", deadline=60, reissue_after=40,
                         answer_within=2.0)
    threading.Thread(target=verifier_role.run, kwargs=dict(
        inbox=ver_in, trainers=transport.open_sender([f"{base}-trn"], role="verifier", index=0), score=scorer.apply,
        observer=observe.VerifierObserver(m, scorer.errors), should_stop=stop_all.is_set), daemon=True).start()

    def sigterm_generator_1() -> None:      # as the signal watcher does while the loop's thread is blocked
        stuck.wait(60)
        if how == "mid-receive":
            assert leave1.send()

    threading.Thread(target=sigterm_generator_1, daemon=True).start()
    train = learner.train_step

    def train_and_scale_down(**kw: object) -> object:
        if how == "idle" and learner.step == 2:          # while step 3 trains: generator 1 stops and vanishes
            stop1.set()
            gen_threads[1].join(30)
            inboxes[1].close()
        return train(**kw)  # type: ignore[arg-type]

    learner.train_step = train_and_scale_down  # type: ignore[method-assign]
    loop.run()
    release.set()
    stop_all.set()
    records = [json.loads(x) for x in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
    assert all(r["completions"] == 16 for r in records)
    assert loop.members == 1 and loop.reissued == 0          # shrunk, not recovered by the stall timer
    assert (loop.left, loop.dropped) == ((set(), {1}) if how == "notice-lost" else ({1}, set()))
    assert pusher.pushes[-1][1] == 1 and (5, 1) in pusher.pushes   # the later pushes reach generator 0 alone
    # idle: the notice is applied before the next SYNC; mid-receive: the one push it was in fails; notice-lost: the
    # pushes within answer_within of the first failure fail too (one or two here)
    assert pusher.failed == {"idle": 0, "mid-receive": 1}[how] if how != "notice-lost" else 1 <= pusher.failed <= 3
    for r in (trn_in, ctl_in, ver_in):
        r.close()


def test_held_out_evaluation_before_every_n_steps_and_after_the_last(tmp_path: Path) -> None:
    calls: list[int] = []

    class Result:
        def __init__(self, accuracy: float) -> None:
            self.accuracy, self.seconds = accuracy, 0.5

    def evaluate() -> Result:
        calls.append(len(calls))
        return Result(0.1 * len(calls))

    out = run_job(job(steps=3), tmp_path, evaluate=evaluate, eval_every=2)
    recs = out["records"]
    assert len(calls) == 3                                   # before step 1, after step 2, after step 3 (last)
    assert recs[0]["eval_accuracy_base"] == pytest.approx(0.1)
    assert [r.get("evaluated", False) for r in recs] == [False, True, True]
    assert [r["eval_accuracy"] for r in recs] == pytest.approx([0.1, 0.2, 0.3])   # the latest, carried forward
    assert "eval_accuracy_base" not in recs[1]


def test_a_generator_restarting_in_place_is_not_a_stalled_step(tmp_path: Path) -> None:
    """Generator 0 dies mid-step (kill -9: no notice) and restarts in place; its engine load outlasts the progress
    deadline (here 3 s; minutes of vLLM start in real pods). While loading it tells trainer 0 it is starting
    (``StartBeats``), so the step's wait is bounded by the start deadline, not the progress deadline: no
    ``Stalled``, the generator's READY re-forms the group and every step is trained once. A start's beats count
    for at most ``start_deadline`` from its first beat (a start that never ends is a hang)."""
    import dataclasses
    import time as _time

    spec_job = job(steps=3)
    n = next(_ids)
    base = f"mem://restart{n}"
    trn_in, ctl_in = transport.open_receiver(f"{base}-trn", hwm=256), transport.open_receiver(f"{base}-ctl")
    ver_in, gen_in = transport.open_receiver(f"{base}-ver"), transport.open_receiver(f"{base}-gen0")
    scorer = verifiers.Scorer(spec_job.spec.verifiers)
    m = metrics.Metrics(role="x", replica=0)
    stop_all, killed = threading.Event(), threading.Event()
    learner = step.Trainer(model_path=models.resolve(spec_job.spec.model), algorithm=spec_job.spec.algorithm)
    sampler = HFSampler(path=models.resolve(spec_job.spec.model), n=4, max_new=2)
    loader = CopyWeights(sampler)
    loader.learner = learner
    sample, load_seconds, beats_sent = sampler.sample, 7.0, []

    class Killed(Exception):
        pass

    def dies_at_step_2(prompts: Sequence[types.Prompt]) -> list[types.RolloutGroup]:
        if learner.step == 1 and not killed.is_set():
            killed.set()
            raise Killed()                                 # this process is gone, its work with it
        return sample(prompts)

    sampler.sample = dies_at_step_2  # type: ignore[method-assign]

    def generator(first: bool) -> None:
        control = transport.open_sender([f"{base}-ctl"], role="generator", index=0)
        if not first:                                      # restarted in place: the engine loads (no heartbeat)
            beats = generator_role.StartBeats(index=0, control=control, every=0.5).start()
            _time.sleep(load_seconds)
            beats.stop()
            beats_sent.append(beats.sent)
        try:
            generator_role.run(index=0, inbox=gen_in, verifiers=transport.open_sender(
                [f"{base}-ver"], role="generator", index=0), control=control, sampler=sampler, weights=loader,
                observer=observe.GeneratorObserver(m), max_policy_lag=1, should_stop=stop_all.is_set)
        except Killed:
            threading.Thread(target=generator, args=(False,), daemon=True).start()   # the kubelet restarts it

    threading.Thread(target=generator, args=(True,), daemon=True).start()
    threading.Thread(target=verifier_role.run, kwargs=dict(
        inbox=ver_in, trainers=transport.open_sender([f"{base}-trn"], role="verifier", index=0), score=scorer.apply,
        observer=observe.VerifierObserver(m, scorer.errors), should_stop=stop_all.is_set), daemon=True).start()
    to_gen = transport.open_sender([f"{base}-gen0"], role="trainer", index=0)
    pusher = ElasticPusher(to_gen, ctl_in)
    pusher.ack_timeout = 0.5        # a push to the dead generator fails fast: the wait is the step's, not the push's
    loop = _elastic_loop(tmp_path, spec_job, learner, inbox=trn_in, generators=to_gen, control=ctl_in, pusher=pusher,
                         deadline=3.0, reissue_after=1.0, start_deadline=60.0)
    loop.run()                                             # no Stalled
    stop_all.set()
    records = [json.loads(x) for x in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert killed.is_set() and beats_sent and beats_sent[0] >= 4
    assert [r["step"] for r in records] == [1, 2, 3] and all(r["completions"] == 16 for r in records)
    assert loop.epochs >= 1 and loop.starting == {}        # its READY ended the start
    # a start's beats count for start_deadline from its first beat, no longer
    loop.s = dataclasses.replace(loop.s, start_deadline=0.3)
    loop._starting(0)
    first = loop.start_beat_at
    _time.sleep(0.5)
    loop._starting(0)
    assert loop.start_beat_at == first
    for r in (trn_in, ctl_in, ver_in, gen_in):
        r.close()


def test_stdout_done_line_carries_only_what_the_done_record_has(capsys: pytest.CaptureFixture[str]) -> None:
    """A pod's log is read back by step records (lines with ``mean_reward``, e2e/run_real.py): the closing ``done``
    line must not look like one (it did, with ``mean_reward: null``, when the typed record was dumped whole)."""
    rep = report.StdoutReporter()
    rep.step(progress.StepRecord(step=40, mean_reward=0.75, policy_version=40))
    rep.done(progress.StepRecord(step=40, policy_version=40, export=None, eval_accuracy=None))
    step_line, done_line = (json.loads(x) for x in capsys.readouterr().out.splitlines())
    assert step_line["mean_reward"] == 0.75 and "done" not in step_line
    assert done_line == {"done": True, "step": 40, "policy_version": 40}


class Events:
    """A generator observer that logs what generator ``index`` did: ("sync", v), ("sample", v) with v the version its
    groups carry, ("skip", v) with v the version the skipped WORK asked for."""

    def __init__(self, index: int, log: list[tuple[int, str, int]]) -> None:
        self.index, self.log = index, log

    def sampled(self, *, groups: Sequence[types.RolloutGroup], seconds: float) -> None:
        self.log.append((self.index, "sample", min(g.policy_version for g in groups)))

    def synced(self, *, version: int, result: generator_role.SyncResult) -> None:
        self.log.append((self.index, "sync", version))

    def sync_failed(self, *, version: int, error: BaseException) -> None:
        self.log.append((self.index, "sync-failed", version))

    def skipped(self, *, work: wire.Work, version: int) -> None:
        self.log.append((self.index, "skip", work.policy_version))

    def unexpected(self, *, kind: str) -> None:
        self.log.append((self.index, f"unexpected {kind}", 0))


def test_a_silent_generator_is_left_out_within_seconds_and_its_restart_takes_the_current_policy_first(
        tmp_path: Path) -> None:
    """Generator 0 of 2 (not the top: no shrink can drop it) dies without a word mid-run (its thread ends, its beats
    stop, its inbox goes). Trainer 0 hears no beat for ``peer_silence`` and leaves it out: its prompts
    go to generator 1 at once (not after the stall timer: ``reissued`` stays 0), the pushes reach generator 1 alone.
    Generator 0 restarts (a fresh loop and inbox): its READY brings it back, it loads the current policy first and
    its first groups carry that version. Every step is trained once with its full share."""
    import time as _time

    spec_job = job(steps=8)
    silence = 1.5
    n = next(_ids)
    base = f"mem://silent{n}"
    trn_in, ctl_in = transport.open_receiver(f"{base}-trn", hwm=256), transport.open_receiver(f"{base}-ctl")
    ver_in = transport.open_receiver(f"{base}-ver")
    inboxes: list[Any] = [transport.open_receiver(f"{base}-gen{i}") for i in (0, 1)]
    scorer = verifiers.Scorer(spec_job.spec.verifiers)
    m = metrics.Metrics(role="x", replica=0)
    stop_all = threading.Event()
    log: list[tuple[int, str, int]] = []
    learner = step.Trainer(model_path=models.resolve(spec_job.spec.model), algorithm=spec_job.spec.algorithm)
    died: dict[str, float] = {}

    class Killed(Exception):
        pass

    def generator(i: int, *, dies: bool) -> None:
        log.append((i, "start", 0))
        if inboxes[i] is None:                            # a new process binds its port afresh
            inboxes[i] = transport.open_receiver(f"{base}-gen{i}")
        sampler = HFSampler(path=models.resolve(spec_job.spec.model), n=4, max_new=2)
        loader = CopyWeights(sampler)
        loader.learner = learner
        if dies:
            sample = sampler.sample

            def dies_at_step_3(prompts: Sequence[types.Prompt]) -> list[types.RolloutGroup]:
                if learner.step >= 2:
                    raise Killed()                    # kill -9: no leave notice, its work lost with it
                return sample(prompts)
            sampler.sample = dies_at_step_3  # type: ignore[method-assign]
        beats = generator_join.AliveBeats(index=i, every=silence / 4, open_control=lambda timeout: (
            transport.open_sender([f"{base}-ctl"], role="generator", index=i, ready_timeout=timeout))).start()
        try:
            generator_role.run(index=i, inbox=inboxes[i], verifiers=transport.open_sender(
                [f"{base}-ver"], role="generator", index=i), control=transport.open_sender(
                [f"{base}-ctl"], role="generator", index=i), sampler=sampler, weights=loader,
                observer=Events(i, log), max_policy_lag=1, should_stop=stop_all.is_set)
        except Killed:
            died["at"] = _time.time()
            inboxes[i].close()                            # what was queued for it dies with it
            inboxes[i] = None
        finally:
            beats.stop()

    threads = [threading.Thread(target=generator, args=(0,), kwargs=dict(dies=True), daemon=True),
               threading.Thread(target=generator, args=(1,), kwargs=dict(dies=False), daemon=True)]
    for t in threads:
        t.start()
    threading.Thread(target=verifier_role.run, kwargs=dict(
        inbox=ver_in, trainers=transport.open_sender([f"{base}-trn"], role="verifier", index=0), score=scorer.apply,
        observer=observe.VerifierObserver(m, scorer.errors), should_stop=stop_all.is_set), daemon=True).start()
    to_gen = transport.open_sender([f"{base}-gen0", f"{base}-gen1"], role="trainer", index=0)
    pusher = ElasticPusher(to_gen, ctl_in)
    loop = _elastic_loop(tmp_path, spec_job, learner, inbox=trn_in, generators=to_gen, control=ctl_in, pusher=pusher,
                         deadline=60, reissue_after=40, peer_silence=silence)
    train = learner.train_step
    restarted: dict[str, float] = {}

    def train_and_restart(**kw: object) -> object:
        if learner.step == 5 and 0 in loop.membership.out and "at" not in restarted:   # type: ignore[union-attr]
            restarted["at"] = _time.time()                 # the kubelet restarts it
            threading.Thread(target=generator, args=(0,), kwargs=dict(dies=False), daemon=True).start()
        return train(**kw)  # type: ignore[arg-type]

    learner.train_step = train_and_restart  # type: ignore[method-assign]
    loop.run()
    stop_all.set()
    records = [json.loads(x) for x in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, 9)) and all(r["completions"] == 16 for r in records)
    assert loop.reissued == 0                               # re-routed when left out, not by the stall timer
    assert loop.membership is not None and loop.membership.out == set() and loop.members == 2
    detect = loop.membership.left_out_at[0] - died["at"]
    print(f"left out {detect:.2f}s after it died (peer silence {silence}s)")
    # its silence, plus what the loop was busy with when it ran out (a train step, one hand-off or push bounded
    # by the silence): seconds, not the stall timer's 40 s here (progressDeadlineSeconds / 4 in a pod)
    assert silence - 0.5 < detect < silence + 10.0
    while_out = [to for v, to in pusher.pushed_to if v > 2 and restarted and to == (1,)]
    assert while_out, pusher.pushed_to                      # pushes while it was out went to generator 1 alone
    assert pusher.pushed_to[-1][1] == (0, 1)                # and after its READY to both again
    life = [(what, v) for g, what, v in log if g == 0]
    restart_from = max(k for k, (what, v) in enumerate(life) if what == "start")
    after = [e for e in life[restart_from:] if e[0] in ("sync", "sample")]
    assert after and after[0][0] == "sync" and after[0][1] >= 5, life   # the current policy before any sample
    first_sample = next(v for what, v in after if what == "sample")
    assert first_sample >= after[0][1]                       # its first groups carry (at least) that version
    for r in (trn_in, ctl_in, ver_in, *[i for i in inboxes if i is not None]):
        r.close()
