"""Export on request (``trainer/export_requests.py``): a request seen by trainer rank 0 after a step makes every
rank export the current policy as an HF folder; the step's record names it; a request is served once. The real loop
runs in process (real HF model, real generator and verifier loops over in-memory transport), as in
test_roles_inprocess."""
from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping
from pathlib import Path

import safetensors.torch

import test_roles_inprocess as rp
from kubeforge.api import contract, progress
from kubeforge.runtime import transport
from kubeforge.runtime.trainer import export_requests as exports, report


def test_a_request_during_the_run_exports_that_step_once(tmp_path: Path) -> None:
    spec_job = rp.job(steps=3)
    n = next(rp._ids)
    loaders: list[rp.CopyWeights] = []
    a, stop, recv = rp._serve(spec_job, f"exp{n}", loaders)
    loop = rp._loop(tmp_path, spec_job, recv[2], deadline=60, reissue_after=30,
                    generators=transport.open_sender([a["gen"]], role="trainer", index=0), control=recv[3])
    loaders[0].learner = loop.learner  # type: ignore[assignment]
    requests = exports.ListRequests()
    assert loop.rank0 is not None
    loop.rank0.exports = requests
    train = loop.learner.train_step

    def train_then_ask(**kw: object) -> object:
        out = train(**kw)  # type: ignore[arg-type]
        if loop.learner.step == 1:
            requests.queue.append("r1")          # asked while step 1 trains: served right after it
        return out

    loop.learner.train_step = train_then_ask  # type: ignore[method-assign]
    loop.run()
    stop.set()
    for r in recv:
        r.close()
    records = [json.loads(x) for x in (tmp_path / "m.jsonl").read_text().splitlines()]
    served = [r for r in records if r.get("export_request")]
    assert [(r["step"], r["export_request"]) for r in served] == [(1, "r1")] and requests.done == ["r1"]
    folder = Path(served[0]["export"])
    assert folder.name == "export-step-000000001" and (folder / "config.json").is_file()
    weights = safetensors.torch.load_file(str(next(folder.glob("*.safetensors"))))
    assert weights and all(t.isfinite().all() for t in weights.values())
    assert sorted(p.name for p in (tmp_path / "ckpt").glob("export-*")) == ["export-step-000000001",
                                                                             "export-step-000000003"]


def test_file_requests_are_served_once_and_the_cli_waits_for_the_record(tmp_path: Path) -> None:
    reqs = exports.FileRequests(tmp_path)
    assert reqs.pending() is None
    rid = exports.request(tmp_path)
    assert reqs.pending() == rid
    reqs.served(rid)
    assert reqs.pending() is None and exports.FileRequests(tmp_path).pending() is None   # also after a restart
    (tmp_path / "metrics.jsonl").write_text("")
    out: list[int] = []
    t = threading.Thread(target=lambda: out.append(exports.cli(run_dir=str(tmp_path), wait_s=30, poll_s=0.05)))
    t.start()
    deadline = time.monotonic() + 10
    while (new := exports.FileRequests(tmp_path).pending()) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"step": 4, "export": "/x/export-step-000004", "export_request": new}) + "\n")
    t.join(10)
    assert out == [0]
    assert exports.cli(run_dir=str(tmp_path / "nope"), wait_s=0) == 2


def test_pod_annotation_request_and_last_export_on_the_progress_annotation() -> None:
    class Api:          # a podapi.Pod
        def __init__(self) -> None:
            self.current: dict[str, str] = {}
            self.patches: list[dict[str, str]] = []

        def annotations(self) -> dict[str, str]:
            return dict(self.current)

        def patch_annotations(self, annotations: Mapping[str, str]) -> None:
            self.patches.append(dict(annotations))

    api = Api()
    reqs = exports.PodAnnotationRequests(pod="j-trainer-0", namespace="ns", api=api)
    assert reqs.pending() is None
    api.current = {contract.ANNOTATION_EXPORT_REQUEST: "a"}
    assert reqs.pending() == "a"
    reqs.served("a")
    assert reqs.pending() is None
    rep = report.PodAnnotationReporter(pod="j-trainer-0", namespace="ns", api=api)
    rep.step(progress.StepRecord(**{"step": 3, "mean_reward": 0.5, "policy_version": 3, "export": "/c/export-step-000003",
              "export_request": "a"}))
    rep.step(progress.StepRecord(**{"step": 4, "mean_reward": 0.6, "policy_version": 4}))
    last = json.loads(api.patches[-1][contract.ANNOTATION_PROGRESS])
    assert last["step"] == 4 and last["lastExport"] == {"request": "a", "path": "/c/export-step-000003", "step": 3}
    # a restarted container of the same pod (new process, nothing in memory) does not serve "a" again: its pod's
    # progress annotation says it was served; a newer request still counts
    api.current = {contract.ANNOTATION_EXPORT_REQUEST: "a",
                   contract.ANNOTATION_PROGRESS: api.patches[-1][contract.ANNOTATION_PROGRESS]}
    again = exports.PodAnnotationRequests(pod="j-trainer-0", namespace="ns", api=api)
    assert again.pending() is None
    api.current = {**api.current, contract.ANNOTATION_EXPORT_REQUEST: "b"}
    assert again.pending() == "b"
