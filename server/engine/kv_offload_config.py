"""The CPU offloading tier's configuration, as vLLM 0.33.0 reads it: `--kv-offloading-size` /
`--kv-offloading-backend`, or `--kv-transfer-config` naming the `OffloadingConnector` with its
`kv_connector_extra_config` (docs/KV_OFFLOAD.md).

Why apart from the tier (`kv_offload.py`): the flags and the JSON are checked once, at build,
with vLLM's words where vLLM refuses, and the tier gets typed values. The extra config is a
free dict in vLLM: keys it does not know are ignored here too; keys that change what the tier
does and are not emulated are refused, naming themselves.

Followed: `vllm/config/vllm.py` `_post_init_kv_transfer_config`; `vllm/v1/kv_offload/factory.py`
(`spec_name`, default "CPUOffloadingSpec"); `base.py` (`offload_prompt_only`, default True:
only prompt blocks are offloaded; `self_describing_kv_events`); `cpu/spec.py`
(`cpu_bytes_to_use`, required; `eviction_policy`, default "lru"; `store_threshold`);
`.../kv_connector/v1/offloading/config.py` (`block_size` or `blocks_per_chunk`, not both).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

BACKENDS = ("native", "lmcache")
POLICIES = ("lru",)  # vLLM's default; "arc" is not emulated
SPECS = ("CPUOffloadingSpec",)  # vLLM's default; TieringOffloadingSpec's tiers are not
GIB = 1 << 30


@dataclass(frozen=True)
class OffloadConfig:
    """The tier as configured: its size and eviction policy, and whether its KV events carry
    vLLM's full payload. Parsed once from the deployment's options (`resolve`)."""

    cpu_bytes: int
    eviction_policy: str = "lru"
    self_describing_events: bool = False
    prompt_only: bool = True  # vLLM's offload_prompt_only: decode blocks are not stored
    chunk_tokens: int | None = None  # `block_size`: a chunk's tokens (must be the device's)

    @staticmethod
    def resolve(size_gib: float | None, backend: str, connector: str | None,
                extra: dict[str, Any] | None) -> OffloadConfig | None:
        """The config from `--kv-offloading-size`/`--kv-offloading-backend`, or from the
        `--kv-transfer-config` (its `connector`) whose OffloadingConnector (itself or a
        MultiConnector's part) has `extra` as kv_connector_extra_config; None without
        either. ValueError says what is wrong."""
        if size_gib is not None:
            if backend not in BACKENDS:
                raise ValueError(f"--kv-offloading-backend: {backend!r} is not one of "
                                 f"{', '.join(BACKENDS)}")
            if backend == "lmcache":
                raise ValueError("--kv-offloading-backend lmcache: vLLM then talks to an "
                                 "LMCache server (LMCacheMPConnector), which is not emulated; "
                                 "use the native backend")
            if connector is not None:
                raise ValueError(f"--kv-offloading-size replaces --kv-transfer-config's "
                                 f"kv_connector {connector} with the OffloadingConnector "
                                 "(vLLM's _post_init_kv_transfer_config); a deployment has "
                                 "one connector here: give one of the two")
            if not size_gib > 0:
                raise ValueError(f"--kv-offloading-size must be > 0 GiB, got {size_gib}")
            return OffloadConfig(int(size_gib * GIB))
        if extra is None:
            return None
        cpu_bytes = extra.get("cpu_bytes_to_use")
        if not isinstance(cpu_bytes, int | float) or not cpu_bytes > 0:
            raise ValueError("cpu_bytes_to_use must be specified in kv_connector_extra_config")
        policy = extra.get("eviction_policy", "lru")
        if policy not in POLICIES:
            raise ValueError(f"kv_connector_extra_config: eviction_policy {policy!r} is not "
                             f"emulated (emulated: {', '.join(POLICIES)})")
        if "block_size" in extra and "blocks_per_chunk" in extra:
            raise ValueError("Specify only one of 'block_size' or 'blocks_per_chunk' in "
                             "kv_connector_extra_config.")
        if extra.get("blocks_per_chunk", 1) != 1:
            raise ValueError("kv_connector_extra_config: blocks_per_chunk > 1 is not emulated "
                             "(a chunk is one device block)")
        if int(extra.get("store_threshold", 0)) >= 2:
            raise ValueError("kv_connector_extra_config: store_threshold is not emulated "
                             "(every block is stored)")
        spec = extra.get("spec_name", "CPUOffloadingSpec")
        if spec not in SPECS:
            raise ValueError(f"kv_connector_extra_config: spec_name {spec!r} is not emulated "
                             f"(emulated: {', '.join(SPECS)})")
        chunk = extra.get("block_size")
        return OffloadConfig(int(cpu_bytes), policy,
                             bool(extra.get("self_describing_kv_events", False)),
                             bool(extra.get("offload_prompt_only", True)),
                             int(chunk) if chunk is not None else None)
