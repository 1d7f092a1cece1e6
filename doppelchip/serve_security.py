"""`serve`'s security and listener flags: vLLM's names and meanings (API keys, TLS, the HTTP
and gRPC listeners' limits, `--sse-keep-alive-interval`), and how they become `[server]`
settings (docs/OPERATIONS.md).

Why a module of its own: the group is the longest part of `serve`'s parser, and the security
tests read its translation without the rest of the command.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping


def add_security_args(p: argparse.ArgumentParser) -> None:
    """vLLM's security flags (same names and meanings) and the listeners' limits
    (docs/OPERATIONS.md); all off, or at grpc's and vLLM's defaults, unless given."""
    g = p.add_argument_group("security", "API keys, TLS and listener limits, as vLLM's flags "
                             "(off by default: the server binds to loopback)")
    g.add_argument("--api-key", nargs="+", metavar="KEY",
                   help="require 'Authorization: Bearer KEY' (any of the keys) on HTTP /v1/*, "
                   "/tokenize, /detokenize and every later route except /health, /ping, "
                   "/version, /metrics, and metadata 'authorization: Bearer KEY' on every gRPC "
                   "service but health and reflection (default: $VLLM_API_KEY if set)")
    g.add_argument("--ssl-keyfile", metavar="FILE", help="TLS private key (PEM), both ports")
    g.add_argument("--ssl-certfile", metavar="FILE",
                   help="TLS certificate chain (PEM), both ports")
    g.add_argument("--ssl-ca-certs", metavar="FILE",
                   help="CA certificates (PEM) client certificates are verified against")
    g.add_argument("--ssl-cert-reqs", type=int, metavar="N",
                   help="client certificates, as Python's ssl module: 0 CERT_NONE (default), "
                   "1 CERT_OPTIONAL (HTTP only), 2 CERT_REQUIRED (mutual TLS)")
    g.add_argument("--h11-max-incomplete-event-size", type=int, metavar="BYTES",
                   help="largest request line + headers accepted on HTTP (default 4194304); "
                   "more: 431")
    g.add_argument("--h11-max-header-count", type=int, metavar="N",
                   help="most headers per HTTP request (default 256); more: 431")
    g.add_argument("--http-header-timeout", type=float, metavar="SECONDS",
                   dest="http_header_timeout_s",
                   help="an HTTP request line and headers must arrive within this (default "
                   "10); else 408 and the connection closes (slowloris)")
    g.add_argument("--http-timeout-keep-alive", type=float, metavar="SECONDS",
                   dest="http_timeout_keep_alive_s",
                   help="an idle kept-alive HTTP connection closes after this (default 5, "
                   "vLLM's VLLM_HTTP_TIMEOUT_KEEP_ALIVE)")
    g.add_argument("--sse-keep-alive-interval", type=int, metavar="SECONDS",
                   help="as vLLM's flag: a streamed completion or chat answer idle this long "
                   "(queued, prefilling, between tokens) sends the SSE comment ': keep-alive', "
                   "so a proxy's read timeout does not close it (default 0: never)")
    g.add_argument("--grpc-max-receive-message-length", type=int, metavar="BYTES",
                   help="largest gRPC request message (default 4194304, grpc's); larger: "
                   "RESOURCE_EXHAUSTED")
    g.add_argument("--grpc-max-concurrent-streams", type=int, metavar="N",
                   help="concurrent gRPC calls per HTTP/2 connection (default: grpc's, no "
                   "limit); a client's further calls wait for a free stream")


SECURITY = ("ssl_keyfile", "ssl_certfile", "ssl_ca_certs", "ssl_cert_reqs",
            "h11_max_incomplete_event_size", "h11_max_header_count",
            "http_header_timeout_s", "http_timeout_keep_alive_s", "sse_keep_alive_interval",
            "grpc_max_receive_message_length", "grpc_max_concurrent_streams")


def security_overrides(args: argparse.Namespace) -> dict:
    out = {k: getattr(args, k) for k in SECURITY}
    out["api_key"] = tuple(args.api_key) if args.api_key else None
    return out


def with_env_api_key(fleet, env: Mapping[str, str]):
    """As vLLM: `VLLM_API_KEY` is the key when neither --api-key nor the fleet file's
    `api_key` gives one."""
    if fleet.server.api_key or not env.get("VLLM_API_KEY"):
        return fleet
    return fleet.with_server(api_key=(env["VLLM_API_KEY"],))
