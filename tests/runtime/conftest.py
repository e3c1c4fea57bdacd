"""Shared fixtures of the runtime tests: the tiny model folder and ONE vLLM engine per test session.

The engine runs inside the pytest process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, set by ``generator.engine``):
no ``__main__`` guard is needed and ``collective_rpc`` is a direct call. Starting it costs about a minute on two
cores, so every test marked ``vllm`` shares :func:`tiny_engine`. Tests that change its weights must put the
original ones back (``weight_sync`` does so at the end of the session) so test order never matters.

:func:`weight_sync` joins that engine to a weight-sync group whose sender (trainer rank 0) lives in this process
too; :func:`sync_into` drives one sync: the sender broadcasts from a thread while the engine receives on the main
thread (gloo releases the GIL while it waits).
"""
from __future__ import annotations

import pathlib
import socket
import threading
from collections.abc import Iterable, Iterator

import pytest
import torch

from kubeforge.api import rljob
from kubeforge.runtime import models, weightsync


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def tiny_model_dir() -> pathlib.Path:
    return models.resolve(rljob.ModelSpec(builtin="tiny"))


@pytest.fixture(scope="session")
def tiny_engine(tiny_model_dir: pathlib.Path) -> Iterator[object]:
    from kubeforge.runtime.generator import engine

    eng = engine.Engine(model_dir=tiny_model_dir, dtype="float32", seed=0,
                        role=rljob.GeneratorRole(kv_cache_gib=1))
    yield eng
    eng.close()


class SyncPair:
    """A trainer-side sender joined with the shared engine (world size 2)."""

    def __init__(self, sender: weightsync.WeightSender, eng: object) -> None:
        self.sender, self.engine = sender, eng

    def sync(self, named: Iterable[tuple[str, torch.Tensor]], *, version: int,
             refresh_tied: bool = True) -> tuple[weightsync.SyncStats, weightsync.SyncStats]:
        """Send from a thread, receive into the engine here; (sender stats, engine stats)."""
        named = list(named)
        box: dict[str, object] = {}

        def send() -> None:
            try:
                box["stats"] = self.sender.send(named, version=version)
            except BaseException as e:  # re-raised on the test thread
                box["error"] = e

        t = threading.Thread(target=send, daemon=True)
        t.start()
        got = self.engine.receive_weights(refresh_tied=refresh_tied)  # type: ignore[attr-defined]
        t.join(timeout=60)
        if "error" in box:
            raise box["error"]  # type: ignore[misc]
        return box["stats"], got  # type: ignore[return-value]


@pytest.fixture(scope="session")
def weight_sync(tiny_engine: object, tiny_model_dir: pathlib.Path) -> Iterator[SyncPair]:
    import transformers

    port = free_port()
    # small buckets: the tiny model travels in ~12, so the engine tests go through the pipelined build
    sender = weightsync.WeightSender(host="127.0.0.1", port=port, world_size=2, timeout=60, bucket_mb=0.125)
    joiner = threading.Thread(target=sender.connect, daemon=True)
    joiner.start()
    tiny_engine.join_weight_sync(host="127.0.0.1", port=port, world_size=2,  # type: ignore[attr-defined]
                                 rank_base=1, timeout=60)
    joiner.join(timeout=60)
    pair = SyncPair(sender, tiny_engine)
    yield pair
    original = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    pair.sync(original.named_parameters(), version=0)  # leave the shared engine as we found it
    sender.close()
    tiny_engine.leave_weight_sync()  # type: ignore[attr-defined]
