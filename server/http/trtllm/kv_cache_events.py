"""`POST /kv_cache_events` of a TensorRT-LLM pod: the KV cache events since the previous call,
drained, in TensorRT-LLM's JSON (`server.kv_events.trtllm_events`), which TensorRT-LLM's
`KvCacheAwareRouter` polls after each request it routed there.

How it reads them: trtllm-serve drains the executor's event buffer (`event_buffer_max_size`
events); the pod's engine core publishes each step's events on vLLM's ZeroMQ stream and keeps
the last `buffer_steps` batches on its replay socket. A call asks each rank's replay socket for
the batches after the last one it converted (vLLM's replay protocol, `relay.replay`), so the
pod needs no subscriber running between calls and a router that polls late loses nothing the
buffer still holds. The replay socket is therefore required (`kv_events_problem` refuses a
`trtllm` pod whose events have none; `doppelchip trtllm-serve` always binds one). Without KV
events the answer is `[]`, as trtllm-serve's without `event_buffer_max_size`.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import zmq.asyncio

from server.engine.interface import DeploymentState
from server.frontend.deployment import DeploymentClient
from server.ipc.deployment import DeploymentInfo
from server.kv_events.relay import decoder, replay
from server.kv_events.trtllm_events import TrtllmEvents

log = logging.getLogger("doppelchip.kv_events")


class _Rank:
    """One rank's replay socket, its engine's incarnation, the last batch converted from it,
    and its conversion (made anew, from a `created` event, for each incarnation)."""

    def __init__(self, index: int, info: DeploymentInfo, attention_dp: bool) -> None:
        self.index, self.info, self.attention_dp = index, info, attention_dp
        self.endpoint = info.kv_events_replay_endpoint
        self.decode = decoder(info.kv_events_wire)
        self.epoch = -1
        self.last = -1
        self.events = self._fresh()

    def _fresh(self) -> TrtllmEvents:
        i = self.info
        return TrtllmEvents(num_blocks=i.capacity.kv_blocks_total,
                            host_blocks=i.kv_offload_blocks,
                            window_size=i.capacity.max_model_len,
                            dp_rank=i.rank if self.attention_dp else None)

    def restart(self, epoch: int) -> dict[str, Any]:
        """A new engine incarnation (the first, or one after a crash): its publisher counts
        from 0 and its cache is empty, as a restarted TensorRT-LLM's; its `created` event."""
        self.epoch, self.last, self.events = epoch, -1, self._fresh()
        return self.events.created()


class KvCacheEvents:
    """What the route drains. One writer: `drain`, one call at a time (its lock), so every
    rank's batches are converted once and in order."""

    def __init__(self, client: DeploymentClient) -> None:
        many = len(client.infos) > 1  # TensorRT-LLM's attention data parallelism
        self.client = client
        self.ranks = [_Rank(n, i, many) for n, i in enumerate(client.infos)
                      if i.kv_events_replay_endpoint]
        self.lock = asyncio.Lock()

    async def drain(self) -> list[dict[str, Any]]:
        async with self.lock:
            out: list[dict[str, Any]] = []
            ctx = zmq.asyncio.Context.instance()
            for r in self.ranks:
                state, _, epoch, _ = self.client.rank_state(r.index)
                if state == DeploymentState.FAILED:  # down until its restart: nothing to ask
                    continue
                if epoch != r.epoch:
                    out.append(r.restart(epoch))
                for seq, payload in await replay(ctx, r.endpoint, r.last + 1):
                    if seq <= r.last:
                        continue
                    if seq > r.last + 1:
                        log.warning("KV events: batches %d-%d were no longer in the replay "
                                    "buffer (buffer_steps); their events are lost",
                                    r.last + 1, seq - 1)
                    out += r.events.convert(r.decode(payload))
                    r.last = seq
            return out
