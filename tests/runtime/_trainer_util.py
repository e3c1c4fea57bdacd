"""Helpers for the trainer tests: a tiny Qwen2 built from a config, an on-policy sampler, synthetic groups, and a
data-parallel worker entrypoint (``python _trainer_util.py worker ...``) run as a real separate process.

Not a conftest (others own those): test files import it as a sibling module.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import random
import socket
import sys
from pathlib import Path

import torch
import transformers

from kubeforge.api import rljob
from kubeforge.runtime import types

VOCAB = 12
TARGET = 3            # the token the toy reward likes ("a")


def build_tiny(path: Path, *, seed: int = 0) -> Path:
    """A random tiny Qwen2 (hidden 128, 2 heads -> head_dim 64, 2 layers, tied embeddings) saved as an HF folder."""
    cfg = transformers.Qwen2Config(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                                   tie_word_embeddings=True, pad_token_id=0)
    torch.manual_seed(seed)
    transformers.Qwen2ForCausalLM(cfg).save_pretrained(path)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@torch.no_grad()
def sample(model: torch.nn.Module, prompt: list[int], *, n: int, max_new: int,
           gen: torch.Generator) -> list[types.Completion]:
    """``n`` completions of ``prompt`` sampled at temperature 1 with their raw logprobs (vLLM's convention)."""
    ids = torch.tensor([prompt] * n, dtype=torch.long)
    lps: list[torch.Tensor] = []
    for _ in range(max_new):
        logits = model(input_ids=ids, use_cache=False).logits[:, -1, :].float()
        logsm = torch.log_softmax(logits, dim=-1)
        nxt = torch.multinomial(logsm.exp(), 1, generator=gen)
        lps.append(logsm.gather(-1, nxt).squeeze(-1))
        ids = torch.cat([ids, nxt], dim=1)
    out = []
    for i in range(n):
        toks = ids[i, len(prompt):].tolist()
        out.append(types.Completion(token_ids=toks, logprobs=[float(lp[i]) for lp in lps], text=""))
    return out


def target_reward(c: types.Completion) -> float:
    """Share of completion tokens equal to TARGET."""
    return sum(1.0 for t in c.token_ids if t == TARGET) / max(len(c.token_ids), 1)


def on_policy_groups(model: torch.nn.Module, *, step: int, version: int, prompts: int, group_size: int,
                     max_new: int, seed: int) -> list[types.RolloutGroup]:
    gen = torch.Generator().manual_seed(seed * 1000 + step)
    groups = []
    for k in range(prompts):
        p = [1 + (k % 3), 2 + (k % 5)]
        comps = sample(model, p, n=group_size, max_new=max_new, gen=gen)
        groups.append(types.RolloutGroup(prompt=types.Prompt(index=step * prompts + k, text="", answer=""),
                                         prompt_token_ids=p, completions=comps, policy_version=version,
                                         step=step, rewards=[target_reward(c) for c in comps]))
    return groups


def synthetic_groups(*, step: int, prompts: int, group_size: int) -> list[types.RolloutGroup]:
    """Deterministic off-policy groups (random tokens of varying lengths, fixed behaviour logprobs, random rewards)
    for step ``step``; prompt indices ``step * prompts + k``."""
    rng = random.Random(step)
    groups = []
    for k in range(prompts):
        p = [rng.randrange(1, VOCAB) for _ in range(rng.randint(1, 4))]
        comps = []
        for _ in range(group_size):
            toks = [rng.randrange(1, VOCAB) for _ in range(rng.randint(1, 5))]
            comps.append(types.Completion(token_ids=toks, logprobs=[-2.3 + 0.1 * rng.random() for _ in toks],
                                          text=""))
        groups.append(types.RolloutGroup(prompt=types.Prompt(index=step * prompts + k, text="", answer=""),
                                         prompt_token_ids=p, completions=comps, policy_version=step, step=step,
                                         rewards=[float(rng.randint(0, 2)) for _ in comps]))
    return groups


ENV = (7, 8, 9)   # an environment turn's tokens, between two policy turns (episodes())


def episodes(groups: list[types.RolloutGroup], *, env_logprob: float | None,
             spans: bool = True) -> list[types.RolloutGroup]:
    """``groups`` as multi-turn episodes: each completion becomes policy turn, environment turn (``ENV``), policy
    turn ``[4, 5]``. ``env_logprob``: the environment tokens' behaviour logprob (None: random values, seeded: a
    perturbation); ``spans`` False: no policy spans, every token counts as a policy token."""
    rng = random.Random(5)
    out = []
    for g in groups:
        comps, all_spans = [], []
        for c in g.completions:
            first, second = c.token_ids.tolist(), [4, 5]
            lps = [rng.uniform(-9, 0) if env_logprob is None else env_logprob for _ in ENV]
            comps.append(types.Completion(token_ids=first + list(ENV) + second,
                                          logprobs=c.logprobs.tolist() + lps + [-1.5, -2.0], text=""))
            k = len(first)
            all_spans.append(((0, k), (k + len(ENV), k + len(ENV) + len(second))))
        out.append(dataclasses.replace(g, completions=comps, policy_spans=tuple(all_spans) if spans else None,
                                       episode_stats=tuple(types.EpisodeStats(turns=2, tool_calls=1)
                                                           for _ in comps)))
    return out


def algorithm(**kw: object) -> rljob.AlgorithmSpec:
    base: dict[str, object] = {"learningRate": 1e-3, "maxNewTokens": 5}
    base.update(kw)
    return rljob.AlgorithmSpec.model_validate(base)


def _worker(argv: list[str]) -> None:
    """One data-parallel trainer rank. For each loss in ``--losses``: train ``--steps`` steps on this rank's share
    of the synthetic groups, save parameters and metrics. Then rank 0 checkpoints the last trainer, fresh trainers
    on every rank resume (only rank 0 can see the checkpoint folder: the rest get it by broadcast) and take one
    more step; their parameters are saved too."""
    from kubeforge.runtime.learner import parallel, step

    ap = argparse.ArgumentParser()
    for name in ("--model", "--out", "--losses"):
        ap.add_argument(name, required=True)
    for name in ("--rank", "--world", "--port", "--steps", "--prompts"):
        ap.add_argument(name, type=int, required=True)
    a = ap.parse_args(argv)
    out = Path(a.out)
    group = parallel.DataParallel(config=parallel.DistConfig(rank=a.rank, world_size=a.world, master_port=a.port,
                                                             timeout_s=60))

    def share(s: int) -> list[types.RolloutGroup]:
        return [g for g in synthetic_groups(step=s, prompts=a.prompts, group_size=4) if g.prompt.index % a.world == a.rank]

    t = None
    for loss in a.losses.split(","):
        t = step.Trainer(model_path=a.model, algorithm=algorithm(loss=loss), group=group)
        history = [t.train_step(groups=share(s)).model_dump() for s in range(a.steps)]
        torch.save(dict(t.model.state_dict()), out / f"{loss}-rank{a.rank}.pt")
        (out / f"{loss}-rank{a.rank}.json").write_text(json.dumps(history))
    assert t is not None
    t.save_checkpoint(directory=out / f"ckpt-rank{a.rank}", keep=1, data_cursor=a.steps * a.prompts)
    resumed = step.Trainer(model_path=a.model, algorithm=algorithm(loss=loss), group=group)
    state = resumed.resume(directory=out / f"ckpt-rank{a.rank}")
    assert state is not None and state["data_cursor"] == a.steps * a.prompts and resumed.step == a.steps
    resumed.train_step(groups=share(a.steps))
    t.train_step(groups=share(a.steps))
    torch.save(dict(resumed.model.state_dict()), out / f"resumed-rank{a.rank}.pt")
    torch.save(dict(t.model.state_dict()), out / f"continued-rank{a.rank}.pt")
    group.close()


def _scale_worker(argv: list[str]) -> None:
    """One trainer rank with a given sharding: ``--steps`` steps from a fresh model (or, with ``--resume``, from
    the newest checkpoint in ``--ckpt``); after each step rank 0 writes the full parameters ``<tag>-<step>.pt``
    (gathered as a weight sync would: every rank iterates the stream), at the end the step metrics; a fresh run
    also checkpoints."""
    from kubeforge.runtime.learner import parallel, step

    ap = argparse.ArgumentParser()
    for name in ("--model", "--out", "--ckpt", "--sharding", "--tag", "--dtype"):
        ap.add_argument(name, required=True)
    for name in ("--rank", "--world", "--port", "--steps", "--prompts", "--micro"):
        ap.add_argument(name, type=int, required=True)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--ac", action="store_true")
    ap.add_argument("--lora", action="store_true")
    ap.add_argument("--episodes", choices=["", "zero", "random", "zero-unmasked", "random-unmasked"], default="",
                    help="train on episodes(): environment logprobs 0 or random, with or without policy spans")
    a = ap.parse_args(argv)
    out = Path(a.out)
    group = parallel.DataParallel(config=parallel.DistConfig(rank=a.rank, world_size=a.world, master_port=a.port,
                                                             timeout_s=120))
    scale = step.Scale(sharding=a.sharding, micro_batch_tokens=a.micro or None, activation_checkpointing=a.ac)
    lora = rljob.LoraSpec(rank=4, alpha=8, targetModules=["q_proj", "down_proj"]) if a.lora else None
    t = step.Trainer(model_path=a.model, algorithm=algorithm(loss="DAPO", learningRate=1e-2 if a.lora else 1e-3),
                     group=group, scale=scale, dtype=a.dtype, lora=lora)

    def share(s: int) -> list[types.RolloutGroup]:
        mine = [g for g in synthetic_groups(step=s, prompts=a.prompts, group_size=4)
                if g.prompt.index % a.world == a.rank]
        if not a.episodes:
            return mine
        return episodes(mine, env_logprob=0.0 if a.episodes.startswith("zero") else None,
                        spans=not a.episodes.endswith("unmasked"))

    first = 0
    if a.resume:
        state = t.resume(directory=a.ckpt)
        assert state is not None
        first = int(state["data_cursor"])
    history = []
    for s in range(first, first + a.steps):
        history.append(t.train_step(groups=share(s)).model_dump())
        stream = t.named_tensors()
        if a.rank == 0:
            assert [e.name for e in stream.meta] == [n for n, p in t.model.named_parameters()
                                                     if p.requires_grad or not a.lora]
            torch.save({n: v.clone() for n, v in stream}, out / f"{a.tag}-{s + 1}.pt")
        else:
            t.follow_sync()
    if a.rank == 0:
        (out / f"{a.tag}.json").write_text(json.dumps(history))
    if not a.resume:
        t.save_checkpoint(directory=a.ckpt, keep=2, data_cursor=first + a.steps)
    group.close()


class _Feed:
    """A trainer rank's inbox: this rank's share of the synthetic groups of the step its learner trains next."""

    def __init__(self, learner: object, *, rank: int, world: int, prompts: int) -> None:
        self.learner, self.rank, self.world, self.prompts = learner, rank, world, prompts
        self.sent: set[int] = set()

    def recv(self, timeout: float | None = None) -> object:
        from kubeforge.runtime import wire

        s = self.learner.step  # type: ignore[attr-defined]
        for g in synthetic_groups(step=s, prompts=self.prompts, group_size=4):
            if g.prompt.index % self.world == self.rank and g.prompt.index not in self.sent:
                self.sent.add(g.prompt.index)
                return wire.Scored(group=g)
        return None

    def close(self) -> None:
        pass


class _NoGenerators:
    """No generator: the loop's work goes nowhere (the inbox feeds the groups)."""

    peers = 0

    def send(self, msg: object, *, to: int | None = None, timeout: float | None = None) -> None:
        raise AssertionError("no generator to send to")

    def recv(self, timeout: float | None = None) -> None:
        return None

    def close(self) -> None:
        pass


def _stop_worker(argv: list[str]) -> None:
    """One rank of a 2-rank DDP trainer ``Loop`` (gloo) of ``--steps`` steps; SIGTERM (``should_stop``) reaches
    only rank ``--term-rank``, while it trains step ``--term-at`` + 1. Writes ``stop-rank<r>.json``: the
    ``Terminated`` message (or None), the steps this rank trained, and the seconds from that SIGTERM to the end of
    the run (rank ``--term-rank`` only)."""
    import time

    from kubeforge.runtime import metrics, observe
    from kubeforge.runtime.learner import parallel, step
    from kubeforge.runtime.trainer import loop as trainer_role
    from kubeforge.runtime.trainer import report

    ap = argparse.ArgumentParser()
    for name in ("--model", "--out", "--ckpt"):
        ap.add_argument(name, required=True)
    for name in ("--rank", "--world", "--port", "--steps", "--prompts", "--term-rank", "--term-at"):
        ap.add_argument(name, type=int, required=True)
    a = ap.parse_args(argv)
    out = Path(a.out)
    group = parallel.DataParallel(config=parallel.DistConfig(rank=a.rank, world_size=a.world, master_port=a.port,
                                                             timeout_s=120))
    learner = step.Trainer(model_path=a.model, algorithm=algorithm(loss="DAPO"), group=group)
    none = _NoGenerators()

    class Pusher:
        def push(self, *, version: int, step: int) -> types.SyncResult:
            return types.SyncResult(seconds=0.0, bytes=0)

        def reform(self, *, members: int | None = None, left_out: frozenset[int] = frozenset()) -> int:
            return 0

    rank0 = trainer_role.Rank0(control=none, pusher=Pusher(),  # type: ignore[arg-type]
                               reporter=report.JsonlReporter(path=out / "steps.jsonl", echo=False)) \
        if a.rank == 0 else None
    term: list[float] = []
    loop = trainer_role.Loop(
        settings=trainer_role.Settings(rank=a.rank, world=a.world, steps=a.steps, prompts_per_step=a.prompts,
                                       max_policy_lag=1, sync_every=1, checkpoint_every=100,
                                       checkpoint_dir=a.ckpt, checkpoint_keep=2, deadline=120, reissue_after=60),
        inbox=_Feed(learner, rank=a.rank, world=a.world, prompts=a.prompts),  # type: ignore[arg-type]
        generators=none, learner=learner, prompt_at=lambda k: types.Prompt(index=k, text="", answer=""),  # type: ignore[arg-type]
        observer=observe.TrainerObserver(metrics.Metrics(role="trainer", replica=a.rank)), rank0=rank0,
        should_stop=lambda: bool(term), stopped_at=lambda: term[0] if term else None)
    trained: list[int] = []
    train = learner.train_step

    def counted(**kw: object) -> object:
        trained.append(learner.step)
        if a.rank == a.term_rank and learner.step == a.term_at:
            term.append(time.monotonic())                       # SIGTERM reaches this rank while it trains
        return train(**kw)  # type: ignore[arg-type]

    learner.train_step = counted  # type: ignore[method-assign]
    stopped: str | None = None
    try:
        loop.run()
    except trainer_role.Terminated as exc:
        stopped = str(exc)
    took = time.monotonic() - term[0] if term else None
    (out / f"stop-rank{a.rank}.json").write_text(json.dumps({"stopped": stopped, "trained": trained,
                                                             "sigterm_to_end_s": took}))
    group.close()


if __name__ == "__main__":
    if sys.argv[1:2] == ["worker"]:
        _worker(sys.argv[2:])
    elif sys.argv[1:2] == ["scale-worker"]:
        _scale_worker(sys.argv[2:])
    elif sys.argv[1:2] == ["stop-worker"]:
        _stop_worker(sys.argv[2:])
