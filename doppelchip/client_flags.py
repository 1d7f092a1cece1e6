"""The client side of the security options, for the commands that talk to a server
(`generate`, `load`): an API key and TLS, as `clients.client.Security` takes them.

Why this exists: one set of flag names for every client command, matching the server's
(`--api-key`, `--ssl-ca-certs`, `--ssl-certfile` / `--ssl-keyfile` for a client certificate),
and one place that reads the PEM files into what grpc wants.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def add_client_security_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("security (a server started with --api-key / TLS)")
    g.add_argument("--api-key", metavar="KEY", default=None,
                   help="send 'authorization: Bearer KEY' (default: $VLLM_API_KEY if set)")
    g.add_argument("--tls", action="store_true",
                   help="connect with TLS, trusting the system's CAs (implied by the flags "
                   "below)")
    g.add_argument("--ssl-ca-certs", metavar="FILE",
                   help="connect with TLS, trusting the CA certificates in FILE (PEM)")
    g.add_argument("--ssl-certfile", metavar="FILE",
                   help="client certificate (PEM) for mutual TLS, with --ssl-keyfile")
    g.add_argument("--ssl-keyfile", metavar="FILE", help="the client certificate's key (PEM)")


def client_security(args: argparse.Namespace,
                    env: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """`AsyncClient`/`Client` keyword arguments from the flags; ValueError (one line) when a
    file cannot be read or only half of a client certificate is given."""
    cert, key = getattr(args, "ssl_certfile", None), getattr(args, "ssl_keyfile", None)
    if bool(cert) != bool(key):
        raise ValueError("--ssl-certfile and --ssl-keyfile go together")

    def read(path: str | None, flag: str) -> bytes | None:
        if not path:
            return None
        try:
            return Path(path).read_bytes()
        except OSError as e:
            raise ValueError(f"cannot read {flag} {path}: {e.strerror}") from None

    return {"api_key": getattr(args, "api_key", None) or env.get("VLLM_API_KEY") or None,
            "tls": bool(getattr(args, "tls", False)),
            "root_certificates": read(getattr(args, "ssl_ca_certs", None), "--ssl-ca-certs"),
            "certificate_chain": read(cert, "--ssl-certfile"),
            "private_key": read(key, "--ssl-keyfile")}
