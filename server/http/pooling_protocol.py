"""Request bodies of a pooling model's routes, as vLLM 0.33.0's pydantic models accept them
(`vllm/entrypoints/pooling/{base,embed,pooling,scoring}/protocol.py`).

`/v1/embeddings` and `/pooling` take a completion-style `input` (a string, strings, token ids
or lists of them) or a chat (`messages`, or a list of messages given as `input`); `/score`
takes two sides under any of vLLM's four pairs of names (`queries`/`documents`,
`queries`/`items`, `data_1`/`data_2`, `text_1`/`text_2`), `/rerank` a `query` and its
`documents`. Unknown fields are accepted and ignored (`extra="allow"`). vLLM's removed
parameters are refused with its words: `normalize` (now `use_activation`) and the old `task`
names.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, TypeAdapter, model_validator

from server.http.errors import vllm_invalid
from server.http.protocol import INT64_MAX, INT64_MIN, ChatMessage, OpenAIBase, TokenId

EncodingFormat = Literal["float", "base64", "bytes", "bytes_only"]
EmbedDType = Literal["float32", "float16", "bfloat16", "fp8_e4m3", "fp8_e5m2"]

# vLLM's _REMOVED_POOLING_TASK_MESSAGES (vllm/tasks.py): what an old `task` name is now
_REMOVED_TASKS = {
    "score": "`score` task was removed; use `classify` instead.",
    "encode": "`encode` task was removed; use `token_embed` or `token_classify` instead.",
}


def _removed(data: Any) -> Any:
    """vLLM's `reject_removed_pooling_parameters`."""
    if isinstance(data, dict):
        if "normalize" in data:
            raise vllm_invalid("Parameter `normalize` was removed; use `use_activation` "
                               "instead.", "normalize")
        task = data.get("task")
        if isinstance(task, str) and task in _REMOVED_TASKS:
            raise vllm_invalid(_REMOVED_TASKS[task], "task")
    return data


class PoolingFields(OpenAIBase):
    """vLLM's `PoolingBasicRequestMixin`."""

    model: str | None = None
    user: str | None = None
    truncate_prompt_tokens: Annotated[int, Field(ge=-1)] | None = None
    truncation_side: Literal["left", "right"] | None = None
    request_id: str | None = None
    priority: int = Field(default=0, ge=INT64_MIN, le=INT64_MAX)
    cache_salt: str | None = Field(default=None, min_length=1, max_length=1024)

    @model_validator(mode="before")
    @classmethod
    def _vllm_removed(cls, data: Any) -> Any:
        return _removed(data)


class EmbedFields(PoolingFields):
    """vLLM's `EmbedRequestMixin` (with `EncodingRequestMixin`)."""

    encoding_format: EncodingFormat = "float"
    embed_dtype: EmbedDType = "float32"
    endianness: Literal["native", "big", "little"] = "native"
    dimensions: int | None = None
    use_activation: bool | None = None


class CompletionInput(OpenAIBase):
    """vLLM's `CompletionRequestMixin`: the prompts as text or token ids."""

    input: list[TokenId] | list[list[TokenId]] | str | list[str]
    add_special_tokens: bool = True


class EmbedCompletion(EmbedFields, CompletionInput):
    pass


def _messages_in_input(data: Any) -> Any:
    """vLLM's `EmbeddingChatInputRequest`: a list of chat messages given as `input`."""
    if isinstance(data, dict) and "messages" not in data:
        value = data.get("input")
        if isinstance(value, list) and value and all(
                isinstance(m, dict) and isinstance(m.get("role"), str) for m in value):
            return {**data, "messages": value}
    return data


class ChatInput(OpenAIBase):
    """vLLM's `ChatRequestMixin`: one prompt, a chat rendered by the template."""

    messages: list[ChatMessage]
    add_generation_prompt: bool = False
    continue_final_message: bool = False
    add_special_tokens: bool = False

    @model_validator(mode="before")
    @classmethod
    def _vllm_input_messages(cls, data: Any) -> Any:
        data = _messages_in_input(data)
        if isinstance(data, dict) and data.get("continue_final_message") \
                and data.get("add_generation_prompt"):
            raise vllm_invalid("Cannot set both `continue_final_message` and "
                               "`add_generation_prompt` to True.")
        return data


