"""The soak's committed command line carries no scratch path of the machine that ran it."""

from __future__ import annotations

from bench.soak import recorded_command


def test_an_out_outside_the_checkout_is_recorded_by_file_name():
    assert recorded_command(["--duration-s", "600", "--out", "/tmp/q/soak10.json"]) == (
        "python bench/soak.py --duration-s 600 --out soak10.json"
    )
    assert recorded_command(["--out=/tmp/q/soak.json"]) == "python bench/soak.py --out=soak.json"
    assert recorded_command(["--out", "bench/results/soak.json"]).endswith("--out bench/results/soak.json")
