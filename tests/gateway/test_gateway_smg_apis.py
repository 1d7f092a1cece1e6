"""OpenAI's Responses API and Anthropic's Messages API through the real smg gateway, which
answers both itself over `vllm.grpc.engine.VllmEngine` workers: a doppelchip replica behind it
serves a conversation continued by `previous_response_id` (smg's own response store) from its
prefix cache, a streamed response the `openai` SDK accumulates, and a Messages request."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anthropic
import openai
import pytest
from fleets import assert_released
from gateway_harness import SMG, Gateway, gateway, gateway_fleet

from clients.client import AsyncClient

pytestmark = pytest.mark.skipif(SMG is None, reason="smg is not installed (make install-dev)")


@pytest.fixture
async def one_replica(tmp_path) -> AsyncIterator[Gateway]:
    """One replica of the `fast` deployment behind smg (every turn lands on its cache)."""
    async with gateway(tmp_path, [gateway_fleet()]) as gw:
        yield gw


async def test_a_conversation_continued_by_id_hits_the_replicas_prefix_cache(one_replica):
    gw = one_replica
    async with openai.AsyncOpenAI(base_url=f"{gw.base}/v1", api_key="none", max_retries=0,
                                  timeout=30) as oai:
        first = await oai.responses.create(
            model=gw.model, max_output_tokens=8,
            input="The quick brown fox jumps over the lazy dog. Name a colour, please.")
        second = await oai.responses.create(model=gw.model, input="And another one?",
                                            max_output_tokens=8, previous_response_id=first.id)
        assert first.status in ("completed", "incomplete") and first.output_text
        # the gateway sent the first turn again: its prompt (whole blocks of it) was cached
        assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
        cached = second.usage.input_tokens_details.cached_tokens
        assert cached >= first.usage.input_tokens // 16 * 16 > 0
        # (200 tokens: the seeded mock model ends this answer itself, so smg closes the stream
        # with response.completed; a cut answer ends with response.incomplete, as OpenAI's
        # API ends it, which the SDK's accumulator does not take)
        async with oai.responses.stream(model=gw.model, input="Name a colour.",
                                        max_output_tokens=200) as stream:
            streamed = await stream.get_final_response()
        whole = await oai.responses.create(model=gw.model, input="Name a colour.",
                                           max_output_tokens=200)
        assert whole.status == "completed"
        assert streamed.output_text == whole.output_text  # unseeded = seed 0: the same text
    async with AsyncClient(gw.replicas[0].target) as client:
        await assert_released(client, "fast")


async def test_a_messages_request_is_served(one_replica):
    gw = one_replica
    async with anthropic.AsyncAnthropic(base_url=gw.base, api_key="none", max_retries=0,
                                        timeout=30) as claude:
        m = await claude.messages.create(model=gw.model, max_tokens=8, messages=[
            {"role": "user", "content": "Name a colour."}])
    assert m.content[0].type == "text" and m.content[0].text
    assert m.stop_reason in ("end_turn", "max_tokens") and 0 < m.usage.output_tokens <= 8
    async with AsyncClient(gw.replicas[0].target) as client:
        await assert_released(client, "fast")
