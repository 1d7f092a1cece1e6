"""Placement: where every layer's weights live, how much KV fits, how many chips are needed.

``place(spec)`` is pure: the same spec gives the same :class:`Placement`, and a deployment that
cannot be placed raises :class:`devices.errors.PlacementError` saying why.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from devices import catalog
from devices.deployment import DeploymentSpec
from devices.errors import PlacementError
from devices.factors import Factors
from devices.plan import ACT_BYTES, Plan, Segment, Stage, make_segment
from devices.specs import ChipSpec, EngineSpec, ModelSpec, QuantSpec

FactorTable = Mapping[tuple[str, str], Factors]
DEFAULT_CONTEXT_SRAM = 8192  # ASSUMPTION: context provisioned when the tool sizes Groq/Cerebras
DEFAULT_CONTEXT_CONTIGUOUS = 4096  # llama.cpp's default n_ctx; MLX/JetStream slot length


@dataclass(frozen=True)
class Placement:
    """The outcome of placing a deployment (all byte figures are totals over all chips)."""

    spec: DeploymentSpec
    model: ModelSpec
    quant: QuantSpec
    chip: ChipSpec
    engine: EngineSpec
    chips: int
    tp: int
    pp: int
    n_gpu_layers: int | None
    weight_bytes: tuple[tuple[str, float], ...]  # tier -> bytes of weights resident there
    kv_tokens: int
    max_context: int
    factors: tuple[tuple[str, Factors], ...]  # chip class -> factors used
    load_seconds: float  # reading the weights into place at a cold start
    notes: tuple[str, ...] = ()
    plan: Plan = field(default=None, compare=False, repr=False)  # type: ignore[assignment]

    def kv_blocks(self, block_size: int = 16) -> int:
        """KV capacity in blocks of ``block_size`` tokens."""
        return self.kv_tokens // block_size

    def max_concurrency(self, context_tokens: int | None = None, block_size: int = 16) -> int:
        """How many sequences of ``context_tokens`` fit at once, capped by ``max_batch``.

        A contiguous layout configured with ``max_context`` reserves all of it per sequence."""
        per_seq = context_tokens or self.max_context
        if self.engine.kv_layout == "contiguous" and self.spec.max_context:
            per_seq = self.spec.max_context  # every slot reserves its full length
        blocks = math.ceil(per_seq / block_size)
        return max(0, min(self.spec.max_batch, self.kv_blocks(block_size) // blocks))

    def memory_bytes(self, kv_tokens_used: int = 0) -> dict[str, float]:
        """Bytes per tier: weights plus ``kv_tokens_used`` tokens of KV."""
        out = dict(self.weight_bytes)
        for stage in self.plan.stages:
            for seg in stage.segments:
                kv = seg.kv_bytes_per_token * seg.tp * stage.repeat * kv_tokens_used
                out[seg.kv_tier] = out.get(seg.kv_tier, 0.0) + kv
        return out


def factors_for(table: FactorTable, engine: str, chip_class: str) -> Factors:
    try:
        return table[(engine, chip_class)]
    except KeyError:
        raise PlacementError(f"no efficiency factors for {engine!r} on {chip_class}") from None


def resolve(spec: DeploymentSpec) -> tuple[ModelSpec, QuantSpec, ChipSpec, EngineSpec]:
    """Look the ids up and check the engine accepts this chip and weight format."""
    model, quant = catalog.get_model(spec.model), catalog.get_quant(spec.quant)
    chip, engine = catalog.get_chip(spec.chip), catalog.get_engine(spec.engine)
    if chip.kind == "storage":
        raise PlacementError(f"{chip.id} is storage, not a processor")
    if chip.chip_class not in engine.chip_classes:
        raise PlacementError(
            f"{engine.name} runs on {', '.join(engine.chip_classes)} chips, "
            f"not on {chip.id} ({chip.chip_class})"
        )
    if quant.family not in engine.quant_families:
        raise PlacementError(
            f"{engine.name} does not load {quant.id} weights "
            f"(it loads: {', '.join(engine.quant_families)} formats)"
        )
    if engine.compile == "ahead_of_time" and spec.built_for and spec.built_for != chip.arch:
        raise PlacementError(
            f"{engine.name} engine built for {spec.built_for} cannot run on {chip.id} "
            f"({chip.arch}): the engine plan file is generated on an incompatible device; "
            f"rebuild the engine for {chip.arch}"
        )
    return model, quant, chip, engine


def place(spec: DeploymentSpec, factor_table: FactorTable | None = None) -> Placement:
    """Place a deployment; ``factor_table`` defaults to the fitted calibration factors."""
    model, quant, chip, engine = resolve(spec)
    if factor_table is None:
        from devices.calibration import fitted_factors

        factor_table = fitted_factors()
    if chip.kind == "host" or (engine.offload and chip.host):
        from devices.offload import place_offload

        return place_offload(spec, model, quant, chip, engine, factor_table)
    if chip.tier.name == "sram":
        return _place_sram(spec, model, quant, chip, engine, factor_table)
    return _place_hbm(spec, model, quant, chip, engine, factor_table)


def read_bytes(model: ModelSpec, quant: QuantSpec, layers: float, head_share: float) -> float:
    """Weight bytes one step reads: the layers plus a share of the LM head (not the embedding,
    of which only the batch's rows are touched)."""
    return (layers * model.layer_params + head_share * model.head_params) * quant.bytes_per_weight


def _resident(model: ModelSpec, quant: QuantSpec) -> float:
    head = 0 if model.tied_embeddings else model.head_params
    params = model.n_layers * model.layer_params + model.embed_params + head
    return params * quant.bytes_per_weight


def _parallelism(spec: DeploymentSpec, chip: ChipSpec) -> tuple[int, int]:
    tp = spec.tp or (spec.count // (spec.pp or 1) if spec.count else 1)
    pp = spec.pp or (spec.count // tp if spec.count else 1)
    if tp < 1 or pp < 1 or (spec.count is not None and tp * pp != spec.count):
        raise PlacementError(f"count {spec.count} is not tp {tp} × pp {pp}")
    if tp * pp > 1 and chip.link_bw_bps <= 0:
        raise PlacementError(f"{chip.id} has no chip-to-chip link: use a single chip")
    return tp, pp


def _gb(x: float) -> str:
    return f"{x / 1e9:.1f} GB"


def _place_hbm(
    spec: DeploymentSpec,
    model: ModelSpec,
    quant: QuantSpec,
    chip: ChipSpec,
    engine: EngineSpec,
    table: FactorTable,
) -> Placement:
    tp, pp = _parallelism(spec, chip)
    f = factors_for(table, engine.id, chip.chip_class)
    tier = chip.tier
    unified = tier.name == "unified"
    cap = tier.capacity_bytes * (chip.usable_fraction if unified else spec.gpu_mem_utilisation)
    budget = spec.max_batched_tokens or engine.prefill_chunk
    # ASSUMPTION (vLLM-style profiling): peak activations of one step of `budget` tokens.
    act = budget * (4 * model.hidden + 3 * model.ffn * max(1, model.n_active_experts) / tp)
    act *= ACT_BYTES
    layers = model.n_layers / pp
    head_mem = 0 if model.tied_embeddings else model.head_params * quant.bytes_per_weight
    stage_w = layers * model.layer_params * quant.bytes_per_weight / tp
    worst_w = stage_w + max(model.embed_params * quant.bytes_per_weight, head_mem) / tp
    if pp == 1:
        worst_w = _resident(model, quant) / tp
    kv_per_chip = model.kv_bytes_per_token(quant.kv_bytes) / model.n_layers * layers
    kv_per_chip /= min(tp, model.n_kv_heads)
    kv_free = cap - worst_w - act
    kv_tokens = int(kv_free // kv_per_chip) if kv_free > 0 else 0
    need = spec.max_context or min(model.max_context, DEFAULT_CONTEXT_CONTIGUOUS)
    if kv_tokens < need:
        where = "unified memory" if unified else f"{tier.name.upper()} of {tp * pp} × {chip.id}"
        why = (
            f"{model.name} {quant.id} does not fit the {where}: weights {_gb(worst_w)} + "
            f"activations {_gb(act)} + KV for {need} tokens {_gb(need * kv_per_chip)} per chip "
            f"> usable {_gb(cap)}"
        )
        if engine.id == "mlx":
            why += "; MLX fails rather than swap: pick a smaller quantisation or a bigger machine"
        elif not unified:
            why += "; add chips (tp/pp) or use a smaller quantisation"
        raise PlacementError(why)
    rate_bw = tier.bandwidth_bps * f.bw_eff

    def seg(head_share: float) -> Segment:
        w = read_bytes(model, quant, layers, head_share) / tp
        return make_segment(
            model=model, quant=quant, engine=engine, chip=chip, f=f, layers=layers, tp=tp,
            head_share=head_share, weight_reads=((tier.name, w, rate_bw),), kv_tier=tier.name,
            kv_bw=rate_bw, link_bw=chip.link_bw_bps, link_latency=chip.link_latency_s,
        )

    delta = tp * (chip.busy_watts - chip.idle_watts)
    if pp == 1:
        stages: tuple[Stage, ...] = (Stage((seg(1.0),), 1, tp, delta),)
    else:
        body = seg(0.0)
        mid = (Stage((body,), pp - 2, tp, delta),) if pp > 2 else ()
        stages = (Stage((body,), 1, tp, delta), *mid, Stage((seg(1.0),), 1, tp, delta))
    n = tp * pp
    plan = Plan(
        stages=stages,
        hop_fixed_s=chip.link_latency_s if pp > 1 else 0.0,
        hop_tok_s=model.hidden * ACT_BYTES / chip.link_bw_bps if pp > 1 else 0.0,
        n_hops=pp - 1,
        idle_w=n * chip.idle_watts,
        usd_per_s=n * chip.usd_per_hour / 3600,
        offload_min_tokens=0,
        moe_k_over_e=model.n_active_experts / model.n_experts if model.is_moe else 0.0,
        moe=model.is_moe,
    )
    resident = _resident(model, quant)
    load_bw = chip.host_link_bw_bps or 7e9  # ASSUMPTION: Apple loads from an NVMe-class SSD
    return Placement(
        spec=spec, model=model, quant=quant, chip=chip, engine=engine, chips=n, tp=tp, pp=pp,
        n_gpu_layers=None, weight_bytes=((tier.name, resident),), kv_tokens=kv_tokens,
        max_context=min(spec.max_context or model.max_context, kv_tokens),
        factors=((chip.chip_class, f),), load_seconds=resident / n / load_bw, plan=plan,
    )


def _place_sram(
    spec: DeploymentSpec,
    model: ModelSpec,
    quant: QuantSpec,
    chip: ChipSpec,
    engine: EngineSpec,
    table: FactorTable,
) -> Placement:
    """Weights (and KV) in on-chip SRAM, pipelined over as many chips as they need."""
    f = factors_for(table, engine.id, chip.chip_class)
    cap = chip.tier.capacity_bytes * chip.usable_fraction
    resident = _resident(model, quant)
    kv_tok = model.kv_bytes_per_token(quant.kv_bytes)
    ctx = spec.max_context or min(model.max_context, DEFAULT_CONTEXT_SRAM)
    n = spec.count or math.ceil((resident + kv_tok * ctx) / cap)
    if resident > n * cap:
        raise PlacementError(
            f"{model.name} {quant.id} needs {_gb(resident)} of SRAM: at least "
            f"{math.ceil(resident / cap)} × {chip.id} ({_gb(cap)} each), not {n}"
        )
    kv_tokens = int((n * cap - resident) // kv_tok)
    if kv_tokens < 16 or (spec.max_context and kv_tokens < spec.max_context):
        raise PlacementError(
            f"{n} × {chip.id} hold the weights but only {kv_tokens} tokens of KV; add chips"
        )
    rate_bw = chip.tier.bandwidth_bps * f.bw_eff
    layers = model.n_layers / n
    w = read_bytes(model, quant, layers, 1 / n)
    segment = make_segment(
        model=model, quant=quant, engine=engine, chip=chip, f=f, layers=layers, tp=1,
        head_share=1 / n, weight_reads=((chip.tier.name, w, rate_bw),),
        kv_tier=chip.tier.name, kv_bw=rate_bw,
    )
    plan = Plan(
        stages=(Stage((segment,), n, 1, chip.busy_watts - chip.idle_watts),),
        hop_fixed_s=chip.link_latency_s,
        hop_tok_s=model.hidden * ACT_BYTES / chip.link_bw_bps,
        n_hops=n - 1,
        idle_w=n * chip.idle_watts,
        usd_per_s=n * chip.usd_per_hour / 3600,
        offload_min_tokens=0,
        moe_k_over_e=model.n_active_experts / model.n_experts if model.is_moe else 0.0,
        moe=model.is_moe,
    )
    return Placement(
        spec=spec, model=model, quant=quant, chip=chip, engine=engine, chips=n, tp=1, pp=n,
        n_gpu_layers=None, weight_bytes=((chip.tier.name, resident),), kv_tokens=kv_tokens,
        max_context=min(spec.max_context or model.max_context, kv_tokens),
        factors=((chip.chip_class, f),), load_seconds=resident / n / chip.host_link_bw_bps,
        notes=(f"{n} chips computed for weights + KV of {ctx} tokens",) if not spec.count else (),
        plan=plan,
    )
