"""The cost of one engine step: a roofline per segment, stage and tier, plus fixed overheads.

``step_cost(placement, batch)`` is pure and cheap (the per-placement constants are in
``placement.plan``): the engine calls it for every step, thousands of times per second of
virtual time. Per segment::

    memory   = dense weights + touched experts + KV read and written + unfused activations
    compute  = linear FLOPs (tokens padded to the MXU tile) + attention + LM head
    device   = max(memory, compute) + kernels × kernel_s + collectives (TP, EP)
    segment  = max(device, host launch time)          (eager engines: launch-bound if tiny)

Sliding-window layers read and attend over at most the window; a speculative step adds its
draft passes (``batch.spec_tokens`` passes of the draft plan over the decodes; a tree's after
the first over ``spec_topk`` rows per decode). A plan of
``ranks`` data-parallel engine cores (``Placement.rank_view``) costs the group's step, every
rank carrying a batch like this one, and reports one rank's share of its FLOPs, bytes, energy
and dollars.
"""

from __future__ import annotations

from dataclasses import dataclass

from devices.deployment import BatchShape
from devices.placed import Placement
from devices.plan import Plan, Segment


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
    ``dollars``: the deployment's price for ``seconds``. ``draft_s``: of ``seconds``, the
    speculative draft passes.
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
    draft_s: float = 0.0

    @property
    def bytes(self) -> float:
        return sum(b for _, b in self.bytes_by_tier)


ZERO = StepCost(0.0, 0.0, (), 0.0, 0.0, 0.0, 0.0, "overhead", (), 0.0, 0.0, 0.0, 0, 0.0)


def _windowed(n: int, s: int, w: int) -> float:
    """Σ_{i=1..n} min(s + i, w): context units of a chunk of n tokens from position s."""
    below = max(0, min(n, w - s))
    return below * s + below * (below + 1) / 2 + (n - below) * w


def step_cost(placement: Placement, batch: BatchShape) -> StepCost:
    """Seconds, bytes, FLOPs, energy and dollars of one step of ``batch`` on ``placement``."""
    plan = placement.plan
    cost = plan_cost(plan, batch)
    if batch.spec_tokens and batch.decode and plan.draft is not None:
        dec, k, topk = batch.decode, batch.spec_tokens, batch.spec_topk
        if topk == 1:  # a chain: every pass drafts one token per decode
            return _with_draft(cost, plan_cost(plan.draft, BatchShape(decode=dec)), k)
        # a tree: the first pass one row per decode, the others topk rows per decode, each
        # attending to its whole context (SGLang's draft decode: bs × topk rows)
        cost = _with_draft(cost, plan_cost(plan.draft, BatchShape(decode=dec)), 1)
        if k > 1:
            wide = BatchShape(decode=tuple(c for c in dec for _ in range(topk)))
            cost = _with_draft(cost, plan_cost(plan.draft, wide), k - 1)
    return cost


def _with_draft(cost: StepCost, draft: StepCost, k: int) -> StepCost:
    """The verification step preceded by ``k`` more sequential passes of the draft model."""
    tiers = dict(cost.bytes_by_tier)
    for t, b in draft.bytes_by_tier:
        tiers[t] = tiers.get(t, 0.0) + k * b
    extra = k * draft.seconds
    return StepCost(
        seconds=cost.seconds + extra, interval_s=cost.interval_s + extra,
        stage_seconds=cost.stage_seconds, memory_s=cost.memory_s + k * draft.memory_s,
        compute_s=cost.compute_s + k * draft.compute_s,
        overhead_s=cost.overhead_s + k * draft.overhead_s, link_s=cost.link_s + k * draft.link_s,
        bound=cost.bound, bytes_by_tier=tuple(tiers.items()), flops=cost.flops + k * draft.flops,
        joules=cost.joules + k * draft.joules, dollars=cost.dollars + k * draft.dollars,
        tokens=cost.tokens, kernels=cost.kernels + k * draft.kernels,
        draft_s=cost.draft_s + extra,
    )


