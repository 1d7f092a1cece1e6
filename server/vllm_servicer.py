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
  `n` > 1 runs its sequences as vLLM's parallel sampling does (server/frontend/parallel.py);
  logprobs are the front end's emulated ones (server/vllm_logprobs.py);
- `Abort` (the gateway's only cancellation) frees the request's KV on the loop's next turn;
- `GetLoads` reports each rank's own counts (running, waiting, KV usage) with smg-grpc-servicer
  0.14.1's own bookkeeping of the requests this service forwards (`LoadTracker`: queued
  uncached prompt tokens, tokens streamed over its 2-second window, the hit rate of the last
  64 first outputs), field for field as its `scheduler_load_fields`; `SubscribeKvEvents`
  stamps each batch with the same figures as an `EngineLoad` (`load_source`);
- `GetServerInfo` reports the engine's own numbers;
- `Embed` pools a tokenized prompt on an embedding model (`server/vllm_embed.py`), and
  `GetModelInfo.is_generation` is false there, so the gateway routes embeddings to it.
Errors: INVALID_ARGUMENT (HTTP 400 through smg), RESOURCE_EXHAUSTED (429), UNAVAILABLE (503).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import UTC, datetime

import grpc
from smg_grpc_proto import vllm_engine_pb2 as vpb
from smg_grpc_proto.generated import common_pb2
from smg_grpc_servicer.vllm.loads import LoadTracker, load_record, scheduler_load_fields

from server import vllm_convert, vllm_embed, vllm_logprobs, wire
from server.engine.errors import InvalidRequest
from server.engine.interface import (
    DeploymentState,
    Finish,
    FinishReason,
    Timings,
    TokenChunk,
    Usage,
)
from server.engine_servicer import EngineServicer
from server.frontend import parallel
from server.frontend.deployment import DeploymentClient
from server.frontend.logprobs import Logprobs
from server.frontend.stream import StreamFailed
from server.http.state import VLLM_VERSION
from server.wire import Undecodable

log = logging.getLogger("doppelchip.vllm")

# the last chunk of a request whose Abort came before it (nothing ran)
ABORTED = TokenChunk(finish=Finish(FinishReason.ABORT, Usage(), Timings()))
VLLM_SERVICE = vpb.DESCRIPTOR.services_by_name["VllmEngine"]
SERVICE_NAME = VLLM_SERVICE.full_name


