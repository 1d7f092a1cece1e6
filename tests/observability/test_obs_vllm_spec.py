"""The exported vLLM metrics match vLLM's own definitions (vllm_reference.json, transcribed from
vLLM's source at named commits), as a real server's /metrics shows them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from server_proc import ServerProcess

from devices import catalog
from server.stats.buckets import FAMILY_DEFAULTS, build_1_2_5_buckets
from server.stats.schema import HISTOGRAMS, HISTOGRAMS_0_33, KV_RESIDENCY

REFERENCE = json.loads((Path(__file__).parent / "vllm_reference.json").read_text())
MAX_LEN = 512


@pytest.fixture(scope="module")
def families():
    doc = {"server": {}, "deployments": [{"name": "a", "model": "llama-3.1-8b", "quant": "bf16",
                                          "chip": "h100-sxm", "engine": "vllm",
                                          "max_model_len": MAX_LEN}]}
    with ServerProcess(doc) as server:
        text = server.scrape()
    return {m.name: m for m in text_string_to_metric_families(text)}


def test_build_1_2_5_buckets_matches_vllm():
    for top, buckets in REFERENCE["build_1_2_5_buckets"].items():
        assert build_1_2_5_buckets(int(top)) == buckets


def test_histogram_table_is_the_transcription():
    ref = REFERENCE["histograms"]
    assert set(HISTOGRAMS) == set(ref)
    for name, (doc, family) in HISTOGRAMS.items():
        assert doc == ref[name]["help"], name
        expected = ref[name]["buckets"]
        default = FAMILY_DEFAULTS[family]
        assert default is None if expected == "1-2-5" else list(default) == expected, name


def test_every_histogram_draws_from_vllms_family():
    """Each vllm: histogram (the KV residency ones too) has vLLM's help, bucket family and
    default bounds, so --custom-histogram-buckets replaces what vLLM's replaces."""
    series = REFERENCE["series"]
    ours = {**HISTOGRAMS, **HISTOGRAMS_0_33, **KV_RESIDENCY}
    theirs = {n for n, s in series.items() if s["type"] == "histogram" and s.get("bucket_family")}
    assert set(ours) == theirs
    for name, (doc, family) in ours.items():
        spec = series[name]
        assert (doc, family) == (spec["help"], spec["bucket_family"]), name
        want = spec["buckets"]
        assert (FAMILY_DEFAULTS[family] is None if want == "1-2-5"
                else list(FAMILY_DEFAULTS[family]) == want), name
    assert set(FAMILY_DEFAULTS) == set(REFERENCE["bucket_families"])
    for family, bounds in REFERENCE["bucket_families"].items():
        if FAMILY_DEFAULTS[family] is not None:
            assert list(FAMILY_DEFAULTS[family]) == bounds, family


def expected_labels(name: str) -> set[str]:
    return {*REFERENCE["labelnames"], "deployment", *REFERENCE["extra_labels"].get(name, [])}


def test_exported_names_types_labels_and_buckets(families):
    for kind in ("gauges", "counters"):
        for name, doc in REFERENCE[kind].items():
            fam = families[name]
            assert fam.type == kind[:-1], name
            assert fam.documentation == doc, name
            if name != "vllm:cache_config_info":  # an info gauge: its labels are the config
                labels = {k for s in fam.samples for k in s.labels}
                assert labels == expected_labels(name), name
    for name, spec in REFERENCE["histograms"].items():
        fam = families[name]
        assert fam.type == "histogram", name
        buckets = [float(s.labels["le"]) for s in fam.samples if s.name.endswith("_bucket")]
        want = build_1_2_5_buckets(MAX_LEN) if spec["buckets"] == "1-2-5" else spec["buckets"]
        assert buckets == [float(b) for b in want] + [float("inf")], name
        labels = {k for s in fam.samples for k in s.labels} - {"le"}
        assert labels == expected_labels(name), name
    info = families["vllm:cache_config_info"].samples[0]
    assert info.value == 1.0 and info.labels["engine"] == "0"
    assert {"block_size", "num_gpu_blocks", "enable_prefix_caching"} <= set(info.labels)
    # no share in the fleet file: the engine's own default (vLLM 0.33.0's 0.92), as vLLM shows
    share = catalog.get_engine("vllm").memory.fraction
    assert float(info.labels["gpu_memory_utilization"]) == share


# --- The full vLLM 0.33.0 catalogue (REFERENCE["series"], docs/VLLM_REFERENCE.md) ---------------
# The keys above are the subset doppelchip implements; "series" is everything vLLM registers.
# Series listed in REFERENCE["doppelchip_pending"] are known gaps: the test below fails both when
# an unconditional vLLM series is missing and not listed there, and when a listed one starts
# being exported (then remove it from the list, and the checks below apply to it).

SERIES = REFERENCE["series"]
PENDING = set(REFERENCE["doppelchip_pending"]["series"])


def family_name(name: str, kind: str) -> str:
    """prometheus_client's family name: a counter registered as x_total is family x."""
    return name.removesuffix("_total") if kind == "counter" else name


def test_implemented_subset_agrees_with_the_full_catalogue():
    for kind in ("gauges", "counters"):
        for name, doc in REFERENCE[kind].items():
            assert SERIES[name]["type"] == kind[:-1] and SERIES[name]["help"] == doc, name
    for name, spec in REFERENCE["histograms"].items():
        assert SERIES[name]["type"] == "histogram" and SERIES[name]["help"] == spec["help"], name
        want = SERIES[name]["buckets"]
        assert want == spec["buckets"], name
    assert {n for n, s in SERIES.items() if s["unconditional"]} >= PENDING


def test_unconditional_vllm_series_are_exported_or_listed_as_pending(families):
    for name, spec in SERIES.items():
        if not spec["unconditional"]:
            continue
        fam = families.get(family_name(name, spec["type"]))
        if name in PENDING:
            assert fam is None, f"{name} is exported now: remove it from doppelchip_pending"
            continue
        assert fam is not None, f"{name} (vLLM 0.33.0, {spec['source']}) is not exported"
        assert fam.type == spec["type"] and fam.documentation == spec["help"], name
        if name == "vllm:cache_config_info":
            continue
        labels = {k for s in fam.samples for k in s.labels} - {"le"}
        assert labels == {*spec["labels"], "deployment"}, name
        if spec["type"] == "histogram":
            buckets = [float(s.labels["le"]) for s in fam.samples if s.name.endswith("_bucket")]
            want = build_1_2_5_buckets(MAX_LEN) if spec["buckets"] == "1-2-5" else spec["buckets"]
            assert buckets == [float(b) for b in want] + [float("inf")], name


def test_finished_reasons_are_vllms(families):
    exported = {s.labels["finished_reason"] for s in families["vllm:request_success"].samples}
    pending = set(REFERENCE["doppelchip_pending"]["finished_reasons"])
    assert exported == set(REFERENCE["finished_reasons"]) - pending


def test_kv_residency_series_need_their_flag(families):
    """vLLM registers vllm:kv_block_*_seconds only with --kv-cache-metrics, and so does this
    server (test_obs_kv_residency.py turns it on)."""
    assert [n for n in families if n.startswith("vllm:kv_block_")] == []


def test_the_tool_parser_counter_needs_a_parser(families):
    """vLLM registers vllm:tool_call_parser_invocations_total only with --tool-call-parser
    (test_http_tool_parser_metric.py gives one)."""
    assert "vllm:tool_call_parser_invocations" not in families
