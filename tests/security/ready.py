"""Wait until every deployment of a just-started server is READY: `ServerProcess` returns once
the ports listen, and a deployment may still be starting then (UNAVAILABLE "compiling")."""

from __future__ import annotations

import time

from clients.client import Client
from doppelchip.v1 import inference_pb2 as pb


def wait_ready(target: str, names: tuple[str, ...] = (), timeout: float = 60.0,
               **security) -> None:
    """Poll `ListDeployments` until the deployments `names` (all when empty) are READY;
    `security`: `Client`'s TLS and API-key arguments."""
    deadline = time.monotonic() + timeout
    with Client(target, **security) as client:
        while True:
            states = {d.name: d.state for d in client.list_deployments(timeout=10).deployments
                      if not names or d.name in names}
            if states and all(s == pb.DEPLOYMENT_STATE_READY for s in states.values()):
                return
            assert time.monotonic() < deadline, f"not ready in {timeout} s: {states}"
            time.sleep(0.05)
