"""Greedy held-out accuracy of a model on arithmetic task variants (what the demo's task choice rests on).

    .venv/bin/python bench/probes/eval_probe.py [--model smollm2-135m-instruct] [--prompts 64] [--max-new-tokens 10] \
        '{"digits": 2, "operations": ["+", "-"]}' '{"digits": 1, "operations": ["+", "-", "*"]}'

Uses the same evaluator the RLJob uses (``trainer.evaluate``: chat template, left-padded greedy HF generate, bf16
autocast, ExactAnswer >= 0.5), on ``--prompts`` held-out problems from index 2^40 of each task's stream. Prints one
JSON line per task, with the load average.
"""
from __future__ import annotations

import argparse
import json
import os

import torch
import transformers

from kubeforge.api import rljob
from kubeforge.runtime import models
from kubeforge.runtime.tasks import registry as tasks
from kubeforge.runtime.trainer import evaluate
from kubeforge.runtime.verifiers import registry as verifiers


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tasks", nargs="+", help="arithmetic task specs as JSON")
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--max-new-tokens", type=int, default=10)
    a = ap.parse_args()
    path = models.resolve(rljob.ModelSpec(builtin=a.model))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    tok = transformers.AutoTokenizer.from_pretrained(str(path))
    v = verifiers.build_inner(rljob.VerifierSpec.model_validate({"name": "answer", "type": "ExactAnswer"}))
    for task in a.tasks:
        spec = rljob.TaskSpec.model_validate({"arithmetic": json.loads(task), "seed": 0})
        ev = rljob.EvaluationSpec(prompts=a.prompts)
        r = evaluate.Evaluator(model=model, tokenizer=tok, prompts=evaluate.held_out(tasks.stream(spec), ev),
                               verifier=v, max_new_tokens=a.max_new_tokens, chat_template=True,
                               compute_dtype=torch.bfloat16).run()
        print(json.dumps({"task": json.loads(task), "max_new_tokens": a.max_new_tokens, "accuracy": r.accuracy,
                          "correct": r.correct, "prompts": r.prompts, "seconds": round(r.seconds, 1),
                          "load_average": [round(x, 2) for x in os.getloadavg()]}), flush=True)


if __name__ == "__main__":
    main()
