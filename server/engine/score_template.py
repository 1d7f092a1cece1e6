"""vLLM's `--chat-template` for a cross-encoder: the template its `/score` and `/rerank` render
each (query, document) pair through (vLLM 0.33.0's `CrossEncoderIOProcessor.get_score_prompt`).

The template is given as vLLM takes it (`load_chat_template`): a file, or the template itself
when the value has Jinja's characters; a value that looks like a path but cannot be opened is
refused with vLLM's words. A pair is rendered as the messages `[{"role": "query"},
{"role": "document"}]` with the request's `chat_template_kwargs` (its `instruction` among
them), in Jinja's sandbox as Hugging Face renders chat templates. vLLM ships
`examples/pooling/score/template/qwen3_reranker.jinja` for Qwen3-Reranker; doppelchip ships
one at the same path that renders the model card's prompt, so vLLM's documented command runs
from a checkout. Chat and completion prompts render with the packaged tokenizer's own template
(`server.engine.tokenizer`), whatever this flag says.
"""

from __future__ import annotations

import functools
from typing import Any

from server.engine import hf_overrides

QWEN3_RERANKER_TEMPLATE = "examples/pooling/score/template/qwen3_reranker.jinja"  # vLLM's path
JINJA_CHARS = "{}\n"  # vLLM's test: a value with any of them is a template, not a path
RESERVED = frozenset({"chat_template", "tools", "tokenize"})  # kwargs the scorer sets itself


def check(model: str, overrides: str | None, template: str | None) -> str:
    """vLLM's start-up advice for an original Qwen3 reranker served without a template ("":
    none); ValueError when `template` names a file that cannot be read."""
    load(template)
    if template or not hf_overrides.parse(overrides).get("is_original_qwen3_reranker"):
        return ""
    return (f"Serving an original Qwen3 reranker ({model}) without a --chat-template. The "
            "model was trained with a specific prompt template; running without it may "
            "produce inaccurate relevance scores. Consider specifying "
            f"`--chat-template {QWEN3_RERANKER_TEMPLATE}`.")


def load(value: str | None) -> str:
    """The template text ("" when none); ValueError when a path-like value cannot be read."""
    if not value:
        return ""
    try:
        with open(value, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        if not any(c in value for c in JINJA_CHARS):
            raise ValueError(f"The supplied chat template ({value}) looks like a file path, "
                             f"but it failed to be opened. Reason: {e}") from None
    return value


@functools.cache
def _compiled(template: str) -> Any:
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(template)


def render(template: str, query: str, document: str, kwargs: dict[str, Any] | None) -> str:
    """One pair's prompt text; ValueError (vLLM's words) for a reserved kwarg, or a template
    that fails to render."""
    kwargs = dict(kwargs or {})
    if bad := RESERVED & kwargs.keys():
        raise ValueError("chat_template_kwargs contains reserved keys that conflict with fixed "
                         f"scorer arguments: {set(bad)}")
    from jinja2 import TemplateError

    try:
        return _compiled(template).render(
            messages=[{"role": "query", "content": query},
                      {"role": "document", "content": document}],
            add_generation_prompt=False, **kwargs)
    except TemplateError as e:
        raise ValueError(f"the chat template failed to render: {e}") from None
