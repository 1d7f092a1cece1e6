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
- a request line with no `HTTP/x.y` (HTTP/0.9): 400 and close at once, where httptools
  would wait for headers that never come;
- a method httptools does not know (`FOO /metrics HTTP/1.1`), which its parser refuses before
  the app sees it (uvicorn answers a bare 400): 405 with `Allow` listing the methods of the
  routes at that path (the same answer the app gives a known method the route does not take),
  or 404 when no route has that path — in vLLM's JSON error shape, and close. The request line
  is awaited (under the deadline) when the parser fails before the path has arrived. A request
  pipelined behind another in one read is not located: uvicorn's 400 then.

Everything else is uvicorn's own protocol, unchanged.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from server.http.errors import HttpError


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


def _json_error(status: int, phrase: str, allow: Sequence[str] | None) -> bytes:
    body = HttpError(status, phrase).json()
    head = (f"HTTP/1.1 {status} {phrase}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n")
    if allow is not None:
        head += f"allow: {', '.join(allow)}\r\n"
    return (head + "\r\n").encode() + body


def _path(target: bytes) -> str:
    """The decoded path of a request target (origin or absolute form)."""
    return unquote(urlsplit(target.decode("latin-1")).path or "/")


class _Parser:
    """httptools' parser, noting when it refused a request's method (uvicorn catches every
    parser error alike)."""

    def __init__(self, parser: Any, protocol: GuardedHttpToolsProtocol) -> None:
        self._parser, self._protocol = parser, protocol

    def feed_data(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserInvalidMethodError:
            self._protocol._bad_method = True
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self._parser, name)


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """One HTTP/1.1 connection (see the module docstring). `limits` is set on the subclass that
    `guarded_protocol` makes for a listener."""

    limits: HeaderLimits = HeaderLimits()
    # the methods the app's routes at a path accept (empty: no route has that path)
    allowed: Callable[[str], Sequence[str]] = staticmethod(lambda path: ())

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.parser = _Parser(self.parser, self)  # type: ignore[assignment]
        self._between = True  # no request in progress: the next byte starts one
        self._bad_method = False  # the parser refused the current request's method
        self._deadline: asyncio.TimerHandle | None = None
        self._in_headers = True  # between a request's first byte and its headers' end
        self._seen = False  # any byte of the current request received
        self._header_bytes = 0  # raw bytes received while the headers are unfinished
        self._parsed_bytes = 0  # request line and headers, as parsed
        self._header_count = 0
        self._line: bytearray | None = None  # the current request's bytes until its line ends
        self._request_line: bytes | None = None  # once it has
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
        if self._bad_method:  # refused: only its request line is still awaited
            self._collect_line(data)
            self._answer_bad_method()
            return
        if self._between:  # this read starts a request: follow it until its line ends
            self._line, self._request_line = bytearray(), None
        if self._line is not None:
            self._collect_line(data)
            line = self._request_line
            if line is not None and not line.rpartition(b" ")[2].startswith(b"HTTP/"):
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

    def _collect_line(self, data: bytes) -> None:
        """Add `data` to the current request's bytes until its request line (the first
        non-blank line: RFC 9112 2.2 allows blank lines before it) has ended."""
        if self._line is None:
            return
        self._line += data
        while (end := self._line.find(b"\n")) >= 0:
            line = bytes(self._line[:end]).rstrip(b"\r")
            if line:
                self._request_line, self._line = line, None
                return
            del self._line[:end + 1]
        self._check_size(len(self._line))
        if self._refusal is not None and self._bad_method:
            self._bad_method = False  # the size refusal wins
            self.transport.write(self._refusal)
            self.transport.close()

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to any parser error; an unknown method gets 405 / 404 instead."""
        if not self._bad_method:
            super().send_400_response(msg)
        elif self._request_line is None and self._line is None:
            self._bad_method = False  # pipelined behind another request: not located
            super().send_400_response(msg)
        else:
            self._answer_bad_method()

    def _answer_bad_method(self) -> None:
        if self._request_line is None or self.transport.is_closing():
            return  # its line has not ended yet (the deadline and the size limit bound it)
        self._disarm()
        parts = self._request_line.split(b" ")
        allow = self.allowed(_path(parts[1])) if len(parts) == 3 else ()
        self.transport.write(_json_error(405, "Method Not Allowed", allow) if allow
                             else _json_error(404, "Not Found", None))
        self.transport.close()

    def _check_size(self, size: int) -> None:
        if self._refusal is None and size > self.limits.max_header_bytes:
            self._refusal = _431(f"Request line and headers exceed "
                                 f"{self.limits.max_header_bytes} bytes.")

    # ---- parser callbacks -----------------------------------------------------------------
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_headers, self._between = True, False
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
        self._between, self._line, self._request_line = True, None, None
        if self._refusal is None:
            super().on_message_complete()


def guarded_protocol(limits: HeaderLimits, allowed: Callable[[str], Sequence[str]] | None = None
                     ) -> type[GuardedHttpToolsProtocol]:
    """The protocol class for one listener (uvicorn instantiates it per connection);
    `allowed(path)`: the methods the app's routes at `path` accept."""
    attrs: dict[str, Any] = {"limits": limits}
    if allowed is not None:
        attrs["allowed"] = staticmethod(allowed)
    return type("GuardedHttpToolsProtocol", (GuardedHttpToolsProtocol,), attrs)
