"""Plots and an HTML page for `doppelchip whatif` results (a plain dict, see
sim/whatif.py): the figures the design notes argue from."""

from __future__ import annotations

from typing import Any

import matplotlib.pyplot as plt

from clients.html_report import page, png_base64, table


def cost_vs_speed_plot(data: dict[str, Any]) -> str:
    fig, ax = plt.subplots(figsize=(8, 5))
    for name, points in data["curves"].items():
        ax.plot([p["per_user_tokens_per_s"] for p in points], [p["usd_per_mtok"] for p in points],
                marker="o", label=name)
        for p in points:
            ax.annotate(f"b{p['batch']}", (p["per_user_tokens_per_s"], p["usd_per_mtok"]),
                        fontsize=7, alpha=0.6)
    for step in data["frontier"][1:]:
        ax.axvline(step["from_per_user_tokens_per_s"], color="grey", ls=":", lw=1)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("per-user output tokens/s (1 / median TPOT)")
    ax.set_ylabel("$ per million output tokens")
    ax.set_title("cost vs speed across batch sizes (dotted: the cheapest option changes)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return png_base64(fig)


def ttft_plot(data: dict[str, Any]) -> str:
    fig, ax = plt.subplots(figsize=(6, 4))
    for engine, rows in data["series"].items():
        ax.plot([r["prompt_tokens"] for r in rows], [r["ttft_s"] for r in rows], marker="o",
                label=engine)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("prompt tokens")
    ax.set_ylabel("time to first token (s)")
    ax.set_title(f"long prompts on {data['chip']}: MLX vs llama.cpp")
    ax.grid(alpha=0.3)
    ax.legend()
    return png_base64(fig)


def tiers_plot(rows: list[dict[str, Any]]) -> str:
    fig, ax = plt.subplots(figsize=(7, 4))
    ok = [r for r in rows if "decode_tokens_per_s" in r]
    labels = [f"{r['model']}\n{r['quant']}" for r in ok]
    ax.bar(range(len(ok)), [r["decode_tokens_per_s"] for r in ok])
    ax.set_xticks(range(len(ok)), labels, fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("batch-1 decode tokens/s")
    ax.set_title("llama.cpp on an RTX 4090 box: VRAM, host RAM, SSD")
    ax.grid(alpha=0.3, axis="y")
    return png_base64(fig)


def groq_plot(rows: list[dict[str, Any]]) -> str:
    fig, ax = plt.subplots(figsize=(6, 4))
    labels = [f"{r['policy']}\n{r['traffic']}" for r in rows]
    ax.bar(range(len(rows)), [r["compile_stall_s"] for r in rows])
    ax.set_xticks(range(len(rows)), labels)
    ax.set_ylabel("seconds stalled compiling")
    ax.set_title("Groq: recompiling vs holding the compiled batch")
    return png_base64(fig)


def render(result: dict[str, Any], conclusions: list[str] | None = None) -> str:
    """The page: `conclusions` (the lines `doppelchip whatif` prints) first, then the plots
    and the data as formatted tables."""
    figures = [
        ("Cost vs speed", cost_vs_speed_plot(result["cost_vs_speed"])),
        ("Long prompts on Apple silicon", ttft_plot(result["long_prompt_ttft"])),
        ("llama.cpp tiers", tiers_plot(result["llamacpp_tiers"])),
        ("Groq compile stalls", groq_plot(result["groq_shapes"])),
    ]
    title = f"doppelchip whatif: {result['model']}, {result['isl']} in / {result['osl']} out"
    return page(title, figures, _tables(result), conclusions)


def _tables(result: dict[str, Any]) -> list[tuple[str, str]]:
    rows = [[name, p["batch"], p["per_user_tokens_per_s"], p["usd_per_mtok"], p["chips"]]
            for name, pts in result["cost_vs_speed"]["curves"].items() for p in pts]
    out = [("Cost vs speed", table(["deployment", "batch", "tok/s per user", "$/Mtok", "chips"],
                                   rows))]
    tiers = [[r["model"], r["quant"], r.get("decode_tokens_per_s", r.get("error"))]
             for r in result["llamacpp_tiers"]]
    out.append(("llama.cpp tiers", table(["model", "quant", "decode tok/s"], tiers)))
    groq = [[r["policy"], r["traffic"], r["compiles"], r["compile_stall_s"], r["e2e_p90_s"]]
            for r in result["groq_shapes"]]
    out.append(("Groq compile stalls",
                table(["policy", "traffic", "compiles", "stall s", "E2E p90 s"], groq)))
    return out
