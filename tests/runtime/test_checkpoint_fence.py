"""The checkpoint store's fence (docs/fencing.md): two trainer epochs writing one store, in every order that matters,
and crashes in the middle of a commit. Nothing here mocks the filesystem: the interleavings are made by running one
writer's steps between another's."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import _trainer_util as util
from kubeforge.runtime.learner import checkpoint, fence, step


def save(root: Path, step_no: int, epoch: int) -> Path:
    return checkpoint.save(root=root, step=step_no, model_state={"w": torch.full((4,), float(step_no + 100 * epoch))},
                           optimizer_state={"state": {}, "param_groups": []}, state={"step": step_no}, keep=10,
                           epoch=epoch)


def newest(root: Path) -> tuple[int, int] | None:
    """(step, epoch) of the checkpoint a resume would load, checked to load."""
    loaded = checkpoint.load_latest(root)
    if loaded is None:
        return None
    w = float(loaded.model_state["w"][0])
    assert w == loaded.state["step"] + 100 * fence.epoch_of(loaded.path)
    return loaded.state["step"], fence.epoch_of(loaded.path)


def test_a_stale_epoch_cannot_commit_once_a_newer_one_claimed(tmp_path: Path) -> None:
    save(tmp_path, 5, epoch=1)
    save(tmp_path, 10, epoch=1)
    assert fence.claim(tmp_path, epoch=2, resumed_from=10) == fence.Claim(epoch=2, resumed_from=10)
    with pytest.raises(checkpoint.Fenced, match="epoch 1"):
        save(tmp_path, 15, epoch=1)
    assert not (tmp_path / checkpoint.dir_name(15)).exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(checkpoint.TMP_PREFIX)]
    assert fence.count(tmp_path) == 1 and newest(tmp_path) == (10, 1)
    with pytest.raises(checkpoint.Fenced):
        save(tmp_path, 15, epoch=0)       # an unfenced writer is older than every epoch
    assert fence.count(tmp_path) == 2
    save(tmp_path, 15, epoch=2)
    assert newest(tmp_path) == (15, 2)


def test_a_stale_trainer_is_refused_at_start_and_a_restart_in_place_keeps_its_first_claim(tmp_path: Path) -> None:
    assert fence.claim(tmp_path, epoch=0, resumed_from=0) is None and not (tmp_path / fence.DIR).exists()
    fence.claim(tmp_path, epoch=2, resumed_from=10)
    with pytest.raises(fence.Fenced, match="epoch 2 claimed"):
        fence.claim(tmp_path, epoch=1, resumed_from=10)
    # epoch 2 restarted in place after committing 20: what it made invisible at 10 stays invisible
    assert fence.claim(tmp_path, epoch=2, resumed_from=20) == fence.Claim(epoch=2, resumed_from=10)
    assert fence.claim(tmp_path, epoch=3, resumed_from=20) == fence.Claim(epoch=3, resumed_from=20)


def run_between(monkeypatch: pytest.MonkeyPatch, name: str, act: Callable[[], Any]) -> None:
    """Run ``act`` (the other writer) once, just before ``checkpoint.<name>`` runs for the writer under test."""
    real = getattr(checkpoint, name)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        monkeypatch.setattr(checkpoint, name, real)
        act()
        return real(*args, **kwargs)
    monkeypatch.setattr(checkpoint, name, wrapped)


def test_a_stale_commit_that_passed_the_check_before_the_claim_is_never_read(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    save(tmp_path, 10, epoch=1)
    # epoch 2 claims between epoch 1's check and its rename: the rename lands, the check after it refuses
    run_between(monkeypatch, "_publish", lambda: fence.claim(tmp_path, epoch=2, resumed_from=10))
    with pytest.raises(checkpoint.Fenced, match="during the commit"):
        save(tmp_path, 15, epoch=1)
    assert (tmp_path / checkpoint.dir_name(15) / checkpoint.COMPLETE).exists()   # published, but
    assert newest(tmp_path) == (10, 1) and checkpoint.latest(tmp_path) == tmp_path / checkpoint.dir_name(10)
    assert fence.count(tmp_path) == 1
    # epoch 2 then commits the same step: the stale folder is moved aside (counted once), its own takes the name
    save(tmp_path, 15, epoch=2)
    assert newest(tmp_path) == (15, 2) and fence.count(tmp_path) == 1


def test_a_stale_commit_is_recorded_even_when_its_writer_died_before_its_own_check(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    save(tmp_path, 10, epoch=1)

    def die(*args: Any, **kwargs: Any) -> None:
        raise KeyboardInterrupt("killed after its rename and marker")
    run_between(monkeypatch, "_publish", lambda: fence.claim(tmp_path, epoch=2, resumed_from=10))
    monkeypatch.setattr(checkpoint, "prune", die)
    monkeypatch.setattr(fence, "valid", lambda found, **kw: True)     # its own check after the rename passes...
    with pytest.raises(KeyboardInterrupt):
        save(tmp_path, 15, epoch=1)                                   # ...and it dies before pruning
    monkeypatch.undo()
    assert fence.count(tmp_path) == 0 and newest(tmp_path) == (10, 1)
    save(tmp_path, 20, epoch=2)                                       # epoch 2's prune finds and records it
    assert fence.count(tmp_path) == 1 and newest(tmp_path) == (20, 2)


def test_a_stale_writer_never_replaces_or_deletes_a_newer_epochs_folder(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    fence.claim(tmp_path, epoch=2, resumed_from=0)
    save(tmp_path, 15, epoch=2)
    monkeypatch.setattr(fence, "newer", lambda root, epoch: [])       # as if epoch 1 checked before the claim
    with pytest.raises(checkpoint.Fenced, match="epoch 2 committed this step"):
        save(tmp_path, 15, epoch=1)
    monkeypatch.undo()
    assert newest(tmp_path) == (15, 2)


def test_markers_are_never_replaced_by_a_displaced_writer(tmp_path: Path) -> None:
    """Epoch 1 renamed its step 15, epoch 2 displaced it and published its own; epoch 1's marker comes late."""
    fence.claim(tmp_path, epoch=2, resumed_from=10)
    stale = checkpoint.begin(root=tmp_path, step=15)
    torch.save({"w": torch.zeros(4)}, stale / checkpoint.MODEL)
    torch.save({}, stale / checkpoint.OPTIMIZER)
    (stale / checkpoint.STATE).write_text("{}")
    (stale / checkpoint.MANIFEST).write_text("{}")
    stale_mark = checkpoint._sha256(stale / checkpoint.MANIFEST)
    final = checkpoint._publish(stale, root=tmp_path, step=15, epoch=1)
    save(tmp_path, 15, epoch=2)                                       # displaces it, marks its own
    with pytest.raises(checkpoint.CheckpointError, match="displaced"):
        checkpoint._mark(final, stale_mark)
    assert newest(tmp_path) == (15, 2)


