"""LoRA adapters on the emulated device: how big an adapter is, what its low-rank matmuls cost
per step, and what loading one onto the device costs.

Why here: an adapter's size and cost follow from the model's shapes (the catalogue) and the
chip's rates (the fitted plan), exactly like the base model's; the engine only says which
adapters (by rank) a step runs over how many tokens, and which it had to bring onto the device.

**Target modules** (an ASSUMPTION, stated once): every adapter targets every linear layer vLLM
can apply LoRA to in a Llama-style decoder — the attention projections q, k, v, o and the
dense MLP's gate, up, down (vLLM packs them as `qkv_proj`, `o_proj`, `gate_up_proj`,
`down_proj`: `packed_modules_mapping` and the LoRA-supported modules of
`vllm/model_executor/models/llama.py`; PEFT's `target_modules="all-linear"`). MoE expert layers
are not targeted (their layers' attention is). That is the largest adapter vLLM allocates slots
for at a given rank, so the figures are an upper bound for adapters trained on q, v only.

**Sizes**: a module of `d_in → d_out` gets A (`r × d_in`) and B (`d_out × r`): `r·(d_in+d_out)`
parameters, in the model's activation dtype (16-bit: vLLM's `lora_dtype` "auto" is the model
dtype). **Per token** the adapter adds `2·r·(d_in+d_out)` FLOPs per module (shrink, then
expand); **per step** each distinct adapter's A and B are read once (shared by its tokens, as
the base weights are), and the kernels (a shrink and an expand per packed module per layer, as
vLLM's punica kernels) pay the engine's per-kernel overhead. The time is a roofline at the
plan's own achieved bandwidth and FLOP rate, per segment, added after the base step.

**Load**: an adapter not resident on the device is copied over the host link
(`ChipSpec.host_link_bw_bps`, PCIe/NVLink-C2C figures with their sources in
`catalog/chips.toml`), each chip receiving its share over its own link (ASSUMPTION: adapters
sharded like the base weights). A chip with unified memory (`host_link_bw_bps = 0`) copies
nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from devices.placed import Placement
from devices.plan import ACT_BYTES
from devices.specs import ModelSpec

LORA_BYTES = ACT_BYTES  # adapter weights in the model's 16-bit dtype (vLLM lora_dtype "auto")
ATTENTION_MODULES = ("q", "k", "v", "o")
MLP_MODULES = ("gate", "up", "down")
KERNELS_PER_LAYER = 2 * 4  # shrink + expand for qkv_proj, o_proj, gate_up_proj, down_proj


def module_dims(model: ModelSpec) -> dict[str, tuple[int, int]]:
    """(d_in, d_out) of every targeted module of one layer."""
    q_out = model.n_heads * model.head_dim
    kv_out = model.n_kv_heads * model.head_dim
    return {
        "q": (model.hidden, q_out), "k": (model.hidden, kv_out), "v": (model.hidden, kv_out),
        "o": (q_out, model.hidden),
        "gate": (model.hidden, model.ffn), "up": (model.hidden, model.ffn),
        "down": (model.ffn, model.hidden),
    }


def params_per_rank(model: ModelSpec) -> float:
    """Adapter parameters per unit of rank, the whole model (A and B of every module)."""
    dims = module_dims(model)
    attn = sum(sum(dims[m]) for m in ATTENTION_MODULES) * model.n_layers
    dense_layers = model.n_layers - model.n_moe_layers if model.is_moe else model.n_layers
    mlp = sum(sum(dims[m]) for m in MLP_MODULES) * dense_layers
    return float(attn + mlp)


def adapter_bytes(model: ModelSpec, rank: int) -> float:
    """Bytes of one adapter of `rank` (what a load moves, what a step reads)."""
    return params_per_rank(model) * rank * LORA_BYTES


@dataclass(frozen=True, slots=True)
class LoraStepCost:
    """What the adapters of one step add: `seconds` (matmuls + kernels + loads), of which
    `load_s` copying adapters onto the device; `flops`, `bytes` (adapter weights read and
    loaded, all chips)."""

    seconds: float = 0.0
    load_s: float = 0.0
    flops: float = 0.0
    bytes: float = 0.0


NO_LORA = LoraStepCost()


class LoraCostModel:
    """Per-placement constants for adapters, computed once (the engine prices every step)."""

    def __init__(self, placement: Placement) -> None:
        self.placement = placement
        model = placement.model
        self.per_rank = params_per_rank(model)
        self.n_layers = model.n_layers
        self.host_bw = placement.chip.host_link_bw_bps * placement.chips
        # per segment: (layer share, chips sharing it, s/byte, s/FLOP, s/kernel) × stage repeats
        self._segments: list[tuple[float, int, float, float, float, int]] = []
        for stage in placement.plan.stages:
            for seg in stage.segments:
                dense = sum(b for _, b in seg.weight_bytes) * (1.0 - seg.expert_fraction)
                s_byte = seg.dense_s / dense if dense else 0.0
                s_flop = seg.flop_s / seg.flops_per_token if seg.flops_per_token else 0.0
                s_kernel = seg.overhead_s / seg.kernels if seg.kernels else 0.0
                self._segments.append((seg.layers / self.n_layers, seg.tp, s_byte, s_flop,
                                       s_kernel, stage.repeat))

    def bytes(self, rank: int) -> float:
        return self.per_rank * rank * LORA_BYTES

    def load_seconds(self, rank: int) -> float:
        """Copying one adapter onto the device over the host link (0 with unified memory)."""
        return self.bytes(rank) / self.host_bw if self.host_bw > 0 else 0.0

    def step(self, tokens_by_adapter: Iterable[tuple[int, int]],
             loaded_ranks: Iterable[int] = ()) -> LoraStepCost:
        """The cost of a step whose adapters (rank, tokens) run in it, `loaded_ranks` being
        the ranks of the adapters it first had to copy onto the device."""
        items = [(r, n) for r, n in tokens_by_adapter if n > 0]
        loads = [r for r in loaded_ranks]
        if not items and not loads:
            return NO_LORA
        read = sum(self.per_rank * r for r, _ in items) * LORA_BYTES
        flops = sum(2.0 * self.per_rank * r * n for r, n in items)
        kernels = KERNELS_PER_LAYER * self.n_layers if items else 0
        seconds = 0.0
        for share, chips, s_byte, s_flop, s_kernel, repeat in self._segments:
            mem = read * share / chips * s_byte
            comp = flops * share / chips * s_flop
            seconds += (max(mem, comp) + kernels * share * s_kernel) * repeat
        load_bytes = sum(self.bytes(r) for r in loads)
        load_s = load_bytes / self.host_bw if self.host_bw > 0 else 0.0
        return LoraStepCost(seconds + load_s, load_s, flops, read + load_bytes)
