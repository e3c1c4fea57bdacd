"""The program inside the sandbox (run by ``sandbox.Sandbox`` as ``python -I -S _sandbox_child.py CONFIG``).

Standard library only: it must start under ``-I -S`` (no site-packages, no environment). In order: drop to the
unprivileged user (when started as root), set the rlimits, restrict itself with Landlock (writes only beneath the
sandbox directory; TCP bind/connect denied; no signals or abstract sockets outside), point stdin at /dev/null and
stdout/stderr at a file in the sandbox directory, then run ``solution.py`` and each test of ``tests.json`` in one
namespace, and write ``{"passed": k, "total": n, "error": ...}`` to the result fd (only from the original process).
"""
import ctypes
import json
import os
import resource
import sys
from typing import Any

NOBODY = 65534
PR_SET_NO_NEW_PRIVS = 38
SYS_CREATE_RULESET, SYS_ADD_RULE, SYS_RESTRICT_SELF = 444, 445, 446   # same numbers on x86_64 and aarch64
FS_WRITE_FILE, FS_READ_FILE = 1 << 1, 1 << 2
FS_WRITE_TREE = (1 << 1) | sum(1 << b for b in range(4, 13))          # write, remove, make-*
FS_REFER, FS_TRUNCATE, FS_IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1
SCOPE_ABSTRACT_UNIX, SCOPE_SIGNAL = 1 << 0, 1 << 1


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def landlock(directory: str) -> int:
    """Restrict this process and its children; returns the Landlock ABI used (0 = not available)."""
    libc = ctypes.CDLL(None, use_errno=True)
    abi = int(libc.syscall(SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(1)))
    if abi <= 0:
        return 0
    fs = FS_WRITE_TREE | (FS_REFER if abi >= 2 else 0) | (FS_TRUNCATE if abi >= 3 else 0)
    fs |= FS_IOCTL_DEV if abi >= 5 else 0
    attr = (ctypes.c_uint64 * 3)(fs, NET_BIND_TCP | NET_CONNECT_TCP, SCOPE_ABSTRACT_UNIX | SCOPE_SIGNAL)
    size = 8 if abi < 4 else 16 if abi < 6 else 24
    fd = libc.syscall(SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if fd < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset")
    for path, access in ((directory, fs), ("/dev/null", FS_WRITE_FILE | (FS_TRUNCATE if abi >= 3 else 0))):
        pfd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        rule = _PathBeneath(access, pfd)
        if libc.syscall(SYS_ADD_RULE, fd, 1, ctypes.byref(rule), 0) != 0:
            raise OSError(ctypes.get_errno(), f"landlock_add_rule {path}")
        os.close(pfd)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(NO_NEW_PRIVS)")
    if libc.syscall(SYS_RESTRICT_SELF, fd, 0) != 0:
        raise OSError(ctypes.get_errno(), "landlock_restrict_self")
    os.close(fd)
    return abi


def confine(cfg: dict[str, Any]) -> None:
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
        landlock(directory)
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
        confine(cfg)
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
