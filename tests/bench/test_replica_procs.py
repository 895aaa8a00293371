"""bench/serve.py's CPU per token by process: a process keeps one label while Ray renames it."""

from bench.replica_procs import title_label


def test_an_actor_keeps_its_label_whatever_method_it_runs():
    assert title_label("ray::ServeController") == "ServeController"
    assert title_label("ray::ServeController.get_serve_status") == "ServeController"
    assert title_label("ray::HAProxyManager.ready") == "HAProxyManager"


def test_a_replica_is_labelled_by_its_deployment():
    assert title_label("ray::ServeReplica:llm:Scheduler") == "Scheduler"
    assert title_label("ray::ServeReplica:llm:Scheduler.handle_request_streaming") == "Scheduler"


def test_other_processes_by_their_program():
    assert title_label("/opt/ray/core/src/ray/gcs/gcs_server --log_dir=/tmp/x") == "gcs_server"
    assert title_label("/work/.venv/bin/python3 /work/.venv/bin/serve run serve_config.yaml") == "python3"
