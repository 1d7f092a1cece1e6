"""`--kv-events-config`: vLLM's KV-events JSON, checked once, and each rank's endpoints.

vLLM 0.33.0 (`vllm/config/kv_events.py`): `{"enable_kv_cache_events": false, "publisher":
"zmq" if enabled else "null", "endpoint": "tcp://*:5557", "replay_endpoint": null,
"buffer_steps": 10000, "hwm": 100000, "max_queue_size": 100000, "topic": ""}`; unknown keys
are an error. How vLLM's publisher (`ZmqEventPublisher`) uses the endpoints, and what
doppelchip changes so that a server only ever listens on loopback:

- vLLM **binds** an endpoint containing `*` or `::`, or an `ipc://`/`inproc://` one, and
  **connects** to any other (a subscriber that binds, as llm-d's KV-cache indexer does).
  doppelchip does the same, except that while the server binds loopback (the default) a
  wildcard host binds 127.0.0.1 (vLLM: every interface) and a connected tcp host must be a
  loopback address. A server bound to another address (`--host 0.0.0.0`, as in a container)
  is `exposed`: there the endpoints mean what they mean in vLLM, so a pod in Kubernetes can
  publish to llm-d's indexer in another pod. An absent `endpoint` is `tcp://*:5557`, i.e.
  bound on 127.0.0.1:5557 by default. The replay endpoint is always bound (ROUTER).
- Ports: vLLM adds the data-parallel rank to the tcp port of both endpoints (port 0 is left
  for the OS to choose). doppelchip adds, in fleet mode, the ranks of the deployments before
  this one in the fleet that publish on the same endpoint: deployments sharing an endpoint
  get consecutive ports, in fleet-file order (`offset`). A pod (`serve --deployment NAME`)
  has offset 0, as a vLLM pod.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from server.engine.json_config import json_object

_LOOPBACK = re.compile(r"^(127\.\d+\.\d+\.\d+|localhost|\[::1\]|::1)$")
_KEYS = {"enable_kv_cache_events", "publisher", "endpoint", "replay_endpoint", "buffer_steps",
         "hwm", "max_queue_size", "topic"}


@dataclass(frozen=True)
class KVEventsConfig:
    enable_kv_cache_events: bool = False
    publisher: str = "null"
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    max_queue_size: int = 100_000
    topic: str = ""

    @property
    def enabled(self) -> bool:
        """vLLM publishes only with events enabled and the zmq publisher."""
        return self.enable_kv_cache_events and self.publisher == "zmq"

    @classmethod
    def parse(cls, text: str | None) -> KVEventsConfig:
        """The JSON of `--kv-events-config` (or the fleet key); raises ValueError saying what
        is wrong."""
        if not text:
            return cls()
        doc = json_object(text, "kv_events_config", _KEYS)
        enabled = doc.get("enable_kv_cache_events", False)
        if not isinstance(enabled, bool):
            raise ValueError("kv_events_config: enable_kv_cache_events must be true or false")
        publisher = doc.get("publisher") or ("zmq" if enabled else "null")
        if publisher not in ("zmq", "null"):
            raise ValueError(f"kv_events_config: publisher must be zmq or null, got "
                             f"{publisher!r}")
        for key in ("buffer_steps", "hwm", "max_queue_size"):
            v = doc.get(key, getattr(cls, key))
            if not isinstance(v, int) or isinstance(v, bool) or v < (1 if key == "buffer_steps"
                                                                     else 0):
                raise ValueError(f"kv_events_config: {key} must be a non-negative integer"
                                 f"{' (>= 1)' if key == 'buffer_steps' else ''}, got {v!r}")
        for key in ("endpoint", "replay_endpoint", "topic"):
            v = doc.get(key)
            if v is not None and not isinstance(v, str):
                raise ValueError(f"kv_events_config: {key} must be a string")
        cfg = cls(enabled, publisher, doc.get("endpoint") or cls.endpoint,
                  doc.get("replay_endpoint") or None, doc.get("buffer_steps", cls.buffer_steps),
                  doc.get("hwm", cls.hwm), doc.get("max_queue_size", cls.max_queue_size),
                  doc.get("topic") or "")
        if cfg.enabled:  # the endpoints' form; where they may go: `endpoint_problem`
            resolve(cfg.endpoint, 0, exposed=True)
            if cfg.replay_endpoint is not None:
                resolve(cfg.replay_endpoint, 0, replay=True, exposed=True)
        return cfg


@dataclass(frozen=True)
class Endpoint:
    """Where one rank's socket goes: ``url`` to bind or connect, and which."""

    url: str
    bind: bool


def with_port_offsets(deployments: tuple[Any, ...]) -> tuple[Any, ...]:
    """The fleet's deployments (``EngineOptions``) with ``kv_events_port_offset`` set: the
    data-parallel ranks of the earlier deployments publishing on the same endpoint."""
    import dataclasses

    seen: dict[str, int] = {}
    out = []
    for d in deployments:
        cfg = KVEventsConfig.parse(d.kv_events_config)
        if cfg.enabled:
            offset = seen.get(cfg.endpoint, 0)
            seen[cfg.endpoint] = offset + d.local_ranks
            d = dataclasses.replace(d, kv_events_port_offset=offset)
        out.append(d)
    return tuple(out)


def is_loopback(host: str) -> bool:
    return bool(_LOOPBACK.match(host))


def endpoint_problem(text: str | None, server_host: str) -> str:
    """Why a deployment's `--kv-events-config` cannot publish from a server bound to
    `server_host` ("" when it can): off loopback only when the server is exposed."""
    cfg = KVEventsConfig.parse(text)
    exposed = not is_loopback(server_host)
    try:
        if cfg.enabled:
            resolve(cfg.endpoint, 0, exposed=exposed)
            if cfg.replay_endpoint is not None:
                resolve(cfg.replay_endpoint, 0, replay=True, exposed=exposed)
    except ValueError as e:
        return str(e)
    return ""


def resolve(endpoint: str, offset: int, replay: bool = False,
            exposed: bool = False) -> Endpoint:
    """vLLM's bind/connect rule and its port offset (see the module docstring): on loopback
    unless `exposed` (the server binds a non-loopback address). Raises ValueError for an
    endpoint that is not tcp/ipc/inproc, or off loopback on a server that is not exposed."""
    if endpoint.startswith(("ipc://", "inproc://")):
        return Endpoint(endpoint if not offset else f"{endpoint}_dp{offset}", True)
    m = re.fullmatch(r"tcp://(.+):(\d+)", endpoint)
    if m is None:
        raise ValueError(f"kv_events_config: endpoint {endpoint!r} must be tcp://HOST:PORT, "
                         "ipc://PATH or inproc://NAME")
    host, port = m.group(1), int(m.group(2))
    wildcard = "*" in host or host in ("::", "[::]")
    if not wildcard and not exposed and not _LOOPBACK.match(host):
        raise ValueError(f"kv_events_config: endpoint {endpoint!r}: doppelchip publishes on "
                         "loopback only while the server binds loopback (use 127.0.0.1, or * "
                         "for 127.0.0.1; a server on --host 0.0.0.0 may publish anywhere)")
    if port and offset:
        port += offset
    bound = ("*" if exposed else "127.0.0.1") if wildcard else host
    return Endpoint(f"tcp://{bound}:{port}", wildcard or replay)
