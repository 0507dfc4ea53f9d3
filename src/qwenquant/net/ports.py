"""Who listens on a TCP port, and is a port free: /proc on Linux, psutil elsewhere."""

from __future__ import annotations

import os
import socket
from pathlib import Path

_LISTEN = "0A"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _listen_inodes(port: int) -> set[str]:
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) > 9 and f[3] == _LISTEN and int(f[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f[9])
    return inodes


def listener_pids(port: int) -> set[int]:
    """Pids holding a listening socket on `port` (only processes we may inspect)."""
    if not Path("/proc/net/tcp").exists():
        return _listener_pids_psutil(port)
    inodes = _listen_inodes(port)
    if not inodes:
        return set()
    targets = {f"socket:[{i}]" for i in inodes}
    pids: set[int] = set()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            for fd in (d / "fd").iterdir():
                if os.readlink(fd) in targets:
                    pids.add(int(d.name))
                    break
        except OSError:  # gone, or not ours to read
            continue
    if not pids:  # listening, but by a process we cannot see: say so with a pid of -1
        pids.add(-1)
    return pids


def _listener_pids_psutil(port: int) -> set[int]:
    import psutil

    return {
        c.pid if c.pid is not None else -1
        for c in psutil.net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port
    }


def process_tree(pid: int) -> set[int]:
    """`pid` and all its descendants."""
    children: dict[int, list[int]] = {}
    proc = Path("/proc")
    if not proc.exists():
        import psutil

        try:
            return {pid} | {c.pid for c in psutil.Process(pid).children(recursive=True)}
        except psutil.NoSuchProcess:
            return {pid}
    for d in proc.iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(d.name))
    out, todo = set(), [pid]
    while todo:
        p = todo.pop()
        if p not in out:
            out.add(p)
            todo += children.get(p, [])
    return out


def port_problem(host: str, port: int) -> str | None:
    """None when `host:port` can be bound now, else why not (with the holder's pid when visible)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does: TIME_WAIT is fine
        try:
            s.bind((host, port))
        except OSError as e:
            holders = sorted(p for p in listener_pids(port) if p > 0)
            who = f" by pid {', '.join(map(str, holders))}" if holders else ""
            return f"port {port} on {host} is already in use{who} ({e.strerror})"
    return None
