"""Per-placement constants of the cost model, precomputed once so ``step_cost`` stays cheap.

A placement is a pipeline of *stages* (separated by link hops); a stage is one or more
*segments* run one after another (llama.cpp: GPU layers, then CPU layers); a segment is a run of
layers on one processor group of ``tp`` chips in parallel. Each segment stores seconds per unit
of work at the engine's fitted efficiencies, so a step is a handful of multiply-adds.
"""

from __future__ import annotations

from dataclasses import dataclass

from devices.factors import Factors
from devices.specs import ChipSpec, EngineSpec, ModelSpec, QuantSpec

ACT_BYTES = 2.0  # activations are 16-bit on every engine modelled


@dataclass(frozen=True)
class Segment:
    """Consecutive layers run by ``tp`` chips of one kind; all figures are per chip."""

    chip: str
    chip_class: str
    layers: float
    tp: int
    weight_bytes: tuple[tuple[str, float], ...]  # tier -> bytes per chip (incl. head share)
    expert_fraction: float  # share of those bytes that are MoE experts
    kv_tier: str
    kv_bytes_per_token: float  # per chip, for these layers
    act_bytes_per_token: float  # unfused intermediate traffic per chip
    dense_s: float  # reading the non-expert weights once
    expert_s: float  # reading every expert once
    kv_s: float  # per KV token read (all these layers)
    act_s: float  # per token of activation traffic
    flop_s: float  # linear-layer FLOPs per (padded) token
    attn_s: float  # attention FLOPs per (query token × context token)
    head_flop_s: float  # LM-head FLOPs per logit row
    overhead_s: float  # kernels × per-kernel overhead
    kernels: float
    coll_fixed_s: float  # tensor-parallel all-reduce latency per step
    coll_tok_s: float  # all-reduce transfer per token
    tile: int  # matmul rows per pass (TPU MXU); tokens are padded to it
    flops_per_token: float  # for reporting, per chip
    attn_flops_per_unit: float
    head_flops_per_logit: float
    prefill_alt: Segment | None = None  # llama.cpp: CPU layers' matmuls moved to the GPU


@dataclass(frozen=True)
class Stage:
    segments: tuple[Segment, ...]
    repeat: int  # identical consecutive stages (Groq: hundreds)
    chips: int  # chips per stage
    busy_delta_w: float  # chips × (busy − idle) watts while this stage works


@dataclass(frozen=True)
class Plan:
    stages: tuple[Stage, ...]
    hop_fixed_s: float
    hop_tok_s: float
    n_hops: int
    idle_w: float
    usd_per_s: float
    offload_min_tokens: int  # a step with at least this many tokens uses ``prefill_alt``
    moe_k_over_e: float  # k/E for MoE, 0 for dense
    moe: bool


def compute_rate(engine: EngineSpec, chip: ChipSpec, quant: QuantSpec, f: Factors) -> float:
    """Achievable FLOP/s: the engine's compute path on this chip × fitted efficiency."""
    path = engine.path_for(chip.chip_class)
    dtype = quant.compute_dtype if path == "quant" else path
    return chip.flops(dtype) * f.flop_eff


def make_segment(
    *,
    model: ModelSpec,
    quant: QuantSpec,
    engine: EngineSpec,
    chip: ChipSpec,
    f: Factors,
    layers: float,
    tp: int,
    head_share: float,
    weight_reads: tuple[tuple[str, float, float], ...],
    kv_tier: str,
    kv_bw: float,
    link_bw: float = 0.0,
    link_latency: float = 0.0,
    rate: float | None = None,
    prefill_alt: Segment | None = None,
) -> Segment:
    """Build a segment. ``weight_reads``: (tier, bytes per chip, effective bytes/s) triples."""
    rate = rate if rate is not None else compute_rate(engine, chip, quant, f)
    total_w = sum(b for _, b, _ in weight_reads) or 1.0
    expert_bytes = (
        layers * model.mlp_params_per_layer * quant.bytes_per_weight / tp if model.is_moe else 0.0
    )
    ef = min(1.0, expert_bytes / total_w)
    read_s = sum(b / bw for _, b, bw in weight_reads if b > 0)
    kv_split = min(tp, model.n_kv_heads)
    kv_tok = model.kv_bytes_per_token(quant.kv_bytes) * layers / model.n_layers / kv_split
    act_tok = engine.kernels_per_layer * 2 * model.hidden * ACT_BYTES * layers / tp
    flops_tok = 2 * model.active_layer_params * layers / tp
    attn_unit = 4 * model.n_heads * model.head_dim * layers / tp
    head_logit = 2 * model.head_params * head_share / tp
    kernels = layers * engine.kernels_per_layer
    if tp > 1:
        coll_fixed = 2 * layers * link_latency
        coll_tok = 2 * layers * 2 * (tp - 1) / tp * model.hidden * ACT_BYTES / link_bw
    else:
        coll_fixed = coll_tok = 0.0
    return Segment(
        chip=chip.id,
        chip_class=chip.chip_class,
        layers=layers,
        tp=tp,
        weight_bytes=tuple((t, b) for t, b, _ in weight_reads),
        expert_fraction=ef,
        kv_tier=kv_tier,
        kv_bytes_per_token=kv_tok,
        act_bytes_per_token=act_tok,
        dense_s=read_s * (1 - ef),
        expert_s=read_s * ef,
        kv_s=kv_tok / kv_bw,
        act_s=act_tok / kv_bw,
        flop_s=flops_tok / rate,
        attn_s=attn_unit / rate,
        head_flop_s=head_logit / rate,
        overhead_s=kernels * f.kernel_s,
        kernels=kernels,
        coll_fixed_s=coll_fixed,
        coll_tok_s=coll_tok,
        tile=max(1, chip.matmul_tile),
        flops_per_token=flops_tok,
        attn_flops_per_unit=attn_unit,
        head_flops_per_logit=head_logit,
        prefill_alt=prefill_alt,
    )
