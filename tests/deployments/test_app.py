"""The builder's config: serve_config.yaml validates, and the Ray Serve defaults that bite are overridden."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from deployments.app import AppConfig

SERVE_CONFIG = Path(__file__).resolve().parents[2] / "serve_config.yaml"


def test_serve_config_yaml_names_the_builder_and_validates():
    config = yaml.safe_load(SERVE_CONFIG.read_text())
    (application,) = config["applications"]
    assert application["import_path"] == "deployments.app:build_app"
    assert config["http_options"] == {"host": "127.0.0.1", "port": 8000}
    app_config = AppConfig.model_validate(application["args"])
    total_cpus = sum(
        options.num_cpus * options.num_replicas
        for options in (app_config.scheduler, app_config.tokenizer, app_config.embedder, app_config.ingress)
    )
    assert total_cpus <= 2, "the shipped config must fit a 2-core machine, or replicas stay PENDING"


def test_defaults_raise_ray_serves_max_ongoing_requests_of_5():
    config = AppConfig()
    assert config.scheduler.max_ongoing_requests >= config.engine.max_num_seqs
    assert config.ingress.max_ongoing_requests > 5
    assert config.ingress.num_cpus < 1 and config.tokenizer.num_cpus < 1


def test_scheduler_slots_below_the_batch_size_are_refused():
    with pytest.raises(ValidationError, match="max_ongoing_requests 8 is below engine.max_num_seqs 64"):
        AppConfig.model_validate({"scheduler": {"max_ongoing_requests": 8}})


def test_a_waiting_bound_that_ray_serve_would_hide_is_refused():
    args = {
        "engine": {"max_num_seqs": 64, "max_waiting_requests": 64},
        "scheduler": {"max_ongoing_requests": 128},
    }
    with pytest.raises(
        ValidationError, match="must exceed engine.max_num_seqs . engine.max_waiting_requests"
    ):
        AppConfig.model_validate(args)
    args["scheduler"]["max_ongoing_requests"] = 130  # 128 + the Ingress replica's output channel
    assert AppConfig.model_validate(args).engine.max_waiting_requests == 64


def test_the_ingress_output_channels_count_against_the_scheduler_slots():
    """Each Ingress replica's output channel holds a slot of every Scheduler replica for good."""
    args: dict = {
        "engine": {"max_num_seqs": 8, "max_waiting_requests": 4},
        "scheduler": {"max_ongoing_requests": 14},
        "ingress": {"autoscaling_config": {"min_replicas": 1, "max_replicas": 2}},
    }
    with pytest.raises(ValidationError, match="14 less 2 for the Ingress replicas' output channels"):
        AppConfig.model_validate(args)
    assert AppConfig.model_validate(args | {"output_channels": False}).output_channels is False
    args["scheduler"]["max_ongoing_requests"] = 15
    assert AppConfig.model_validate(args).output_channels is True


def test_the_stream_batch_rate_is_positive_or_off():
    assert AppConfig().max_stream_batches_per_s == 200  # 16 streams: a batch each per 80 ms at most
    assert AppConfig.model_validate({"max_stream_batches_per_s": None}).max_stream_batches_per_s is None
    with pytest.raises(ValidationError, match="max_stream_batches_per_s"):
        AppConfig.model_validate({"max_stream_batches_per_s": 0})


def test_unknown_keys_are_refused():
    with pytest.raises(ValidationError, match="schedular"):
        AppConfig.model_validate({"schedular": {}})
    with pytest.raises(ValidationError, match="max_num_seq"):
        AppConfig.model_validate({"engine": {"max_num_seq": 4}})


def test_actor_options_carry_fractional_cpus():
    options = AppConfig.model_validate({"tokenizer": {"num_cpus": 0.1}}).tokenizer.actor_options()
    assert options == {
        "num_replicas": 1,
        "max_ongoing_requests": 64,
        "graceful_shutdown_timeout_s": 5.0,
        "graceful_shutdown_wait_loop_s": 0.5,
        "ray_actor_options": {"num_cpus": 0.1},
    }


def test_num_threads_reaches_the_scheduler_env_only_when_set():
    assert AppConfig().scheduler.runtime_env() == {}
    env = AppConfig.model_validate({"scheduler": {"num_threads": 1}}).scheduler.runtime_env()["env_vars"]
    assert env == {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}


def test_security_and_limits_default_to_open_with_a_body_limit_and_a_timeout():
    config = AppConfig()
    assert config.security.api_keys == [] and config.security.cors_allow_origins == []
    assert config.limits.max_body_bytes == 10 * 1024 * 1024 and config.limits.rate_limit is None
    assert config.limits.request_timeout_s == 600


def test_security_and_limits_are_validated():
    config = AppConfig.model_validate(
        {"security": {"api_keys": ["sk-1"]}, "limits": {"rate_limit": {"requests_per_minute": 30}}}
    )
    assert config.security.api_keys == ["sk-1"] and config.limits.rate_limit.bucket_size == 30
    with pytest.raises(ValidationError, match="api_key"):
        AppConfig.model_validate({"security": {"api_key": ["sk-1"]}})
    with pytest.raises(ValidationError, match="requests_per_minute"):
        AppConfig.model_validate({"limits": {"rate_limit": {"requests_per_minute": 0}}})
