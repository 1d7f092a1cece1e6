"""SGLang 0.5.23's `/generate` body (`GenerateReqInput`, `sglang/srt/managers/io_struct.py`)
and its sampling parameters (`SamplingParams`, `sglang/srt/sampling/sampling_params.py`),
checked in SGLang's words and turned into the completions request over token ids that runs
them here (the same engine request, limits and KV accounting as every other route).

Why its own body: routers that speak SGLang (smg and sgl-router in HTTP mode, SGLang's own
`bench_serving --backend sglang`) send `{"text": ..., "sampling_params": {...}}` to
`/generate`, whose names and defaults are SGLang's: `max_new_tokens` 128, `top_k` -1 for all,
`no_stop_trim` for vLLM's `include_stop_str_in_output`, `sampling_seed`.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from server.engine.errors import InvalidRequest
from server.frontend import sglang_pod
from server.frontend.sglang_pod import MAX_NEW_TOKENS
from server.http.errors import HttpError
from server.http.protocol import CompletionRequest

# SamplingParams' keyword arguments: emulated (mapped below) or accepted without effect
MAPPED = {"max_new_tokens", "min_new_tokens", "temperature", "top_p", "top_k", "min_p",
          "frequency_penalty", "presence_penalty", "repetition_penalty", "stop",
          "stop_token_ids", "ignore_eos", "skip_special_tokens", "no_stop_trim", "n",
          "json_schema", "regex", "ebnf", "sampling_seed"}
ACCEPTED = {"stop_regex", "spaces_between_special_tokens", "stream_interval", "logit_bias",
            "custom_params", "structural_tag", "beam_width", "watermark"}


def invalid(message: str) -> HttpError:
    """SGLang's answer to a ValueError: 400 `{"error": {"message": ...}}`."""
    return HttpError(400, message)


@dataclass
class GenerateInput:
    """One `/generate` request: its prompts (text or token ids), whether it was a batch, the
    sampling parameters, and what the answer carries."""

    prompts: list[str | list[int]]
    batch: bool
    sampling: dict[str, Any]
    stream: bool = False
    rids: list[str] = field(default_factory=list)
    return_logprob: bool = False
    top_logprobs_num: int = 0

    @property
    def n(self) -> int:
        return int(self.sampling.get("n", 1))


def parse(body: Any) -> GenerateInput:
    """The body, or the 400 SGLang answers (its messages where it has them)."""
    if not isinstance(body, dict):
        raise invalid("The request body must be a JSON object")
    prompts, batch = prompt_inputs(body)
    sampling = body.get("sampling_params") or {}
    if isinstance(sampling, list):
        if len({repr(s) for s in sampling}) > 1:
            raise invalid("per-prompt sampling_params are not served by doppelchip: give one")
        sampling = sampling[0] if sampling else {}
    if not isinstance(sampling, dict):
        raise invalid("sampling_params must be an object")
    unknown = sorted(set(sampling) - MAPPED - ACCEPTED)
    if unknown:  # SamplingParams(**params) raises TypeError there
        raise invalid(f"SamplingParams.__init__() got an unexpected keyword argument "
                      f"'{unknown[0]}'")
    check_sampling(sampling)
    rid = body.get("rid")
    count = len(prompts) * int(sampling.get("n", 1))
    if isinstance(rid, list):
        rids = [str(r) for r in rid]
    elif rid is not None:
        rids = [str(rid)] if count == 1 else [f"{rid}_{i}" for i in range(count)]
    else:
        rids = [uuid.uuid4().hex for _ in range(count)]
    if len(rids) != count:
        raise invalid("The rid should be a list for batch processing.")
    return GenerateInput(prompts, batch, sampling, bool(body.get("stream")), rids,
                         bool(body.get("return_logprob")), _top_logprobs_num(body))


def _top_logprobs_num(body: dict) -> int:
    """`top_logprobs_num`: an integer (none or below 1: no top logprobs, as SGLang reads it);
    anything else is a 400 here (SGLang's dataclass takes it unchecked and fails later)."""
    value = body.get("top_logprobs_num")
    if isinstance(value, list):
        raise invalid("per-prompt top_logprobs_num lists are not served by doppelchip: give one")
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise invalid(f"top_logprobs_num must be an integer, got {value!r}")
    return max(0, value or 0)


