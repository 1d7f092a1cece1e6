"""TensorRT-LLM's `speculative_config` (a key of trtllm-serve's `--config` YAML) as the pod's
`speculative_config` (devices/speculative.py).

TensorRT-LLM (`tensorrt_llm/llmapi/llm_args.py` at `0004396`, as docs/TRTLLM_SERVE.md names it:
`DecodingBaseConfig` and its subclasses) picks the algorithm by `decoding_type` and
drafts `max_draft_len` tokens per step. Emulated, as the engines catalogue's
`speculative_methods` have them:

- `Eagle3` (and `Eagle`): a draft head on the target's hidden states (`speculative_model`
  required, TensorRT-LLM's "Draft model must be provided for EAGLE"), `max_draft_len` drafts;
- `MTP`: the model's own multi-token-prediction layer; `max_draft_len` (the deprecated
  `num_nextn_predict_layers` is its alias, with TensorRT-LLM's warning), default the
  checkpoint's number of MTP layers;
- either a chain, or with `use_dynamic_tree` (EAGLE-2's dynamic tree) `dynamic_tree_max_topK`
  branches per draft layer and `max_total_draft_tokens` (default topK x max_draft_len, at most
  that, at least max_draft_len) verified at once.

doppelchip runs no draft model, so the chance a draft is accepted is a parameter of its own in
the same mapping: `acceptance_rate` (or `acceptance_length` with `acceptance_method`), as
`--speculative-config` takes it. The other algorithms (NGram, Draft_Target, Medusa, PARD,
DFlash, SA, AUTO, ...) are refused (their drafters are not in the catalogue), as are a static
tree (`eagle_choices`, deprecated) and an unknown `decoding_type`; what changes the schedule
but is not emulated (`max_concurrency`, `draft_len_schedule`, an acceptance-length cut-off,
`sa_config`) is accepted with a warning; loading and sampling details change nothing.

Why a module of its own: the YAML merge (trtllm_config.py) and the pod's flags
(cmd_trtllm.py) should not carry one algorithm family's rules.
"""

from __future__ import annotations

import json
from typing import Any

from devices.model import ModelSpec
from devices.speculative import SpeculativeConfig

EMULATED = {"eagle": "eagle", "eagle3": "eagle3", "mtp": "mtp"}  # decoding_type -> method
# TensorRT-LLM's other decoding types (its discriminated union), refused by name
OTHERS = ("Medusa", "SaveState", "User_Provided", "NGram", "SA", "Draft_Target", "PARD",
          "DFlash", "AUTO")
ACCEPTANCE = ("acceptance_rate", "acceptance_length", "acceptance_method")  # doppelchip's keys
SILENT = frozenset({  # loading and sampling: nothing the timeline shows changes
    "decoding_type", "max_draft_len", "max_total_draft_tokens", "speculative_model",
    "speculative_model_dir", "load_format", "use_rejection_sampling",
    "allow_advanced_sampling", "eagle3_one_model", "eagle3_layers_to_capture",
    "eagle3_model_arch", "greedy_sampling", "posterior_threshold", "num_eagle_layers",
    "max_non_leaves_per_layer", "use_dynamic_tree", "dynamic_tree_max_topK",
    "use_relaxed_acceptance_for_thinking", "relaxed_topk", "relaxed_delta", "use_mtp_vanilla",
    "mtp_eagle_one_model", "begin_thinking_phase_token", "end_thinking_phase_token",
    "num_nextn_predict_layers", *ACCEPTANCE})
WARNED = ("max_concurrency", "draft_len_schedule", "acceptance_window",
          "acceptance_length_threshold", "sa_config")  # the schedule changes, not emulated


def speculative_config(value: Any, where: str, model: ModelSpec
                       ) -> tuple[str | None, list[str]]:
    """(the pod's `--speculative-config` JSON, warnings) for the YAML's `speculative_config`
    (`where` names it in messages; None or an empty mapping: no speculation); ValueError for
    one TensorRT-LLM would refuse or doppelchip cannot emulate."""
    if value is None or value == {}:
        return None, []
    if not isinstance(value, dict):
        raise ValueError(f"{where} must be a mapping")
    kind = value.get("decoding_type")
    if not isinstance(kind, str):
        raise ValueError(f"{where}: decoding_type is required (Eagle3, MTP, ...): it picks "
                         "the algorithm")
    method = EMULATED.get(kind.lower())
    if method is None:
        known = kind in OTHERS
        raise ValueError(f"{where}: decoding_type {kind}: "
                         + ("not emulated (its drafter is not in the catalogue); "
                            if known else "not a TensorRT-LLM decoding type; ")
                         + "emulated: Eagle3, Eagle, MTP")
    config: dict[str, Any] = {"method": method, **_acceptance(value, where)}
    config.update(_mtp(value, where, model) if method == "mtp" else _eagle(value, where))
    draft = value.get("speculative_model", value.get("speculative_model_dir"))
    if draft is not None:
        config["model"] = str(draft)
    try:
        SpeculativeConfig.parse(config)  # (the acceptance values checked)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    warnings = _warnings(value, where)
    return json.dumps(config, separators=(",", ":")), warnings


