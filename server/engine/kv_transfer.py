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
The `OffloadingConnector` is the engine core's CPU tier (`kv_offload_config.py`); a
`MultiConnector` (vllm/distributed/kv_transfer/kv_connector/v1/multi_connector.py) of a NIXL
and an offloading connector is a P/D pod with a host tier, llm-d's P/D with offloading.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field
from typing import Any

from server.engine.json_config import json_object

ROLES = ("kv_producer", "kv_consumer", "kv_both")
# the connector llm-d's P/D uses, vLLM's native CPU offloading (server/engine/kv_offload.py),
# and vLLM's MultiConnector of the two (P/D pods with a host tier)
CONNECTORS = ("NixlConnector", "OffloadingConnector", "MultiConnector")
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
    parts: tuple[KvTransferConfig, ...] = ()  # a MultiConnector's connectors, in its order

    def _part(self, name: str) -> KvTransferConfig | None:
        if self.kv_connector == name:
            return self
        return next((p for p in self.parts if p.kv_connector == name), None)

    @property
    def nixl(self) -> KvTransferConfig | None:
        """The P/D connector's config (itself, or a MultiConnector's part), if any."""
        return self._part("NixlConnector")

    @property
    def offloading(self) -> KvTransferConfig | None:
        """The CPU offloading connector's config (the engine core's tier), if any."""
        return self._part("OffloadingConnector")

    @property
    def is_kv_consumer(self) -> bool:
        """vLLM's name: the pod loads KV through a connector (role kv_consumer or kv_both),
        which registers vllm:num_requests_kv_fetch_by_stage."""
        return self.kv_role in ("kv_consumer", "kv_both")

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
        return _from_dict(raw, os.environ if env is None else env)


def _from_dict(raw: dict[str, Any], env: dict[str, str], part: bool = False,
               engine_id: str | None = None) -> KvTransferConfig:
    """One connector's config; a MultiConnector's `connectors` (vLLM: each a KVTransferConfig
    with the multi connector's engine_id unless it names its own) become its `parts`."""
    what = "--kv-transfer-config" + (": a MultiConnector connector" if part else "")
    if part:
        unknown = sorted(set(raw) - _FIELDS)
        if unknown:
            raise ValueError(f"{what}: unknown key(s) {', '.join(unknown)}")
    connector, role = raw.get("kv_connector"), raw.get("kv_role")
    if connector not in CONNECTORS or (part and connector == "MultiConnector"):
        raise ValueError(f"{what}: kv_connector {connector!r} is not emulated (supported: "
                         f"{', '.join(CONNECTORS)})")
    if role not in ROLES:
        raise ValueError(f"Unsupported kv_role: {role}. Supported roles are {ROLES}")
    policy = raw.get("kv_load_failure_policy", "recompute")
    if policy not in POLICIES:
        raise ValueError(f"{what}: kv_load_failure_policy must be one of "
                         f"{POLICIES}, got {policy!r}")
    extra = raw.get("kv_connector_extra_config") or {}
    if not isinstance(extra, dict):
        raise ValueError(f"{what}: kv_connector_extra_config must be an object")
    engine_id = str(raw.get("engine_id") or engine_id or uuid.uuid4())
    parts: tuple[KvTransferConfig, ...] = ()
    if connector == "MultiConnector":
        subs = extra.get("connectors")
        if not isinstance(subs, list) or not subs or not all(isinstance(c, dict) for c in subs):
            raise ValueError(f"{what}: a MultiConnector's kv_connector_extra_config needs "
                             "`connectors`, a list of connector configs")
        parts = tuple(_from_dict(c, env, True, engine_id) for c in subs)
        names = [p.kv_connector for p in parts]
        if len(set(names)) != len(names):
            raise ValueError(f"{what}: a MultiConnector lists {', '.join(names)}: one of each "
                             "kind is emulated")
    return KvTransferConfig(
        kv_connector=connector, kv_role=role, engine_id=engine_id,
        kv_load_failure_policy=policy, extra=dict(extra),
        side_channel_host=env.get("VLLM_NIXL_SIDE_CHANNEL_HOST", "127.0.0.1"),
        side_channel_port=int(env.get("VLLM_NIXL_SIDE_CHANNEL_PORT", "5600")),
        abort_request_timeout_s=float(env.get("VLLM_NIXL_ABORT_REQUEST_TIMEOUT", "480")),
        parts=parts,
    )
