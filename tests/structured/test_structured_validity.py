"""Constrained outputs, through gRPC, always satisfy their constraint, and are deterministic."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
from fleets import assert_released
from structured_cases import CHOICES, REGEXES, SCHEMAS

from doppelchip.v1 import inference_pb2 as pb

SEEDS = range(4)


async def _generate(client, **kwargs) -> tuple[str, list[int], pb.Final]:
    text, ids, final = "", [], None
    async for chunk in client.generate("Answer:", max_tokens=200, **kwargs):
        text += chunk.text
        ids.extend(chunk.token_ids)
        if chunk.HasField("final"):
            final = chunk.final
    assert final is not None
    return text, ids, final


@pytest.mark.parametrize("regex", REGEXES)
async def test_regex_outputs_match(client, regex):
    for seed in SEEDS:
        text, _, final = await _generate(client, regex=regex, seed=seed)
        assert final.finish_reason == pb.FINISH_REASON_STOP
        assert re.fullmatch(regex, text), (regex, text)
    await assert_released(client, "fast")


@pytest.mark.parametrize("name", sorted(SCHEMAS))
async def test_json_schema_outputs_validate(client, name):
    schema = SCHEMAS[name]
    for seed in SEEDS:
        text, _, final = await _generate(client, json_schema=schema, seed=seed)
        assert final.finish_reason == pb.FINISH_REASON_STOP, text
        jsonschema.validate(json.loads(text), schema)
    await assert_released(client, "fast")


@pytest.mark.parametrize("choices", CHOICES, ids=[c[0] for c in CHOICES])
async def test_choice_outputs_are_one_of_the_choices(client, choices):
    for seed in SEEDS:
        text, _, final = await _generate(client, choice=list(choices), seed=seed)
        assert final.finish_reason == pb.FINISH_REASON_STOP
        assert text in choices


async def test_lark_grammar_output_parses(client):
    grammar = 'start: "(" NUM (OP NUM)* ")"\nNUM: /[0-9]{1,3}/\nOP: "+" | "*"\n'
    for seed in SEEDS:
        text, _, _ = await _generate(client, grammar=grammar, seed=seed)
        assert re.fullmatch(r"\([0-9]{1,3}([+*][0-9]{1,3})*\)", text), text


async def test_same_request_same_output(client):
    kwargs = dict(json_schema=SCHEMAS["nested"], seed=7, return_token_times=True)
    first = await _generate(client, **kwargs)
    second = await _generate(client, **kwargs)
    assert first[0] == second[0] and first[1] == second[1]
    others = {(await _generate(client, json_schema=SCHEMAS["nested"], seed=s))[0]
              for s in range(8, 12)}
    assert len(others) > 1  # the seed matters: outputs are not all the same


async def test_usage_counts_the_constrained_tokens(client):
    _, ids, final = await _generate(client, regex=r"[0-9]{3}-[0-9]{4}")
    assert final.usage.completion_tokens == len(ids)
    assert final.usage.jump_forward_tokens == 0  # vLLM (the `fast` deployment) decodes all


async def test_constraint_that_cannot_finish_ends_with_length(client):
    chunks = [c async for c in client.generate("Answer:", max_tokens=20, regex="(xy){300}")]
    final = chunks[-1].final
    text = "".join(c.text for c in chunks)
    assert final.finish_reason == pb.FINISH_REASON_LENGTH
    assert final.usage.completion_tokens == 20
    assert re.fullmatch(r"(xy)*x?", text) and len(text) >= 20, text  # the partial output
    await assert_released(client, "fast")


async def test_complete_grammar_ends_the_request_even_with_ignore_eos(client):
    text, ids, final = await _generate(client, choice=["alpha", "beta"], ignore_eos=True,
                                       min_tokens=5)
    assert final.finish_reason == pb.FINISH_REASON_STOP and text in ("alpha", "beta")
    assert len(ids) < 200
