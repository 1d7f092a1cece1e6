"""Placement on device memory: HBM/VRAM split over tp/ep ranks, or one unified pool (Apple).

Weights per chip: the dense parts (attention, dense MLPs, shared experts) over ``tp``, the
routed experts over their ``expert_shards``; KV gets what the engine's memory rule leaves
(``MemoryRule``: vLLM's share of capacity less weights and one step's activations, SGLang's
static share less weights, TensorRT-LLM's share of what is free), split over KV heads (not
for MLA's latent, which every tensor-parallel rank keeps whole) and held by each of the ``dp``
attention replicas for its own sequences. The deployment's ``gpu_mem_utilisation`` overrides
the engine's share. A unified-memory chip (placement trait 'unified') may use its
``usable_fraction`` (Metal's working set); an engine that cannot offload then fails outright.
"""

from __future__ import annotations

from devices.deployment import DeploymentSpec
from devices.errors import PlacementError
from devices.parallel import Parallelism, resolve_parallelism
from devices.placed import (
    DEFAULT_CONTEXT_CONTIGUOUS,
    FactorTable,
    Placement,
    attention_fields,
    factors_for,
    gb,
    kv_element_bytes,
    moe_fields,
    per_chip_weights,
    resident_bytes,
)
from devices.plan import ACT_BYTES, Plan, Segment, Stage, make_segment
from devices.specs import ChipSpec, EngineSpec, MemoryRule, ModelSpec, QuantSpec


def draft_layers(spec: DeploymentSpec, model: ModelSpec) -> int:
    """Layers of the speculative draft model: EAGLE heads are one decoder layer; MTP runs the
    model's own multi-token-prediction layer(s)."""
    if spec.speculative is None:
        return 0
    if spec.speculative.method == "mtp":
        if not model.mtp_layers:
            raise PlacementError(f"{model.name} has no multi-token-prediction layer for 'mtp'")
        return model.mtp_layers
    return 1


def step_budget(spec: DeploymentSpec, engine: EngineSpec, chip: ChipSpec) -> int | None:
    """Tokens one step may carry: the deployment's, else the engine's default for this chip
    (None: whole prompts, unchunked)."""
    _, _, tokens = engine.scheduler.for_chip(chip.tier.capacity_bytes, chip.name)
    return spec.max_batched_tokens or tokens


