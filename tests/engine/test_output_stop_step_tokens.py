"""A stop string that completes inside a multi-token step (jump-forward, speculative decoding)
cuts the text but not the step's tokens, as vLLM v1 does: `BaseIncrementalDetokenizer.update`
appends every new token before `check_stop_strings` truncates `output_text`, and
`RequestState.make_request_output` passes the step's whole `new_token_ids` (and
`LogprobsProcessor` their logprobs) on, so `usage.completion_tokens`, `token_ids` and the
logprobs entries count the tokens after the stop (a trim is only proposed upstream, open
vllm-project/vllm#47616). A stop *token* is different: vLLM's scheduler trims the step there.

Why: a "fix" that drops the tokens after the stop string would count fewer tokens than vLLM.
"""

from __future__ import annotations

import asyncio

from server.engine.interface import EngineRequest, FinishReason, SamplingParams, TokenChunk
from server.engine.output import RequestOutput
from server.engine.tokenizer import get_tokenizer
from server.frontend.stream import RequestStream

TOK = get_tokenizer()
CHANCES, ENCODES, AWAITED, CASC = TOK.encode(" chances encodes awaited casc")


def run(steps: list[list[int]], **sampling: object) -> tuple[list[TokenChunk], RequestStream]:
    """Steps pushed as the receiver pushes them; the engine's finish (length) unless a stop
    string ended the request first."""
    req = EngineRequest("r", prompt_token_ids=(7,), sampling=SamplingParams(**sampling))
    st = RequestStream(req, RequestOutput(req, (7,), TOK), seq=1, deployment=0, rank=0,
                       arrival=0.0, interval=1, clock=lambda: 0.0)

    async def consume() -> list[TokenChunk]:
        stopped = False
        for i, step in enumerate(steps):
            if stopped := st.push(step, float(i + 1)):
                break
        if not stopped:
            st.finish(FinishReason.LENGTH)
        return [c async for c in st.outputs()]
    return asyncio.run(consume()), st


def test_tokens_after_a_mid_step_stop_string_are_output_tokens():
    # " chances" completes "han" in the second of four tokens of one step
    step = [ENCODES, CHANCES, AWAITED, CASC]
    chunks, st = run([step], stop=("han",))
    fin = chunks[-1].finish
    assert fin is not None and fin.reason is FinishReason.STOP and fin.stop_str == "han"
    assert "".join(c.text for c in chunks) == " encodes c"  # the text stops at the string
    assert [t for c in chunks for t in c.token_ids] == step  # ids (and logprobs): all four
    assert fin.usage.completion_tokens == 4
    assert st.n_out == 4  # vllm:generation_tokens counts the step's tokens too
    # the same with the stop string kept, and after an earlier step
    chunks, _ = run([[AWAITED], step], stop=("han",), include_stop_str_in_output=True)
    assert "".join(c.text for c in chunks) == " awaited encodes chan"
    assert [t for c in chunks for t in c.token_ids] == [AWAITED, *step]
    assert chunks[-1].finish is not None and chunks[-1].finish.usage.completion_tokens == 5
