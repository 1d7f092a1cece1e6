"""Per-placement constants of the cost model, precomputed once so ``step_cost`` stays cheap.

A placement is a pipeline of *stages* (separated by link hops); a stage is one or more
*segments* run one after another (llama.cpp: GPU layers, then CPU layers); a segment is a run of
layers on one group of ``chips`` processors working in parallel (``tp × dp``: tensor-parallel
shards of ``dp`` attention replicas). Each segment stores seconds per unit of work at the
engine's fitted efficiencies, per chip, so a step is a handful of multiply-adds. Units are the
step's *global* quantities (all tokens, all sequences); the per-chip shares (1/dp of the
sequences, 1/tp of every matrix) are folded into the constants.
"""

from __future__ import annotations

from dataclasses import dataclass

from devices.collectives import link_for
from devices.factors import Factors
from devices.parallel import Parallelism
from devices.specs import ChipSpec, EngineSpec, ModelSpec, QuantSpec

ACT_BYTES = 2.0  # activations are 16-bit on every engine modelled


@dataclass(frozen=True)
class Segment:
    """Consecutive layers run by ``chips`` processors of one kind; all figures are per chip."""

    chip: str
    chip_class: str
    layers: float
    tp: int  # chips working on these layers together (tp × dp)
    weight_bytes: tuple[tuple[str, float], ...]  # tier -> bytes per chip (incl. head share)
    expert_fraction: float  # share of those bytes that are MoE experts
    kv_tier: str
    kv_bytes_per_token: float  # per chip, full-attention layers, per context token
    kv_swa_bytes_per_token: float  # per chip, sliding layers, per context token in the window
    act_bytes_per_token: float  # unfused intermediate traffic per chip per token
    dense_s: float  # reading the non-expert weights once
    expert_s: float  # reading every expert this chip holds once
    kv_s: float  # per context token read (full-attention layers)
    kv_swa_s: float  # per context token read inside the window (sliding layers)
    act_s: float  # per token of activation traffic
    flop_s: float  # linear-layer FLOPs per (padded) token
    attn_s: float  # attention FLOPs per (query token × context token), full layers
    attn_swa_s: float  # the same, sliding layers (context capped at the window)
    head_flop_s: float  # LM-head FLOPs per logit row
    overhead_s: float  # kernels × per-kernel overhead
    launch_s: float  # host time to launch every kernel eagerly (0 with graphs)
    kernels: float
    coll_fixed_s: float  # collectives' latency per step (TP all-reduce, EP all-to-all)
    coll_tok_s: float  # collectives' transfer per token
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
    expert_tokens_div: int = 1  # an expert shard sees all tokens / this (dp without ep)
    window: int = 0  # sliding-window size (0: none)
    bidirectional: bool = False  # an encoder: a prompt's n tokens each attend to all n (n², not
    #                              causal attention's n(n + 1)/2)
    draft: Plan | None = None  # speculative decoding: one pass of the draft model
    ranks: int = 1  # engine cores stepping this plan together, each with a batch like the one
    #                 costed (vLLM's data-parallel ranks of a MoE model): the step is the
    #                 group's (ranks × the batch); FLOPs, bytes, energy and dollars the rank's

    @property
    def rank_idle_w(self) -> float:
        """One engine core's idle power: the deployment's, or a rank's share of its group's
        (`idle_w` is every chip's)."""
        return self.idle_w / self.ranks

    @property
    def rank_usd_per_s(self) -> float:
        """One engine core's price per second: the deployment's, or a rank's share of its
        group's (`usd_per_s` is every chip's)."""
        return self.usd_per_s / self.ranks


def compute_rate(engine: EngineSpec, chip: ChipSpec, quant: QuantSpec, f: Factors) -> float:
    """Achievable FLOP/s: the engine's compute path and kernel path on this chip × efficiency."""
    path = engine.path_for(chip.chip_class)
    key = quant.compute_dtype if path == "quant" else path
    return chip.flops(engine.kernel_key(chip, key)) * f.flop_eff


