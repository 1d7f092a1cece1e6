"""Compile behaviour per engine: a small stateful strategy the engine asks before each step.

* ``none`` (llama.cpp, vLLM, SGLang, Cerebras): eager; no stalls.
* ``ahead_of_time`` (TensorRT-LLM): the engine is built at deploy time (a ``cold`` start pays
  the build) with limits on batch, input length, sequence length and tokens per step; a step
  outside them raises :class:`devices.errors.ShapeError` (the scheduler must stay inside).
  A plan built for another architecture is refused at placement (``built_for``).
* ``per_shape`` (XLA/JetStream, MLX ``mx.compile``): the first step of a new shape bucket
  compiles, then it is cached; JetStream pads prefill to power-of-two buckets (16…32,768) and
  decode batches to powers of two, and the padding costs compute (``padded``).
* ``static`` (Groq): one whole program for one (batch, context bucket); any other shape forces a
  recompile during which the pipeline idles. Padding/holding to the compiled shape instead is
  the scheduler's policy (``padded``/``fits_compiled`` tell it what that costs).

A strategy starts in its built state (TensorRT-LLM's engine, JetStream's warmed buckets,
Groq's first program). A cold start is paid once, up front, by whoever runs the engine
(``startup_seconds(cold=True)``: the server's start-up window, a virtual replica's first
seconds, an autoscaled replica's boot); it is not charged again at the first step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from devices.deployment import BatchShape
from devices.errors import ShapeError
from devices.placed import Placement

# hardware.md, "Compile and launch behaviour": measured TensorRT-LLM builds.
MEASURED_BUILDS = ((124e6, 41.0), (1e9, 120.0), (6e9, 300.0))  # (parameters, seconds)
MIN_BUCKET, MAX_BUCKET = 16, 32768  # JetStream prefill buckets


def _bucket(n: int, lo: int = 1) -> int:
    return max(lo, 1 << max(0, math.ceil(math.log2(max(1, n)))))


def build_seconds(params: float) -> float:
    """TensorRT-LLM build time: a power law fitted (log-log least squares) to the measured
    builds (41 s GPT-2, ~2 min 1B, ~5 min 6B); 70B → ~17 min, inside the 10–40 min claimed."""
    xs = [math.log(p) for p, _ in MEASURED_BUILDS]
    ys = [math.log(s) for _, s in MEASURED_BUILDS]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    b /= sum((x - mx) ** 2 for x in xs)
    return math.exp(my + b * (math.log(params) - mx))


@dataclass(frozen=True)
class Stall:
    """How long a step waits before it can run, and why (``reason`` is None for no stall)."""

    seconds: float = 0.0
    reason: str | None = None


NO_STALL = Stall()


class CompileStrategy:
    """Base: eager execution (``none``)."""

    kind = "none"

    def __init__(self, placement: Placement) -> None:
        self.placement = placement
        self.compiles = 0
        self.compile_seconds = 0.0

    def startup_seconds(self, cold: bool) -> float:
        """Seconds before the deployment serves: weight load (+ build/compile when cold)."""
        return self.placement.load_seconds if cold else 0.0

    def padded(self, batch: BatchShape) -> BatchShape:
        """The batch as the compiled program runs it (padding costs compute)."""
        return batch

    def before_step(self, batch: BatchShape) -> Stall:
        return NO_STALL

    def _stall(self, seconds: float, reason: str) -> Stall:
        self.compiles += 1
        self.compile_seconds += seconds
        return Stall(seconds, reason)


class AheadOfTime(CompileStrategy):
    kind = "ahead_of_time"

    def __init__(self, placement: Placement) -> None:
        super().__init__(placement)
        spec = placement.spec
        self.max_batch = spec.max_batch
        self.max_seq_len = spec.max_seq_len or placement.max_context
        self.max_input_len = spec.max_input_len or self.max_seq_len
        sched = placement.engine.scheduler.max_num_batched_tokens
        self.max_num_tokens = spec.max_batched_tokens or sched or self.max_seq_len
        self.build_s = build_seconds(placement.model.params)

    def startup_seconds(self, cold: bool) -> float:
        return super().startup_seconds(cold) + (self.build_s if cold else 0.0)

    def before_step(self, batch: BatchShape) -> Stall:
        limits = (
            (batch.num_seqs > self.max_batch, f"batch {batch.num_seqs} > max_batch "
             f"{self.max_batch}"),
            (batch.num_tokens > self.max_num_tokens, f"{batch.num_tokens} tokens > "
             f"max_num_tokens {self.max_num_tokens}"),
            (any(n + s > self.max_input_len for n, s in batch.prefill), "prompt longer than "
             f"max_input_len {self.max_input_len}"),
            (any(c + 1 > self.max_seq_len for c in batch.decode), "sequence longer than "
             f"max_seq_len {self.max_seq_len}"),
        )
        for broken, why in limits:
            if broken:
                raise ShapeError(f"outside the TensorRT-LLM engine's build limits: {why}; "
                                 "rebuild the engine with larger limits")
        return NO_STALL


class PerShape(CompileStrategy):
    kind = "per_shape"

    def __init__(self, placement: Placement) -> None:
        super().__init__(placement)
        self.bucketed = placement.engine.shape_buckets == "pow2"
        self.seen: set[tuple[str, int]] = set()
        if self.bucketed:  # JetStream compiles its buckets ahead (its warm-up, at start-up)
            self.seen |= set(self._warm_keys())

    def _warm_keys(self) -> list[tuple[str, int]]:
        """JetStream's ahead-of-time programs: every prefill bucket (16 … max context) and
        every power-of-two decode batch up to the deployment's batch cap."""
        top = min(MAX_BUCKET, _bucket(self.placement.max_context))
        prefill = [("prefill", 1 << i) for i in range(4, int(math.log2(top)) + 1)]
        batch = _bucket(self.placement.spec.max_batch)
        return prefill + [("decode", 1 << i) for i in range(int(math.log2(batch)) + 1)]

    def startup_seconds(self, cold: bool) -> float:
        per = self.placement.engine.compile_seconds
        extra = len(self._warm_keys()) * per if cold and self.bucketed else 0.0
        return super().startup_seconds(cold) + extra

    def padded(self, batch: BatchShape) -> BatchShape:
        if not self.bucketed:
            return batch
        pre = tuple((min(MAX_BUCKET, _bucket(n, MIN_BUCKET)), s) for n, s in batch.prefill)
        dec = batch.decode
        if dec:
            dec = dec + (max(dec),) * (_bucket(len(dec)) - len(dec))
        return replace(batch, prefill=pre, decode=dec)

    def _keys(self, batch: BatchShape) -> list[tuple[str, int]]:
        if self.bucketed:
            keys = [("prefill", min(MAX_BUCKET, _bucket(n, MIN_BUCKET))) for n, _ in batch.prefill]
            if batch.decode:
                keys.append(("decode", _bucket(len(batch.decode))))
            return keys
        keys = [("prefill", n) for n, _ in batch.prefill]
        return keys + ([("decode", len(batch.decode))] if batch.decode else [])

    def before_step(self, batch: BatchShape) -> Stall:
        new = [k for k in dict.fromkeys(self._keys(batch)) if k not in self.seen]
        if not new:
            return NO_STALL
        self.seen.update(new)
        shapes = ", ".join(f"{k} {v}" for k, v in new)
        per = self.placement.engine.compile_seconds
        return self._stall(per * len(new), f"compiling new shape ({shapes}), then cached")


