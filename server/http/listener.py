"""uvicorn's httptools protocol with the limits it lacks: a header-read deadline, header size and
count limits, and a prompt answer to an HTTP/0.9 request.

Why this exists: uvicorn (0.54) has no timeout on receiving a request — its keep-alive timer
runs only between requests and is cancelled by every byte received — so a client that sends
its headers a byte at a time holds a connection for ever (slowloris; uvicorn issue #157 asks
for `--timeout-request-start`), and its header limits (`h11_max_incomplete_event_size`, which
vLLM sets from `--h11-max-incomplete-event-size` / `--h11-max-header-count`) apply to the h11
parser only, not to httptools. Here, per connection:

- the request line and headers must arrive within `header_timeout_s` of the connection's
  opening (first request) or of the request's first byte (later ones); else the server answers
  408 (or, before any byte, just closes) and closes the connection. The body is read by the
  handler as it needs it and is not under this deadline; a TLS handshake is under asyncio's
  own (60 s);
- more than `max_header_bytes` of request line and headers, or more than `max_header_count`
  headers: 431 and close;
- a first request line with no `HTTP/x.y` (HTTP/0.9): 400 and close at once, where httptools
  would wait for headers that never come.

Everything else is uvicorn's own protocol, unchanged.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


@dataclass(frozen=True)
class HeaderLimits:
    header_timeout_s: float = 10.0
    max_header_bytes: int = 4 * 1024 * 1024
    max_header_count: int = 256


_408 = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
        b"content-length: 38\r\nconnection: close\r\n\r\n"
        b"Request headers not received in time.\n")


def _431(message: str) -> bytes:
    body = (message + "\n").encode()
    return (b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
            b"content-type: text/plain; charset=utf-8\r\n"
            b"content-length: " + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n"
            + body)


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """One HTTP/1.1 connection (see the module docstring). `limits` is set on the subclass that
    `guarded_protocol` makes for a listener."""

    limits: HeaderLimits = HeaderLimits()

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        self._in_headers = True  # between a request's first byte and its headers' end
        self._seen = False  # any byte of the current request received
        self._header_bytes = 0  # raw bytes received while the headers are unfinished
        self._parsed_bytes = 0  # request line and headers, as parsed
        self._header_count = 0
        self._first_line: bytearray | None = bytearray()  # until the first request line ends
        self._refusal: bytes | None = None

    # ---- the deadline ---------------------------------------------------------------------
    def _arm(self) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(self.limits.header_timeout_s, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self) -> None:
        self._deadline = None
        if self.transport.is_closing() or not self._in_headers:
            return
        if self._seen:
            self.transport.write(_408)
        self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    # ---- bytes in -------------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        if self._first_line is not None and not self._check_first_line(data):
            self._disarm()
            self.send_400_response("HTTP/0.9 requests are not supported.")
            return
        self._seen = True
        super().data_received(data)
        if self._refusal is None and self._in_headers:
            self._header_bytes += len(data)
            self._check_size(self._header_bytes)
        if self._refusal is not None and not self.transport.is_closing():
            self._disarm()
            self.transport.write(self._refusal)
            self.transport.close()

    def _check_first_line(self, data: bytes) -> bool:
        """False when the connection's first request line has no HTTP version (HTTP/0.9)."""
        assert self._first_line is not None
        self._first_line += data
        while True:
            end = self._first_line.find(b"\n")
            if end < 0:
                return True  # not ended yet (the size limit bounds it)
            line = bytes(self._first_line[:end]).rstrip(b"\r")
            if line:  # blank lines before a request line are allowed (RFC 9112 2.2)
                self._first_line = None
                version = line.rpartition(b" ")[2]
                return version.startswith(b"HTTP/")
            del self._first_line[:end + 1]

    def _check_size(self, size: int) -> None:
        if self._refusal is None and size > self.limits.max_header_bytes:
            self._refusal = _431(f"Request line and headers exceed "
                                 f"{self.limits.max_header_bytes} bytes.")

    # ---- parser callbacks -----------------------------------------------------------------
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_headers = True
        self._header_bytes = self._parsed_bytes = self._header_count = 0
        if self._deadline is None:
            self._arm()

    def on_url(self, url: bytes) -> None:
        self._parsed_bytes += len(url)
        self._check_size(self._parsed_bytes)
        if self._refusal is None:
            super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._parsed_bytes += len(name) + len(value) + 4  # ": " and CRLF
        self._check_size(self._parsed_bytes)
        self._header_count += 1
        if self._refusal is None and self._header_count > self.limits.max_header_count:
            self._refusal = _431(f"More than {self.limits.max_header_count} request headers.")
        if self._refusal is None:
            super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_headers, self._seen = False, False
        self._disarm()
        if self._refusal is None:
            super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if self._refusal is None:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if self._refusal is None:
            super().on_message_complete()


def guarded_protocol(limits: HeaderLimits) -> type[GuardedHttpToolsProtocol]:
    """The protocol class for one listener (uvicorn instantiates it per connection)."""
    return type("GuardedHttpToolsProtocol", (GuardedHttpToolsProtocol,), {"limits": limits})
