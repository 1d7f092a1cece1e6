"""400s for out-of-range sampling parameters, as vLLM's `SamplingParams._verify_args` raises
them (`VLLMValidationError`) and `create_error_response` answers them: `param` is the
exception's `parameter` — set only for temperature, top_p and max_tokens, which also end the
message with `(parameter=…, value=…)`; the penalties, top_k, min_p, min_tokens and an empty
stop string answer `param` null. The checks run in vLLM's order.

Why: doppelchip named `param` for all of them (the penalties through the engine's messages),
left the tail out, wrote its own top_k wording and one temperature message for three checks.
"""

from __future__ import annotations

import math

import pytest

from server.http.errors import HttpError
from server.http.lengths import output_budget
from server.http.protocol import ChatCompletionRequest, CompletionRequest
from server.http.sampling import check_common

ASK = [{"role": "user", "content": "x"}]


def refusal(body: dict, max_tokens: int | None = 16) -> dict:
    """The error body `check_common` answers a completions request with."""
    with pytest.raises(HttpError) as e:
        check_common(CompletionRequest(prompt="x", **body), max_tokens)
    return e.value.body()["error"]


def bad(message: str, param: str | None = None) -> dict:
    return {"message": message, "type": "BadRequestError", "param": param, "code": 400}


@pytest.mark.parametrize(("body", "message", "param"), [
    ({"temperature": 5}, "temperature must be in [0, 2], got 5.0. "
     "(parameter=temperature, value=5.0)", "temperature"),
    ({"temperature": -1}, "temperature must be non-negative, got -1.0. "
     "(parameter=temperature, value=-1.0)", "temperature"),
    ({"temperature": math.nan}, "temperature must be a finite number, got nan. "
     "(parameter=temperature, value=nan)", "temperature"),
    ({"top_p": 0}, "top_p must be in (0, 1], got 0.0. (parameter=top_p, value=0.0)", "top_p"),
    ({"top_k": -3}, "top_k must be 0 (disable), or at least 1, got -3.", None),
    ({"min_p": 2}, "min_p must be in [0, 1], got 2.0.", None),
    ({"presence_penalty": 3}, "presence_penalty must be in [-2, 2], got 3.0.", None),
    ({"frequency_penalty": -2.5}, "frequency_penalty must be in [-2, 2], got -2.5.", None),
    ({"repetition_penalty": 0}, "repetition_penalty must be greater than zero, got 0.0.", None),
    ({"repetition_penalty": math.inf}, "repetition_penalty must be a finite number, got inf.",
     None),
    ({"min_tokens": -1}, "min_tokens must be greater than or equal to 0, got -1.", None),
    ({"stop": ""}, "stop cannot contain an empty string.", None),
    ({"stop": ["a", ""]}, "stop cannot contain an empty string.", None),
])
def test_out_of_range_parameters_answer_as_vllm(body: dict, message: str, param: str | None):
    assert refusal(body) == bad(message, param)


def test_checks_run_in_vllm_order():
    # _verify_args: n, penalties, temperature, top_p, top_k, min_p, max_tokens, min_tokens
    assert refusal({"temperature": 5, "presence_penalty": 3})["message"].startswith(
        "presence_penalty")
    assert refusal({"top_p": 0}, max_tokens=0)["param"] == "top_p"
    assert refusal({"min_p": 2, "min_tokens": -1})["message"].startswith("min_p")
    # in range, and None (the defaults): accepted
    ok = {"temperature": 2, "top_p": 1, "top_k": -1, "min_p": 0, "presence_penalty": -2,
          "frequency_penalty": 2, "repetition_penalty": 1.2, "stop": ["a"]}
    assert check_common(CompletionRequest(prompt="x", **ok), 16) == 1
    assert check_common(CompletionRequest(prompt="x", stop=None), None) == 1


def test_min_tokens_over_max_tokens_names_the_sampling_field():
    # vLLM's message names SamplingParams.max_tokens, also for chat's max_completion_tokens
    req = ChatCompletionRequest(messages=ASK, max_completion_tokens=5, min_tokens=9)
    with pytest.raises(HttpError) as e:
        check_common(req, 5)
    assert e.value.message == "min_tokens must be less than or equal to max_tokens=5, got 9."


def test_the_clamped_budget_is_checked_as_sampling_params_checks_it():
    with pytest.raises(HttpError) as e:  # the prompt fills the context: 0 tokens left
        output_budget(16, 4096, 4096)
    assert e.value.body()["error"] == bad(
        "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)", "max_tokens")
    with pytest.raises(HttpError) as e:  # min_tokens within max_tokens, not within the room
        output_budget(16, 10, 20, min_tokens=15)
    assert e.value.body()["error"] == bad(
        "min_tokens must be less than or equal to max_tokens=10, got 15.")


@pytest.mark.parametrize(("path", "base"), [("/v1/completions", {"prompt": "x"}),
                                            ("/v1/chat/completions", {"messages": ASK})])
async def test_the_http_answers(http, path: str, base: dict):
    r = await http.post(path, json={**base, "max_tokens": 2, "presence_penalty": 3})
    assert r.status_code == 400
    assert r.json()["error"] == bad("presence_penalty must be in [-2, 2], got 3.0.")
    r = await http.post(path, json={**base, "max_tokens": 2, "temperature": 2.5})
    assert r.status_code == 400
    assert r.json()["error"] == bad("temperature must be in [0, 2], got 2.5. "
                                    "(parameter=temperature, value=2.5)", "temperature")
