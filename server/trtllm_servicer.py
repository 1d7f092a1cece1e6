"""TensorRT-LLM's gRPC service (`trtllm.TrtllmService`), what a TensorRT-LLM pod
(`doppelchip serve --grpc-api trtllm`; `doppelchip trtllm-serve MODEL --grpc`) serves on its
gRPC port in place of vLLM's engine service, so the smg gateway in gRPC mode detects and fronts
it as a TensorRT-LLM worker (docs/TRTLLM.md).

Thin, as `server/vllm_servicer.py`: convert (`server/trtllm_convert.py`), hand to the engine,
convert back; the shared rules (owned aborts, every request freed however it ends, the
tokenizer zip, KV events) are `server/engine_servicer.py`'s. What TensorRT-LLM's smg servicer
(`tensorrt_llm/grpc/smg/`, main at 8fe605e) answers, and so this one:
- `Generate`: streaming, a chunk per engine chunk that brings a sequence new tokens, and once
  the request has finished one `complete` per sequence with all its ids, in sequence order;
  not streaming, only the completes. A request the engine fails ends the RPC with INTERNAL, as
  an exception in the request manager does there;
- `HealthCheck`: `status` "OK" while the deployment is ready (smg reads "ok", any case, as
  healthy), else the executor's words: "Executor is not available" while it compiles or the
  server drains, "Executor is unhealthy" once it failed;
- `Abort` {request_id}: `success` and "Request X aborted" / "not found";
- `GetModelInfo`: model_id (the served name), max_input_len, max_seq_len, vocab_size;
- `GetServerInfo`: version, backend "tensorrt-llm", the parallel sizes;
- `Embed`: UNIMPLEMENTED "Embed RPC not yet implemented", as there.
Errors: INVALID_ARGUMENT (HTTP 400 through smg), RESOURCE_EXHAUSTED (429), ALREADY_EXISTS (an
id in flight), UNAVAILABLE (503: draining, an engine down), INTERNAL (the engine failed).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator, Sequence

import grpc
from smg_grpc_proto import trtllm_service_pb2 as tpb

from server import trtllm_convert as tc
from server import wire
from server.engine.interface import DeploymentState, FinishReason
from server.engine_servicer import EngineServicer
from server.frontend import parallel
from server.frontend.deployment import DeploymentClient
from server.frontend.logprobs import Logprobs
from server.frontend.outputs import Output
from server.frontend.stream import StreamFailed
from server.wire import Undecodable

log = logging.getLogger("doppelchip.trtllm")

TRTLLM_SERVICE = tpb.DESCRIPTOR.services_by_name["TrtllmService"]
SERVICE_NAME = TRTLLM_SERVICE.full_name
# the release GetServerInfo names: the first llm-d's trtllm-serve guide requires (docs/TRTLLM.md)
TRTLLM_VERSION = "1.3.0rc12"
MAX_INPUT_LEN = 1024  # BaseLlmArgs.max_input_len's default, what GetModelInfo reports


class TrtllmServiceServicer(EngineServicer):
    def __init__(self, client: DeploymentClient, api_keys: Sequence[str] = ()) -> None:
        super().__init__(client, api_keys, log)

    async def Generate(self, request: tpb.GenerateRequest, context: grpc.aio.ServicerContext
                       ) -> AsyncIterator[tpb.GenerateResponse]:
        if type(request) is Undecodable:
            await wire.reject(request, context)
        rid = request.request_id or f"grpc-{uuid.uuid4().hex}"
        limits = (self.client.info.capacity.max_model_len, self.client.limits.max_logprobs)
        call = await self.open_call(context, rid,
                                    lambda: tc.to_engine_requests(request, rid, *limits))
        if call.streams is None:  # its Abort overtook it: cancelled at once, nothing ran
            yield tpb.GenerateResponse(request_id=rid, complete=tpb.GenerateComplete(
                finish_reason="cancelled",
                prompt_tokens=len(request.tokenized.input_token_ids)))
            wire.end_stream(context)
            return
        streams = call.streams
        oc = request.output_config
        k = oc.logprobs if oc.HasField("logprobs") else 0
        seqs = [Output(s, Logprobs(self.client.tokenizer, s.request.sampling.seed or 0)
                       if k > 0 else None) for s in streams]
        ended: dict[int, tpb.GenerateComplete] = {}
        try:  # from here on every way out frees what the engine holds
            await self.send_headers(context, rid)
            async for i, chunk in parallel.merged(streams):
                seq, finished = seqs[i], chunk.finish is not None
                tops = seq.add(chunk.token_ids, k)
                if finished and chunk.finish.reason is FinishReason.ERROR:
                    ended[i] = tpb.GenerateComplete()
                    await wire.abort(context, grpc.StatusCode.INTERNAL,
                                     f"Request {rid} failed: the engine failed")
                if finished:
                    seq.counts.cached_tokens = chunk.finish.usage.cached_prompt_tokens
                if request.streaming and chunk.token_ids:
                    yield tpb.GenerateResponse(request_id=rid, chunk=tc.to_chunk(
                        chunk.token_ids, seq.counts, i, tc.token_logprobs(tops)))
                if finished:
                    ended[i] = tc.to_complete(chunk, seq.ids, seq.counts, i,
                                              tc.token_logprobs(seq.tops))
            for i in sorted(ended):  # the request finished: its sequences' completes, in order
                yield tpb.GenerateResponse(request_id=rid, complete=ended[i])
            wire.end_stream(context)
        except StreamFailed as e:
            await wire.abort(context, grpc.StatusCode.UNAVAILABLE, str(e))
        finally:
            self.close_call(call, len(ended) == len(streams))

    async def Embed(self, request: tpb.EmbedRequest, context: grpc.aio.ServicerContext
                    ) -> tpb.EmbedResponse:
        await wire.abort(context, grpc.StatusCode.UNIMPLEMENTED, "Embed RPC not yet implemented")
        raise AssertionError("unreachable")  # wire.abort raises

    async def HealthCheck(self, request: tpb.HealthCheckRequest,
                          context: grpc.aio.ServicerContext) -> tpb.HealthCheckResponse:
        state = self.client.status().state
        if self.draining or state is not DeploymentState.READY:
            failed = state is DeploymentState.FAILED and not self.draining
            return tpb.HealthCheckResponse(
                status="Executor is unhealthy" if failed else "Executor is not available")
        return tpb.HealthCheckResponse(status="OK")

    async def Abort(self, request: tpb.AbortRequest, context: grpc.aio.ServicerContext
                    ) -> tpb.AbortResponse:
        """Owned, as VllmEngine's (`EngineServicer.abort_owned`): anyone else's Abort answers
        `success: false`, "not found", and ends nothing."""
        return tpb.AbortResponse(**self.abort_reply(context, request.request_id))

    async def GetModelInfo(self, request: tpb.GetModelInfoRequest,
                           context: grpc.aio.ServicerContext) -> tpb.GetModelInfoResponse:
        info, max_seq_len = self.client.info, self.client.info.capacity.max_model_len
        return tpb.GetModelInfoResponse(
            model_id=info.model_name, max_input_len=min(MAX_INPUT_LEN, max_seq_len),
            max_seq_len=max_seq_len, vocab_size=self.client.tokenizer.vocab_size)

    async def GetServerInfo(self, request: tpb.GetServerInfoRequest,
                            context: grpc.aio.ServicerContext) -> tpb.GetServerInfoResponse:
        info = self.client.info
        tp, pp = info.tensor_parallel, info.pipeline_parallel
        return tpb.GetServerInfoResponse(
            version=TRTLLM_VERSION, backend="tensorrt-llm", tensor_parallel_size=tp,
            pipeline_parallel_size=pp, context_parallel_size=1, world_size=tp * pp)
