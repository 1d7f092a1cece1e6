"""Stop strings and stop tokens on the detokenized output, as vLLM 0.33.0's
`vllm/v1/engine/detokenizer.py` (`BaseIncrementalDetokenizer.update`, `check_stop_strings`,
`get_next_output_text`) applies them.

Why these tests: each pins one way `server.engine.output.RequestOutput` used to differ from
vLLM — a stop string matched inside the first `min_tokens` tokens' text, a stop token's own
text left out although `include_stop_str_in_output` asked for it (and special tokens always
dropped), several stop strings resolved by where they start instead of where they complete,
and text held back although an included stop string never needs it.
"""

from __future__ import annotations

import asyncio

import pytest

from server.engine.interface import EngineRequest, FinishReason, SamplingParams, TokenChunk
from server.engine.output import RequestOutput
from server.engine.tokenizer import get_tokenizer
from server.frontend.stream import RequestStream

TOK = get_tokenizer()
EOS = TOK.eos_token_id  # "<|eot_id|>"
# One token each: " chances", " encodes", " correspondent", " awaited", " casc" (what the
# default deployment generates after "Hello"), " hand", " ch", "ances".
CHANCES, ENCODES, CORRESPONDENT, AWAITED, CASC = TOK.encode(
    " chances encodes correspondent awaited casc")
HAND, CH, ANCES = TOK.encode(" hand")[0], TOK.encode(" ch")[0], TOK.encode("ances")[0]
HELLO_RUN = [CHANCES, ENCODES, CORRESPONDENT, AWAITED, CASC]


def output(**sampling: object) -> RequestOutput:
    req = EngineRequest("r", prompt_token_ids=(7,), sampling=SamplingParams(**sampling))
    return RequestOutput(req, (7,), TOK)


def stream_steps(out: RequestOutput, steps: list[list[int]]) -> tuple[list[str], str]:
    """Each step's streamed delta, and the whole text (deltas plus what the end releases)."""
    deltas = [out.add(step) for step in steps]
    return deltas, "".join(deltas) + out.rest()


def test_min_tokens_window_starts_after_min_tokens_text():
    # the HTTP repro: "Hello", max_tokens 5, stop ["chances"], min_tokens 1 -> vLLM returns the
    # five tokens, finish length (" chances" is the first token's text, never searched)
    out = output(stop=("chances",), min_tokens=1)
    deltas, text = stream_steps(out, [[t] for t in HELLO_RUN])
    assert not out.stopped and out.stop_str is None
    assert text == " chances encodes correspondent awaited casc"
    assert "".join(deltas) == text[: len(text) - len("chances") + 1]  # the hold-back
    # the same tokens in one step (non-streaming consumers, jump-forward): the same text
    one = output(stop=("chances",), min_tokens=1)
    assert one.add(HELLO_RUN) + one.rest() == text and not one.stopped
    # a stop string that starts in the min_tokens text but completes after it does match
    # (vLLM searches from len(stop) - 1 characters before the window)
    straddle = output(stop=("chances",), min_tokens=1)
    assert stream_steps(straddle, [[CH], [ANCES]])[1] == " "
    assert straddle.stop_str == "chances"


def test_min_tokens_offset_inside_a_multi_token_step():
    # min_tokens 2 ends inside the step: only text after " ch" + "ances" is searched
    out = output(stop=("ances",), min_tokens=2)
    assert out.add([CH, ANCES, CHANCES]) + out.rest() == " chances ch"
    assert out.stop_str == "ances"


def test_stop_token_text_included_when_asked():
    kept = output(stop_token_ids=(HAND,), include_stop_str_in_output=True)
    assert stream_steps(kept, [[CHANCES], [HAND]])[1] == " chances hand"
    dropped = output(stop_token_ids=(HAND,))
    assert stream_steps(dropped, [[CHANCES], [HAND]])[1] == " chances"
    # within min_tokens a stop token does not end the request: its text is output text
    early = output(stop_token_ids=(HAND,), min_tokens=2)
    assert stream_steps(early, [[HAND], [CHANCES]])[1] == " hand chances"


def test_stop_token_text_can_complete_a_stop_string():
    # the stop token's included text is searched too: the stop string becomes stop_reason
    out = output(stop=("hand",), stop_token_ids=(HAND,), include_stop_str_in_output=True)
    assert stream_steps(out, [[CHANCES], [HAND]])[1] == " chances hand"
    assert out.stopped and out.stop_str == "hand"


