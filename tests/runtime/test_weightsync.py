"""Weight sync over real gloo groups; the ``vllm`` tests push weights into the shared real engine.

What the engine tests prove: after a sync, the engine's greedy tokens AND their logprobs equal the trainer's own
HF model on fixed prompts (long enough to fill prefix-cache blocks cached before the sync). Parameter checksums
would not do: on CPU vLLM repacks weights, and a tied lm_head can stay stale while sums look right.
"""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch
import transformers

from kubeforge.runtime import types, weightsync

PROMPTS = [types.Prompt(index=i, text=f"Read the string below carefully and copy it exactly, twice: {w}\nAnswer:", answer="")
           for i, w in enumerate(["abcd", "dcba", "12+34=?", "hello world"])]
MAX_TOKENS = 8
ATOL = 2e-3


# ---------------------------------------------------------------- HF reference computations


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def trainer_model(model_dir: object, *, noise_seed: int, scale: float = 0.05) -> transformers.PreTrainedModel:
    """The tiny HF model with every parameter perturbed (as after some optimizer steps)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(noise_seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * scale)
    return model


def hf_greedy(model: transformers.PreTrainedModel, prompt_ids: list[int], max_tokens: int,
              eos: int) -> tuple[list[int], list[float]]:
    ids, out, lps = list(prompt_ids), [], []
    with torch.no_grad():
        for _ in range(max_tokens):
            logits = model(torch.tensor([ids])).logits[0, -1].float()
            lp = torch.log_softmax(logits, dim=-1)
            tok = int(torch.argmax(lp))
            out.append(tok)
            lps.append(float(lp[tok]))
            ids.append(tok)
            if tok == eos:
                break
    return out, lps


def hf_logprobs(model: transformers.PreTrainedModel, prompt_ids: list[int], completion: list[int],
                temperature: float) -> list[float]:
    """Teacher-forced log_softmax(logits / T) of each completion token: the documented convention."""
    ids = torch.tensor([[int(x) for x in prompt_ids] + [int(x) for x in completion]])  # ids arrive as uint32 arrays
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt_ids) - 1:-1].float()
    lp = torch.log_softmax(logits / temperature, dim=-1)
    return [float(lp[i, t]) for i, t in enumerate(completion)]


def engine_vs_hf(engine: object, model: transformers.PreTrainedModel) -> tuple[bool, float]:
    """(greedy tokens all equal, max |logprob difference| over matching prefixes)."""
    got = engine.greedy(PROMPTS, max_tokens=MAX_TOKENS)  # type: ignore[attr-defined]
    same, worst = True, 0.0
    for prompt, comp in zip(PROMPTS, got):
        ids = engine.encode(prompt, chat_template=False)  # type: ignore[attr-defined]
        want, want_lps = hf_greedy(model, ids, MAX_TOKENS, engine.tokenizer.eos_token_id)  # type: ignore[attr-defined]
        same = same and want == comp.token_ids.tolist()
        n = next((i for i, (a, b) in enumerate(zip(want, comp.token_ids)) if a != b), min(len(want), len(comp.token_ids)))
        if n == 0:
            return False, float("inf")
        worst = max(worst, max(abs(a - b) for a, b in zip(want_lps[:n], comp.logprobs[:n])))
    return same, worst


# ---------------------------------------------------------------- into the real engine


@pytest.mark.vllm
def test_sync_makes_engine_match_trainer(weight_sync: object, tiny_engine: object, tiny_model_dir: object) -> None:
    model = trainer_model(tiny_model_dir, noise_seed=1)
    assert len(PROMPTS[0].text) > 2 * 32  # fills prefix-cache blocks (32 tokens) that must not survive the sync
    same, worst = engine_vs_hf(tiny_engine, model)
    assert not (same and worst < ATOL), "the perturbed model must differ from the engine's before the sync"

    sent, got = weight_sync.sync(model.named_parameters(), version=1)  # type: ignore[attr-defined]

    same, worst = engine_vs_hf(tiny_engine, model)
    assert same, "greedy tokens differ from the trainer's model after the sync"
    assert worst < ATOL, f"logprobs differ by {worst}"
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())  # tied embedding counted once
    assert sent.version == got.version == 1
    assert sent.bytes == got.bytes == param_bytes
    assert sent.tensors == len(list(model.parameters())) and sent.buckets >= 1
    assert sent.seconds > 0 and sent.gb_per_s > 0


@pytest.mark.vllm
def test_tied_head_needs_the_refresh(weight_sync: object, tiny_engine: object, tiny_model_dir: object) -> None:
    assert transformers.AutoConfig.from_pretrained(tiny_model_dir).tie_word_embeddings
    model = trainer_model(tiny_model_dir, noise_seed=2)
    weight_sync.sync(model.named_parameters(), version=2, refresh_tied=False)  # type: ignore[attr-defined]
    same, worst = engine_vs_hf(tiny_engine, model)
    assert not (same and worst < ATOL), "without the refresh the tied lm_head should be stale"
    weight_sync.sync(model.named_parameters(), version=3)  # type: ignore[attr-defined]
    same, worst = engine_vs_hf(tiny_engine, model)
    assert same and worst < ATOL, f"after the refresh: tokens equal={same}, logprob diff {worst}"


@pytest.mark.vllm
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_logprobs_follow_the_convention(weight_sync: object, tiny_engine: object, tiny_model_dir: object,
                                                temperature: float) -> None:
    model = trainer_model(tiny_model_dir, noise_seed=4)
    weight_sync.sync(model.named_parameters(), version=4)  # type: ignore[attr-defined]
    out = tiny_engine.generate(PROMPTS[:2], n=3, max_tokens=MAX_TOKENS,  # type: ignore[attr-defined]
                               temperature=temperature, seed=11, chat_template=False)
    for prompt_ids, comps in out:
        for c in comps:
            want = hf_logprobs(model, prompt_ids, c.token_ids, temperature)
            assert max(abs(a - b) for a, b in zip(want, c.logprobs)) < ATOL


FRESH_ENGINE = textwrap.dedent("""
    import json, pathlib, sys
    from kubeforge.api import rljob
    from kubeforge.runtime import types
    from kubeforge.runtime.generator import engine
    folder, texts, max_tokens = pathlib.Path(sys.argv[1]), json.loads(sys.argv[2]), int(sys.argv[3])
    eng = engine.Engine(model_dir=folder, dtype="float32", seed=0, role=rljob.GeneratorRole(kv_cache_gib=1))
    out = eng.greedy([types.Prompt(index=i, text=t, answer="") for i, t in enumerate(texts)], max_tokens=max_tokens)
    print("FRESH " + json.dumps([[c.token_ids.tolist(), c.logprobs.tolist()] for c in out]), flush=True)
    eng.close()
