"""A short soak against the session app: every request answered or cleanly cancelled, nothing leaked.

The full 10-minute run is bench/soak.py (figures in docs/reliability.md); this one proves the same
invariants in CI: no error and no hang among mixed, partly cancelled, partly prefix-sharing streams,
then every Scheduler replica idle with no KV block held. No timing assertion.
"""

from __future__ import annotations

import asyncio

import pytest

from bench.soak import run_soak
from bench.soak_load import LoadConfig

pytestmark = pytest.mark.e2e

CI_LOAD = LoadConfig(num_clients=8, duration_s=45, cancel_fraction=0.2, shared_prefix_fraction=0.3)


def test_a_short_soak_answers_or_cancels_every_request_and_leaks_no_block(base_url):
    report = asyncio.run(run_soak(base_url, "e2e", CI_LOAD, sample_interval_s=5.0, warmup_s=20.0))
    outcomes = report["outcomes"]
    print(f"soak: {report['num_requests']} requests {outcomes}; idle {report['idle_after_s']} s after")
    print(f"soak memory: {report['memory']}")
    assert set(outcomes) <= {"completed", "cancelled"}, report["errors"]
    assert outcomes.get("completed", 0) > 0 and outcomes.get("cancelled", 0) > 0, outcomes
    assert report["idle"] and report["no_blocks_held"], report["final_total"]
    assert report["final_total"]["num_blocks_free"] == report["final_total"]["num_blocks_total"]
    # The sampler really saw the replicas: two Scheduler processes with a resident model.
    assert len(report["samples"][-1]["scheduler_rss_mib"]) == 2, report["samples"][-1]
