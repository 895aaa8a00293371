"""Image URLs of chat requests -> the images' bytes: data URLs decoded, http(s) URLs fetched under a
size limit and a timeout, local files (file:// or a path) refused unless the config allows them.

Owns the rules that no request makes the server read a local file or reach a non-public address by
default. Decoding the bytes as an image is the Tokenizer's (engine/prompt/image_processor.py). Errors are 400s
naming the route's prompt field (`param`). No Ray, no MLX.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import ipaddress
import socket
from pathlib import Path
from urllib.parse import unquote, urljoin, urlparse

import httpx

from api.config import ImageLimitsConfig
from api.errors import ApiError, invalid

MAX_REDIRECTS = 5


async def load_images(urls: list[str], limits: ImageLimitsConfig, param: str = "messages") -> list[bytes]:
    """Every image's bytes, in prompt order; the first bad one is a 400 naming `param`."""
    if len(urls) > limits.max_images_per_request:
        raise invalid(
            param,
            f"the request has {len(urls)} images, above the limit of {limits.max_images_per_request}; "
            "send fewer images",
        )
    try:
        return [await load_image(url, i + 1, limits) for i, url in enumerate(urls)]
    except ApiError as exc:
        exc.param = param
        raise


async def load_image(url: str, index: int, limits: ImageLimitsConfig) -> bytes:
    scheme = urlparse(url).scheme.lower()
    if scheme == "data":
        data = _decode_data_url(url, index)
    elif scheme in ("http", "https"):
        data = await _fetch(url, index, limits)
    elif scheme == "file" or len(scheme) <= 1:  # a path; a one-letter "scheme" is a Windows drive
        data = _read_local(url, index, limits)
    else:
        raise invalid(None, f"image {index}: URL scheme {scheme!r} is not served; send a data: or https: URL")
    _check_size(len(data), index, limits)
    return data


def _decode_data_url(url: str, index: int) -> bytes:
    header, sep, payload = url[len("data:") :].partition(",")
    if not sep or not header.endswith(";base64"):
        raise invalid(None, f"image {index}: a data URL must be 'data:<media type>;base64,<data>'")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise invalid(None, f"image {index}: the data URL's base64 does not decode ({exc})") from exc


async def _fetch(url: str, index: int, limits: ImageLimitsConfig) -> bytes:
    """Follows redirects itself, so every hop's address is checked before it is reached."""
    try:
        async with httpx.AsyncClient(timeout=limits.fetch_timeout_s) as client:
            async with asyncio.timeout(limits.fetch_timeout_s):
                for _ in range(MAX_REDIRECTS + 1):
                    if not limits.allow_private_urls:
                        await check_public(url, index)
                    async with client.stream("GET", url) as response:
                        if response.is_redirect:
                            url = urljoin(url, response.headers["location"])
                            continue
                        if response.status_code != 200:
                            raise invalid(
                                None, f"image {index}: fetching {url} answered HTTP {response.status_code}"
                            )
                        return await _read_body(response, index, limits)
    except (httpx.TimeoutException, TimeoutError) as exc:
        raise invalid(None, f"image {index}: fetching {url} took over {limits.fetch_timeout_s} s") from exc
    except httpx.HTTPError as exc:
        raise invalid(None, f"image {index}: fetching {url} failed ({type(exc).__name__})") from exc
    raise invalid(None, f"image {index}: fetching the URL redirected more than {MAX_REDIRECTS} times")


async def _read_body(response: httpx.Response, index: int, limits: ImageLimitsConfig) -> bytes:
    chunks, size = [], 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        _check_size(size, index, limits)
        chunks.append(chunk)
    return b"".join(chunks)


async def check_public(url: str, index: int) -> None:
    """Refuses a URL whose host is, or resolves to, a non-public address (loopback, private, link-local,
    reserved: the server's own network). A name that does not resolve is a 400 too."""
    parsed = urlparse(url)
    host = parsed.hostname or ""
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(
            host, parsed.port or 443, type=socket.SOCK_STREAM
        )
    except (socket.gaierror, UnicodeError) as exc:
        raise invalid(None, f"image {index}: the host {host!r} of the image URL does not resolve") from exc
    for info in infos:
        address = ipaddress.ip_address(info[4][0])
        if not address.is_global:
            raise invalid(
                None,
                f"image {index}: the image URL's host {host!r} is a non-public address ({address}); "
                "send a public URL or a data: URL (an operator may allow these with "
                "limits.images.allow_private_urls)",
            )


def _read_local(url: str, index: int, limits: ImageLimitsConfig) -> bytes:
    if not limits.allow_local_files:
        raise invalid(
            None,
            f"image {index}: file:// URLs and local paths are refused; send a data: or https: URL "
            "(an operator may allow local files with limits.images.allow_local_files)",
        )
    path = Path(unquote(urlparse(url).path) if url.lower().startswith("file:") else url)
    try:
        _check_size(path.stat().st_size, index, limits)
        return path.read_bytes()
    except OSError as exc:
        raise invalid(None, f"image {index}: cannot read {path} ({type(exc).__name__})") from exc


def _check_size(num_bytes: int, index: int, limits: ImageLimitsConfig) -> None:
    if num_bytes > limits.max_image_bytes:
        raise ApiError(
            400,
            f"image {index} is over the limit of {limits.max_image_bytes} bytes; send a smaller image",
            code="image_too_large",
        )
