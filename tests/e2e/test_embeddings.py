"""Embeddings through the real Embedder deployment: both encodings, and concurrent requests batched."""

import math
from concurrent.futures import ThreadPoolExecutor

from ray import serve

SENTENCES = [f"sentence number {i} about {topic}" for i, topic in enumerate(["cats", "rain", "maths"] * 4)]


def _cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b))
    return dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def test_base64_default_and_float_agree_and_identical_input_has_cosine_one(client):
    default = client.embeddings.create(model="default", input=["the same text", "the same text"])
    as_float = client.embeddings.create(model="default", input="the same text", encoding_format="float")
    a, b = default.data[0].embedding, default.data[1].embedding
    assert abs(_cosine(a, b) - 1.0) < 1e-6
    assert abs(_cosine(a, as_float.data[0].embedding) - 1.0) < 1e-5
    assert as_float.usage.prompt_tokens * 2 == default.usage.prompt_tokens


def test_concurrent_requests_share_forwards_and_each_gets_its_own_vectors(client):
    alone = [client.embeddings.create(model="default", input=s).data[0].embedding for s in SENTENCES]
    embedder = serve.get_deployment_handle("Embedder", app_name="e2e")
    before = embedder.batch_count.remote().result()
    with ThreadPoolExecutor(len(SENTENCES)) as pool:
        together = list(pool.map(lambda s: client.embeddings.create(model="default", input=s), SENTENCES))
    batches = embedder.batch_count.remote().result() - before
    for vector, response in zip(alone, together):
        assert _cosine(vector, response.data[0].embedding) > 1 - 1e-4
    assert batches < len(SENTENCES)
