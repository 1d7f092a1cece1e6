"""Disaggregated prefill/decode in virtual time (Splitwise / DistServe style; issue 16): the
seconds a prompt's KV spends between a prefill replica and a decode replica.

Why it exists: the event loop (`sim.virtual`) moves a P/D request from its prefill
core to its decode core when the KV has arrived; when that is, is this module's answer, and it
must be the answer the served P/D pods give (`server/engine_proc/kv_connector.py`). So it
prices the transfer exactly as the real-time connector does, with the ONE function for it,
`devices.transfer.transfer_seconds`:

- bytes: the decode deployment's KV bytes per token (all its chips together, the figure
  `DeploymentInfo.kv_bytes_per_token` carries) × the tokens moved (the prompt but its last
  token, which the decode side recomputes, as vLLM);
- link: `kv_connector_extra_config.link` of the decode deployment's (else the prefill
  deployment's) `kv_transfer_config`, else the slower of the two chips' scale-out networks
  (`devices.transfer.kv_link`); lanes: the fewer chips of the two replicas;
- one transfer at a time per decode replica's link: a transfer starts after the one before
  it on that link ended (the connector's `link_free`).
"""

from __future__ import annotations

from collections.abc import Sequence

from devices.transfer import Link, kv_link, transfer_seconds
from server.engine.core import EngineCore
from server.engine.kv_transfer import KvTransferConfig


def link_name(*kv_transfer_configs: str | None) -> str | None:
    """The first `kv_connector_extra_config.link` among the deployments' configs."""
    for text in kv_transfer_configs:
        cfg = KvTransferConfig.parse(text, env={})
        nixl = cfg.nixl if cfg is not None else None
        if nixl is not None and nixl.link:
            return nixl.link
    return None


class KvLinks:
    """The links between a fleet's prefill and decode replicas, and when each is free.

    `cores[i]` and `links[i]` are indexed like the fleet's replicas; `links[i]` names replica
    i's link id (None: the chips' networks)."""

    def __init__(self, cores: Sequence[EngineCore], links: Sequence[str | None]) -> None:
        self.cores, self.links = list(cores), list(links)
        self.free_at = [0.0] * len(self.cores)  # per decode replica: its link's last end
        self.transfers, self.bytes, self.seconds = 0, 0.0, 0.0

    def link(self, prefill: int, decode: int) -> Link:
        a, b = self.cores[prefill], self.cores[decode]
        return kv_link(a.placement.chip, b.placement.chip,
                       self.links[decode] or self.links[prefill])

    def seconds_for(self, prefill: int, decode: int, num_tokens: int) -> float:
        """What `transfer_seconds` charges for `num_tokens` tokens' KV between the two."""
        a, b = self.cores[prefill], self.cores[decode]
        nbytes = b.placement.kv_bytes_per_token * num_tokens
        return transfer_seconds(nbytes, self.link(prefill, decode),
                                min(a.placement.chips, b.placement.chips))

    def transfer(self, prefill: int, decode: int, num_tokens: int,
                 t: float) -> tuple[float, float]:
        """Start a transfer asked at `t`: (when it ends, its seconds on the link)."""
        seconds = self.seconds_for(prefill, decode, num_tokens)
        end = max(t, self.free_at[decode]) + seconds
        self.free_at[decode] = end
        self.transfers += 1
        self.bytes += self.cores[decode].placement.kv_bytes_per_token * num_tokens
        self.seconds += seconds
        return end, seconds
