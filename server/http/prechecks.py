"""vLLM 0.33.0's `mode="before"` model validators, on a request body's raw JSON object.

vLLM's `CompletionRequest` and `ChatCompletionRequest` (`vllm/entrypoints/openai/{completion,
chat_completion}/protocol.py`, `vllm/entrypoints/generate/base/protocol.py`) check these
before pydantic looks at any field, and raise `VLLMValidationError` — not a `ValueError`, so it
leaves pydantic as it is and vLLM answers it as 400 `BadRequestError` whose message ends with
`(parameter=…, value=…)` (`vllm_invalid`). pydantic runs `before` validators last-defined
first; each function below runs them in that order. The data may be anything JSON: a check
looks only at what it needs and leaves the rest to the fields' validation.
"""

from __future__ import annotations

from typing import Any

from server.http.errors import vllm_invalid

MAX_CACHE_SALT = 128
CACHE_SALT_FORBIDDEN = frozenset("@/\\\x00")


def cache_salt(salt: object) -> None:
    """`validate_cache_salt`."""
    if salt is None:
        return
    if not isinstance(salt, str) or not salt:
        raise vllm_invalid("Parameter 'cache_salt' must be a non-empty string if provided.",
                           "cache_salt")
    if len(salt) > MAX_CACHE_SALT or any(c in CACHE_SALT_FORBIDDEN for c in salt):
        raise vllm_invalid("Parameter 'cache_salt' must be at most 128 characters and must not "
                           "contain '@', '/', '\\\\', or NUL.", "cache_salt")


def _response_format(data: dict) -> None:
    rf = data.get("response_format")
    if isinstance(rf, dict) and rf.get("type") == "json_schema" \
            and rf.get("json_schema") is None:
        raise vllm_invalid("When response_format type is 'json_schema', the 'json_schema' "
                           "field must be provided.", "response_format")


def _structured_outputs_count(data: dict, parameter: str | None) -> None:
    so = data.get("structured_outputs")
    if isinstance(so, dict) and sum(so.get(k) is not None
                                    for k in ("json", "regex", "choice")) > 1:
        raise vllm_invalid("You can only use one kind of constraints for structured outputs "
                           "('json', 'regex' or 'choice').", parameter)


def _stream_options(data: dict) -> None:
    if data.get("stream_options") and not data.get("stream"):
        raise vllm_invalid("Stream options can only be defined when `stream=True`.",
                           "stream_options")


def _integers(data: dict, names: tuple[str, ...]) -> None:
    for name in names:
        value = data.get(name)
        if value is not None and not isinstance(value, int | float):
            raise vllm_invalid(f"`{name}` must be an integer.", name, value)


def _prompt_logprobs(data: dict) -> None:
    value = data.get("prompt_logprobs")
    if value is None:
        return
    if data.get("stream") and (value > 0 or value == -1):
        raise vllm_invalid("`prompt_logprobs` are not available when `stream=True`.",
                           "prompt_logprobs")
    if value < 0 and value != -1:
        raise vllm_invalid("`prompt_logprobs` must be a positive value or -1.",
                           "prompt_logprobs", value)


def completion(data: Any) -> Any:
    """`CompletionRequest`'s before-validators."""
    if not isinstance(data, dict):
        return data
    prompt, embeds = data.get("prompt"), data.get("prompt_embeds")
    if prompt in (None, "") and (embeds is None or embeds == []):
        raise vllm_invalid("Either prompt or prompt_embeds must be provided and non-empty.",
                           "prompt")
    _stream_options(data)
    _integers(data, ("prompt_logprobs", "logprobs"))
    _prompt_logprobs(data)
    logprobs = data.get("logprobs")
    if logprobs is not None and logprobs < 0 and logprobs != -1:
        raise vllm_invalid("`logprobs` must be a positive value or -1.", "logprobs", logprobs)
    _structured_outputs_count(data, "structured_outputs")
    _response_format(data)
    cache_salt(data.get("cache_salt"))
    if data.get("max_tokens") is None and "max_tokens" in data:  # normalize_null_max_tokens
        data = {**data, "max_tokens": DEFAULT_COMPLETION_MAX_TOKENS}
    return data


DEFAULT_COMPLETION_MAX_TOKENS = 16  # CompletionRequest.max_tokens' default, null included


def chat(data: Any) -> Any:
    """`ChatCompletionRequest`'s before-validators."""
    if not isinstance(data, dict):
        return data
    _tool_usage(data)
    _structured_outputs_count(data, None)
    _integers(data, ("prompt_logprobs", "top_logprobs"))
    _prompt_logprobs(data)
    top = data.get("top_logprobs")
    if top is not None:
        if top < 0 and top != -1:
            raise vllm_invalid("`top_logprobs` must be a positive value or -1.",
                               "top_logprobs", top)
        if (top == -1 or top > 0) and not data.get("logprobs"):
            raise vllm_invalid("when using `top_logprobs`, `logprobs` must be set to true.",
                               "top_logprobs")
    _stream_options(data)
    _response_format(data)
    cache_salt(data.get("cache_salt"))
    return data


USAGE = 'Correct usage: `{"type": "function", "function": {"name": "my_function"}}`'


def _tool_usage(data: dict) -> None:
    """`check_tool_usage` (its defaulting of `tool_choice` to "auto" is `tools.plan`'s). As
    vLLM 0.34.0 (and OpenAI), an empty `tools` array is an omitted one, and "auto" or
    "required" then has nothing to call: "none"; a named tool still finds no match."""
    tools = data.get("tools")
    choice = data.get("tool_choice")
    if tools == [] and not isinstance(choice, dict):
        data["tools"] = tools = None
        if choice in ("auto", "required"):
            data["tool_choice"] = choice = "none"
    if choice is None or choice == "none":
        return
    if tools is None:
        raise vllm_invalid("When using `tool_choice`, `tools` must be set.", "tool_choice")
    if choice not in ("auto", "required") and not isinstance(choice, dict):
        raise vllm_invalid(f"Invalid value for `tool_choice`: {choice}! Only named tools, "
                           '"none", "auto" or "required" are supported.', "tool_choice")
    if not isinstance(choice, dict):
        return
    function = choice.get("function")
    if not isinstance(function, dict):
        raise vllm_invalid(f"Invalid value for `function`: `{function}` in `tool_choice`! "
                           f"{USAGE}", "tool_choice.function")
    if "name" not in function:
        raise vllm_invalid(f"Expected field `name` in `function` in `tool_choice`! {USAGE}",
                           "tool_choice.function.name")
    name = function["name"]
    if not isinstance(name, str) or not name:
        raise vllm_invalid(f"Invalid `name` in `function`: `{name}` in `tool_choice`! {USAGE}",
                           "tool_choice.function.name")
    names = [t.get("function", {}).get("name") for t in tools
             if isinstance(t, dict) and isinstance(t.get("function"), dict)] \
        if isinstance(tools, list) else []
    if name not in names:
        raise vllm_invalid(f"The tool `{name}` specified in `tool_choice` does not match any "
                           "of the specified `tools`", "tool_choice")
