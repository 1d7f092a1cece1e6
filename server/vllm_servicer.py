"""The vLLM engine gRPC service (`vllm.grpc.engine.VllmEngine`), so the smg gateway fronts us.

One deployment per listening port (`[server] vllm_engine_deployment`, default: the fleet's
default deployment). Thin, like `server/servicer.py`: convert (`server/vllm_convert.py`), hand
to the engine (`submit`, `outputs`, `abort`, `status`), convert back. What smg relies on:
- `HealthCheck` is healthy only while the deployment is READY (not compiling, failed or
  draining);
- `GetModelInfo` names the model, `GetTokenizer` streams a zip of the engine's tokenizer
  directory (tokenizer.json + tokenizer_config.json with its chat template) with the sha256 of
  the zip on the last chunk, so the gateway tokenizes and applies the chat template offline;
- `Generate` sends initial metadata at once (the gateway times TTFT from it), then chunks;
  stop strings are enforced by the engine; a stream that ends early aborts the request;
- `Abort` (the gateway's only cancellation) frees the request's KV on the loop's next turn;
- `GetLoads` / `GetServerInfo` report the engine's own numbers;
- `Embed` pools a tokenized prompt on an embedding model (`server/vllm_embed.py`), and
  `GetModelInfo.is_generation` is false there, so the gateway routes embeddings to it.
Errors: INVALID_ARGUMENT (HTTP 400 through smg), RESOURCE_EXHAUSTED (429), UNAVAILABLE (503).
"""

from __future__ import annotations

import hashlib
import io
import logging
import time
import uuid
import zipfile
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime
from pathlib import Path

import grpc
from smg_grpc_proto import vllm_engine_pb2 as vpb
from smg_grpc_proto import vllm_engine_pb2_grpc as vpb_grpc
from smg_grpc_proto.generated import common_pb2

from server import convert, vllm_convert, vllm_embed, wire
from server.auth import ApiKeys, has_api_key
from server.engine.interface import (
    DeploymentState,
    EngineError,
    Finish,
    FinishReason,
    Timings,
    TokenChunk,
    Usage,
)
from server.engine.logs import request_log
from server.engine.tokenizer import TOKENIZER_DIR
from server.frontend import parallel, request_ids
from server.frontend.deployment import DeploymentClient
from server.frontend.stream import StreamFailed
from server.kv_events import relay as kv_relay
from server.wire import Undecodable

log = logging.getLogger("doppelchip.vllm")

# the last chunk of a request whose Abort came before it (nothing ran)
ABORTED = TokenChunk(finish=Finish(FinishReason.ABORT, Usage(), Timings()))
VLLM_SERVICE = vpb.DESCRIPTOR.services_by_name["VllmEngine"]
SERVICE_NAME = VLLM_SERVICE.full_name
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
CHUNK_BYTES = 64 * 1024  # as vLLM's servicer streams the bundle


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


class _Rate:
    """Generated tokens per wall second between two polls (load-aware routing reads it)."""

    def __init__(self) -> None:
        self.t, self.count, self.rate = time.monotonic(), 0, 0.0

    def update(self, count: int) -> float:
        now = time.monotonic()
        if now - self.t >= 0.05:
            self.rate = (count - self.count) / (now - self.t)
            self.t, self.count = now, count
        return self.rate


