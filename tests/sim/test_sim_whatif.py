"""`doppelchip whatif`: the crossover between HBM GPUs and SRAM chips is computed, not drawn."""

from __future__ import annotations

import json

from devices import DeploymentSpec, DeviceError, place
from doppelchip.cli import main
from sim.whatif import FAMILIES, WhatIfConfig, cost_vs_speed


def test_hbm_cheapest_at_large_batch_sram_fastest_at_batch_one_sized_for_the_batch():
    """The design notes' conclusion, computed: with Groq and Cerebras sized for each batch
    (weights + the batch's KV), an HBM GPU gives the cheapest tokens at large batch, while the
    SRAM chips give the fastest tokens per user at batch 1."""
    cfg = WhatIfConfig(families=("h100-vllm", "h100-tensorrt-llm", "groq", "cerebras"),
                       batches=(1, 16, 256), isl=512, osl=64)
    result = cost_vs_speed(cfg)
    curves = result["curves"]
    h100, wafer, groq = curves["h100-vllm"], curves["cerebras"], curves["groq"]
    assert [p["batch"] for p in h100] == [p["batch"] for p in wafer] == [1, 16, 256]
    cheapest_big = min((pts[-1]["usd_per_mtok"], name) for name, pts in curves.items())
    assert cheapest_big[1].startswith("h100")
    fastest_b1 = max((pts[0]["per_user_tokens_per_s"], name) for name, pts in curves.items())
    assert fastest_b1[1] in ("groq", "cerebras")
    assert all(b["per_user_tokens_per_s"] > 2 * a["per_user_tokens_per_s"]
               for a, b in zip(h100, wafer, strict=True))
    # sized for the batch: more sequences need more SRAM chips for their KV
    assert groq[0]["chips"] < groq[-1]["chips"]
    # the cost per token of every deployment falls as one weight read serves a larger batch
    assert all(pts[-1]["usd_per_mtok"] < pts[0]["usd_per_mtok"] for pts in curves.values())
    # the cheapest deployment for a per-user speed: an HBM GPU when slow tokens will do, an
    # SRAM chip once the speed needed is beyond what the GPUs reach at any batch
    frontier = result["frontier"]
    assert frontier[0]["memory"] == "hbm" and frontier[-1]["memory"] == "sram"
    fastest_gpu = max(p["per_user_tokens_per_s"] for name in ("h100-vllm", "h100-tensorrt-llm")
                      for p in result["curves"][name])
    assert frontier[-1]["from_per_user_tokens_per_s"] <= fastest_gpu


def test_gpu_families_are_sized_for_a_big_model():
    """whatif --model llama-3.1-70b keeps the GPU rows: each HBM family gets the smallest
    power-of-two chip count the model fits on (or the --count/--tp/--ep given)."""
    cfg = WhatIfConfig(model="llama-3.1-70b", families=("h100-vllm", "h100-tensorrt-llm"),
                       batches=(1,), osl=16)
    result = cost_vs_speed(cfg)
    assert not result["failed"]

    def fits(family: str, count: int) -> bool:
        fam = FAMILIES[family]
        try:
            place(DeploymentSpec(cfg.model, fam["quant"], fam["chip"], fam["engine"],
                                 count=count, max_context=cfg.max_model_len, max_batch=1))
        except DeviceError:
            return False
        return True

    chips = {f: result["curves"][f][0]["chips"] for f in cfg.families}
    for family, n in chips.items():
        assert fits(family, n) and (n == 1 or not fits(family, n // 2)), family
    assert chips["h100-vllm"] > 1  # bf16: 141 GB of weights
    assert chips["h100-vllm"] >= chips["h100-tensorrt-llm"]  # fp8: half the bytes
    given = cost_vs_speed(WhatIfConfig(model="llama-3.1-70b", families=("h100-vllm",),
                                       batches=(1,), osl=16, tp=8))
    assert given["curves"]["h100-vllm"][0]["chips"] == 8


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


def test_a_point_does_not_depend_on_the_other_batch_sizes_asked_for():
    """Each point's deployment is configured for its own batch: Groq at batch 1 is the same
    whether or not batch 256 is also asked for (a static-shape compiler configured for 256
    sequences pads a batch of one to them, which made batch 1 half as fast)."""
    alone = cost_vs_speed(WhatIfConfig(families=("groq",), batches=(1,), isl=128, osl=32))
    both = cost_vs_speed(WhatIfConfig(families=("groq",), batches=(1, 256), isl=128, osl=32))
    assert both["curves"]["groq"][0] == alone["curves"]["groq"][0]