def _acceptance(value: dict[str, Any], where: str) -> dict[str, Any]:
    given = {k: value[k] for k in ACCEPTANCE if k in value}
    if "acceptance_rate" not in given and "acceptance_length" not in given:
        raise ValueError(f"{where}: add doppelchip's acceptance_rate (the chance each draft is "
                         "accepted, e.g. 0.7) or acceptance_length: doppelchip runs no draft "
                         "model (docs/TRTLLM_SERVE.md)")
    return given


def _draft_len(n: Any, where: str, name: str) -> int | None:
    """A draft length as given (None: not given); ValueError unless a positive integer."""
    if n is None:
        return None
    if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
        raise ValueError(f"{where}: max_draft_len must be > 0 for {name} (got {n!r})")
    return n


def _eagle(value: dict[str, Any], where: str) -> dict[str, Any]:
    """An EAGLE chain or dynamic tree: TensorRT-LLM's `validate_eagle_config` checks."""
    steps = _draft_len(value.get("max_draft_len"), where, "Eagle")
    if steps is None:
        raise ValueError(f"{where}: max_draft_len must be > 0 for Eagle")
    if value.get("speculative_model", value.get("speculative_model_dir")) is None:
        raise ValueError(f"{where}: Draft model must be provided for EAGLE (speculative_model)")
    if value.get("eagle_choices") is not None:
        raise ValueError(f"{where}: eagle_choices: a static tree is not emulated (TensorRT-LLM "
                         "deprecates it); use use_dynamic_tree with dynamic_tree_max_topK")
    return _tree(value, where, steps, "dynamic_tree_max_topK should be provided, which "
                 "indicates the number of nodes to expand each time")


def _mtp(value: dict[str, Any], where: str, model: ModelSpec) -> dict[str, Any]:
    """MTP's draft length: max_draft_len, else the deprecated num_nextn_predict_layers, else
    the checkpoint's MTP layers (TensorRT-LLM reads them from the model's config); a chain, or
    a dynamic tree as EAGLE's."""
    steps = _draft_len(value.get("max_draft_len", value.get("num_nextn_predict_layers")),
                       where, "MTP")
    if steps is None and value.get("use_dynamic_tree"):
        raise ValueError(f"{where}: max_draft_len must be set when use_dynamic_tree is True")
    if steps is None:
        steps = model.mtp_layers
    if not steps:
        raise ValueError(f"{where}: decoding_type MTP: {model.name} has no multi-token-"
                         "prediction layer")
    return _tree(value, where, steps,
                 "dynamic_tree_max_topK must be > 0 when use_dynamic_tree is True")


def _tree(value: dict[str, Any], where: str, steps: int, no_topk: str) -> dict[str, Any]:
    """`steps` drafts a step: a chain, or with `use_dynamic_tree` (only then: a topK alone is
    ignored, with TensorRT-LLM's warning) `dynamic_tree_max_topK` branches per draft layer and
    `max_total_draft_tokens` drafts verified (default topK x steps, within [steps, that])."""
    out: dict[str, Any] = {"num_speculative_tokens": steps}
    if not value.get("use_dynamic_tree"):
        return out
    topk = value.get("dynamic_tree_max_topK")
    if isinstance(topk, bool) or not isinstance(topk, int) or topk <= 0:
        raise ValueError(f"{where}: {no_topk}")
    total = value.get("max_total_draft_tokens", topk * steps)
    if isinstance(total, bool) or not isinstance(total, int) or not steps <= total <= topk * steps:
        raise ValueError(f"{where}: max_total_draft_tokens ({total}) must be in [max_draft_len "
                         f"({steps}), dynamic_tree_max_topK * max_draft_len ({topk * steps})]")
    return {**out, "eagle_topk": topk, "num_draft_tokens": total + 1}


def _warnings(value: dict[str, Any], where: str) -> list[str]:
    out = []
    if value.get("dynamic_tree_max_topK") is not None and not value.get("use_dynamic_tree"):
        out.append("dynamic_tree_max_topK is set but use_dynamic_tree is False; ignoring "
                   "dynamic_tree_max_topK and using the linear draft path.")  # TensorRT-LLM's
    if "num_nextn_predict_layers" in value:  # TensorRT-LLM's own warning
        out.append("MTPDecodingConfig: 'num_nextn_predict_layers' is deprecated and will be "
                   "removed in a future release. Use 'max_draft_len' instead.")
    unemulated = [k for k in value if k in WARNED or (k not in SILENT and k != "eagle_choices")]
    if unemulated:
        out.append(f"{where}: {', '.join(map(str, unemulated))}: accepted but not emulated: "
                   f"{'it changes' if len(unemulated) == 1 else 'they change'} nothing here "
                   "(speculation runs at every batch size, every draft length fixed)")
    return out
