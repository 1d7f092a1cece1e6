"""Jump-forward decoding: same output, fewer model steps, a shorter emulated timeline.

A request alone on a core: every step computes it once, and every step but a jump's samples
one token. Jump-forward appends the grammar's forced tokens without sampling them, so the
run has exactly `jump_forward_tokens` fewer steps; the forced tokens are computed as a short
prefill-like extension in the next step instead.
"""

from __future__ import annotations

import json

import jsonschema
import pytest
from structured_cases import CHOICES, SCHEMAS, core, run_one, schema_constraint

from clients.structured import ORDER_SCHEMA
from server.engine.interface import Constraint, EngineRequest, FinishReason
from server.engine.output import RequestOutput, spread_times
from server.engine.tokenizer import get_tokenizer
from server.frontend.stream import RequestStream

LONG_KEYS = schema_constraint(ORDER_SCHEMA)  # long fixed keys: most tokens are forced


@pytest.mark.parametrize("seed", range(4))
def test_on_vs_off_same_text_fewer_steps_lower_e2e(seed):
    on = run_one(core(jump_forward=True), LONG_KEYS, seed=seed)
    off = run_one(core(jump_forward=False), LONG_KEYS, seed=seed)
    assert on.text == off.text
    assert on.request.output_token_ids == off.request.output_token_ids
    jsonschema.validate(json.loads(on.text), ORDER_SCHEMA)
    forced = on.request.num_jump_forward_tokens
    assert off.request.num_jump_forward_tokens == 0
    assert forced > on.request.num_output_tokens // 2  # the keys dominate this schema
    assert off.steps - on.steps == forced  # one model step fewer per forced token
    assert off.decode_steps == off.request.num_output_tokens - 1  # every token after the 1st
    assert on.decode_steps < off.decode_steps - forced  # jumps are extensions, not decodes
    assert on.seconds < off.seconds  # end to end, on the emulated timeline


def test_sglang_defaults_on_and_vllm_off():
    assert core("sglang").jump_forward and not core("vllm").jump_forward
    assert core("vllm", jump_forward=True).jump_forward


def test_forced_runs_are_priced_as_prefill_extensions():
    eng = core(jump_forward=True)
    req = run_one(eng, LONG_KEYS).request
    stats = eng.scheduler.stats
    assert stats.num_jump_forward_tokens == req.num_jump_forward_tokens
    # the prompt, plus each jump's sampled token and forced run, went through prefill
    assert stats.num_prefill_tokens > req.num_prompt_tokens + req.num_jump_forward_tokens - 1


@pytest.mark.parametrize("constraint", [
    Constraint("choice", choices=CHOICES[0]),
    Constraint("regex", r"(yes|no)-[0-9]{2}"),
    schema_constraint(SCHEMAS["enum"]),
])
def test_on_vs_off_identical_for_other_constraints(constraint):
    on = run_one(core(jump_forward=True), constraint, seed=3)
    off = run_one(core(jump_forward=False), constraint, seed=3)
    assert on.request.output_token_ids == off.request.output_token_ids
    assert off.steps - on.steps == on.request.num_jump_forward_tokens


def test_forced_run_is_cut_at_max_tokens():
    on = run_one(core(jump_forward=True), LONG_KEYS, max_tokens=7)
    off = run_one(core(jump_forward=False), LONG_KEYS, max_tokens=7)
    assert on.request.num_output_tokens == off.request.num_output_tokens == 7
    assert on.request.output_token_ids == off.request.output_token_ids
    assert on.request.finish_reason == off.request.finish_reason == "length"


async def test_multi_token_step_divides_its_interval():
    """A step that brings a request several tokens (jump-forward) spreads them over the
    interval since its previous token; the final chunk counts the forced tokens."""
    assert spread_times(None, 2.0, 3) == [2.0, 2.0, 2.0]  # first tokens: no interval yet
    assert spread_times(1.0, 2.0, 4) == [1.25, 1.5, 1.75, 2.0]
    tok = get_tokenizer()
    request = EngineRequest("r", "x", return_token_times=True)
    stream = RequestStream(request, RequestOutput(request, (1,), tok), seq=1, deployment=0,
                           rank=0, arrival=0.5, interval=1, clock=lambda: 2.5)
    chunks = stream.outputs()
    stream.push(tok.encode("a"), 1.0)
    first = await anext(chunks)
    stream.push(tok.encode(" b c d")[:3], 2.5)
    stream.jumped = 2
    later = await anext(chunks)
    assert first.token_times == (0.5,)
    assert later.token_times == pytest.approx((1.0, 1.5, 2.0))
    stream.finish(FinishReason.STOP)
    final = await anext(chunks)
    assert final.finish is not None and final.finish.usage.jump_forward_tokens == 2
    assert final.finish.usage.completion_tokens == 4


def test_compiled_grammars_are_cached(monkeypatch):
    """A repeated constraint is compiled once (llguidance is called once), yet every request
    gets a state of its own."""
    from server.engine import constraints as module

    eng = core()
    compiled = []
    real = module._compile
    monkeypatch.setattr(module, "_compile",
                        lambda lltok, spec: compiled.append(spec) or real(lltok, spec))
    schema = Constraint("json_schema", text=json.dumps({"type": "object", "properties": {
        "cache_probe": {"type": "integer"}}, "required": ["cache_probe"]}))
    a = eng.constraints.start(schema, 65536)
    b = eng.constraints.start(schema, 65536)
    c = eng.constraints.start(schema, 65536)
    assert len(compiled) == 1
    assert a.matcher is not b.matcher and b.matcher is not c.matcher  # one state each
