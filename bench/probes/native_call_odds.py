"""Probe: how likely the untrained SmolLM2-135M-Instruct is to write a whole right native tool call on its first
turn of a ``Calculator`` episode, by the number of worked exchanges before the problem.

Renders the native calculator's first prompt (``agents.native.Native`` over the model's format template, the
environment's system prompt, 1-3 worked exchanges with a native call, then a held-out problem of
``examples/tool-calculator.yaml``) and scores, with one forward pass of the HF model, the probability of the opening
``<tool_call>`` (its first 5 tokens) and of the whole right call
``<tool_call>[{"name": "calculate", "arguments": {"expression": "A * B"}}]</tool_call>``, at temperature 1. This is
the chance one sampled first turn starts GRPO's signal (a right call is answered with the product, which the model
then copies). Prints one JSON line per count of worked exchanges. Nothing is asserted.

    python bench/probes/native_call_odds.py [--example examples/tool-calculator.yaml] [--problems 4]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
import transformers
import yaml

from kubeforge.api import rljob
from kubeforge.runtime import models
from kubeforge.runtime.agents import native, protocol
from kubeforge.runtime.agents.envs import calculator
from kubeforge.runtime.tasks import registry as tasks
from kubeforge.runtime.trainer import evaluate

ROOT = Path(__file__).resolve().parents[2]
WORKED = ((314, 27), (52, 608), (731, 46))     # the first two are the environment's own demonstration


def worked(a: int, b: int) -> list[dict[str, str]]:
    q = f"{a} * {b}"
    return [{"role": "user", "content": f"What is {q}? Answer with the number only."},
            protocol.assistant_tool_calls([(calculator.FUNCTION, {"expression": q})]),
            {"role": "tool", "content": str(a * b)}, {"role": "assistant", "content": str(a * b)}]


def odds(model: Any, tok: Any, nat: native.Native, messages: list[dict[str, Any]], call: str) -> tuple[float, float]:
    ctx = tok.apply_chat_template(nat.start(messages), tools=nat.tools, chat_template=nat.template, tokenize=False,
                                  add_generation_prompt=True)
    head, tail = tok(ctx).input_ids, tok(call).input_ids
    with torch.no_grad():
        logits = model(torch.tensor([head + tail])).logits[0, len(head) - 1:-1].float()
    lp = torch.log_softmax(logits, -1)[torch.arange(len(tail)), torch.tensor(tail)]
    return float(lp[:5].sum().exp()), float(lp.sum().exp())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--example", default=str(ROOT / "examples" / "tool-calculator.yaml"))
    ap.add_argument("--problems", type=int, default=4)
    args = ap.parse_args()
    spec = rljob.RLJobSpec.model_validate(yaml.safe_load(Path(args.example).read_text())["spec"])
    assert spec.evaluation is not None
    path = models.resolve(spec.model)
    tok = transformers.AutoTokenizer.from_pretrained(str(path))
    model: Any = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    model.eval()
    nat = native.Native(tokenizer=tok, tools=calculator.TOOLS, chat_template=True)
    problems = evaluate.held_out(tasks.stream(spec.task), spec.evaluation)[:args.problems]
    for n in range(1, len(WORKED) + 1):
        demo = [m for a, b in WORKED[:n] for m in worked(a, b)]
        rows = []
        for p in problems:
            q = p.text.removeprefix("What is ").split("?")[0]
            call = '<tool_call>[{"name": "calculate", "arguments": {"expression": "' + q + '"}}]</tool_call>'
            messages = [{"role": "system", "content": calculator.NATIVE_SYSTEM}, *demo,
                        {"role": "user", "content": p.text}]
            rows.append(odds(model, tok, nat, messages, call))
        print(json.dumps({"worked_exchanges": n, "p_open": [round(o, 4) for o, _ in rows],
                          "p_whole_call": [round(w, 4) for _, w in rows]}), flush=True)


if __name__ == "__main__":
    main()
