"""Every status a client of the server may see, as the code documents it, in one place.

The fault-tolerance tests assert that nothing else ever comes back. Sources:
- `proto/doppelchip/v1/inference.proto` (its header): doppelchip.v1.Inference;
- `server/frontend/request_ids.py`: ALREADY_EXISTS / 409 for an id in flight;
- `server/vllm_servicer.py` (its docstring): vllm.grpc.engine.VllmEngine; the methods it does
  not serve (profiling, KV events when off) are UNIMPLEMENTED, as any gRPC server answers them;
- `server/sglang_servicer.py` (its docstring): sglang.grpc.scheduler.SglangScheduler on an
  SGLang pod; INTERNAL only for a request the engine failed, UNIMPLEMENTED for the LoRA and
  profiling methods it does not serve;
- `server/trtllm_servicer.py` (its docstring): trtllm.TrtllmService on a TensorRT-LLM pod;
  INTERNAL only for a request the engine failed, UNIMPLEMENTED for Embed (as TensorRT-LLM's)
  and for KV events when off;
- `server/mlx_servicer.py` (its docstring): mlx.grpc.engine.MlxEngine on an MLX pod
  (`--grpc-api mlx`); INTERNAL only for a request the engine failed;
- `server/http/errors.py` and `server/http/app.py`: the HTTP API (vLLM's error shape); 501
  is the Responses API's `json_object` (`server/http/responses.py`: vLLM's NotImplementedError);
- grpc itself: a message above the server's receive limit is RESOURCE_EXHAUSTED.

`HEALTHY` narrows them to what a server that is serving (not draining, no engine down, every
deployment placed) may answer: there, UNAVAILABLE, FAILED_PRECONDITION, 500 and 503 are
failures too. CANCELLED and DEADLINE_EXCEEDED are the client's own doing and are allowed only
for a call the client cancelled or gave a deadline.
"""

from __future__ import annotations

from grpc import StatusCode as C

INFERENCE = frozenset({C.OK, C.NOT_FOUND, C.INVALID_ARGUMENT, C.RESOURCE_EXHAUSTED,
                       C.FAILED_PRECONDITION, C.UNAVAILABLE, C.DEADLINE_EXCEEDED, C.CANCELLED,
                       C.ALREADY_EXISTS})
VLLM_ENGINE = frozenset({C.OK, C.INVALID_ARGUMENT, C.RESOURCE_EXHAUSTED, C.UNAVAILABLE,
                         C.ALREADY_EXISTS, C.UNIMPLEMENTED, C.DEADLINE_EXCEEDED, C.CANCELLED})
SGLANG_SCHEDULER = frozenset({C.OK, C.INVALID_ARGUMENT, C.RESOURCE_EXHAUSTED, C.UNAVAILABLE,
                              C.ALREADY_EXISTS, C.UNIMPLEMENTED, C.INTERNAL,
                              C.DEADLINE_EXCEEDED, C.CANCELLED})
TRTLLM_SERVICE = frozenset({C.OK, C.INVALID_ARGUMENT, C.RESOURCE_EXHAUSTED, C.UNAVAILABLE,
                            C.ALREADY_EXISTS, C.UNIMPLEMENTED, C.INTERNAL,
                            C.DEADLINE_EXCEEDED, C.CANCELLED})
MLX_ENGINE = frozenset({C.OK, C.INVALID_ARGUMENT, C.RESOURCE_EXHAUSTED, C.UNAVAILABLE,
                        C.ALREADY_EXISTS, C.INTERNAL, C.DEADLINE_EXCEEDED, C.CANCELLED})
HTTP = frozenset({200, 400, 404, 405, 409, 429, 500, 501, 503})

HEALTHY_GRPC = frozenset({C.OK, C.NOT_FOUND, C.INVALID_ARGUMENT, C.RESOURCE_EXHAUSTED,
                          C.ALREADY_EXISTS, C.UNIMPLEMENTED})
HEALTHY_HTTP = frozenset({200, 400, 404, 405, 409, 429, 501})
CLIENT_ENDED = {"cancel": C.CANCELLED, "deadline": C.DEADLINE_EXCEEDED}


def allowed_grpc(service: frozenset, action: str) -> frozenset:
    """What a gRPC call of `service` may end in on a healthy server, given what the client
    did (`read` all, `cancel` after a chunk, `deadline` short)."""
    ok = service & HEALTHY_GRPC
    if action in CLIENT_ENDED:
        ok |= {CLIENT_ENDED[action]}
    return ok


def allowed_http() -> frozenset:
    return HTTP & HEALTHY_HTTP
