"""Trainer checkpoints: exact round trip (weights, optimizer, counters, RNG), crash safety, pruning."""
from __future__ import annotations

import json
import os
import random
from pathlib import Path

import numpy as np
import pytest
import torch

import _trainer_util as util
from kubeforge.runtime.learner import checkpoint, step


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return util.build_tiny(tmp_path_factory.mktemp("tiny") / "model")


def draws() -> tuple[float, float, list[float]]:
    return random.random(), float(np.random.random()), torch.rand(3).tolist()


def test_round_trip_restores_exactly(tiny: Path, tmp_path: Path) -> None:
    a = step.Trainer(model_path=tiny, algorithm=util.algorithm())
    for s in range(2):
        a.train_step(groups=util.synthetic_groups(step=s, prompts=3, group_size=4))
    random.seed(7), np.random.seed(7), torch.manual_seed(7)
    path = a.save_checkpoint(directory=tmp_path, keep=2, data_cursor=6, extra={"note": "x"})
    assert path is not None and checkpoint.latest(tmp_path) == path
    expected = draws()

    b = step.Trainer(model_path=tiny, algorithm=util.algorithm())
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    state = b.resume(directory=tmp_path)
    assert state is not None
    assert (state["step"], state["policy_version"], state["data_cursor"], state["extra"]) == (2, 2, 6, {"note": "x"})
    assert (b.step, b.policy_version) == (2, 2)
    assert draws() == expected                       # RNG: the same next random numbers
    sa, sb = a.model.state_dict(), b.model.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    oa, ob = a.optimizer.state_dict(), b.optimizer.state_dict()
    assert oa["param_groups"] == ob["param_groups"]
    for i, st in oa["state"].items():
        assert all(torch.equal(st[k], ob["state"][i][k]) for k in st)
    # and the next step is bit-identical too
    g = util.synthetic_groups(step=2, prompts=3, group_size=4)
    a.train_step(groups=g), b.train_step(groups=g)
    assert all(torch.equal(x, y) for x, y in zip(a.model.parameters(), b.model.parameters()))


def test_no_checkpoint_means_fresh_start(tiny: Path, tmp_path: Path) -> None:
    t = step.Trainer(model_path=tiny, algorithm=util.algorithm())
    assert t.resume(directory=tmp_path / "missing") is None
    assert t.step == 0


def fake_save(root: Path, step_no: int, keep: int = 10) -> Path:
    return checkpoint.save(root=root, step=step_no, model_state={"w": torch.full((4,), float(step_no))},
                           optimizer_state={"state": {}, "param_groups": []}, state={"step": step_no}, keep=keep)


def test_partial_temp_dir_is_ignored_and_cleaned(tmp_path: Path) -> None:
    good = fake_save(tmp_path, 1)
    tmp = tmp_path / ".tmp-step-000000002-999999-1"      # a dead writer's leftovers
    tmp.mkdir()
    (tmp / "model.pt").write_bytes(b"\x00" * 10)
    assert checkpoint.latest(tmp_path) == good
    fake_save(tmp_path, 3)
    assert not tmp.exists()


def test_missing_marker_never_loads(tmp_path: Path) -> None:
    good = fake_save(tmp_path, 1)
    newest = fake_save(tmp_path, 2)
    (newest / checkpoint.COMPLETE).unlink()              # crashed after the rename, before the marker
    assert checkpoint.latest(tmp_path) == good
    with pytest.raises(checkpoint.CheckpointError, match="COMPLETE"):
        checkpoint.load(newest)
    loaded = checkpoint.load_latest(tmp_path)
    assert loaded is not None and loaded.state == {"step": 1}


def test_crash_before_marker_leaves_previous_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_save(tmp_path, 1)

    def crash(path: Path, text: str) -> None:
        raise KeyboardInterrupt("killed while writing the marker")

    monkeypatch.setattr(checkpoint, "_write_text_atomic", crash)
    with pytest.raises(KeyboardInterrupt):
        fake_save(tmp_path, 2)
    monkeypatch.undo()
    assert (tmp_path / "step-000000002").is_dir()
    assert checkpoint.latest(tmp_path) == tmp_path / "step-000000001"
    fake_save(tmp_path, 2)                               # the retry replaces the incomplete folder
    assert checkpoint.latest(tmp_path) == tmp_path / "step-000000002"


def test_truncated_file_never_loads(tmp_path: Path) -> None:
    good = fake_save(tmp_path, 1)
    newest = fake_save(tmp_path, 2)
    model = newest / checkpoint.MODEL
    os.truncate(model, model.stat().st_size // 2)
    assert checkpoint.latest(tmp_path) == good
    with pytest.raises(checkpoint.CheckpointError, match="size"):
        checkpoint.load(newest)


def test_corrupt_bytes_of_the_right_size_fail_the_checksum(tmp_path: Path) -> None:
    fake_save(tmp_path, 1)
    newest = fake_save(tmp_path, 2)
    data = bytearray((newest / checkpoint.MODEL).read_bytes())
    data[-20] ^= 0xFF
    (newest / checkpoint.MODEL).write_bytes(bytes(data))
    with pytest.raises(checkpoint.CheckpointError, match="checksum"):
        checkpoint.load(newest)
    loaded = checkpoint.load_latest(tmp_path)            # falls back to the older, intact one
    assert loaded is not None and loaded.state == {"step": 1}
    assert torch.equal(loaded.model_state["w"], torch.full((4,), 1.0))


def test_tampered_manifest_is_refused(tmp_path: Path) -> None:
    newest = fake_save(tmp_path, 1)
    m = json.loads((newest / checkpoint.MANIFEST).read_text())
    m[checkpoint.STATE]["sha256"] = "0" * 64
    (newest / checkpoint.MANIFEST).write_text(json.dumps(m))
    with pytest.raises(checkpoint.CheckpointError, match="MANIFEST"):
        checkpoint.load(newest)


def test_keep_prunes_oldest(tmp_path: Path) -> None:
    for s in (5, 10, 15, 20):
        fake_save(tmp_path, s, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-000000015", "step-000000020"]


def test_pickled_objects_are_refused(tmp_path: Path) -> None:
    # weights_only loading: a checkpoint whose model file holds an arbitrary object does not load
    newest = fake_save(tmp_path, 1)
    torch.save({"w": object()}, newest / checkpoint.MODEL)
    size = (newest / checkpoint.MODEL).stat().st_size
    m = json.loads((newest / checkpoint.MANIFEST).read_text())
    m[checkpoint.MODEL] = {"bytes": size, "sha256": checkpoint._sha256(newest / checkpoint.MODEL)}
    (newest / checkpoint.MANIFEST).write_text(json.dumps(m))
    (newest / checkpoint.COMPLETE).write_text(checkpoint._sha256(newest / checkpoint.MANIFEST))
    with pytest.raises(checkpoint.CheckpointError, match="cannot load"):
        checkpoint.load(newest)
