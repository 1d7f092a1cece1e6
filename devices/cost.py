"""The cost of one engine step: a roofline per segment, stage and tier, plus fixed overheads.

``step_cost(placement, batch)`` is pure and cheap (the per-placement constants are in
``placement.plan``): the engine calls it for every step, thousands of times per second of
virtual time.
"""

from __future__ import annotations

from dataclasses import dataclass

from devices.deployment import BatchShape
from devices.placement import Placement
from devices.plan import Segment


@dataclass(frozen=True, slots=True)
class StepCost:
    """Plain data describing what one step costs on the emulated device.

    It exists so that the engine (which knows nothing about chips) can advance its clock by
    ``seconds``, record metrics (bytes per tier, FLOPs, bound, energy, cost) and pace a
    pipeline (``interval_s``) without calling back into the device model.

    ``seconds``: latency of the step through every pipeline stage (and the hops between).
    ``interval_s``: the slowest stage (+ one hop): how soon a pipeline accepts the next
    micro-batch; equals ``seconds`` without pipeline parallelism.
    ``memory_s``/``compute_s``/``overhead_s``/``link_s``: where the time went (summed over
    stages); ``bound`` names the largest ('memory', 'compute', 'overhead', 'link').
    ``bytes_by_tier``: bytes moved per memory tier, all chips together. ``joules``: busy
    power of the working stages plus idle power of the whole deployment for ``seconds``.
    ``dollars``: the deployment's price for ``seconds``.
    """

    seconds: float
    interval_s: float
    stage_seconds: tuple[float, ...]
    memory_s: float
    compute_s: float
    overhead_s: float
    link_s: float
    bound: str
    bytes_by_tier: tuple[tuple[str, float], ...]
    flops: float
    joules: float
    dollars: float
    tokens: int
    kernels: float

    @property
    def bytes(self) -> float:
        return sum(b for _, b in self.bytes_by_tier)


ZERO = StepCost(0.0, 0.0, (), 0.0, 0.0, 0.0, 0.0, "overhead", (), 0.0, 0.0, 0.0, 0, 0.0)


def step_cost(placement: Placement, batch: BatchShape) -> StepCost:
    """Seconds, bytes, FLOPs, energy and dollars of one step of ``batch`` on ``placement``."""
    plan = placement.plan
    n_pre = 0
    ctx_read = 0.0
    attn = 0.0
    for n, s in batch.prefill:
        n_pre += n
        ctx_read += s
        attn += n * s + n * (n + 1) / 2
    dec = batch.decode
    n_dec = len(dec)
    if n_dec:
        c = sum(dec)
        ctx_read += c
        attn += c + n_dec
    tokens = n_pre + n_dec
    if tokens == 0:
        return ZERO
    logits = n_dec + len(batch.prefill)
    touched = 1.0 - (1.0 - plan.moe_k_over_e) ** tokens if plan.moe else 0.0
    offload = plan.offload_min_tokens and tokens >= plan.offload_min_tokens
    mem_s = comp_s = over_s = link_s = 0.0
    flops = kernels = joules = 0.0
    by_tier: dict[str, float] = {}
    stage_seconds = []
    total = 0.0
    for stage in plan.stages:
        t_stage = 0.0
        r = stage.repeat
        for seg0 in stage.segments:
            seg: Segment = seg0.prefill_alt if (offload and seg0.prefill_alt) else seg0
            tpad = -(-tokens // seg.tile) * seg.tile
            mem = seg.dense_s + seg.expert_s * touched + seg.kv_s * (ctx_read + tokens)
            mem += seg.act_s * tokens
            comp = seg.flop_s * tpad + seg.attn_s * attn + seg.head_flop_s * logits
            coll = seg.coll_fixed_s + seg.coll_tok_s * tokens
            if mem >= comp:
                mem_s += mem * r
            else:
                comp_s += comp * r
            over_s += seg.overhead_s * r
            link_s += coll * r
            t_stage += (mem if mem >= comp else comp) + seg.overhead_s + coll
            chips = seg.tp * r
            flops += (
                seg.flops_per_token * tpad + seg.attn_flops_per_unit * attn
                + seg.head_flops_per_logit * logits
            ) * chips
            kernels += seg.kernels * r
            wscale = (1.0 - seg.expert_fraction) + seg.expert_fraction * touched
            for tier, b in seg.weight_bytes:
                by_tier[tier] = by_tier.get(tier, 0.0) + b * wscale * chips
            kvb = (seg.kv_bytes_per_token * (ctx_read + tokens) + seg.act_bytes_per_token * tokens)
            by_tier[seg.kv_tier] = by_tier.get(seg.kv_tier, 0.0) + kvb * chips
        stage_seconds.append(t_stage)
        total += t_stage * r
        joules += t_stage * r * stage.busy_delta_w
    hop = plan.hop_fixed_s + plan.hop_tok_s * tokens if plan.n_hops else 0.0
    total += hop * plan.n_hops
    link_s += hop * plan.n_hops
    joules += total * plan.idle_w
    slowest = max(stage_seconds) + hop
    parts = (("memory", mem_s), ("compute", comp_s), ("overhead", over_s), ("link", link_s))
    bound = max(parts, key=lambda p: p[1])[0]
    return StepCost(
        seconds=total,
        interval_s=min(slowest, total),
        stage_seconds=tuple(stage_seconds),
        memory_s=mem_s,
        compute_s=comp_s,
        overhead_s=over_s,
        link_s=link_s,
        bound=bound,
        bytes_by_tier=tuple(by_tier.items()),
        flops=flops,
        joules=joules,
        dollars=total * plan.usd_per_s,
        tokens=tokens,
        kernels=kernels,
    )
