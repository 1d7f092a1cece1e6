"""Request bodies, as vLLM 0.33.0's pydantic models accept them (`CompletionRequest`,
`ChatCompletionRequest`, `TokenizeRequest`, `DetokenizeRequest`).

Unknown fields are accepted and ignored (`extra="allow"`), as vLLM does. vLLM's
`mode="before"` validators run first (`server.http.prechecks`), then the field types are
checked here (a wrong type is a 400 naming `body.<field>`; `structured_outputs` holds exactly
one constraint, as vLLM's `StructuredOutputsParams.__post_init__` checks); ranges and
combinations are checked in `server.http.sampling`, which names the parameter as vLLM does.
Beyond vLLM 0.33.0 (which ignores them): the `guided_json` / `guided_regex` / `guided_choice` /
`guided_grammar` aliases constrain the output (docs/HTTP.md).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, model_validator

from server.http import prechecks
from server.http.errors import vllm_invalid

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
TokenId = Annotated[int, Field(ge=0)]


class OpenAIBase(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)


class StreamOptions(OpenAIBase):
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False

    @property
    def usage_each(self) -> bool:
        """vLLM's `should_include_usage`: per-chunk usage only with include_usage as well."""
        return bool(self.include_usage and self.continuous_usage_stats)


class JsonSchemaFormat(OpenAIBase):
    name: str
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(OpenAIBase):
    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputs(OpenAIBase):
    json_: str | dict[str, Any] | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: str | None = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None

    def vllm_fields(self, parsed: bool = False) -> dict[str, Any]:
        """The fields as vLLM's `StructuredOutputsParams.__dict__` holds them (the two private
        ones too when pydantic made it from the request: `parsed`)."""
        out = {"json": self.json_, "regex": self.regex, "choice": self.choice,
               "grammar": self.grammar, "json_object": self.json_object,
               "disable_any_whitespace": self.disable_any_whitespace,
               "disable_additional_properties": self.disable_additional_properties,
               "whitespace_pattern": self.whitespace_pattern,
               "structural_tag": self.structural_tag}
        return {**out, "_backend": None, "_backend_was_auto": False} if parsed else out

    @model_validator(mode="after")
    def _one_kind(self) -> StructuredOutputs:
        """vLLM's `StructuredOutputsParams.__post_init__`, run when the request is parsed."""
        check_one_kind(self.vllm_fields(parsed=True))
        return self


CONSTRAINT_KEYS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")
# vLLM's `StructuredOutputsParams()` fields, in its order, as nothing sets them
UNSET_FIELDS: dict[str, Any] = {"json": None, "regex": None, "choice": None, "grammar": None,
                                "json_object": None, "disable_any_whitespace": False,
                                "disable_additional_properties": False,
                                "whitespace_pattern": None, "structural_tag": None}


def check_one_kind(fields: dict[str, Any]) -> None:
    """Exactly one structured-output constraint, else vLLM's error (no `param`)."""
    count = sum(fields[k] is not None for k in CONSTRAINT_KEYS)
    if count > 1:
        raise vllm_invalid("You can only use one kind of structured outputs constraint but "
                           f"multiple are specified: {fields}")
    if count < 1:
        raise vllm_invalid("You must use one kind of structured outputs constraint but none "
                           f"are specified: {fields}")


class GenerationFields(OpenAIBase):
    """What completions and chat share: sampling, structured output, scheduling."""

    model: str | None = None
    n: int | None = 1
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = Field(default=None, ge=INT64_MIN, le=INT64_MAX)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    min_tokens: int = 0
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    skip_special_tokens: bool | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    priority: int = Field(default=0, ge=INT64_MIN, le=INT64_MAX)
    request_id: str | None = None
    user: str | None = None
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    guided_json: str | dict[str, Any] | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    # --- P/D (issue 13): vLLM's NIXL connector parameters (docs/PD.md) ---
    kv_transfer_params: dict[str, Any] | None = None
    # checked as vLLM checks it, not used: the front end's --stream-interval applies
    stream_interval: Annotated[int, Field(ge=1)] | None = None
    cache_salt: str | None = None  # its checks: prechecks.cache_salt (vLLM's, before parsing)
    # vLLM's: a conversation's stable id, which its KV events name (routes.with_session)
    session_id: str | None = None
    # vLLM's request extensions (SamplingParams.extra_args): `kv_cache_report_mode`
    # ("full": a prefix-cache hit is reported as KV events) and `session_id` are read
    vllm_xargs: dict[str, str | int | float | list[str | int | float]] | None = None
    # how long the prompt may be: server.http.lengths (vLLM's TokenizeParams)
    truncate_prompt_tokens: Annotated[int, Field(ge=-1, le=INT64_MAX)] | None = None
    truncation_side: Literal["left", "right"] | None = None
    # the prompt's and each choice's token ids in the answer (vLLM's, for RL and tracing)
    return_token_ids: bool | None = None
    return_tokens_as_token_ids: bool | None = None  # logprobs name tokens "token_id:N"
    # each choice's weight_versions: which weight version sampled which output tokens (RL)
    return_weight_versions: bool = False


