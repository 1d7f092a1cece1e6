"""`doppelchip whatif`: the design notes' comparisons, computed in virtual time.

Four studies, each a set of `simulate` runs (the same scheduler, KV cache and device model the
server uses), never a table of expected answers:

1. cost vs speed — one workload on one deployment per chip family, closed loop at growing
   batch sizes: per-user tokens/s against dollars per million output tokens. The crossover is
   computed: for each per-user speed, the cheapest deployment that reaches it. Deployments
   are sized for the question: an SRAM family (Groq, Cerebras) gets the chips that hold the
   weights plus the KV of `batch` sequences of `max_model_len` tokens at each batch size; an
   HBM family takes `count`/`tp`/`pp`/`ep` when given, or else the smallest power-of-two
   chip count the model fits on.
2. long prompts on Apple silicon — time to first token, MLX vs llama.cpp on the same chip.
3. llama.cpp tiers — batch-1 decode tokens/s against model size on one RTX 4090 box (layers
   in VRAM, in host RAM, and paged from SSD when the file exceeds RAM).
4. Groq shapes — compile stalls under uniform vs varied traffic, recompiling or holding the
   compiled batch.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from clients.workloads import WorkloadSpec
from devices import DeviceError, catalog, place
from devices.place_sram import chips_needed
from server.engine.options import EngineOptions
from sim.simulation import SimulationError, simulate_conversations

# One deployment per chip family of the design notes (HBM GPUs, TPU, Apple, SRAM chips).
FAMILIES: dict[str, dict[str, Any]] = {
    "h100-vllm": dict(chip="h100-sxm", engine="vllm", quant="bf16", memory="hbm"),
    "h100-tensorrt-llm": dict(chip="h100-sxm", engine="tensorrt-llm", quant="fp8",
                              memory="hbm"),
    "tpu-v5e-jetstream": dict(chip="tpu-v5e", engine="jetstream", quant="bf16", count=8,
                              memory="hbm"),
    "m4-max-mlx": dict(chip="m4-max-40", engine="mlx", quant="mlx-4bit", memory="unified"),
    "groq": dict(chip="groq-lpu-v1", engine="groq", quant="bf16", memory="sram"),
    "cerebras": dict(chip="cerebras-cs3", engine="cerebras", quant="bf16", memory="sram"),
}


@dataclass(frozen=True)
class WhatIfConfig:
    model: str = "llama-3.1-8b"
    isl: int = 512
    osl: int = 256
    batches: tuple[int, ...] = (1, 4, 16, 64, 256)
    families: tuple[str, ...] = tuple(FAMILIES)
    max_model_len: int = 2048  # enough for the workloads; SRAM chips are sized for it
    count: int | None = None  # HBM families: chips (None: the smallest that fits)
    tp: int | None = None
    pp: int | None = None
    ep: int | None = None


AUTO_COUNTS = (1, 2, 4, 8, 16, 32, 64)  # HBM families: chip counts tried when none is given


def _options(name: str, cfg: WhatIfConfig, batch: int | None = None,
             **extra: Any) -> EngineOptions:
    """The family's deployment for `cfg`, configured for `batch` sequences (its batch cap, and
    SRAM chips sized for it): a point of the curve does not depend on the other batch sizes
    asked for (a static-shape compiler pads every step to the cap)."""
    fam = {k: v for k, v in FAMILIES[name].items() if k != "memory"}
    opts = EngineOptions(name=name, model=cfg.model, max_model_len=cfg.max_model_len,
                         max_num_seqs=batch or max(cfg.batches), **fam, **extra)
    chip = catalog.get_chip(opts.chip)
    if chip.placement == "sram":
        spec = opts.spec()
        seqs = batch or max(cfg.batches)
        n = chips_needed(spec, catalog.get_model(cfg.model), catalog.get_quant(opts.quant),
                         chip, seqs, cfg.max_model_len)
        return replace(opts, count=n)
    if chip.placement != "sharded":
        return opts
    given = {k: v for k, v in (("count", cfg.count), ("tp", cfg.tp), ("pp", cfg.pp),
                               ("ep", cfg.ep)) if v is not None}
    if given:
        return replace(opts, **{"count": None, "tp": None, "pp": None, **given})
    for n in ((opts.count,) if opts.count else ()) + AUTO_COUNTS:
        if opts.count and n < opts.count:
            continue
        try:
            place(replace(opts, count=n).spec())
        except DeviceError:
            continue
        return replace(opts, count=n)
    return opts


def cost_vs_speed(cfg: WhatIfConfig) -> dict[str, Any]:
    curves: dict[str, list[dict[str, float]]] = {}
    failed: dict[str, str] = {}
    for name in cfg.families:
        points = []
        for batch in cfg.batches:
            spec = WorkloadSpec(num_requests=max(2 * batch, 8), isl=cfg.isl, osl=cfg.osl,
                                ignore_eos=True)
            try:
                s, _ = simulate_conversations(_options(name, cfg, batch), spec,
                                              concurrency=batch)
            except SimulationError as e:
                failed[name] = str(e)
                break
            if not s["tpot_s"]["p50"]:  # no request decoded a second token
                failed[name] = f"no request completed at batch {batch} ({s['errors']})"
                break
            points.append({"batch": batch, "per_user_tokens_per_s": 1 / s["tpot_s"]["p50"],
                           "usd_per_mtok": s["usd_per_mtok"], "chips": s["chips"],
                           "output_tokens_per_s": s["output_tokens_per_s"]})
        if points:
            curves[name] = points
    return {"curves": curves, "failed": failed, "frontier": frontier(curves)}


def frontier(curves: dict[str, list[dict[str, float]]]) -> list[dict[str, Any]]:
    """For each per-user speed some deployment reaches, the cheapest deployment reaching it
    (a step function, fastest last): where it switches family is the crossover."""
    speeds = sorted({p["per_user_tokens_per_s"] for pts in curves.values() for p in pts})
    out: list[dict[str, Any]] = []
    for speed in speeds:
        best = min(((p["usd_per_mtok"], name) for name, pts in curves.items() for p in pts
                    if p["per_user_tokens_per_s"] >= speed), default=None)
        if best is not None and (not out or out[-1]["deployment"] != best[1]):
            out.append({"from_per_user_tokens_per_s": speed, "deployment": best[1],
                        "memory": FAMILIES[best[1]]["memory"], "usd_per_mtok": best[0]})
    return out


def long_prompt_ttft(cfg: WhatIfConfig, chip: str = "m4-max-40",
                     prompts: tuple[int, ...] = (256, 1024, 4096)) -> dict[str, Any]:
    engines = {"mlx": "mlx-4bit", "llama.cpp": "q4_0"}
    out: dict[str, list[dict[str, float]]] = {}
    failed: dict[str, str] = {}  # engines that cannot hold the model on this chip
    for engine, quant in engines.items():
        opts = EngineOptions(name=engine, model=cfg.model, quant=quant, chip=chip,
                             engine=engine, max_model_len=max(prompts) + 64)
        rows = []
        try:
            for n in prompts:
                s, _ = simulate_conversations(opts, WorkloadSpec(num_requests=1, isl=n, osl=16,
                                                                 ignore_eos=True))
                rows.append({"prompt_tokens": n, "ttft_s": s["ttft_s"]["p50"],
                             "decode_tokens_per_s": 1 / s["tpot_s"]["p50"]})
        except SimulationError as e:
            failed[engine] = str(e)
            continue
        out[engine] = rows
    return {"chip": chip, "series": out, "failed": failed}


def llamacpp_tiers(models: tuple[str, ...] = ("llama-3.1-8b", "llama-2-13b", "llama-3.1-70b"),
                   quants: tuple[str, ...] = ("q4_k_m", "f16")) -> list[dict[str, Any]]:
    rows = []
    for model in models:
        for quant in quants:
            opts = EngineOptions(name=f"{model}-{quant}", model=model, quant=quant,
                                 chip="rtx-4090", engine="llama.cpp", max_model_len=1024)
            try:
                s, _ = simulate_conversations(opts, WorkloadSpec(num_requests=1, isl=64, osl=16,
                                                                 ignore_eos=True))
            except SimulationError as e:
                rows.append({"model": model, "quant": quant, "error": str(e)})
                continue
            rows.append({"model": model, "quant": quant,
                         "decode_tokens_per_s": 1 / s["tpot_s"]["p50"]})
    return rows


def groq_shapes(cfg: WhatIfConfig, requests: int = 40) -> list[dict[str, Any]]:
    uniform = WorkloadSpec(num_requests=requests, isl=128, osl=32, rate=20.0,
                           arrival="constant", ignore_eos=True, seed=1)
    varied = replace(uniform, arrival="gamma", burstiness=0.3, length_dist="uniform",
                     length_spread=0.9)
    rows = []
    for policy in ("recompile", "hold"):
        opts = _options("groq", replace(cfg, batches=(8,)), 8, shape_policy=policy,
                        batching="continuous")
        for traffic, spec in (("uniform", uniform), ("varied", varied)):
            s, _ = simulate_conversations(opts, spec)
            rows.append({"policy": policy, "traffic": traffic, "compiles": s["compiles"],
                         "compile_stall_s": s["compile_stall_s"], "e2e_p90_s": s["e2e_s"]["p90"]})
    return rows


def run_whatif(cfg: WhatIfConfig) -> dict[str, Any]:
    return {
        "model": cfg.model, "isl": cfg.isl, "osl": cfg.osl,
        "cost_vs_speed": cost_vs_speed(cfg),
        "long_prompt_ttft": long_prompt_ttft(cfg),
        "llamacpp_tiers": llamacpp_tiers(),
        "groq_shapes": groq_shapes(cfg),
    }
