"""Images end to end: a second app serves a tiny random-weight VLM (tests/tiny_vlms/core.py: Gemma 3,
then Qwen3-VL with M-RoPE and DeepStack) beside the session app, at route prefix /vlm; the real openai and
anthropic SDKs send images through it (data: URLs, base64 blocks, http URLs, /v1/responses input_image),
8 concurrent requests with different pictures answer as they do one at a time, and the 400 cases
(text-only model, non-image bytes, too many images, file:// URL) come back clean."""

import base64
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.e2e.conftest import _wait_healthy
from tests.tiny_vlm import png_bytes
from tests.tiny_vlms.core import build_gemma3, build_qwen3_vl

pytestmark = pytest.mark.e2e

MAX_IMAGES = 2
BUILDERS = {"gemma3": build_gemma3, "qwen3_vl": build_qwen3_vl}


def _image_tokens(model_dir: str) -> int:
    """Image tokens of png_bytes' default picture, as the model's processor expands it."""
    from engine.models.vision_probe import render_user_turn
    from engine.prompt.image_processor import ImagePreprocessor

    processor = ImagePreprocessor.load(model_dir)
    ids, _ = processor.process(render_user_turn(processor.processor, "x", 1), [png_bytes(1)], 10**8)
    return ids.count(processor.image_token_id)


@pytest.fixture(scope="module", params=list(BUILDERS))
def vlm(request, base_url: str, tmp_path_factory) -> Iterator[tuple[str, int]]:
    """(the app's URL, image tokens per default picture), for each tiny VLM in turn."""
    from ray import serve

    from deployments.app import build_app

    model_dir = BUILDERS[request.param](tmp_path_factory.mktemp(f"tiny-{request.param}"), 0)
    image_tokens = _image_tokens(str(model_dir))
    args = {
        "engine": {
            "model": str(model_dir),
            "max_num_seqs": 8,
            "kv_cache_memory_bytes": 8 << 20,
            "block_size": 4,
        },
        "scheduler": {"num_cpus": 0.1, "num_threads": 1, "max_ongoing_requests": 16},
        "tokenizer": {"num_cpus": 0.1},
        "ingress": {"num_cpus": 0.1},
        "response_store": {"num_cpus": 0},
        "embedder": {"enabled": False},
        "limits": {"images": {"max_images_per_request": MAX_IMAGES, "allow_private_urls": True}},
    }
    serve.run(build_app(args), name="vlm", route_prefix="/vlm")
    url = f"{base_url}/vlm"
    _wait_healthy(url)
    try:
        yield url, image_tokens
    finally:
        serve.delete("vlm")


@pytest.fixture
def vlm_url(vlm) -> str:
    return vlm[0]


def _data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def _openai(url: str):
    import openai

    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)


def _image_message(*urls: str) -> list[dict]:
    parts = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    return [{"role": "user", "content": [*parts, {"type": "text", "text": "What is in the picture?"}]}]


def test_openai_sdk_sends_a_data_url_image(vlm):
    vlm_url, image_tokens = vlm
    client = _openai(vlm_url)
    with_image = client.chat.completions.create(
        model="default", messages=_image_message(_data_url(png_bytes(1))), max_tokens=6, temperature=0
    )
    text_only = client.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": "What is in the picture?"}],
        max_tokens=6,
        temperature=0,
    )
    # The processor expanded the image into its image tokens (plus wrapper tokens).
    assert with_image.usage.prompt_tokens >= text_only.usage.prompt_tokens + image_tokens
    assert with_image.usage.completion_tokens == 6 and with_image.choices[0].message.content


def test_models_list_the_vision_model_with_its_modalities(vlm_url, base_url):
    card = _openai(vlm_url).models.list().data[0]
    assert card.model_extra["input_modalities"] == ["text", "image"]
    text_card = _openai(base_url).models.list().data[0]
    assert text_card.model_extra["input_modalities"] == ["text"]


def test_eight_concurrent_pictures_answer_as_one_at_a_time(vlm_url):
    from concurrent.futures import ThreadPoolExecutor

    client = _openai(vlm_url)

    def ask(seed: int) -> list:
        reply = client.chat.completions.create(
            model="default",
            messages=_image_message(_data_url(png_bytes(100 + seed, (40 + 8 * seed, 48)))),
            max_tokens=8,
            temperature=0,
            logprobs=True,
            extra_body={"ignore_eos": True},
        )
        return [(t.token, t.logprob) for t in reply.choices[0].logprobs.content]

    alone = [ask(seed) for seed in range(8)]
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(ask, range(8)))
    for one, batched in zip(alone, together):
        assert [t for t, _ in batched] == [t for t, _ in one]
        assert [lp for _, lp in batched] == pytest.approx([lp for _, lp in one], abs=2e-3)
    assert len({tuple(answer) for answer in alone}) == 8  # each picture reaches its answer