G = TypeVar("G", bound=GenerationFields)


def passed_on(body: GenerationFields) -> dict[str, Any]:
    """The `EngineRequest` fields completions and chat take from the body as they are (the
    sampling, the prompt and the constraint are built apart). `kv_cache_report_mode` is
    vLLM's `Request.kv_cache_report_mode`: the `vllm_xargs` entry, "incremental" unless it
    says "full" (the only mode vLLM's KV-cache manager acts on)."""
    mode = (body.vllm_xargs or {}).get("kv_cache_report_mode")
    return {"priority": body.priority, "kv_transfer_params": body.kv_transfer_params,
            "return_weight_versions": body.return_weight_versions,
            "stream": bool(body.stream), "cache_salt": body.cache_salt,
            "session_id": body.session_id,
            "kv_cache_report_mode": "full" if mode == "full" else "incremental"}


def forced_usage(body: G, force: bool) -> G:
    """vLLM's --enable-force-include-usage (`should_include_usage`): a stream carries the
    usage so far on every chunk and the whole usage in a last chunk, whatever its
    `stream_options` say (an answer that is not streamed always has its usage)."""
    if not (force and body.stream):
        return body
    return body.model_copy(update={"stream_options": StreamOptions(
        include_usage=True, continuous_usage_stats=True)})


def tokens_as_ids(body: G, default: bool) -> G:
    """vLLM's --return-tokens-as-token-ids: the server's default for a request that leaves
    `return_tokens_as_token_ids` unset."""
    if not default or body.return_tokens_as_token_ids is not None:
        return body
    return body.model_copy(update={"return_tokens_as_token_ids": True})


class CompletionRequest(GenerationFields):
    # vLLM's union, in its order; None (or "") is refused by `prechecks.completion`
    prompt: list[TokenId] | list[list[TokenId]] | str | list[str] | None = None
    n: int = 1  # not nullable here (chat's is)
    max_tokens: int | None = 16
    logprobs: int | None = None
    prompt_logprobs: int | None = None  # emulated as `logprobs` (server.frontend.logprobs)
    echo: bool | None = False
    suffix: str | None = None
    add_special_tokens: bool = True

    @model_validator(mode="before")
    @classmethod
    def _vllm_prechecks(cls, data: Any) -> Any:
        return prechecks.completion(data)


class FunctionDef(OpenAIBase):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class Tool(OpenAIBase):
    type: Literal["function"] = "function"
    function: FunctionDef


class NamedFunction(OpenAIBase):
    name: str


class NamedToolChoice(OpenAIBase):
    type: Literal["function"] = "function"
    function: NamedFunction


class ChatMessage(OpenAIBase):
    role: str
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


class ChatCompletionRequest(GenerationFields):
    messages: list[ChatMessage]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = 0
    prompt_logprobs: int | None = None  # the rendered prompt's, as completions' (top level)
    tools: list[Tool] | None = None
    tool_choice: (Literal["none"] | Literal["auto"] | Literal["required"] | NamedToolChoice
                  | None) = None
    parallel_tool_calls: bool | None = True
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    echo: bool = False

    @model_validator(mode="before")
    @classmethod
    def _vllm_prechecks(cls, data: Any) -> Any:
        return prechecks.chat(data)


class TokenizeCompletionRequest(OpenAIBase):
    """`/tokenize` of a prompt: BOS added unless `add_special_tokens` is false."""

    model: str | None = None
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool | None = False


class TokenizeChatRequest(OpenAIBase):
    """`/tokenize` of chat messages, through the chat template (which writes BOS itself)."""

    model: str | None = None
    messages: list[ChatMessage]
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    return_token_strs: bool | None = False


# vLLM's two request forms, validated as the union (a body that is neither gets pydantic's
# error for each form: `body.TokenizeCompletionRequest.prompt`, `...TokenizeChatRequest...`)
TokenizeRequest = TypeAdapter(TokenizeCompletionRequest | TokenizeChatRequest)


class DetokenizeRequest(OpenAIBase):
    model: str | None = None
    tokens: list[Annotated[int, Field(ge=0, le=INT64_MAX)]]
