"""Placement in on-chip SRAM (Groq, Cerebras): weights and KV pipelined over many chips.

A chip holds ``usable_fraction`` of its SRAM. The pipeline is as deep as the model has layers
(or as there are chips, if fewer): with more chips than layers, each stage is one layer spread
over ``n / layers`` chips working on it together (tensor parallel inside the stage, which
costs an all-reduce over the chip-to-chip links); with fewer, each chip is a stage of several
layers. Per token every stage pays its fixed cost (the fitted ``kernel_s`` per program stage)
plus streaming its share of the weights, and every hop between stages the link latency plus
the activation vector over ONE chip-to-chip link (a stage talks to the next over a link, not
the whole fabric). Pipeline depth, not chip count, sets the latency.

``chips_needed`` sizes ``n`` for a batch of sequences of a given context, which is what
``estimate`` and ``whatif`` ask; a default placement holds one sequence of ``max_context``
(8,192 tokens when unset) beside the weights.
"""

from __future__ import annotations

import math

from devices.deployment import DeploymentSpec
from devices.errors import PlacementError
from devices.parallel import Parallelism
from devices.placed import (
    DEFAULT_CONTEXT_SRAM,
    FactorTable,
    Placement,
    attention_fields,
    factors_for,
    gb,
    kv_element_bytes,
    moe_fields,
    read_bytes,
    resident_bytes,
)
from devices.plan import ACT_BYTES, Plan, Stage, make_segment
from devices.specs import ChipSpec, EngineSpec, ModelSpec, QuantSpec


def chips_needed(spec: DeploymentSpec, model: ModelSpec, quant: QuantSpec, chip: ChipSpec,
                 sequences: int, context: int) -> int:
    """SRAM chips that hold the weights plus the KV of ``sequences`` × ``context`` tokens."""
    cap = chip.tier.capacity_bytes * chip.usable_fraction
    kv = model.kv_bytes_for_context(context, kv_element_bytes(spec, quant)) * sequences
    return max(1, math.ceil((resident_bytes(model, quant) + kv) / cap))


def place_sram(spec: DeploymentSpec, model: ModelSpec, quant: QuantSpec, chip: ChipSpec,
               engine: EngineSpec, table: FactorTable) -> Placement:
    if (spec.tp or 1) > 1 or (spec.ep or 1) > 1:
        raise PlacementError(f"{chip.id} pipelines layers over chips: tp and ep do not apply")
    if spec.speculative is not None:
        raise PlacementError(f"{engine.name} does not run speculative decoding")
    f = factors_for(table, engine.id, chip.chip_class)
    cap = chip.tier.capacity_bytes * chip.usable_fraction
    resident = resident_bytes(model, quant)
    kvb = kv_element_bytes(spec, quant)
    ctx = spec.max_context or min(model.max_context, DEFAULT_CONTEXT_SRAM)
    n = spec.count or chips_needed(spec, model, quant, chip, 1, ctx)
    if resident > n * cap:
        raise PlacementError(
            f"{model.name} {quant.id} needs {gb(resident)} of SRAM: at least "
            f"{math.ceil(resident / cap)} × {chip.id} ({gb(cap)} each), not {n}"
        )
    kv_tokens = 0  # an encoder keeps no KV cache: the weights alone size the chips
    if model.holds_kv:
        kv_tokens = int((n * cap - resident) // model.kv_bytes_per_context_token(ctx, kvb))
    if model.holds_kv and (kv_tokens < 16 or (spec.max_context and kv_tokens < spec.max_context)):
        raise PlacementError(
            f"{n} × {chip.id} hold the weights but only {kv_tokens} tokens of KV; add chips"
        )
    rate_bw = chip.tier.bandwidth_bps * f.bw_eff
    depth = min(n, model.n_layers)  # pipeline stages
    width = n / depth  # chips per stage (tensor parallel inside a stage)
    layers = model.n_layers / depth
    par = Parallelism(max(1, round(width)), depth, 1, 1)
    w = read_bytes(model, quant, layers, 1 / depth) / width
    segment = make_segment(
        model=model, quant=quant, engine=engine, chip=chip, f=f, layers=layers,
        head_share=1 / depth, weight_reads=((chip.tier.name, w, rate_bw),),
        kv_tier=chip.tier.name, kv_bw=rate_bw, kv_bytes=kvb, par=par,
    )
    plan = Plan(
        stages=(Stage((segment,), depth, par.tp, par.tp * (chip.busy_watts - chip.idle_watts)),),
        hop_fixed_s=chip.hop_latency_s,
        hop_tok_s=model.hidden * ACT_BYTES / chip.pipeline_hop_bw,
        n_hops=depth - 1,
        idle_w=n * chip.idle_watts,
        usd_per_s=n * chip.usd_per_hour / 3600,
        offload_min_tokens=0,
        **attention_fields(model),  # type: ignore[arg-type]
        **moe_fields(model, par),  # type: ignore[arg-type]
    )
    sized = f"{n} chips computed for weights + KV of {ctx} tokens"
    return Placement(
        spec=spec, model=model, quant=quant, chip=chip, engine=engine, chips=n, tp=par.tp,
        pp=depth,
        n_gpu_layers=None, weight_bytes=((chip.tier.name, resident),), kv_tokens=kv_tokens,
        max_context=min(spec.max_context or model.max_context,
                        kv_tokens if model.holds_kv else model.max_context), kv_bytes=kvb,
        factors=((chip.chip_class, f),), load_seconds=resident / n / chip.host_link_bw_bps,
        notes=(sized,) if not spec.count else (), plan=plan, memory_share=chip.usable_fraction,
    )
