"""One front end's HTTP listener: uvicorn (httptools) on the front end's own event loop, beside
the gRPC server.

The socket is made here and handed to uvicorn: with several front ends it is bound with
SO_REUSEPORT to the concrete port the supervisor reserved (and locked) for the server, so the
kernel spreads connections over the front ends, as vLLM's API servers share one port. uvicorn's
own signal handling is off: the front end's SIGTERM handler drains (`FrontendApp.drain`), then
`stop()` closes the listener and gives open connections a moment to finish.

`ListenerOptions` are the `[server]` settings of the listener: TLS (vLLM's `--ssl-keyfile`,
`--ssl-certfile`, `--ssl-ca-certs`, `--ssl-cert-reqs`, handed to uvicorn as vLLM does), the
keep-alive timeout (vLLM's `VLLM_HTTP_TIMEOUT_KEEP_ALIVE`, 5 s), and the header deadline and
limits that `server.http.listener` adds to uvicorn's httptools protocol.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import uvicorn
from starlette.types import ASGIApp

from server.http.listener import HeaderLimits, guarded_protocol
from server.server_config import ServerConfig

BACKLOG = 2048


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:  # the front end owns its signals
        yield


def listen_socket(host: str, port: int, reuse_port: bool) -> socket.socket:
    """A listening TCP socket on host:port (SO_REUSEPORT when the port is shared)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.listen(BACKLOG)
    sock.setblocking(False)
    return sock


@dataclass(frozen=True)
class ListenerOptions:
    ssl_keyfile: str = ""
    ssl_certfile: str = ""
    ssl_ca_certs: str = ""
    ssl_cert_reqs: int = 0  # ssl.CERT_NONE / CERT_OPTIONAL / CERT_REQUIRED
    timeout_keep_alive_s: float = 5.0
    limits: HeaderLimits = field(default_factory=HeaderLimits)

    @classmethod
    def of(cls, cfg: ServerConfig) -> ListenerOptions:
        return cls(cfg.ssl_keyfile, cfg.ssl_certfile, cfg.ssl_ca_certs, cfg.ssl_cert_reqs,
                   cfg.http_timeout_keep_alive_s,
                   HeaderLimits(cfg.http_header_timeout_s, cfg.h11_max_incomplete_event_size,
                                cfg.h11_max_header_count))

    def uvicorn_ssl(self) -> dict:
        """uvicorn's TLS settings (none without a key and certificate)."""
        if not (self.ssl_keyfile and self.ssl_certfile):
            return {}
        return {"ssl_keyfile": self.ssl_keyfile, "ssl_certfile": self.ssl_certfile,
                "ssl_ca_certs": self.ssl_ca_certs or None, "ssl_cert_reqs": self.ssl_cert_reqs}


def route_methods(app: ASGIApp) -> Callable[[str], tuple[str, ...]]:
    """`allowed(path)` for the listener: the methods of every route of `app` whose path
    pattern matches (read at call time, so routes added later count)."""
    def allowed(path: str) -> tuple[str, ...]:
        methods: set[str] = set()
        for route in getattr(getattr(app, "router", None), "routes", ()):
            regex, accepted = getattr(route, "path_regex", None), getattr(route, "methods", None)
            if regex is not None and accepted and regex.match(path):
                methods |= accepted
        return tuple(sorted(methods))
    return allowed


class HttpServer:
    def __init__(self, app: ASGIApp, host: str, port: int, reuse_port: bool,
                 options: ListenerOptions | None = None) -> None:
        self.app, self.host, self.requested_port, self.reuse_port = app, host, port, reuse_port
        self.options = options or ListenerOptions()
        self.port = 0
        self._server: _Server | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        sock = listen_socket(self.host, self.requested_port, self.reuse_port)
        self.port = sock.getsockname()[1]
        opts = self.options
        try:
            protocol = guarded_protocol(opts.limits, route_methods(self.app))
            config = uvicorn.Config(self.app, http=protocol,
                                    lifespan="off", log_level="warning", access_log=False,
                                    timeout_graceful_shutdown=2, server_header=False,
                                    timeout_keep_alive=opts.timeout_keep_alive_s,  # type: ignore
                                    **opts.uvicorn_ssl())
            config.load()  # builds the TLS context: a bad key or certificate fails here
        except (OSError, ValueError) as e:
            sock.close()
            raise OSError(f"HTTP TLS: {e}") from e
        self._server = _Server(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]))
        while not self._server.started:
            if self._task.done():
                self._task.result()  # raises what stopped it
                raise OSError(f"HTTP server on {self.host}:{self.port} did not start")
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        """Close the listener; let open connections finish for up to 2 s, then cut them."""
        if self._server is None or self._task is None:
            return
        self._server.should_exit = True
        try:
            await asyncio.wait_for(asyncio.shield(self._task), 5.0)
        except TimeoutError:
            self._server.force_exit = True
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
        self._server = None
