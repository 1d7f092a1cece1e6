"""Helpers for the engine tests: drive a scheduler with the mock model, no device, no clock."""

from __future__ import annotations

from collections.abc import Callable

from server.engine.mock_model import MockModel, OutputLengths
from server.engine.request import Request, SamplingParams
from server.engine.scheduler import Scheduler
from server.engine.scheduler_config import SchedulerConfig

EOS = 0
VOCAB = range(1, 1000)


def make(
    lengths: OutputLengths | None = None, model_seed: int = 0, **config: object
) -> tuple[Scheduler, MockModel]:
    sched = Scheduler(SchedulerConfig(**config), eos_token_id=EOS)  # type: ignore[arg-type]
    return sched, MockModel(VOCAB, EOS, lengths or OutputLengths("geometric", 24), model_seed)


def request(rid: str, prompt: list[int], max_tokens: int = 64, priority: int = 0,
            **params: object) -> Request:
    return Request(rid, prompt, SamplingParams(max_tokens=max_tokens, **params),  # type: ignore[arg-type]
                   priority=priority)


def step(sched: Scheduler, model: MockModel) -> list[Request]:
    out = sched.schedule()
    return sched.update(out, model.next_tokens(out, sched.requests))


def run(
    sched: Scheduler,
    model: MockModel,
    *,
    check: bool = True,
    before_step: Callable[[Scheduler, int], None] | None = None,
    max_steps: int = 100_000,
) -> dict[str, Request]:
    """Step until nothing is unfinished; returns every request that finished, by id."""
    done: dict[str, Request] = {}
    for n in range(max_steps):
        if not sched.has_unfinished():
            return done
        if before_step is not None:
            before_step(sched, n)
        for r in step(sched, model):
            done[r.request_id] = r
        if check:
            sched.check_integrity()
    raise AssertionError("the scheduler did not drain")


def pooling_request(rid: str, prompt: list[int]):
    req = request(rid, prompt, 1)
    req.pooling = True
    return req


def drive(sched, model) -> list[tuple[int, list]]:
    """(step, requests finished in it) until idle; integrity checked after every step."""
    out, n = [], 0
    while sched.has_unfinished():
        o = sched.schedule()
        sampled = model.next_tokens(o, sched.requests)
        assert not any(sched.requests[rid].pooling for rid in sampled), "a pooling one sampled"
        finished = sched.update(o, sampled)
        sched.check_integrity()
        out.append((n, finished))
        n += 1
    return out
