"""``kubeforge role generator`` with a stand-in for the vLLM engine (tests only): the role's real wiring
(``generator.start.main``: sockets, READY, the alive beats, ``Joining``, the loop, the fence, the weight-sync group
joined with a real ``weightsync.WeightReceiver`` at the rank each SYNC names) around an engine that samples no model.
It lets the recovery test kill and restart generators as processes where no vLLM may run. Run with the env contract
of a generator (the launcher's ProcSpec env)."""
from __future__ import annotations

import sys
import time
import types as pytypes
from collections.abc import Sequence
from typing import Any

from kubeforge.runtime import role, types, weightsync

SAMPLE_SECONDS = 0.05      # a batch takes a little time, as an engine's would


class Engine:
    """The part of ``generator.engine.Engine`` that ``generator.start`` uses."""

    def __init__(self, **_: Any) -> None:
        self.start_seconds = 0.0
        self.tokenizer = None
        self.receiver: weightsync.WeightReceiver | None = None

    def generate(self, prompts: Sequence[types.Prompt], *, n: int, **_: Any) -> list[tuple[list[int], Any]]:
        time.sleep(SAMPLE_SECONDS)
        return [([1, 2], [types.Completion(token_ids=[3 + (k + p.index) % 5], logprobs=[-1.5], text="ab"[k % 2])
                          for k in range(n)]) for p in prompts]

    def join_weight_sync(self, *, host: str, port: int, world_size: int, rank_base: int, timeout: float,
                         backend: str, epoch: int, join_timeout: float) -> list[int]:
        self.leave_weight_sync()
        self.receiver = weightsync.WeightReceiver(host=host, port=port, world_size=world_size, rank=rank_base,
                                                  epoch=epoch, backend=backend, timeout=timeout,
                                                  join_timeout=join_timeout)
        return [rank_base]

    def receive_weights(self) -> weightsync.SyncStats:
        assert self.receiver is not None
        return self.receiver.receive(lambda tensors: [None for _ in tensors])

    def leave_weight_sync(self) -> None:
        if self.receiver is not None:
            self.receiver.close()
            self.receiver = None

    def close(self) -> None:
        self.leave_weight_sync()


def main() -> int:
    fake = pytypes.ModuleType("kubeforge.runtime.generator.engine")
    fake.Engine = Engine  # type: ignore[attr-defined]
    sys.modules["kubeforge.runtime.generator.engine"] = fake
    for name in ("vllm_steps",):       # imported by generator.start; only partial rollouts use it
        sys.modules[f"kubeforge.runtime.generator.{name}"] = pytypes.ModuleType(name)
    return role.run(role="generator")


if __name__ == "__main__":
    sys.exit(main())
