"""The front end's grpc.aio server as the `[server]` settings make it: channel options (message
size, streams per connection, SO_REUSEPORT), the API-key interceptor, TLS / mutual TLS.

One gRPC server per front end serves every deployment, so these are server-wide settings, not
a deployment's. TLS follows vLLM's flags (`--ssl-keyfile`, `--ssl-certfile`, `--ssl-ca-certs`,
`--ssl-cert-reqs`): with `ssl_cert_reqs` 2 (`ssl.CERT_REQUIRED`) a client must present a
certificate that chains to `ssl_ca_certs`. grpc's Python API can either require and verify a
client certificate or not ask for one, so `ssl_cert_reqs` 1 (`CERT_OPTIONAL`) does not ask on
the gRPC port (HTTP asks and verifies one if given); docs/OPERATIONS.md says so.
"""

from __future__ import annotations

import ssl
from pathlib import Path

import grpc

from server.auth import ApiKeyInterceptor, ApiKeys
from server.backlog import BACKLOG_OPTIONS
from server.server_config import ServerConfig


def server_options(cfg: ServerConfig, reuse_port: bool) -> list[tuple[str, int]]:
    options = [("grpc.so_reuseport", int(reuse_port)),
               ("grpc.max_receive_message_length", cfg.grpc_max_receive_message_length),
               *BACKLOG_OPTIONS]
    if cfg.grpc_max_concurrent_streams:
        options.append(("grpc.max_concurrent_streams", cfg.grpc_max_concurrent_streams))
    return options


def build_server(cfg: ServerConfig, reuse_port: bool) -> grpc.aio.Server:
    """The configured server, with no services yet."""
    keys = ApiKeys(cfg.api_key)
    interceptors = [ApiKeyInterceptor(keys)] if keys else None
    return grpc.aio.server(options=server_options(cfg, reuse_port), interceptors=interceptors)


def _read(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise OSError(f"cannot read {what} {path}: {e.strerror}") from e


def check_tls_files(cfg: ServerConfig) -> None:
    """Raise OSError with one clear line when the files cannot serve TLS (grpc itself would
    only log its C-core errors and fail to bind)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        ctx.load_cert_chain(cfg.ssl_certfile, cfg.ssl_keyfile)
        if cfg.ssl_ca_certs:
            ctx.load_verify_locations(cfg.ssl_ca_certs)
    except ssl.SSLError as e:
        raise OSError(f"TLS: --ssl-keyfile {cfg.ssl_keyfile} / --ssl-certfile "
                      f"{cfg.ssl_certfile} / --ssl-ca-certs {cfg.ssl_ca_certs or '-'}: "
                      f"{e.reason or e}") from e


def server_credentials(cfg: ServerConfig) -> grpc.ServerCredentials:
    """TLS credentials from the key, certificate and (for client certificates) CA files."""
    key = _read(cfg.ssl_keyfile, "--ssl-keyfile")
    cert = _read(cfg.ssl_certfile, "--ssl-certfile")
    ca = _read(cfg.ssl_ca_certs, "--ssl-ca-certs") if cfg.ssl_ca_certs else None
    check_tls_files(cfg)
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=ca,
        require_client_auth=cfg.ssl_cert_reqs == ssl.CERT_REQUIRED)


def add_port(server: grpc.aio.Server, cfg: ServerConfig, port: int) -> int:
    """Bind host:port (TLS when configured); the bound port (0 when it could not bind)."""
    address = f"{cfg.host}:{port}"
    if cfg.tls:
        return server.add_secure_port(address, server_credentials(cfg))
    return server.add_insecure_port(address)
