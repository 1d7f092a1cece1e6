"""An HTTP request's fields → the engine's `SamplingParams` and `Constraint`; pure functions.

Ranges and combinations are checked here with vLLM's rules and messages
(`vllm/sampling_params.py`, the protocol validators), `param` and the message's
`(parameter=…, value=…)` tail where vLLM's `VLLMValidationError` sets them (`check_common`);
what the engine checks again (context length, KV pool, grammar compilation) it reports itself.
Structured output comes from `structured_outputs` (json / regex / choice / grammar /
json_object) with `response_format` (json_schema / json_object) merged into it as vLLM merges
it, or — beyond vLLM 0.33.0, which ignores them — from one of the `guided_json` /
`guided_regex` / `guided_choice` / `guided_grammar` aliases.
"""

from __future__ import annotations

import json
import math
from typing import Any

from server.engine.interface import JSON_OBJECT, Constraint, SamplingParams
from server.engine.tokenizer import get_tokenizer
from server.frontend.logprobs import too_many
from server.frontend.parallel import MAX_N
from server.http.errors import bad_request, vllm_invalid
from server.http.protocol import (
    CONSTRAINT_KEYS,
    UNSET_FIELDS,
    ChatCompletionRequest,
    GenerationFields,
    check_one_kind,
)

MAX_LOGPROBS = 20  # vLLM's default --max-logprobs


def check_common(req: GenerationFields, max_tokens: int | None) -> int:
    """Raise a 400 for the first bad parameter, in the order of vLLM's
    `SamplingParams._verify_args`; the number of choices per prompt.

    vLLM raises `VLLMValidationError`, whose `param` (and the message's `(parameter=…,
    value=…)` tail, `vllm_invalid`) is set only for temperature, top_p and max_tokens (chat's
    max_completion_tokens too: vLLM's SamplingParams calls it max_tokens); n, the penalties,
    top_k, min_p, min_tokens and stop answer `param` null. doppelchip's own `MAX_N` cap
    (vLLM's VLLM_MAX_N_SEQUENCES is 16384) names `n`."""
    n = 1 if req.n is None else req.n
    if n < 1:
        raise vllm_invalid(f"n must be at least 1, got {n}.")
    if n > MAX_N:
        raise bad_request(f"n must be at most {MAX_N}, got {n}.", "n")
    for name in ("presence_penalty", "frequency_penalty"):
        value = getattr(req, name)
        if value is not None and not -2 <= value <= 2:
            raise vllm_invalid(f"{name} must be in [-2, 2], got {value}.")
    rp = req.repetition_penalty
    if rp is not None and not math.isfinite(rp):
        raise vllm_invalid(f"repetition_penalty must be a finite number, got {rp}.")
    if rp is not None and rp <= 0:
        raise vllm_invalid(f"repetition_penalty must be greater than zero, got {rp}.")
    if (t := req.temperature) is not None:
        problem = ("a finite number" if not math.isfinite(t) else "non-negative" if t < 0
                   else "in [0, 2]" if t > 2 else None)
        if problem:
            raise vllm_invalid(f"temperature must be {problem}, got {t}.", "temperature", t)
    if req.top_p is not None and not 0 < req.top_p <= 1:
        raise vllm_invalid(f"top_p must be in (0, 1], got {req.top_p}.", "top_p", req.top_p)
    if req.top_k is not None and req.top_k < -1:
        raise vllm_invalid(f"top_k must be 0 (disable), or at least 1, got {req.top_k}.")
    if req.min_p is not None and not 0 <= req.min_p <= 1:
        raise vllm_invalid(f"min_p must be in [0, 1], got {req.min_p}.")
    if max_tokens is not None and max_tokens < 1:
        raise vllm_invalid(f"max_tokens must be at least 1, got {max_tokens}.", "max_tokens",
                           max_tokens)
    if req.min_tokens < 0:
        raise vllm_invalid(f"min_tokens must be greater than or equal to 0, got "
                           f"{req.min_tokens}.")
    if max_tokens is not None and req.min_tokens > max_tokens:
        raise vllm_invalid(f"min_tokens must be less than or equal to max_tokens="
                           f"{max_tokens}, got {req.min_tokens}.")
    if any(t < 0 for t in req.stop_token_ids or ()):
        raise bad_request("stop_token_ids must be non-negative token ids.", "stop_token_ids")
    stops = req.stop if isinstance(req.stop, list) else [req.stop]
    if any(s == "" for s in stops):  # a string is one stop string, as vLLM's __post_init__
        raise vllm_invalid("stop cannot contain an empty string.")
    return n


def _allowed(cap: int) -> int:
    """The deployment's --max-logprobs as a number: -1 allows the whole vocabulary."""
    return get_tokenizer().vocab_size if cap == -1 else cap


def check_logprobs(value: int | None, name: str, cap: int = MAX_LOGPROBS) -> int | None:
    """vLLM's checks of `logprobs` (completions) / `top_logprobs` (chat): ≥ 0, or -1 for the
    whole vocabulary — more than `--max-logprobs` (`cap`) allows unless it is -1 too (the
    protocol's before-validator, then `SamplingParams._validate_logprobs`, whose `param` is
    "logprobs")."""
    if value is None:
        return None
    if value < 0 and value != -1:
        raise vllm_invalid(f"`{name}` must be a positive value or -1.", name, value)
    asked = get_tokenizer().vocab_size if value == -1 else value
    if refusal := too_many(asked, _allowed(cap)):
        raise vllm_invalid(refusal, "logprobs", asked)
    return value


