"""`VllmEngine.Embed`: what smg calls for `/v1/embeddings` on a vLLM gRPC worker
(smg-grpc-servicer 0.14.1's vLLM servicer: `PoolingParams(task="embed")` on the tokenized
input, the final output's vector). Here the tokenized prompt is pooled on the deployment — a
request that ends with its prefill (docs/EMBEDDINGS.md) — and answered with its emulated
vector (`server/frontend/pooled.py`): whole and normalised.

Statuses: INVALID_ARGUMENT for no `tokenized` input, a bad id, or a generative model ("This
model does not support pooling", vLLM's words); the engine's admission refusals as
`Generate`'s; UNAVAILABLE for a request aborted before its prefill ended (a drain, a pause) or
an engine gone. A call that ends early (cancelled, deadline) frees the request at once.
"""

from __future__ import annotations

import logging
import uuid

import grpc
from smg_grpc_proto import vllm_engine_pb2 as vpb

from server import convert, wire
from server.engine.errors import EngineError
from server.engine.interface import EngineRequest, FinishReason, PoolingParams
from server.engine.logs import request_log
from server.frontend import parallel, request_ids
from server.frontend.deployment import DeploymentClient
from server.frontend.pooled import prompt_vector
from server.frontend.stream import StreamFailed

log = logging.getLogger("doppelchip.vllm")


async def embed(client: DeploymentClient, request: vpb.EmbedRequest,
                context: grpc.aio.ServicerContext) -> vpb.EmbedResponse:
    rid = request.request_id or f"embd-{uuid.uuid4().hex}"
    if not request.HasField("tokenized"):
        await wire.abort(context, grpc.StatusCode.INVALID_ARGUMENT,
                         "EmbedRequest requires tokenized input")
    ids, params = tuple(request.tokenized.input_ids), PoolingParams()
    try:
        request_ids.check(rid)
        (stream,) = await parallel.submit_all(client, [EngineRequest(
            request_id=rid, prompt_token_ids=ids, pooling=params)], rid)
    except EngineError as e:
        request_log(log, rid).info("rejected: %s", e)
        await wire.abort(context, convert.status_code(e), str(e))
    finish = None
    try:
        async for chunk in stream.outputs():
            finish = chunk.finish or finish
    except StreamFailed as e:
        await wire.abort(context, grpc.StatusCode.UNAVAILABLE, str(e))
    finally:
        if finish is None:  # cancelled or failed: free it at once
            client.abort(stream)
    if finish.reason is not FinishReason.STOP:  # aborted (a drain, a pause) or failed
        await wire.abort(context, grpc.StatusCode.UNAVAILABLE, f"Embed request {rid} did not "
                         f"produce a result ({finish.reason.value})")
    vector = prompt_vector(ids, client.limits.embedding_size, params,
                           client.tokenizer.special_token_ids)
    return vpb.EmbedResponse(embedding=vector.tolist(), prompt_tokens=len(ids),
                             embedding_dim=len(vector))