""")


def fresh_engine_greedy(folder: object) -> list[tuple[list[int], list[float]]]:
    """Greedy tokens and logprobs of PROMPTS from a vLLM engine started fresh on ``folder`` (its own process)."""
    done = subprocess.run([sys.executable, "-c", FRESH_ENGINE, str(folder), json.dumps([p.text for p in PROMPTS]),
                           str(MAX_TOKENS)], capture_output=True, text=True, timeout=1200,
                          env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"})
    line = next((x for x in done.stdout.splitlines() if x.startswith("FRESH ")), None)
    assert line is not None, done.stderr[-3000:]
    return [(ids, lps) for ids, lps in json.loads(line[len("FRESH "):])]


def engine_greedy(engine: object) -> list[tuple[list[int], list[float]]]:
    return [(c.token_ids.tolist(), c.logprobs.tolist())
            for c in engine.greedy(PROMPTS, max_tokens=MAX_TOKENS)]  # type: ignore[attr-defined]


def save_model(model: transformers.PreTrainedModel, source: pathlib.Path, dest: pathlib.Path) -> pathlib.Path:
    """``model``'s weights as a model folder (tokenizer and generation config copied from ``source``)."""
    model.save_pretrained(dest)
    for f in source.iterdir():
        if f.name.startswith(("tokenizer", "generation_config")):
            shutil.copy(f, dest / f.name)
    return dest


def start_send(weight_sync: object, named: list[tuple[str, torch.Tensor]], version: int) -> threading.Thread:
    """The trainer's side of one sync, in a thread (it returns once the engine acked the receive)."""
    sender = weight_sync.sender  # type: ignore[attr-defined]
    t = threading.Thread(target=sender.send, args=(named,), kwargs={"version": version}, daemon=True)
    t.start()
    return t


@pytest.mark.vllm
def test_swap_reload_equals_a_fresh_engine_and_spares_the_batches_before_it(
        weight_sync: object, tiny_engine: object, tiny_model_dir: pathlib.Path, tmp_path: pathlib.Path) -> None:
    """The new weights are received and their kernels built in the background while the engine keeps serving the
    old ones (every batch until ``receive_weights`` equals the old weights' output, also once the build is done);
    after the swap, greedy tokens and logprobs equal those of an engine started fresh from the same weights."""
    model = trainer_model(tiny_model_dir, noise_seed=9)
    old = engine_greedy(tiny_engine)
    sending = start_send(weight_sync, [(n, p.detach()) for n, p in model.named_parameters()], version=9)
    during = engine_greedy(tiny_engine)                 # while the sync lands and builds (or just after)
    deadline = time.monotonic() + 120
    while not tiny_engine.weights_staged():            # type: ignore[attr-defined]
        assert time.monotonic() < deadline, "the sync did not arrive"
        assert engine_greedy(tiny_engine) == old
        time.sleep(0.05)
    staged = engine_greedy(tiny_engine)                 # received and built, not swapped in yet
    stats = tiny_engine.receive_weights()               # type: ignore[attr-defined]
    sending.join(60)
    assert during == old and staged == old, "a batch before the swap saw the new weights"
    assert stats.swapped and stats.version == 9 and stats.prepare_seconds > 0
    fresh = fresh_engine_greedy(save_model(model, tiny_model_dir, tmp_path / "v9"))
    got = engine_greedy(tiny_engine)
    assert [ids for ids, _ in got] == [ids for ids, _ in fresh] != [ids for ids, _ in old]
    worst = max(abs(a - b) for (_, x), (_, y) in zip(got, fresh) for a, b in zip(x, y))
    assert worst <= 1e-5, f"logprobs differ from a fresh engine's by {worst}"