def check_prompt_logprobs(value: int | None, cap: int = MAX_LOGPROBS) -> None:
    """vLLM's `_validate_logprobs` of `prompt_logprobs` (its sign and stream checks ran in
    `prechecks`): -1 is the whole vocabulary, more than `--max-logprobs` (`cap`) allows
    unless it is -1 too."""
    asked = get_tokenizer().vocab_size if value == -1 else value
    if asked and (refusal := too_many(asked, _allowed(cap), "prompt")):
        raise vllm_invalid(refusal, "prompt_logprobs", asked)


def prompt_logprobs_asked(req: GenerationFields) -> int | None:
    """vLLM's `prompt_logprobs` of a request (`to_sampling_params`): as given, else with
    `echo` the completion's `logprobs` (a chat's `top_logprobs`, 0 by default)."""
    asked = getattr(req, "prompt_logprobs", None)
    if asked is None and getattr(req, "echo", False):
        asked = req.top_logprobs if isinstance(req, ChatCompletionRequest) else req.logprobs
    return asked


def sampling_params(req: GenerationFields, max_tokens: int | None) -> SamplingParams:
    """The engine's sampling parameters (validated again by the engine's own rules). A request
    that asks its prompt's logprobs reads nothing from the prefix cache, as vLLM's
    (`skip_reading_prefix_cache`): its whole prompt is computed."""
    d = SamplingParams()

    def pick(value: Any, default: Any) -> Any:
        return default if value is None else value

    stop = req.stop if isinstance(req.stop, list) else ([req.stop] if req.stop else [])
    top_k = pick(req.top_k, -1)
    return SamplingParams(
        max_tokens=max_tokens,
        min_tokens=req.min_tokens,
        temperature=float(pick(req.temperature, d.temperature)),
        top_p=float(pick(req.top_p, d.top_p)),
        top_k=-1 if top_k == 0 else top_k,
        min_p=float(pick(req.min_p, d.min_p)),
        repetition_penalty=float(pick(req.repetition_penalty, d.repetition_penalty)),
        presence_penalty=float(pick(req.presence_penalty, d.presence_penalty)),
        frequency_penalty=float(pick(req.frequency_penalty, d.frequency_penalty)),
        seed=req.seed,
        ignore_eos=req.ignore_eos,
        stop=tuple(stop),
        stop_token_ids=tuple(req.stop_token_ids or ()),
        include_stop_str_in_output=req.include_stop_str_in_output,
        skip_special_tokens=pick(req.skip_special_tokens, True),
        skip_reading_prefix_cache=prompt_logprobs_asked(req) is not None,
    )


def _schema_text(schema: Any, param: str) -> str:
    if isinstance(schema, str):
        return schema
    if isinstance(schema, dict | bool):
        return json.dumps(schema)
    raise bad_request("a JSON schema must be an object (or its JSON text)", param)


def constraint(req: GenerationFields) -> Constraint | None:
    """The structured-output constraint of the request, or None. As vLLM
    (`structured_outputs_from_response_format`): `response_format` sets `structured_outputs`'
    `json` (json_schema: its `schema`, None when it has none) or `json_object`, and the result
    must hold exactly one constraint (vLLM's error otherwise, no `param`). The guided_*
    aliases are one more source; two sources are a 400."""
    found: list[tuple[str, Constraint]] = []
    so = req.structured_outputs
    fields = so.vllm_fields() if so is not None else None
    rf = req.response_format
    if rf is not None and rf.type != "text":
        if rf.type == "structural_tag":
            raise bad_request("response_format type 'structural_tag' is not supported.",
                              "response_format")
        fields = dict(fields or UNSET_FIELDS)
        if rf.type == "json_object":
            fields["json_object"] = True
        elif rf.json_schema is None:  # the protocol's before-validator refuses it first
            raise bad_request("When response_format type is 'json_schema', the "
                              "'json_schema' field must be provided.", "response_format")
        else:
            fields["json"] = rf.json_schema.json_schema
        check_one_kind(fields)
    if fields is not None:
        kind = next(k for k in CONSTRAINT_KEYS if fields[k] is not None)
        found.append(("structured_outputs" if so is not None else "response_format",
                      _kind("json_" if kind == "json" else kind, fields[kind])))
    for name, kind in (("guided_json", "json_"), ("guided_regex", "regex"),
                       ("guided_choice", "choice"), ("guided_grammar", "grammar")):
        value = getattr(req, name)
        if value is not None:
            found.append((name, _kind(kind, value)))
    if len(found) > 1:
        raise bad_request("You can only use one kind of structured output: got "
                          f"{', '.join(name for name, _ in found)}.", found[1][0])
    return found[0][1] if found else None


def _kind(kind: str, value: Any) -> Constraint:
    if kind == "json_":
        return Constraint("json_schema", _schema_text(value, "structured_outputs.json"))
    if kind == "json_object":
        if value is False:  # vLLM's SamplingParams._validate_structured_outputs
            raise vllm_invalid("structured_outputs.json_object must be True if set; omit "
                               "structured_outputs to disable structured outputs")
        return Constraint("json_schema", JSON_OBJECT)
    if kind == "choice":
        return Constraint("choice", choices=tuple(value))
    if kind == "structural_tag":
        raise bad_request("structural_tag is not supported.", "structured_outputs")
    return Constraint(kind, text=value)  # type: ignore[arg-type]  # regex | grammar
