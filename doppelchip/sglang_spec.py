"""SGLang 0.5.23's speculative decoding flags, as `doppelchip sglang serve` translates them into
the deployment's `speculative_config` (devices/speculative.py), following SGLang's resolution
(`sglang/srt/arg_groups/speculative_hook.py`, read, not copied).

What SGLang does, and what is emulated:
- `--speculative-algorithm` is upper-cased. EAGLE and EAGLE3 run a draft head
  (`--speculative-draft-model-path`); NEXTN, and EAGLE without a draft on a model that ships
  multi-token-prediction layers (SGLang's DeepSeek rule: the draft is the model itself), run
  the model's own MTP layer. Other algorithms (STANDALONE, NGRAM, DFLASH, ...) are refused.
- Without `--speculative-num-steps`, SGLang picks (steps, topk, draft tokens) by the model's
  architecture (`_auto_choose_speculative_params`: Llama and Grok (5, 4, 8), others (3, 1, 4));
  giving topk or draft tokens without steps is its assertion error.
- With topk 1, SGLang sets the draft tokens to steps + 1 (a chain: `steps` drafts verified per
  step), warning when they differed; no topk is a chain too (NEXTN's). With topk > 1 the draft
  is a tree: each draft step after the first runs topk branches per request and verification
  checks the `--speculative-num-draft-tokens` - 1 best candidates at once (tree attention); a
  tree without draft tokens, or with more than its draft steps score
  (`organize_draft_results`: topk + (steps - 1) × topk² candidates), is refused.
- Without `--max-running-requests`, SGLang caps running requests at 48, with its warning.
- How many drafts are accepted comes from SGLang's own simulation knobs
  (`sglang/srt/speculative/spec_utils.py`): `SGLANG_SIMULATE_ACC_LEN` L, the mean accepted
  length per verification (bonus token included, clamped to [1, steps + 1]), and
  `SGLANG_SIMULATE_ACC_METHOD` (match-expected, its default: every verification step's batch
  accepts ⌊L⌋ or ⌊L⌋ + 1 tokens with mean L; multinomial: round(N(L, 1))). doppelchip runs no
  draft model, so without L the pod refuses to start, saying so. They become the deployment's
  `acceptance_length` and `acceptance_method` (devices/speculative.py).
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Mapping

from devices.model import ModelSpec
from devices.speculative import ACCEPTANCE_METHODS, SpeculativeConfig, SpeculativeConfigError

EMULATED = ("EAGLE", "EAGLE3", "NEXTN")
# _auto_choose_speculative_params: these architectures get (5, 4, 8), the rest (3, 1, 4)
WIDE_DEFAULTS = ("LlamaForCausalLM", "Grok1ForCausalLM", "Grok1VForCausalLM")
MAX_RUNNING = 48  # SGLang's cap on running requests under speculative decoding
ENV = "SGLANG_SIMULATE_ACC_LEN"
METHOD_ENV = "SGLANG_SIMULATE_ACC_METHOD"


def speculative_config(args: argparse.Namespace, model: ModelSpec
                       ) -> tuple[str | None, list[str]]:
    """The deployment's `speculative_config` JSON (None: no speculation) and SGLang's start-up
    warnings; ValueError says what cannot be served."""
    if args.speculative_algorithm is None:
        return None, []
    algorithm = args.speculative_algorithm.upper()
    if algorithm not in EMULATED:
        raise ValueError(f"--speculative-algorithm {algorithm}: emulated are "
                         f"{', '.join(EMULATED)} (NEXTN: the model's MTP layer)")
    draft = args.speculative_draft_model_path
    if algorithm == "NEXTN" or (algorithm == "EAGLE" and draft is None and model.mtp_layers):
        method = "mtp"
    elif draft is None:
        raise ValueError(f"--speculative-algorithm {algorithm} needs "
                         "--speculative-draft-model-path (the draft head's checkpoint)")
    else:
        method = algorithm.lower()
    if method == "mtp" and not model.mtp_layers:
        raise ValueError(f"--speculative-algorithm {algorithm}: {model.name} has no "
                         "multi-token-prediction layer")
    steps, topk, tokens = args.speculative_num_steps, args.speculative_eagle_topk, \
        args.speculative_num_draft_tokens
    chosen = ""
    if steps is None:
        if topk is not None or tokens is not None:  # SGLang's bare assertion
            raise ValueError("--speculative-eagle-topk and --speculative-num-draft-tokens need "
                             "--speculative-num-steps (SGLang asserts it)")
        steps, topk, tokens = (5, 4, 8) if model.architecture in WIDE_DEFAULTS else (3, 1, 4)
        chosen = f" (SGLang's default for {model.architecture or model.name}: {steps} steps, " \
                 f"topk {topk}, {tokens} draft tokens)"
    if steps < 1:
        raise ValueError(f"--speculative-num-steps {steps}: at least one draft step")
    if topk is not None and topk < 1:
        raise ValueError(f"--speculative-eagle-topk {topk}: at least one branch")
    warnings = []
    if topk == 1 and tokens != steps + 1:  # (topk None: a chain too, left as given)
        warnings.append("speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 "
                        "when speculative_eagle_topk == 1")
    if args.max_running_requests is None:
        warnings.append("Max running requests is reset to 48 for speculative decoding. You can "
                        "override this by explicitly setting --max-running-requests.")
    config = {"method": method, "num_speculative_tokens": steps, **acceptance(os.environ)}
    if topk is not None and topk > 1:  # a tree
        if tokens is None:
            raise ValueError(f"--speculative-eagle-topk {topk}{chosen}: a tree needs "
                             "--speculative-num-draft-tokens (the tokens verified per step)")
        config.update(eagle_topk=topk, num_draft_tokens=tokens)
    if draft is not None and method != "mtp":
        config["model"] = draft
    try:
        SpeculativeConfig.parse(dict(config))  # (a tree's draft tokens checked)
    except SpeculativeConfigError as e:
        raise ValueError(f"--speculative-num-draft-tokens {tokens}{chosen}: {e}") from None
    return json.dumps(config), warnings


def acceptance(env: Mapping[str, str]) -> dict[str, float | str]:
    """`acceptance_length` and `acceptance_method` from SGLANG_SIMULATE_ACC_LEN and
    SGLANG_SIMULATE_ACC_METHOD (ValueError when the length is missing or not positive:
    SGLang's "off" needs a real draft model)."""
    simulated = env.get(ENV)
    try:
        length = float(simulated) if simulated is not None else -1.0
    except ValueError:
        raise ValueError(f"{ENV}={simulated!r} is not a number") from None
    if length <= 0:  # SGLang's "off"
        raise ValueError(f"speculative decoding needs {ENV}=L (SGLang's simulated acceptance "
                         "length: tokens per verification step, bonus included): doppelchip "
                         "runs no draft model")
    method = env.get(METHOD_ENV, "match-expected")
    if method not in ACCEPTANCE_METHODS:
        raise ValueError(f"Invalid simulate_acc_method: {method}")  # (SGLang's words)
    return {"acceptance_length": length, "acceptance_method": method}