def _named(model: transformers.PreTrainedModel) -> list[tuple[str, torch.Tensor]]:
    return [(n, p.detach()) for n, p in model.named_parameters()]


BAD_SYNCS = {
    "wrong shape": (lambda named: [(n, t[:-1] if n == "model.norm.weight" else t) for n, t in named],
                    "model.norm.weight"),
    "unknown name": (lambda named: [*named, ("model.layers.7.mlp.extra.weight", torch.ones(4, 4))],
                     "model.layers.7.mlp.extra.weight"),
    "integer dtype": (lambda named: [(n, t.to(torch.int64) if n == "model.norm.weight" else t) for n, t in named],
                      "'model.norm.weight' has dtype torch.int64"),
    "missing weight": (lambda named: [(n, t) for n, t in named if n != "model.norm.weight"],
                       "lacks 1 of the model's weights: model.norm.weight"),
    "sent twice": (lambda named: [*named, (named[1][0], named[1][1].clone())],   # a clone: the sender dedups storage
                   "'model.layers.0.self_attn.q_proj.weight' is sent twice"),
}


@pytest.mark.vllm
def test_a_sync_that_does_not_fit_is_refused_and_the_engine_keeps_its_weights(
        weight_sync: object, tiny_engine: object, tiny_model_dir: pathlib.Path) -> None:
    """Each bad sync (wrong shape, unknown name, integer dtype, a weight missing) is received, fails its build in the
    background and is refused by ``receive_weights`` with an error naming what is wrong; the engine keeps serving
    the weights it had, whole; the next good sync loads."""
    model = trainer_model(tiny_model_dir, noise_seed=10)
    weight_sync.sync(model.named_parameters(), version=10)  # type: ignore[attr-defined]
    before = engine_greedy(tiny_engine)
    bad = trainer_model(tiny_model_dir, noise_seed=11)
    for version, case in enumerate(sorted(BAD_SYNCS), start=11):
        change, says = BAD_SYNCS[case]
        sending = start_send(weight_sync, change(_named(bad)), version=version)
        with pytest.raises(weightsync.WeightSyncError, match="refused, the engine keeps its weights") as refused:
            tiny_engine.receive_weights()  # type: ignore[attr-defined]
        sending.join(60)
        assert says in str(refused.value), case
        assert engine_greedy(tiny_engine) == before, f"a refused sync ({case}) changed the engine's weights"
    _, got = weight_sync.sync(_named(bad), version=20)  # type: ignore[attr-defined]
    assert got.swapped
    same, worst = engine_vs_hf(tiny_engine, bad)
    assert same and worst < ATOL, "the next good sync did not load"


@pytest.mark.vllm
def test_the_shadow_builds_each_layer_as_soon_as_its_tensors_are_loaded(
        weight_sync: object, tiny_engine: object, tiny_model_dir: pathlib.Path) -> None:
    """The build is pipelined with the wire: each layer's kernel is built once its tensors are loaded, while later
    tensors are still to come (none is left for after the load but the vocabulary's, whose padding rows are never
    loaded), from that layer's whole new weights (the fused QKV
    kernel computes with q, k and v of this sync); the tied lm_head shares the embedding's kernel. The shadow is
    made after an in-place reload, which leaves vLLM's buffering loaders on the recorded metadata (copied as they
    were, they dropped every load: the kernels would have been built from stale tensors)."""
    from kubeforge.runtime.generator import swap_reload as shadow_mod

    model = trainer_model(tiny_model_dir, noise_seed=12)
    weight_sync.sync(model.named_parameters(), version=12, refresh_tied=False)  # type: ignore[attr-defined]
    named = _named(model)
    sd = dict(named)
    attn = "model.layers.0.self_attn."
    qkv_w = torch.cat([sd[attn + "q_proj.weight"], sd[attn + "k_proj.weight"], sd[attn + "v_proj.weight"]])
    x = torch.randn(3, qkv_w.shape[1], generator=torch.Generator().manual_seed(0))

    def probe(worker: object) -> dict[str, object]:
        live = worker.model_runner.get_model()  # type: ignore[attr-defined]
        sh = shadow_mod.ShadowModel(live)       # a shadow of its own: the extension's stays as it is
        built_before: list[int] = []

        def weights(items: list[tuple[str, torch.Tensor]]) -> object:
            for n, t in items:
                built_before.append(len(sh._done))
                yield n, t

        sh.build(weights(named))
        qkv = sh._shadows[id(live.model.layers[0].self_attn.qkv_proj)]
        out = {"built_before": list(built_before), "late": sh.late_layers, "layers": len(sh.processed),
               "qkv": qkv.quant_method.apply(qkv, x),
               "shared": sh._shadows[id(live.lm_head)].__dict__["cpu_linear"]
               is sh._shadows[id(live.model.embed_tokens)].__dict__["cpu_linear"]}
        return out

    got = tiny_engine.llm.collective_rpc(probe)[0]  # type: ignore[attr-defined]
    assert set(got["late"]) <= {"VocabParallelEmbedding", "ParallelLMHead"}, got["late"]
    assert got["built_before"][-1] >= got["layers"] - len(got["late"]) - 4, got["built_before"]
    assert torch.allclose(got["qkv"], x @ qkv_w.T, atol=1e-4)
    assert got["shared"], "the tied lm_head packed the embedding's weight again"


