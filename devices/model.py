"""ModelSpec: a model's architecture from its published config.json, and what follows from it.

The parameter count is derived (and checked by tests against the published one). Layers may be
of two kinds — dense or mixture-of-experts (DeepSeek's first 3 layers are dense; Llama 4
Maverick alternates) — and attention of three — grouped-query (K and V per KV head), MLA
(DeepSeek: one compressed latent of ``kv_lora_rank + qk_rope_head_dim`` per token and layer,
shared by all heads) and sliding-window (gpt-oss alternates full and 128-token windows, Gemma 3
keeps 5 local layers per global one): a sliding layer never holds more than ``sliding_window``
tokens of a sequence. The cost model works on per-layer *averages* (dense and expert bytes,
FLOPs), which is exact for totals over all layers.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ModelSpec:
    """Architecture figures from the model's published config.json (names in the TOML)."""

    id: str
    name: str
    n_layers: int
    hidden: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn: int  # dense MLP intermediate size (all-MoE models: the per-expert size)
    vocab: int
    max_context: int
    tied_embeddings: bool = False
    n_experts: int = 0  # routed experts per MoE layer; 0 = dense
    n_active_experts: int = 0
    expert_ffn: int = 0  # moe_intermediate_size; 0 = ffn
    n_shared_experts: int = 0
    shared_ffn: int = 0  # intermediate size of the shared expert(s); 0 = expert_ffn
    first_dense_layers: int = 0  # DeepSeek first_k_dense_replace
    moe_every: int = 1  # every k-th layer after those is MoE (Llama 4 Maverick: 2)
    qk_norm: bool = False
    attn_bias: bool = False  # q/k/v/o projection biases (gpt-oss)
    expert_bias: bool = False  # expert projection biases (gpt-oss)
    q_lora_rank: int = 0  # MLA (DeepSeek): 0 = no query compression
    kv_lora_rank: int = 0  # MLA latent size; 0 = standard attention
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    sliding_window: int = 0  # tokens a sliding-window (or chunked) layer attends to
    sliding_layers: int = 0  # how many layers use the window
    mtp_layers: int = 0  # multi-token-prediction layers shipped beside the model (DeepSeek)
    architecture: str = ""  # config.json's `architectures[0]` (SGLang keys speculative defaults
    #                         on it: sglang_spec.py); "" where the catalogue does not say
    # --- encoders (BERT, XLM-RoBERTa): what their config.json says differently from a decoder
    encoder_only: bool = False  # bidirectional attention (vLLM's attn_type "encoder_only")
    gated_mlp: bool = True  # False: an up and a down projection around GELU (BERT), no gate
    mlp_bias: bool = False  # MLP projection biases (BERT)
    norm_bias: bool = False  # LayerNorm (a weight and a bias) instead of RMSNorm (a weight)
    max_position_embeddings: int = 0  # learned absolute positions (0: rotary, none learned)
    type_vocab_size: int = 0  # learned token-type (segment) rows
    head_dense: bool = False  # a hidden × hidden layer (+ bias) on the pooled token: BERT's
    #                           pooler, RoBERTa's classification head (its out_proj is in the
    #                           same ASSUMPTION as `as_pooling`'s score head)
    # --- pooling models (embeddings): what vLLM reads from the repository beside config.json
    lm_head: bool = True  # False: the checkpoint ships no output projection (an embedding model)
    pooling_task: str = ""  # "embed": vLLM's runner "pooling" (Sentence Transformers modules.json)
    pooling_type: str = ""  # how the pooler reduces the tokens: "LAST" (1_Pooling/config.json)
    matryoshka: bool = False  # config.json's is_matryoshka / matryoshka_dimensions (vLLM's rule)
    num_labels: int = 0  # a classifier's outputs (task "classify"; 1: a cross-encoder's score)
    # config_sentence_transformers.json's `prompts`: Cohere's `input_type` → an instruction
    task_instructions: dict[str, str] = field(default_factory=dict, compare=False)
    published_params: float = 0.0
    published_active_params: float = 0.0
    source: str = field(default="", compare=False)

    # -- kinds ---------------------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.n_experts > 0

    @property
    def holds_kv(self) -> bool:
        """Whether serving keeps a KV cache. An encoder attends over the whole prompt in one
        pass and keeps nothing for a next step: no KV cache, so no prefix caching and no
        chunked prefill (vLLM 0.33.0: EncoderOnlyAttention has no KV-cache spec; ModelConfig
        `is_prefix_caching_supported` and `is_chunked_prefill_supported` are false)."""
        return not self.encoder_only

    @property
    def is_pooling(self) -> bool:
        """Served by vLLM's pooling runner: no token is generated; a request's answer is the
        pooled hidden state of its prompt (an embedding), ready when its prefill ends."""
        return bool(self.pooling_task)

    def as_pooling(self, task: str, num_labels: int = 0) -> ModelSpec:
        """This model served by vLLM's pooling runner though its checkpoint is generative
        (`--convert embed|classify`, or `--hf-overrides` naming a `*ForSequenceClassification`
        architecture): the LM head is dropped and the last token's hidden state pooled; a
        classifier reads it through a score head of `num_labels` rows, built from LM-head rows
        (vLLM's `as_seq_cls_model`). ASSUMPTION: that head (num_labels × hidden, 1,024 to
        4,096 parameters for a reranker) is left out of weights and FLOPs, < 1e-5 of either."""
        return dataclasses.replace(self, lm_head=False, pooling_task=task,
                                   pooling_type=self.pooling_type or "LAST",
                                   num_labels=num_labels if task == "classify" else 0)

    @property
    def embedding_size(self) -> int:
        """Length of a pooled vector (vLLM's `ModelConfig.embedding_size`: the hidden size)."""
        return self.hidden

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def n_moe_layers(self) -> int:
        if not self.is_moe:
            return 0
        return (self.n_layers - self.first_dense_layers) // max(1, self.moe_every)

    @property
    def n_dense_layers(self) -> int:
        return self.n_layers - self.n_moe_layers

    # -- parameters per part -------------------------------------------------------------
    @property
    def attn_params_per_layer(self) -> int:
        h, nh = self.hidden, self.n_heads
        norms = (4 if self.norm_bias else 2) * h
        if self.is_mla:
            qk = self.qk_nope_head_dim + self.qk_rope_head_dim
            if self.q_lora_rank:
                q = h * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * nh * qk
            else:
                q = h * nh * qk
            kv = h * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank
            kv += self.kv_lora_rank * nh * (self.qk_nope_head_dim + self.v_head_dim)
            o = nh * self.v_head_dim * h
            return q + kv + o + norms
        q = h * nh * self.head_dim
        kv = 2 * h * self.n_kv_heads * self.head_dim
        o = nh * self.head_dim * h
        bias = (nh + 2 * self.n_kv_heads) * self.head_dim + h if self.attn_bias else 0
        return q + kv + o + bias + norms + (2 * self.head_dim if self.qk_norm else 0)

    @property
    def dense_mlp_params(self) -> int:
        h, f = self.hidden, self.ffn
        if self.gated_mlp:
            return 3 * h * f + (2 * f + h if self.mlp_bias else 0)
        return 2 * h * f + (f + h if self.mlp_bias else 0)

    @property
    def expert_params(self) -> int:
        """One routed expert (gate, up and down projections), or the dense MLP if not MoE."""
        f = self.expert_ffn or self.ffn
        if not self.is_moe:
            return self.dense_mlp_params
        return 3 * self.hidden * f + (2 * f + self.hidden if self.expert_bias else 0)

    @property
    def shared_params(self) -> int:
        f = self.shared_ffn or self.expert_ffn or self.ffn
        return self.n_shared_experts * 3 * self.hidden * f

    @property
    def router_params(self) -> int:
        return self.hidden * self.n_experts + (self.n_experts if self.expert_bias else 0)

    @property
    def embed_params(self) -> int:
        """The token embedding, with an encoder's learned position and token-type rows."""
        return (self.vocab + self.max_position_embeddings + self.type_vocab_size) * self.hidden

    @property
    def outer_params(self) -> int:
        """Parameters outside the layers but the embedding and the head: one norm (the final
        RMSNorm; an encoder's embedding LayerNorm) and an encoder's pooled dense layer."""
        h = self.hidden
        return (2 * h if self.norm_bias else h) + (h * h + h if self.head_dense else 0)

    @property
    def head_params(self) -> int:
        """LM head (output projection) parameters, shared with the embedding when tied; none
        for a checkpoint without one (an embedding model: its pooler reads the hidden state)."""
        return self.vocab * self.hidden if self.lm_head else 0

    # -- per-layer averages (what the cost model multiplies by layers) --------------------
    @property
    def dense_layer_params(self) -> float:
        """Non-expert parameters of an average layer: attention, dense MLPs, shared experts,
        routers. Every token reads and multiplies through all of them."""
        moe = self.n_moe_layers * (self.shared_params + self.router_params)
        return self.attn_params_per_layer + (self.n_dense_layers * self.dense_mlp_params
                                             + moe) / self.n_layers

    @property
    def mlp_params_per_layer(self) -> float:
        """Routed-expert parameters of an average layer (0 for a dense model)."""
        return self.n_moe_layers * self.n_experts * self.expert_params / self.n_layers

    @property
    def layer_params(self) -> float:
        return self.dense_layer_params + self.mlp_params_per_layer

    @property
    def active_expert_params_per_layer(self) -> float:
        return self.n_moe_layers * self.n_active_experts * self.expert_params / self.n_layers

    @property
    def active_layer_params(self) -> float:
        """Parameters one token multiplies through in an average layer (k experts for MoE)."""
        return self.dense_layer_params + self.active_expert_params_per_layer

    @property
    def params(self) -> int:
        """Total parameters, derived from the architecture (MTP layers not included)."""
        head = 0 if self.tied_embeddings else self.head_params
        layers = round(self.n_layers * self.layer_params)
        return layers + self.embed_params + head + self.outer_params

    @property
    def active_params(self) -> float:
        return self.n_layers * self.active_layer_params + self.head_params

    # -- attention and KV ----------------------------------------------------------------
    @property
    def kv_elems_per_layer(self) -> int:
        """KV-cache elements per token and layer: K and V per KV head, or MLA's latent; none for
        an encoder (it keeps no KV cache)."""
        if not self.holds_kv:
            return 0
        if self.is_mla:
            return self.kv_lora_rank + self.qk_rope_head_dim
        return 2 * self.n_kv_heads * self.head_dim

    @property
    def kv_shards(self) -> int:
        """Tensor-parallel ranks the KV cache can be split over: one per KV head; MLA's latent
        is shared by all heads, so every rank keeps all of it."""
        return 1 if self.is_mla else self.n_kv_heads

    def kv_bytes_per_token(self, kv_bytes: float) -> float:
        """KV bytes of one token in every layer (as if all layers attended to everything)."""
        return self.n_layers * self.kv_elems_per_layer * kv_bytes

    @property
    def full_layers(self) -> int:
        return self.n_layers - self.sliding_layers

    def kv_bytes_for_context(self, ctx: int, kv_bytes: float) -> float:
        """KV bytes a sequence of ``ctx`` tokens holds: sliding layers keep their window only."""
        per = self.kv_elems_per_layer * kv_bytes
        window = min(ctx, self.sliding_window) if self.sliding_layers else 0
        return per * (self.full_layers * ctx + self.sliding_layers * window)

    def kv_bytes_per_context_token(self, ctx: int, kv_bytes: float) -> float:
        """Average KV bytes per token of a ``ctx``-token sequence (sizes the KV pool)."""
        return self.kv_bytes_for_context(ctx, kv_bytes) / max(1, ctx)

    @property
    def attn_flops_per_unit(self) -> float:
        """Attention FLOPs per (query token × context token) per layer: QKᵀ and PV. MLA runs
        absorbed: queries meet the latent (kv_lora + rope dims), values come from the latent."""
        if self.is_mla:
            return 2 * self.n_heads * (2 * self.kv_lora_rank + self.qk_rope_head_dim)
        return 4 * self.n_heads * self.head_dim
