"""MLX's gRPC service (`mlx.grpc.engine.MlxEngine`), what an MLX pod (`doppelchip serve
--grpc-api mlx`, e.g. `--deployment mlx-m4max`) serves on its gRPC port in place of vLLM's
engine service, so the smg gateway in gRPC mode detects and fronts it as an `mlx` worker
(docs/MLX.md).

Thin, as `server/trtllm_servicer.py`: convert (`server/mlx_convert.py`), hand to the engine,
convert back; the shared rules (owned aborts, every request freed however it ends, the
tokenizer zip) are `server/engine_servicer.py`'s. What smg's own MLX servicer
(`smg_grpc_servicer/mlx/`, smg-grpc-servicer 0.14.1) answers, and so this one:
- `Generate`: streaming, a chunk per engine chunk that brings new tokens (each with its
  logprobs when asked), then one `complete` with no ids; not streaming, only the complete with
  all the ids and logprobs. An aborted request ends the stream with no complete, and an
  Abort that came before its Generate ends that Generate at once with nothing. A request the
  engine fails ends the RPC with INTERNAL, as an exception in Generate does there;
- `HealthCheck`: `healthy` and "OK" while the deployment is ready; else not healthy, in the
  servicer's words: "generation loop not started" while it loads, "generation thread exited"
  once it failed, "servicer shutting down" while the pod drains;
- `Abort` {request_ids}: each id ended if the caller owns it (`EngineServicer.abort_owned`);
  the answer is empty, as there;
- `GetModelInfo`: model_path, served_model_name, model_type, architectures, the context
  (max_context_length and max_req_input_len), vocab, EOS/BOS/PAD ids;
- `GetServerInfo`: server_type "mlx-grpc", the requests in flight, uptime;
- `GetTokenizer`: the shared tokenizer zip.
Errors: INVALID_ARGUMENT (HTTP 400 through smg), RESOURCE_EXHAUSTED (a full queue),
ALREADY_EXISTS (an id in flight), UNAVAILABLE (draining, an engine down), INTERNAL (the engine
failed).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator, Sequence

import grpc
from smg_grpc_proto import mlx_engine_pb2 as mpb

from server import mlx_convert as mc
from server import wire
from server.engine.interface import DeploymentState, FinishReason
from server.engine.tokenizer import ARCHITECTURES, MODEL_TYPE
from server.engine_servicer import EngineServicer
from server.frontend.deployment import DeploymentClient
from server.frontend.logprobs import Logprobs
from server.frontend.outputs import Output
from server.frontend.stream import StreamFailed
from server.wire import Undecodable

log = logging.getLogger("doppelchip.mlx")

MLX_SERVICE = mpb.DESCRIPTOR.services_by_name["MlxEngine"]
SERVICE_NAME = MLX_SERVICE.full_name
SERVER_TYPE = "mlx-grpc"


class MlxEngineServicer(EngineServicer):
    def __init__(self, client: DeploymentClient, api_keys: Sequence[str] = ()) -> None:
        super().__init__(client, api_keys, log)
        self.active = 0  # Generates admitted and not yet ended (GetServerInfo)

    async def Generate(self, request: mpb.GenerateRequest, context: grpc.aio.ServicerContext
                       ) -> AsyncIterator[mpb.GenerateResponse]:
        if type(request) is Undecodable:
            await wire.reject(request, context)
        rid = request.request_id or f"grpc-{uuid.uuid4().hex}"
        limits = (self.client.info.capacity.max_model_len, self.client.limits.max_logprobs)
        call = await self.open_call(context, rid,
                                    lambda: [mc.to_engine_request(request, rid, *limits)])
        if call.streams is None:  # its Abort overtook it: ended at once, nothing ran
            wire.end_stream(context)
            return
        (stream,) = call.streams
        k = mc.logprobs_asked(request.sampling_params)
        seq = Output(stream, Logprobs(self.client.tokenizer, stream.request.sampling.seed or 0)
                     if k > 0 else None)
        eos = self.client.tokenizer.eos_token_id
        finished = False
        self.active += 1
        try:  # from here on every way out frees what the engine holds
            await self.send_headers(context, rid)
            async for chunk in stream.outputs():
                tops = seq.add(chunk.token_ids, k)
                if request.stream and chunk.token_ids:
                    yield mc.to_chunk(chunk.token_ids, seq.counts,
                                      mc.output_logprobs(chunk.token_ids, tops))
                if chunk.finish is None:
                    continue
                finished = True
                if chunk.finish.reason is FinishReason.ERROR:
                    await wire.abort(context, grpc.StatusCode.INTERNAL,
                                     f"Request {rid} failed: the engine failed")
                if chunk.finish.reason is not FinishReason.ABORT:  # aborted: no complete
                    ids = [] if request.stream else seq.ids
                    lps = None if request.stream else mc.output_logprobs(seq.ids, seq.tops)
                    yield mc.to_complete(chunk, ids, seq.counts, eos, lps)
                break
            wire.end_stream(context)
        except StreamFailed as e:
            await wire.abort(context, grpc.StatusCode.UNAVAILABLE, str(e))
        finally:
            self.active -= 1
            self.close_call(call, finished)

    async def HealthCheck(self, request: mpb.HealthCheckRequest,
                          context: grpc.aio.ServicerContext) -> mpb.HealthCheckResponse:
        if self.draining:
            return mpb.HealthCheckResponse(healthy=False, message="servicer shutting down")
        state = self.client.status().state
        if state is DeploymentState.FAILED:
            return mpb.HealthCheckResponse(healthy=False, message="generation thread exited")
        if state is not DeploymentState.READY:
            return mpb.HealthCheckResponse(healthy=False,
                                           message="generation loop not started")
        return mpb.HealthCheckResponse(healthy=True, message="OK")

    async def Abort(self, request: mpb.AbortRequest, context: grpc.aio.ServicerContext
                    ) -> mpb.AbortResponse:
        """Owned, as VllmEngine's (`EngineServicer.abort_owned`): anyone else's ids end
        nothing; the answer is empty either way, as there."""
        for rid in request.request_ids:
            self.abort_owned(context, rid)
        return mpb.AbortResponse()

    async def GetModelInfo(self, request: mpb.GetModelInfoRequest,
                           context: grpc.aio.ServicerContext) -> mpb.GetModelInfoResponse:
        info, tok = self.client.info, self.client.tokenizer
        context_len = info.capacity.max_model_len
        return mpb.GetModelInfoResponse(
            model_path=info.model_path or info.model_name, is_generation=True,
            max_context_length=context_len, vocab_size=tok.vocab_size,
            served_model_name=info.model_name, model_type=MODEL_TYPE,
            architectures=ARCHITECTURES, eos_token_ids=[tok.eos_token_id],
            pad_token_id=tok.pad_token_id or 0, bos_token_id=tok.bos_token_id or 0,
            max_req_input_len=context_len)

    async def GetServerInfo(self, request: mpb.GetServerInfoRequest,
                            context: grpc.aio.ServicerContext) -> mpb.GetServerInfoResponse:
        return mpb.GetServerInfoResponse(server_type=SERVER_TYPE, active_requests=self.active,
                                         uptime_seconds=time.time() - self.started)
