"""Coalescing under overload (server.frontend.pacing): the factor follows the loop's lateness,
and a stream wakes its consumer only when interval x factor tokens are pending, the first
tokens and the finish still at once, token times exact."""

from __future__ import annotations

import asyncio

from server.engine.interface import EngineRequest, FinishReason
from server.engine.output import RequestOutput
from server.engine.tokenizer import get_tokenizer
from server.frontend import pacing
from server.frontend.pacing import LoopPacer
from server.frontend.stream import RequestStream


def test_factor_doubles_while_late_and_halves_once_on_time():
    p = LoopPacer()
    late, on_time, between = pacing.LATE_S * 2, pacing.ON_TIME_S / 2, pacing.LATE_S / 2
    assert [p.observe(late) for _ in range(5)] == [2, 4, 8, 8, 8]  # capped
    assert p.observe(between) == 8  # neither late nor on time: holds
    assert [p.observe(on_time) for _ in range(4)] == [4, 2, 1, 1]


def stream(pacer: LoopPacer, interval: int = 1) -> RequestStream:
    req = EngineRequest("r", prompt_token_ids=(1, 2, 3), return_token_times=True)
    return RequestStream(req, RequestOutput(req, (1, 2, 3), get_tokenizer()), seq=1,
                         deployment=0, rank=0, arrival=0.0, interval=interval,
                         clock=lambda: 0.0, pacer=pacer)


def drain(s: RequestStream) -> list:
    async def run():
        chunks = []
        async for c in s.outputs():
            chunks.append(c)
        return chunks
    return asyncio.run(run())


def test_a_saturated_loop_sends_fewer_larger_messages_with_exact_times():
    chunks = {}
    for factor in (1, 4):
        p = LoopPacer()
        p.factor = factor
        s = stream(p)
        woken = []
        for k in range(1, 10):  # nine steps of one token each, 10 ms apart
            s.push([100 + k], 0.01 * k)
            woken.append(s._event.is_set())
            if s._event.is_set():
                s._event.clear()
                s.sent += len(s.pending)  # what the consumer would take
                s.pending, s.pending_times = [], []
        # the first token wakes at once; afterwards every interval x factor tokens
        assert woken == [True] + [(k - 1) % factor == 0 for k in range(2, 10)]
        s2 = stream(p)
        for k in range(1, 10):
            s2.push([100 + k], 0.01 * k)
        s2.finish(FinishReason.LENGTH)
        chunks[factor] = drain(s2)
        times = [t for c in chunks[factor] for t in c.token_times]
        assert times == [0.01 * k for k in range(1, 10)]  # exact emulated times, whatever
        assert chunks[factor][-1].finish is not None
