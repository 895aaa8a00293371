"""A two-node Ray cluster on this machine, in a process of its own, for tests that deploy onto it.

`python -m tests.e2e.two_node_cluster RESOURCE` starts a head node and a second node that declares the
custom resource RESOURCE, prints `address <gcs address>` once both are up, and shuts both down on
SIGTERM or when its stdin closes. Its own process: the test process may hold another Ray session.
"""

from __future__ import annotations

import signal
import sys
import threading

NUM_CPUS_PER_NODE = 2


def main(resource: str) -> None:
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": NUM_CPUS_PER_NODE, "include_dashboard": False},
    )
    done = threading.Event()
    try:
        cluster.add_node(num_cpus=NUM_CPUS_PER_NODE, resources={resource: 1})
        cluster.wait_for_nodes()
        signal.signal(signal.SIGTERM, lambda *_: done.set())
        threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
        print(f"address {cluster.address}", flush=True)
        done.wait()
    finally:
        cluster.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
