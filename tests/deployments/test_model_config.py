"""The `models:` list of serve_config.yaml: each entry validated once, the single-model form as its
one-entry list, on-demand models as Ray Serve scale-to-zero autoscaling, and the deployments build_app
binds (one Scheduler per text model, one Tokenizer per tokenizer, one Embedder per embedding model)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from deployments.app import AppConfig, build_app
from deployments.options import POWER_OF_TWO_ROUTER, PREFIX_ROUTER, SchedulerOptions

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "multi-model.yaml"
TWO_MODELS = {
    "models": [
        {"served_model_name": "smol", "aliases": ["chat"]},
        {"model": "bundled:smollm2-135m-instruct-8bit", "served_model_name": "smol-8bit",
         "on_demand": {"idle_timeout_s": 60}},
        {"kind": "embedding"},
    ]
}  # fmt: skip


def _specs(args: dict) -> list:
    """The ModelSpecs build_app binds the Ingress with (its first argument)."""
    return build_app(args)._bound_deployment.init_args[0]


def test_the_single_model_form_is_a_one_entry_list_plus_its_embedder():
    config = AppConfig.model_validate({"engine": {"served_model_name": "s", "max_num_seqs": 8}})
    text, embedding = config.entries()
    assert (text.kind, text.model_id(), text.engine_config().max_num_seqs) == ("text", "s", 8)
    assert (embedding.kind, embedding.model_id()) == ("embedding", "all-MiniLM-L6-v2")
    assert [spec.deployment_names for spec in _specs({})] == [["Scheduler", "Tokenizer"], ["Embedder"]]
    disabled = AppConfig.model_validate({"embedder": {"enabled": False}})
    assert [entry.kind for entry in disabled.entries()] == ["text"]


def test_each_model_gets_its_deployments_and_models_sharing_a_tokenizer_share_one():
    smol, smol_8bit, embedder = _specs(TWO_MODELS)
    assert smol.deployment_names == ["Scheduler-smol", "Tokenizer-smol"]
    assert smol_8bit.deployment_names == ["Scheduler-smol-8bit", "Tokenizer-smol"]
    assert smol_8bit.tokenizer is smol.tokenizer and smol_8bit.on_demand and not smol.on_demand
    assert embedder.deployment_names == ["Embedder-all-MiniLM-L6-v2"] and embedder.kind == "embedding"
    scheduler = smol.scheduler._bound_deployment  # the router keys prompts by the engine's blocks
    assert scheduler._deployment_config.request_router_config.request_router_kwargs == {"block_size": 16}
    assert smol.names[:2] == ["smol", "chat"] and "bundled:smollm2-135m-instruct" in smol.names
    assert "SmolLM2-135M-Instruct-8bit" in smol_8bit.names


def test_an_on_demand_model_scales_from_and_to_zero_after_its_idle_timeout():
    options = SchedulerOptions().actor_options(AppConfig.model_validate(TWO_MODELS).entries()[1].on_demand)
    scaling = options["autoscaling_config"]
    assert "num_replicas" not in options
    assert (scaling["min_replicas"], scaling["initial_replicas"], scaling["max_replicas"]) == (0, 0, 1)
    # the look-back window and the downscale delay add up to the idle timeout
    assert scaling["downscale_delay_s"] == scaling["downscale_to_zero_delay_s"] == 30
    assert scaling["look_back_period_s"] + scaling["downscale_to_zero_delay_s"] == 60
    assert scaling["metrics_interval_s"] < scaling["look_back_period_s"]  # Ray warns otherwise
    assert options["request_router_config"] == {"request_router_class": PREFIX_ROUTER}


def test_deployment_options_pass_autoscaling_gpus_and_custom_resources_to_ray_serve():
    options = SchedulerOptions.model_validate(
        {"autoscaling_config": {"min_replicas": 1, "max_replicas": 3}, "num_gpus": 1,
         "resources": {"node_b": 0.5}, "request_router": "power_of_two"}
    ).actor_options()  # fmt: skip
    assert options["autoscaling_config"] == {"min_replicas": 1, "max_replicas": 3}
    assert options["ray_actor_options"]["num_gpus"] == 1
    assert options["ray_actor_options"]["resources"] == {"node_b": 0.5}
    # Ray's power of two choices, in a router that also sends output channels to their replica
    assert options["request_router_config"] == {"request_router_class": POWER_OF_TWO_ROUTER}
    with pytest.raises(ValidationError, match="num_replicas or autoscaling_config"):
        SchedulerOptions.model_validate({"num_replicas": 2, "autoscaling_config": {"max_replicas": 2}})
    with pytest.raises(ValidationError, match="min_replicas"):
        SchedulerOptions.model_validate({"autoscaling_config": {"min_replicas": 3, "max_replicas": 1}})


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"models": [{"engine": {"model": "x"}}]}, "at the entry's top level"),
        ({"models": [{"served_model_name": "a"}, {"served_model_name": "a"}]}, "used by both"),
        ({"models": [{"served_model_name": "a", "aliases": ["default"]}]}, "names the first model"),
        ({"models": [{"kind": "embedding"}]}, "no text or vision model"),
        (
            {"models": [{}, {"kind": "embedding", "engine": {"max_num_seqs": 4}}]},
            "embedding model takes none",
        ),
        ({"models": [{}], "engine": {"max_num_seqs": 4}}, "go inside a model's entry"),
        ({"models": [{"deployment": {"max_ongoing_requests": 8}}]}, "is below engine.max_num_seqs"),
        ({"models": [{"deployment": {"num_cpu": 1}}]}, "num_cpu"),
        ({"models": [{"kind": "audio"}]}, "kind"),
        ({"models": [{"on_demand": {"idle_timeout_s": 0}}]}, "idle_timeout_s"),
    ],
)
def test_a_wrong_entry_is_refused_with_what_to_change(args, message):
    with pytest.raises(ValidationError, match=message):
        AppConfig.model_validate(args)


def test_the_shipped_multi_model_example_validates_and_fits_two_cores():
    config = yaml.safe_load(EXAMPLE.read_text())
    (application,) = config["applications"]
    app_config = AppConfig.model_validate(application["args"])
    entries = app_config.entries()
    assert [entry.kind for entry in entries] == ["text", "text", "embedding"]
    assert entries[1].on_demand is not None and entries[0].on_demand is None
    reserved = (
        sum((e.scheduler_options() if e.generates else e.embedder_options()).num_cpus for e in entries)
        + sum(e.tokenizer.num_cpus for e in entries[:1])
        + app_config.ingress.num_cpus
        + app_config.response_store.num_cpus
    )
    assert reserved <= 2, "the example must fit a 2-core machine, or replicas stay PENDING"
