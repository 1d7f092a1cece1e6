"""`Scheduler.update`: a finished step accounted — the other half of the scheduler's contract
(`schedule()` → device step, sampling → `update(output, sampled_tokens)`).

Why it is a file of its own: it is the step's write-back (computed tokens advanced, sampled
tokens appended, stop rules applied, finished requests' KV freed into the prefix cache), with
no part in choosing the batch. `StepUpdate` is a mixin of `Scheduler`, which owns every
attribute it writes and stays their one writer (`_hold`, for a P/D prefill ended by length,
is `KvHold`'s).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .kv_manager import KVCacheManager
from .request import FinishReason, Request, RequestStatus
from .scheduler_config import SchedulerConfig, SchedulerOutput, SchedulerStats


class StepUpdate:
    """`update` (see the module docstring)."""

    config: SchedulerConfig
    eos_token_id: int | None
    kv: KVCacheManager
    requests: dict[str, Request]
    running: list[Request]
    stats: SchedulerStats

    def update(
        self, output: SchedulerOutput, sampled_tokens: Mapping[str, Sequence[int]]
    ) -> list[Request]:
        """Account a finished step: advance computed tokens, append sampled tokens, apply stop
        conditions, finish requests (their KV goes to the prefix cache, their references are
        dropped; a pooling request finishes, stopped, when its prefill is done). Returns the
        requests that finished in this step. Requests aborted since ``schedule()`` are
        skipped."""
        finished: list[Request] = []
        stats, requests, running = self.stats, self.requests, RequestStatus.RUNNING
        eos, max_len = self.eos_token_id, self.config.max_model_len
        plain = 0  # plain decodes' tokens, counted in the stats once at the end
        for rid, num_new, _, is_prefill, samples_token, num_drafts in output.scheduled:
            req = requests.get(rid)
            if req is None or req.status is not running:
                continue
            req.num_computed_tokens += num_new
            if is_prefill:
                stats.num_prefill_tokens += num_new
            reason = None
            if samples_token:
                tokens = sampled_tokens[rid]
                if len(tokens) == 1 and not num_drafts:  # a plain decode
                    token = tokens[0]
                    req.token_ids.append(token)
                    plain += 1
                    sp = req.sampling_params
                    n_out = len(req.token_ids) - req.num_prompt_tokens
                    if (token == eos or n_out >= sp.max_tokens or len(req.token_ids) >= max_len
                            or sp.stop_token_ids):
                        reason = req.stop_reason(token, eos, max_len)
                else:
                    appended = 0
                    for token in tokens:
                        req.token_ids.append(token)
                        appended += 1
                        stats.num_generation_tokens += 1
                        if (reason := req.stop_reason(token, eos, max_len)) is not None:
                            break
                    if num_drafts:  # accepted drafts had their KV computed by verify
                        req.num_computed_tokens += appended - 1
            elif req.pooling and req.num_computed_tokens == req.num_prompt_tokens:
                reason = FinishReason.STOP  # its prefill is done: the pooled vector is ready
            if reason is None:
                continue
            if req.hold_kv and reason is FinishReason.LENGTH:
                self._hold(req)
            self.kv.free(req, cache=True)
            req.status, req.finish_reason = RequestStatus.for_reason(reason), reason
            del self.requests[req.request_id]
            finished.append(req)
        stats.num_generation_tokens += plain
        if finished:
            self.running = [r for r in self.running if not r.is_finished]
            self.stats.num_finished += len(finished)
        return finished
