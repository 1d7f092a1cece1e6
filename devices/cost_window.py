"""The cost of many decode-only steps at once: `plan_cost` in closed form over NumPy arrays.

Why it exists: between batch-changing events, the steps of a virtual run are decode batches
whose every context grows by one token per step. For a decode-only batch without speculation
or a sliding window, `plan_cost` depends on the batch only through its size ``n`` and its
summed context ``S`` (each decode reads ``c`` tokens of KV and attends over ``c + 1``), and is
built from the plan's per-segment constants by additions, products and maxima. `decode_costs`
evaluates the very same expressions, in the same order, elementwise over arrays of ``n`` and
``S`` (one entry per step), so each entry is the float `step_cost` gives for that step.

Contract: `closed_form(placement)` says whether the placement qualifies (one pipeline stage,
no sliding window, no draft model, no prefill offload); `decode_costs` is then exact for
batches of plain decodes (``spec_tokens == 0``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from devices.pipeline import num_stages
from devices.placed import Placement

BOUNDS = ("memory", "compute", "overhead", "link")  # step_cost's order (first maximum wins)


@dataclass(frozen=True)
class DecodeCosts:
    """Per step (arrays of one length): seconds, joules, dollars, bytes moved, FLOPs, and
    the index in `BOUNDS` of what bounds it."""

    seconds: np.ndarray
    joules: np.ndarray
    dollars: np.ndarray
    bytes: np.ndarray
    flops: np.ndarray
    bound: np.ndarray


def closed_form(placement: Placement) -> bool:
    plan = placement.plan
    return (num_stages(placement) == 1 and not plan.window and plan.draft is None
            and not plan.offload_min_tokens)


def decode_costs(placement: Placement, n: np.ndarray, ctx: np.ndarray) -> DecodeCosts:
    """`step_cost` of decode batches of `n` requests whose contexts sum to `ctx` (per step)."""
    plan = placement.plan
    tokens = n.astype(np.int64)
    ctx_read = ctx.astype(np.float64)
    attn = ctx_read + tokens  # sum of (c + 1): exact, as plan_cost's running float sum
    logits = tokens
    if plan.moe:
        seen = tokens / plan.expert_tokens_div
        touched = np.array([1.0 - (1.0 - plan.moe_k_over_e) ** s for s in seen.tolist()])
    else:
        touched = np.zeros(len(tokens))
    zeros = np.zeros(len(tokens))
    mem_s, comp_s, over_s, link_s = zeros.copy(), zeros.copy(), zeros.copy(), zeros.copy()
    flops, joules, total = zeros.copy(), zeros.copy(), zeros.copy()
    by_tier: dict[str, np.ndarray] = {}
    for stage in plan.stages:
        t_stage = zeros.copy()
        r = stage.repeat
        for seg in stage.segments:
            tpad = -(-tokens // seg.tile) * seg.tile
            mem = seg.dense_s + seg.expert_s * touched + seg.kv_s * (ctx_read + tokens)
            mem = mem + (seg.kv_swa_s * (0.0 + tokens) + seg.act_s * tokens)
            comp = seg.flop_s * tpad + seg.attn_s * attn + seg.attn_swa_s * 0.0
            comp = comp + seg.head_flop_s * logits
            coll = seg.coll_fixed_s + seg.coll_tok_s * tokens
            device = np.maximum(mem, comp) + seg.overhead_s + coll
            launch_wait = np.maximum(0.0, seg.launch_s - device)
            mem_bound = mem >= comp
            mem_s = np.where(mem_bound, mem_s + mem * r, mem_s)
            comp_s = np.where(mem_bound, comp_s, comp_s + comp * r)
            over_s = over_s + (seg.overhead_s + launch_wait) * r
            link_s = link_s + coll * r
            t_stage = t_stage + (device + launch_wait)
            chips = seg.tp * r
            flops = flops + (seg.flops_per_token * tpad + seg.attn_flops_per_unit * (attn + 0.0)
                             + seg.head_flops_per_logit * logits) * chips
            wscale = (1.0 - seg.expert_fraction) + seg.expert_fraction * touched
            for tier, b in seg.weight_bytes:
                by_tier[tier] = by_tier.get(tier, zeros) + b * wscale * chips
            kvb = seg.kv_bytes_per_token * (ctx_read + tokens) + seg.act_bytes_per_token * tokens
            kvb = kvb + seg.kv_swa_bytes_per_token * (0.0 + tokens)
            by_tier[seg.kv_tier] = by_tier.get(seg.kv_tier, zeros) + kvb * chips
        total = total + t_stage * r
        joules = joules + t_stage * r * stage.busy_delta_w
    if plan.n_hops:
        hop = plan.hop_fixed_s + plan.hop_tok_s * tokens
        total = total + hop * plan.n_hops
        link_s = link_s + hop * plan.n_hops
    joules = joules + total * plan.idle_w
    moved = zeros.copy()
    for b in by_tier.values():
        moved = moved + b
    bound = np.argmax(np.stack([mem_s, comp_s, over_s, link_s]), axis=0)
    return DecodeCosts(total, joules, total * plan.usd_per_s, moved, flops, bound)
