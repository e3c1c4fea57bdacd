"""Sockets and processes on this machine, read from /proc (Linux), for leak checks and clean stops.

Role: answer "which processes belong to this cluster?" and "which TCP ports still listen?" without
external tools. Neighbours: ``lifecycle.down`` uses it to verify (and if needed finish) a stop;
e2e/scripts/check_no_leaks.py and the smoke tests use it to assert nothing is left behind.
Invariant: processes are identified by their command line naming the cluster's work dir, never by name.
"""

from __future__ import annotations

import os
import signal
import socket
import time


def free_ports(count: int, *, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct ports that were free a moment ago (bound together, then released)."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def listening_ports() -> set[int]:
    """TCP ports in LISTEN state (IPv4 and IPv6)."""
    ports: set[int] = set()
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(path) as f:
                next(f)
                for line in f:
                    parts = line.split()
                    if parts[3] == "0A":  # TCP_LISTEN
                        ports.add(int(parts[1].rsplit(":", 1)[1], 16))
        except FileNotFoundError:
            continue
    return ports


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def processes_mentioning(text: str) -> dict[int, str]:
    """pid -> command line of every live process whose command line contains ``text``."""
    me = os.getpid()
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != me:
            cmd = _cmdline(int(entry))
            if text in cmd and not _is_zombie(int(entry)):
                out[int(entry)] = cmd
    return out


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def rss_kib(pid: int) -> int:
    """Resident set size of ``pid`` in KiB (0 if gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def terminate(pids: list[int], *, grace_s: float = 5.0) -> None:
    """SIGTERM the given pids, wait up to ``grace_s``, then SIGKILL survivors."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(not _is_zombie(p) and _alive(p) for p in pids):
        time.sleep(0.1)
    for pid in pids:
        if _alive(pid) and not _is_zombie(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
