"""The layers (docs/architecture.md): one dependency direction between api, operator and runtime, and the pure
cores (render, status, lifecycle; grpo) free of I/O. Checked by import-linter over the source folders against
every contract in pyproject.toml (counted from there: a contract added is a contract checked), and the packages'
types by mypy --strict."""
import os
import pathlib
import subprocess
import sys
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(str(ROOT / d) for d in ("api", "operator", "runtime")))


def test_import_contracts_hold() -> None:
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    assert len(contracts) >= 5
    exe = pathlib.Path(sys.executable).with_name("lint-imports")
    proc = subprocess.run([str(exe)], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{len(contracts)} kept, 0 broken" in proc.stdout, proc.stdout


def test_mypy_strict() -> None:
    proc = subprocess.run([sys.executable, "-m", "mypy", "--strict", "api/kubeforge", "operator/kubeforge",
                           "runtime/kubeforge"], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-20000:] + proc.stderr[-5000:]