def test_a_marker_linked_first_by_a_displaced_writer_is_replaced_by_the_folders_owner(tmp_path: Path,
                                                                                     monkeypatch: pytest.MonkeyPatch
                                                                                     ) -> None:
    fence.claim(tmp_path, epoch=2, resumed_from=10)
    final = tmp_path / checkpoint.dir_name(15)
    # the displaced writer's late marker lands in epoch 2's folder between its rename and its own marker
    run_between(monkeypatch, "_mark", lambda: (final / checkpoint.COMPLETE).write_text("0" * 64 + "\n"))
    save(tmp_path, 15, epoch=2)
    assert newest(tmp_path) == (15, 2)


def test_a_crash_mid_commit_leaves_the_previous_checkpoint_and_the_retry_or_the_new_epoch_replaces_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fence.claim(tmp_path, epoch=1, resumed_from=0)
    save(tmp_path, 5, epoch=1)

    def crash(path: Path, text: str) -> None:
        raise KeyboardInterrupt("killed while writing the marker")
    monkeypatch.setattr(checkpoint, "_write_text_atomic", crash)
    with pytest.raises(KeyboardInterrupt):
        save(tmp_path, 10, epoch=1)
    monkeypatch.undo()
    assert (tmp_path / checkpoint.dir_name(10)).is_dir() and newest(tmp_path) == (5, 1)
    # the same epoch restarted in place retries the step: the incomplete folder is replaced, nothing counted
    save(tmp_path, 10, epoch=1)
    assert newest(tmp_path) == (10, 1) and fence.count(tmp_path) == 0
    # a crash of epoch 1 mid-commit, then epoch 2 resumes from 10 and commits the same step number
    monkeypatch.setattr(checkpoint, "_write_text_atomic", crash)
    with pytest.raises(KeyboardInterrupt):
        save(tmp_path, 15, epoch=1)
    monkeypatch.undo()
    fence.claim(tmp_path, epoch=2, resumed_from=10)
    save(tmp_path, 15, epoch=2)
    assert newest(tmp_path) == (15, 2) and fence.count(tmp_path) == 0   # an incomplete folder was no write


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return util.build_tiny(tmp_path_factory.mktemp("tiny") / "model")


def test_trainers_of_two_epochs_the_old_one_refused_at_its_commit_and_at_its_restart(tiny: Path,
                                                                                     tmp_path: Path) -> None:
    old = step.Trainer(model_path=tiny, algorithm=util.algorithm(), trainer_epoch=1)
    assert old.resume(directory=tmp_path) is None
    old.train_step(groups=util.synthetic_groups(step=0, prompts=2, group_size=4))
    old.save_checkpoint(directory=tmp_path, keep=3, data_cursor=1)
    new = step.Trainer(model_path=tiny, algorithm=util.algorithm(), trainer_epoch=2)
    state = new.resume(directory=tmp_path)
    assert state is not None and new.step == 1
    old.train_step(groups=util.synthetic_groups(step=1, prompts=2, group_size=4))
    with pytest.raises(checkpoint.Fenced):
        old.save_checkpoint(directory=tmp_path, keep=3, data_cursor=2)
    new.train_step(groups=util.synthetic_groups(step=1, prompts=2, group_size=4))
    path = new.save_checkpoint(directory=tmp_path, keep=3, data_cursor=2)
    assert path is not None and checkpoint.latest(tmp_path) == path and fence.epoch_of(path) == 2
    assert fence.count(tmp_path) == 1
    again = step.Trainer(model_path=tiny, algorithm=util.algorithm(), trainer_epoch=1)
    with pytest.raises(fence.Fenced):
        again.resume(directory=tmp_path)
