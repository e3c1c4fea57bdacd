"""User verifiers and the pool: a Python function, a reward model built from a config (no downloads), process
isolation that kills an overrunning worker, thread timeouts, and their fallbacks counted."""
from __future__ import annotations

import math
import pathlib
import sys
import textwrap
import time
from typing import Iterator

import pytest
import torch
import transformers

from kubeforge.api import rljob
from kubeforge.runtime import types, verifiers
from kubeforge.runtime.models import tiny
from kubeforge.runtime.verifiers import pool, python_fn, reward_model

USER_MODULE = textwrap.dedent('''
    import time

    def score(*, prompt, reference, completions):
        return [1.0 if reference in c else 0.0 for c in completions]

    def slow(*, prompt, reference, completions):
        if "hang" in completions:
            time.sleep(3600)
        return [float(len(c)) for c in completions]

    def wrong(*, prompt, reference, completions):
        return [1.0]

    not_callable = 3
''')


@pytest.fixture()
def user_module(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    (tmp_path / "kf_user_rewards.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))   # the spawned process worker imports it too
    yield "kf_user_rewards"
    sys.modules.pop("kf_user_rewards", None)


def spec(**kw: object) -> rljob.VerifierSpec:
    return rljob.VerifierSpec.model_validate(kw)


def group(texts: list[str], answer: str = "42") -> types.RolloutGroup:
    return types.RolloutGroup(prompt=types.Prompt(index=0, text="q", answer=answer), prompt_token_ids=[1],
                              completions=[types.Completion(token_ids=[], logprobs=[], text=t) for t in texts],
                              policy_version=0)


def test_python_function(user_module: str) -> None:
    s = verifiers.Scorer([spec(name="mine", type="Python", python={"entryPoint": f"{user_module}:score"})])
    assert s.score_group(group(["it is 42", "41"]))[0] == [1.0, 0.0]
    with pytest.raises(ValueError, match="python.entryPoint: cannot import 'kf_absent_module'"):
        python_fn.PythonFunction("kf_absent_module:score", field="python.entryPoint")
    with pytest.raises(ValueError, match="has no function 'not_callable'"):
        python_fn.PythonFunction(f"{user_module}:not_callable")


def test_wrong_count_falls_back_and_is_counted(user_module: str) -> None:
    s = verifiers.Scorer([spec(name="w", type="Python", fallbackScore=0.25,
                               python={"entryPoint": f"{user_module}:wrong"})])
    assert s.score_group(group(["a", "b"]))[0] == [0.25, 0.25]
    assert s.errors == {"w": 1} and s.fallbacks == {"w": 2} and "2 completions" in s.last_error["w"]


def test_thread_timeout_falls_back_without_waiting_for_the_call(user_module: str) -> None:
    s = verifiers.Scorer([spec(name="slow", type="Python", timeoutSeconds=0.3, fallbackScore=0.0,
                               python={"entryPoint": f"{user_module}:slow"}),
                          spec(name="fast", type="Length", length={"maxChars": 10})])
    t0 = time.monotonic()
    rewards, scores = s.score_group(group(["hang", "ok"]))
    assert time.monotonic() - t0 < 5
    assert scores == {"slow": [0.0, 0.0], "fast": [1.0, 1.0]} and rewards == [1.0, 1.0]
    assert s.timeouts == {"slow": 1} and s.fallbacks == {"slow": 2}
    s.close()


def test_a_hung_thread_verifier_does_not_hold_up_the_process_exit(user_module: str) -> None:
    """A Thread-isolated call that never returns must not keep a finished role alive: the pool's threads are daemon
    threads (a ThreadPoolExecutor's are joined at exit, which kept this test suite's process alive for an hour)."""
    import subprocess
    script = textwrap.dedent(f"""
        from kubeforge.api import rljob
        from kubeforge.runtime import types, verifiers
        s = verifiers.Scorer([rljob.VerifierSpec.model_validate(dict(name="slow", type="Python", timeoutSeconds=0.2,
                                fallbackScore=0.0, python={{"entryPoint": "{user_module}:slow"}}))])
        g = types.RolloutGroup(prompt=types.Prompt(index=0, text="q", answer="1"), prompt_token_ids=[1],
                               completions=[types.Completion(token_ids=[], logprobs=[], text="hang")],
                               policy_version=0)
        print(s.score_group(g)[1], flush=True)
        s.close()
    """)
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "{'slow': [0.0]}" in done.stdout
    assert time.monotonic() - t0 < 60   # the call sleeps 3600 s; exit must not wait for it


def test_daemon_threads_run_calls_concurrently_and_cancel_pending_on_shutdown() -> None:
    import threading
    gate = threading.Event()
    ex = pool.DaemonThreads(2, name="t")
    a, b, c = ex.submit(gate.wait, 5), ex.submit(gate.wait, 5), ex.submit(lambda: 1)
    time.sleep(0.2)
    assert a.running() and b.running() and not c.done()   # two workers at most; the third call queues
    ex.shutdown()
    assert c.cancelled()
    gate.set()
    assert a.result(timeout=5) is True and b.result(timeout=5) is True
    with pytest.raises(RuntimeError):
        ex.submit(lambda: 1)
    err = pool.DaemonThreads(1, name="e")
    with pytest.raises(ZeroDivisionError):
        err.submit(lambda: 1 / 0).result(timeout=5)
    err.shutdown()


def test_process_isolation_kills_an_overrunning_worker_and_recovers(user_module: str) -> None:
    sp = spec(name="slow", type="Python", isolation="Process", timeoutSeconds=1.0, fallbackScore=None,
              python={"entryPoint": f"{user_module}:slow"})
    s = verifiers.Scorer([sp], reward=rljob.RewardSpec.model_validate({"aggregation": "MajorityVote"}))
    worker = s.verifiers["slow"]
    assert isinstance(worker, pool.ProcessVerifier)
    assert s.score_group(group(["abc", "hang"]))[1] == {"slow": [0.0, 0.0]}  # abstained (0.0 on the wire)
    assert worker.restarts == 1 and s.timeouts == {"slow": 1}
    assert s.score_group(group(["abcd"]))[1] == {"slow": [4.0]}                # a fresh worker
    s.close()


def test_process_worker_reports_build_errors_at_start_up() -> None:
    with pytest.raises(ValueError, match="cannot import"):
        verifiers.build(spec(name="x", type="Python", isolation="Process", python={"entryPoint": "kf_nope:f"}))


@pytest.fixture(scope="module")
def rm_folder(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """A tiny Qwen2 sequence classifier with the tiny model's byte tokenizer, built from a config."""
    path = tmp_path_factory.mktemp("rm")
    cfg = tiny.config()
    cfg.num_labels = 1
    torch.manual_seed(0)
    transformers.Qwen2ForSequenceClassification(cfg).save_pretrained(path)
    tiny.tokenizer().save_pretrained(path)
    return path


def test_reward_model_scores_pairs(rm_folder: pathlib.Path) -> None:
    settings = rljob.RewardModelVerifier(path=str(rm_folder), batch_size=2, max_length=64)
    rm = reward_model.RewardModel(settings)
    texts = ["hello", "a much longer completion than that", "", "hello"]
    got = rm.score(types.Prompt(index=0, text="q", answer=""), texts)
    assert len(got) == 4 and all(0.0 < x < 1.0 and math.isfinite(x) for x in got)
    assert got[0] == pytest.approx(got[3], abs=1e-5)        # batching and padding do not change a score
    assert len(set(round(x, 6) for x in got[:3])) == 3
    s = verifiers.Scorer([spec(name="rm", type="RewardModel", rewardModel={"path": str(rm_folder)})])
    assert s.score_group(group(texts))[1]["rm"] == pytest.approx(got, abs=1e-5)
    with pytest.raises(ValueError, match="rm: rewardModel.path: .* is not a Hugging Face model folder"):
        verifiers.build(spec(name="rm", type="RewardModel", rewardModel={"path": str(rm_folder / "absent")}))