class Static(CompileStrategy):
    kind = "static"

    def __init__(self, placement: Placement, hold: bool = False) -> None:
        super().__init__(placement)
        ctx = _bucket(placement.max_context)
        # hold: the program is compiled for the scheduler's batch cap and smaller batches are
        # padded to it (never a recompile); otherwise it follows the traffic and recompiles.
        self.hold = hold
        batch = placement.spec.max_batch if hold else 1
        self.shape: tuple[int, int] = (batch, ctx)

    def startup_seconds(self, cold: bool) -> float:
        compile_s = self.placement.engine.compile_seconds if cold else 0.0
        return super().startup_seconds(cold) + compile_s

    def shape_of(self, batch: BatchShape) -> tuple[int, int]:
        longest = max([n + s for n, s in batch.prefill] + [c + 1 for c in batch.decode] + [1])
        return batch.num_seqs, _bucket(longest)

    def fits_compiled(self, batch: BatchShape) -> bool:
        b, ctx = self.shape_of(batch)
        return b <= self.shape[0] and ctx <= self.shape[1]

    def padded(self, batch: BatchShape) -> BatchShape:
        if not self.fits_compiled(batch):
            return batch
        missing = self.shape[0] - batch.num_seqs
        dec = batch.decode + (max(batch.decode, default=0),) * missing
        return replace(batch, decode=dec)

    def before_step(self, batch: BatchShape) -> Stall:
        b, ctx = self.shape_of(batch)
        old = self.shape
        if ctx <= old[1] and (b == old[0] or (self.hold and b <= old[0])):
            return NO_STALL
        self.shape = shape = (b, max(ctx, old[1]))
        return self._stall(
            self.placement.engine.compile_seconds,
            f"recompile: batch {shape[0]} / context ≤ {shape[1]} differs from compiled batch "
            f"{old[0]} / context ≤ {old[1]}",
        )


_KINDS: dict[str, type[CompileStrategy]] = {
    "none": CompileStrategy,
    "ahead_of_time": AheadOfTime,
    "per_shape": PerShape,
    "static": Static,
}


def make_compile_strategy(placement: Placement, hold: bool = False) -> CompileStrategy:
    """The engine's compile strategy for this placement, built (see the module docstring).

    ``hold`` (static programs only): compile once for the batch cap and pad to it, instead of
    recompiling whenever the batch size changes."""
    if placement.engine.compile == "static":
        return Static(placement, hold)
    return _KINDS[placement.engine.compile](placement)
