"""bench/bench_pool.py's parts: the manifests of both modes pass the launcher's own checks, the memory sampler finds
the generator processes (and their children) below a launcher and no other process, and the figures' arithmetic.
The bench's whole path (both modes with real vLLM engines) is ``test_the_bench_runs_both_modes_to_its_last_line``,
in the long tier."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT / "bench") not in sys.path:     # a bench script, imported as the bench scripts import each other
    sys.path.insert(0, str(ROOT / "bench"))

import bench_pool  # noqa: E402

from kubeforge.runtime.launcher import main, poolrun  # noqa: E402


def test_both_modes_manifests_pass_the_launchers_checks(tmp_path: pathlib.Path) -> None:
    docs = [(f"j{k}", bench_pool.job_doc(k, model="tiny", steps=3, pool=None)) for k in range(3)]
    for path in bench_pool.write(docs, tmp_path / "separate"):
        job = main.prepare(path, steps=None)
        assert job.spec.generator_pool is None and job.spec.model.lora is not None
        assert job.spec.algorithm.steps == 3
    files = bench_pool.write([("pool", bench_pool.pool_doc(jobs=3, model="tiny")),
                              *((f"j{k}", bench_pool.job_doc(k, model="tiny", steps=3, pool=bench_pool.POOL_NAME))
                                for k in range(3))], tmp_path / "pool")
    (_, pool), jobs = poolrun.prepare(files, steps=None)
    assert pool.spec.max_adapters == 3 and pool.spec.replicas == 1
    assert [j.spec.task.seed for _, j in jobs] == [0, 1, 2]
    assert len({j.metadata.name for _, j in jobs}) == 3


def test_the_learning_example_alternates_its_two_jobs_and_passes_the_launchers_checks(tmp_path: pathlib.Path) -> None:
    """``--example smollm2``: job k is ``job-a.yaml`` or ``job-b.yaml`` by parity, with seed k, on the example's own
    base model (SmolLM2 in bf16, the pool's too) unless ``--model`` names another."""
    docs = [(f"j{k}", bench_pool.job_doc(k, model=None, steps=3, pool=None, example="smollm2")) for k in range(4)]
    jobs = [main.prepare(path, steps=None) for path in bench_pool.write(docs, tmp_path / "separate")]
    assert [j.spec.task.arithmetic.operations if j.spec.task.arithmetic else None for j in jobs] == \
        [["+"], ["*"], ["+"], ["*"]]
    assert [j.spec.task.seed for j in jobs] == [0, 1, 2, 3]
    assert all(j.spec.generator_pool is None and j.spec.model.lora is not None for j in jobs)
    files = bench_pool.write([("pool", bench_pool.pool_doc(jobs=4, model=None, example="smollm2")),
                              *((f"j{k}", bench_pool.job_doc(k, model=None, steps=3, pool=bench_pool.POOL_NAME,
                                                             example="smollm2")) for k in range(4))],
                             tmp_path / "pool")
    (_, pool), attached = poolrun.prepare(files, steps=None)
    assert pool.spec.max_adapters == 4 and pool.spec.model.builtin == "smollm2-135m-instruct"
    assert {j.spec.model.builtin for _, j in attached} == {"smollm2-135m-instruct"}


def test_held_out_accuracy_comes_from_each_jobs_launcher_line() -> None:
    lines = [{"job": "j0", "eval_accuracy_before": 0.1, "eval_accuracy_after": 0.9},
             {"run_dir": "/tmp/x/separate/j1", "eval_accuracy_before": 0.2, "eval_accuracy_after": 0.5},
             {"run_dir": "/tmp/x/separate/j11", "eval_accuracy_before": 0.3, "eval_accuracy_after": 0.4}]
    assert bench_pool.held_out("j0", lines) == {"eval_accuracy_before": 0.1, "eval_accuracy_after": 0.9}
    assert bench_pool.held_out("j1", lines) == {"eval_accuracy_before": 0.2, "eval_accuracy_after": 0.5}
    assert bench_pool.held_out("j2", lines) == {"eval_accuracy_before": None, "eval_accuracy_after": None}


def test_one_at_a_time_starts_each_launch_after_the_previous_ended(tmp_path: pathlib.Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """``--one-at-a-time``: the separate launches run one after another (each job alone), every launcher line kept."""
    def launch(files: list[str], *, run_dir: pathlib.Path, log: pathlib.Path) -> "subprocess.Popen[str]":
        code = ("import json, time; t = time.time(); time.sleep(1.0); "
                f"print(json.dumps({{'run_dir': {str(run_dir)!r}, 'start': t, 'end': time.time()}}))")
        return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=log.open("w"), text=True)

    monkeypatch.setattr(bench_pool, "_launch", launch)
    launches = [([f"j{k}.yaml"], tmp_path / f"j{k}") for k in range(2)]
    metrics = {f"j{k}": tmp_path / f"j{k}" / "metrics.jsonl" for k in range(2)}
    out = bench_pool.run_mode("separate", launches, jobs=["j0", "j1"], metrics=metrics, timeout=60,
                              one_at_a_time=True)
    first, second = out["launcher_lines"]
    assert first["run_dir"].endswith("j0") and second["start"] >= first["end"]
    together = bench_pool.run_mode("separate", launches, jobs=["j0", "j1"], metrics=metrics, timeout=60)
    first, second = together["launcher_lines"]
    assert second["start"] < first["end"], "at once by default"


SCRIPTS = {
    # hold.py MIB [argv tags...]: hold MIB MiB, touched (resident), and sleep
    "hold.py": "import sys, time\nx = bytearray(int(sys.argv[1]) << 20)\nx[::4096] = b'1' * len(x[::4096])\n"
               "time.sleep(120)\n",
    # a generator: a child holding 40 MiB, itself 60 MiB
    "gen.py": "import pathlib, runpy, subprocess, sys\nhere = pathlib.Path(__file__).parent\n"
              "subprocess.Popen([sys.executable, str(here / 'hold.py'), '40'])\n"
              "sys.argv = [str(here / 'hold.py'), '60']\nrunpy.run_path(str(here / 'hold.py'), run_name='__main__')\n",
    # a launcher: a trainer holding 80 MiB and the generator
    "launch.py": "import pathlib, subprocess, sys, time\nhere = pathlib.Path(__file__).parent\n"
                 "subprocess.Popen([sys.executable, str(here / 'hold.py'), '80', 'kubeforge.cli', 'role', 'trainer'])\n"
                 "subprocess.Popen([sys.executable, str(here / 'gen.py'), 'kubeforge.cli', 'role', 'generator'])\n"
                 "time.sleep(120)\n",
}


def test_the_sampler_counts_the_generators_and_their_children_below_the_launchers_only(
        tmp_path: pathlib.Path) -> None:
    for name, text in SCRIPTS.items():
        (tmp_path / name).write_text(text)
    launcher = subprocess.Popen([sys.executable, str(tmp_path / "launch.py")], start_new_session=True)
    outsider = subprocess.Popen([sys.executable, str(tmp_path / "hold.py"), "30", "kubeforge.cli", "role",
                                 "generator"], start_new_session=True)      # a generator, not below the launcher
    try:
        sampler = bench_pool.MemorySampler(roots=[launcher.pid])
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (sampler.peak_processes == 2 and sampler.peak_rss_mib > 100):
            sampler.sample()
            time.sleep(0.5)
        assert sampler.peak_processes == 2, sampler           # the generator and its child: no trainer, no outsider
        assert 100 < sampler.peak_rss_mib < 100 + 2 * 60, sampler   # 60 + 40 MiB touched, plus two interpreters
        assert 0 < sampler.peak_pss_mib <= sampler.peak_rss_mib
    finally:
        os.killpg(launcher.pid, 9)
        os.killpg(outsider.pid, 9)
        launcher.wait()
        outsider.wait()


def _recs(times: list[float], completions: int = 64, rewards: list[float] | None = None) -> list[dict[str, object]]:
    rewards = rewards or [0.5] * len(times)
    return [{"step": i + 1, "time": t, "completions": completions, "mean_reward": r}
            for i, (t, r) in enumerate(zip(times, rewards))]


def test_aggregate_rate_drops_each_jobs_step_1_and_spans_the_union_of_the_jobs() -> None:
    out = bench_pool.aggregate({"a": _recs([10.0, 20.0, 30.0]), "b": _recs([14.0, 34.0])})
    # steps 2.. of both: 2 x 64 + 1 x 64 completions, from the first end of step 1 (10) to the last end (34)
    assert out["completions_after_step_1"] == 192 and out["span_seconds"] == 24.0
    assert out["completions_per_second"] == pytest.approx(192 / 24, abs=1e-3)
    assert out["completions"] == 5 * 64
    assert out["completions_per_second_jobs_summed"] == pytest.approx(128 / 20 + 64 / 20, abs=1e-3)   # each its own
    assert bench_pool.aggregate({"a": _recs([5.0])})["completions_per_second"] is None


def test_rewards_are_the_first_and_last_third_of_the_steps() -> None:
    r = bench_pool.rewards(_recs([1, 2, 3, 4, 5, 6, 7], rewards=[0.0, 0.2, 0.4, 0.5, 0.6, 0.8, 1.0]))
    assert r == {"steps": 7, "reward_window": 2, "reward_first": 0.1, "reward_last": 0.9}
    assert bench_pool.rewards(_recs([1], rewards=[0.25]))["reward_first"] == 0.25


def test_read_steps_keeps_the_last_record_of_a_step_and_skips_a_torn_line(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join([json.dumps({"step": 1, "time": 1.0, "completions": 8}),
                               json.dumps({"step": 1, "time": 2.0, "completions": 9}), '{"step": 2, "ti']))
    assert bench_pool.read_steps(path) == [{"step": 1, "time": 2.0, "completions": 9}]


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.long
@pytest.mark.timeout(1800)
def test_the_bench_runs_both_modes_to_its_last_line(tmp_path: pathlib.Path) -> None:
    """One job, two steps: its own generator, then a pool of one engine: every contract field filled."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(ROOT / d) for d in ("api", "operator", "runtime"))}
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_pool.py"), "--jobs", "1", "--steps", "2",
                           "--keep", str(tmp_path)], capture_output=True, text=True, timeout=1700, env=env,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    for field in ("completions_per_second_pool", "completions_per_second_separate", "generator_rss_mib_pool",
                  "generator_rss_mib_separate"):
        assert out[field] and out[field] > 0, (field, out)
    assert out["machine"]["cpu_model"] is not None
    for mode in ("separate", "pool"):
        (job,) = out["rewards"][mode].values()
        assert job["steps"] == 2 and job["reward_first"] is not None and job["reward_last"] is not None
