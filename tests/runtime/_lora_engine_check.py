"""Run as a script (its own vLLM engine, apart from the session's shared one): a LoRA trainer syncs its adapter
into a real vLLM engine; prints JSON comparing the engine's greedy outputs and logprobs with the trainer's
(merged) model. Used by test_lora_engine.py."""
from __future__ import annotations

import json
import os
import sys
import threading

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

import torch  # noqa: E402

import _trainer_util as util  # noqa: E402
from kubeforge.api import rljob  # noqa: E402
from kubeforge.runtime import models, types, weightsync  # noqa: E402
from kubeforge.runtime.generator import engine  # noqa: E402
from kubeforge.runtime.learner import step  # noqa: E402


def policy_logprobs(model: torch.nn.Module, prompt: list[int], tokens: list[int]) -> list[float]:
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        lg = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
    return [float(lg[len(prompt) - 1 + i, t]) for i, t in enumerate(tokens)]


def main() -> None:
    path = models.resolve(rljob.ModelSpec(builtin="tiny"))
    spec = rljob.LoraSpec(rank=8, alpha=16, targetModules=["q_proj", "k_proj", "v_proj", "o_proj"])
    t = step.Trainer(model_path=path, algorithm=util.algorithm(learningRate=5e-2), lora=spec)
    for s in range(2):
        t.train_step(groups=util.synthetic_groups(step=s, prompts=4, group_size=4))
    eng = engine.Engine(model_dir=path, dtype="float32", seed=0, role=rljob.GeneratorRole(kv_cache_gib=1),
                        lora=spec)
    prompts = [types.Prompt(index=i, text=text, answer="") for i, text in enumerate(["ab", "copy: b", "a+b="])]
    before = eng.greedy(prompts, max_tokens=6)
    port = util.free_port()
    sender = weightsync.WeightSender(host="127.0.0.1", port=port, world_size=2, timeout=60)
    box: dict[str, object] = {}

    def send() -> None:
        try:
            box["stats"] = sender.send(t.named_tensors(), version=t.policy_version)
        except BaseException as e:  # reported below
            box["error"] = repr(e)
    th = threading.Thread(target=send, daemon=True)
    th.start()
    eng.join_weight_sync(host="127.0.0.1", port=port, world_size=2, rank_base=1, timeout=60)
    got = eng.receive_weights()
    th.join(timeout=60)
    after = eng.greedy(prompts, max_tokens=6)
    rows = []
    for p, b, a in zip(prompts, before, after):
        ids = eng.encode(p, chat_template=False)
        want = policy_logprobs(t.model, ids, a.token_ids.tolist())  # uint32 arrays on the wire
        base_lp = policy_logprobs(t.model, ids, b.token_ids.tolist())
        rows.append({"tokens": a.token_ids.tolist(), "engine": a.logprobs.tolist(), "trainer": want,
                     "trainer_argmax_equal": all(
                         int(torch.log_softmax(t.model(input_ids=torch.tensor([ids + a.token_ids.tolist()]))
                                               .logits[0, len(ids) - 1 + i].float(), -1).argmax()) == tok
                         for i, tok in enumerate(a.token_ids)),
                     "before_engine": b.logprobs.tolist(), "before_trainer_now": base_lp})
    stats = box.get("stats")
    out = {"error": box.get("error"), "received_bytes": got.bytes, "version": got.version,
           "sent_bytes": getattr(stats, "bytes", None),
           "adapter_bytes": sum(p.numel() * p.element_size() for n, p in t.model.named_parameters()
                                if p.requires_grad),
           "full_model_bytes": sum(p.numel() * p.element_size() for p in t.model.parameters()),
           "lora_request": str(getattr(eng.lora_request, "lora_name", None)), "rows": rows}
    eng.close()
    sender.close()
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    sys.exit(main())
