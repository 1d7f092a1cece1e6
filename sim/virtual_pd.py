"""The fleet's part of the virtual-time event loop (issue 16): the router's `Dispatch`
protocol and the P/D hop — a request prefilled on one core, its KV moved, decoded on another.
The decode core pulls the KV as a real-time decode pod does (`server/engine/kv_pulls.py`):
when its scheduler admits the request, holding its blocks until the pull lands; the prefill
core frees its held blocks then.

Why it exists apart from `sim.virtual`: the hop is one concern (disaggregated
serving, Splitwise/DistServe style, as llm-d's sidecar and vLLM's P/D proxy run it; the
real-time version is `server/engine_proc/kv_connector.py`), and the event loop stays
readable. `PdHops` is a mixin of `virtual._Runner`: it uses the runner's `cores`,
`max_waiting`, `sessions`, `outstanding`, `live`, `times`, `t`, `dispatch`, and its
own `pd` (rid -> Hop), which the runner creates. The fleet's policies (sim/pools.py) come in
through `Dispatch`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Protocol

from server.engine.core import EngineCore
from server.engine.intake import queue_is_full
from server.engine.kv_pulls import RemotePulls
from server.engine.request import Request, SamplingParams

if TYPE_CHECKING:
    from clients.conversation import Conversation


class Dispatch(Protocol):
    """A fleet's router with admission and P/D (sim/pools.py), used instead of a `Route`.

    Why it exists: the event loop stays one loop for one core and for any fleet, yet has to
    ask the fleet's policy three things it alone knows: which core serves a turn (by its SLO
    class too), whether the router refuses it, and, for a disaggregated fleet, which core
    prefills it and when its KV has crossed the link."""

    pd: bool  # disaggregated: turns hop from a prefill core to a decode core
    prefill_cores: Sequence[int]  # P/D: the cores whose step ends may start a KV transfer

    def place(self, prompt: Sequence[int], outstanding: Sequence[int],
              session: Conversation) -> tuple[int, int | None] | None:
        """(the core that serves the turn, the core that prefills it first or None), or None:
        refused at the router (recorded as RESOURCE_EXHAUSTED, holding no KV), or `HELD`:
        no replica of a role it needs is ready yet (routed again after the next tick)."""
        ...

    def transfer(self, prefill: int, decode: int, num_tokens: int,
                 t: float) -> tuple[float, float]:
        """A KV transfer of `num_tokens` tokens' KV from core `prefill` to `decode` started at
        emulated time `t`: (when it ends, the seconds it spends on the link)."""
        ...


class PdHops:
    """The P/D hop's steps, called by the event loop (see the module docstring)."""

    cores: list[EngineCore]
    max_waiting: list[int | None]
    sessions: dict[int, Conversation]  # started, not over
    outstanding: list[int]
    live: dict[str, tuple[Request, int, int, float, int]]
    times: dict[str, list[float]]
    pd: dict[str, Hop]
    dispatch: Dispatch | None
    t: float

    def _attach_pulls(self) -> None:
        """Any core may decode a hop: its scheduler pulls the KV when it admits the request."""
        for k, core in enumerate(self.cores):
            core.scheduler.attach_pulls(RemotePulls(partial(self._pull_timing, k),
                                                    self._pull_end))

    def _pull_timing(self, decode: int, rid: str, num_tokens: int, start: float) -> float:
        hop = self.pd[rid]
        assert self.dispatch is not None
        end, hop.kv_transfer_s = self.dispatch.transfer(hop.prefill, decode, num_tokens, start)
        return end

    def _pull_end(self, rid: str, landed: bool) -> None:
        """The pull landed (or its request ended first): the prefill core frees the blocks
        it held (the decode side's notification)."""
        self.cores[self.pd[rid].prefill].scheduler.release_held(rid)

    def _pd_check(self, k: int, prompt: tuple[int, ...]) -> str | None:
        """What the prefill core would answer at intake (its context length, its queue)."""
        sched = self.cores[k].scheduler
        if len(prompt) + 1 > sched.config.max_model_len:
            return "INVALID_ARGUMENT"
        mw = self.max_waiting[k]
        if mw is not None and queue_is_full(sched.num_waiting, sched.free_seats, mw):
            return "RESOURCE_EXHAUSTED"
        return None

    def _start_prefill(self, k: int, decode: int, req: Request, si: int, ti: int,
                       at: float) -> None:
        """The prefill half, as llm-d's sidecar sends it: the same prompt with max_tokens 1,
        whose blocks the prefill core holds for the decode core to read (vLLM's
        do_remote_decode; `Request.hold_kv`)."""
        s = self.sessions[si]
        pre = Request(req.request_id, list(req.prompt_token_ids),
                      SamplingParams(max_tokens=1, ignore_eos=s.ignore_eos, seed=s.seed),
                      arrival_time=at)
        pre.hold_kv = True
        self.cores[k].add_request(pre)
        self.outstanding[k] += 1
        self.pd[req.request_id] = Hop(req, si, ti, at, k, decode)

    def _prefilled(self, hop: Hop, pre: Request) -> None:
        """The prefill ended: the request joins the decode core, which pulls its KV (all
        prompt tokens but the last, which the decode side recomputes, as vLLM) when it admits
        it; a prefill that kept nothing (it stopped on EOS) moves nothing and the decode side
        prefills the prompt itself."""
        self.outstanding[hop.prefill] -= 1
        hop.prefill_end_s = self.t
        req, prefill = hop.req, self.cores[hop.prefill].scheduler
        if req.request_id in prefill.held:
            hop.num_tokens = max(0, len(pre.prompt_token_ids) - 1)
            if hop.num_tokens:
                req.num_remote_tokens = hop.num_tokens
            else:  # a one-token prompt: nothing to pull, the blocks go at once
                prefill.release_held(req.request_id)
        self.cores[hop.decode].add_request(req)
        self.live[req.request_id] = (req, hop.si, hop.ti, hop.at, hop.decode)
        self.times[req.request_id] = []


@dataclass(eq=False)
class Hop:
    """A disaggregated request between its arrival and its decode's start (issue 16)."""

    req: Request  # the decode half (the turn's own sampling parameters)
    si: int
    ti: int
    at: float
    prefill: int  # its cores
    decode: int
    prefill_end_s: float | None = None
    num_tokens: int = 0  # prompt tokens whose KV moves
    kv_transfer_s: float = 0.0
