"""vLLM's `--hf-overrides` (config.json keys a deployment overrides, a JSON object) and
`--runner`/`--convert`: what the deployment serves.

Emulated keys:
- `is_matryoshka`, `matryoshka_dimensions`: an embedding model is Matryoshka, as vLLM's
  `ModelConfig.is_matryoshka` reads them (a non-empty `matryoshka_dimensions`, or
  `is_matryoshka`): a request's `dimensions` is accepted (within the listed ones, when
  listed). vLLM's docs give `'{"is_matryoshka": true}'` for Qwen3-Embedding, whose card
  describes MRL but whose config.json does not declare it.
- `architectures`, `classifier_from_token`, `method`, `is_original_qwen3_reranker`: a
  generative checkpoint served as a sequence classifier (`conversion`), as vLLM's docs serve
  Qwen3-Reranker: `'{"architectures": ["Qwen3ForSequenceClassification"],
  "classifier_from_token": ["no", "yes"], "is_original_qwen3_reranker": true}'`.
Other keys change nothing here (`vllm serve` warns that they are not emulated).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from devices.hf_config import classifies

EMULATED = ("is_matryoshka", "matryoshka_dimensions", "architectures", "classifier_from_token",
            "method", "is_original_qwen3_reranker", "use_sep_token")
# vLLM's SEQ_CLS_LOAD_METHODS (model_executor/models/adapters.py): how the score head is made
# from LM-head rows: the difference of 2 rows (one label), or N rows as they are (N labels)
METHODS = ("from_2_way_softmax", "no_post_processing")


def parse(text: str | None) -> dict[str, Any]:
    """The overrides as a dict ({} when none); ValueError naming the flag when not an object,
    or when an emulated key has the wrong type."""
    if not text:
        return {}
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise ValueError(f"--hf-overrides: not JSON ({e})") from None
    if not isinstance(doc, dict):
        raise ValueError("--hf-overrides: a JSON object of config.json keys")
    dims = doc.get("matryoshka_dimensions")
    if dims is not None and not (isinstance(dims, list) and all(
            isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in dims)):
        raise ValueError("--hf-overrides: matryoshka_dimensions is a list of positive ints")
    for key in ("is_matryoshka", "use_sep_token"):
        if not isinstance(doc.get(key, False), bool):
            raise ValueError(f"--hf-overrides: {key} is true or false")
    for key in ("architectures", "classifier_from_token"):
        value = doc.get(key)
        if value is not None and not (isinstance(value, list)
                                      and all(isinstance(v, str) for v in value)):
            raise ValueError(f"--hf-overrides: {key} is a list of strings")
    if doc.get("method") is not None and doc["method"] not in METHODS:
        raise ValueError(f"--hf-overrides: method {doc['method']!r} not supported (vLLM's: "
                         f"{', '.join(METHODS)})")
    return doc


@dataclass(frozen=True)
class Conversion:
    """How a checkpoint is served: as it is (`task` ""), or converted by vLLM's pooling
    runner into an embedding model ("embed") or a classifier of `num_labels` ("classify")."""

    task: str = ""
    num_labels: int = 0


def conversion(text: str | None, runner: str | None, convert: str | None, name: str,
               native: str) -> Conversion:
    """What vLLM serves for these flags (ValueError, in its terms, when it would not start).

    `native`: the checkpoint's own pooling task ("embed", "classify"; "" for a generative
    one), `name` its name.
    As vLLM's `ModelConfig`: `--runner auto` is `pooling` when `--convert` asks for a
    conversion or an overridden architecture is a classifier; `--convert auto` is then
    `classify` for such an architecture, else `embed`. A classifier needs a score head: a
    generative checkpoint has none, so vLLM builds it from the LM-head rows of
    `classifier_from_token` by `method` (`is_original_qwen3_reranker` sets `from_2_way_softmax`,
    as vLLM's `Qwen3ForSequenceClassificationConfig`): one label from two tokens, or one per
    token."""
    doc = parse(text)
    pooling = bool(native)
    runner, convert = runner or "auto", convert or "auto"
    arch = "classify" if classifies(doc.get("architectures")) else ""
    if runner == "auto":
        runner = "pooling" if pooling or arch or convert not in ("auto", "none") else "generate"
    if runner == "draft":
        raise ValueError("--runner draft: a speculative draft model's runner is not emulated "
                         "(--speculative-config gives a deployment its drafts)")
    if runner == "generate":
        if pooling or arch:
            raise ValueError(f"--runner generate: {name} is served as a pooling model (no LM "
                             "head); vLLM serves it with --runner pooling")
        if convert not in ("auto", "none"):
            raise ValueError(f"--convert {convert} needs --runner pooling")
        return Conversion()
    if convert == "auto":
        convert = arch or ("none" if pooling else "embed")
    if pooling:
        if convert not in ("none", native):
            kind = "a classifier" if native == "classify" else "an embedding model"
            raise ValueError(f"--convert {convert}: {name} is {kind}; serve it with --convert "
                             f"{native} (or none)")
        return Conversion()
    if convert == "none":
        raise ValueError(f"--runner pooling --convert none: {name} is a generative model; "
                         "serve it with --convert embed or classify")
    if convert == "embed":
        return Conversion("embed")
    return Conversion("classify", _labels(doc, name))


def _labels(doc: dict[str, Any], name: str) -> int:
    """The score head's rows (vLLM's `SequenceClassificationConfig` and loader)."""
    method = doc.get("method") or ("from_2_way_softmax" if doc.get("is_original_qwen3_reranker")
                                   else None)
    tokens = doc.get("classifier_from_token")
    if method is None or not tokens:
        raise ValueError(f"--convert classify: {name}'s checkpoint has no classifier (score) "
                         "weights; vLLM builds them from LM-head rows given --hf-overrides "
                         "classifier_from_token and method (or is_original_qwen3_reranker)")
    if method == "from_2_way_softmax":
        if len(tokens) != 2:
            raise ValueError("--hf-overrides: from_2_way_softmax takes 2 classifier_from_token "
                             f"(got {len(tokens)})")
        return 1
    return len(tokens)


def use_sep_token(text: str | None, converted: bool) -> bool:
    """Whether a cross-encoder's pair is tokenized as a pair, with the tokenizer's separator
    (vLLM's `ModelConfig.use_sep_token`: config.json's, true by default; a language model
    converted into a reranker defaults to false, `as_seq_cls_model`, and takes the texts back to
    back)."""
    return bool(parse(text).get("use_sep_token", not converted))


def matryoshka(text: str | None, declared: bool) -> tuple[bool, tuple[int, ...]]:
    """(whether `dimensions` may be asked, the dimensions allowed — () for any), given what
    the model's own config.json `declared`."""
    doc = parse(text)
    dims = tuple(doc.get("matryoshka_dimensions") or ())
    return bool(dims) or bool(doc.get("is_matryoshka", declared)), dims
