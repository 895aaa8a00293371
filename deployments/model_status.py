"""Each configured model's card for /v1/models and its block of /v1/status, read without starting it.

Owns what the Ingress reports per model: state (loaded, loading, cold, failed), context length, source,
modalities, cold-start waits and the stats of its running replicas. Asks a replica only when one runs.
"""

from __future__ import annotations

from typing import Any

from api.errors import ApiError
from api.openai_responses import ModelCard
from api.status import status_body
from deployments.messages import ReplicaStats
from deployments.replica_stats import gather_stats
from deployments.served_model import ServedModel


async def model_card(served: ServedModel) -> ModelCard:
    answered = await _learn(served)
    info, spec = served.known_info(), served.spec
    if not spec.generates:
        inputs, outputs = ["text"], ["embedding"]
    else:
        images = info.accepts_images if info is not None else spec.kind == "vision"
        inputs, outputs = (["text", "image"] if images else ["text"]), ["text"]
    return ModelCard(
        id=served.model_id,
        created=0,
        root=spec.root,
        max_model_len=served.max_model_len(),
        input_modalities=inputs,
        output_modalities=outputs,
        state="loaded" if answered else served.state(),  # a replica just answered; the poll may lag
    )


async def _learn(served: ServedModel) -> bool:
    """Asks the model's engine for its facts once it can answer: at once if a replica runs, or waits for
    one that is starting (a model not on demand); never wakes a cold on-demand model or a failed one.
    True if a replica answered."""
    state = served.state()
    if state != "loaded" and (state != "loading" or served.spec.on_demand):
        return False
    try:
        if served.spec.generates:
            await served.info()
        elif served.max_input_tokens is None:
            assert served.embedder is not None
            served.max_input_tokens = await served.embedder.max_input_tokens.remote()
    except ApiError as exc:  # it went down meanwhile: its card says so
        if exc.status != 503:
            raise
        return False
    return True


async def model_status(served: ServedModel, timeout_s: float) -> dict[str, Any]:
    body: dict[str, Any] = {
        "state": served.state(),
        "on_demand": served.spec.on_demand,
        "cold_start": served.cold_waits(),
        "deployments": {
            name: state.describe() for name in served.spec.deployment_names
            if (state := served.deployment_state(name)) is not None
        },
    }  # fmt: skip
    if served.scheduler is None:
        return body
    replicas: list[ReplicaStats] = []
    errors: list[str] = []
    if served.is_warm() and body["state"] != "failed":
        replicas, errors = await gather_stats(served.scheduler, timeout_s)
    channels = {r.replica_id: r.num_output_channels for r in replicas}
    return body | status_body(served.model_id, [(r.replica_id, r.stats) for r in replicas], errors, channels)