def prompt_inputs(body: dict) -> tuple[list[str | list[int]], bool]:
    """A `/generate` or `/encode` body's prompts (`text` or `input_ids`, one or a list) and
    whether they were a batch; the 400 SGLang answers for neither or both."""
    text, ids = body.get("text"), body.get("input_ids")
    if (text is None) == (ids is None):
        raise invalid("Either text or input_ids should be provided." if text is None else
                      "Only one of text or input_ids should be provided.")
    for key in ("input_embeds", "image_data", "video_data", "audio_data"):
        if body.get(key) is not None:
            raise invalid(f"{key} is not served by doppelchip: its models are text only")
    if text is not None:
        batch = isinstance(text, list)
        prompts = list(text) if batch else [text]
        if not all(isinstance(t, str) for t in prompts):
            raise invalid("text must be a string or a list of strings")
    else:
        batch = isinstance(ids, list) and bool(ids) and isinstance(ids[0], list)
        prompts = [list(p) for p in ids] if batch else [ids]
        if not all(isinstance(p, list) and all(isinstance(t, int) for t in p)
                   for p in prompts):
            raise invalid("input_ids must be a list of token ids or a list of such lists")
    if batch and not prompts:
        raise invalid("The batch is empty")
    return prompts, batch


def check_sampling(sp: dict[str, Any]) -> None:
    """`SamplingParams.verify` (`sglang_pod.check_sampling`), as SGLang's 400."""
    try:
        sglang_pod.check_sampling(sp)
    except InvalidRequest as e:
        raise invalid(str(e)) from None


def check_length(n_input: int, max_new: int | None, context_len: int) -> None:
    """The tokenizer manager's `_validate_one_request` length checks (no auto-truncation)."""
    if n_input >= context_len:
        raise invalid(f"The input ({n_input} tokens) is longer than the model's context "
                      f"length ({context_len} tokens).")
    if max_new is not None and max_new + n_input > context_len:
        raise invalid(
            f"Requested token count exceeds the model's maximum context length of "
            f"{context_len} tokens. You requested a total of {max_new + n_input} tokens: "
            f"{n_input} tokens from the input messages and {max_new} tokens for the "
            f"completion. Please reduce the number of tokens in the input messages or the "
            f"completion to fit within the limit.")


def completion_body(inp: GenerateInput, model: str, ids: list[list[int]]) -> CompletionRequest:
    """The completions request over the prompts' token ids that runs `inp`."""
    sp = inp.sampling
    stop = sp.get("stop")
    data: dict[str, Any] = {
        "model": model, "prompt": ids if len(ids) > 1 else ids[0], "n": inp.n,
        "max_tokens": sp.get("max_new_tokens", MAX_NEW_TOKENS),
        "min_tokens": sp.get("min_new_tokens", 0),
        "temperature": sp.get("temperature", 1.0), "top_p": sp.get("top_p", 1.0),
        "top_k": sp.get("top_k", -1), "min_p": sp.get("min_p", 0.0),
        "frequency_penalty": sp.get("frequency_penalty", 0.0),
        "presence_penalty": sp.get("presence_penalty", 0.0),
        "repetition_penalty": sp.get("repetition_penalty", 1.0),
        "stop": [stop] if isinstance(stop, str) else stop,
        "stop_token_ids": sp.get("stop_token_ids"), "ignore_eos": bool(sp.get("ignore_eos")),
        "skip_special_tokens": sp.get("skip_special_tokens", True),
        "include_stop_str_in_output": bool(sp.get("no_stop_trim")),
        "seed": sp.get("sampling_seed"), "stream": inp.stream,
        "logprobs": max(1, inp.top_logprobs_num) if inp.return_logprob else None,
    }
    for key, kind in (("json_schema", "json"), ("regex", "regex"), ("ebnf", "grammar")):
        if sp.get(key) is not None:
            data["structured_outputs"] = {kind: sp[key]}
    return CompletionRequest.model_validate(data)