@pytest.mark.vllm
def test_later_syncs_of_a_layout_land_in_the_shadow_and_serve_what_an_in_place_reload_serves(
        weight_sync: object, tiny_engine: object, tiny_model_dir: pathlib.Path) -> None:
    """The first sync of a layout records the loaders' copies: the shadow tensors that are identity copies of the
    receive buffers become views of them (no copy of their own), and later syncs of that layout hand the loaders
    only the other tensors (here the fused QKV, whose pieces lie between their biases, and the padded embedding),
    building each aliased layer once its last tensor has landed. What such a sync serves, full or as a delta, is
    bit for bit what vLLM's in-place reload of the same weights serves, and equals the trainer's model."""
    sender = weight_sync.sender  # type: ignore[attr-defined]
    bucket_bytes, delta = sender.bucket_bytes, sender.delta
    sender.bucket_bytes, sender.delta = 64 << 20, True   # one bucket: a fused layer's pieces lie back to back

    def sync(model: transformers.PreTrainedModel, version: int, *, swap: bool = True) -> weightsync.SyncStats:
        flight = sender.start(_named(model), version=version)
        got = tiny_engine.receive_weights(swap=swap)  # type: ignore[attr-defined]
        flight.result(60)
        return got  # type: ignore[no-any-return]

    try:
        first, second = trainer_model(tiny_model_dir, noise_seed=13), trainer_model(tiny_model_dir, noise_seed=14)
        assert sync(first, 30).swapped
        learned = tiny_engine.llm.collective_rpc(_shadow_state)[0]  # type: ignore[attr-defined]
        assert not learned["replayed"] and 0 < learned["routed"] < learned["entries"], learned
        assert learned["aliased"] > 0 and learned["in_buffers"], learned
        got = sync(second, 31)
        state = tiny_engine.llm.collective_rpc(_shadow_state)[0]  # type: ignore[attr-defined]
        assert got.swapped and state["replayed"] and state["routed"] == learned["routed"], state
        swapped = engine_greedy(tiny_engine)
        sync(second, 32, swap=False)                       # the same weights, through vLLM's in-place reload
        assert engine_greedy(tiny_engine) == swapped
        third = trainer_model(tiny_model_dir, noise_seed=14)
        with torch.no_grad():                              # a few elements change: the next sync is a delta
            third.model.layers[1].mlp.down_proj.weight[:3] += 0.25
            third.model.norm.weight[:5] -= 0.5
        same, worst = engine_vs_hf(tiny_engine, third)
        assert not (same and worst < ATOL), "the change must show in what the engine serves"
        got = sync(third, 33)
        assert got.delta and got.swapped and tiny_engine.llm.collective_rpc(  # type: ignore[attr-defined]
            _shadow_state)[0]["replayed"]
        swapped = engine_greedy(tiny_engine)
        same, worst = engine_vs_hf(tiny_engine, third)
        assert same and worst < ATOL, f"tokens equal={same}, logprob diff {worst}"
        sync(third, 34, swap=False)
        assert engine_greedy(tiny_engine) == swapped
    finally:
        sender.bucket_bytes, sender.delta = bucket_bytes, delta


def _shadow_state(worker: object) -> dict[str, object]:
    """The extension's shadow after its last build: whether it followed a plan, how many received tensors the
    plan routes past the loaders, how many shadow tensors view the receive buffers (and that they do)."""
    shadow, receiver = worker._kf_shadow, worker._kf_receiver  # type: ignore[attr-defined]
    plan = shadow.aliases
    storages = {b.untyped_storage().data_ptr() for b in receiver.buffers.buffers}
    return {"replayed": shadow.replayed, "routed": len(plan.routed) if plan else 0, "entries": len(plan.key[0]) if plan
            else 0, "aliased": len(shadow._aliased),
            "in_buffers": all(t.untyped_storage().data_ptr() in storages for t, _ in shadow._aliased)}