class EmbedChat(EmbedFields, ChatInput):
    pass


class PoolCompletion(EmbedCompletion):
    """`/pooling` (vLLM's `PoolingCompletionRequest`): `task` None is the model's own."""

    task: str | None = None


class PoolChat(EmbedChat):
    task: str | None = None


def _kind(data: Any) -> str:
    """Which body this is: "chat" when it carries messages (`messages`, or an `input` of
    messages), else "completion" (so a bad body's errors name one model's fields)."""
    data = _messages_in_input(data)
    return "chat" if isinstance(data, dict) and "messages" in data else "completion"


def _either(chat: type, completion: type) -> TypeAdapter:
    return TypeAdapter(Annotated[Annotated[chat, Tag("chat")]
                                 | Annotated[completion, Tag("completion")],
                                 Discriminator(_kind)])


EmbeddingRequest = _either(EmbedChat, EmbedCompletion)
PoolingRequest = _either(PoolChat, PoolCompletion)


class ClassifyFields(PoolingFields):
    """vLLM's `ClassifyRequestMixin`."""

    use_activation: bool | None = None


class ClassifyCompletion(ClassifyFields, CompletionInput):
    pass


class ClassifyChat(ClassifyFields, ChatInput):
    pass


ClassificationRequest = _either(ClassifyChat, ClassifyCompletion)


# -- scoring -------------------------------------------------------------------------------------
ScoreInput = str | dict[str, Any]  # a text, or vLLM's ScoreMultiModalParam {"content": [...]}


class ScoringFields(PoolingFields):
    """vLLM's `ScoringRequestMixin`."""

    max_tokens_per_query: int = 0
    max_tokens_per_doc: int = 0
    instruction: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    use_activation: bool | None = None


_SCORE_SIDES = (("queries", "documents"), ("queries", "items"), ("data_1", "data_2"),
                ("text_1", "text_2"))


class ScoreRequest(ScoringFields):
    """`/score`: vLLM's union of four pairs of names, kept as `data_1` / `data_2`."""

    data_1: ScoreInput | list[ScoreInput]
    data_2: ScoreInput | list[ScoreInput]

    @model_validator(mode="before")
    @classmethod
    def _sides(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for a, b in _SCORE_SIDES:
                if a in data and b in data:
                    return {**data, "data_1": data[a], "data_2": data[b]}
        return data


class RerankRequest(ScoringFields):
    query: ScoreInput
    documents: ScoreInput | list[ScoreInput]
    top_n: int = Field(default=0, ge=0)


# -- Cohere's /v2/embed ---------------------------------------------------------------------------
class CohereContent(OpenAIBase):
    type: Literal["text", "image_url"]
    text: str | None = None
    image_url: dict[str, str] | None = None

    @model_validator(mode="after")
    def _payload(self) -> CohereContent:
        if self.type == "text" and self.text is None:
            raise ValueError("CohereEmbedContent with type='text' requires text")
        if self.type == "image_url" and not (self.image_url or {}).get("url"):
            raise ValueError("CohereEmbedContent with type='image_url' requires image_url.url")
        return self


class CohereInput(OpenAIBase):
    content: list[CohereContent]


class CohereEmbedRequest(OpenAIBase):
    """vLLM's `CohereEmbedRequest` (Cohere's v2 Embed API)."""

    model: str | None = None
    input_type: str | None = None
    texts: list[str] | None = None
    images: list[str] | None = None
    inputs: list[CohereInput] | None = None
    output_dimension: int | None = None
    embedding_types: list[Literal["float", "binary", "ubinary", "base64"]] | None = None
    truncate: Literal["NONE", "START", "END"] = "END"
    max_tokens: int | None = None
    priority: int = Field(default=0, ge=INT64_MIN, le=INT64_MAX)

    @model_validator(mode="after")
    def _one_input(self) -> CohereEmbedRequest:
        given = [f for f in (self.texts, self.images, self.inputs) if f is not None]
        if len(given) != 1 or not given[0]:
            raise ValueError("Exactly one of texts, images, or inputs must be provided, and it "
                             "must be non-empty")
        return self