class VllmEngineServicer(vpb_grpc.VllmEngineServicer):
    def __init__(self, client: DeploymentClient, api_keys: Sequence[str] = ()) -> None:
        self.client = client
        self.api_keys = ApiKeys(api_keys)  # a caller with one may abort any request
        self.aborts = request_ids.AbortBook()
        self.peers: dict[int, str] = {}  # stream seq -> the connection that started it
        self.draining = False
        self.started = time.monotonic()
        self.last_receive = 0.0
        # per data-parallel rank, of the requests this service finished (cache hit rate)
        self.prompt_tokens = [0] * len(client.views)
        self.cached_tokens = [0] * len(client.views)
        self._rates = [_Rate() for _ in client.views]  # per data-parallel rank
        self._tokenizer: tuple[bytes, str] | None = None

    def ready(self) -> bool:
        return not self.draining and self.client.is_ready()

    async def Generate(
        self, request: vpb.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[vpb.GenerateResponse]:
        if type(request) is Undecodable:
            await wire.reject(request, context)
        rid = request.request_id or f"req-{uuid.uuid4().hex}"
        rlog = request_log(log, rid)
        peer = context.peer()
        self.last_receive = time.time()
        if self.draining:
            await wire.abort(context, grpc.StatusCode.UNAVAILABLE, "server is draining")
        try:
            request_ids.check(rid)
            engine_request = vllm_convert.to_engine_request(request, rid)
            early_abort = self.aborts.take_early_abort(peer, rid)
            if not early_abort:
                (stream,) = await parallel.submit_all(self.client, [engine_request], rid)
        except EngineError as e:
            rlog.info("rejected: %s", e)
            await wire.abort(context, convert.status_code(e), str(e))
        if early_abort:  # its Abort overtook it: it ends at once, aborted, having run nothing
            rlog.info("aborted before it arrived (Abort from the client came first)")
            self.aborts.finished(peer, rid)
            yield vllm_convert.to_complete(ABORTED, ())
            return
        self.peers[stream.seq] = peer
        prompt_tokens = len(stream.out.prompt_ids)
        output_ids: list[int] = []
        finished = False
        try:  # from here on every way out frees what the engine holds
            await wire.send_headers(context,
                                    (("x-request-id", request_ids.metadata_value(rid)),))
            async for chunk in stream.outputs():
                output_ids.extend(chunk.token_ids)
                finished = chunk.finish is not None
                if request.stream and (chunk.token_ids or finished):
                    cached = chunk.finish.usage.cached_prompt_tokens if finished else 0
                    yield vllm_convert.to_chunk(chunk, prompt_tokens, cached)
                if finished:
                    self._account(chunk, stream.rank)
                    ids = chunk.token_ids if request.stream else tuple(output_ids)
                    yield vllm_convert.to_complete(chunk, ids)
        except StreamFailed as e:
            await wire.abort(context, grpc.StatusCode.UNAVAILABLE, str(e))
        finally:
            self.peers.pop(stream.seq, None)
            self.aborts.finished(peer, rid)
            if not finished:  # client cancel, deadline, or a failed write: free it at once
                rlog.info("stream ended early; aborting in %s", self.client.name)
                self.client.abort(stream)

    async def Embed(self, request: vpb.EmbedRequest, context: grpc.aio.ServicerContext
                    ) -> vpb.EmbedResponse:
        """smg's embeddings path: `server/vllm_embed.py`."""
        if type(request) is Undecodable:
            await wire.reject(request, context)
        self.last_receive = time.time()
        if self.draining:
            await wire.abort(context, grpc.StatusCode.UNAVAILABLE, "server is draining")
        return await vllm_embed.embed(self.client, request, context)

    def _account(self, chunk, rank: int) -> None:
        if chunk.finish.reason is not FinishReason.ABORT:
            self.prompt_tokens[rank] += chunk.finish.usage.prompt_tokens
            self.cached_tokens[rank] += chunk.finish.usage.cached_prompt_tokens

    async def Abort(
        self, request: vpb.AbortRequest, context: grpc.aio.ServicerContext
    ) -> vpb.AbortResponse:
        """Aborts are owned (`request_ids.AbortBook`): a request ends only for an Abort from
        the connection that started it, or from a caller holding the API key; anyone else's
        Abort answers OK and does nothing. An Abort for an id not yet here is remembered."""
        peer = context.peer()
        admin = self._has_api_key(context)
        for rid in request.request_ids:
            mine = [s for s in self.client.find(rid)
                    if admin or self.peers.get(s.seq) == peer]
            if not mine:
                if not any(self.peers.get(s.seq) for s in self.client.find(rid)):
                    self.aborts.abort_unknown(peer, rid)  # its Generate may still come
                continue
            request_log(log, rid).info("Abort from the client; aborting in %s", self.client.name)
            for stream in mine:
                self.client.cancel(stream)
        return vpb.AbortResponse()

    def _has_api_key(self, context: grpc.aio.ServicerContext) -> bool:
        return has_api_key(self.api_keys, context)

    async def HealthCheck(
        self, request: vpb.HealthCheckRequest, context: grpc.aio.ServicerContext
    ) -> vpb.HealthCheckResponse:
        if self.draining:
            return vpb.HealthCheckResponse(healthy=False, message="server is draining")
        status = self.client.status()
        healthy = status.state is DeploymentState.READY
        return vpb.HealthCheckResponse(
            healthy=healthy, message=f"{status.name}: {status.state.value}: {status.state_message}"
        )

    async def GetModelInfo(
        self, request: vpb.GetModelInfoRequest, context: grpc.aio.ServicerContext
    ) -> vpb.GetModelInfoResponse:
        tok = self.client.tokenizer
        return vllm_convert.to_model_info(
            self.client.status(), self.client.info.model_name, self.client.info.model_path,
            eos=tok.eos_token_id, bos=tok.bos_token_id, pad=tok.pad_token_id or 0,
            vocab_size=tok.vocab_size, is_generation=not self.client.limits.pooling_task,
        )

    async def GetTokenizer(
        self, request: common_pb2.GetTokenizerRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[common_pb2.GetTokenizerChunk]:
        if self._tokenizer is None:
            self._tokenizer = tokenizer_zip()
        data, digest = self._tokenizer
        for start in range(0, len(data), CHUNK_BYTES):
            end = min(start + CHUNK_BYTES, len(data))
            yield common_pb2.GetTokenizerChunk(data=data[start:end],
                                               sha256=digest if end == len(data) else "")

    async def GetServerInfo(
        self, request: vpb.GetServerInfoRequest, context: grpc.aio.ServicerContext
    ) -> vpb.GetServerInfoResponse:
        s, info = self.client.status(), self.client.info
        return vpb.GetServerInfoResponse(
            active_requests=s.num_running + s.num_waiting, is_paused=False,
            last_receive_timestamp=self.last_receive,
            uptime_seconds=time.monotonic() - self.started, server_type="vllm-grpc",
            data_parallel_size=info.data_parallel_size, kv_cache_dtype=info.cache_dtype,
            block_size=s.capacity.block_size, model_dtype=s.quant,
            max_num_seqs=s.capacity.max_num_seqs,
        )

    async def GetLoads(
        self, request: vpb.GetLoadsRequest, context: grpc.aio.ServicerContext
    ) -> vpb.GetLoadsResponse:
        """One load per data-parallel rank this pod runs, numbered by its rank in the group, as
        smg's servicer (0.14.1) reports them; `dp_rank` and `include` are accepted and not
        applied, as there. A rank's cache hit rate is over the requests this service
        finished there (smg's servicer keeps its own per rank)."""
        loads = [vllm_convert.to_scheduler_load(
                     self.client.status([r]), rate.update(self.client.generated_tokens([r])),
                     self.cached_tokens[r] / self.prompt_tokens[r] if self.prompt_tokens[r]
                     else 0.0, view.info.dp_rank)
                 for r, (view, rate) in enumerate(zip(self.client.views, self._rates,
                                                      strict=True))]
        return vpb.GetLoadsResponse(timestamp=_now_iso(), version="doppelchip",
                                    dp_rank_count=len(loads), loads=loads)


    # --- KV events (issue 13): docs/KV_EVENTS.md ---
    async def SubscribeKvEvents(
        self, request: common_pb2.SubscribeKvEventsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[common_pb2.KvEventBatch]:
        info = self.client.info  # rank 0, as smg's servicer relays rank 0 only
        if not info.kv_events_endpoint:
            await wire.abort(context, grpc.StatusCode.UNIMPLEMENTED, kv_relay.DISABLED)
        await context.send_initial_metadata(())
        log.info("SubscribeKvEvents from %s: relaying %s from sequence %d", context.peer(),
                 info.kv_events_endpoint, request.start_sequence_number)
        async for batch in kv_relay.relay(info.kv_events_endpoint,
                                          info.kv_events_replay_endpoint, info.kv_events_topic,
                                          request.start_sequence_number, context.cancelled):
            yield batch

    async def FlushCache(
        self, request: common_pb2.FlushCacheRequest, context: grpc.aio.ServicerContext
    ) -> common_pb2.FlushCacheResponse:
        ok = await self.client.reset_prefix_cache()
        return common_pb2.FlushCacheResponse(
            success=ok, message="Cache flushed successfully" if ok else
            "KV prefix cache reset refused; requests may be in flight")
    # --- end KV events ---


def _now_iso() -> str:
    return datetime.now(UTC).isoformat()
