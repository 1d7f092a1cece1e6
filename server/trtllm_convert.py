"""TensorRT-LLM's gRPC wire (`trtllm.TrtllmService`, from smg-grpc-proto) <-> engine conversions.

Pure functions, as `server/vllm_convert.py` and `server/sglang_convert.py` are for the others.
The shapes follow TensorRT-LLM's smg servicer (`tensorrt_llm/grpc/smg/servicer.py` and
`request_manager.py`, main at 8fe605e / 3c68ae6; docs/TRTLLM.md), which is what the smg gateway
reads:
- the input is `tokenized` only ("Missing tokenized input");
- sampling (`create_sampling_params_from_proto`): unset temperature and top_p are 1.0, unset
  repetition_penalty 1.0; top_k 0 is "all tokens" (TensorRT-LLM's runtime default) and so is
  unset; `num_return_sequences` is n (0: 1); `beam_width` > 1 is beam search, refused here (not
  emulated); greedy decoding (top_k unset or 1 and top_p 0) with n > 1 is refused in the LLM
  API's words;
- length: a prompt that leaves no room for an output token is refused ("Prompt length (P)
  exceeds maximum input length (M)."); `max_tokens` past `max_seq_len` is clipped to what is
  left, as the runtime does (it logs and changes the request, it does not refuse); 0 (unset)
  is refused: `max_tokens` must be > 0;
- streaming: one chunk per engine chunk with the new ids (`sequence_index` for one of n) and
  the cumulative prompt, completion and cached counts; when the request has finished, one
  `complete` per sequence carrying *all* its output ids, streaming or not;
- `finish_reason` is "stop", "length" or "cancelled" (TensorRT-LLM's CompletionOutput); a stop
  token id or stop string that matched is `matched_token_id` / `matched_stop_str`, and the
  end-of-sequence token is a stop with no match (its FinishReason.END_ID);
- logprobs: `output_config.logprobs` k >= 1 gives each token its logprob and the k most likely
  tokens (the generated one among them); 0 or unset, none.
"""

from __future__ import annotations

from collections.abc import Sequence

from smg_grpc_proto import trtllm_service_pb2 as tpb

from server.engine.errors import InvalidRequest
from server.engine.interface import (
    JSON_OBJECT,
    Constraint,
    EngineRequest,
    SamplingParams,
    TokenChunk,
)
from server.frontend.logprobs import too_many
from server.frontend.outputs import Counts, finish_fields
from server.frontend.parallel import MAX_N, child_requests

GUIDES = {tpb.GuidedDecodingParams.GUIDE_TYPE_JSON: "json_object",
          tpb.GuidedDecodingParams.GUIDE_TYPE_JSON_SCHEMA: "json_schema",
          tpb.GuidedDecodingParams.GUIDE_TYPE_REGEX: "regex",
          tpb.GuidedDecodingParams.GUIDE_TYPE_EBNF_GRAMMAR: "grammar"}


def _constraint(req: tpb.GenerateRequest) -> Constraint | None:
    """`guided_decoding` as the engine's constraint; none without a guide (as TensorRT-LLM,
    which ignores a guide type with an empty guide)."""
    if not req.HasField("guided_decoding") or not req.guided_decoding.guide:
        return None
    g = req.guided_decoding
    if g.guide_type == tpb.GuidedDecodingParams.GUIDE_TYPE_STRUCTURAL_TAG:
        raise InvalidRequest("structural_tag guided decoding is not supported")
    if g.guide_type not in GUIDES:
        return None  # GUIDE_TYPE_UNSPECIFIED: no constraint, as TensorRT-LLM
    kind = GUIDES[g.guide_type]
    if kind == "json_object":  # any JSON object (TensorRT-LLM's json_object=True)
        return Constraint("json_schema", text=JSON_OBJECT)
    return Constraint(kind, text=g.guide)  # type: ignore[arg-type]  # json_schema, regex, grammar


def _refuse_unserved(req: tpb.GenerateRequest) -> None:
    """What the request asks that a doppelchip pod does not emulate: INVALID_ARGUMENT."""
    sc, oc = req.sampling_config, req.output_config
    if sc.beam_width > 1 or len(sc.beam_width_array):
        raise InvalidRequest("beam search (beam_width > 1) is not emulated")
    if req.HasField("multimodal_input") and len(req.multimodal_input.image_data):
        raise InvalidRequest("multimodal inputs are not supported (text-only model)")
    if req.HasField("lora_config") and req.lora_config.task_id:
        raise InvalidRequest(f"lora_config task_id {req.lora_config.task_id}: LoRA adapters are "
                             "not served on a TensorRT-LLM pod")
    if req.HasField("disaggregated_params"):
        raise InvalidRequest("disaggregated_params: TensorRT-LLM's disaggregated serving is "
                             "not emulated")
    if req.HasField("prompt_tuning_config") or req.HasField("lookahead_config"):
        raise InvalidRequest("prompt tuning and lookahead decoding are not emulated")
    if len(req.embedding_bias) or len(req.bad) or len(req.bad_token_ids):
        raise InvalidRequest("embedding_bias and bad words are not emulated")
    if oc.HasField("prompt_logprobs") and oc.prompt_logprobs > 0:
        raise InvalidRequest("prompt_logprobs are not served (output logprobs only)")
    if oc.return_context_logits or oc.return_generation_logits or oc.return_encoder_output:
        raise InvalidRequest("logits and encoder outputs are not returned (the emulated model "
                             "has none)")