def plan_cost(plan: Plan, batch: BatchShape) -> StepCost:
    """``step_cost`` for one plan (the target model, or a speculative draft pass)."""
    w = plan.window
    q = batch.query_tokens  # per decode: its token and the drafts it verifies
    n_pre = 0
    ctx_read = ctx_swa = attn = attn_swa = 0.0
    both_ways = plan.bidirectional
    for n, s in batch.prefill:
        n_pre += n
        ctx_read += s
        attn += n * (s + n) if both_ways else n * s + n * (n + 1) / 2
        if w:
            ctx_swa += min(s, w)
            attn_swa += _windowed(n, s, w)
    dec = batch.decode
    n_dec = len(dec)
    if w:
        for c in dec:
            ctx_read += c
            attn += q * c + q * (q + 1) / 2
            ctx_swa += min(c, w)
            attn_swa += _windowed(q, c, w)
    elif n_dec:  # every term and partial sum is a whole number below 2^53: exact in any order
        total_c = sum(dec)
        ctx_read += total_c
        attn += q * total_c + n_dec * (q * (q + 1) // 2)
    tokens = n_pre + n_dec * q
    if tokens == 0:
        return ZERO
    logits = n_dec * q + len(batch.prefill)
    ranks = plan.ranks
    if ranks != 1:  # every rank of the group runs a batch like this one (balanced DP)
        tokens *= ranks
        logits *= ranks
        ctx_read *= ranks
        ctx_swa *= ranks
        attn *= ranks
        attn_swa *= ranks
    seen = tokens / plan.expert_tokens_div
    touched = 1.0 - (1.0 - plan.moe_k_over_e) ** seen if plan.moe else 0.0
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
            mem += seg.kv_swa_s * (ctx_swa + tokens) + seg.act_s * tokens
            comp = seg.flop_s * tpad + seg.attn_s * attn + seg.attn_swa_s * attn_swa
            comp += seg.head_flop_s * logits
            coll = seg.coll_fixed_s + seg.coll_tok_s * tokens
            device = max(mem, comp) + seg.overhead_s + coll
            launch_wait = max(0.0, seg.launch_s - device)  # the host cannot keep up
            if mem >= comp:
                mem_s += mem * r
            else:
                comp_s += comp * r
            over_s += (seg.overhead_s + launch_wait) * r
            link_s += coll * r
            t_stage += device + launch_wait
            chips = seg.tp * r
            flops += (
                seg.flops_per_token * tpad + seg.attn_flops_per_unit * (attn + attn_swa)
                + seg.head_flops_per_logit * logits
            ) * chips
            kernels += seg.kernels * r
            wscale = (1.0 - seg.expert_fraction) + seg.expert_fraction * touched
            for tier, b in seg.weight_bytes:
                by_tier[tier] = by_tier.get(tier, 0.0) + b * wscale * chips
            kvb = seg.kv_bytes_per_token * (ctx_read + tokens) + seg.act_bytes_per_token * tokens
            kvb += seg.kv_swa_bytes_per_token * (ctx_swa + tokens)
            by_tier[seg.kv_tier] = by_tier.get(seg.kv_tier, 0.0) + kvb * chips
        stage_seconds.append(t_stage)
        total += t_stage * r
        joules += t_stage * r * stage.busy_delta_w
    hop = plan.hop_fixed_s + plan.hop_tok_s * tokens if plan.n_hops else 0.0
    total += hop * plan.n_hops
    link_s += hop * plan.n_hops
    joules += total * plan.idle_w
    slowest = max(stage_seconds) + hop
    bound, most = "memory", mem_s  # the first of the largest, as max() picks it
    if comp_s > most:
        bound, most = "compute", comp_s
    if over_s > most:
        bound, most = "overhead", over_s
    if link_s > most:
        bound = "link"
    dollars = total * plan.usd_per_s
    if ranks != 1:  # this rank's share of the group's work
        flops /= ranks
        joules /= ranks
        dollars /= ranks
        by_tier = {tier: b / ranks for tier, b in by_tier.items()}
        tokens //= ranks
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
        dollars=dollars,
        tokens=tokens,
        kernels=kernels,
    )
