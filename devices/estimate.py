"""``estimate``: a llama-bench-like single point for a deployment (what ``doppelchip estimate``
prints): prefill and decode rates, TTFT, TPOT, memory per tier, energy and dollars.

SRAM deployments (chip placement 'sram') without a chip count are sized for the question:
enough chips for the weights plus ``batch`` sequences of ``prompt + output`` tokens. Prefill
is packed into steps of the engine's token budget exactly as the scheduler packs it (chunks
of ``max_num_batched_tokens``; whole prompts when the engine does not chunk). With speculative
decoding a decode step yields 1 + Σ rateᵏ tokens on average (``SpeculativeConfig``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from devices import catalog
from devices.cost import StepCost, step_cost
from devices.deployment import BatchShape, DeploymentSpec
from devices.errors import DeviceError
from devices.pipeline import cycle_cost
from devices.place_hbm import step_budget
from devices.place_sram import chips_needed
from devices.placed import FactorTable, Placement
from devices.placement import place, served_model

DECODE_SAMPLES = 8  # decode steps evaluated (evenly spread over the output) and averaged
UNITS = {
    "prefill_tokens_per_s": "tok/s", "decode_tokens_per_s": "tok/s per sequence",
    "output_tokens_per_s": "tok/s", "end_to_end_tokens_per_s": "tok/s", "ttft_s": "s",
    "tpot_s": "s", "joules_per_mtok": "J per 1M output tokens",
    "usd_per_mtok": "USD per 1M output tokens", "usd_per_hour": "USD/h", "memory_bytes": "B",
    "kv_tokens": "tokens", "max_context": "tokens", "tokens_per_step": "tokens",
    "memory_share": "of each chip's memory (the engine's rule)",
    # an embedding model's (ModelSpec.is_pooling): its requests end with their prefill
    "embeddings_per_s": "prompts/s", "joules_per_m_input_tok": "J per 1M input tokens",
    "usd_per_m_input_tok": "USD per 1M input tokens",
}
POOLING_NOTE = ("a pooling model (embeddings, a classifier): a request ends with its prefill and "
                "generates nothing "
                "(docs/EMBEDDINGS.md); the decode and output figures are its body's per-token "
                "cost, not what it serves")
ENCODER_NOTE = ("an encoder: each prompt attends to itself both ways in one pass and keeps no KV "
                "cache (kv_tokens 0), so the sequence cap, not memory, bounds max_concurrency")


def _sig(x: float, digits: int = 5) -> float:
    if x == 0 or not math.isfinite(x):
        return x
    return round(x, digits - 1 - math.floor(math.log10(abs(x))))


def prefill_steps(placement: Placement, prompt: int, batch: int) -> list[BatchShape]:
    """The prefill of ``batch`` prompts packed into steps as the scheduler packs them: chunks
    of at most the token budget, or whole prompts up to ``max_context`` when unchunked."""
    chunk = step_budget(placement.spec, placement.engine, placement.chip)
    budget = chunk or placement.max_context
    steps: list[BatchShape] = []
    cur: list[tuple[int, int]] = []
    room = budget
    for _ in range(batch):
        if chunk is None and 0 < room < prompt and cur:  # a whole prompt waits for a step
            steps.append(BatchShape(prefill=tuple(cur)))
            cur, room = [], budget
        pos = 0
        while pos < prompt:
            n = min(prompt - pos, room)
            cur.append((n, pos))
            pos += n
            room -= n
            if room == 0:
                steps.append(BatchShape(prefill=tuple(cur)))
                cur, room = [], budget
    if cur:
        steps.append(BatchShape(prefill=tuple(cur)))
    return steps


def decode_contexts(prompt: int, output: int, samples: int = DECODE_SAMPLES) -> list[int]:
    """Context lengths at which decode is sampled (midpoints of equal slices of the output)."""
    k = max(1, min(output, samples))
    return [prompt + int((j + 0.5) * output / k) for j in range(k)]


def pipelined_prefill(placement: Placement, shape: BatchShape) -> tuple[float, float]:
    """(seconds, joules) of one prefill step; across pipeline stages it is split into ``m``
    micro-chunks in flight (latency of one + (m − 1) × slowest stage), best ``m`` chosen."""
    stages = sum(s.repeat for s in placement.plan.stages)
    cost = step_cost(placement, shape)
    best = (cost.seconds, cost.joules)
    if stages == 1 or len(shape.prefill) != 1:
        return best
    n, start = shape.prefill[0]
    m = 2
    while m <= min(n, stages):
        size = -(-n // m)
        c = step_cost(placement, BatchShape(prefill=((size, start + n - size),)))
        seconds = c.seconds + (m - 1) * c.interval_s
        if seconds < best[0]:
            idle_w = placement.plan.rank_idle_w
            busy = c.joules - c.seconds * idle_w
            best = (seconds, m * busy + seconds * idle_w)
        m *= 2
    return best


def decode_cycle(placement: Placement, ctx: int, batch: int) -> tuple[float, StepCost, int]:
    """Seconds until every one of ``batch`` sequences has one more step, at context ``ctx``
    (pipelined over the deployment's stages: see ``devices.pipeline``)."""
    sp, decode = placement.spec.speculative, (ctx,) * batch
    shape = BatchShape.speculating((), decode, sp) if sp else BatchShape(decode=decode)
    cycle = cycle_cost(placement, shape)
    return cycle.seconds, cycle.micro, cycle.micro_batches


def sized_for(spec: DeploymentSpec, prompt: int, output: int, batch: int) -> DeploymentSpec:
    """The deployment ``estimate`` prices: an SRAM chip count sized for the batch and context
    when none is given (other deployments unchanged)."""
    chip = catalog.get_chip(spec.chip)
    if chip.placement != "sram" or spec.count is not None:
        return spec
    ctx = max(spec.max_context or 0, prompt + output)
    model, quant = served_model(spec), catalog.get_quant(spec.quant)
    n = chips_needed(spec, model, quant, chip, batch, ctx)
    return dataclasses.replace(spec, count=n, max_context=ctx, max_batch=max(spec.max_batch,
                                                                              batch))


def estimate(
    spec: DeploymentSpec,
    prompt: int,
    output: int,
    batch: int,
    factor_table: FactorTable,
    ranks: int = 1,
) -> dict[str, Any]:
    """One point: ``batch`` sequences of ``prompt`` tokens in, ``output`` tokens out.

    ``ranks`` > 1: the point of one of that many data-parallel engine cores (``place``'s
    ``ranks``; balanced DP: every rank carries such a batch). Chips, rates, memory and price
    are that rank's; the group's are ``ranks`` times them.

    Returns ``{"fits": False, "error": ...}`` when the deployment (or this batch) cannot be
    placed. Rates: ``decode_tokens_per_s`` per sequence, ``output_tokens_per_s`` for the whole
    batch; ``*_per_mtok`` per million output tokens (prefill included). ``units`` names the
    unit of every figure.
    """
    if prompt < 0 or output < 1 or batch < 1:
        return {"fits": False, "error": "prompt must be >= 0, output and batch >= 1"}
    try:
        placement = place(sized_for(spec, prompt, output, batch), factor_table, ranks)
    except DeviceError as exc:
        return {"fits": False, "error": str(exc)}
    need = prompt + output
    if need > placement.max_context:
        return {"fits": False, "error": f"prompt + output = {need} tokens exceeds the max "
                f"context {placement.max_context} of this deployment"}
    if batch > placement.max_concurrency(need) and batch > 1:
        return {"fits": False, "error": f"batch {batch} of {need}-token sequences exceeds KV "
                f"capacity ({placement.kv_tokens} tokens; at most "
                f"{placement.max_concurrency(need)} at once)"}
    plan = placement.plan
    idle_w, usd_per_s = plan.rank_idle_w, plan.rank_usd_per_s
    prefill_s = prefill_j = 0.0
    for shape in prefill_steps(placement, prompt, batch):
        seconds, joules = pipelined_prefill(placement, shape)
        prefill_s += seconds
        prefill_j += joules
    sp = placement.spec.speculative
    per_step = sp.expected_tokens_per_step if sp else 1.0
    cycles = []
    joules = []
    mid: StepCost | None = None
    ctxs = decode_contexts(prompt, output)
    for i, ctx in enumerate(ctxs):
        cycle, cost, m = decode_cycle(placement, ctx, batch)
        busy = cost.joules - cost.seconds * idle_w
        cycles.append(cycle / per_step)
        joules.append((m * busy + cycle * idle_w) / per_step)
        if i == len(ctxs) // 2:
            mid = cost
    tpot = sum(cycles) / len(cycles)
    decode_s = tpot * output
    decode_j = sum(joules) / len(joules) * output
    out_tokens = batch * output
    total_s = prefill_s + decode_s
    usd = total_s * usd_per_s
    assert mid is not None
    pooling = placement.model.is_pooling and prompt > 0
    return {
        "fits": True,
        "chips": placement.chips,
        "prefill_tokens_per_s": _sig(batch * prompt / prefill_s) if prompt else None,
        "decode_tokens_per_s": _sig(1 / tpot),
        "output_tokens_per_s": _sig(batch / tpot),
        "end_to_end_tokens_per_s": _sig(out_tokens / total_s),
        "ttft_s": _sig(prefill_s),
        "tpot_s": _sig(tpot),
        "tokens_per_step": _sig(per_step),
        "bound": mid.bound,
        "memory_bytes": {k: _sig(v) for k, v in placement.memory_bytes(batch * need).items()},
        "joules_per_mtok": _sig((prefill_j + decode_j) / out_tokens * 1e6),
        "usd_per_mtok": _sig(usd / out_tokens * 1e6),
        "usd_per_hour": _sig(usd_per_s * 3600),
        "batch": batch,
        "prompt": prompt,
        "output": output,
        "tp": placement.tp,
        "pp": placement.pp,
        "dp": placement.dp,
        "ep": placement.ep,
        "data_parallel_size": ranks,
        "n_gpu_layers": placement.n_gpu_layers,
        "kv_tokens": placement.kv_tokens,
        "memory_share": placement.memory_share,
        "max_context": placement.max_context,
        "max_concurrency": placement.max_concurrency(need),
        "notes": list(placement.notes) + ([POOLING_NOTE] if pooling else [])
        + ([] if placement.model.holds_kv else [ENCODER_NOTE]),
        "units": UNITS,
        **(_pooling(batch * prompt, prefill_s, prefill_j, usd_per_s, batch) if pooling else {}),
    }


def _pooling(tokens: int, prefill_s: float, prefill_j: float, usd_per_s: float,
             batch: int) -> dict[str, Any]:
    """An embedding model's figures: the batch's prompts pooled in its prefill's time, priced
    per million input tokens."""
    return {"embeddings_per_s": _sig(batch / prefill_s),
            "joules_per_m_input_tok": _sig(prefill_j / tokens * 1e6),
            "usd_per_m_input_tok": _sig(prefill_s * usd_per_s / tokens * 1e6)}