def max_new_tokens(asked: int, prompt_len: int, max_seq_len: int) -> int:
    """The request's output budget: refused at 0 (unset) or when the prompt fills the
    sequence; clipped to what `max_seq_len` leaves, as TensorRT-LLM's runtime does."""
    if prompt_len > max_seq_len - 1:
        raise InvalidRequest(f"Prompt length ({prompt_len}) exceeds maximum input length "
                             f"({max_seq_len - 1}).")
    if asked <= 0:
        raise InvalidRequest(f"max_tokens must be > 0, got {asked}")
    return min(asked, max_seq_len - prompt_len)


def to_engine_requests(req: tpb.GenerateRequest, rid: str, max_seq_len: int,
                       max_logprobs: int) -> list[EngineRequest]:
    """The engine requests of one GenerateRequest (n of them for `num_return_sequences` > 1:
    children sharing the prompt, `server/frontend/parallel.py`); raises InvalidRequest saying
    what is wrong. `max_logprobs`: the deployment's `--max-logprobs`, which bounds
    `output_config.logprobs` as it bounds the pod's HTTP routes."""
    if not req.HasField("tokenized"):
        raise InvalidRequest("Missing tokenized input")
    _refuse_unserved(req)
    sc = req.sampling_config
    k = req.output_config.logprobs if req.output_config.HasField("logprobs") else 0
    if max_logprobs >= 0 and (refusal := too_many(k, max_logprobs)):
        raise InvalidRequest(refusal)
    n = sc.num_return_sequences or 1
    if n > MAX_N:
        raise InvalidRequest(f"n must be in [1, {MAX_N}], got {n}")
    top_k = sc.top_k if sc.HasField("top_k") else None
    top_p = sc.top_p if sc.HasField("top_p") else 1.0
    greedy = top_p == 0.0 and top_k in (None, 1)  # the LLM API's _greedy_decoding
    if n > 1 and greedy:
        raise InvalidRequest(
            f"Greedy decoding in the LLM API does not allow multiple returns. Please set to "
            f"best_of=1, got best_of={n}. Please set to best_of=1 or set an environment "
            f"variable TLLM_ALLOW_N_GREEDY_DECODING=1 to allow best_of > 1 under the greedy "
            f"decoding.")
    ids = tuple(req.tokenized.input_token_ids)
    if not ids:
        raise InvalidRequest("prompt is empty (no input_token_ids)")
    max_new = max_new_tokens(req.max_tokens, len(ids), max_seq_len)
    sampling = SamplingParams(
        max_tokens=max_new, min_tokens=min(sc.min_tokens, max_new),
        # greedy as the engine's temperature 0 (its top_p is in (0, 1])
        temperature=0.0 if greedy else sc.temperature if sc.HasField("temperature") else 1.0,
        top_p=top_p if top_p > 0 else 1.0, top_k=top_k if top_k else -1,
        min_p=sc.min_p,
        repetition_penalty=sc.repetition_penalty if sc.HasField("repetition_penalty") else 1.0,
        presence_penalty=sc.presence_penalty, frequency_penalty=sc.frequency_penalty,
        seed=sc.seed if sc.HasField("seed") else None, ignore_eos=req.ignore_eos,
        stop=tuple(req.stop), stop_token_ids=tuple(req.stop_token_ids),
        include_stop_str_in_output=req.include_stop_token_in_output)
    sampling.validate()
    request = EngineRequest(request_id=rid, prompt_token_ids=ids, sampling=sampling,
                            constraint=_constraint(req), stream=req.streaming)
    return child_requests(request, n)


def token_logprobs(tops: Sequence[list[tuple[int, float]]]) -> list[tpb.TokenLogprob]:
    """Each position's emulated top tokens (the generated one first: `server/frontend/
    logprobs.py`) as TokenLogprob: its own logprob and the whole top list."""
    return [tpb.TokenLogprob(token_id=top[0][0], logprob=top[0][1],
                             top_logprobs=[tpb.TopLogprob(token_id=t, logprob=v)
                                           for t, v in top])
            for top in tops]


def to_chunk(ids: Sequence[int], counts: Counts, index: int,
             logprobs: list[tpb.TokenLogprob]) -> tpb.GenerateStreamChunk:
    return tpb.GenerateStreamChunk(
        token_ids=ids, sequence_index=index, prompt_tokens=counts.prompt_tokens,
        completion_tokens=counts.completion_tokens, cached_tokens=counts.cached_tokens,
        logprobs=logprobs)


def to_complete(chunk: TokenChunk, ids: Sequence[int], counts: Counts, index: int,
                logprobs: list[tpb.TokenLogprob]) -> tpb.GenerateComplete:
    return tpb.GenerateComplete(
        output_token_ids=ids, sequence_index=index, prompt_tokens=counts.prompt_tokens,
        completion_tokens=counts.completion_tokens, cached_tokens=counts.cached_tokens,
        logprobs=logprobs, **finish_fields(chunk, None, "cancelled"))
