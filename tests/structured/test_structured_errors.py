"""Bad constraints get INVALID_ARGUMENT naming the problem, before anything is allocated."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from fleets import assert_released
from server_proc import metric

from clients.client import build_request

BAD_CONSTRAINTS = [
    # (build_request kwargs, words the message must contain)
    (dict(regex="[a-z"), "regex constraint does not compile"),
    (dict(regex="(ab"), "regex constraint does not compile"),
    (dict(regex=""), "regex constraint is empty"),
    (dict(json_schema='{"type": "strin"}'), "json_schema constraint does not compile"),
    (dict(json_schema='{"type": "object", "properties": {"a": {"$ref": "#/nope"}}}'),
     "json_schema constraint does not compile"),
    (dict(json_schema="{not json"), "not valid JSON"),
    (dict(json_schema="[1, 2]"), "must be an object or a boolean"),
    (dict(choice=[]), "choice constraint needs at least one choice"),
    (dict(grammar="start: undefined_rule"), "grammar constraint does not compile"),
    (dict(grammar="   "), "grammar constraint is empty"),
    (dict(regex="a" * 70_000), "accepts at most 65536 (max_grammar_bytes)"),
]


@pytest.mark.parametrize(("kwargs", "words"), BAD_CONSTRAINTS,
                         ids=[f"{next(iter(k))}:{str(next(iter(k.values())))[:20]}"
                              for k, _ in BAD_CONSTRAINTS])
async def test_bad_constraint_is_invalid_argument(client, server, kwargs, words):
    before = await asyncio.to_thread(server.scrape)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        async for _ in client.stub.Generate(build_request("hello", max_tokens=8, **kwargs)):
            pass
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert words in err.value.details()
    # refused at submit: never queued, never stepped, no block taken
    after = await asyncio.to_thread(server.scrape)
    for name in ("vllm:iteration_tokens_total_count", "vllm:prefix_cache_queries_total"):
        assert metric(after, name, deployment="fast") == metric(before, name, deployment="fast")
    for name in ("fast", "slow"):
        await assert_released(client, name)
    ok = [c async for c in client.generate("still fine", max_tokens=2, regex="[0-9]+")]
    assert ok[-1].final.usage.completion_tokens >= 1


def test_client_refuses_two_constraints():
    with pytest.raises(TypeError, match="at most one constraint"):
        build_request("x", regex="a", choice=["a"])
