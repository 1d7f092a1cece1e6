"""The catalogue: every id the issue names, derived parameter counts, sources, price rule."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from devices import catalog

CHIPS = ["h100-sxm", "h200-sxm", "a100-sxm-80g", "rtx-4090", "m2-ultra-60", "m2-ultra-76",
         "m3-max-40", "m4-max-40", "tpu-v5e", "tpu-v5p", "tpu-v6e", "groq-lpu-v1", "groq-3",
         "cerebras-cs3", "ddr5-dual-channel", "nvme-gen4",
         # the 2026 catalogue (issue 17's ids)
         "b200", "gb200", "h20", "mi300x", "mi325x", "mi355x", "tpu-v7", "m3-ultra-80"]
ENGINES = ["vllm", "sglang", "tensorrt-llm", "llama.cpp", "mlx", "jetstream", "groq", "cerebras"]
MODELS = ["llama-2-7b", "llama-2-13b", "llama-2-70b", "llama-3-8b", "llama-3.1-8b",
          "llama-3.1-70b", "llama-3.1-405b", "mixtral-8x7b", "qwen3-30b-a3b", "mistral-7b",
          "deepseek-v3", "gpt-oss-120b", "gpt-oss-20b", "qwen3-235b-a22b", "qwen3-32b",
          "llama-4-scout", "llama-4-maverick", "gemma-3-27b", "qwen3-embedding-8b",
          "qwen3-embedding-0.6b", "qwen3-reranker-0.6b", "qwen3-reranker-4b",
          "qwen3-reranker-8b", "bge-m3", "bge-reranker-v2-m3", "all-minilm-l6-v2"]
QUANTS = ["f16", "bf16", "fp8", "int8", "q8_0", "q4_0", "q4_k_m", "mlx-4bit",
          "nvfp4", "mxfp4", "awq-int4", "gptq-int4"]
CATALOG_DIR = Path(catalog.__file__).parent


def test_every_issue_id_exists():
    for ident in CHIPS:
        catalog.get_chip(ident)
    assert [e.id for e in catalog.list_engines()] == ENGINES
    assert [m.id for m in catalog.list_models()] == MODELS
    assert [q.id for q in catalog.list_quants()] == QUANTS


@pytest.mark.parametrize("model", MODELS)
def test_derived_parameter_count_matches_published(model: str):
    m = catalog.get_model(model)
    assert m.params == pytest.approx(m.published_params, rel=0.02)
    assert m.source.endswith("config.json")


def test_moe_active_parameters():
    assert catalog.get_model("mixtral-8x7b").active_params == pytest.approx(12.9e9, rel=0.03)
    assert catalog.get_model("qwen3-30b-a3b").active_params == pytest.approx(3.3e9, rel=0.1)
    for m in catalog.list_models():
        if m.published_active_params:  # Llama 4's published 17B counts the vision path too
            assert m.active_params == pytest.approx(m.published_active_params, rel=0.06), m.id


def test_quant_bytes_include_block_scales():
    assert catalog.get_quant("q8_0").bytes_per_weight == 34 / 32
    assert catalog.get_quant("q4_0").bytes_per_weight == 18 / 32
    assert 0.59 < catalog.get_quant("q4_k_m").bytes_per_weight < 0.62


def _number_lines(text: str) -> list[str]:
    lines = []
    for line in text.splitlines():
        body = line.split("#", 1)[0]
        if re.search(r"=\s*0\s*$", body):  # "none" (no link, no copy): not a figure
            continue
        if "=" in body and re.search(r"=\s*[\[{]?\s*[\d.]", body):
            lines.append(line)
    return lines


@pytest.mark.parametrize("name", ["chips", "engines", "models", "quants"])
def test_every_number_has_a_source_or_stated_assumption(name: str):
    """Each numeric line carries a comment, or its entry carries a `source` field."""
    text = (CATALOG_DIR / f"{name}.toml").read_text()
    for section in re.split(r"\n(?=\[)", text):
        if not re.search(r"^(source|notes?) = ", section, re.M) and section.startswith("[chips"):
            pytest.fail(f"{name}: section without source: {section[:40]}")
        has_source = bool(re.search(r"^source = ", section, re.M))
        for line in _number_lines(section):
            if name in ("chips", "engines"):
                assert "#" in line or line.startswith(("kernels", "compile_seconds = 0")), line
            else:
                assert has_source or "#" in line, line


def test_assumptions_are_labelled_in_chips():
    text = (CATALOG_DIR / "chips.toml").read_text()
    for line in text.splitlines():
        if line.startswith("idle_watts"):
            assert "ASSUMPTION" in line or "hardware.md" in line, line


def test_price_rule():
    h100 = catalog.get_chip("h100-sxm")
    assert h100.usd_per_hour == pytest.approx((1.65 * 6.88) ** 0.5)
    groq = catalog.get_chip("groq-lpu-v1")
    assert groq.usd_per_hour == pytest.approx(20000 / 26298 + 0.3 * 0.10)
    cs3 = catalog.get_chip("cerebras-cs3")
    assert cs3.usd_per_hour == pytest.approx((1.4e6 * 3e6) ** 0.5 / 26298 + 23 * 0.10)


def test_engines_declare_their_chips():
    assert catalog.get_engine("mlx").chip_classes == ("apple",)
    assert set(catalog.get_engine("tensorrt-llm").chip_classes) <= {"nvidia-datacentre",
                                                                     "nvidia-consumer"}
    assert catalog.get_engine("groq").deterministic
