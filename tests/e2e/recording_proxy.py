"""Two small HTTP servers for tests of real clients: a proxy that relays to the app and records every
exchange, and a trap that records any connection a client tries to make to the outside world.

The proxy streams responses through as they arrive (SSE included) and closes each connection after its
response, so it needs no chunked re-framing. It runs in a thread of the test process.
"""

from __future__ import annotations

import gzip
import http.client
import json
import threading
import zlib
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

_HOP_HEADERS = {"host", "connection", "keep-alive", "transfer-encoding", "content-length", "proxy-connection"}


@dataclass
class Exchange:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    status: int = 0
    response: bytes = b""

    def json(self) -> Any:
        """The request body as JSON (decompressed first if the client compressed it), or None."""
        body = self.body
        encoding = self.headers.get("content-encoding", "")
        if encoding == "gzip":
            body = gzip.decompress(body)
        elif encoding == "deflate":
            body = zlib.decompress(body)
        elif encoding == "zstd":
            import zstandard

            body = zstandard.ZstdDecompressor().decompress(body, max_output_size=64 << 20)
        try:
            return json.loads(body) if body else None
        except ValueError:
            return None


@dataclass
class Recorder:
    exchanges: list[Exchange] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, exchange: Exchange) -> None:
        with self.lock:
            self.exchanges.append(exchange)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    recorder: Recorder
    upstream: str


class _Relay(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def _relay(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length) if length else b""
        headers = {k.lower(): v for k, v in self.headers.items()}
        exchange = Exchange(self.command, self.path, headers, body)
        self.server.recorder.add(exchange)
        upstream = urlsplit(self.server.upstream)
        conn = http.client.HTTPConnection(upstream.hostname, upstream.port, timeout=600)
        forward = {k: v for k, v in headers.items() if k not in _HOP_HEADERS}
        conn.request(self.command, upstream.path.rstrip("/") + self.path, body=body, headers=forward)
        response = conn.getresponse()
        exchange.status = response.status
        self.send_response(response.status)
        for name, value in response.getheaders():
            if name.lower() not in _HOP_HEADERS:
                self.send_header(name, value)
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        while chunk := response.read1(65536):
            exchange.response += chunk
            self.wfile.write(chunk)
            self.wfile.flush()
        conn.close()

    do_GET = do_POST = do_HEAD = do_DELETE = do_PUT = _relay

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _Trap(BaseHTTPRequestHandler):
    """Records whatever a client sends through it as a proxy (a CONNECT or a plain request) and refuses it."""

    server: _Server

    def _refuse(self) -> None:
        self.server.recorder.add(Exchange(self.command, self.path, dict(self.headers.items()), b""))
        self.send_error(403, "this test lets nothing leave the machine")

    do_CONNECT = do_GET = do_POST = do_HEAD = do_PUT = do_DELETE = _refuse

    def log_message(self, format: str, *args: Any) -> None:
        pass


def _serve(handler: type[BaseHTTPRequestHandler], upstream: str = "") -> tuple[_Server, Recorder]:
    server = _Server(("127.0.0.1", 0), handler)
    server.recorder, server.upstream = Recorder(), upstream
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, server.recorder


def start_proxy(upstream: str) -> tuple[_Server, Recorder]:
    """A recording relay to `upstream` (e.g. http://127.0.0.1:8000); its URL is http://127.0.0.1:<port>."""
    return _serve(_Relay, upstream)


def start_trap() -> tuple[_Server, Recorder]:
    return _serve(_Trap)


def url_of(server: _Server) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}"
