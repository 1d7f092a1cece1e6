"""Property test: any interleaving of add / step / finish / abort / preempt / evict keeps every
scheduler, block-pool and radix-cache invariant, checked after every rule."""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from server.engine.mock_model import MockModel, OutputLengths
from server.engine.radix_cache import RadixCache, RadixNode
from server.engine.request import FinishReason, Request, RequestStatus, SamplingParams
from server.engine.scheduler import Scheduler
from server.engine.scheduler_config import SchedulerConfig

EOS = 0
MAX_MODEL_LEN = 96


class SchedulerMachine(RuleBasedStateMachine):
    sched: Scheduler
    model: MockModel

    @initialize(
        block_size=st.sampled_from([2, 4, 16]),
        extra_blocks=st.integers(0, 24),
        policy=st.sampled_from(["fcfs", "priority", "lpm"]),
        prefix_caching=st.booleans(),
        chunked=st.booleans(),
        layout=st.sampled_from(["paged", "paged", "contiguous"]),
        batching=st.sampled_from(["continuous", "continuous", "static"]),
        budget=st.sampled_from([8, 32, 128]),
        max_num_seqs=st.integers(1, 6),
        mean_len=st.sampled_from([2.0, 8.0, 40.0]),
    )
    def setup(
        self,
        block_size: int,
        extra_blocks: int,
        policy: str,
        prefix_caching: bool,
        chunked: bool,
        layout: str,
        batching: str,
        budget: int,
        max_num_seqs: int,
        mean_len: float,
    ) -> None:
        min_blocks = -(-MAX_MODEL_LEN // block_size)  # one longest request always fits
        cfg = SchedulerConfig(
            num_blocks=min_blocks + extra_blocks * 16 // block_size,
            block_size=block_size,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=budget if chunked else max(budget, MAX_MODEL_LEN),
            max_model_len=MAX_MODEL_LEN,
            enable_chunked_prefill=chunked,
            policy=policy,  # type: ignore[arg-type]
            enable_prefix_caching=prefix_caching,
            kv_layout=layout,  # type: ignore[arg-type]
            batching=batching,  # type: ignore[arg-type]
            lpm_fcfs_threshold=3,
        )
        self.sched = Scheduler(cfg, eos_token_id=EOS)
        self.model = MockModel(range(1, 40), EOS, OutputLengths("geometric", mean_len))
        self.prefixes = [[(7 * i + j) % 39 + 1 for j in range(48)] for i in range(3)]
        self.next_id = 0
        self.finished: set[str] = set()

    # -- rules -----------------------------------------------------------------------------
    @rule(
        prefix=st.integers(0, 3),
        prefix_len=st.integers(0, 48),
        suffix=st.lists(st.integers(1, 39), min_size=0, max_size=20),
        max_tokens=st.integers(1, 40),
        ignore_eos=st.booleans(),
        priority=st.integers(-1, 1),
        stop=st.lists(st.integers(1, 39), max_size=2),
        seed=st.integers(0, 1),
    )
    def add(
        self,
        prefix: int,
        prefix_len: int,
        suffix: list[int],
        max_tokens: int,
        ignore_eos: bool,
        priority: int,
        stop: list[int],
        seed: int,
    ) -> None:
        head = self.prefixes[prefix][:prefix_len] if prefix < 3 else []
        prompt = (head + suffix) or [1]
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos, seed=seed,
                                stop_token_ids=tuple(stop))
        req = Request(f"r{self.next_id}", prompt, params, arrival_time=self.next_id,
                      priority=priority)
        self.next_id += 1
        self.sched.add_request(req)

    @precondition(lambda self: self.sched.has_unfinished())
    @rule(data=st.data())
    def add_twin(self, data: st.DataObject) -> None:
        """The same prompt and seed again: both compute the same blocks at the same time."""
        rid = data.draw(st.sampled_from(sorted(self.sched.requests)))
        twin = self.sched.requests[rid]
        req = Request(f"r{self.next_id}", twin.prompt_token_ids, twin.sampling_params,
                      arrival_time=self.next_id, priority=twin.priority)
        self.next_id += 1
        self.sched.add_request(req)

    @rule()
    def step(self) -> None:
        out = self.sched.schedule()
        for s in out.scheduled:
            assert s.num_new_tokens > 0
        assert out.num_batched_tokens <= self.sched.config.max_num_batched_tokens
        assert len(out.scheduled) <= self.sched.config.max_num_seqs
        assert self.sched.num_running <= self.sched.config.max_num_seqs
        finished = self.sched.update(out, self.model.next_tokens(out, self.sched.requests))
        for r in finished:
            assert r.status.is_finished and r.finish_reason in (FinishReason.STOP,
                                                                FinishReason.LENGTH)
            assert not r.block_ids and r.cache_node is None
            assert r.num_output_tokens <= r.sampling_params.max_tokens
            self.finished.add(r.request_id)

    @precondition(lambda self: self.sched.has_unfinished())
    @rule(data=st.data(), error=st.booleans())
    def abort(self, data: st.DataObject, error: bool) -> None:
        rid = data.draw(st.sampled_from(sorted(self.sched.requests)))
        reason = FinishReason.ERROR if error else FinishReason.ABORT
        req = self.sched.abort(rid, reason)
        assert req is not None and req.finish_reason is reason
        assert not req.block_ids and req.cache_node is None
        assert self.sched.abort(rid) is None  # idempotent

    @precondition(lambda self: self.sched.num_running > 0)
    @rule(data=st.data())
    def preempt(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(r.request_id for r in self.sched.running)))
        assert self.sched.preempt(rid)
        req = self.sched.requests[rid]
        assert req.status == RequestStatus.PREEMPTED and not req.block_ids

    @rule(n=st.integers(1, 50))
    def evict(self, n: int) -> None:
        locked = self._locked_paths()
        self.sched.cache.evict(n)
        # Every running request's locked path is still in the tree, with the same blocks.
        assert locked == self._locked_paths()

    @rule()
    def drain(self) -> None:
        for _ in range(2000):
            if not self.sched.has_unfinished():
                break
            self.step()
            self.sched.check_integrity()
        assert not self.sched.has_unfinished()
        self.idle()
        self.sched.cache.evict(self.sched.pool.num_blocks)
        assert self.sched.pool.num_free == self.sched.pool.num_blocks

    # -- invariants ------------------------------------------------------------------------
    def _locked_paths(self) -> dict[str, list[int]]:
        paths = {}
        for r in self.sched.running:
            node = r.cache_node
            if node is None:
                continue
            assert isinstance(node, RadixNode) and node.lock_ref > 0
            blocks: list[int] = []
            while node.parent is not None:
                blocks[:0] = node.block_ids
                node = node.parent
            assert node is self.sched.cache.root  # still attached: never evicted
            assert r.block_ids[: len(blocks)] == blocks
            paths[r.request_id] = blocks
        return paths

    @invariant()
    def integrity(self) -> None:
        self.sched.check_integrity()
        self._locked_paths()

    @invariant()
    def idle(self) -> None:
        if self.sched.has_unfinished():
            return
        pool, cache = self.sched.pool, self.sched.cache
        assert pool.num_used == cache.cached_blocks  # all blocks not held by the cache are free
        if isinstance(cache, RadixCache):
            assert cache.evictable_blocks == cache.cached_blocks  # nothing stays locked


SchedulerMachine.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestSchedulerInvariants = SchedulerMachine.TestCase
