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
  step), warning when they differed; no topk is a chain too (NEXTN's). A tree (topk > 1:
  `num_draft_tokens` candidates in a tree verified at once) is refused: the cost model prices
  chains only (pass `--speculative-eagle-topk 1`).
- Without `--max-running-requests`, SGLang caps running requests at 48, with its warning.
- How often a draft is accepted comes from SGLang's own simulation knob,
  `SGLANG_SIMULATE_ACC_LEN` (the mean accepted length per verification, bonus token included,
  in [1, steps + 1]): doppelchip runs no draft model. The per-position acceptance rate r is the
  one whose chain gives that mean (1 + r + ... + r^steps = L). Without it the pod refuses to
  start, saying so.
"""

from __future__ import annotations

import argparse
import json
import os

from devices.model import ModelSpec

EMULATED = ("EAGLE", "EAGLE3", "NEXTN")
# _auto_choose_speculative_params: these architectures get (5, 4, 8), the rest (3, 1, 4)
WIDE_DEFAULTS = ("LlamaForCausalLM", "Grok1ForCausalLM", "Grok1VForCausalLM")
MAX_RUNNING = 48  # SGLang's cap on running requests under speculative decoding
ENV = "SGLANG_SIMULATE_ACC_LEN"


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
    if topk is not None and topk > 1:
        raise ValueError(
            f"--speculative-eagle-topk {topk}{chosen}: tree drafts are not emulated (chains "
            "only); pass --speculative-num-steps N --speculative-eagle-topk 1")
    if steps < 1:
        raise ValueError(f"--speculative-num-steps {steps}: at least one draft step")
    warnings = []
    if topk == 1 and tokens != steps + 1:  # (topk None: a chain too, left as given)
        warnings.append("speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 "
                        "when speculative_eagle_topk == 1")
    if args.max_running_requests is None:
        warnings.append("Max running requests is reset to 48 for speculative decoding. You can "
                        "override this by explicitly setting --max-running-requests.")
    rate = acceptance_rate(steps, os.environ.get(ENV))
    config = {"method": method, "num_speculative_tokens": steps, "acceptance_rate": rate}
    if draft is not None and method != "mtp":
        config["model"] = draft
    return json.dumps(config), warnings


def acceptance_rate(steps: int, simulated: str | None) -> float:
    """The per-position acceptance rate whose chain of `steps` drafts accepts
    `SGLANG_SIMULATE_ACC_LEN` tokens per verification on average (clamped to [1, steps + 1],
    as SGLang clamps it)."""
    try:
        length = float(simulated) if simulated is not None else -1.0
    except ValueError:
        raise ValueError(f"{ENV}={simulated!r} is not a number") from None
    if length <= 0:  # SGLang's "off"
        raise ValueError(f"speculative decoding needs {ENV}=L (SGLang's simulated acceptance "
                         "length: tokens per verification step, bonus included): doppelchip "
                         "runs no draft model")
    lo, hi = 0.0, 1.0  # (a length past [1, steps + 1] ends at a bound: SGLang's clamp)
    for _ in range(60):  # 1 + r + ... + r^steps rises with r: bisect
        mid = (lo + hi) / 2
        if sum(mid**i for i in range(steps + 1)) < length:
            lo = mid
        else:
            hi = mid
    return round((lo + hi) / 2, 12)
