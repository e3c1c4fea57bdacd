"""Weight-sync micro-benchmark: full sync into a running vLLM engine vs a raw gloo broadcast of the same bytes.

    .venv/bin/python bench/bench_weightsync.py [--model tiny|smollm2-135m-instruct|all] [--reps N] \
        [--dtype bfloat16|float32] [--profile] [--delta [--lr LR]]

For each model, in one run: a sender process (the "trainer", holding the HF model) and this process (the
"generator", holding a real vLLM engine in-process) first time a raw gloo broadcast of one flat buffer as large as
the model's parameters (the baseline: wire speed on this machine, now), then ``--reps`` full syncs
(``WeightSender.start`` -> ``Engine.receive_weights``, as the trainer runs them: the sender snapshots the weights
into its reusable buffers, then broadcasts from a background thread while it could train; the engine receives
in the background into its reusable buffers (metadata, buckets, ack) and builds the new kernels into its shadow
model there too, while this process keeps sampling small batches, as a generator does; then, between batches, the
swap of the new kernels and small tensors, prefix-cache reset). ``generation_pause_seconds`` is that swap
(``Engine.receive_weights`` once the sync is staged and built): the time a generator stops sampling per sync;
``background_receive_seconds`` / ``background_build_seconds`` the receive and the build that ran while it sampled;
they are pipelined (the build starts with the receive and builds each layer as soon as its bytes have landed):
``background_build_wait_seconds`` is the part of the build spent waiting for the wire, ``background_ready_seconds``
header to received whole and built, ``receive_build_overlap_seconds`` = receive + build work (build minus its
waits) - ready, the time the pipelining saves against receiving, then building.
``sync_seconds`` = ready + swap (header to new weights serving). The baseline of the same run:
``--reps`` more syncs loaded with vLLM's in-place reload in the pause (``inplace_pause_seconds``, the path before
the swap reload; ``ratio_pause_inplace_over_swap``). ``--dtype`` is the
dtype of the weights and the engine (the demo's is bfloat16). Prints one JSON line per model; ``ratio`` = sync
GB/s / raw GB/s (medians after one warm-up each). ``receive_discard`` syncs run the same protocol into the engine's worker but
discard the tensors instead of loading them: the difference to a full sync is vLLM's reload time. ``memcpy_*`` is one
in-process copy of the same bytes into a preallocated buffer (the ceiling of landing them in memory once). Nothing is asserted: speed is reported, never hard-coded.

``--delta`` (lossless deltas, ``spec.weightSync.delta``): the sender holds float32 masters and runs real AdamW steps
on them (gradients drawn from a normal distribution: the optimizer's arithmetic, not a task's loss; ``--lr``, default
the example's rate for the model: examples/arithmetic-smollm2.yaml 2e-5, examples/tiny.yaml 5e-3); each step's
weights, in ``--dtype``, go out twice into the same running engine: first as a delta against the previous step's
(full if the delta is not smaller), then full (the same weights again), so both figures describe one update. One
JSON line per model with one entry per step: ``changed`` (the fraction of elements whose bits changed), and for
``delta`` and ``full`` each: ``sent_delta``, ``bytes`` (sent), ``pack_seconds`` (the sender's snapshot, with the
comparison and encoding for the delta: ``encode_seconds``), ``sync_seconds`` (header to the new weights serving,
engine side, as above) and ``total_seconds`` (pack + sync); medians over the steps after the first.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time
from typing import Any

import common

MODELS = ("tiny", "smollm2-135m-instruct")
LEARNING_RATES = {"tiny": 5e-3, "smollm2-135m-instruct": 2e-5}   # examples/tiny.yaml, examples/arithmetic-smollm2.yaml


def model_dir(name: str) -> pathlib.Path:
    from kubeforge.api import rljob
    from kubeforge.runtime import models

    return models.resolve(rljob.ModelSpec(builtin=name))


def raw_rounds(*, rank: int, port: int, nbytes: int, reps: int) -> list[float]:
    """Time ``reps`` broadcasts of an ``nbytes`` buffer over a fresh private gloo group (both ends call this)."""
    import torch

    from kubeforge.runtime import weightsync

    group = weightsync.TorchGroup(host="127.0.0.1", port=port, world_size=2, rank=rank, timeout=120,
                                  join_timeout=600)
    buf = torch.empty(nbytes, dtype=torch.uint8)
    times = []
    for _ in range(reps + 1):
        group.all_reduce_sum(torch.zeros(1))  # line both ends up before the clock starts
        start = time.perf_counter()
        group.broadcast(buf)
        group.all_reduce_sum(torch.zeros(1))  # the receiver has it all
        times.append(time.perf_counter() - start)
    group.close()
    return times[1:]


def memcpy_seconds(*, nbytes: int, reps: int) -> float:
    """Median time of one in-process copy of ``nbytes`` into a preallocated buffer (torch's copy, its threads):
    the ceiling of any receive that has to land the bytes in memory once."""
    import torch

    src = torch.ones(nbytes, dtype=torch.uint8)
    dst = torch.empty_like(src)
    times = []
    for _ in range(reps + 1):
        t0 = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])


def sender_main(args: argparse.Namespace) -> None:
    """The trainer side: raw rounds, then full syncs of the (perturbed) HF model; stats as JSON lines."""
    import torch
    import transformers

    from kubeforge.runtime import weightsync

    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir(args.model), dtype=getattr(torch, args.dtype))
    named = [(n, p.detach()) for n, p in model.named_parameters()]
    nbytes = sum(t.numel() * t.element_size() for _, t in named)
    raw = raw_rounds(rank=0, port=args.raw_port, nbytes=nbytes, reps=args.reps)
    print(json.dumps({"raw_sender_seconds": raw}), flush=True)
    sender = weightsync.WeightSender(host="127.0.0.1", port=args.sync_port, world_size=2, timeout=120,
                                     join_timeout=3600)   # the engine may take 15 min to start on a loaded machine
    for v in range(1, 3 * (args.reps + 1) + 1):  # discarded by the engine, loaded in place, then swapped in
        with torch.no_grad():
            for _, t in named:
                t.add_(torch.randn_like(t) * 1e-3)  # new weights every time, as after an optimizer step
        t0 = time.perf_counter()
        flight = sender.start(named, version=v)   # snapshot into the reusable send buffers, then background
        pack = time.perf_counter() - t0
        print(json.dumps({"sync": flight.result(timeout=600).as_dict(), "pack_seconds": pack}), flush=True)
    sender.close()


def receiver_main(args: argparse.Namespace) -> dict[str, object]:
    """The generator side for one model; returns the report line."""
    import torch

    from kubeforge.api import rljob
    from kubeforge.runtime.generator import engine

    folder = model_dir(args.model)
    raw_port, sync_port = common.free_port(), common.free_port()
    cmd = [sys.executable, __file__, "--role", "sender", "--model", args.model, "--reps", str(args.reps),
           "--dtype", args.dtype,
           "--raw-port", str(raw_port), "--sync-port", str(sync_port)]
    sender = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        import safetensors.torch

        elem = torch.empty((), dtype=getattr(torch, args.dtype)).element_size()
        nbytes = sum(t.numel() * elem for t in _unique_tensors(safetensors.torch, folder))
        raw = raw_rounds(rank=1, port=raw_port, nbytes=nbytes, reps=args.reps)
        eng = engine.Engine(model_dir=folder, dtype=args.dtype, seed=0, role=rljob.GeneratorRole(kv_cache_gib=1),
                            max_model_len=512)
        eng.join_weight_sync(host="127.0.0.1", port=sync_port, world_size=2, rank_base=1, timeout=120)
        wire_only = [eng.receive_weights(load=False) for _ in range(args.reps + 1)][1:]
        inplace = []
        for _ in range(args.reps + 1):   # the baseline first: the run ends on a swap (a short last load)
            generate_until_staged(eng)
            inplace.append(eng.receive_weights(swap=False))
        inplace = inplace[1:]
        engine_side, generated = [], []
        for _ in range(args.reps + 1):
            # as a generator does: sample while the next sync lands in the background, load it between batches
            generated.append(generate_until_staged(eng))
            engine_side.append(profiled(eng.receive_weights) if args.profile and len(engine_side) == args.reps
                               else eng.receive_weights())
        engine_side, generated = engine_side[1:], generated[1:]
        lines = [json.loads(x) for x in sender.communicate(timeout=600)[0].splitlines() if x.startswith("{")]
    finally:
        if sender.poll() is None:
            sender.kill()
    all_syncs = [x["sync"] for x in lines if "sync" in x]
    packs = [x["pack_seconds"] for x in lines if "sync" in x][2 * (args.reps + 1) + 1:]
    wire_syncs, syncs = all_syncs[1:args.reps + 1], all_syncs[2 * (args.reps + 1) + 1:]
    wire_s = statistics.median(s["seconds"] for s in wire_syncs)
    raw_s = statistics.median(raw)
    memcpy_s = memcpy_seconds(nbytes=nbytes, reps=args.reps)
    # end to end: header to the new weights serving = the engine's background receive and build, pipelined (header
    # to received whole and built: ready_seconds), then the swap; the sender's own figure also holds its wait for a
    # receiver still sampling or loading
    sync_s = statistics.median((e.ready_seconds or e.receive_seconds + e.prepare_seconds) + e.seconds
                               for e in engine_side)
    pause_s = statistics.median(s.seconds for s in engine_side)
    inplace_s = statistics.median(s.seconds for s in inplace)
    report = {
        "model": args.model, "dtype": args.dtype, "bytes": nbytes, "reps": args.reps,
        "threads": torch.get_num_threads(),
        "engine_start_seconds": round(eng.start_seconds, 1),
        "raw_seconds": round(raw_s, 4), "raw_gb_per_s": round(nbytes / raw_s / 1e9, 3),
        "receive_discard_seconds": round(wire_s, 4), "receive_discard_gb_per_s": round(nbytes / wire_s / 1e9, 3),
        "sync_seconds": round(sync_s, 4), "sync_gb_per_s": round(nbytes / sync_s / 1e9, 3),
        "engine_receive_seconds": round(statistics.median(s.seconds for s in engine_side), 4),
        "generation_pause_seconds": round(pause_s, 4),
        "generation_pause_max_seconds": round(max(s.seconds for s in engine_side), 4),
        "swapped": all(s.swapped for s in engine_side),
        "background_receive_seconds": round(statistics.median(s.receive_seconds for s in engine_side), 4),
        "background_build_seconds": round(statistics.median(s.prepare_seconds for s in engine_side), 4),
        "background_build_wait_seconds": round(statistics.median(s.prepare_wait_seconds for s in engine_side), 4),
        "background_ready_seconds": round(statistics.median(s.ready_seconds for s in engine_side), 4),
        "receive_build_overlap_seconds": round(statistics.median(
            s.receive_seconds + s.prepare_seconds - s.prepare_wait_seconds - s.ready_seconds for s in engine_side), 4),
        "inplace_pause_seconds": round(inplace_s, 4),
        "inplace_pause_max_seconds": round(max(s.seconds for s in inplace), 4),
        "ratio_pause_inplace_over_swap": round(inplace_s / pause_s, 1),
        "batches_generated_while_receiving": generated,
        "sender_pack_seconds": round(statistics.median(packs), 4),
        "buckets": syncs[0]["buckets"], "tensors": syncs[0]["tensors"],
        "ratio_sync_vs_raw": round(raw_s / sync_s, 3), "ratio_discard_vs_raw": round(raw_s / wire_s, 3),
        "memcpy_seconds": round(memcpy_s, 4), "memcpy_gb_per_s": round(nbytes / memcpy_s / 1e9, 3),
        "ratio_sync_vs_memcpy": round(memcpy_s / sync_s, 3),
        "load_average": common.load_average(),
    }
    eng.close()
    return report


def delta_sender_main(args: argparse.Namespace) -> None:
    """``--delta``, the trainer side: one full sync (no base yet), then per step an AdamW update of the float32
    masters sent as a delta, then the same weights full; a JSON line per step."""
    import torch
    import transformers

    from kubeforge.runtime import weightsync

    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir(args.model), dtype=torch.float32)
    params = list(model.named_parameters())   # a tied weight once, as the trainer sends it
    opt = torch.optim.AdamW([p for _, p in params], lr=args.lr or LEARNING_RATES[args.model])
    dtype = getattr(torch, args.dtype)
    sender = weightsync.WeightSender(host="127.0.0.1", port=args.sync_port, world_size=2, timeout=120,
                                     join_timeout=3600, delta=True)
    gen = torch.Generator().manual_seed(0)

    def sync(version: int, *, delta: bool) -> dict[str, Any]:
        sender.delta = delta
        t0 = time.perf_counter()
        flight = sender.start([(n, p.detach().to(dtype)) for n, p in params], version=version)
        pack = time.perf_counter() - t0
        return {"sync": flight.result(timeout=600).as_dict(), "pack_seconds": pack}

    print(json.dumps({"step": 0, "full": sync(1, delta=False)}), flush=True)
    for step in range(1, args.reps + 2):
        for _, p in params:
            p.grad = torch.randn(p.shape, generator=gen)
        opt.step()
        print(json.dumps({"step": step, "delta": sync(2 * step, delta=True), "full": sync(2 * step + 1, delta=False)}),
              flush=True)
    sender.close()


def delta_receiver_main(args: argparse.Namespace) -> dict[str, object]:
    """``--delta``, the generator side (a real engine sampling between syncs, as above); the report line."""
    import torch

    from kubeforge.api import rljob
    from kubeforge.runtime.generator import engine

    folder, sync_port = model_dir(args.model), common.free_port()
    cmd = [sys.executable, __file__, "--role", "sender", "--model", args.model, "--reps", str(args.reps),
           "--dtype", args.dtype, "--delta", "--lr", str(args.lr), "--sync-port", str(sync_port)]
    sender = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        eng = engine.Engine(model_dir=folder, dtype=args.dtype, seed=0, role=rljob.GeneratorRole(kv_cache_gib=1),
                            max_model_len=512)
        eng.join_weight_sync(host="127.0.0.1", port=sync_port, world_size=2, rank_base=1, timeout=120)
        engine_side = []
        for _ in range(1 + 2 * (args.reps + 1)):   # the first full sync, then a delta and a full one per step
            generate_until_staged(eng)
            engine_side.append(eng.receive_weights())
        lines = [json.loads(x) for x in sender.communicate(timeout=600)[0].splitlines() if x.startswith("{")]
    finally:
        if sender.poll() is None:
            sender.kill()
    steps = []
    for line in lines[1:]:
        k = 2 * line["step"] - 1
        steps.append({"step": line["step"], "changed": line["delta"]["sync"].get("changed"),
                      "delta": _figures(line["delta"], engine_side[k]),
                      "full": _figures(line["full"], engine_side[k + 1])})
    measured = steps[1:]   # the first step warms the delta path's buffers up
    report = {
        "model": args.model, "dtype": args.dtype, "mode": "delta", "reps": args.reps,
        "learning_rate": args.lr or LEARNING_RATES[args.model], "gradients": "normal(0, 1), AdamW on float32 masters",
        "full_bytes": lines[0]["full"]["sync"]["bytes"], "threads": torch.get_num_threads(),
        "engine_start_seconds": round(eng.start_seconds, 1), "steps": steps,
        "changed_median": round(statistics.median(s["changed"] for s in measured), 4),
        "load_average": common.load_average(),
    }
    for kind in ("delta", "full"):
        for field in ("bytes", "pack_seconds", "sync_seconds", "total_seconds"):
            report[f"{kind}_{field}_median"] = round(statistics.median(s[kind][field] for s in measured), 4)
    eng.close()
    return report


def _figures(sent: dict[str, Any], got: Any) -> dict[str, object]:
    """One sync's figures: the sender's line and the engine's stats (header to serving: ready + swap)."""
    sync = (got.ready_seconds or got.receive_seconds + got.prepare_seconds) + got.seconds
    return {"sent_delta": sent["sync"]["delta"], "received_delta": got.delta, "bytes": sent["sync"]["bytes"],
            "pack_seconds": round(sent["pack_seconds"], 4),
            "encode_seconds": round(sent["sync"].get("encode_seconds", 0.0), 4),
            "sync_seconds": round(sync, 4), "pause_seconds": round(got.seconds, 4),
            "total_seconds": round(sent["pack_seconds"] + sync, 4)}


def profiled(fn: Any) -> Any:
    """``fn()`` under cProfile; the top of the profile (cumulative) goes to stderr."""
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    out = prof.runcall(fn)
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(40)
    print(text.getvalue(), file=sys.stderr, flush=True)
    return out


def generate_until_staged(eng: Any, *, limit_s: float = 600.0) -> int:
    """Sample small batches until the next sync is in the engine's buffers (bounded); how many batches ran."""
    from kubeforge.runtime import types

    prompts = [types.Prompt(index=i, text=f"Count to {i + 3}:", answer="") for i in range(4)]
    deadline, batches = time.monotonic() + limit_s, 0
    while not eng.weights_staged():
        if time.monotonic() > deadline:
            raise SystemExit(f"no sync arrived within {limit_s}s")
        eng.generate(prompts, n=2, max_tokens=8, chat_template=False)
        batches += 1
    return batches


def _unique_tensors(st: Any, folder: pathlib.Path) -> list[Any]:
    import transformers

    cfg = transformers.AutoConfig.from_pretrained(folder)
    tensors = {}
    for f in sorted(folder.glob("*.safetensors")):
        tensors.update(st.load_file(f))  # type: ignore[attr-defined]
    if getattr(cfg, "tie_word_embeddings", False):
        tensors.pop("lm_head.weight", None)  # the sender sends a tied weight once
    return list(tensors.values())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="all", choices=(*MODELS, "all"))
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    p.add_argument("--profile", action="store_true", help="cProfile the last swap (the pause) to stderr")
    p.add_argument("--role", default="bench", choices=("bench", "sender"))
    p.add_argument("--raw-port", type=int, default=0)
    p.add_argument("--sync-port", type=int, default=0)
    p.add_argument("--delta", action="store_true", help="each step's update sent as a delta, then full (see above)")
    p.add_argument("--lr", type=float, default=0.0, help="--delta: AdamW's learning rate (0: the example's)")
    args = p.parse_args()
    if args.role == "sender":
        (delta_sender_main if args.delta else sender_main)(args)
    elif args.model == "all":  # one engine per process: each model in its own child
        for name in MODELS:
            subprocess.run([sys.executable, __file__, "--model", name, "--reps", str(args.reps), "--dtype", args.dtype,
                            *(["--delta", "--lr", str(args.lr)] if args.delta else [])],
                           check=True,
                           env={**os.environ})
    else:
        print(json.dumps((delta_receiver_main if args.delta else receiver_main)(args)), flush=True)


if __name__ == "__main__":
    main()
