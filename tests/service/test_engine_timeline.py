"""The engine process's emulated timeline while idle: only an arrival moves it.

Drives the real EngineLoop in-process on a timeline whose `now` the test sets, with messages
pushed into its real input socket (a blocking poll waits for each: no sleeps)."""

from __future__ import annotations

import zmq

from server.engine.build import build_core
from server.engine.clock import Timeline
from server.engine.interface import EngineRequest, SamplingParams
from server.engine.options import EngineOptions
from server.engine.tokenizer import get_tokenizer
from server.engine_proc.info import placed_info
from server.engine_proc.loop import EngineLoop
from server.engine_proc.stats import EngineStats
from server.ipc import messages as m
from server.ipc.paths import RunDir

OPTS = EngineOptions(name="d", model="llama-3.1-8b", quant="bf16", chip="h100-sxm",
                     engine="vllm", max_model_len=512)


class SetClock(Timeline):
    """A timeline the test moves by hand."""

    def __init__(self) -> None:
        super().__init__(0.0, 1.0)
        self.t = 0.0

    def now(self) -> float:
        return self.t


def test_a_wake_up_that_is_not_an_arrival_leaves_an_in_flight_request_no_queue(tmp_path):
    """The CI failure of test_http_lora's token times: the last step ended at 10; a request
    was stamped at 15 and was still on its way when the front end's ack woke the idle engine
    at 20. Resuming at the wall clock then would start the request at 20 (5 s of queue the
    device never had); it must start at its arrival."""
    tok = get_tokenizer()
    core = build_core(OPTS, tok)
    info = placed_info(OPTS, 0, core, tok)
    run = RunDir(tmp_path)
    clock = SetClock()
    loop = EngineLoop(deployment=0, rank=0, epoch=0, core=core, limits=info.limits,
                      stats=EngineStats(run.engine_stats(0, 0), info, 0, 1), run_dir=run,
                      num_frontends=1, timeline=clock, cold=False, check_integrity=True,
                      info=info)
    push = loop.ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    push.connect(run.engine_input(0, 0))
    try:
        loop.state = "ready"  # as run() leaves it after the start-up
        loop._t, clock.t = 10.0, 20.0
        joules = core.stats.joules
        push.send(m.encode(m.Ack(frontend=0, step=0)))
        loop._idle()  # blocks until the ack is in, then handles it
        assert loop._t == 10.0 and core.stats.joules == joules
        request = EngineRequest("r", prompt_token_ids=tuple(range(1, 9)),
                                sampling=SamplingParams(max_tokens=2))
        push.send(m.encode(m.AddRequest(0, 1, 0, 15.0, 2, request)))
        loop._idle()
        assert loop.inbox and loop._t == 15.0  # the step starts at the arrival
        assert core.stats.joules - joules == core.idle_watts * 5.0  # idle from the last step
    finally:
        push.close()
        loop.ctx.destroy(linger=0)
