"""`--kv-transfer-config`: vLLM's KVTransferConfig JSON, as far as the emulated NIXL connector
uses it, plus the environment variables vLLM's connector reads.

Why it exists: a P/D deployment is configured exactly as a vLLM pod is (llm-d's manifests pass
`--kv-transfer-config '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'`), so the JSON is
checked here once — unknown keys are refused as vLLM's config dataclass refuses them — and
the connector (`server/engine_proc/kv_connector.py`) gets typed values.

Followed: vllm/config/kv_transfer.py @ 9dc4946 (fields, `kv_load_failure_policy` default
"recompute"), vllm/envs.py (VLLM_NIXL_SIDE_CHANNEL_HOST/PORT, default localhost:5600;
VLLM_NIXL_ABORT_REQUEST_TIMEOUT, default 480 s). doppelchip's own key, in
`kv_connector_extra_config`: `link`, a `devices/catalog/links.toml` id naming the link between
the prefill and the decode pods (default: the slower of the two chips' scale-out networks).
The side-channel host defaults to 127.0.0.1 (vLLM's "localhost"; loopback only here).
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field
from typing import Any

from server.engine.json_config import json_object

ROLES = ("kv_producer", "kv_consumer", "kv_both")
# the connector llm-d's P/D uses, and vLLM's native CPU offloading (server/engine/kv_offload.py)
CONNECTORS = ("NixlConnector", "OffloadingConnector")
POLICIES = ("recompute", "fail")
_FIELDS = {"kv_connector", "engine_id", "kv_buffer_device", "kv_buffer_size", "kv_role",
           "kv_rank", "kv_parallel_size", "kv_ip", "kv_port", "kv_connector_extra_config",
           "kv_connector_module_path", "enable_permute_local_kv", "kv_load_failure_policy"}


@dataclass(frozen=True)
class KvTransferConfig:
    kv_connector: str
    kv_role: str
    engine_id: str
    kv_load_failure_policy: str = "recompute"
    extra: dict[str, Any] = field(default_factory=dict)
    side_channel_host: str = "127.0.0.1"
    side_channel_port: int = 5600
    abort_request_timeout_s: float = 480.0

    @property
    def is_nixl(self) -> bool:
        """The P/D connector (the other one, OffloadingConnector, is the engine core's)."""
        return self.kv_connector == "NixlConnector"

    @property
    def link(self) -> str | None:
        """The links.toml id of the link between the pods (None: the chips' networks)."""
        return self.extra.get("link")

    @staticmethod
    def parse(text: str | None, env: dict[str, str] | None = None) -> KvTransferConfig | None:
        """The config, or None without one (kv_transfer_params are then ignored, as vLLM
        ignores them without a connector). Raises ValueError naming what is wrong."""
        if not text:
            return None
        raw = json_object(text, "--kv-transfer-config", _FIELDS)
        connector, role = raw.get("kv_connector"), raw.get("kv_role")
        if connector not in CONNECTORS:
            raise ValueError(f"--kv-transfer-config: kv_connector {connector!r} is not "
                             f"emulated (supported: {', '.join(CONNECTORS)})")
        if role not in ROLES:
            raise ValueError(f"Unsupported kv_role: {role}. Supported roles are {ROLES}")
        policy = raw.get("kv_load_failure_policy", "recompute")
        if policy not in POLICIES:
            raise ValueError(f"--kv-transfer-config: kv_load_failure_policy must be one of "
                             f"{POLICIES}, got {policy!r}")
        extra = raw.get("kv_connector_extra_config") or {}
        if not isinstance(extra, dict):
            raise ValueError("--kv-transfer-config: kv_connector_extra_config must be an object")
        env = os.environ if env is None else env
        return KvTransferConfig(
            kv_connector=connector, kv_role=role,
            engine_id=str(raw.get("engine_id") or uuid.uuid4()),
            kv_load_failure_policy=policy, extra=dict(extra),
            side_channel_host=env.get("VLLM_NIXL_SIDE_CHANNEL_HOST", "127.0.0.1"),
            side_channel_port=int(env.get("VLLM_NIXL_SIDE_CHANNEL_PORT", "5600")),
            abort_request_timeout_s=float(env.get("VLLM_NIXL_ABORT_REQUEST_TIMEOUT", "480")),
        )
