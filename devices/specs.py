"""Frozen catalogue records: what a chip, a host part, an engine, a model and a quantisation are.

Only data and derived properties live here; the numbers themselves (each with its public source)
are in ``devices/catalog/*.toml``.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Tier:
    """One memory tier of a chip: name ('hbm', 'vram', 'unified', 'sram', 'host_dram', 'ssd')."""

    name: str
    capacity_bytes: float
    bandwidth_bps: float  # peak bytes per second


@dataclass(frozen=True)
class ChipSpec:
    """A processor with its memory (a GPU, an Apple SoC, a TPU, an LPU, a wafer, or a host CPU).

    ``kind`` is 'accelerator', 'host' (CPU + DRAM) or 'storage' (an SSD); ``chip_class`` keys the
    engine efficiency factors (never the chip id). ``peak_flops`` maps a compute dtype
    ('bf16', 'fp16', 'fp8', 'int8', 'fp32') to dense peak FLOP/s.
    """

    id: str
    name: str
    kind: str
    vendor: str
    chip_class: str
    arch: str
    tiers: tuple[Tier, ...]
    peak_flops: tuple[tuple[str, float], ...]
    link_bw_bps: float  # chip-to-chip bandwidth, ONE direction
    link_latency_s: float
    host_link_bw_bps: float  # to the host (PCIe), one direction
    matmul_tile: int  # rows a matmul pass processes at once (TPU MXU); 1 = no padding
    usable_fraction: float  # share of the first tier the runtime may use (Metal working set)
    busy_watts: float
    idle_watts: float
    usd_per_hour: float
    price_basis: str
    host: str | None = None  # host part id for a GPU box (llama.cpp offload)
    ssd: str | None = None
    os_reserve_bytes: float = 0.0  # host RAM the OS keeps (host parts only)
    sources: tuple[tuple[str, str], ...] = field(default=(), compare=False)

    @property
    def tier(self) -> Tier:
        """The chip's own (first, fastest) memory tier."""
        return self.tiers[0]

    def flops(self, dtype: str) -> float:
        """Dense peak FLOP/s for ``dtype``, falling back to the 16-bit rate if unsupported."""
        table = dict(self.peak_flops)
        for key in (dtype, "bf16", "fp16", "fp32"):
            if key in table:
                return table[key]
        raise KeyError(dtype)


@dataclass(frozen=True)
class EngineSpec:
    """How a serving engine behaves on a chip (structure only; fitted factors are separate)."""

    id: str
    name: str
    chip_classes: tuple[str, ...]  # the chip classes it runs on; anything else is refused
    kv_layout: str  # 'paged' | 'contiguous'
    batching: str  # 'continuous' | 'static'
    prefix_cache: str  # 'radix' | 'hash' | 'off'
    kernels_per_layer: float  # kernel launches (or program stages) per transformer layer
    compile: str  # 'none' | 'ahead_of_time' | 'per_shape' | 'static'
    compute_path: tuple[tuple[str, str], ...]  # chip class -> 'quant' | 'fp16' | 'bf16'
    prefill_chunk: int  # tokens per prefill step in a llama-bench-like estimate
    jump_forward: bool
    deterministic: bool  # no jitter (Groq)
    offload: bool  # can keep layers on the host CPU (llama.cpp)
    compile_seconds: float  # per new shape / bucket (per_shape, static)
    borrow_from: tuple[str, ...]  # engines whose same-class factors stand in for missing ones
    quant_families: tuple[str, ...] = ("float",)  # weight formats it loads
    flop_eff_scale: float = 1.0  # stated assumption scaling a borrowed FLOP efficiency (MLX)

    def path_for(self, chip_class: str) -> str:
        table = dict(self.compute_path)
        return table.get(chip_class, table.get("default", "bf16"))


@dataclass(frozen=True)
class QuantSpec:
    """A weight format: bytes per weight including block scales, KV bytes per element."""

    id: str
    bytes_per_weight: float
    kv_bytes: float
    compute_dtype: str  # what the matmul can run on if the chip/engine allows ('int8', 'fp8', ...)
    family: str  # 'float' | 'gguf' | 'mlx' | 'scaled'
    source: str = field(default="", compare=False)


@dataclass(frozen=True)
class ModelSpec:
    """Architecture figures from the model's published config.json."""

    id: str
    name: str
    n_layers: int
    hidden: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn: int  # dense MLP intermediate size (or per-expert size for MoE)
    vocab: int
    max_context: int
    tied_embeddings: bool = False
    n_experts: int = 0  # 0 = dense
    n_active_experts: int = 0
    qk_norm: bool = False
    published_params: float = 0.0
    source: str = field(default="", compare=False)

    @property
    def is_moe(self) -> bool:
        return self.n_experts > 0

    @property
    def attn_params_per_layer(self) -> int:
        q = self.hidden * self.n_heads * self.head_dim
        kv = 2 * self.hidden * self.n_kv_heads * self.head_dim
        o = self.n_heads * self.head_dim * self.hidden
        norms = 2 * self.hidden + (2 * self.head_dim if self.qk_norm else 0)
        router = self.hidden * self.n_experts
        return q + kv + o + norms + router

    @property
    def expert_params(self) -> int:
        """Parameters of one MLP (one expert for MoE): gate, up and down projections."""
        return 3 * self.hidden * self.ffn

    @property
    def mlp_params_per_layer(self) -> int:
        return self.expert_params * max(1, self.n_experts)

    @property
    def embed_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def head_params(self) -> int:
        """LM head (output projection) parameters, shared with the embedding when tied."""
        return self.vocab * self.hidden

    @property
    def layer_params(self) -> int:
        return self.attn_params_per_layer + self.mlp_params_per_layer

    @property
    def params(self) -> int:
        """Total parameters, derived from the architecture."""
        head = 0 if self.tied_embeddings else self.head_params
        return self.n_layers * self.layer_params + self.embed_params + head + self.hidden

    @property
    def active_layer_params(self) -> int:
        """Parameters one token multiplies through in one layer (k experts for MoE)."""
        k = self.n_active_experts if self.is_moe else 1
        return self.attn_params_per_layer + k * self.expert_params

    @property
    def active_params(self) -> int:
        return self.n_layers * self.active_layer_params + self.head_params

    def kv_bytes_per_token(self, kv_bytes: float) -> float:
        """K and V for every layer: 2 · layers · kv_heads · head_dim · bytes."""
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * kv_bytes
