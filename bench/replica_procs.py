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


def tree_cpu_seconds(root_pid: int) -> dict[str, float]:
    """CPU seconds used so far by `root_pid` and every process below it, added up by what each is: a
    replica by its deployment (`Scheduler`, `Ingress`, ...), anything else by its program name
    (`raylet`, `haproxy`, ...). Children that already exited are counted only by the kernel's
    cumulative child times of their parent, which this leaves out."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        fields = _read(stat).rsplit(")", 1)[-1].split()
        if len(fields) > 1:
            parents[int(stat.parent.name)] = int(fields[1])
    totals: dict[str, float] = {}
    for pid in parents:
        ancestor = pid
        while ancestor not in (root_pid, 0, 1) and ancestor in parents:
            ancestor = parents[ancestor]
        seconds = cpu_seconds(pid) if ancestor == root_pid else None
        if seconds is not None:
            label = process_label(pid)
            totals[label] = totals.get(label, 0.0) + seconds
    return totals


def process_label(pid: int) -> str:
    title = _read(Path(f"/proc/{pid}/cmdline")).replace("\0", " ").strip()
    return title_label(title) if title else _read(Path(f"/proc/{pid}/comm")).strip()


def title_label(title: str) -> str:
    """What a process is, from its title: a replica by its deployment, another Ray actor by its class,
    each without the method it runs at the moment (Ray names it in the title while it runs: a label
    read once as `ServeController.get_serve_status` and once as `ServeController` counted the
    controller's whole CPU time since its start as one level's), anything else by its program."""
    if title.startswith("ray::ServeReplica:"):
        return title.split(":")[-1].split(".")[0].split()[0]
    if title.startswith("ray::"):
        return title.split()[0][5:].split(".")[0]
    return Path(title.split()[0]).name


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""