def test_openai_stream_with_an_image(vlm_url):
    stream = _openai(vlm_url).chat.completions.create(
        model="default", messages=_image_message(_data_url(png_bytes(2))), max_tokens=5, stream=True
    )
    chunks = list(stream)
    assert chunks[-1].choices[0].finish_reason in ("length", "stop")


def test_anthropic_sdk_sends_a_base64_image(vlm_url):
    import anthropic

    client = anthropic.Anthropic(base_url=vlm_url, api_key="unused", max_retries=0, timeout=120)
    source = {"type": "base64", "media_type": "image/png", "data": base64.b64encode(png_bytes(3)).decode()}
    content = [{"type": "image", "source": source}, {"type": "text", "text": "Describe it."}]
    reply = client.messages.create(
        model="default", max_tokens=6, messages=[{"role": "user", "content": content}]
    )
    assert reply.usage.output_tokens == 6 and reply.stop_reason == "max_tokens"
    count = client.messages.count_tokens(model="default", messages=[{"role": "user", "content": content}])
    assert count.input_tokens == reply.usage.input_tokens


def _bad_request(client, messages) -> dict:
    import openai

    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="default", messages=messages, max_tokens=4)
    return err.value.body


def test_text_only_model_refuses_an_image(client):
    body = _bad_request(client, _image_message(_data_url(png_bytes(1))))
    assert "accepts no images" in body["message"] and body["param"] == "messages"


def test_bytes_that_are_no_image_are_a_400(vlm_url):
    body = _bad_request(_openai(vlm_url), _image_message(_data_url(b"plain text, not a picture")))
    assert "could not be decoded as an image" in body["message"]


def test_too_many_images_are_a_400(vlm_url):
    body = _bad_request(
        _openai(vlm_url), _image_message(*[_data_url(png_bytes(i)) for i in range(MAX_IMAGES + 1)])
    )
    assert f"above the limit of {MAX_IMAGES}" in body["message"]


def test_file_urls_are_refused(vlm_url):
    body = _bad_request(_openai(vlm_url), _image_message("file:///etc/hostname"))
    assert "file:// URLs and local paths are refused" in body["message"]


def test_anthropic_image_to_a_text_only_model_is_an_anthropic_400(base_url):
    import anthropic

    client = anthropic.Anthropic(base_url=base_url, api_key="unused", max_retries=0, timeout=120)
    source = {"type": "base64", "media_type": "image/png", "data": base64.b64encode(png_bytes(1)).decode()}
    with pytest.raises(anthropic.BadRequestError, match="accepts no images"):
        client.messages.create(
            model="default",
            max_tokens=4,
            messages=[{"role": "user", "content": [{"type": "image", "source": source}]}],
        )


@pytest.fixture(scope="module")
def image_host() -> Iterator[str]:
    """A real HTTP server on loopback serving one PNG at /cat.png (the VLM app allows private URLs)."""
    picture = png_bytes(7)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/cat.png" else 404)
            self.send_header("Content-Type", "image/png")
            self.end_headers()
            if self.path == "/cat.png":
                self.wfile.write(picture)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def test_an_http_image_url_is_fetched_and_equals_the_same_bytes_inline(vlm_url, image_host):
    client = _openai(vlm_url)

    def reply(url: str):
        return client.chat.completions.create(
            model="default", messages=_image_message(url), max_tokens=6, temperature=0
        )

    fetched, inline = reply(f"{image_host}/cat.png"), reply(_data_url(png_bytes(7)))
    assert fetched.choices[0].message.content == inline.choices[0].message.content
    assert fetched.usage.prompt_tokens == inline.usage.prompt_tokens
    body = _bad_request(client, _image_message(f"{image_host}/missing.png"))
    assert "answered HTTP 404" in body["message"]


def test_responses_input_image_and_a_follow_up_that_replays_it(vlm):
    vlm_url, image_tokens = vlm
    client = _openai(vlm_url)
    url = _data_url(png_bytes(8))
    question = "What is in the picture?"
    content = [{"type": "input_image", "image_url": url}, {"type": "input_text", "text": question}]
    first = client.responses.create(
        model="default", input=[{"role": "user", "content": content}], max_output_tokens=4, temperature=0
    )
    text_only = client.responses.create(model="default", input=question, max_output_tokens=4, temperature=0)
    assert first.usage.input_tokens >= text_only.usage.input_tokens + image_tokens
    follow_up = client.responses.create(
        model="default",
        input="And its colours?",
        previous_response_id=first.id,
        max_output_tokens=4,
        temperature=0,
    )
    # The stored turn's image is replayed: the same conversation through chat completions, image
    # included, has the same prompt and gives the same answer.
    same = client.chat.completions.create(
        model="default",
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": url}},
                    {"type": "text", "text": question},
                ],
            },
            {"role": "assistant", "content": first.output_text},
            {"role": "user", "content": "And its colours?"},
        ],
        max_tokens=4,
        temperature=0,
    )
    assert follow_up.usage.input_tokens == same.usage.prompt_tokens
    assert follow_up.output_text == same.choices[0].message.content