class VllmEngineServicer(EngineServicer):
    """`vllm.grpc.engine.VllmEngine` over one deployment (the shared rules:
    `server/engine_servicer.py`)."""

    def __init__(self, client: DeploymentClient, api_keys: Sequence[str] = ()) -> None:
        super().__init__(client, api_keys, log)
        # smg's per-rank bookkeeping of the requests this service forwards, by group rank
        self.loads = LoadTracker()

    async def Generate(
        self, request: vpb.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[vpb.GenerateResponse]:
        if type(request) is Undecodable:
            await wire.reject(request, context)
        rid = request.request_id or f"req-{uuid.uuid4().hex}"
        tok = self.client.tokenizer
        asked: list[tuple[int | None, int | None]] = []

        def build() -> list:  # (a refusal, checks' included, ends the RPC with its status)
            asked.append(vllm_logprobs.asked(request.sampling_params,
                                             self.client.limits.max_logprobs, tok.vocab_size))
            n = request.sampling_params.n or 1  # (proto3's unset 0: vLLM's default, 1)
            if not 1 <= n <= parallel.MAX_N:
                raise InvalidRequest(f"n must be in [1, {parallel.MAX_N}], got {n}")
            return parallel.child_requests(vllm_convert.to_engine_request(request, rid), n)

        call = await self.open_call(context, rid, build)
        if call.streams is None:  # its Abort overtook it: it ends at once, having run nothing
            yield vllm_convert.to_complete(ABORTED, ())
            wire.end_stream(context)
            return
        streams = call.streams
        prompt_ids = streams[0].out.prompt_ids
        rank = self.client.views[streams[0].rank].info.dp_rank
        self.loads.submitted(rid, len(prompt_ids), rank=rank)
        k, k_prompt = asked[0]
        lps = [Logprobs(tok, s.request.sampling.seed or 0) if k is not None else None
               for s in streams]  # (each sequence its own seed)
        prompt_lp = (vllm_logprobs.prompt(Logprobs(tok, 0), prompt_ids, k_prompt)
                     if k_prompt is not None else None)
        out = GenerateMessages(request.stream, len(prompt_ids), k, lps, prompt_lp)
        loads = self.loads
        try:  # from here on every way out frees what the engine holds
            await self.send_headers(context, rid)
            # one sequence (most requests): its stream read directly, no merging layer on the
            # per-token path; n > 1: (sequence, chunk) pairs as they come
            n = len(streams)
            chunks = streams[0].outputs() if n == 1 else parallel.merged(streams)
            async for item in chunks:
                i, chunk = (0, item) if n == 1 else item
                if out.started is None:  # its first output: started, with what the cache held
                    out.started = i
                    loads.first_output(rid, len(prompt_ids), streams[i].cached, rank=rank)
                loads.generated(len(chunk.token_ids), rank=rank)
                for msg in out.of(i, chunk):
                    yield msg
            for msg in out.ended():  # a request not streamed: its completes, once all ended
                yield msg
            wire.end_stream(context)
        except StreamFailed as e:
            await wire.abort(context, grpc.StatusCode.UNAVAILABLE, str(e))
        finally:
            loads.finished(rid)  # (a request that never started leaves the queue)
            self.close_call(call, out.all_finished)

    async def Embed(self, request: vpb.EmbedRequest, context: grpc.aio.ServicerContext
                    ) -> vpb.EmbedResponse:
        """smg's embeddings path: `server/vllm_embed.py`."""
        if type(request) is Undecodable:
            await wire.reject(request, context)
        self.last_receive = time.time()
        if self.draining:
            await wire.abort(context, grpc.StatusCode.UNAVAILABLE, "server is draining")
        return await vllm_embed.embed(self.client, request, context)

    async def Abort(
        self, request: vpb.AbortRequest, context: grpc.aio.ServicerContext
    ) -> vpb.AbortResponse:
        """Aborts are owned (`request_ids.AbortBook`): a request ends only for an Abort from
        the connection that started it, or from a caller holding the API key; anyone else's
        Abort answers OK and does nothing. An Abort for an id not yet here is remembered."""
        for rid in request.request_ids:
            self.abort_owned(context, rid)
        return vpb.AbortResponse()

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

    async def GetServerInfo(
        self, request: vpb.GetServerInfoRequest, context: grpc.aio.ServicerContext
    ) -> vpb.GetServerInfoResponse:
        s, info = self.client.status(), self.client.info
        return vpb.GetServerInfoResponse(
            active_requests=s.num_running + s.num_waiting, is_paused=False,
            last_receive_timestamp=self.last_receive,
            uptime_seconds=time.time() - self.started, server_type="vllm-grpc",
            data_parallel_size=info.data_parallel_size, kv_cache_dtype=info.cache_dtype,
            block_size=s.capacity.block_size, model_dtype=s.quant,
            max_num_seqs=s.capacity.max_num_seqs,
        )

    async def GetLoads(
        self, request: vpb.GetLoadsRequest, context: grpc.aio.ServicerContext
    ) -> vpb.GetLoadsResponse:
        """One load per data-parallel rank this pod runs, numbered by its rank in the group, as
        smg's servicer (0.14.1) reports them; `dp_rank` and `include` are accepted and not
        applied, as there."""
        loads = [vpb.SchedulerLoad(**scheduler_load_fields(*args, **kw))
                 for args, kw in map(self._rank_load, range(len(self.client.views)))]
        return vpb.GetLoadsResponse(timestamp=_now_iso(), version=VLLM_VERSION,
                                    dp_rank_count=len(loads), loads=loads)

    def _rank_load(self, r: int) -> tuple[tuple, dict]:
        """Local rank `r`'s load, as the arguments of smg's `scheduler_load_fields` and
        `load_record`: its own counts and KV usage (blocks neither free nor evictable, vLLM's
        `kv_cache_usage`), this service's estimate for it, its group rank and capacities."""
        s, dp = self.client.status([r]), self.client.views[r].info.dp_rank
        c = s.capacity
        total = c.kv_blocks_total
        usage = (total - c.kv_blocks_free) / total if total else 0.0
        return ((s.num_running, s.num_waiting, usage, self.loads.estimate(s.num_waiting, rank=dp)),
                {"dp_rank": dp, "max_total_num_tokens": total * c.block_size,
                 "max_running_requests": c.max_num_seqs})

    def load_source(self) -> Callable[[int | None], common_pb2.EngineLoad | None]:
        """The record smg's relay stamps on a batch of group rank `dp_rank` (None: the first
        rank; a rank this pod does not run: none): that rank's GetLoads figures, as smg's
        `load_record` makes them."""
        def record(dp_rank: int | None) -> common_pb2.EngineLoad | None:
            r = self.local_rank(dp_rank)
            if r is None:
                return None
            args, kw = self._rank_load(r)
            return load_record(*args, **kw)
        return record


class GenerateMessages:
    """The GenerateResponses of one request's chunks: n sequences, their token ids so far,
    their logprobs (`lps`, None when not asked) and the prompt's (`prompt`)."""

    def __init__(self, stream: bool, prompt_tokens: int, k: int | None,
                 lps: list[Logprobs | None], prompt: vpb.InputLogProbs | None) -> None:
        self.stream, self.prompt_tokens, self.k, self.lps = stream, prompt_tokens, k, lps
        self.prompt = prompt
        self.ids: list[list[int]] = [[] for _ in lps]
        self.finished = [False] * len(lps)
        self.completes: list[vpb.GenerateResponse] = []
        self.started: int | None = None  # the sequence that output first

    def of(self, i: int, chunk: TokenChunk) -> list[vpb.GenerateResponse]:
        """What sequence `i`'s chunk sends now: a chunk when streaming, a complete when the
        sequence ended streamed (not streamed: kept for `ended`)."""
        ids, finished = self.ids[i], chunk.finish is not None
        start = len(ids)
        ids.extend(chunk.token_ids)
        out = []
        if self.stream and (chunk.token_ids or finished):
            cached = chunk.finish.usage.cached_prompt_tokens if finished else 0
            msg = vllm_convert.to_chunk(chunk, self.prompt_tokens, cached, i)
            if self.k is not None or (self.prompt is not None and not start):
                self._attach(msg.chunk, i, chunk.token_ids, start,
                             self.prompt if not start else None)
            out.append(msg)
        if finished:
            self.finished[i] = True
            delta = chunk.token_ids if self.stream else tuple(ids)
            msg = vllm_convert.to_complete(chunk, delta, i)
            if self.k is not None or self.prompt is not None:
                self._attach(msg.complete, i, delta, len(ids) - len(delta), self.prompt)
            (out if self.stream else self.completes).append(msg)
        return out

    def ended(self) -> list[vpb.GenerateResponse]:
        """A request not streamed: every sequence's complete, in order (vLLM's outputs)."""
        return sorted(self.completes, key=lambda m: m.complete.index)

    @property
    def all_finished(self) -> bool:
        return all(self.finished)

    def _attach(self, msg: vpb.GenerateStreamChunk | vpb.GenerateComplete, i: int,
                ids: Sequence[int], start: int, prompt: vpb.InputLogProbs | None) -> None:
        """The logprobs of tokens `ids` at output positions `start`… when asked, and the
        prompt's when given (vllm_logprobs.py)."""
        lp = self.lps[i]
        if lp is not None and (o := vllm_logprobs.output(lp, ids, start, self.k or 0)):
            msg.output_logprobs.CopyFrom(o)
        if prompt is not None:
            msg.input_logprobs.CopyFrom(prompt)


def _now_iso() -> str:
    return datetime.now(UTC).isoformat()
