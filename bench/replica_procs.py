"""Finds the processes of a running app's Ray Serve replicas on this machine, their memory and CPU time.

Ray names each replica's worker process after its actor class, `ray::ServeReplica:<app>:<deployment>`
(a method call in progress appends `.<method>()`), so /proc/<pid>/cmdline tells which process is which
replica without Ray's state API (which needs the dashboard). Reads /proc only; signals nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

PAGE_KIB = 4


def replica_pids(app: str, deployment: str) -> list[int]:
    """PIDs of the live replicas of `deployment` in Serve application `app`, sorted."""
    prefix = f"ray::ServeReplica:{app}:{deployment}"
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        title = _read(cmdline).replace("\0", " ").strip()
        if title == prefix or title.startswith((prefix + ".", prefix + " ")):
            pids.append(int(cmdline.parent.name))
    return sorted(pids)


def rss_mib(pid: int) -> float | None:
    """Resident set size of `pid` in MiB, or None if it is gone."""
    for line in _read(Path(f"/proc/{pid}/status")).splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return None


def cpu_seconds(pid: int) -> float | None:
    """User plus system CPU time `pid` has used, in seconds, or None if it is gone."""
    fields = _read(Path(f"/proc/{pid}/stat")).rsplit(")", 1)[-1].split()
    if len(fields) <= 12:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""
