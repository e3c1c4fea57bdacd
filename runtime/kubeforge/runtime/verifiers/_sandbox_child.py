"""The program inside the sandbox (run by ``sandbox.Sandbox`` as ``python -I -S _sandbox_child.py CONFIG``).

Standard library only: it must start under ``-I -S`` (no site-packages, no environment). In order: drop to the
unprivileged user (when started as root), set the rlimits, restrict itself with Landlock (writes only beneath the
sandbox directory; no reads of the hidden folders -- the service-account token's -- nor of other processes' /proc,
with ``kubeforge.runtime.confine``'s Landlock code; TCP bind/connect denied; no signals or abstract sockets outside), point stdin at /dev/null and
stdout/stderr at a file in the sandbox directory, then run ``solution.py`` and each test of ``tests.json`` in one
namespace, and write ``{"passed": k, "total": n, "error": ...}`` to the result fd (only from the original process).
"""
import importlib.util
import json
import os
import resource
import sys
from typing import Any

NOBODY = 65534


def _load_confine(path: str) -> Any:
    """``kubeforge.runtime.confine`` by its file (this program runs under ``-I -S``: no package path), loaded while
    still root when started as root (the file need not be readable by nobody)."""
    spec = importlib.util.spec_from_file_location("kf_confine", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def landlock(lib: Any, directory: str, hide: list[str]) -> int:
    """Restrict this process and its children: writes only beneath ``directory`` (and /dev/null), reads anywhere
    but the hidden folders and other processes' ``/proc``; TCP bind/connect, signals and abstract sockets outside
    denied. Returns the Landlock ABI used (0 = not available)."""
    fs = lib.FS_WRITE_TREE | lib.FS_REFER | lib.FS_TRUNCATE | lib.FS_IOCTL_DEV | lib.FS_READ_FILE
    rules = [(directory, fs), ("/dev/null", lib.FS_WRITE_FILE | lib.FS_TRUNCATE | lib.FS_READ_FILE)]
    rules += [(p, lib.FS_READ_FILE) for p in lib.readable_except([*hide, *lib.other_processes()])]
    return int(lib.landlock(fs=fs, rules=rules, net=lib.NET_BIND_TCP | lib.NET_CONNECT_TCP,
                            scope=lib.SCOPE_ABSTRACT_UNIX | lib.SCOPE_SIGNAL))


def confine(cfg: dict[str, Any], lib: Any) -> None:
    directory = cfg["dir"]
    if cfg["drop_user"]:
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
    mib = 1024 * 1024
    for name, value in (("RLIMIT_CPU", cfg["cpu_s"]), ("RLIMIT_AS", cfg["memory_mib"] * mib),
                        ("RLIMIT_NPROC", cfg["nproc"]), ("RLIMIT_FSIZE", cfg["file_mib"] * mib),
                        ("RLIMIT_NOFILE", 64), ("RLIMIT_CORE", 0)):
        resource.setrlimit(getattr(resource, name), (value, value))
    if cfg["landlock"]:
        landlock(lib, directory, cfg["hide"])
    os.chdir(directory)
    null = os.open("/dev/null", os.O_RDONLY)
    out = os.open(os.path.join(directory, "output.txt"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(null, 0)
    os.dup2(out, 1)
    os.dup2(out, 2)


def main() -> None:
    cfg = json.loads(sys.argv[1])
    result_fd = cfg["result_fd"]
    me = os.getpid()
    result: dict[str, Any] = {"passed": 0, "total": 0, "error": None}
    try:
        confine(cfg, _load_confine(cfg["confine"]))
        with open("solution.py", encoding="utf-8") as f:
            source = f.read()
        with open("tests.json", encoding="utf-8") as f:
            tests = json.load(f)
        result["total"] = len(tests)
        namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": __builtins__}
        exec(compile(source, "solution.py", "exec"), namespace)
        for i, test in enumerate(tests):
            try:
                exec(compile(test, f"test_{i}", "exec"), namespace)
                result["passed"] += 1
            except Exception:
                pass
    except BaseException as e:  # the completion's exceptions, SystemExit included, end its run
        result["error"] = f"{type(e).__name__}: {e}"[:500]
    if os.getpid() == me:
        try:
            os.write(result_fd, (json.dumps(result) + "\n").encode())
        except OSError:
            pass
    os._exit(0)


if __name__ == "__main__":
    main()
