"""The SGLang pod's pieces without a server: the configuration it needs, `/generate` bodies
parsed and refused in SGLang's words, the completions request they become, `/v1/loads` in
Prometheus' format, and the throughput gauge's window."""

from __future__ import annotations

import dataclasses

import pytest

from server.http.errors import HttpError
from server.http.sglang.native import prometheus_loads
from server.http.sglang.protocol import completion_body, parse
from server.server_config import ServerConfig, server_problem
from server.stats.collector_sglang import Throughput, WindowRatio


def test_sglang_api_needs_a_pod():
    assert "pod mode" in server_problem(ServerConfig(http_api="sglang"))
    assert server_problem(ServerConfig(http_api="sglang", pod=True)) == ""
    assert "http_api must be one of vllm, sglang" in server_problem(
        dataclasses.replace(ServerConfig(), http_api="tgi"))


def refused(body) -> str:
    with pytest.raises(HttpError) as e:
        parse(body)
    assert e.value.status == 400
    return e.value.message


def test_bodies_refused_in_sglangs_words():
    assert refused({"text": "a", "input_ids": [1]}) == \
        "Only one of text or input_ids should be provided."
    assert refused({"text": ["a", "b"], "rid": ["x"]}) == \
        "The rid should be a list for batch processing."
    assert refused({"text": "a", "sampling_params": {"repetition_penalty": 3}}) == \
        "repetition_penalty must be in [0, 2], got 3."
    assert refused({"text": "a", "sampling_params": {"max_new_tokens": -1}}) == \
        "max_new_tokens must be at least 0, got -1."
    assert refused({"text": "a", "sampling_params": {"frequency_penalty": 2.5}}) == \
        "frequency_penalty must be in [-2, 2], got 2.5."
    assert "text only" in refused({"text": "a", "image_data": "x.png"})
    assert "give one" in refused({"text": ["a", "b"], "sampling_params": [
        {"max_new_tokens": 1}, {"max_new_tokens": 2}]})


def test_rids_and_batches():
    one = parse({"text": "a", "rid": "r"})
    assert one.rids == ["r"] and not one.batch and one.prompts == ["a"]
    batch = parse({"input_ids": [[1, 2], [3]], "sampling_params": {"n": 2}, "rid": "r"})
    assert batch.batch and batch.rids == ["r_0", "r_1", "r_2", "r_3"] and batch.n == 2
    same = parse({"text": ["a", "b"], "sampling_params": [{"top_k": 5}, {"top_k": 5}]})
    assert same.sampling == {"top_k": 5}


def test_the_completions_request_it_becomes():
    inp = parse({"input_ids": [1, 2, 3], "stream": True, "return_logprob": True,
                 "sampling_params": {"stop": "xy", "no_stop_trim": True, "sampling_seed": 7,
                                     "regex": "[ab]+", "top_k": 3}})
    req = completion_body(inp, "m", [[1, 2, 3]])
    assert req.prompt == [1, 2, 3] and req.max_tokens == 128  # SGLang's default
    assert req.stop == ["xy"] and req.include_stop_str_in_output and req.seed == 7
    assert req.structured_outputs.regex == "[ab]+" and req.top_k == 3
    assert req.stream and req.logprobs == 1


def test_loads_in_prometheus_format():
    text = prometheus_loads([{"dp_rank": 1, "num_running_reqs": 2, "memory": {"weight_gb": 1.5},
                              "decode_moments": None}])
    assert text.splitlines() == [
        "# TYPE sglang_num_running_reqs gauge", 'sglang_num_running_reqs{dp_rank="1"} 2',
        "# TYPE sglang_memory_weight_gb gauge", 'sglang_memory_weight_gb{dp_rank="1"} 1.5']


def test_throughput_is_per_emulated_second_between_renders():
    rate = Throughput()
    assert rate(100, 1.0) == 0.0  # no window yet
    assert rate(300, 3.0) == 100.0
    assert rate(300, 3.0) == 0.0  # no time passed (idle)


def test_hit_rate_is_the_window_since_the_last_read_held_while_idle():
    rate = WindowRatio()
    assert rate(30, 100) == 0.3  # since start
    assert rate(130, 200) == 1.0  # the last window's: 100 of 100
    assert rate(130, 200) == 1.0  # nothing looked up since: held, as SGLang's gauge
    assert rate(130, 300) == 0.0
