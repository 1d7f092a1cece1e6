"""What the engines' gRPC services that smg fronts share: vLLM's `VllmEngine`
(`server/vllm_servicer.py`), SGLang's `SglangScheduler` (`server/sglang_servicer.py`),
TensorRT-LLM's `TrtllmService` (`server/trtllm_servicer.py`) and MLX's `MlxEngine`
(`server/mlx_servicer.py`).

Why a base of its own: both front one deployment for the same gateway, and the rules that keep
a request's resources honest are one rule, not two copies:
- `open_call` admits a Generate's engine requests (all or none) or ends the RPC with the
  refusal's status; an Abort that overtook its Generate ends it at once (`AbortBook`);
- `close_call` runs on every way out of a Generate: a request that did not finish (client
  cancel, deadline, a failed write) is aborted, freeing its KV blocks and queue entries;
- `abort_owned`: an Abort ends a request only from the connection that started it, or from a
  caller holding the API key (`server/frontend/request_ids.py`);
- the tokenizer zip (`GetTokenizer`), the KV-event relay (`SubscribeKvEvents`) and
  `FlushCache` are the same messages (`smg.grpc.common`) on every service that has them
  (TensorRT-LLM's has no FlushCache).
"""

from __future__ import annotations

import hashlib
import io
import logging
import time
import zipfile
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
from smg_grpc_proto.generated import common_pb2

from server import convert, wire
from server.auth import ApiKeys, has_api_key
from server.engine.errors import EngineError
from server.engine.interface import EngineRequest
from server.engine.logs import request_log
from server.engine.tokenizer import TOKENIZER_DIR
from server.frontend import parallel, request_ids
from server.frontend.deployment import DeploymentClient
from server.frontend.stream import RequestStream
from server.kv_events import relay as kv_relay

log = logging.getLogger("doppelchip.engine_grpc")

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
CHUNK_BYTES = 64 * 1024  # as the servicers stream the bundle


