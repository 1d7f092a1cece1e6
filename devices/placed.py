"""The outcome of placing a deployment, and helpers the placement strategies share.

This module sits below every strategy (``place_hbm``, ``place_sram``, ``offload``) and below
the cost model, so none of them imports another: ``placement.place`` picks the strategy.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from devices.deployment import DeploymentSpec
from devices.errors import PlacementError
from devices.factors import Factors
from devices.parallel import Parallelism
from devices.plan import Plan
from devices.specs import ChipSpec, EngineSpec, ModelSpec, QuantSpec

FactorTable = Mapping[tuple[str, str], Factors]
DEFAULT_CONTEXT_SRAM = 8192  # ASSUMPTION: context provisioned when the tool sizes Groq/Cerebras
DEFAULT_CONTEXT_CONTIGUOUS = 4096  # llama.cpp's default n_ctx; MLX/JetStream slot length
# --kv-cache-dtype values besides 'auto' (OCP FP8 E4M3: 1 byte; 16-bit floats: 2)
KV_DTYPE_BYTES = {"fp8": 1.0, "bf16": 2.0, "f16": 2.0}


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
    dp: int = 1
    ep: int = 1
    kv_bytes: float = 2.0  # bytes per KV element (after --kv-cache-dtype)
    memory_share: float = 1.0  # share of each chip's memory the engine sized itself to
    kv_pool_bytes: float = 0.0  # KV bytes per chip its memory rule left (vLLM's "Available KV
    #                             cache memory"); 0 where no rule sizes it (SRAM, offload)

    @property
    def block_size(self) -> int:
        """Tokens per KV block the engine picks on this chip for this model without a
        --block-size and without a KV connector (a pod's own: EngineOptions.block_size_on)."""
        return self.engine.block_size_on(self.chip, mla=self.model.is_mla)

    def kv_blocks(self, block_size: int | None = None) -> int:
        """KV capacity in blocks of ``block_size`` tokens (default: the engine's)."""
        return self.kv_tokens // (block_size or self.block_size)

    def max_concurrency(self, context_tokens: int | None = None,
                        block_size: int | None = None) -> int:
        """How many sequences of ``context_tokens`` fit at once, capped by ``max_batch``.

        A contiguous layout configured with ``max_context`` reserves all of it per sequence;
        a model without a KV cache (an encoder) holds no tokens between steps."""
        block_size = block_size or self.block_size
        if not self.model.holds_kv:
            return self.spec.max_batch
        per_seq = context_tokens or self.max_context
        if self.engine.kv_layout == "contiguous" and self.spec.max_context:
            per_seq = self.spec.max_context  # every slot reserves its full length
        blocks = math.ceil(per_seq / block_size)
        return max(0, min(self.spec.max_batch, self.kv_blocks(block_size) // blocks))

    def rank_view(self, ranks: int, spec: DeploymentSpec) -> Placement:
        """One of ``ranks`` engine cores that together run this placement, each scheduling
        ``dp / ranks`` of its attention replicas with the limits of ``spec`` (vLLM's
        data-parallel ranks of a MoE model, whose experts are sharded over every rank's
        chips): its chips, weights and KV capacity are the rank's; its steps cost the whole
        group's, every rank carrying a batch like its own (``Plan.ranks``)."""
        plan = dataclasses.replace(self.plan, ranks=ranks)
        if plan.draft is not None:
            plan = dataclasses.replace(plan, draft=dataclasses.replace(plan.draft, ranks=ranks))
        return dataclasses.replace(
            self, spec=spec, chips=self.chips // ranks, dp=self.dp // ranks,
            kv_tokens=self.kv_tokens // ranks, plan=plan,
            weight_bytes=tuple((tier, b / ranks) for tier, b in self.weight_bytes))

    @property
    def kv_bytes_per_token(self) -> float:
        """KV bytes one token adds on all of the deployment's chips (every tier, every copy a
        TP rank keeps): what moving a token's KV between machines or to host memory moves."""
        return sum(self.memory_bytes(1).values()) - sum(self.memory_bytes(0).values())

    def memory_bytes(self, kv_tokens_used: int = 0) -> dict[str, float]:
        """Bytes per tier: weights plus ``kv_tokens_used`` tokens of KV."""
        out = dict(self.weight_bytes)
        for stage in self.plan.stages:
            for seg in stage.segments:
                per = seg.kv_bytes_per_token + seg.kv_swa_bytes_per_token  # an upper bound
                kv = per * seg.tp * stage.repeat * kv_tokens_used
                out[seg.kv_tier] = out.get(seg.kv_tier, 0.0) + kv
        return out


def factors_for(table: FactorTable, engine: str, chip_class: str) -> Factors:
    try:
        return table[(engine, chip_class)]
    except KeyError:
        raise PlacementError(f"no efficiency factors for {engine!r} on {chip_class}") from None


def kv_element_bytes(spec: DeploymentSpec, quant: QuantSpec) -> float:
    """Bytes per KV-cache element: the quantisation's default, or ``kv_cache_dtype``."""
    if spec.kv_cache_dtype in ("auto", "", None):
        return quant.kv_bytes
    try:
        return KV_DTYPE_BYTES[spec.kv_cache_dtype]
    except KeyError:
        raise PlacementError(f"unknown kv_cache_dtype {spec.kv_cache_dtype!r} "
                             f"(auto or {', '.join(KV_DTYPE_BYTES)})") from None


def read_bytes(model: ModelSpec, quant: QuantSpec, layers: float, head_share: float) -> float:
    """Weight bytes one step reads: the layers plus a share of the LM head (not the embedding,
    of which only the batch's rows are touched)."""
    return (quant.layer_bytes(layers * model.dense_layer_params,
                              layers * model.mlp_params_per_layer)
            + quant.edge_bytes(head_share * model.head_params))


def resident_bytes(model: ModelSpec, quant: QuantSpec) -> float:
    """All weights, embedding and (untied) head included."""
    head = 0 if model.tied_embeddings else model.head_params
    n = model.n_layers
    return (quant.layer_bytes(n * model.dense_layer_params, n * model.mlp_params_per_layer)
            + quant.edge_bytes(model.embed_params + head))


def per_chip_weights(model: ModelSpec, quant: QuantSpec, par: Parallelism, layers: float,
                     extra_params: float) -> float:
    """Weight bytes one chip of a stage holds: dense parts over tp, experts over their
    shards, plus ``extra_params`` (embedding/head share) over tp."""
    dense = layers * model.dense_layer_params / par.tp
    experts = par.experts_per_chip(layers * model.mlp_params_per_layer, model.n_experts)
    return quant.layer_bytes(dense, experts) + quant.edge_bytes(extra_params / par.tp)


def moe_fields(model: ModelSpec, par: Parallelism) -> dict[str, object]:
    """The Plan's MoE constants: k/E, and whose tokens an expert shard sees (ep > 1: all of
    them; ep = 1: its attention replica's)."""
    if not model.is_moe:
        return {"moe_k_over_e": 0.0, "moe": False, "expert_tokens_div": 1}
    return {"moe_k_over_e": model.n_active_experts / model.n_experts, "moe": True,
            "expert_tokens_div": par.dp if par.ep == 1 else 1}


def attention_fields(model: ModelSpec) -> dict[str, object]:
    """The Plan's attention constants: the sliding window, and whether a prompt's tokens
    attend both ways (an encoder)."""
    return {"window": model.sliding_window if model.sliding_layers else 0,
            "bidirectional": model.encoder_only}


def gb(x: float) -> str:
    return f"{x / 1e9:.1f} GB"
