"""vLLM's `vllm:tool_call_parser_invocations_total` on a real pod started with vLLM's tool flags
(`--enable-auto-tool-choice --tool-call-parser llama3_json`): registered at start-up with its
12 combinations at 0, counted where vLLM's tool parser runs — tool_choice "auto", once per
choice, once per streamed delta — by outcome and API (vllm_reference.json)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from server_proc import ServerProcess

MODEL = "llama-3.1-8b"
POD = ["--chip", "h100-sxm", "--engine", "vllm", "--model", MODEL, "--quant", "fp8",
       "--max-model-len", "2048", "--time-scale", "0.05", "--enable-auto-tool-choice",
       "--tool-call-parser", "llama3_json"]
SPEC = json.loads((Path(__file__).parent.parent / "observability" / "vllm_reference.json")
                  .read_text())["series"]["vllm:tool_call_parser_invocations_total"]
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
ASK = [{"role": "user", "content": "Weather in Paris?"}]
ANSWERED = [*ASK, {"role": "assistant", "content": "", "tool_calls": [{
    "id": "call-1", "type": "function",
    "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
    {"role": "tool", "tool_call_id": "call-1", "content": "sunny"}]


@pytest.fixture(scope="module")
def pod():
    with ServerProcess(None, *POD) as s:
        yield s


def counts(pod) -> dict[tuple[str, str, str], float]:
    fams = {f.name: f for f in text_string_to_metric_families(pod.scrape())}
    fam = fams["vllm:tool_call_parser_invocations"]
    assert fam.type == "counter" and fam.documentation == SPEC["help"]
    out = {}
    for s in fam.samples:
        if s.name.endswith("_total"):
            assert s.labels["model_name"] == MODEL
            out[s.labels["mode"], s.labels["outcome"], s.labels["request_type"]] = s.value
    return out


def delta(before: dict, after: dict) -> dict:
    return {k: after[k] - before[k] for k in after if after[k] != before[k]}


def test_all_combinations_start_at_zero(pod):
    got = counts(pod)
    labels = SPEC["label_values"]
    assert set(got) == {(m, o, r) for m in labels["mode"] for o in labels["outcome"]
                        for r in labels["request_type"]}


def test_auto_choices_count_by_outcome_and_api(pod):
    with httpx.Client(base_url=pod.http_url, timeout=60) as http:
        before = counts(pod)
        r = http.post("/v1/chat/completions", json={"messages": ASK, "tools": [TOOL],
                                                    "max_tokens": 200, "n": 2})
        assert r.json()["choices"][0]["finish_reason"] == "tool_calls"
        r = http.post("/v1/chat/completions", json={"messages": ANSWERED, "tools": [TOOL],
                                                    "max_tokens": 5})
        assert r.json()["choices"][0]["finish_reason"] == "length"  # text after the result
        r = http.post("/v1/chat/completions", json={  # a named tool: no parser runs
            "messages": ASK, "tools": [TOOL], "max_tokens": 200,
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}}})
        assert r.status_code == 200
        r = http.post("/v1/responses", json={"model": MODEL, "input": "Weather in Paris?",
                                             "tools": [{"type": "function", "name":
                                                        "get_weather", "parameters":
                                                        TOOL["function"]["parameters"]}],
                                             "max_output_tokens": 200})
        assert r.status_code == 200
        after = counts(pod)
    assert delta(before, after) == {
        ("non_streaming", "tool_call", "chat_completions"): 2,  # once per choice
        ("non_streaming", "no_tool_call", "chat_completions"): 1,
        ("non_streaming", "tool_call", "responses"): 1}


def test_a_stream_counts_each_delta(pod):
    with httpx.Client(base_url=pod.http_url, timeout=60) as http:
        before = counts(pod)
        with http.stream("POST", "/v1/chat/completions", json={
                "messages": ASK, "tools": [TOOL], "max_tokens": 200, "stream": True}) as r:
            events = [json.loads(line[6:]) for line in r.iter_lines()
                      if line.startswith("data: {")]
        after = counts(pod)
    found = sum(1 for e in events for c in e["choices"] if c["delta"].get("tool_calls"))
    changed = delta(before, after)
    assert set(changed) <= {("streaming", "tool_call", "chat_completions"),
                            ("streaming", "no_tool_call", "chat_completions")}
    assert changed[("streaming", "tool_call", "chat_completions")] == found >= 1
    assert sum(changed.values()) > found  # deltas that completed no call count too