# ---------------------------------------------------------------- gloo only (no engine)


def _tensors() -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    shared = torch.randn(64, 32, generator=g)
    return [("embed.weight", shared), ("a", torch.randn(3, generator=g)), ("big", torch.randn(600, 600, generator=g)),
            ("b16", torch.randn(5, 7, generator=g).to(torch.bfloat16)), ("tied_head.weight", shared),
            ("i", torch.arange(10))]


def _threads_receive(port: int, world: int, got: list[dict[str, torch.Tensor]], errors: list[BaseException],
                     fail_rank: int | None = None) -> list[threading.Thread]:
    def run(rank: int) -> None:
        try:
            r = weightsync.WeightReceiver(host="127.0.0.1", port=port, world_size=world, rank=rank, timeout=20)
            for attempt in range(2):
                box: dict[str, torch.Tensor] = {}

                def load(it: object) -> None:
                    for n, t in it:  # type: ignore[attr-defined]
                        if rank == fail_rank and attempt == 0:
                            raise ValueError("loader broke")
                        box[n] = t.clone()
                try:
                    r.receive(load)
                    got.append(box)
                except weightsync.WeightSyncError as e:
                    errors.append(e)
            r.close()
        except BaseException as e:  # surfaced by the test
            errors.append(e)

    threads = [threading.Thread(target=run, args=(k,), daemon=True) for k in range(1, world)]
    for t in threads:
        t.start()
    return threads


def test_broadcast_reaches_every_receiver_exactly() -> None:
    port, world = free_port(), 3
    got: list[dict[str, torch.Tensor]] = []
    errors: list[BaseException] = []
    threads = _threads_receive(port, world, got, errors)
    sender = weightsync.WeightSender(host="127.0.0.1", port=port, world_size=world, timeout=20, bucket_mb=0.5)
    stats = [sender.send(_tensors(), version=v) for v in (5, 6)]
    for t in threads:
        t.join(timeout=30)
    sender.close()
    assert not errors and len(got) == 4
    want = {n: t for n, t in _tensors() if n != "tied_head.weight"}  # shares storage with embed.weight: sent once
    for box in got:
        assert box.keys() == want.keys()
        assert all(torch.equal(box[n], t) and box[n].dtype == t.dtype for n, t in want.items())
    assert stats[1].version == 6 and stats[0].bytes == sum(t.numel() * t.element_size() for t in want.values())
    assert stats[0].buckets >= 2 and stats[0].gb_per_s > 0


def test_a_failing_loader_is_reported_and_the_group_stays_usable() -> None:
    port, world = free_port(), 3
    got: list[dict[str, torch.Tensor]] = []
    errors: list[BaseException] = []
    threads = _threads_receive(port, world, got, errors, fail_rank=2)
    sender = weightsync.WeightSender(host="127.0.0.1", port=port, world_size=world, timeout=20, bucket_mb=0.5)
    with pytest.raises(weightsync.WeightSyncError, match="1 of 2 receivers failed"):
        sender.send(_tensors(), version=1)
    assert sender.send(_tensors(), version=2).version == 2
    for t in threads:
        t.join(timeout=30)
    sender.close()
    assert len(errors) == 1 and "loader broke" in str(errors[0])
    assert len(got) == 3  # rank 1 twice, rank 2 once (its second attempt)


PEER = textwrap.dedent("""
    import os, sys, time, torch
    from kubeforge.runtime import weightsync as ws
    role, port = sys.argv[1], int(sys.argv[2])
    if role == "receiver":
        r = ws.WeightReceiver(host="127.0.0.1", port=port, world_size=2, rank=1, timeout=30)
        def load(it):
            next(it)
            os._exit(3)  # dies mid-broadcast: buckets still to come
        r.receive(load)
    elif role == "sender-mid":
        s = ws.WeightSender(host="127.0.0.1", port=port, world_size=2, timeout=30, bucket_mb=1)
        s.connect()
        tensors = [(f"w{i}", torch.randn(512, 1024)) for i in range(16)]  # 16 buckets of 2 MiB
        _, _, _, meta = s._plan(ws.metadata._ListStream(tensors), 1)
        ws.announce(s.group)
        s._header(s.group, 1, meta)
        s.group.broadcast(tensors[0][1].reshape(-1).view(torch.uint8))
        time.sleep(1.0)   # bucket 0 has landed: die with 15 still to come
        os._exit(3)
    else:
        s = ws.WeightSender(host="127.0.0.1", port=port, world_size=2, timeout=30, bucket_mb=1)
        s.connect()
        deadline = time.monotonic() + 300
        while not s._store.check(["test/joined"]) and time.monotonic() < deadline:
            time.sleep(0.01)   # the receiver has its group: die now, before sending anything
        os._exit(3)
""")


