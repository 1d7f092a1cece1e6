"""`doppelchip whatif`: the crossover between HBM GPUs and SRAM chips is computed, not drawn."""

from __future__ import annotations

import json

import numpy as np

from doppelchip.cli import main
from doppelchip.whatif import WhatIfConfig, cost_vs_speed


def test_cost_sign_flips_across_the_batch_sweep_while_sram_stays_faster():
    cfg = WhatIfConfig(families=("h100-vllm", "h100-tensorrt-llm", "cerebras"),
                       batches=(1, 16, 256), isl=512, osl=64)
    result = cost_vs_speed(cfg)
    h100, wafer = result["curves"]["h100-vllm"], result["curves"]["cerebras"]
    assert [p["batch"] for p in h100] == [p["batch"] for p in wafer] == [1, 16, 256]
    diff = [a["usd_per_mtok"] - b["usd_per_mtok"] for a, b in zip(h100, wafer, strict=True)]
    assert len(set(np.sign(diff))) == 2  # the cheaper of the two changes along the sweep
    assert all(b["per_user_tokens_per_s"] > 2 * a["per_user_tokens_per_s"]
               for a, b in zip(h100, wafer, strict=True))
    # the cheapest deployment for a per-user speed: an HBM GPU when slow tokens will do, an
    # SRAM chip once the speed needed is beyond what the GPUs reach at any batch
    frontier = result["frontier"]
    assert frontier[0]["memory"] == "hbm" and frontier[-1]["memory"] == "sram"
    fastest_gpu = max(p["per_user_tokens_per_s"] for name in ("h100-vllm", "h100-tensorrt-llm")
                      for p in result["curves"][name])
    assert frontier[-1]["from_per_user_tokens_per_s"] <= fastest_gpu


def test_whatif_command_writes_its_report(capsys, tmp_path):
    assert main(["whatif", "--batches", "1,16", "--osl", "32", "--out", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "cheapest deployment by per-user speed" in text and "Groq compile stalls" in text
    result = json.loads((tmp_path / "whatif.json").read_text())
    ttft = result["long_prompt_ttft"]["series"]
    # a long prompt's first token is faster on llama.cpp than on MLX on the same chip
    assert ttft["llama.cpp"][-1]["ttft_s"] < ttft["mlx"][-1]["ttft_s"]
    tiers = {(r["model"], r["quant"]): r["decode_tokens_per_s"] for r in result["llamacpp_tiers"]}
    assert tiers[("llama-3.1-8b", "q4_k_m")] > tiers[("llama-3.1-70b", "q4_k_m")] \
        > 10 * tiers[("llama-3.1-70b", "f16")]  # spilling to SSD is far slower still
    groq = {(r["policy"], r["traffic"]): r for r in result["groq_shapes"]}
    assert groq[("recompile", "varied")]["compiles"] > groq[("recompile", "uniform")]["compiles"]
    assert groq[("hold", "varied")]["compiles"] == 0
    page = (tmp_path / "whatif.html").read_text()
    assert page.count('src="data:image/png;base64,') == 4
