"""A TensorRT-LLM pod's metric definitions against TensorRT-LLM's source (transcribed into
trtllm_reference.json): every family it exports (a speculating pod's too) has TensorRT-LLM's
name, type, help string, extra label and buckets; the base labels and the config info gauges'
label keys are its."""

from __future__ import annotations

import json
from pathlib import Path

from server.stats.collector_trtllm import config_info, labels
from server.stats.schema_trtllm import (
    CONFIG_INFO,
    ITERATION_SERIES,
    SPEC_SERIES,
    TRTLLM_REQUEST_METRICS,
)

REF = json.loads((Path(__file__).parent / "trtllm_reference.json").read_text())


def exported() -> dict[str, dict]:
    """Every family a TensorRT-LLM pod exports, as the reference names it (counters `_total`)."""
    out = {}
    for d in TRTLLM_REQUEST_METRICS:
        name = d.name + "_total" if d.kind == "counter" else d.name
        out[name] = {"type": d.kind, "help": d.help, "extra_labels": [d.label] if d.label
                     else [], "buckets": list(d.buckets) or None}
    for name, (kind, doc) in ITERATION_SERIES.items():
        full = name + "_total" if kind == "counter" else name
        out[full] = {"type": kind, "help": doc, "extra_labels": [], "buckets": None}
    for name, (kind, doc, label) in SPEC_SERIES.items():
        full = name + "_total" if kind == "counter" else name
        out[full] = {"type": kind, "help": doc, "extra_labels": [label] if label else [],
                     "buckets": None}
    for name, doc in CONFIG_INFO.items():
        out[name] = {"type": "gauge", "help": doc, "extra_labels": [], "buckets": None}
    return out


def test_every_family_is_tensorrt_llms():
    ours = exported()
    assert set(ours) == set(REF["families"])
    for name, family in REF["families"].items():
        assert ours[name]["type"] == family["type"], name
        assert ours[name]["help"] == family["help"], name
        assert ours[name]["extra_labels"] == family["extra_labels"], name
        if family["buckets"] is not None:
            assert ours[name]["buckets"] == [float(b) for b in family["buckets"]], name


class Info:  # the DeploymentInfo fields the label sets read
    model_name, model, model_path, quant, chip = "served", "llama-3.1-8b", "", "fp8", "h100-sxm"
    tensor_parallel, pipeline_parallel, enable_prefix_caching = 2, 1, True
    gpu_memory_utilisation, cache_dtype = 0.9, "auto"
    num_speculative_tokens, speculative_method, speculative_model = 3, "eagle3", "draft"

    class capacity:  # a stand-in for the Capacity struct
        max_model_len = 4096


def test_label_sets():
    assert [k for k, _ in labels(Info())] == REF["labels"]
    info = config_info(Info())
    assert {name: [k for k, _ in pairs] for name, pairs in info.items()} == REF["config_labels"]
    assert list(info) == list(REF["config_labels"])  # TensorRT-LLM's order
    assert dict(info["trtllm_speculative_config_info"]) == {
        "spec_enabled": "true", "spec_method": "Eagle3", "spec_num_tokens": "3",
        "spec_draft_model": "draft"}  # decoding_type's spelling
    plain = Info()
    plain.num_speculative_tokens = 0  # a pod that does not speculate logs no speculative info
    assert "trtllm_speculative_config_info" not in config_info(plain)
    parallel = dict(info["trtllm_parallel_config_info"])
    assert parallel["tensor_parallel_size"] == "2" and parallel["gpu_count"] == "2"
    assert dict(info["trtllm_model_config_info"])["quantization"] == "FP8"
