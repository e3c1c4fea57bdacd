"""The greedy strategy of a GuessNumber policy: every secret played once, each guess and hint printed.

    PYTHONPATH=api:operator:runtime .venv/bin/python bench/probes/guess_greedy.py \
        --checkpoint runs/tiny-guess-number-.../checkpoints [--model tiny --max-new-tokens 1 --max-value 8 --max-turns 4]

Plays secret 1..maxValue with the built-in ``GuessNumber`` environment (``agents/envs/guess_number.py``), the
episode rendered as the runner renders it (``agents.chat``: the chat template when the model has one, else plain
lines), greedy turns of at most ``--max-new-tokens`` (the example's ``maxNewTokens``) ending at the EOS token, from
the built-in ``--model`` untrained (no ``--checkpoint``) or with the newest complete checkpoint's weights. A deterministic policy that ignores the hints finds a secret in 3.25 turns per
episode at best over 1..8 with four turns; the printed tree says whether the policy reads them. One JSON line per
secret, then a summary line.
"""
from __future__ import annotations

import argparse
import json
from typing import Any

import torch
import transformers

from kubeforge.api import rljob
from kubeforge.runtime import models, types
from kubeforge.runtime.agents import chat
from kubeforge.runtime.agents.envs import guess_number
from kubeforge.runtime.learner import checkpoint


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", help="a run's checkpoints folder (default: the untrained model)")
    ap.add_argument("--model", default="tiny", help="the built-in model the run trained")
    ap.add_argument("--max-new-tokens", type=int, default=1)
    ap.add_argument("--max-value", type=int, default=8)
    ap.add_argument("--max-turns", type=int, default=4)
    a = ap.parse_args()
    path = models.resolve(rljob.ModelSpec(builtin=a.model))
    model: Any = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    model.train(False)
    tok = transformers.AutoTokenizer.from_pretrained(str(path))
    step = 0
    if a.checkpoint:
        loaded = checkpoint.load_latest(a.checkpoint)
        if loaded is None:
            raise SystemExit(f"{a.checkpoint}: no complete checkpoint")
        model.load_state_dict(loaded.model_state)
        step = int(loaded.state.get("step", 0))
    turns_all: list[int] = []
    rewards: list[float] = []
    for secret in range(1, a.max_value + 1):
        env = guess_number.GuessNumber(max_value=a.max_value, max_turns=a.max_turns)
        start = env.reset(types.Prompt(index=0, text="", answer=str(secret)))
        ids = chat.start_ids(tok, start, chat_template=True)
        moves: list[tuple[str, str]] = []
        reward = 0.0
        for _ in range(a.max_turns):
            with torch.no_grad():
                out = model.generate(torch.tensor([ids]), max_new_tokens=a.max_new_tokens, do_sample=False,
                                     eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
            turn = [int(x) for x in out[0, len(ids):]]
            text = str(tok.decode(turn, skip_special_tokens=True))
            result = env.step(text)
            ids += turn
            if result.done:
                moves.append((text, "right"))
                reward = result.reward or 0.0
                break
            hint = str(result.observation)
            moves.append((text, hint))
            ids += chat.delta(tok, start, [{"role": "user", "content": hint}], chat_template=True,
                              ended_with_eos=bool(turn) and turn[-1] == tok.eos_token_id)[0]
        turns_all.append(len(moves))
        rewards.append(reward)
        print(json.dumps({"secret": secret, "moves": moves, "turns": len(moves), "reward": reward}), flush=True)
    print(json.dumps({"step": step, "turns_mean": sum(turns_all) / len(turns_all),
                      "reward_mean": sum(rewards) / len(rewards),
                      "found": sum(r > 0 for r in rewards), "secrets": a.max_value}), flush=True)


if __name__ == "__main__":
    main()
