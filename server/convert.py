"""Wire <-> engine conversions. Pure functions; the servicer stays thin."""

from __future__ import annotations

import grpc

from doppelchip.v1 import inference_pb2 as pb
from server.engine.errors import (
    AlreadyExists,
    EngineError,
    InvalidRequest,
    NotPlaced,
    Overloaded,
    Unavailable,
)
from server.engine.interface import (
    Constraint,
    DeploymentState,
    DeploymentStatus,
    EngineRequest,
    FinishReason,
    SamplingParams,
    TokenChunk,
)
from server.frontend.faults import InjectedFailure
from server.frontend.parallel import MAX_N

_STATUS: dict[type[EngineError], grpc.StatusCode] = {
    InvalidRequest: grpc.StatusCode.INVALID_ARGUMENT,
    AlreadyExists: grpc.StatusCode.ALREADY_EXISTS,
    Overloaded: grpc.StatusCode.RESOURCE_EXHAUSTED,
    Unavailable: grpc.StatusCode.UNAVAILABLE,
    NotPlaced: grpc.StatusCode.FAILED_PRECONDITION,
}

_FINISH = {
    FinishReason.STOP: pb.FINISH_REASON_STOP,
    FinishReason.LENGTH: pb.FINISH_REASON_LENGTH,
    FinishReason.ABORT: pb.FINISH_REASON_ABORT,
    FinishReason.ERROR: pb.FINISH_REASON_ERROR,
}

_STATE = {
    DeploymentState.COMPILING: pb.DEPLOYMENT_STATE_COMPILING,
    DeploymentState.READY: pb.DEPLOYMENT_STATE_READY,
    DeploymentState.FAILED: pb.DEPLOYMENT_STATE_FAILED,
    DeploymentState.DRAINING: pb.DEPLOYMENT_STATE_DRAINING,
}


def status_code(error: EngineError) -> grpc.StatusCode:
    if isinstance(error, InjectedFailure):  # failure injection (issue 13)
        return grpc.StatusCode[error.kind.grpc]
    for cls, code in _STATUS.items():
        if isinstance(error, cls):
            return code
    return grpc.StatusCode.INTERNAL


def num_sequences(req: pb.GenerateRequest) -> int:
    """`SamplingParams.n` (1 when unset); InvalidRequest outside [1, MAX_N]."""
    sp = req.sampling
    n = sp.n if sp.HasField("n") else 1
    if not 1 <= n <= MAX_N:
        raise InvalidRequest(f"n must be in [1, {MAX_N}], got {n}")
    return n


def _sampling(sp: pb.SamplingParams) -> SamplingParams:
    if sp.HasField("logprobs") and sp.logprobs != 0:
        raise InvalidRequest(f"logprobs={sp.logprobs} is not supported")
    defaults = SamplingParams()

    def opt(name: str):  # the field's value if the client set it, else our default
        return getattr(sp, name) if sp.HasField(name) else getattr(defaults, name)

    options = SamplingParams(
        max_tokens=sp.max_tokens if sp.HasField("max_tokens") else None,
        min_tokens=opt("min_tokens"),
        temperature=opt("temperature"),
        top_p=opt("top_p"),
        top_k=opt("top_k"),
        min_p=opt("min_p"),
        repetition_penalty=opt("repetition_penalty"),
        presence_penalty=opt("presence_penalty"),
        frequency_penalty=opt("frequency_penalty"),
        seed=sp.seed if sp.HasField("seed") else None,
        ignore_eos=sp.ignore_eos,
        stop=tuple(sp.stop),
        stop_token_ids=tuple(sp.stop_token_ids),
        include_stop_str_in_output=sp.include_stop_str_in_output,
        skip_special_tokens=sp.skip_special_tokens,
    )
    options.validate()
    return options


def to_engine_request(req: pb.GenerateRequest, request_id: str) -> EngineRequest:
    """The engine's view of a GenerateRequest; raises InvalidRequest saying what is wrong."""
    which = req.WhichOneof("prompt")
    if which is None:
        raise InvalidRequest("prompt is missing: set text or token_ids")
    if which == "text" and not req.text:
        raise InvalidRequest("prompt is empty")
    if which == "token_ids" and not req.token_ids.ids:
        raise InvalidRequest("prompt is empty (no token ids)")
    return EngineRequest(
        request_id=request_id,
        prompt_text=req.text if which == "text" else None,
        prompt_token_ids=tuple(req.token_ids.ids) if which == "token_ids" else None,
        sampling=_sampling(req.sampling),
        priority=req.priority,
        return_token_times=req.return_token_times,
        return_prompt_token_ids=req.return_prompt_token_ids,
        constraint=_constraint(req.constraint) if req.HasField("constraint") else None,
    )


def _constraint(c: pb.Constraint) -> Constraint | None:
    """The engine's view of the constraint slot (None when no kind is set)."""
    kind = c.WhichOneof("kind")
    if kind is None:
        return None
    if kind == "choice":
        return Constraint("choice", choices=tuple(c.choice.choices))
    return Constraint(kind, text=getattr(c, kind))


def to_response(chunk: TokenChunk, request_id: str, deployment: str) -> pb.GenerateResponse:
    msg = pb.GenerateResponse(request_id=request_id, token_ids=chunk.token_ids, text=chunk.text,
                              index=chunk.index)
    if chunk.token_times:  # only the fields a chunk has: an empty field still costs
        msg.token_times.extend(chunk.token_times)
    if chunk.prompt_token_ids:
        msg.prompt_token_ids.extend(chunk.prompt_token_ids)
    f = chunk.finish
    if f is not None:
        u, t = f.usage, f.timings
        msg.final.CopyFrom(
            pb.Final(
                finish_reason=_FINISH[f.reason],
                usage=pb.Usage(
                    prompt_tokens=u.prompt_tokens,
                    cached_prompt_tokens=u.cached_prompt_tokens,
                    completion_tokens=u.completion_tokens,
                    jump_forward_tokens=u.jump_forward_tokens,
                ),
                timings=pb.Timings(
                    queue_s=t.queue_s, prefill_s=t.prefill_s, ttft_s=t.ttft_s,
                    decode_s=t.decode_s, e2e_s=t.e2e_s, delivery_lag_s=t.delivery_lag_s,
                ),
                deployment=deployment,
            )
        )
        if f.stop_str is not None:
            msg.final.stop_str = f.stop_str
        elif f.stop_token_id is not None:
            msg.final.stop_token_id = f.stop_token_id
    return msg


def to_deployment(s: DeploymentStatus, is_default: bool) -> pb.Deployment:
    c = s.capacity
    return pb.Deployment(
        name=s.name, model=s.model, quant=s.quant, engine=s.engine,
        device=pb.Device(
            chip=s.chip, count=s.chip_count, tensor_parallel=s.tensor_parallel,
            pipeline_parallel=s.pipeline_parallel,
        ),
        state=_STATE[s.state],
        state_message=s.state_message,
        capacity=pb.Capacity(
            kv_blocks_total=c.kv_blocks_total, kv_blocks_free=c.kv_blocks_free,
            block_size=c.block_size, max_model_len=c.max_model_len,
            max_num_seqs=c.max_num_seqs, max_concurrency=c.max_concurrency,
            max_waiting=c.max_waiting,
        ),
        load=pb.Load(num_running=s.num_running, num_waiting=s.num_waiting),
        is_default=is_default,
        adapters=[pb.LoraAdapter(name=a.name, id=a.id, path=a.path,  # LoRA (issue 13)
                                 base_model_name=a.base_model_name, rank=a.rank)
                  for a in s.adapters],
    )
