"""vLLM engine wire (`vllm.grpc.engine`, from smg-grpc-proto) <-> engine conversions.

Pure functions, as `server/convert.py` is for doppelchip's own API. The shapes follow what
vLLM's gRPC servicer sends (smg-grpc-servicer), which is what the smg gateway reads:
- streaming: one `chunk` per engine chunk (delta token ids; `completion_tokens` is the delta
  count, the gateway accumulates), and when the request finishes a `complete` carrying the
  last delta, the finish reason, the matched stop and the prompt / cached token counts;
- not streaming: one `complete` with every output token id;
- n > 1: each message names its sequence (`index`), each sequence ends with its own complete.
Proto3 leaves "unset" as zero for most sampling fields; zero means the vLLM default here as in
vLLM's servicer (top_p 0 -> 1, top_k 0 -> off, repetition_penalty 0 -> 1).
"""

from __future__ import annotations

from collections.abc import Sequence

from smg_grpc_proto import vllm_engine_pb2 as vpb

from server.engine.errors import InvalidRequest
from server.engine.interface import (
    JSON_OBJECT,
    Constraint,
    DeploymentStatus,
    EngineRequest,
    SamplingParams,
    TokenChunk,
)
from server.engine.tokenizer import ARCHITECTURES, MODEL_TYPE


def to_sampling(sp: vpb.SamplingParams) -> SamplingParams:
    """The engine's sampling options; raises InvalidRequest for what the engine cannot do."""
    if sp.logit_bias:
        raise InvalidRequest("logit_bias is not supported")
    options = SamplingParams(
        max_tokens=sp.max_tokens if sp.HasField("max_tokens") else None,
        min_tokens=sp.min_tokens,
        temperature=sp.temperature if sp.HasField("temperature") else 1.0,
        top_p=sp.top_p if sp.top_p != 0.0 else 1.0,
        top_k=sp.top_k if sp.top_k > 0 else -1,
        min_p=sp.min_p,
        repetition_penalty=sp.repetition_penalty if sp.repetition_penalty != 0.0 else 1.0,
        presence_penalty=sp.presence_penalty,
        frequency_penalty=sp.frequency_penalty,
        seed=sp.seed if sp.HasField("seed") else None,
        ignore_eos=sp.ignore_eos,
        stop=tuple(sp.stop),
        stop_token_ids=tuple(sp.stop_token_ids),
        include_stop_str_in_output=sp.include_stop_str_in_output,
        skip_special_tokens=sp.skip_special_tokens,
    )
    options.validate()
    return options


def to_constraint(sp: vpb.SamplingParams) -> Constraint | None:
    kind = sp.WhichOneof("constraint")
    if kind is None:
        return None
    if kind == "choice":
        return Constraint("choice", choices=tuple(sp.choice.choices))
    if kind == "json_object":
        return Constraint("json_schema", text=JSON_OBJECT) if sp.json_object else None
    if kind == "structural_tag":
        raise InvalidRequest("structural_tag constraints are not supported")
    return Constraint(kind, text=getattr(sp, kind))  # json_schema, regex, grammar


def to_engine_request(req: vpb.GenerateRequest, request_id: str) -> EngineRequest:
    """The engine's view of a vLLM GenerateRequest; raises InvalidRequest saying what is wrong."""
    if req.HasField("mm_inputs") or req.extra_mm_inputs or req.HasField("media_refs"):
        raise InvalidRequest("multimodal inputs are not supported (text-only model)")
    which = req.WhichOneof("input")
    if which is None:
        raise InvalidRequest("input is missing: set tokenized or text")
    sp = req.sampling_params
    rank = req.data_parallel_rank if req.HasField("data_parallel_rank") else None
    if which == "text":
        if not req.text:
            raise InvalidRequest("prompt is empty")
        return EngineRequest(request_id=request_id, prompt_text=req.text,
                             sampling=to_sampling(sp), constraint=to_constraint(sp),
                             data_parallel_rank=rank)
    ids = tuple(req.tokenized.input_ids)
    if sp.HasField("truncate_prompt_tokens") and sp.truncate_prompt_tokens > 0:
        ids = ids[-sp.truncate_prompt_tokens :]
    if not ids:
        raise InvalidRequest("prompt is empty (no input_ids)")
    return EngineRequest(request_id=request_id, prompt_token_ids=ids,
                         sampling=to_sampling(sp), constraint=to_constraint(sp),
                         data_parallel_rank=rank)


def to_chunk(chunk: TokenChunk, prompt_tokens: int, cached: int, index: int = 0
             ) -> vpb.GenerateResponse:
    """A streamed chunk of sequence `index` (of a request's n)."""
    return vpb.GenerateResponse(chunk=vpb.GenerateStreamChunk(
        token_ids=chunk.token_ids, prompt_tokens=prompt_tokens,
        completion_tokens=len(chunk.token_ids), cached_tokens=cached, index=index,
    ))


def to_complete(chunk: TokenChunk, output_ids: Sequence[int], index: int = 0
                ) -> vpb.GenerateResponse:
    """The `complete` message of a finished sequence `index`: `output_ids` are the last delta
    when streaming, every output token otherwise."""
    f = chunk.finish
    assert f is not None
    msg = vpb.GenerateComplete(
        output_ids=output_ids, finish_reason=f.reason.value,
        prompt_tokens=f.usage.prompt_tokens, completion_tokens=len(output_ids),
        cached_tokens=f.usage.cached_prompt_tokens, index=index,
    )
    if (spec := f.spec_decode_metrics) is not None:  # --per-request-spec-decode-metrics
        msg.spec_accepted_tokens = spec.num_accepted_draft_tokens
        msg.spec_draft_tokens = spec.num_draft_tokens
    if f.stop_str is not None:
        msg.matched_stop_str = f.stop_str
    elif f.stop_token_id is not None:
        msg.matched_token_id = f.stop_token_id
    return vpb.GenerateResponse(complete=msg)


def to_model_info(status: DeploymentStatus, served_name: str, model_path: str, eos: int,
                  bos: int, pad: int, vocab_size: int,
                  is_generation: bool = True) -> vpb.GetModelInfoResponse:
    """`model_path` is what vLLM's --model named (`vllm serve REPO`), else the catalogue id;
    `is_generation` false for an embedding model (a router then sends it embeddings)."""
    c = status.capacity
    return vpb.GetModelInfoResponse(
        model_path=model_path or status.model, served_model_name=served_name, tokenizer_path="",
        is_generation=is_generation, max_context_length=c.max_model_len,
        max_req_input_len=c.max_model_len,
        vocab_size=vocab_size, supports_vision=False, model_type=MODEL_TYPE,
        architectures=ARCHITECTURES, eos_token_ids=[eos], bos_token_id=bos,
        pad_token_id=pad,
    )

