"""Request bodies of Anthropic's Messages API as vLLM serves it (`/v1/messages`,
`/v1/messages/count_tokens`; `vllm/entrypoints/anthropic/protocol.py`, docs/HTTP.md).

Why it exists: Anthropic's clients (the `anthropic` SDK, Claude Code with
`ANTHROPIC_BASE_URL`) speak this shape, and vLLM answers it by turning it into a chat request
(`server.http.messages`). The fields and their checks are vLLM's: `max_tokens` required and
> 0, `model` non-empty, `tool_choice` "tool" needs a `name`, a tool's `input_schema` without
`type` is an object schema, a tool's `type` is "custom" or absent (vLLM 0.34.0), Claude Code's
`ctx`/`msg` roles read as `user`. Unknown fields are
ignored (pydantic's default, as vLLM's models leave it).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

_ROLES = {"ctx": "user", "msg": "user"}  # Claude Code >= 2.1.154's roles (vLLM maps them)


class ContentBlock(BaseModel):
    """One block of a message's content (text, image, tool use, tool result, thinking)."""

    type: Literal["text", "image", "tool_use", "tool_result", "tool_reference", "thinking",
                  "redacted_thinking"]
    text: str | None = None
    source: dict[str, Any] | None = None
    id: str | None = None
    tool_use_id: str | None = None
    name: str | None = None
    input: dict[str, Any] | None = None
    content: str | list[dict[str, Any]] | None = None
    is_error: bool | None = None
    tool_name: str | None = None
    thinking: str | None = None
    signature: str | None = None
    data: str | None = None


class Message(BaseModel):
    role: Literal["user", "assistant", "system"]
    content: str | list[ContentBlock]

    @field_validator("role", mode="before")
    @classmethod
    def _claude_code_roles(cls, v: Any) -> Any:
        return _ROLES.get(v, v) if isinstance(v, str) else v


class AnthropicTool(BaseModel):
    type: Literal["custom"] | None = None
    name: str
    description: str | None = None
    input_schema: dict[str, Any]
    strict: bool | None = None
    defer_loading: bool | None = None

    @model_validator(mode="before")
    @classmethod
    def _custom_only(cls, data: Any) -> Any:
        """vLLM 0.34.0: an Anthropic-defined tool (a versioned `type`: web search, code
        execution, bash, text editor, ...) is refused by its type, before the missing
        `input_schema` would be reported instead."""
        if isinstance(data, dict) and data.get("type") not in (None, "custom"):
            raise ValueError(f"tool type {data['type']!r} is not supported; only custom tools "
                             "with an input_schema are supported")
        return data

    @field_validator("input_schema")
    @classmethod
    def _object_by_default(cls, v: dict[str, Any]) -> dict[str, Any]:
        return v if "type" in v else {**v, "type": "object"}


class ToolChoice(BaseModel):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None

    @model_validator(mode="after")
    def _named(self) -> ToolChoice:
        if self.type == "tool" and not self.name:
            raise ValueError("tool_choice.name is required when type is 'tool'")
        return self


class JsonOutputFormat(BaseModel):
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    type: Literal["json_schema"] = "json_schema"


class OutputConfig(BaseModel):
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None
    format: JsonOutputFormat | None = None


class _Conversation(BaseModel):
    """What both routes take: the conversation, its system prompt and its tools."""

    model: str
    messages: list[Message]
    system: str | list[ContentBlock] | None = None
    tool_choice: ToolChoice | None = None
    tools: list[AnthropicTool] | None = None
    chat_template_kwargs: dict[str, Any] | None = None  # vLLM's own (accepted, unused here)

    @field_validator("model")
    @classmethod
    def _model_given(cls, v: str) -> str:
        if not v:
            raise ValueError("Model is required")
        return v


class MessagesRequest(_Conversation):
    """`POST /v1/messages`."""

    max_tokens: int
    metadata: dict[str, Any] | None = None
    output_config: OutputConfig | None = None
    stop_sequences: list[str] | None = None
    stream: bool | None = False
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    kv_transfer_params: dict[str, Any] | None = None  # vLLM's own: P/D (docs/PD.md)

    @field_validator("max_tokens")
    @classmethod
    def _positive(cls, v: int) -> int:
        if v <= 0:
            raise ValueError("max_tokens must be positive")
        return v


class CountTokensRequest(_Conversation):
    """`POST /v1/messages/count_tokens`."""