@pytest.mark.parametrize(("sampling", "steps", "text"), [
    ({"skip_special_tokens": False, "include_stop_str_in_output": True},
     [[CHANCES], [EOS]], " chances<|eot_id|>"),
    ({"skip_special_tokens": False, "ignore_eos": True}, [[EOS], [CHANCES]],
     "<|eot_id|> chances"),
    ({"skip_special_tokens": False, "min_tokens": 2}, [[EOS], [CHANCES]],
     "<|eot_id|> chances"),
    ({"skip_special_tokens": False, "stop": ("zz",), "include_stop_str_in_output": True},
     [[CHANCES, EOS]], " chances<|eot_id|>"),
])
def test_special_tokens_as_vllm(sampling: dict, steps: list[list[int]], text: str):
    # skip_special_tokens false: a special token's text is its content; EOS ending the request
    # is left out unless include_stop_str_in_output (skip_special_tokens true: always "")
    assert stream_steps(output(**sampling), steps)[1] == text
    # EOS ending the request without include_stop_str_in_output adds no text
    assert stream_steps(output(skip_special_tokens=False), [[CHANCES], [EOS]])[1] == " chances"


@pytest.mark.parametrize(("stops", "steps", "include", "text", "stop"), [
    (("chances", "han"), [[CHANCES]], False, " c", "han"),  # the brief's repro
    (("chances", "han"), [[CHANCES]], True, " chan", "han"),
    (("chances", "han"), [[CH], [ANCES]], False, " c", "han"),
])
def test_several_stop_strings_first_to_complete_wins(stops: tuple[str, ...],
                                                     steps: list[list[int]], include: bool,
                                                     text: str, stop: str):
    out = output(stop=stops, include_stop_str_in_output=include)
    assert stream_steps(out, steps)[1] == text
    assert out.stop_str == stop
    # a stop string completed by an earlier token of the step wins over a later one
    two = output(stop=(*stops, "hand"))
    assert stream_steps(two, [[CHANCES, HAND]])[1] == " c" and two.stop_str == "han"


def test_stop_strings_completing_at_the_same_character_go_by_list_order():
    first = output(stop=("an", "han"))
    assert stream_steps(first, [[CHANCES]])[1] == " ch" and first.stop_str == "an"
    second = output(stop=("han", "an"))
    assert stream_steps(second, [[CHANCES]])[1] == " c" and second.stop_str == "han"


def test_no_hold_back_when_the_stop_string_is_included():
    # vLLM's stop_buffer_length is 0 with include_stop_str_in_output: nothing is taken back
    out = output(stop=("zebra",), include_stop_str_in_output=True)
    assert out.add([CHANCES]) == " chances"
    held = output(stop=("zebra",))
    assert held.add([CHANCES]) == " cha" and held.rest() == "nces"


def run_stream(sampling: SamplingParams, steps: list[list[int]]) -> list[TokenChunk]:
    """Steps pushed into a `RequestStream` as the receiver does, then the engine's finish
    (length) unless a stop string already ended the request."""
    req = EngineRequest("r", prompt_token_ids=(7,), sampling=sampling)
    st = RequestStream(req, RequestOutput(req, (7,), TOK), seq=1, deployment=0, rank=0,
                       arrival=0.0, interval=1, clock=lambda: 0.0)

    async def run() -> list[TokenChunk]:
        stopped = False
        for i, step in enumerate(steps):
            stopped = st.push(step, float(i + 1))
            if stopped:
                break
        if not stopped:
            st.finish(FinishReason.LENGTH)
        return [c async for c in st.outputs()]
    return asyncio.run(run())


def test_stream_finish_reasons_follow_vllm():
    chunks = run_stream(SamplingParams(stop=("chances",), min_tokens=1, max_tokens=5),
                        [[t] for t in HELLO_RUN])
    fin = chunks[-1].finish
    assert fin is not None and fin.reason is FinishReason.LENGTH and fin.stop_str is None
    assert "".join(c.text for c in chunks) == " chances encodes correspondent awaited casc"
    chunks = run_stream(SamplingParams(stop=("chances", "han")), [[CHANCES], [HAND]])
    fin = chunks[-1].finish
    assert fin is not None and fin.reason is FinishReason.STOP and fin.stop_str == "han"
    assert "".join(c.text for c in chunks) == " c"
