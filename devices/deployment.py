"""What the engine asks the device layer about: a deployment and the shape of a batch."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DeploymentSpec:
    """Model × quantisation × chip × count × parallelism × engine (+ engine knobs).

    ``count`` is the total number of chips; ``None`` means ``tp × pp`` for GPUs/TPUs and
    "computed from the weights" for SRAM chips (Groq, Cerebras). ``tp`` defaults to ``count``.
    ``n_gpu_layers`` (llama.cpp) defaults to as many as fit. ``built_for`` is the GPU
    architecture an ahead-of-time engine (TensorRT-LLM) was built for; ``None`` = this chip's.
    ``max_context`` defaults to the model's, capped by KV capacity (4096 for llama.cpp's n_ctx;
    8192 for a computed SRAM chip count). ``max_batch``/``max_input_len``/``max_seq_len`` are
    the build limits of an ahead-of-time engine and the scheduler's sequence cap.
    """

    model: str
    quant: str
    chip: str
    engine: str
    count: int | None = None
    tp: int | None = None
    pp: int | None = None
    n_gpu_layers: int | None = None
    built_for: str | None = None
    gpu_mem_utilisation: float = 0.9
    max_context: int | None = None
    max_batch: int = 256
    max_batched_tokens: int | None = None
    max_input_len: int | None = None
    max_seq_len: int | None = None
    host: str | None = None
    ssd: str | None = None


@dataclass(frozen=True)
class BatchShape:
    """One engine step: prefill chunks ``(num_tokens, start_position)`` and decode contexts.

    ``decode`` holds, for each sequence generating one token this step, the number of tokens
    already in its KV cache (the context the new token attends to).
    """

    prefill: tuple[tuple[int, int], ...] = ()
    decode: tuple[int, ...] = ()

    @property
    def num_tokens(self) -> int:
        return sum(n for n, _ in self.prefill) + len(self.decode)

    @property
    def num_seqs(self) -> int:
        return len(self.prefill) + len(self.decode)
