"""How long an HTTP request's prompt may be and how many tokens it may generate, decided as
vLLM 0.33.0's entrypoint layer decides them — before the engine sees the request.

Why it exists: vLLM's OpenAI server does not refuse a `max_tokens` that overruns the context;
it generates up to the context's end (`get_max_tokens` in
`vllm/entrypoints/serve/utils/api_utils.py`: the least of `max_model_len - prompt` and the
request's budget). It refuses only what cannot fit at all, with its own messages and `param`s
(`TokenizeParams` in `vllm/renderers/params.py`), which clients match on ("maximum context
length" is how LangChain and others spot an over-long prompt). The engine's own intake
(`server/engine/intake.py`) stays strict for the gRPC API; a request clamped here passes it.

In vLLM's order, per request:
1. `check_requested`: a budget above `max_model_len` (`max_tokens`, or chat's
   `max_completion_tokens`) or a `truncate_prompt_tokens` above it is a 400 naming that field;
2. `fit_prompt`, per prompt: `truncate_prompt_tokens` keeps the prompt's last N tokens (vLLM
   loads generation tokenizers with `truncation_side="left"`; -1: `max_model_len - 1`; a text
   prompt keeps its BOS, as the tokenizer's own truncation does), or the request's
   `truncation_side`; then a prompt longer than `max_model_len` is a 400 with vLLM's message
   (a text prompt "at least max_model_len + 1" tokens: vLLM's tokenizer stops counting there);
3. `output_budget`, per prompt: the clamped `max_tokens` (0 left: vLLM's SamplingParams
   refuses it, "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)").
"""

from __future__ import annotations

from server.http.errors import bad_request, vllm_invalid


def check_requested(max_tokens: int | None, name: str, truncate: int | None,
                    max_model_len: int) -> None:
    """Step 1: what the request asks for, before its prompt is tokenized."""
    if max_tokens is not None and max_tokens > max_model_len:
        raise bad_request(f"{name}={max_tokens} cannot be greater than max_model_len="
                          f"{max_model_len}. Please request fewer output tokens.", name)
    if truncate is not None and truncate > max_model_len:
        raise bad_request(f"truncate_prompt_tokens={truncate} cannot be greater than "
                          f"max_model_len = {max_model_len}. Please request a smaller "
                          "truncation size.", "truncate_prompt_tokens")


def fit_prompt(ids: list[int], max_model_len: int, *, truncate: int | None = None,
               side: str | None = None, from_text: bool = False,
               keeps_bos: bool = False) -> list[int]:
    """Step 2: the prompt truncated as asked, or a 400 if it is longer than the context.
    `from_text`: tokenized here from text (the count is vLLM's "at least"); `keeps_bos`: its
    first token is the BOS the tokenizer added (kept by a left truncation, as the tokenizer's
    own truncation keeps its special tokens)."""
    if truncate is not None:
        keep = max_model_len - 1 if truncate < 0 else truncate
        if keep < len(ids):
            if side == "right":
                ids = ids[:keep]
            elif keep == 0:
                ids = []
            elif keeps_bos and side is None:
                ids = [ids[0], *ids[len(ids) - keep + 1:]] if keep > 1 else ids[:1]
            else:
                ids = ids[len(ids) - keep:]
    if len(ids) > max_model_len:
        count = f"at least {max_model_len + 1}" if from_text else str(len(ids))
        raise bad_request(f"This model's maximum context length is {max_model_len} tokens. "
                          f"However, your prompt contains {count} input tokens, which exceeds "
                          "this limit even without any output tokens. Please reduce the "
                          "length of the input prompt.", "input_tokens")
    return ids


def output_budget(max_tokens: int | None, prompt_len: int, max_model_len: int,
                  min_tokens: int = 0) -> int:
    """Step 3: the tokens this prompt may generate (vLLM's `get_max_tokens`), checked as
    vLLM's `SamplingParams` checks the clamped value."""
    room = max_model_len - prompt_len
    budget = room if max_tokens is None else min(room, max_tokens)
    if budget < 1:  # vLLM's VLLMValidationError: param and tail name max_tokens
        raise vllm_invalid(f"max_tokens must be at least 1, got {budget}.", "max_tokens", budget)
    if min_tokens > budget:  # no parameter given: param null
        raise vllm_invalid(f"min_tokens must be less than or equal to max_tokens={budget}, got "
                           f"{min_tokens}.")
    return budget
