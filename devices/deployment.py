"""What the engine asks the device layer about: a deployment and the shape of a batch."""

from __future__ import annotations

from dataclasses import dataclass

from devices.speculative import SpeculativeConfig


@dataclass(frozen=True)
class DeploymentSpec:
    """Model × quantisation × chip × count × parallelism × engine (+ engine knobs).

    Parallelism: ``count = tp × pp × dp`` chips. ``tp`` shards every layer, ``pp`` splits the
    layers into stages, ``dp`` replicates attention (each replica holds its own sequences and
    KV: data-parallel attention as SGLang and vLLM run DeepSeek). ``ep`` shards a MoE model's
    experts over that many of a stage's ``tp × dp`` chips (it must divide it); ``ep`` 1 keeps
    every expert tensor-parallel like a dense MLP. Defaults: ``count`` None means ``tp × pp``
    (× ``ep`` when only ``ep`` is given) for GPUs/TPUs and "computed from the weights" for SRAM
    chips (Groq, Cerebras); ``tp`` None means ``count / pp`` — or 1 when ``ep`` is given, so
    ``count 8, ep 8`` is 8 attention replicas with experts spread over all 8 chips.
    ``n_gpu_layers`` (llama.cpp) defaults to as many as fit. ``built_for`` is the GPU
    architecture an ahead-of-time engine (TensorRT-LLM) was built for; ``None`` = this chip's.
    ``max_context`` defaults to the model's, capped by KV capacity (4096 for llama.cpp's n_ctx;
    8192 for a computed SRAM chip count). ``max_batch``/``max_input_len``/``max_seq_len`` are
    the build limits of an ahead-of-time engine and the scheduler's sequence cap (SRAM chip
    counts are sized to hold ``max_batch`` sequences of ``max_context`` tokens).
    ``kv_cache_dtype``: 'auto' (the quantisation's default) or 'fp8' (1 byte per element).
    ``speculative``: speculative decoding (see ``devices.speculative``).
    ``gpu_mem_utilisation``: the engine's memory share (vLLM's ``--gpu-memory-utilization``,
    SGLang's ``--mem-fraction-static``, TensorRT-LLM's ``free_gpu_memory_fraction``; what each
    means: ``devices.specs.MemoryRule``); None: the engine's default.
    ``kv_cache_memory_bytes``: the KV cache per chip, whatever the share (vLLM's
    ``--kv-cache-memory-bytes``); it must still fit beside weights and activations.
    ``cpu_offload_bytes``: weights per chip kept in pinned host memory and read over the host
    link in every forward pass (vLLM's and SGLang's ``--cpu-offload-gb``).
    ``enforce_eager`` (vLLM's ``--enforce-eager``): an engine that replays captured graphs
    launches every kernel from the host instead.
    ``convert``/``num_labels``: the model served as a pooling model (vLLM's ``--convert``).
    """

    model: str
    quant: str
    chip: str
    engine: str
    count: int | None = None
    tp: int | None = None
    pp: int | None = None
    ep: int | None = None
    n_gpu_layers: int | None = None
    built_for: str | None = None
    gpu_mem_utilisation: float | None = None
    kv_cache_memory_bytes: int | None = None
    cpu_offload_bytes: int = 0
    max_context: int | None = None
    max_batch: int = 256
    max_batched_tokens: int | None = None
    max_input_len: int | None = None
    max_seq_len: int | None = None
    host: str | None = None
    ssd: str | None = None
    kv_cache_dtype: str = "auto"
    speculative: SpeculativeConfig | None = None
    enforce_eager: bool = False
    convert: str = ""  # "embed" | "classify": a generative checkpoint served by the pooling
    num_labels: int = 0  # runner (ModelSpec.as_pooling); a classifier's labels


@dataclass(frozen=True)
class BatchShape:
    """One engine step: prefill chunks ``(num_tokens, start_position)`` and decode contexts.

    ``decode`` holds, for each sequence generating one token this step, the number of tokens
    already in its KV cache (the context the new token attends to). ``spec_tokens`` > 0: each
    decode is a speculative verification of 1 + spec_tokens tokens, after spec_tokens passes
    of the draft model (its cost is part of the step). A tree (SGLang's EAGLE, ``spec_topk``
    > 1) verifies 1 + ``spec_verify`` tokens per decode, and its draft passes after the first
    run ``spec_topk`` branches per decode (``SpeculativeConfig``, ``speculating``).
    """

    prefill: tuple[tuple[int, int], ...] = ()
    decode: tuple[int, ...] = ()
    spec_tokens: int = 0
    spec_verify: int = 0  # (0: spec_tokens, a chain's)
    spec_topk: int = 1

    @classmethod
    def speculating(cls, prefill: tuple[tuple[int, int], ...], decode: tuple[int, ...],
                    spec: SpeculativeConfig) -> BatchShape:
        """A step whose decodes verify `spec`'s drafts."""
        return cls(prefill, decode, spec.num_speculative_tokens, spec.drafts_per_step,
                   spec.eagle_topk)

    @property
    def query_tokens(self) -> int:
        """Tokens each decode runs through the model: its own and the drafts it verifies."""
        return 1 + (self.spec_verify or self.spec_tokens)

    @property
    def num_tokens(self) -> int:
        return sum(n for n, _ in self.prefill) + len(self.decode) * self.query_tokens

    @property
    def num_seqs(self) -> int:
        return len(self.prefill) + len(self.decode)
