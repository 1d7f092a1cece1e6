"""SGLang's gRPC scheduler service (`sglang.grpc.scheduler.SglangScheduler`), what an SGLang
pod (`--http-api sglang`; `doppelchip sglang serve --smg-grpc-mode`) serves on its gRPC port in
place of vLLM's engine service, so the smg gateway in gRPC mode detects and fronts it as an
SGLang worker (docs/SGLANG.md, "gRPC").

Thin, as `server/vllm_servicer.py`: convert (`server/sglang_convert.py`), hand to the engine,
convert back; the shared rules (owned aborts, every request freed however it ends, the
tokenizer zip, KV events, FlushCache) are `server/engine_servicer.py`'s. What smg-grpc-servicer
0.14.1's SGLang servicer answers, and so this one:
- `Generate`: initial metadata at once; chunks with the new ids and cumulative counts, then a
  `complete`; `n` > 1 as n outputs told apart by `index` (streams interleaved, completes in
  index order when not streaming); `return_logprob` with the emulated distribution
  (`server/frontend/logprobs.py`). A request the engine ends with an error ends the RPC with
  INTERNAL, as a scheduler abort with a 500 does there;
- `HealthCheck`: a one-token generation from input_ids [0] (`sglang_pod.probe`), healthy once
  it produced its token, within SGLang's 20 s; unhealthy while draining;
- `Abort` {request_id}: `success` and "Request X aborted" / "not found";
- `GetModelInfo`, `GetServerInfo` (`server_args` as `/server_info`'s, `server_type` "grpc"),
  `GetLoads` (each rank's LoadSnapshot, `include` and `dp_rank` applied, the aggregate);
- `Embed`: a pooling model's tokenized prompt, its emulated vector.
LoRA and profiling methods answer UNIMPLEMENTED (not emulated on an SGLang pod).
Errors: INVALID_ARGUMENT (HTTP 400 through smg), RESOURCE_EXHAUSTED (429), ALREADY_EXISTS (an
id in flight), UNAVAILABLE (503: draining, an engine down), INTERNAL (the engine failed the
request).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import UTC, datetime

import grpc
from google.protobuf.struct_pb2 import Struct
from google.protobuf.timestamp_pb2 import Timestamp
from smg_grpc_proto import sglang_scheduler_pb2 as spb
from smg_grpc_proto.generated import common_pb2
from smg_grpc_servicer.load_record import engine_load_from

from server import sglang_convert as sc
from server import vllm_embed, wire
from server.engine.interface import FinishReason
from server.engine.tokenizer import ARCHITECTURES, MODEL_TYPE
from server.engine_servicer import EngineServicer
from server.frontend import parallel, sglang_pod
from server.frontend.deployment import DeploymentClient
from server.frontend.logprobs import Logprobs
from server.frontend.outputs import Output
from server.frontend.stream import StreamFailed
from server.wire import Undecodable

log = logging.getLogger("doppelchip.sglang")

SGLANG_SERVICE = spb.DESCRIPTOR.services_by_name["SglangScheduler"]
SERVICE_NAME = SGLANG_SERVICE.full_name
HEALTH_CHECK_TIMEOUT_S = 20.0  # SGLANG_HEALTH_CHECK_TIMEOUT's default


class SglangSchedulerServicer(EngineServicer):
    KV_DISABLED = ("KV cache events not enabled. Start SGLang with "  # smg's SGLang servicer
                   '--kv-events-config \'{"publisher": "zmq"}\'')

    def __init__(self, client: DeploymentClient, api_keys: Sequence[str] = (),
                 enable_metrics: bool = False) -> None:
        super().__init__(client, api_keys, log)
        self.enable_metrics = enable_metrics
        self.windows = sglang_pod.Windows()

    async def Generate(self, request: spb.GenerateRequest, context: grpc.aio.ServicerContext
                       ) -> AsyncIterator[spb.GenerateResponse]:
        if type(request) is Undecodable:
            await wire.reject(request, context)
        rid = request.request_id or f"grpc-{uuid.uuid4().hex}"
        limits = (*sglang_pod.request_limits(self.client), self.client.limits.max_logprobs)
        call = await self.open_call(
            context, rid, lambda: sc.to_engine_requests(request, rid, *limits))
        if call.streams is None:  # its Abort overtook it: it ends at once, having run nothing
            yield spb.GenerateResponse(request_id=rid,
                                       complete=spb.GenerateComplete(finish_reason="abort"))
            wire.end_stream(context)
            return
        streams = call.streams
        k = max(0, request.top_logprobs_num) if request.return_logprob else 0
        outs = [Output(s, Logprobs(self.client.tokenizer, s.request.sampling.seed or 0)
                       if request.return_logprob else None) for s in streams]
        eos = self.client.tokenizer.eos_token_id
        ended: dict[int, spb.GenerateComplete] = {}
        try:  # from here on every way out frees what the engine holds
            await self.send_headers(context, rid)
            async for i, chunk in parallel.merged(streams):
                o, finished = outs[i], chunk.finish is not None
                tops = o.add(chunk.token_ids, k)
                if finished and chunk.finish.reason is FinishReason.ERROR:
                    ended[i] = spb.GenerateComplete()
                    await wire.abort(context, grpc.StatusCode.INTERNAL,
                                     "the scheduler aborted the request: the engine failed")
                if finished:
                    o.counts.cached_tokens = chunk.finish.usage.cached_prompt_tokens
                if request.stream:
                    lps = sc.output_logprobs(tops, k) if o.lp is not None else None
                    if chunk.token_ids or finished:
                        yield spb.GenerateResponse(request_id=rid, chunk=sc.to_chunk(
                            chunk.token_ids, o.counts, i, lps))
                    if finished:
                        ended[i] = sc.to_complete(chunk, chunk.token_ids, o.counts, i, eos,
                                                  lps)
                        yield spb.GenerateResponse(request_id=rid, complete=ended[i])
                elif finished:
                    ended[i] = sc.to_complete(chunk, o.ids, o.counts, i, eos,
                                              sc.output_logprobs(o.tops, k)
                                              if o.lp is not None else None)
            if not request.stream:  # the outputs together, in index order, as SGLang's batch
                for i in sorted(ended):
                    yield spb.GenerateResponse(request_id=rid, complete=ended[i])
            wire.end_stream(context)
        except StreamFailed as e:
            await wire.abort(context, grpc.StatusCode.UNAVAILABLE, str(e))
        finally:
            self.close_call(call, len(ended) == len(streams))

    async def Embed(self, request: spb.EmbedRequest, context: grpc.aio.ServicerContext
                    ) -> spb.EmbedResponse:
        """A pooling model's tokenized prompt pooled (the path vLLM's Embed takes:
        `server/vllm_embed.py`), answered in SGLang's flat EmbedResponse."""
        if type(request) is Undecodable:
            await wire.reject(request, context)
        self.last_receive = time.time()
        if self.draining:
            await wire.abort(context, grpc.StatusCode.UNAVAILABLE, "server is draining")
        out = await vllm_embed.embed(self.client, request, context)
        return spb.EmbedResponse(embedding=out.embedding, prompt_tokens=out.prompt_tokens,
                                 embedding_dim=out.embedding_dim)

    async def HealthCheck(self, request: spb.HealthCheckRequest,
                          context: grpc.aio.ServicerContext) -> spb.HealthCheckResponse:
        if self.draining:
            return spb.HealthCheckResponse(healthy=False, message="Server is shutting down")
        try:
            ok = await asyncio.wait_for(sglang_pod.probe(self.client), HEALTH_CHECK_TIMEOUT_S)
        except TimeoutError:
            return spb.HealthCheckResponse(
                healthy=False, message=f"Health check timeout after "
                f"{HEALTH_CHECK_TIMEOUT_S:.0f}s")
        return spb.HealthCheckResponse(healthy=ok, message="Health check passed" if ok else
                                       "Health check probe failed")

    async def Abort(self, request: spb.AbortRequest, context: grpc.aio.ServicerContext
                    ) -> spb.AbortResponse:
        """Owned, as VllmEngine's (`EngineServicer.abort_owned`): anyone else's Abort answers
        `success: false`, "not found", and ends nothing."""
        return spb.AbortResponse(**self.abort_reply(context, request.request_id))

    async def GetModelInfo(self, request: spb.GetModelInfoRequest,
                           context: grpc.aio.ServicerContext) -> spb.GetModelInfoResponse:
        info, tok = sglang_pod.model_info(self.client), self.client.tokenizer
        return spb.GetModelInfoResponse(
            model_path=info["model_path"], tokenizer_path=info["tokenizer_path"],
            is_generation=info["is_generation"], weight_version=info["weight_version"],
            served_model_name=info["served_model_name"],
            max_context_length=self.client.info.capacity.max_model_len,
            vocab_size=tok.vocab_size, supports_vision=False, model_type=MODEL_TYPE,
            eos_token_ids=[tok.eos_token_id], pad_token_id=tok.pad_token_id or 0,
            bos_token_id=tok.bos_token_id,
            max_req_input_len=sglang_pod.request_limits(self.client)[1],
            architectures=ARCHITECTURES)

    async def GetServerInfo(self, request: spb.GetServerInfoRequest,
                            context: grpc.aio.ServicerContext) -> spb.GetServerInfoResponse:
        args = sglang_pod.server_info(self.client, self.enable_metrics)
        scheduler = {"max_total_num_tokens": args["max_total_num_tokens"],
                     "max_req_input_len": args["max_req_input_len"],
                     "is_generation": not self.client.limits.pooling_task}
        for key in ("internal_states", "version", "status", "frontend"):
            args.pop(key)
        server_args, scheduler_info = Struct(), Struct()
        server_args.update(args)
        scheduler_info.update(scheduler)
        s = self.client.status()
        start = Timestamp()
        start.FromSeconds(int(self.started))
        return spb.GetServerInfoResponse(
            server_args=server_args, scheduler_info=scheduler_info,
            active_requests=s.num_running + s.num_waiting, is_paused=False,
            last_receive_timestamp=self.last_receive, uptime_seconds=time.time() - self.started,
            sglang_version=sglang_pod.SGLANG_VERSION, server_type="grpc", start_time=start,
            max_total_num_tokens=scheduler["max_total_num_tokens"])

    def load_source(self) -> Callable[[int | None], common_pb2.EngineLoad | None]:
        """The record smg's relay stamps on a batch of group rank `dp_rank` (None: the first
        rank; a rank this pod does not run: none): that rank's LoadSnapshot as GetLoads
        reports it, every section, as smg's SGLang servicer reads it (`load_record`); its
        windows are the stream's own, so a subscriber does not shift GetLoads' polls."""
        windows = sglang_pod.Windows()

        def record(dp_rank: int | None) -> common_pb2.EngineLoad | None:
            r = self.local_rank(dp_rank)
            if r is None:
                return None
            snapshot = sglang_pod.load_snapshot(self.client, r, windows, self.client.clock(),
                                                None)
            return engine_load_from(sc.to_scheduler_load(snapshot), queued_token_work=True)
        return record

    async def GetLoads(self, request: spb.GetLoadsRequest, context: grpc.aio.ServicerContext
                       ) -> spb.GetLoadsResponse:
        include = set(request.include) or {"all"}
        if refusal := sglang_pod.unknown_sections(include):
            await wire.abort(context, grpc.StatusCode.INVALID_ARGUMENT, refusal)
        rank = request.dp_rank if request.HasField("dp_rank") else None
        now = self.client.clock()
        loads = [sc.to_scheduler_load(sglang_pod.load_snapshot(self.client, r, self.windows,
                                                               now, include))
                 for r, view in enumerate(self.client.views)
                 if rank is None or view.info.dp_rank == rank]
        return spb.GetLoadsResponse(
            timestamp=datetime.now(UTC).isoformat(), version=sglang_pod.SGLANG_VERSION,
            dp_rank_count=len(loads), loads=loads, aggregate=sc.aggregate(loads))

