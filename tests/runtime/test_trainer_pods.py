"""Trainer ranks as pods run them: each with its own model cache (a pod's HOME), the operator's env contract.

The bug this guards (tiny-fsdp failed in real pods: trainer-1 exited 1 at step 0): a built-in model is built into
the process's own cache on first use, and transformers' ``save_pretrained`` writes nothing on a torch.distributed
rank other than 0 once a process group exists. Locally every trainer shares one cache (rank 0 or the launcher
builds it), so only pods, one cache each, hit it: rank 1 built ``tiny`` after joining the trainer group, published a
folder of tokenizer files only, and died reading it ("Unrecognized model ... config.json").
"""
from __future__ import annotations

import os
import secrets
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from kubeforge.api import contract, load
from kubeforge.runtime import transport
from kubeforge.runtime.launcher import ports

ROOT = Path(__file__).resolve().parents[2]


def _two(script: str, tmp_path: Path, *, timeout: float = 240.0) -> list[subprocess.CompletedProcess[str]]:
    """Run ``script`` as ranks 0 and 1 of a fresh gloo group (argv: rank, port, cache root)."""
    port = ports.allocate(1)[0]
    path = tmp_path / "rank.py"
    path.write_text(textwrap.dedent(script))
    procs = [subprocess.Popen([sys.executable, str(path), str(r), str(port), str(tmp_path / f"cache{r}")],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in (0, 1)]
    out = []
    for p in procs:
        text, _ = p.communicate(timeout=timeout)
        out.append(subprocess.CompletedProcess(p.args, p.returncode, text, ""))
    return out


BUILD_IN_GROUP = """
    import sys, pathlib
    from kubeforge.runtime.models import cache, tiny
    from kubeforge.runtime.learner import parallel
    rank, port, root = int(sys.argv[1]), int(sys.argv[2]), pathlib.Path(sys.argv[3])
    group = parallel.DataParallel(config=parallel.DistConfig(rank=rank, world_size=2, master_port=port,
                                                             timeout_s=120))
    try:
        cache.ensure(tiny.NAME, tiny.build, cache_root=root / "after")             # what rank 1 did in its pod
        print("after: built")
    except cache.BuildError as exc:
        print(f"after: BuildError {exc}")
    group.barrier()
    group.close()
"""


def test_a_builtin_built_after_joining_the_group_is_refused_on_rank_1_not_published(tmp_path: Path) -> None:
    r0, r1 = _two(BUILD_IN_GROUP, tmp_path)
    assert r0.returncode == 0 and r1.returncode == 0, r0.stdout[-2000:] + r1.stdout[-2000:]
    assert "after: built" in r0.stdout                        # rank 0 saves as usual
    assert "after: BuildError" in r1.stdout and "config.json" in r1.stdout    # rank 1: refused, not half-published
    assert not (tmp_path / "cache1" / "after" / "tiny-v2").exists()
    assert (tmp_path / "cache0" / "after" / "tiny-v2" / "model.safetensors").is_file()


def _pod_env(tmp_path: Path, *, index: int, bases: list[int], manifest: Path, key: str) -> dict[str, str]:
    home = tmp_path / f"home{index}"        # a pod's own HOME: its own model cache
    home.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(contract.ENV_PREFIX)}
    env.update({
        "HOME": str(home), contract.ENV_ROLE: "trainer", contract.ENV_INDEX: str(index),
        contract.ENV_CONFIG: str(manifest), contract.ENV_JOB_NAME: "tiny-fsdp", contract.ENV_NAMESPACE: "ns",
        contract.ENV_POD_NAME: f"tiny-fsdp-trainer-{index}", contract.ENV_PORT_BASE: str(bases[index]),
        contract.ENV_BIND_HOST: "127.0.0.1", contract.ENV_ATTEMPT: "0", contract.ENV_JOB_KEY: key,
        contract.ENV_CHECKPOINT_DIR: str(tmp_path / "checkpoints"),     # the shared volume of the pods
        contract.env_replicas("trainer"): "2",
        contract.env_peers("trainer"): ",".join(f"127.0.0.1:{b}" for b in bases[:2]),
        contract.env_replicas("generator"): "1", contract.env_peers("generator"): f"127.0.0.1:{bases[2]}",
        contract.env_replicas("verifier"): "1", contract.env_peers("verifier"): f"127.0.0.1:{bases[3]}",
    })
    return env


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_fsdp_trainer_pods_with_their_own_caches_both_get_ready(tmp_path: Path) -> None:
    """Both ranks of examples/tiny-fsdp.yaml, started as the operator starts them (its env contract, the manifest
    with defaults as the ConfigMap holds it), each with an empty cache of its own, build their model and become
    ready. The generator is only its data socket (a trainer connects to it before it is ready); nothing trains."""
    doc = yaml.safe_load((ROOT / "examples" / "tiny-fsdp.yaml").read_text())
    job = load.parse(doc)
    manifest = tmp_path / "rljob.yaml"
    dumped = load.dump(job)          # as the operator's ConfigMap holds it: defaults filled in, no status
    dumped.pop("status", None)
    manifest.write_text(yaml.safe_dump(dumped, sort_keys=True))
    bases, key = ports.allocate(4), secrets.token_hex(32)
    transport.use_curve(transport.CurveKeys.from_job_key(bytes.fromhex(key)))   # the job's keys, as in pods
    generator = transport.open_receiver(f"tcp://127.0.0.1:{bases[2] + contract.PORT_DATA}")
    logs = [open(tmp_path / f"trainer-{i}.log", "w") for i in (0, 1)]   # noqa: SIM115 - handed to the children
    procs = [subprocess.Popen([sys.executable, "-m", "kubeforge.cli", "role", "trainer"], stdout=logs[i],
                              stderr=subprocess.STDOUT,
                              env=_pod_env(tmp_path, index=i, bases=bases, manifest=manifest, key=key))
             for i in (0, 1)]
    try:
        deadline = time.monotonic() + 420
        while time.monotonic() < deadline:
            dead = [p.returncode for p in procs if p.poll() is not None]
            if dead or all(_ready(bases[i] + contract.PORT_METRICS) for i in (0, 1)):
                break
            time.sleep(1)
        text = [(tmp_path / f"trainer-{i}.log").read_text()[-3000:] for i in (0, 1)]
        assert all(p.poll() is None for p in procs), f"a trainer exited: {text}"
        assert all(_ready(bases[i] + contract.PORT_METRICS) for i in (0, 1)), f"not ready in time: {text}"
        for i in (0, 1):
            assert (tmp_path / f"home{i}" / ".cache" / "kubeforge" / "models" / "tiny-v2" / "config.json").is_file()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait(30)
        for f in logs:
            f.close()
        generator.close()
        transport.use_curve(None)
