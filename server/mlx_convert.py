"""MLX's gRPC wire (`mlx.grpc.engine.MlxEngine`, from smg-grpc-proto) <-> engine conversions.

Pure functions, as `server/trtllm_convert.py` is for TensorRT-LLM's. The shapes follow smg's
own MLX servicer (`smg_grpc_servicer/mlx/servicer.py`, smg-grpc-servicer 0.14.1; docs/MLX.md),
which is what the smg gateway reads:
- the input is `tokenized` only: `text` (or none) is refused, INVALID_ARGUMENT "MLX servicer
  requires tokenized input";
- sampling (`_build_sampler`, `_build_logits_processors`): unset temperature is 1.0 (0 is
  greedy); top_p 0 and top_k 0 are "no cut" (mlx-lm's make_sampler applies neither); min_p 0
  none; repetition, frequency and presence penalties 0 are none (the proto's defaults);
  `seed` seeds the request's sampling;
- stops (`_build_state_machine`): each of `stop_token_ids`, and the end-of-sequence token
  unless `ignore_eos`, is a one-token stop sequence; the one that matched is
  `matched_stop_token_id`, EOS included;
- length: `max_tokens` unset is what the context leaves after the prompt (as there); set, it
  is taken as is there, so here 0 runs one token (mlx-lm's BatchGenerator finishes a request
  once its count reaches max_tokens, checked after each token);
- `finish_reason` is mlx-lm's: "stop" or "length"; an aborted request has no complete;
- logprobs: `logprobs` k >= 1 gives each token its logprob and the k most likely tokens,
  most likely first; 0, negative or unset, none.
What this pod adds, as the other engine services do (docs/MLX.md "Where doppelchip differs"):
a prompt that leaves no room in the context is refused, `max_tokens` past the context is
clipped to what it leaves, `logit_bias` is refused (not emulated), and k past the
deployment's `--max-logprobs` is refused.
"""

from __future__ import annotations

from collections.abc import Sequence

from smg_grpc_proto import mlx_engine_pb2 as mpb

from server.engine.errors import InvalidRequest
from server.engine.interface import EngineRequest, SamplingParams, TokenChunk
from server.frontend.logprobs import too_many
from server.frontend.outputs import Counts, finish_fields

NEEDS_TOKENS = "MLX servicer requires tokenized input"


def max_new_tokens(sp: mpb.SamplingParams, prompt_len: int, context: int) -> int:
    """The request's output budget: refused when the prompt fills the context; unset, what the
    context leaves; set, at least one token (0 runs one, as mlx-lm) and at most what is left."""
    left = context - prompt_len
    if left < 1:
        raise InvalidRequest(f"Prompt length ({prompt_len}) leaves no room for an output token "
                             f"in the context ({context} tokens)")
    if not sp.HasField("max_tokens"):
        return left
    return min(max(sp.max_tokens, 1), left)


def logprobs_asked(sp: mpb.SamplingParams) -> int:
    """k of `logprobs` (0: none; negative is none there too)."""
    return max(sp.logprobs, 0) if sp.HasField("logprobs") else 0


def to_engine_request(req: mpb.GenerateRequest, rid: str, context: int,
                      max_logprobs: int) -> EngineRequest:
    """The engine request of one GenerateRequest (MLX runs one sequence per request); raises
    InvalidRequest saying what is wrong. `context`: the deployment's max_model_len;
    `max_logprobs`: its `--max-logprobs`, which bounds k as it bounds the pod's HTTP routes."""
    if req.WhichOneof("input") != "tokenized":
        raise InvalidRequest(NEEDS_TOKENS)
    ids = tuple(req.tokenized.input_ids)
    if not ids:
        raise InvalidRequest("prompt is empty (no input_ids)")
    sp = req.sampling_params
    if len(sp.logit_bias):
        raise InvalidRequest("logit_bias is not emulated")
    k = logprobs_asked(sp)
    if max_logprobs >= 0 and (refusal := too_many(k, max_logprobs)):
        raise InvalidRequest(refusal)
    sampling = SamplingParams(
        max_tokens=max_new_tokens(sp, len(ids), context),
        temperature=sp.temperature if sp.HasField("temperature") else 1.0,
        top_p=sp.top_p if 0 < sp.top_p < 1 else 1.0, top_k=sp.top_k or -1, min_p=sp.min_p,
        repetition_penalty=sp.repetition_penalty or 1.0,
        presence_penalty=sp.presence_penalty, frequency_penalty=sp.frequency_penalty,
        seed=sp.seed if sp.HasField("seed") else None, ignore_eos=sp.ignore_eos,
        stop_token_ids=tuple(sp.stop_token_ids))
    sampling.validate()
    return EngineRequest(request_id=rid, prompt_token_ids=ids, sampling=sampling,
                         stream=req.stream)


def output_logprobs(ids: Sequence[int], tops: Sequence[list[tuple[int, float]]]
                    ) -> mpb.OutputLogProbs | None:
    """Positions' emulated top tokens (the generated one first: `server/frontend/logprobs.py`)
    as OutputLogProbs: each token, its logprob and its top list; None when none were asked."""
    if not tops:
        return None
    return mpb.OutputLogProbs(
        token_ids=ids, token_logprobs=[top[0][1] for top in tops],
        top_logprobs=[mpb.TopLogProbs(token_ids=[t for t, _ in top], values=[v for _, v in top])
                      for top in tops])


def to_chunk(ids: Sequence[int], counts: Counts,
             logprobs: mpb.OutputLogProbs | None) -> mpb.GenerateResponse:
    """A stream chunk: the new ids, the cumulative counts (cached 0, as there), index 0."""
    return mpb.GenerateResponse(chunk=mpb.GenerateStreamChunk(
        token_ids=ids, prompt_tokens=counts.prompt_tokens,
        completion_tokens=counts.completion_tokens, cached_tokens=0, index=0,
        output_logprobs=logprobs))


def to_complete(chunk: TokenChunk, ids: Sequence[int], counts: Counts, eos: int,
                logprobs: mpb.OutputLogProbs | None) -> mpb.GenerateResponse:
    """The request's end: streaming, no ids (they went in the chunks) and no logprobs; not
    streaming, all of them. "stop" names the token that matched, EOS included."""
    fields = finish_fields(chunk, eos, "abort")
    matched = fields.pop("matched_token_id", None)
    fields.pop("matched_stop_str", None)  # no stop strings on this wire
    return mpb.GenerateResponse(complete=mpb.GenerateComplete(
        output_ids=ids, prompt_tokens=counts.prompt_tokens,
        completion_tokens=counts.completion_tokens, cached_tokens=0, index=0,
        output_logprobs=logprobs, matched_stop_token_id=matched, **fields))
