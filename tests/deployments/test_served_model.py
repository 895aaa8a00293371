"""How the Ingress resolves a request's `model` among several models, and each model's state as
Ray Serve's status snapshots (given by hand here, no Ray) make it."""

from __future__ import annotations

import pytest

from api.errors import ApiError
from deployments.deployment_health import DeploymentWatch, deployment_state
from deployments.served_model import ModelSpec, ModelTable, ServedModel

FAILED = "A replica failed to start with exception. Retrying 2 more time(s). Error:\nModelLoadError: no such directory"


def _table(watch: DeploymentWatch) -> ModelTable:
    specs = [
        ModelSpec("chat", ["chat", "c", "/m/chat", "chat-dir"], "text", "/m/chat", deployment_names=["S-chat", "T"]),
        ModelSpec("coder", ["coder", "/m/coder"], "text", "/m/coder", on_demand=True, deployment_names=["S-coder", "T"]),
        ModelSpec("emb", ["emb"], "embedding", "emb", deployment_names=["E-emb"]),
    ]  # fmt: skip
    return ModelTable([ServedModel(spec, watch) for spec in specs])


def test_default_names_the_first_model_of_the_routes_kind_and_every_name_resolves():
    table = _table(DeploymentWatch(dict))
    assert table.generator("default").model_id == "chat" and table.embedder("default").model_id == "emb"
    assert [table.generator(n).model_id for n in ("c", "/m/chat", "chat-dir", "coder")] == [
        "chat", "chat", "chat", "coder"
    ]  # fmt: skip
    assert table.find("emb").model_id == "emb"


@pytest.mark.parametrize("name", ["nope", "emb"])
def test_an_unknown_name_or_another_kinds_model_is_a_404_listing_the_routes_models(name):
    with pytest.raises(ApiError) as raised:
        _table(DeploymentWatch(dict)).generator(name)
    assert raised.value.status == 404 and raised.value.code == "model_not_found"
    assert raised.value.message.endswith("this server serves 'chat', 'coder'.")


def test_states_follow_ray_serves_status_and_a_failed_model_is_a_503_naming_it():
    watch = DeploymentWatch(dict)
    chat, coder, emb = _table(watch).models
    watch.apply({
        "S-chat": deployment_state("S-chat", "HEALTHY", {"RUNNING": 1}, ""),
        "T": deployment_state("T", "HEALTHY", {"RUNNING": 1}, ""),
        "S-coder": deployment_state("S-coder", "HEALTHY", {}, ""),
        "E-emb": deployment_state("E-emb", "UPDATING", {"STARTING": 1}, FAILED),
    })  # fmt: skip
    assert (chat.state(), coder.state(), emb.state()) == ("loaded", "cold", "failed")
    assert chat.is_warm() and not coder.is_warm()
    with pytest.raises(ApiError) as raised:
        emb.check_serving()
    assert raised.value.status == 503 and "the model 'emb' cannot serve" in raised.value.message
    watch.apply(watch.states() | {"S-coder": deployment_state("S-coder", "UPSCALING", {"STARTING": 1}, "")})
    assert coder.state() == "loading"
    coder.cold_wait_started(1)
    assert coder.cold_waits()["num_waiting"] == 1
    watch.apply(watch.states() | {"S-coder": deployment_state("S-coder", "HEALTHY", {"RUNNING": 1}, "")})
    assert coder.state() == "loaded" and coder.cold_waits()["num_waiting"] == 0
