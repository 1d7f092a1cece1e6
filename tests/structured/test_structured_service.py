"""Jump-forward and the constraint limits through the server: a fleet file's `jump_forward`
and `max_grammar_bytes`, usage, token times and the engine's counters."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import AsyncIterator, Iterator

import grpc
import jsonschema
import pytest
from fleets import assert_released
from server_proc import ServerProcess, metric

from clients.client import AsyncClient
from clients.generate import run_generate
from clients.structured import ORDER_SCHEMA

_DEPLOYMENT = {"model": "llama-3.1-8b", "quant": "bf16", "chip": "h100-sxm", "engine": "vllm",
               "max_model_len": 512}
FLEET = {
    "server": {"time_scale": 0.05, "default_deployment": "decode-all"},
    "deployments": [
        {"name": "decode-all", **_DEPLOYMENT},
        {"name": "jump", **_DEPLOYMENT, "jump_forward": True},
        {"name": "tiny-grammars", **_DEPLOYMENT, "max_grammar_bytes": 100},
    ],
}


@pytest.fixture(scope="module")
def structured_server() -> Iterator[ServerProcess]:
    with ServerProcess(FLEET) as s:
        yield s


@pytest.fixture
async def served(structured_server) -> AsyncIterator:
    async with AsyncClient(structured_server.target) as c:
        yield structured_server, c


async def _collect(client, deployment: str, seed: int):
    chunks = [c async for c in client.generate(
        "Order:", deployment=deployment, json_schema=ORDER_SCHEMA, seed=seed, max_tokens=300,
        return_token_times=True)]
    ids = [t for c in chunks for t in c.token_ids]
    times = [t for c in chunks for t in c.token_times]
    return "".join(c.text for c in chunks), ids, times, chunks[-1].final


async def test_jump_forward_deployment_same_output_counted(served):
    app, client = served
    total = 0
    for seed in range(3):
        text, ids, times, final = await _collect(client, "jump", seed)
        text_off, ids_off, _, final_off = await _collect(client, "decode-all", seed)
        assert (text, ids) == (text_off, ids_off)
        jsonschema.validate(json.loads(text), ORDER_SCHEMA)
        assert final.usage.completion_tokens == final_off.usage.completion_tokens == len(ids)
        assert final.usage.jump_forward_tokens > len(ids) // 2
        assert final_off.usage.jump_forward_tokens == 0
        assert len(times) == len(ids) and times == sorted(times)  # one time per token
        total += final.usage.jump_forward_tokens
    for name in ("jump", "decode-all", "tiny-grammars"):
        await assert_released(client, name)
    text = await asyncio.to_thread(app.scrape)
    assert metric(text, "doppelchip_jump_forward_tokens_total", deployment="jump") == total
    assert metric(text, "doppelchip_jump_forward_tokens_total", deployment="decode-all") == 0


async def test_configured_grammar_size_limit(served):
    _, client = served
    with pytest.raises(grpc.aio.AioRpcError) as err:
        async for _ in client.generate("x", deployment="tiny-grammars",
                                       json_schema=ORDER_SCHEMA):
            pass
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "accepts at most 100 (max_grammar_bytes)" in err.value.details()
    await assert_released(client, "tiny-grammars")


async def test_cli_generate_with_constraint_flags(served, tmp_path):
    app, _ = served
    schema = tmp_path / "order.json"
    schema.write_text(json.dumps(ORDER_SCHEMA))
    target = app.target
    from clients.generate import read_constraint
    from doppelchip.cli import build_parser

    def schema_ok(t: str) -> bool:
        jsonschema.validate(json.loads(t), ORDER_SCHEMA)
        return True

    for argv, check in [
        (["--json-schema", str(schema)], schema_ok),
        (["--regex", "[0-9]{4}"], lambda t: t.isdigit() and len(t) == 4),
        (["--choice", "left", "--choice", "right"], lambda t: t in ("left", "right")),
    ]:
        args = build_parser().parse_args(["generate", "hi", "--deployment", "jump", *argv])
        constraint = read_constraint(json_schema=args.json_schema, regex=args.regex,
                                     choice=args.choice, grammar=args.grammar)
        out, err = io.StringIO(), io.StringIO()
        code = await asyncio.to_thread(run_generate, target, "hi", out=out, err=err,
                                       deployment="jump", max_tokens=200, **constraint)
        assert code == 0, err.getvalue()
        assert check(out.getvalue().rstrip("\n")), out.getvalue()
        assert "finish=stop" in err.getvalue()
    with pytest.raises(SystemExit):  # at most one constraint flag
        build_parser().parse_args(["generate", "hi", "--regex", "a", "--choice", "a"])
