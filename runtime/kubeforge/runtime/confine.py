"""Self-confinement of a child process that runs code we do not trust: Landlock, rlimits; then ``exec`` the program.

Standard library only, importable under ``python -I -S`` (no site-packages, any interpreter): ``isolation`` starts
environment workers and the Verifiers runner as ``python -I -S confine.py CONFIG PROGRAM ARGS...``; the code
sandbox's child (``verifiers._sandbox_child``) loads this file by path and calls ``landlock`` itself.

```
 confine.py CONFIG argv ─ rlimits (AS, CPU, NOFILE, CORE=0) ─ NO_NEW_PRIVS ─ Landlock ─ execv(argv)
```

Landlock (Linux >= 5.13, no privilege needed, allowed under the restricted Pod Security level) is what hides the
pod's secrets from the child: file reads are handled, and granted beneath every path except the ``hide`` folders
(the service-account token's) and ``/proc/<pid>`` of every other process (``environ`` there is the pod's
environment, with the job key: Landlock's ptrace rule denies ``mem`` and attaching, not the read-mode ``environ``)
-- Landlock grants, it cannot deny beneath a grant, so the grants are the siblings of each folder on the way down
to a hidden one. ABI >= 6 also scopes signals (no kill of the role or of PID 1).

Invariants: the domain holds across ``exec`` and for every descendant, and cannot be lifted; when CONFIG asks for
Landlock and it cannot be applied the program is not run (exit ``REFUSED``: fail closed, the parent probed first).
"""
import ctypes
import json
import os
import resource
import sys
from collections.abc import Sequence

PR_SET_NO_NEW_PRIVS = 38
SYS_CREATE_RULESET, SYS_ADD_RULE, SYS_RESTRICT_SELF = 444, 445, 446   # same numbers on x86_64 and aarch64
RULE_PATH_BENEATH = 1
FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE = 1 << 0, 1 << 1, 1 << 2
FS_WRITE_TREE = (1 << 1) | sum(1 << b for b in range(4, 13))          # write, remove, make-*
FS_REFER, FS_TRUNCATE, FS_IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1
SCOPE_ABSTRACT_UNIX, SCOPE_SIGNAL = 1 << 0, 1 << 1
REFUSED = 126


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def abi() -> int:
    """The kernel's Landlock ABI version, 0 when there is none (old kernel, not in the LSM list, seccomp)."""
    try:
        version = int(_libc().syscall(SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(1)))
    except (OSError, AttributeError):
        return 0
    return max(version, 0)


def fs_known(version: int) -> int:
    """The file-system rights ABI ``version`` knows (handling one it does not is EINVAL)."""
    known = FS_WRITE_TREE | FS_EXECUTE | FS_READ_FILE | (1 << 3)
    return known | (FS_REFER if version >= 2 else 0) | (FS_TRUNCATE if version >= 3 else 0) | (
        FS_IOCTL_DEV if version >= 5 else 0)


def landlock(*, fs: int, rules: Sequence[tuple[str, int]], net: int = 0, scope: int = 0) -> int:
    """Restrict this process and its descendants: the ``fs`` rights are denied except beneath ``rules``' paths
    (path, rights); ``net`` (ABI >= 4) and ``scope`` (ABI >= 6) where the kernel knows them. Returns the ABI
    used, 0 when Landlock is not there; raises ``OSError`` when it is there and refuses."""
    version = abi()
    if version <= 0:
        return 0
    libc = _libc()
    fs &= fs_known(version)
    attr = (ctypes.c_uint64 * 3)(fs, net if version >= 4 else 0, scope if version >= 6 else 0)
    size = 8 if version < 4 else 16 if version < 6 else 24
    fd = int(libc.syscall(SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0)))
    if fd < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset")
    try:
        for path, access in rules:
            try:
                pfd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except FileNotFoundError:     # gone since it was listed (a /proc/<pid> whose process exited): a rule
                continue                  # left out only denies more, never grants
            try:
                rule = _PathBeneath(access & fs, pfd)
                if libc.syscall(SYS_ADD_RULE, fd, RULE_PATH_BENEATH, ctypes.byref(rule), 0) != 0:
                    raise OSError(ctypes.get_errno(), f"landlock_add_rule {path}")
            finally:
                os.close(pfd)
        if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(NO_NEW_PRIVS)")
        if libc.syscall(SYS_RESTRICT_SELF, fd, 0) != 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self")
    finally:
        os.close(fd)
    return version


def readable_except(hidden: Sequence[str]) -> list[str]:
    """Paths beneath which reading leaves out exactly the ``hidden`` folders that exist: every sibling of each
    folder on the way down to a hidden one. Symbolic links are left out (granting one grants its target, which
    may be hidden); a path through a link is checked where it resolves."""
    real = {os.path.realpath(h) for h in hidden if os.path.lexists(h)}
    if not real:
        return ["/"]
    on_the_way = {os.path.dirname(p) for h in real for p in _ancestry(h)} - {""}
    keep = real | {p for h in real for p in _ancestry(h)}
    out: list[str] = []
    for d in sorted(on_the_way - real):
        try:
            entries = list(os.scandir(d))
        except OSError:
            continue
        out.extend(e.path for e in entries if e.path not in keep and not e.is_symlink())
    return sorted(out)


def other_processes() -> list[str]:
    """``/proc/<pid>`` of every process but this one: their ``environ`` (the pod's environment, with the job key)
    must not be read. A process started later has no grant either; this one keeps ``/proc/self``."""
    me = str(os.getpid())
    try:
        return [f"/proc/{n}" for n in os.listdir("/proc") if n.isdigit() and n != me]
    except OSError:
        return []


def _ancestry(path: str) -> list[str]:
    """``/a/b/c`` -> ``[/a, /a/b, /a/b/c]``."""
    parts = [p for p in path.split("/") if p]
    return ["/" + "/".join(parts[:i + 1]) for i in range(len(parts))]


def limit(*, memory_mib: int = 0, cpu_s: int = 0, nofile: int = 0) -> None:
    """Hard and soft rlimits: address space, CPU seconds, open files (0: left as they are); no core files."""
    for name, value in (("RLIMIT_AS", memory_mib << 20), ("RLIMIT_CPU", cpu_s), ("RLIMIT_NOFILE", nofile)):
        if value > 0:
            resource.setrlimit(getattr(resource, name), (value, value))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def main() -> None:
    cfg = json.loads(sys.argv[1])
    argv = sys.argv[2:]
    try:
        limit(memory_mib=int(cfg.get("memory_mib", 0)), cpu_s=int(cfg.get("cpu_s", 0)),
              nofile=int(cfg.get("nofile", 0)))
        if cfg.get("landlock"):
            hide = [*cfg["hide"], *other_processes()]
            used = landlock(fs=FS_READ_FILE, rules=[(p, FS_READ_FILE) for p in readable_except(hide)],
                            scope=SCOPE_SIGNAL)
            if used <= 0:
                raise OSError("Landlock was probed as available but is not")
    except (OSError, ValueError) as e:
        print(f"confine: refusing to run {argv[:1]}: {e}", file=sys.stderr)
        sys.exit(REFUSED)
    try:
        os.execv(argv[0], argv)
    except OSError as e:             # no such program: say so, as a failed start would
        print(f"confine: cannot run {argv[:1]}: {e}", file=sys.stderr)
        sys.exit(127)


if __name__ == "__main__":
    main()
