"""The engine loop's messages out, as a mixin of `EngineLoop` (server/engine_proc/loop.py),
which owns every attribute used here: one `StepOutputs` per front end per step (vLLM v1's one
IPC message per step) with the step's new tokens, first schedulings, jump-forward runs,
preemptions and finishes; and the per-front-end queue that keeps their order when a front end
is slow to take them.

Why a mixin: it is what the single writer tells the front ends after each step, kept out of
`loop.py` so that the step loop reads on its own.
"""

from __future__ import annotations

import zmq

from server.engine.core import StepResult
from server.engine.interface import FinishReason
from server.ipc import messages as m


class LoopOutputs:
    """EngineLoop's `_send`, `_flush` and `_publish` (see the module docstring)."""

    def _send(self, fe: int, payload: bytes) -> None:
        if self.pending[fe]:
            self.pending[fe].append(payload)
            return
        try:
            self.outputs[fe].send(payload, zmq.NOBLOCK)
        except zmq.Again:  # the front end is slow: keep order, flush when it can take more
            self.pending[fe].append(payload)
            self.poller.register(self.outputs[fe], zmq.POLLOUT)

    def _flush(self, fe: int) -> None:
        queue, sock = self.pending[fe], self.outputs[fe]
        while queue:
            try:
                sock.send(queue[0], zmq.NOBLOCK)
            except zmq.Again:
                return
            queue.popleft()
        self.poller.unregister(sock)

    def _publish(self, result: StepResult, start: float) -> None:
        n = len(self.outputs)
        seqs: list[list[int]] = [[] for _ in range(n)]
        counts: list[list[int]] = [[] for _ in range(n)]
        tokens: list[list[int]] = [[] for _ in range(n)]
        first: list[list[tuple[int, int]]] = [[] for _ in range(n)]
        jumped: list[list[tuple[int, int]]] = [[] for _ in range(n)]
        finished: list[list[m.Finished]] = [[] for _ in range(n)]
        preempted: list[list[int]] = [[] for _ in range(n)]
        external: list[list[tuple[int, int]]] = [[] for _ in range(n)]
        live_of = self.live.get
        extra = self.faults.take_preempted() if self.faults is not None else ()
        for rid in (*result.output.preempted_request_ids, *extra):
            if (live := live_of(rid)) is not None:
                preempted[live.frontend].append(live.seq)
        for s in result.output.scheduled:
            live = live_of(s.request_id)
            if live is not None and not live.scheduled:
                live.scheduled = True
                first[live.frontend].append((live.seq, max(live.req.num_cached_tokens, 0)))
                if live.req.num_external_tokens:  # P/D: its prompt KV was transferred in
                    external[live.frontend].append((live.seq, live.req.num_external_tokens))
        for rid, toks in result.new_tokens.items():
            live = live_of(rid)
            if live is not None:
                fe = live.frontend
                seqs[fe].append(live.seq)
                counts[fe].append(len(toks))
                tokens[fe].extend(toks)
        for rid, n_jumped in result.jump_forward.items():
            if (live := live_of(rid)) is not None:
                jumped[live.frontend].append((live.seq, n_jumped))
        for req in result.finished:
            live = live_of(req.request_id)
            if live is None:
                continue
            reason = req.finish_reason or FinishReason.STOP
            out, sp = req.token_ids, req.sampling_params
            stop_token = out[-1] if (reason is FinishReason.STOP and req.num_output_tokens
                                     and out[-1] in sp.stop_token_ids) else None
            kvp = (self.connector.prefill_finished(req.request_id, self._t)
                   if self.connector is not None and req.hold_kv else None)
            finished[live.frontend].append(m.Finished(live.seq, reason.value, stop_token, kvp,
                                                      req.spec_decode_metrics))
            self._forget(live, reason)
        self.step_no += 1
        for fe in range(n):
            if seqs[fe] or first[fe] or finished[fe] or preempted[fe]:
                self._send(fe, m.encode(m.StepOutputs(
                    self.deployment, self.rank, self.epoch, self.step_no, start, self._t,
                    seqs[fe], counts[fe], tokens[fe], first[fe], jumped[fe], finished[fe],
                    self._lagging, preempted[fe], external[fe], self.weight_version)))
                if self._lagging:
                    self.unacked[fe].append(self.step_no)
