"""Image URLs of chat requests -> the images' bytes: data URLs decoded, http(s) URLs fetched under a
size limit and a timeout, local files (file:// or a path) refused unless the config allows them.

Owns the rule that no request makes the server read a local file by default. Decoding the bytes as an
image is the Tokenizer's (engine/image_processor.py). Errors are 400s naming `messages`. No Ray, no MLX.
"""

from __future__ import annotations

import base64
import binascii
from pathlib import Path
from urllib.parse import unquote, urlparse

import httpx

from api.config import ImageLimitsConfig
from api.errors import ApiError, invalid

PARAM = "messages"


async def load_images(urls: list[str], limits: ImageLimitsConfig) -> list[bytes]:
    """Every image's bytes, in prompt order; the first bad one is a 400."""
    if len(urls) > limits.max_images_per_request:
        raise invalid(
            PARAM,
            f"the request has {len(urls)} images, above the limit of {limits.max_images_per_request}; "
            "send fewer images",
        )
    return [await load_image(url, i + 1, limits) for i, url in enumerate(urls)]


async def load_image(url: str, index: int, limits: ImageLimitsConfig) -> bytes:
    scheme = urlparse(url).scheme.lower()
    if scheme == "data":
        data = _decode_data_url(url, index)
    elif scheme in ("http", "https"):
        data = await _fetch(url, index, limits)
    elif scheme == "file" or len(scheme) <= 1:  # a path; a one-letter "scheme" is a Windows drive
        data = _read_local(url, index, limits)
    else:
        raise invalid(
            PARAM, f"image {index}: URL scheme {scheme!r} is not served; send a data: or https: URL"
        )
    _check_size(len(data), index, limits)
    return data


def _decode_data_url(url: str, index: int) -> bytes:
    header, sep, payload = url[len("data:") :].partition(",")
    if not sep or not header.endswith(";base64"):
        raise invalid(PARAM, f"image {index}: a data URL must be 'data:<media type>;base64,<data>'")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise invalid(PARAM, f"image {index}: the data URL's base64 does not decode ({exc})") from exc


async def _fetch(url: str, index: int, limits: ImageLimitsConfig) -> bytes:
    chunks, size = [], 0
    try:
        client = httpx.AsyncClient(timeout=limits.fetch_timeout_s, follow_redirects=True)
        async with client, client.stream("GET", url) as response:
            if response.status_code != 200:
                raise invalid(PARAM, f"image {index}: fetching {url} answered HTTP {response.status_code}")
            async for chunk in response.aiter_bytes():
                size += len(chunk)
                _check_size(size, index, limits)
                chunks.append(chunk)
    except httpx.TimeoutException as exc:
        raise invalid(PARAM, f"image {index}: fetching {url} took over {limits.fetch_timeout_s} s") from exc
    except httpx.HTTPError as exc:
        raise invalid(PARAM, f"image {index}: fetching {url} failed ({type(exc).__name__})") from exc
    return b"".join(chunks)


def _read_local(url: str, index: int, limits: ImageLimitsConfig) -> bytes:
    if not limits.allow_local_files:
        raise invalid(
            PARAM,
            f"image {index}: file:// URLs and local paths are refused; send a data: or https: URL "
            "(an operator may allow local files with limits.images.allow_local_files)",
        )
    path = Path(unquote(urlparse(url).path) if url.lower().startswith("file:") else url)
    try:
        _check_size(path.stat().st_size, index, limits)
        return path.read_bytes()
    except OSError as exc:
        raise invalid(PARAM, f"image {index}: cannot read {path} ({type(exc).__name__})") from exc


def _check_size(num_bytes: int, index: int, limits: ImageLimitsConfig) -> None:
    if num_bytes > limits.max_image_bytes:
        raise ApiError(
            400,
            f"image {index} is over the limit of {limits.max_image_bytes} bytes; send a smaller image",
            param=PARAM,
            code="image_too_large",
        )
