"""Pure parts of the HTTP layer, without a server: the tool-call stream scanner on every way a
call list can be cut into chunks, the emulated logprob distribution, and the fleet file's
`http_port` / `metrics_port` alias."""

from __future__ import annotations

import itertools
import json
import math

import pytest

from server.config import ConfigError, parse_fleet
from server.engine.interface import Constraint
from server.engine.tokenizer import get_tokenizer
from server.frontend.logprobs import Logprobs
from server.http.tools import ToolPlan, ToolStreamer, parse_calls

CALLS = [{"name": "get_weather", "parameters": {"city": "Pa,ris {\"x\"} ]", "n": [1, {"a": 2}]}},
         {"name": "get_time", "parameters": {"zone": "UTC\\\\"}}]
ARRAY = json.dumps(CALLS, separators=(",", ":"))
PLAN = ToolPlan("array", Constraint("json_schema", "{}"))


def assemble(text: str, cuts: list[int], plan: ToolPlan = PLAN) -> dict[int, dict]:
    streamer = ToolStreamer(plan)
    calls: dict[int, dict] = {}
    bounds = [0, *cuts, len(text)]
    for a, b in itertools.pairwise(bounds):
        for d in streamer.feed(text[a:b]):
            entry = calls.setdefault(d["index"], {"args": ""})
            if "id" in d:
                assert "name" not in entry  # the header comes once
                entry["name"] = d["function"]["name"]
            entry["args"] += d["function"]["arguments"]
    return calls


@pytest.mark.parametrize("step", [1, 2, 3, 7, len(ARRAY)])
def test_streamed_calls_equal_the_whole_text(step):
    calls = assemble(ARRAY, list(range(step, len(ARRAY), step)))
    assert [calls[i]["name"] for i in sorted(calls)] == ["get_weather", "get_time"]
    for i, call in enumerate(CALLS):
        assert json.loads(calls[i]["args"]) == call["parameters"]
    whole = parse_calls(PLAN, ARRAY)
    assert [json.loads(c["function"]["arguments"]) for c in whole] == [
        c["parameters"] for c in CALLS]


def test_named_plan_streams_the_output_as_arguments():
    plan = ToolPlan("named", Constraint("json_schema", "{}"), "get_time")
    calls = assemble('{"zone":"CET"}', [3, 9], plan)
    assert calls == {0: {"name": "get_time", "args": '{"zone":"CET"}'}}


def test_incomplete_call_list_parses_to_no_calls():
    assert parse_calls(PLAN, ARRAY[:-5]) == []


def test_logprobs_form_a_distribution_and_repeat():
    tok = get_tokenizer()
    a, b = Logprobs(tok, 3), Logprobs(tok, 3)
    token = tok.free_text_token_ids[10]
    top = a.top(5, token, 6)
    assert top == b.top(5, token, 6) and top != Logprobs(tok, 4).top(5, token, 6)
    assert top[0][0] == token and len({t for t, _ in top}) == 6
    values = [v for _, v in top]
    assert values == sorted(values, reverse=True) and sum(math.exp(v) for v in values) < 1


def test_logprobs_of_many_alternatives_stay_finite_and_end():
    """Past ~1,074 alternatives (1 - p0) 2^-k underflows to 0: the values are taken in log
    space, so none is log(0); and no more alternatives than the pool holds are listed (an
    ask for more, `--max-logprobs -1` with the whole vocabulary, would never end)."""
    tok = get_tokenizer()
    pool = tok.free_text_token_ids
    token = pool[10]
    top = Logprobs(tok, 3).top(0, token, 1500)
    values = [v for _, v in top]
    assert len(top) == 1500 and all(math.isfinite(v) for v in values)
    assert values == sorted(values, reverse=True)
    assert values[1:4] == pytest.approx([math.log((1 - math.exp(values[0])) * 2.0 ** -k)
                                         for k in (1, 2, 3)], rel=1e-12)
    everything = Logprobs(tok, 3).top(0, token, tok.vocab_size)
    assert len(everything) == len(pool) == len({t for t, _ in everything})


def test_metrics_port_is_an_alias_of_http_port():
    doc = {"deployments": [{"name": "d", "model": "llama-3.1-8b", "quant": "bf16",
                            "chip": "h100-sxm", "engine": "vllm"}]}
    assert parse_fleet({**doc, "server": {"metrics_port": 9100}}).server.http_port == 9100
    fleet = parse_fleet({**doc, "server": {"http_port": 9101, "metrics_port": 9101}})
    assert fleet.server.http_port == fleet.server.metrics_port == 9101
    with pytest.raises(ConfigError, match="alias"):
        parse_fleet({**doc, "server": {"http_port": 9101, "metrics_port": 9102}})
