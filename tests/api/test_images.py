"""Images in chat requests at the HTTP edge: OpenAI image_url parts and Anthropic image blocks become
image parts plus URLs; data URLs decode; local files and odd schemes are refused; limits hold."""

import asyncio
import base64
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from api.anthropic_convert import chat_prompt, check_supported
from api.anthropic_schemas import MessagesRequest
from api.config import ImageLimitsConfig
from api.errors import ApiError
from api.images import load_images
from api.openai_convert import chat_image_urls, chat_messages, check_chat_supported
from api.openai_schemas import ChatCompletionRequest

PNG = b"\x89PNG\r\n\x1a\n not checked here: decoding is the Tokenizer's"
DATA_URL = "data:image/png;base64," + base64.b64encode(PNG).decode()


def _openai(content) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": content}]}
    )


def test_openai_image_url_parts_become_image_parts_and_urls_in_order():
    req = _openai(
        [
            {"type": "text", "text": "Compare"},
            {"type": "image_url", "image_url": {"url": DATA_URL}},
            {"type": "image_url", "image_url": {"url": "https://example.com/b.png", "detail": "auto"}},
        ]
    )
    check_chat_supported(req)
    assert chat_messages(req) == [
        {
            "role": "user",
            "content": [{"type": "text", "text": "Compare"}, {"type": "image"}, {"type": "image"}],
        }
    ]
    assert chat_image_urls(req) == [DATA_URL, "https://example.com/b.png"]


def test_openai_text_parts_alone_stay_one_string():
    req = _openai([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}])
    assert chat_messages(req) == [{"role": "user", "content": "a\nb"}]
    assert chat_image_urls(req) == []


@pytest.mark.parametrize(
    ("image_url", "param"),
    [
        ({}, "messages[0].content[0].image_url.url"),
        ({"url": DATA_URL, "detail": "high"}, "messages[0].content[0].image_url.detail"),
        ({"url": DATA_URL, "size": 3}, "messages[0].content[0].image_url"),
    ],
)
def test_openai_bad_image_parts_are_400s_naming_the_field(image_url, param):
    with pytest.raises(ApiError) as err:
        check_chat_supported(_openai([{"type": "image_url", "image_url": image_url}]))
    assert err.value.status == 400 and err.value.param == param


def _anthropic(content) -> MessagesRequest:
    return MessagesRequest.model_validate(
        {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": content}]}
    )


def test_anthropic_image_blocks_become_image_parts_and_urls():
    data = base64.b64encode(PNG).decode()
    req = _anthropic(
        [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}},
            {"type": "image", "source": {"type": "url", "url": "https://example.com/c.jpg"}},
            {"type": "text", "text": "What differs?"},
        ]
    )
    check_supported(req)
    prompt = chat_prompt(req)
    assert prompt.messages == [
        {
            "role": "user",
            "content": [{"type": "image"}, {"type": "image"}, {"type": "text", "text": "What differs?"}],
        }
    ]
    assert prompt.image_urls == (DATA_URL, "https://example.com/c.jpg")


def test_anthropic_base64_image_without_a_known_media_type_is_a_400():
    req = _anthropic(
        [{"type": "image", "source": {"type": "base64", "media_type": "text/plain", "data": "eA=="}}]
    )
    with pytest.raises(ApiError) as err:
        check_supported(req)
    assert err.value.status == 400 and err.value.param == "messages[0].content[0].source"


def _load(urls, **limits):
    return asyncio.run(load_images(urls, ImageLimitsConfig(**limits)))


def test_data_urls_decode_to_their_bytes():
    assert _load([DATA_URL, DATA_URL]) == [PNG, PNG]


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("file:///etc/passwd", "file:// URLs and local paths are refused"),
        ("/etc/passwd", "file:// URLs and local paths are refused"),
        ("ftp://example.com/a.png", "scheme 'ftp' is not served"),
        ("data:image/png,notbase64", "data URL must be"),
        ("data:image/png;base64,@@@", "does not decode"),
    ],
)
def test_local_files_odd_schemes_and_bad_data_urls_are_400s(url, message):
    with pytest.raises(ApiError, match=message) as err:
        _load([url])
    assert err.value.status == 400 and err.value.param == "messages"


def test_local_files_are_read_only_when_allowed(tmp_path):
    image = tmp_path / "a.png"
    image.write_bytes(PNG)
    assert _load([f"file://{image}"], allow_local_files=True) == [PNG]


def test_too_many_and_too_large_images_are_400s():
    with pytest.raises(ApiError, match="3 images, above the limit of 2"):
        _load([DATA_URL] * 3, max_images_per_request=2)
    big = "data:image/png;base64," + base64.b64encode(b"x" * 2048).decode()
    with pytest.raises(ApiError, match="over the limit of 1024 bytes") as err:
        _load([big], max_image_bytes=1024)
    assert err.value.code == "image_too_large"


def test_an_unreachable_url_is_a_400_not_a_hang():
    with pytest.raises(ApiError, match="image 1: fetching") as err:
        _load(["http://127.0.0.1:9/none.png"], fetch_timeout_s=2, allow_private_urls=True)
    assert err.value.status == 400


@pytest.fixture
def image_server() -> Iterator[tuple[str, list[str]]]:
    """A real HTTP server on loopback: /a.png answers the image, /hop redirects to it; it logs paths."""
    hits: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            hits.append(self.path)
            if self.path == "/hop":
                self.send_response(302)
                self.send_header("Location", "/a.png")
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(PNG)))
            self.end_headers()
            self.wfile.write(PNG)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", hits
    finally:
        server.shutdown()


def test_private_addresses_are_refused_before_any_connection(image_server):
    base, hits = image_server
    for url in (f"{base}/a.png", f"{base.replace('127.0.0.1', 'localhost')}/a.png"):
        with pytest.raises(ApiError, match="non-public address") as err:
            _load([url])
        assert err.value.status == 400 and err.value.param == "messages"
    assert hits == []  # refused before a connection was made


@pytest.mark.parametrize("host", ["10.1.2.3", "192.168.0.1", "169.254.169.254", "[::1]", "0.0.0.0"])
def test_private_and_metadata_addresses_are_refused(host):
    with pytest.raises(ApiError, match="non-public address"):
        _load([f"http://{host}/latest/meta-data"])


def test_allowed_private_urls_are_fetched_following_redirects(image_server):
    base, hits = image_server
    assert _load([f"{base}/hop"], allow_private_urls=True) == [PNG]
    assert hits == ["/hop", "/a.png"]


def test_errors_name_the_routes_prompt_field():
    with pytest.raises(ApiError) as err:
        asyncio.run(load_images(["ftp://x/a.png"], ImageLimitsConfig(), "input"))
    assert err.value.param == "input"