def place_hbm(spec: DeploymentSpec, model: ModelSpec, quant: QuantSpec, chip: ChipSpec,
              engine: EngineSpec, table: FactorTable) -> Placement:
    par = resolve_parallelism(spec, chip, model, engine)
    tp, pp = par.tp, par.pp
    f = factors_for(table, engine.id, chip.chip_class)
    tier = chip.tier
    unified = chip.placement == "unified"
    need = spec.max_context or min(model.max_context, DEFAULT_CONTEXT_CONTIGUOUS)
    budget = step_budget(spec, engine, chip) or need
    inter = max(model.ffn if model.n_dense_layers else 0,
                (model.expert_ffn or model.ffn) * model.n_active_experts
                + model.n_shared_experts * (model.shared_ffn or model.expert_ffn or model.ffn))
    # ASSUMPTION (vLLM-style profiling): peak activations of one step of `budget` tokens.
    act = budget / par.dp * (4 * model.hidden + 3 * inter / tp) * ACT_BYTES
    layers = model.n_layers / pp
    head = 0 if model.tied_embeddings else model.head_params
    dl = draft_layers(spec, model)
    draft_w = per_chip_weights(model, quant, par, dl, 0.0)
    if pp == 1:
        worst_w = per_chip_weights(model, quant, par, model.n_layers, model.embed_params + head)
    else:
        worst_w = per_chip_weights(model, quant, par, layers, max(model.embed_params, head))
    worst_w += draft_w
    host_share = offload = 0.0  # of the layers' weights (bytes per chip) in pinned host memory
    if spec.cpu_offload_bytes:
        if unified or not engine.uva_offload:
            raise PlacementError(f"{engine.name} does not keep weights in host memory "
                                 "(cpu_offload_gb is vLLM's and SGLang's)")
        # vLLM offloads decoder layers' parameters in order until the budget is met (not the
        # embedding, which is looked up, not read): ASSUMPTION spread evenly over the layers —
        # every layer runs every step, so the bytes read over the link are the same
        read_w = per_chip_weights(model, quant, par, layers, model.head_params)
        offload = min(float(spec.cpu_offload_bytes), read_w)
        host_share = offload / read_w
        worst_w -= offload
    kvb = kv_element_bytes(spec, quant)
    kv_per_chip = model.kv_bytes_per_context_token(need, kvb) / pp
    kv_per_chip /= min(tp, model.kv_shards)
    rule = MemoryRule() if unified else engine.memory
    if rule is None:
        raise PlacementError(f"{engine.name} has no memory rule for {chip.id} (engines.toml)")
    act = rule.activations(act, spec.max_batch, model.vocab)  # every rank samples full logits
    share = (chip.usable_fraction if unified else spec.gpu_mem_utilisation
             or rule.share(tier.capacity_bytes, budget, spec.max_batch, tp * pp))
    cap = tier.capacity_bytes * share
    total = gb(tier.capacity_bytes) + (" reported" if tier.nominal_bytes else "")
    if spec.kv_cache_memory_bytes and not unified:  # vLLM: the KV size given, share ignored
        kv_free = float(spec.kv_cache_memory_bytes)
        if worst_w + act + kv_free > tier.capacity_bytes:
            raise PlacementError(
                f"{model.name} {quant.id}: weights {gb(worst_w)} + activations {gb(act)} + "
                f"kv_cache_memory_bytes {gb(kv_free)} per chip > the {total} of {chip.id}")
    else:
        kv_free = rule.kv_bytes(tier.capacity_bytes, share, worst_w, act)
    if not model.holds_kv:  # an encoder keeps no KV cache (vLLM: one null block, no pool)
        per_replica = need = 0
        if kv_free < 0:
            raise PlacementError(
                f"{model.name} {quant.id} does not fit the {tier.name.upper()} of {par.chips} × "
                f"{chip.id}: weights {gb(worst_w)} + activations {gb(act)} per chip > "
                f"{share:.3g} of {total}; add chips (tp) or use a smaller quantisation")
    else:
        per_replica = int(kv_free // kv_per_chip) if kv_free > 0 else 0
    if per_replica < need:
        where = "unified memory" if unified else f"{tier.name.upper()} of {par.chips} × {chip.id}"
        kv = f"KV for {need} tokens {gb(need * kv_per_chip)}"
        of = f"{share:.3g} of {total}"
        if rule.rule == "free":
            what = (f"{kv} per chip > {of} left free by weights {gb(worst_w)} + activations "
                    f"{gb(act)}")
        elif rule.rule == "static":
            what = f"weights {gb(worst_w)} + {kv} per chip > {gb(cap)} ({of})"
        else:
            what = (f"weights {gb(worst_w)} + activations {gb(act)} + {kv} per chip > usable "
                    f"{gb(cap)} ({of})")
        why = f"{model.name} {quant.id} does not fit the {where}: {what}"
        if unified and not engine.offload:
            why += (f"; {engine.name} fails rather than swap: pick a smaller quantisation or a "
                    "bigger machine")
        elif not unified:
            why += "; add chips (tp/pp/ep) or use a smaller quantisation"
        raise PlacementError(why)
    rate_bw = tier.bandwidth_bps * f.bw_eff

    def seg(n_layers: float, head_share: float, extra_w: float = 0.0) -> Segment:
        w = per_chip_weights(model, quant, par, n_layers, head_share * model.head_params)
        w += extra_w
        reads = ((tier.name, w * (1 - host_share), rate_bw),)
        if host_share:  # zero-copy over the host link (ASSUMPTION: at its full rate)
            reads += (("host_dram", w * host_share, chip.host_link_bw_bps),)
        return make_segment(
            model=model, quant=quant, engine=engine, chip=chip, f=f, layers=n_layers,
            head_share=head_share, weight_reads=reads,
            kv_tier=tier.name, kv_bw=rate_bw, kv_bytes=kvb, par=par,
        )

    delta = par.stage_chips * (chip.busy_watts - chip.idle_watts)
    if pp == 1:
        stages: tuple[Stage, ...] = (Stage((seg(layers, 1.0),), 1, par.stage_chips, delta),)
    else:
        body = seg(layers, 0.0)
        mid = (Stage((body,), pp - 2, par.stage_chips, delta),) if pp > 2 else ()
        stages = (Stage((body,), 1, par.stage_chips, delta), *mid,
                  Stage((seg(layers, 1.0),), 1, par.stage_chips, delta))
    n = par.chips
    common = dict(idle_w=n * chip.idle_watts, usd_per_s=n * chip.usd_per_hour / 3600,
                  offload_min_tokens=0, **attention_fields(model), **moe_fields(model, par))
    draft = None
    if dl:
        draft = Plan(stages=(Stage((seg(dl, 1.0),), 1, par.stage_chips, delta),),
                     hop_fixed_s=0.0, hop_tok_s=0.0, n_hops=0, **common)  # type: ignore[arg-type]
    plan = Plan(
        stages=stages,
        hop_fixed_s=chip.collective_base_s + chip.hop_latency_s if pp > 1 else 0.0,
        hop_tok_s=model.hidden * ACT_BYTES / par.dp / chip.link_bw_bps if pp > 1 else 0.0,
        n_hops=pp - 1, draft=draft, **common,  # type: ignore[arg-type]
    )
    resident = resident_bytes(model, quant)
    held = ((tier.name, resident - offload * n),)
    notes: tuple[str, ...] = ()
    if offload:
        held += (("host_dram", offload * n),)
        notes = (f"{gb(offload)} of weights per chip ({host_share:.0%} of the layers') in host "
                 f"memory, read over the {gb(chip.host_link_bw_bps)}/s host link every step "
                 "(cpu_offload_gb)",)
    load_bw = chip.host_link_bw_bps or 7e9  # ASSUMPTION: Apple loads from an NVMe-class SSD
    return Placement(
        spec=spec, model=model, quant=quant, chip=chip, engine=engine, chips=n, tp=tp, pp=pp,
        dp=par.dp, ep=par.ep, kv_bytes=kvb, memory_share=share, kv_pool_bytes=kv_free,
        n_gpu_layers=None, weight_bytes=held, kv_tokens=per_replica * par.dp, notes=notes,
        max_context=min(spec.max_context or model.max_context,
                        per_replica if model.holds_kv else model.max_context),
        factors=((chip.chip_class, f),), load_seconds=resident / n / load_bw, plan=plan,
    )


__all__ = ["Parallelism", "draft_layers", "place_hbm", "step_budget"]
