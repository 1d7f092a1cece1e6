"""The request body of OpenAI's Responses API as vLLM serves it (`POST /v1/responses`;
`vllm/entrypoints/openai/responses/protocol.py`, docs/HTTP.md).

Why it exists: OpenAI's newer clients (the `openai` SDK's `client.responses`, the Agents SDK,
Codex) speak this shape, and vLLM answers it by rendering the conversation as a chat prompt
(`server.http.responses`). The fields, defaults and checks are vLLM's: `store` true and
`background` false by default, `background` only with `store`, no `prompt` templates, a
non-empty `cache_salt`, not both `previous_input_messages` and `previous_response_id`. Input
items are checked here (pydantic's 400 names the field) and converted one by one: a message
(`type` may be left out, as OpenAI allows), a `function_call`, a `function_call_output`, a
`reasoning` item. Unknown fields are ignored, as vLLM's models leave them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, model_validator


class MessageItem(BaseModel):
    """A message of the conversation: text (or parts: `input_text`, `output_text`,
    `input_image`) from the user, the assistant, the system or the developer."""

    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[dict[str, Any]]
    id: str | None = None
    status: str | None = None


class FunctionCallItem(BaseModel):
    """A call the model made earlier (sent back with its output)."""

    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: str | None = None
    status: str | None = None


class FunctionCallOutputItem(BaseModel):
    """The result of a call, for the model to read."""

    type: Literal["function_call_output"]
    call_id: str
    output: str | list[dict[str, Any]]
    id: str | None = None
    status: str | None = None


class ReasoningItem(BaseModel):
    """A reasoning item of an earlier answer (its text goes back as the assistant's
    `reasoning`, as vLLM sends it; encrypted content is refused, as vLLM refuses it)."""

    type: Literal["reasoning"]
    id: str | None = None
    summary: list[dict[str, Any]] = Field(default_factory=list)
    content: list[dict[str, Any]] | None = None
    encrypted_content: str | None = None
    status: str | None = None


InputItem = Annotated[MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem,
                      Field(discriminator="type")]


class FunctionTool(BaseModel):
    """A function the model may call (the Responses API's flat shape)."""

    type: Literal["function"]
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class TextFormat(BaseModel):
    """`text.format`: plain text, a JSON schema the output must follow, or JSON mode."""

    type: Literal["text", "json_schema", "json_object"]
    name: str | None = None
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    description: str | None = None
    strict: bool | None = None


class TextConfig(BaseModel):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class ResponsesRequest(BaseModel):
    """`POST /v1/responses`, with vLLM's defaults."""

    background: bool | None = False
    include: list[str] | None = None
    input: str | list[InputItem]
    instructions: str | None = None
    max_output_tokens: int | None = None
    max_tool_calls: int | None = None
    metadata: dict[str, str] | None = None
    model: str | None = None
    parallel_tool_calls: bool | None = True
    previous_response_id: str | None = None
    prompt: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] = "auto"
    store: bool | None = True
    stream: bool | None = False
    temperature: float | None = None
    text: TextConfig | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] = "auto"
    tools: list[dict[str, Any]] = Field(default_factory=list)
    top_logprobs: int | None = 0
    top_p: float | None = None
    top_k: int | None = None
    truncation: Literal["auto", "disabled"] | None = "disabled"
    user: str | None = None
    # --- vLLM's own ---
    request_id: str | None = None  # the response's id (default: resp_<random hex>, as vLLM)
    priority: int = 0
    cache_salt: str | None = None
    session_id: str | None = None  # as chat's (routes.with_session)
    vllm_xargs: dict[str, str | int | float | list[str | int | float]] | None = None
    previous_input_messages: list[Any] | None = None

    @model_validator(mode="before")
    @classmethod
    def _checks(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        if data.get("background") and not data.get("store", True):
            raise ValueError("background can only be used when `store` is true")
        if data.get("prompt") is not None:
            raise ValueError("prompt template is not supported")
        salt = data.get("cache_salt")
        if salt is not None and (not isinstance(salt, str) or not salt):
            raise ValueError("Parameter 'cache_salt' must be a non-empty string if provided.")
        items = data.get("input")
        if isinstance(items, list):  # a message may leave out its `type` (OpenAI's EasyInput)
            data = {**data, "input": [{**i, "type": "message"} if isinstance(i, dict)
                                      and "type" not in i and "role" in i else i
                                      for i in items]}
        return data

    def logprobs_included(self) -> bool:
        """Whether the answer carries the output's logprobs (`include`, as vLLM reads it)."""
        return "message.output_text.logprobs" in (self.include or ())
