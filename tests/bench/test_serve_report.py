"""Committed benchmark results name their --out file without any machine's scratch paths; the CPU
accounting of a server's process tree and its one-line split."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from bench import replica_procs, serve_report
from bench.serve_report import recorded_out

REPO = Path("/checkout/mlx-ray-serve")


def test_an_out_inside_the_checkout_stays_relative():
    assert recorded_out("bench/results/serve.json", REPO) == "bench/results/serve.json"
    assert recorded_out(f"{REPO}/bench/results/serve.json", REPO) == "bench/results/serve.json"


def test_an_out_elsewhere_keeps_only_its_file_name():
    assert recorded_out("/tmp/exp/pairs/p1.json", REPO) == "p1.json"
    assert recorded_out("../elsewhere/p2.json", REPO) == "p2.json"


def test_the_cpu_split_names_the_largest_process_kinds_and_adds_up_the_rest():
    cpu = {"Scheduler": 6.3, "Ingress": 0.28, "raylet": 0.2, "haproxy": 0.1, "gcs_server": 0.05, "x": 0.05}
    assert serve_report.cpu_split(cpu | {"total": 6.98}) == (
        "Scheduler 6.30, Ingress 0.28, raylet 0.20, haproxy 0.10, other 0.10"
    )
    assert serve_report.cpu_split({}) == ""


def test_the_process_tree_cpu_counts_busy_descendants_by_program_and_nothing_outside_it():
    child = subprocess.Popen(["sh", "-c", "i=0; while [ $i -lt 400000 ]; do i=$((i+1)); done; sleep 5"])
    try:
        deadline_s = time.monotonic() + 20
        while (replica_procs.cpu_seconds(child.pid) or 0) < 0.2:  # until the loop has burnt some CPU
            assert time.monotonic() < deadline_s, "the busy child never ran"
            time.sleep(0.05)
        mine, childs = replica_procs.tree_cpu_seconds(os.getpid()), replica_procs.tree_cpu_seconds(child.pid)
    finally:
        child.kill()
        child.wait()
    assert mine["sh"] >= 0.2 and childs["sh"] >= 0.2
    assert set(childs) == {"sh"}  # its parent (this test's process) is outside its tree