def _peer(role: str, port: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", PEER, role, str(port)], env={**os.environ})


def _reap(peer: subprocess.Popen[bytes]) -> None:
    try:
        peer.wait(timeout=60)
    except subprocess.TimeoutExpired:
        peer.kill()
        peer.wait()


def _bound(timeout: float) -> float:
    """How long a failing sync may take: its timeout plus slack for a loaded 2-core machine (12.3 s at load average 8
    and 38.7 s at load 20 were seen for a 5 s timeout). Without the timeout gloo waits 30 minutes, so the bound still
    tells the two apart."""
    return 24 * timeout


def test_sender_fails_within_timeout_when_a_receiver_dies() -> None:
    port, timeout = free_port(), 5.0
    peer = _peer("receiver", port)
    sender = weightsync.WeightSender(host="127.0.0.1", port=port, world_size=2, timeout=timeout, join_timeout=60,
                                     bucket_mb=1)
    tensors = [(f"w{i}", torch.randn(512, 1024)) for i in range(16)]  # 16 buckets of 2 MiB
    try:
        start = time.monotonic()
        with pytest.raises(weightsync.WeightSyncError):
            sender.send(tensors, version=1)
        elapsed = time.monotonic() - start
    finally:
        sender.close()
        _reap(peer)
    assert peer.returncode == 3
    assert elapsed < _bound(timeout), f"took {elapsed:.1f}s"


def test_receiver_fails_within_timeout_when_the_sender_dies() -> None:
    """The sender dies once the receiver has joined (it waits for the receiver's mark in the store: dying while
    the receiver was still forming its group made the join fail instead, under load) and before it sends anything;
    the receive fails within its timeout."""
    port, timeout = free_port(), 5.0
    peer = _peer("sender", port)
    try:
        receiver = weightsync.WeightReceiver(host="127.0.0.1", port=port, world_size=2, rank=1, timeout=timeout,
                                             join_timeout=300)
        receiver.group.root.set("test/joined", b"1")  # type: ignore[attr-defined]
        start = time.monotonic()
        with pytest.raises(weightsync.WeightSyncError):
            receiver.receive(lambda it: None)
        elapsed = time.monotonic() - start
        receiver.close()
    finally:
        _reap(peer)
    assert peer.returncode == 3
    assert elapsed < _bound(timeout), f"took {elapsed:.1f}s"


def test_a_sender_dying_mid_sync_fails_the_pipelined_receive_cleanly() -> None:
    """A prefetch prepares the sync while its buckets land; the sender dies after the first of 16. The preparation
    sees a ``WeightSyncError`` from the bucket it waits for (not a misfit of the weights), the prefetch fails with
    it within the timeout, and the staged sync never reaches a load (the engine keeps its weights)."""
    port, timeout = free_port(), 5.0
    peer = _peer("sender-mid", port)
    seen: list[str] = []
    errors: list[BaseException] = []

    def prepare(staged: weightsync.Staged) -> str:
        try:
            seen.extend(name for name, _ in staged.tensors())
        except BaseException as e:
            errors.append(e)
            raise
        return "built"

    try:
        receiver = weightsync.WeightReceiver(host="127.0.0.1", port=port, world_size=2, rank=1, timeout=timeout,
                                             join_timeout=300)
        start = time.monotonic()
        receiver.prefetch(prepare)
        with pytest.raises(weightsync.WeightSyncError, match="receive failed on rank 1 after 1 of 16 buckets"):
            receiver.take(timeout=_bound(timeout))
        elapsed = time.monotonic() - start
        receiver.close()
    finally:
        _reap(peer)
    assert peer.returncode == 3
    assert seen == ["w0"] and len(errors) == 1 and isinstance(errors[0], weightsync.WeightSyncError)
    assert elapsed < _bound(timeout), f"took {elapsed:.1f}s"


# ---------------------------------------------------------------- pure parts


@pytest.mark.parametrize(("sizes", "bucket", "want"), [
    ([10, 10, 10], 64, [(0, 0), (0, 16), (0, 32)]),
    ([10, 100, 10], 64, [(0, 0), (1, 0), (2, 0)]),
    ([60, 10], 64, [(0, 0), (1, 0)]),
    ([], 64, []),
])
def test_plan_buckets(sizes: list[int], bucket: int, want: list[tuple[int, int]]) -> None:
    assert weightsync.plan_buckets(sizes, bucket_bytes=bucket) == want


@pytest.mark.parametrize("raw", [
    b"not json", b'{"version": 1}', b'{"version":1,"tensors":[{"name":"x"}],"buckets":[4]}',
    b'{"version":1,"tensors":[{"name":"x","shape":[2],"dtype":"float32","bucket":0,"offset":0}],"buckets":[4]}',
    b'{"version":1,"tensors":[{"name":"x","shape":[1],"dtype":"complex64","bucket":0,"offset":0}],"buckets":[8]}',
    # bounded: a bucket larger than its tensors (the receiver would allocate it), an empty bucket, a huge rank
    b'{"version":1,"tensors":[{"name":"x","shape":[1],"dtype":"float32","bucket":0,"offset":0}],"buckets":[1099511627776]}',
    b'{"version":1,"tensors":[{"name":"x","shape":[1],"dtype":"float32","bucket":0,"offset":0}],"buckets":[4,8]}',
    b'{"version":1,"tensors":[{"name":"x","shape":[1,1,1,1,1,1,1,1,1],"dtype":"float32","bucket":0,"offset":0}],'
    b'"buckets":[4]}',
    b'{"version":1,"tensors":[{"name":"x","shape":[-1],"dtype":"float32","bucket":0,"offset":0}],"buckets":[4]}',
])
def test_malformed_metadata_is_refused(raw: bytes) -> None:
    with pytest.raises(weightsync.WeightSyncError):
        weightsync.decode_meta(raw)


def test_metadata_the_sender_writes_is_accepted() -> None:
    sizes = [40, 8, 100]
    places = weightsync.plan_buckets(sizes, bucket_bytes=64)
    buckets = [0] * (places[-1][0] + 1)
    for (b, off), size in zip(places, sizes):
        buckets[b] = max(buckets[b], off + size)
    entries = [{"name": f"t{i}", "shape": [size // 4], "dtype": "float32", "bucket": b, "offset": off}
               for i, ((b, off), size) in enumerate(zip(places, sizes))]
    raw = weightsync.encode_meta(version=3, entries=entries, bucket_sizes=buckets)
    assert weightsync.decode_meta(raw) == (3, entries, buckets)


def test_rank_layout() -> None:
    assert weightsync.world_size(generators=3, tensor_parallel_size=2) == 7
    assert [weightsync.rank_base(generator_index=g, tensor_parallel_size=2) for g in range(3)] == [1, 3, 5]


def test_epochs_reform_the_group_and_an_abandoned_epoch_ends_its_waiters_at_once() -> None:
    """A receiver that never joins epoch 0 (a generator that died) stalls it; ``reset`` abandons it (a late joiner
    of epoch 0 fails at once instead of waiting its join timeout) and epoch 1 forms with a new member."""
    port, world = free_port(), 2
    sender = weightsync.WeightSender(host="127.0.0.1", port=port, world_size=world, timeout=10, join_timeout=1.0)
    with pytest.raises(weightsync.WeightSyncError, match="within"):
        sender.send(_tensors(), version=1)                      # nobody joined epoch 0
    assert sender.reset() == 1
    started = time.monotonic()
    with pytest.raises(weightsync.WeightSyncError, match="abandoned"):
        weightsync.WeightReceiver(host="127.0.0.1", port=port, world_size=world, rank=1, timeout=10,
                                  join_timeout=60, epoch=0)
    assert time.monotonic() - started < 5
    got: list[dict[str, torch.Tensor]] = []

    def join_epoch_1() -> None:
        r = weightsync.WeightReceiver(host="127.0.0.1", port=port, world_size=world, rank=1, timeout=10,
                                      join_timeout=30, epoch=1)
        box: dict[str, torch.Tensor] = {}
        r.receive(lambda it: box.update({n: t.clone() for n, t in it}))
        got.append(box)
        r.close()

    t = threading.Thread(target=join_epoch_1, daemon=True)
    t.start()
    sender._join_timeout = 30.0
    sender._args["join_timeout"] = 30.0
    stats = sender.send(_tensors(), version=2)
    t.join(timeout=30)
    sender.close()
    assert stats.version == 2 and len(got) == 1 and torch.equal(got[0]["a"], dict(_tensors())["a"])


def _authenticate_pair(key0: bytes, key1: bytes) -> list[BaseException | None]:
    import threading

    import torch.distributed as dist

    store = dist.HashStore()
    store.set_timeout(__import__("datetime").timedelta(seconds=10))
    out: list[BaseException | None] = [None, None]

    def side(rank: int, key: bytes) -> None:
        try:
            weightsync.authenticate(store, rank=rank, world_size=2, key=key)
        except BaseException as e:  # noqa: BLE001 - reported to the test
            out[rank] = e

    threads = [threading.Thread(target=side, args=(r, k)) for r, k in ((0, key0), (1, key1))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return out


def test_the_rendezvous_proves_the_job_key_both_ways() -> None:
    import os as _os

    key = _os.urandom(32)
    assert _authenticate_pair(key, key) == [None, None]
    refused = _authenticate_pair(key, _os.urandom(32))       # a joiner without the key / a store not our trainer's
    assert all(isinstance(e, weightsync.WeightSyncError) for e in refused), refused
    assert "failed rendezvous authentication" in str(refused[0]) and "did not prove the job key" in str(refused[1])


def test_prefetch_waits_between_syncs_in_the_store_not_in_a_collective() -> None:
    """A receiver prefetching in the background waits for the next sync on the epoch's sync count (no collective is
    open between syncs, so a gap longer than the group's timeout breaks nothing), receives it whole and acks it
    before anything is loaded; ``take`` hands it over, the load is timed on its own, and a failing load is an error
    that leaves the group usable for the next prefetch."""
    port, timeout = free_port(), 3.0
    box: dict[str, object] = {}

    def join() -> None:
        box["rx"] = weightsync.WeightReceiver(host="127.0.0.1", port=port, world_size=2, rank=1, timeout=timeout)

    joiner = threading.Thread(target=join, daemon=True)
    joiner.start()
    sender = weightsync.WeightSender(host="127.0.0.1", port=port, world_size=2, timeout=timeout, bucket_mb=0.5)
    sender.connect()
    joiner.join(30)
    rx = box["rx"]
    assert isinstance(rx, weightsync.WeightReceiver)
    want = {n: t for n, t in _tensors() if n != "tied_head.weight"}
    rx.prefetch()
    time.sleep(timeout + 1.0)          # longer than the group's timeout: the prefetch is waiting in the store
    assert not rx.staged
    stats = sender.send(_tensors(), version=1)   # returns once the receiver acked: before any load
    assert stats.version == 1
    staged = rx.take(timeout=30)
    assert staged.version == 1 and rx.seen == 1
    got: dict[str, torch.Tensor] = {}
    loaded = rx.load_staged(staged, lambda it: got.update((n, t.clone()) for n, t in it))
    assert got.keys() == want.keys() and all(torch.equal(got[n], t) for n, t in want.items())
    assert loaded.version == 1 and loaded.bytes == stats.bytes and loaded.receive_seconds > 0

    rx.prefetch()
    sender.send(_tensors(), version=2)

    def broken(it: object) -> None:
        raise ValueError("loader broke")

    with pytest.raises(weightsync.WeightSyncError, match="v2: loading failed: loader broke"):
        rx.load_staged(rx.take(timeout=30), broken)
    rx.prefetch()
    flight = sender.start(_tensors(), version=3)   # the overlapped sender against a prefetching receiver
    assert flight.result(timeout=30).version == 3
    assert rx.receive(lambda it: got.update(it)).version == 3   # receive() loads what was prefetched
    rx.prefetch()
    started = time.monotonic()
    rx.close()                          # a prefetch waiting in the store stops within a poll
    assert time.monotonic() - started < 5
    sender.close()
    with pytest.raises(weightsync.WeightSyncError, match="without prefetch"):
        rx.take()


def test_prefetch_prepares_in_its_thread_and_a_closing_sender_ends_the_wait() -> None:
    """``prefetch(prepare)`` runs ``prepare`` on the staged sync in the background thread after the receive was
    acked; its result or error travels with the staged sync. A sender that closes marks the epoch closed, so a
    receiver waiting in the store stops at once (it does not poll a store about to vanish)."""
    port = free_port()
    box: dict[str, object] = {}
    joiner = threading.Thread(target=lambda: box.update(rx=weightsync.WeightReceiver(
        host="127.0.0.1", port=port, world_size=2, rank=1, timeout=10)), daemon=True)
    joiner.start()
    sender = weightsync.WeightSender(host="127.0.0.1", port=port, world_size=2, timeout=10, bucket_mb=0.5)
    sender.connect()
    joiner.join(30)
    rx = box["rx"]
    assert isinstance(rx, weightsync.WeightReceiver)
    threads: list[str] = []

    def prepare(staged: weightsync.Staged) -> dict[str, torch.Tensor]:
        threads.append(threading.current_thread().name)
        return {n: t.clone() for n, t in staged.tensors()}

    rx.prefetch(prepare)
    sender.send(_tensors(), version=1)
    staged = rx.take(timeout=30)
    want = {n: t for n, t in _tensors() if n != "tied_head.weight"}
    assert threads == ["weightsync-prefetch"] and staged.prepare_error is None and staged.prepare_seconds > 0
    assert staged.prepared.keys() == want.keys() and all(torch.equal(staged.prepared[n], t) for n, t in want.items())
    assert rx.load_staged(staged, lambda it: None).prepare_seconds == staged.prepare_seconds

    def failing(staged: weightsync.Staged) -> None:
        raise ValueError("does not fit")

    rx.prefetch(failing)
    assert sender.send(_tensors(), version=2).version == 2     # the receive itself succeeded and was acked
    staged = rx.take(timeout=30)
    assert staged.version == 2 and staged.prepared is None and isinstance(staged.prepare_error, ValueError)
    rx.prefetch()
    started = time.monotonic()
    sender.close()                      # returns once the polling receiver saw the close (at most 2 s)
    closed = time.monotonic() - started
    with pytest.raises(weightsync.WeightSyncError, match="sender closed"):
        rx.take(timeout=10)
    assert time.monotonic() - started < 10
    assert rx._live is False and closed < weightsync.CLOSE_WAIT_SECONDS + 5
    rx.close()
