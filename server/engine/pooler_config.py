"""vLLM's `--pooler-config`: how a pooling model pools, and its requests' pooling defaults.

Followed: vLLM 0.33.0 `vllm/config/pooler.py` (`PoolerConfig`: its fields, extra fields
forbidden, its validation and its words), `vllm/config/model.py` (`is_prefix_caching_supported`
and `is_chunked_prefill_supported`: a causal model pooled by MEAN or CLS, or STEP token
pooling, supports neither), `vllm/pooling_params.py` (`_merge_default_parameters`: a request
that leaves `dimensions` or `use_activation` unset takes the config's) and
`model_executor/layers/pooler/seqwise/heads.py` (a classifier's logits calibrated as
activation((logit − logit_mean) / logit_sigma)).

Emulated: `pooling_type` / `seq_pooling_type` (what the scheduler may cache and chunk),
`use_activation` and `dimensions` (request defaults), `logit_mean` and `logit_sigma`, and
`task` (it must be the task the model serves). The other fields are accepted and named as not
emulated (`ignored`): they change answers doppelchip does not compute (token pooling, long
inputs chunked and averaged, reward models' step tags).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from server.engine.json_config import json_object

SEQ_POOLING_TYPES = ("CLS", "LAST", "MEAN")
TOK_POOLING_TYPES = ("ALL", "STEP")
EMULATED = ("task", "pooling_type", "seq_pooling_type", "use_activation", "dimensions",
            "logit_mean", "logit_sigma")
NOT_EMULATED = ("tok_pooling_type", "enable_flash_late_interaction", "enable_chunked_processing",
                "max_embed_len", "step_tag_id", "returned_token_ids")
REMOVED_TASKS = {"score": "`score` task was removed; use `classify` instead.",
                 "encode": "`encode` task was removed; use `token_embed` or `token_classify` "
                           "instead."}


@dataclass(frozen=True)
class PoolerOptions:
    """The parsed config (None: not given, the model's or the pooler's default)."""

    seq_pooling_type: str | None = None
    tok_pooling_type: str | None = None
    task: str | None = None
    use_activation: bool | None = None
    dimensions: int | None = None
    logit_mean: float | None = None
    logit_sigma: float | None = None
    ignored: tuple[str, ...] = ()  # fields given that change nothing here

    def pooling_type(self, model_default: str) -> str:
        """The sequence pooling the model runs with (its own unless given)."""
        return self.seq_pooling_type or model_default

    def caches_and_chunks(self, model_default: str) -> bool:
        """Whether a causal pooling model may keep its prefix cache and chunk its prefill:
        not when it pools by MEAN or CLS (every token's state counts) or by STEP."""
        return (self.pooling_type(model_default) not in ("MEAN", "CLS")
                and self.tok_pooling_type != "STEP")


def _number(doc: dict[str, Any], key: str, kind: type | tuple[type, ...]) -> None:
    value = doc.get(key)
    if value is not None and (isinstance(value, bool) or not isinstance(value, kind)):
        raise ValueError(f"--pooler-config: {key} must be a number, got {value!r}")


def parse(text: str | None) -> PoolerOptions:
    """The config (PoolerOptions() when none); ValueError, in vLLM's words where it has them."""
    if not text:
        return PoolerOptions()
    doc = json_object(text, "--pooler-config", (*EMULATED, *NOT_EMULATED, "normalize"))
    if "normalize" in doc:
        raise ValueError("Parameter `normalize` was removed; use `use_activation` instead.")
    task = doc.get("task")
    if isinstance(task, str) and task in REMOVED_TASKS:
        raise ValueError(REMOVED_TASKS[task])
    pooling, seq = doc.get("pooling_type"), doc.get("seq_pooling_type")
    for key, allowed in (("pooling_type", SEQ_POOLING_TYPES + TOK_POOLING_TYPES),
                         ("seq_pooling_type", SEQ_POOLING_TYPES),
                         ("tok_pooling_type", TOK_POOLING_TYPES)):
        if doc.get(key) is not None and doc[key] not in allowed:
            raise ValueError(f"--pooler-config: {key} {doc[key]!r} is not one of "
                             f"{', '.join(allowed)}")
    tok = doc.get("tok_pooling_type")
    if pooling is not None:
        if seq is not None:
            raise ValueError("Cannot set both `pooling_type` and `seq_pooling_type`")
        if tok is not None:
            raise ValueError("Cannot set both `pooling_type` and `tok_pooling_type`")
        seq, tok = (pooling, None) if pooling in SEQ_POOLING_TYPES else (None, pooling)
    if doc.get("use_activation") is not None and not isinstance(doc["use_activation"], bool):
        raise ValueError("--pooler-config: use_activation is true or false")
    dims = doc.get("dimensions")
    if dims is not None and (isinstance(dims, bool) or not isinstance(dims, int) or dims < 1):
        raise ValueError(f"--pooler-config: dimensions must be a positive int, got {dims!r}")
    for key in ("logit_mean", "logit_sigma"):
        _number(doc, key, (int, float))
    if doc.get("logit_sigma") == 0:
        raise ValueError("logit_sigma cannot be 0 (division by zero)")
    return PoolerOptions(
        seq_pooling_type=seq, tok_pooling_type=tok, task=task,
        use_activation=doc.get("use_activation"), dimensions=dims,
        logit_mean=doc.get("logit_mean"), logit_sigma=doc.get("logit_sigma"),
        ignored=tuple(k for k in NOT_EMULATED
                      if (tok if k == "tok_pooling_type" else doc.get(k)) is not None))


def check_task(options: PoolerOptions, served: str) -> None:
    """vLLM's start-up refusal of a `task` the model does not serve (`get_pooling_task`);
    token-level tasks are not emulated."""
    if options.task is None or options.task == served:
        return
    if options.task in ("token_embed", "token_classify", "plugin", "embed&token_classify"):
        raise ValueError(f"--pooler-config: task {options.task!r}: token-level pooling is not "
                         "emulated")
    raise ValueError(f"Unsupported task: {options.task!r} Supported tasks: ({served!r},)")


def problems(text: str | None, task: str) -> list[str]:
    """`--pooler-config` checked against the task the model is served for ("" when it
    generates): ValueError, in vLLM's words, when vLLM would not start with it; else what it
    asks that changes nothing here (each a warning)."""
    options = parse(text)
    if not text:
        return []
    if not task:
        return ["--pooler-config is ignored: the model is served by the generate runner"]
    check_task(options, task)
    return [f"--pooler-config: {', '.join(options.ignored)} accepted but not emulated (only "
            f"{', '.join(EMULATED)} change anything here)"] if options.ignored else []
