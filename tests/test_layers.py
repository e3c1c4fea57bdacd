"""The one dependency direction (docs: architecture): operator and runtime never import each other; api imports
neither. Checked by import-linter over the source folders (the contracts live in pyproject.toml)."""
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_import_contracts_hold() -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(str(ROOT / d) for d in ("api", "operator", "runtime")))
    exe = pathlib.Path(sys.executable).with_name("lint-imports")
    proc = subprocess.run([str(exe)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 kept, 0 broken" in proc.stdout
