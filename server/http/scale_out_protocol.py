"""The wire shapes of vLLM 0.33.0's scale-out routes (`server/http/scale_out.py`): the
`GenerateRequest` that `/render` answers and `/inference/v1/generate` takes
(vllm/entrypoints/scale_out/token_in_token_out/protocol.py), and vLLM's `SamplingParams` as
it serializes inside one (vllm/sampling_params.py; `PydanticMsgspecMixin` in
vllm/v1/serial_utils.py: only the fields that differ from their declared defaults).

Why a module: render writes these shapes and generate reads them back, so a render → generate
round trip (an RL rollout, a router that tokenizes before it routes) is one reading of vLLM's.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from server.http.protocol import (
    INT64_MAX,
    INT64_MIN,
    UNSET_FIELDS,
    GenerationFields,
    StreamOptions,
    StructuredOutputs,
    TokenId,
)

_SAMPLING_EPS, _MAX_TEMP = 1e-5, 1e-2  # vllm/sampling_params.py
# vLLM's `SamplingParams` fields in declaration order, with their declared defaults (private
# ones left out: they never serialize); output_kind as its enum value (CUMULATIVE)
SAMPLING_DEFAULTS: dict[str, Any] = {
    "n": 1, "presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0,
    "temperature": 1.0, "watermarking": None, "top_p": 1.0, "top_k": 0, "min_p": 0.0,
    "seed": None, "stop": None, "stop_token_ids": None, "ignore_eos": False, "max_tokens": 16,
    "min_tokens": 0, "logprobs": None, "prompt_logprobs": None,
    "prompt_logprob_token_ids": None, "prompt_logprob_start": None, "logprob_token_ids": None,
    "flat_logprobs": False, "detokenize": True, "skip_special_tokens": True,
    "spaces_between_special_tokens": True, "include_stop_str_in_output": False,
    "output_kind": 0, "stream_interval": None, "skip_clone": False,
    "output_text_buffer_length": 0, "structured_outputs": None, "logit_bias": None,
    "allowed_token_ids": None, "extra_args": None, "bad_words": None,
    "skip_reading_prefix_cache": None, "thinking_token_budget": None,
    "repetition_detection": None, "routed_experts_prompt_start": 0,
    "trace_decode_token_ids": None,
}
OUTPUT_KIND_DELTA, OUTPUT_KIND_FINAL_ONLY = 1, 2


def structured_outputs(req: GenerationFields) -> dict[str, Any] | None:
    """vLLM's `extract_structured_outputs()`: `structured_outputs`, or what `response_format`
    or a guided_* alias sets (the request was checked by `sampling.constraint` first)."""
    if req.structured_outputs is not None:
        return req.structured_outputs.vllm_fields()
    fields = dict(UNSET_FIELDS)
    rf = req.response_format
    if rf is not None and rf.type == "json_object":
        fields["json_object"] = True
    elif rf is not None and rf.type == "json_schema" and rf.json_schema is not None:
        fields["json"] = rf.json_schema.json_schema
    else:
        for name, key in (("guided_json", "json"), ("guided_regex", "regex"),
                          ("guided_choice", "choice"), ("guided_grammar", "grammar")):
            if (value := getattr(req, name)) is not None:
                fields[key] = value
                break
        else:
            return None
    return fields


def sampling_params(req: GenerationFields, max_tokens: int, logprobs: int | None,
                    prompt_logprobs: int | None) -> dict[str, Any]:
    """The request's vLLM `SamplingParams` as a render's `GenerateRequest` serializes it
    (`to_sampling_params` with no server defaults — doppelchip loads no generation config —
    then `__post_init__`): the fields that differ from their defaults, in declaration order,
    then `max_tokens` if it equals its default (vLLM 0.34.0 keeps a resolved one, so that it
    is not read back as not provided)."""
    def pick(value: Any, default: Any) -> Any:
        return default if value is None else value

    stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    temperature = float(pick(req.temperature, 1.0))
    if 0 < temperature < _MAX_TEMP:
        temperature = _MAX_TEMP
    greedy = temperature < _SAMPLING_EPS
    values = {
        "n": pick(req.n, 1),
        "presence_penalty": float(pick(req.presence_penalty, 0.0)),
        "frequency_penalty": float(pick(req.frequency_penalty, 0.0)),
        "repetition_penalty": float(pick(req.repetition_penalty, 1.0)),
        "temperature": temperature,
        "top_p": 1.0 if greedy else float(pick(req.top_p, 1.0)),
        "top_k": 0 if greedy else pick(req.top_k, 0),
        "min_p": 0.0 if greedy else float(pick(req.min_p, 0.0)),
        "seed": None if req.seed == -1 else req.seed,
        "stop": stop,
        "stop_token_ids": list(dict.fromkeys(req.stop_token_ids or [])),
        "ignore_eos": req.ignore_eos, "max_tokens": max_tokens, "min_tokens": req.min_tokens,
        "logprobs": logprobs, "prompt_logprobs": prompt_logprobs,
        "skip_special_tokens": pick(req.skip_special_tokens, True),
        "include_stop_str_in_output": req.include_stop_str_in_output,
        "output_kind": OUTPUT_KIND_DELTA if req.stream else OUTPUT_KIND_FINAL_ONLY,
        "stream_interval": req.stream_interval, "skip_clone": True,
        "output_text_buffer_length": (max(map(len, stop)) - 1
                                      if stop and not req.include_stop_str_in_output else 0),
        "structured_outputs": structured_outputs(req),
        "bad_words": list(dict.fromkeys(getattr(req, "bad_words", None) or [])),
        "skip_reading_prefix_cache": prompt_logprobs is not None,
        # the client's vllm_xargs (render hoists kv_transfer_params out, to the top level)
        "extra_args": dict(req.vllm_xargs) if req.vllm_xargs else None,
    }
    params = {k: values[k] for k, default in SAMPLING_DEFAULTS.items()
              if k in values and values[k] != default}
    params.setdefault("max_tokens", max_tokens)
    return params


class VllmSamplingParams(BaseModel):
    """`GenerateRequest.sampling_params` as vLLM validates it (a typed dict of the
    `SamplingParams` fields, each with its default; unknown keys ignored). What doppelchip's
    engine applies is mapped by `scale_out.generate_body`; the rest is accepted."""

    model_config = ConfigDict(extra="ignore")

    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    max_tokens: int | None = 16
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    detokenize: bool = True
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    stream_interval: int | None = None
    structured_outputs: StructuredOutputs | None = None
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    extra_args: dict[str, Any] | None = None  # `kv_cache_report_mode` is read


class GenerateRequest(BaseModel):
    """vLLM's `GenerateRequest`, the fields doppelchip reads (multimodal inputs are refused
    by the route; `parse_context` and the reasoning fields are accepted and unused)."""

    model_config = ConfigDict(extra="ignore")

    request_id: str | None = None
    token_ids: list[TokenId] = Field(min_length=1)
    sampling_params: VllmSamplingParams
    model: str | None = None
    return_token_ids: bool | None = None
    output_mode: Literal["tokens", "text", "derender"] = "tokens"
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    cache_salt: Annotated[str, Field(min_length=1, max_length=1024)] | None = None
    priority: int = Field(default=0, ge=INT64_MIN, le=INT64_MAX)
    kv_transfer_params: dict[str, Any] | None = None
    features: dict[str, Any] | None = None
    content_parts: list[dict[str, Any]] | None = None


def generate_request(request_id: str, token_ids: list[int], params: dict[str, Any],
                     req: GenerationFields, parse_context: dict[str, Any] | None = None
                     ) -> dict[str, Any]:
    """A `GenerateRequest` as `/render` answers it (`model_dump()`: every field, in order)."""
    stream = bool(req.stream)
    return {"request_id": request_id, "token_ids": token_ids, "token_offsets": None,
            "features": None, "content_parts": None, "sampling_params": params,
            "model": req.model, "reasoning_ended": None, "reasoning_parser_kwargs": None,
            "return_token_ids": req.return_token_ids, "output_mode": "tokens",
            "parse_context": parse_context, "stream": stream,
            "stream_options": (
                {"include_usage": req.stream_options.include_usage,
                 "continuous_usage_stats": req.stream_options.continuous_usage_stats}
                if stream and req.stream_options is not None else None),
            "cache_salt": req.cache_salt, "priority": req.priority,
            "kv_transfer_params": req.kv_transfer_params, "ec_transfer_params": None}


class AbortRequestsRequest(BaseModel):
    """`/inference/v1/abort_requests`'s body (vLLM 0.34.0 validates it as this model, so a
    missing or mistyped `request_ids` is the validation handler's 400)."""

    request_ids: str | list[str]