def tokenizer_zip(directory: Path = TOKENIZER_DIR) -> tuple[bytes, str]:
    """The tokenizer directory as a zip (fixed timestamps: the same bytes every time) and the
    sha256 hex digest of those bytes."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name in TOKENIZER_FILES:
            info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, (directory / name).read_bytes())
    data = buf.getvalue()
    return data, hashlib.sha256(data).hexdigest()


@dataclass
class Call:
    """One Generate's id, the connection that made it (read once, while the call is live),
    and its admitted streams (None: its Abort came first, nothing ran)."""

    rid: str
    peer: str
    streams: list[RequestStream] | None


class EngineServicer:
    """The shared half of an engine gRPC service fronting `client` (see the module docstring).
    `logger`: the service's own log, so a request's lines say which protocol it came by."""

    KV_DISABLED = kv_relay.DISABLED  # SubscribeKvEvents without events: the servicer's words

    def __init__(self, client: DeploymentClient, api_keys: Sequence[str] = (),
                 logger: logging.Logger = log) -> None:
        self.client = client
        self.log = logger
        self.api_keys = ApiKeys(api_keys)  # a caller with one may abort any request
        self.aborts = request_ids.AbortBook()
        self.peers: dict[int, str] = {}  # stream seq -> the connection that started it
        self.draining = False
        self.started = time.time()
        self.last_receive = 0.0
        self._tokenizer: tuple[bytes, str] | None = None

    def ready(self) -> bool:
        return not self.draining and self.client.is_ready()

    async def open_call(self, context: grpc.aio.ServicerContext, rid: str,
                        build: Callable[[], list[EngineRequest]]) -> Call:
        """A Generate's engine requests (`build()`, which may raise InvalidRequest), admitted
        and owned by the caller's connection; `streams` None when the caller's Abort came
        first (nothing ran). A refusal ends the RPC with its status."""
        peer = context.peer()  # read now: never from a call that has ended
        self.last_receive = time.time()
        if self.draining:
            await wire.abort(context, grpc.StatusCode.UNAVAILABLE, "server is draining")
        try:
            request_ids.check(rid)
            requests = build()
            if self.aborts.take_early_abort(peer, rid):
                request_log(self.log, rid).info(
                    "aborted before it arrived (Abort from the client came first)")
                self.aborts.finished(peer, rid)
                return Call(rid, peer, None)
            streams = await parallel.submit_all(self.client, requests, rid)
        except EngineError as e:
            request_log(self.log, rid).info("rejected: %s", e)
            await wire.abort(context, convert.status_code(e), str(e))
        for stream in streams:
            self.peers[stream.seq] = peer
        return Call(rid, peer, streams)

    async def send_headers(self, context: grpc.aio.ServicerContext, rid: str) -> None:
        """Initial metadata at once: the gateway times TTFT from it."""
        await wire.send_headers(context, (("x-request-id", request_ids.metadata_value(rid)),))

    def close_call(self, call: Call, finished: bool) -> None:
        """Every way out of a Generate: unfinished streams are aborted at once."""
        streams = call.streams or []
        for stream in streams:
            self.peers.pop(stream.seq, None)
        self.aborts.finished(call.peer, call.rid)
        if not finished:  # client cancel, deadline, or a failed write: free it at once
            request_log(self.log, call.rid).info("stream ended early; aborting in %s",
                                                 self.client.name)
            parallel.abort_all(self.client, streams)

    def local_rank(self, dp_rank: int | None) -> int | None:
        """The pod's engine index of group rank `dp_rank` (None: its first rank); None for a
        rank this pod does not run (a load record names no other rank's figures)."""
        if dp_rank is None:
            return 0
        return next((r for r, v in enumerate(self.client.views) if v.info.dp_rank == dp_rank),
                    None)

    def abort_owned(self, context: grpc.aio.ServicerContext, rid: str) -> bool:
        """End request `rid` if the caller owns it (its connection started it, or it holds
        the API key); remember an Abort for an id not here yet. Whether anything ended."""
        peer = context.peer()
        admin = has_api_key(self.api_keys, context)
        found = [s for s in self.client.streams.values()  # n > 1: children of `rid`
                 if s.request_id == rid or s.client_id == rid]
        mine = [s for s in found if admin or self.peers.get(s.seq) == peer]
        if not mine:
            if not any(self.peers.get(s.seq) for s in found):
                self.aborts.abort_unknown(peer, rid)  # its Generate may still come
            return False
        request_log(self.log, rid).info("Abort from the client; aborting in %s",
                                        self.client.name)
        for stream in mine:
            self.client.cancel(stream)
        return True

    def abort_reply(self, context: grpc.aio.ServicerContext, rid: str) -> dict:
        """SGLang's and TensorRT-LLM's Abort answer for `rid` (`abort_owned`): `success`, and
        "Request X aborted" or "Request X not found" (anyone else's request ends nothing)."""
        ok = self.abort_owned(context, rid)
        return {"success": ok, "message": f"Request {rid} {'aborted' if ok else 'not found'}"}

    async def GetTokenizer(
        self, request: common_pb2.GetTokenizerRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[common_pb2.GetTokenizerChunk]:
        """A zip of the engine's tokenizer (tokenizer.json, tokenizer_config.json with the
        chat template), the zip's sha256 on the last chunk: the gateway needs no hub."""
        if self._tokenizer is None:
            self._tokenizer = tokenizer_zip()
        data, digest = self._tokenizer
        for start in range(0, len(data), CHUNK_BYTES):
            end = min(start + CHUNK_BYTES, len(data))
            yield common_pb2.GetTokenizerChunk(data=data[start:end],
                                               sha256=digest if end == len(data) else "")

    # --- KV events (issue 13): docs/KV_EVENTS.md ---
    def load_source(self) -> Callable[[int | None], common_pb2.EngineLoad | None] | None:
        """What stamps the KV-event stream's batches with a rank's load (smg's `LoadSource`),
        or None: the stream then carries cache events only and the gateway polls GetLoads."""
        return None

    async def SubscribeKvEvents(
        self, request: common_pb2.SubscribeKvEventsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[common_pb2.KvEventBatch]:
        ranks = [(n, i) for n, i in enumerate(self.client.infos) if i.kv_events_endpoint]
        if not ranks:
            await wire.abort(context, grpc.StatusCode.UNIMPLEMENTED, self.KV_DISABLED)
        await context.send_initial_metadata(())
        self.log.info("SubscribeKvEvents from %s: relaying %s from sequence %d",
                      context.peer(), ", ".join(i.kv_events_endpoint for _, i in ranks),
                      request.start_sequence_number)
        # each stream under the rank clients see (the group's: start rank + local index)
        streams = {i.dp_rank: kv_relay.rank_batches(
                       i.kv_events_endpoint, i.kv_events_replay_endpoint, i.kv_events_topic,
                       request.start_sequence_number, context.cancelled,
                       lambda n=n: self.client.rank_state(n)[2])
                   for n, i in ranks}
        try:
            async for batch in kv_relay.merge(streams, self.load_source()):
                yield batch
        except (kv_relay.PublisherRestarted, kv_relay.HistoryLost) as e:
            await wire.abort(context, grpc.StatusCode.DATA_LOSS, str(e))

    async def FlushCache(
        self, request: common_pb2.FlushCacheRequest, context: grpc.aio.ServicerContext
    ) -> common_pb2.FlushCacheResponse:
        ok = await self.client.reset_prefix_cache()
        return common_pb2.FlushCacheResponse(
            success=ok, message="Cache flushed successfully" if ok else
            "KV prefix cache reset refused; requests may be in flight")
    # --- end KV events ---