def make_segment(
    *,
    model: ModelSpec,
    quant: QuantSpec,
    engine: EngineSpec,
    chip: ChipSpec,
    f: Factors,
    layers: float,
    head_share: float,
    weight_reads: tuple[tuple[str, float, float], ...],
    kv_tier: str,
    kv_bw: float,
    kv_bytes: float,
    par: Parallelism | None = None,
    rate: float | None = None,
    prefill_alt: Segment | None = None,
) -> Segment:
    """Build a segment. ``weight_reads``: (tier, bytes per chip, effective bytes/s) triples."""
    par = par or Parallelism(1, 1, 1, 1)
    tp, dp, chips = par.tp, par.dp, par.stage_chips
    rate = rate if rate is not None else compute_rate(engine, chip, quant, f)
    total_w = sum(b for _, b, _ in weight_reads) or 1.0
    expert_bytes = par.experts_per_chip(
        layers * model.mlp_params_per_layer * quant.bytes_per_weight, model.n_experts)
    ef = min(1.0, expert_bytes / total_w) if model.is_moe else 0.0
    read_s = sum(b / bw for _, b, bw in weight_reads if b > 0)
    kv_split = min(tp, model.kv_shards) * dp  # heads over tp; sequences over dp
    per_layer_kv = model.kv_elems_per_layer * kv_bytes / kv_split
    frac_full = model.full_layers / model.n_layers
    kv_tok = per_layer_kv * layers * frac_full
    kv_swa = per_layer_kv * layers * (1 - frac_full)
    act_tok = engine.kernels_per_layer * 2 * model.hidden * ACT_BYTES * layers / chips
    flops_tok = 2 * model.active_layer_params * layers / chips
    attn_unit = model.attn_flops_per_unit * layers / chips
    head_logit = 2 * model.head_params * head_share / chips
    kernels = layers * engine.kernels_per_layer
    coll_fixed = coll_tok = 0.0
    moe_share = model.n_moe_layers / model.n_layers
    token_bytes = model.hidden * ACT_BYTES
    if tp > 1:  # two all-reduces per layer (attention, MLP); one in a MoE layer under EP
        fixed, per_byte = link_for(chip, tp).all_reduce_parts()
        n_ar = layers * (2 - (moe_share if par.ep > 1 else 0.0))
        coll_fixed += n_ar * fixed
        coll_tok += n_ar * per_byte * token_bytes / dp  # each replica reduces its own tokens
    if par.ep > 1:  # dispatch + combine all-to-all per MoE layer over the ep ranks
        fixed, per_byte = link_for(chip, par.ep).all_to_all_parts()
        n_a2a = 2 * layers * moe_share
        coll_fixed += n_a2a * fixed
        coll_tok += n_a2a * per_byte * token_bytes * model.n_active_experts / chips
    return Segment(
        chip=chip.id,
        chip_class=chip.chip_class,
        layers=layers,
        tp=chips,
        weight_bytes=tuple((t, b) for t, b, _ in weight_reads),
        expert_fraction=ef,
        kv_tier=kv_tier,
        kv_bytes_per_token=kv_tok,
        kv_swa_bytes_per_token=kv_swa,
        act_bytes_per_token=act_tok,
        dense_s=read_s * (1 - ef),
        expert_s=read_s * ef,
        kv_s=kv_tok / kv_bw,
        kv_swa_s=kv_swa / kv_bw,
        act_s=act_tok / kv_bw,
        flop_s=flops_tok / rate,
        attn_s=attn_unit * frac_full / rate,
        attn_swa_s=attn_unit * (1 - frac_full) / rate,
        head_flop_s=head_logit / rate,
        overhead_s=kernels * f.kernel_s,
        launch_s=kernels * chip.launch_s if engine.launch == "eager" else 0.0,
        kernels=kernels,
        coll_fixed_s=coll_fixed,
        coll_tok_s=coll_tok,
        tile=max(1, chip.matmul_tile),
        flops_per_token=flops_tok,
        attn_flops_per_unit=attn_unit,
        head_flops_per_logit=head_logit,
        prefill_alt=prefill_alt,
    )
