"""CodeExecution's sandbox: hostile completions are stopped and scored as failures; the verifier survives them.

Each case runs a real subprocess under the mechanisms this machine has (``sandbox.mechanisms()`` is printed):
namespaces via unshare, Landlock, rlimits, the unprivileged user when root."""
from __future__ import annotations

import os
import pathlib
import shutil
import socket
import subprocess
import tempfile
import time

import pytest

from kubeforge.api import rljob
from kubeforge.runtime import types, verifiers
from kubeforge.runtime.verifiers import code, sandbox

TESTS = "assert double(2) == 4\nassert double(-3) == -6\n# comment\nassert double(0) == 0\n"
GOOD = "def double(x):\n    return 2 * x\n"


def verifier(**kw: object) -> code.CodeExecution:
    settings = {"timeoutSeconds": 1, "memoryMiB": 256, "maxProcesses": 8, "parallelism": 2, **kw}
    return code.CodeExecution(rljob.CodeExecutionVerifier.model_validate(settings))


def prompt(tests: str = TESTS) -> types.Prompt:
    return types.Prompt(index=0, text="Write double(x).", answer=tests)


def test_mechanisms_in_force() -> None:
    mech = sandbox.mechanisms()
    print("\nsandbox mechanisms:", ", ".join(mech))
    assert "rlimits" in mech


def test_correct_partial_and_fenced_code() -> None:
    v = verifier()
    fenced = f"Here it is:\n```python\n{GOOD}```\nDone."
    half = "def double(x):\n    return 4 if x == 2 else 0\n"
    assert v.score(prompt(), [GOOD, fenced, half, "syntax error(", ""]) == [1.0, 1.0, 2 / 3, 0.0, 0.0]
    assert verifier(partialCredit=False).score(prompt(), [half, GOOD]) == [0.0, 1.0]
    with pytest.raises(ValueError, match="no tests"):
        v.score(prompt("# none"), [GOOD])


def _nobody_processes() -> int:
    out = subprocess.run(["ps", "-u", "65534", "-o", "pid="], capture_output=True, text=True).stdout
    return len(out.split())


def test_hostile_completions_are_stopped_and_scored_zero(tmp_path: pathlib.Path) -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.2)
    port = server.getsockname()[1]
    outside = tmp_path / "outside.txt"
    os.chmod(tmp_path, 0o777)  # writable by anyone: only the sandbox can stop the write
    hostile = {
        "infinite-loop": "while True:\n    pass\n",
        "fork-bomb": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
        "memory-hog": "hog = bytearray(8 * 1024 ** 3)\n",
        "network": f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)\n",
        "write-outside": f"open({str(outside)!r}, 'w').write('escaped')\n",
    }
    v = verifier()
    before = _nobody_processes() if os.geteuid() == 0 else 0
    t0 = time.monotonic()
    for name, src in hostile.items():
        got = v.score(prompt(), [src + GOOD, GOOD])
        print(f"{name}: {got}")
        assert got == [0.0, 1.0], name            # stopped, scored a failure; its neighbour still scores
    assert time.monotonic() - t0 < 60
    assert not outside.exists()
    with pytest.raises(socket.timeout):
        server.accept()                            # nothing got through
    server.close()
    assert v.status["timeout"] >= 2                # the loop and the fork bomb were killed
    if os.geteuid() == 0:                          # no process of the fork bomb outlives its run (reaping may lag)
        deadline = time.monotonic() + 5
        while _nobody_processes() > before and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _nobody_processes() <= before
    assert v.score(prompt(), [GOOD]) == [1.0]      # the verifier survived all of it


def test_scorer_runs_code_execution_from_the_spec() -> None:
    spec = rljob.VerifierSpec.model_validate({"name": "tests", "type": "CodeExecution", "timeoutSeconds": 20,
                                              "codeExecution": {"timeoutSeconds": 2}})
    g = types.RolloutGroup(prompt=prompt(), prompt_token_ids=[1], policy_version=0,
                           completions=[types.Completion(token_ids=[], logprobs=[], text=t)
                                        for t in (GOOD, "while True: pass", "nope")])
    rewards, scores = verifiers.score_group([spec], g)
    assert rewards == [1.0, 0.0, 0.0]


def test_sandboxed_code_reads_no_hidden_file_nor_another_process_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/security.md section 5: a world-readable token in a hidden folder and the parent's environ are out of
    reach (Landlock); the same file outside the hidden folder is read (the control)."""
    if sandbox.probe()[1] == 0:
        pytest.skip("no Landlock in this kernel: the sandbox's reads are not restricted (docs/security.md)")
    tmp_path = pathlib.Path(tempfile.mkdtemp(prefix="kf-hide-"))   # traversable by nobody, unlike pytest's tmp_path
    tmp_path.chmod(0o755)
    for name in ("secrets", "open"):
        (tmp_path / name).mkdir(mode=0o755)
        (tmp_path / name / "token").write_text("k")
        (tmp_path / name / "token").chmod(0o644)
    monkeypatch.setenv("KUBEFORGE_HIDE_PATHS", str(tmp_path / "secrets"))
    box = sandbox.Sandbox(sandbox.Limits(timeout_s=5))
    read = "def can(p):\n    try:\n        open(p, 'rb').read(1)\n        return True\n    except OSError:\n        return False\n"
    r = box.run(read, [f"assert not can({str(tmp_path / 'secrets' / 'token')!r})",
                       f"assert can({str(tmp_path / 'open' / 'token')!r})",
                       f"assert not can('/proc/{os.getpid()}/environ')", "assert not can('/proc/1/environ')"])
    shutil.rmtree(tmp_path)
    assert (r.passed, r.total) == (4, 4), r
