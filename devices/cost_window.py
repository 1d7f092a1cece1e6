"""The cost of many decode-only steps at once: `plan_cost` in closed form over NumPy arrays.

Why it exists: between batch-changing events, the steps of a virtual run are decode batches
whose every context grows by one token per step. For a decode-only batch without speculation
or a sliding window, `plan_cost` depends on the batch only through its size ``n`` and its
summed context ``S`` (each decode reads ``c`` tokens of KV and attends over ``c + 1``), and is
built from the plan's per-segment constants by additions, products and maxima. `decode_costs`
evaluates the very same expressions, in the same order, elementwise over arrays of ``n`` and
``S`` (one entry per step), leaving out only the terms that are exactly zero (or products by
exactly one), so each entry is the float `step_cost` gives for that step.

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
    """`step_cost` of decode batches of `n` requests whose contexts sum to `ctx` (per step).

    `step_cost`'s expressions in its order, with the terms whose constant is exactly zero
    (a dense model's experts, no sliding layers, no collectives, no launch wait, one
    repeat, one chip) left out rather than added: x + 0.0 and x * 1 are x itself in
    floating point, so each entry is still `step_cost`'s float, at a fraction of the NumPy
    operations (their overhead, not the arithmetic, is the cost at a window's length)."""
    plan = placement.plan
    ranks = plan.ranks
    tokens = n.astype(np.int64)
    ctx_read = ctx.astype(np.float64)
    if ranks != 1:  # the group's step: every rank with a batch like this one
        tokens = tokens * ranks
        ctx_read = ctx_read * ranks
    attn = ctx_read + tokens  # sum of (c + 1): exact, as plan_cost's running float sum
    logits = tokens
    touched = None  # None: exactly zero
    if plan.moe:
        seen = tokens / plan.expert_tokens_div
        touched = np.array([1.0 - (1.0 - plan.moe_k_over_e) ** s for s in seen.tolist()])
    size = len(tokens)
    mem_s = comp_s = over_s = link_s = flops = joules = total = None
    by_tier: dict[str, object] = {}
    for stage in plan.stages:
        t_stage = None
        r = stage.repeat
        for seg in stage.segments:
            tpad = tokens if seg.tile == 1 else -(-tokens // seg.tile) * seg.tile
            mem = seg.dense_s if touched is None or not seg.expert_s else \
                seg.dense_s + seg.expert_s * touched
            mem = mem + seg.kv_s * attn  # attn is ctx_read + tokens
            act = seg.act_s * tokens
            mem = mem + (seg.kv_swa_s * (0.0 + tokens) + act if seg.kv_swa_s else act)
            comp = seg.flop_s * tpad + seg.attn_s * attn
            comp = comp + seg.head_flop_s * logits
            coll = _plus(seg.coll_fixed_s or None,
                         seg.coll_tok_s * tokens if seg.coll_tok_s else None)
            device = _plus(np.maximum(mem, comp) + seg.overhead_s, coll)
            launch_wait = np.maximum(0.0, seg.launch_s - device) if seg.launch_s else None
            mem_bound = mem >= comp
            mem_r, comp_r = _times(mem, r), _times(comp, r)
            mem_s = np.where(mem_bound, _plus(mem_s, mem_r), 0.0 if mem_s is None else mem_s)
            comp_s = np.where(mem_bound, 0.0 if comp_s is None else comp_s, _plus(comp_s, comp_r))
            over_s = _plus(over_s, _times(_plus(seg.overhead_s, launch_wait), r))
            link_s = _plus(link_s, _times(coll, r))
            t_stage = _plus(t_stage, _plus(device, launch_wait))
            chips = seg.tp * r
            f = seg.flops_per_token * tpad + seg.attn_flops_per_unit * attn
            flops = _plus(flops, _times(f + seg.head_flops_per_logit * logits, chips))
            if touched is None or not seg.expert_fraction:
                wscale = (1.0 - seg.expert_fraction) + seg.expert_fraction * 0.0
            else:
                wscale = (1.0 - seg.expert_fraction) + seg.expert_fraction * touched
            for tier, b in seg.weight_bytes:
                by_tier[tier] = _plus(by_tier.get(tier), b * wscale * chips)
            kvb = seg.kv_bytes_per_token * attn + seg.act_bytes_per_token * tokens
            if seg.kv_swa_bytes_per_token:
                kvb = kvb + seg.kv_swa_bytes_per_token * (0.0 + tokens)
            by_tier[seg.kv_tier] = _plus(by_tier.get(seg.kv_tier), _times(kvb, chips))
        total = _plus(total, _times(t_stage, r))
        joules = _plus(joules, _times(t_stage, r) * stage.busy_delta_w)
    if plan.n_hops:
        hop = plan.hop_fixed_s + plan.hop_tok_s * tokens
        total = _plus(total, hop * plan.n_hops)
        link_s = _plus(link_s, hop * plan.n_hops)
    total = _full(total, size)
    joules = _full(_plus(joules, total * plan.idle_w), size)
    dollars = total * plan.usd_per_s
    flops = _full(flops, size)
    if ranks != 1:  # the rank's share, divided as plan_cost divides it (tier by tier)
        joules, dollars, flops = joules / ranks, dollars / ranks, flops / ranks
        by_tier = {tier: b / ranks for tier, b in by_tier.items()}
    moved = None
    for b in by_tier.values():
        moved = _plus(moved, b)
    parts = np.array([_full(x, size) for x in (mem_s, comp_s, over_s, link_s)])
    bound = parts.argmax(axis=0)
    return DecodeCosts(total, joules, dollars, _full(moved, size), flops, bound)


def _plus(a, b):
    """a + b, where None stands for an exact zero (x + 0.0 is x)."""
    if a is None:
        return b
    return a if b is None else a + b


def _times(a, r: int):
    """a * r for a whole repeat or chip count (x * 1 is x)."""
    return a if r == 1 or a is None else a * r


def _full(x, size: int) -> np.ndarray:
    """`x` (None: zero, or a constant) as a float array of one entry per step."""
    if x is None:
        return np.zeros(size)
    if isinstance(x, np.ndarray) and x.shape == (size,):
        return x.astype(np.float64, copy=False)
    return np.full(size, x, np.float64)
