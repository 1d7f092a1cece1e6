"""A decode pod's pull of remotely prefilled KV, as vLLM 0.33.0's scheduler drives its NIXL
connector: the pull starts only when the request is admitted (a seat, blocks for its prompt),
holds those blocks while the KV crosses the link, and lands at the first step after its end;
then only the last prompt token is computed and the tokens are the aggregated deployment's.
However the request ends, the connector hears of it once (the prefill pod frees its blocks),
and the scheduler's invariants hold after every step."""

from __future__ import annotations

from engine_drive import make, request, run

from server.engine.kv_pulls import RemotePulls
from server.engine.request import RequestStatus

PROMPT = [(7 * i) % 997 + 1 for i in range(100)]
LINK_S = 0.25  # the test's link: every pull takes this long, one after another


class Link:
    """The connector's side of `RemotePulls`: a link serving one pull at a time."""

    def __init__(self) -> None:
        self.free_at = 0.0
        self.started: dict[str, tuple[int, float]] = {}  # id -> (tokens, start)
        self.ended: list[tuple[str, bool]] = []

    def timing(self, rid: str, num_tokens: int, start: float) -> float:
        self.started[rid] = (num_tokens, start)
        self.free_at = max(start, self.free_at) + LINK_S
        return self.free_at

    def on_end(self, rid: str, landed: bool) -> None:
        self.ended.append((rid, landed))


def decode_pod(**config):
    sched, model = make(num_blocks=64, block_size=16, **config)
    link = Link()
    sched.attach_pulls(RemotePulls(link.timing, link.on_end))
    return sched, model, link


def pulled(rid: str, max_tokens: int = 20):
    req = request(rid, PROMPT, max_tokens, ignore_eos=True)
    req.num_remote_tokens = len(PROMPT) - 1  # the prefill pod holds all but the last token
    return req


def tick(sched, model, t: float):
    out = sched.schedule(t)
    sched.update(out, model.next_tokens(out, sched.requests))
    sched.check_integrity()
    return out


def test_the_pull_waits_for_a_seat_holds_blocks_and_lands_before_the_last_token():
    agg, model = make(num_blocks=64, block_size=16)
    agg.add_request(request("r", PROMPT, 20, ignore_eos=True))
    expected = run(agg, model)["r"].output_token_ids

    sched, model, link = decode_pod(max_num_seqs=1)
    sched.add_request(request("busy", list(range(200, 230)), 3, ignore_eos=True))
    tick(sched, model, 0.0)  # busy holds the one seat
    sched.add_request(pulled("r"))
    free = sched.pool.num_free
    t = 0.0
    while sched.requests["r"].status == RequestStatus.WAITING:
        assert sched.kv_fetch_stages() == (1, 0, 0) and not link.started  # not started
        assert sched.pool.num_free <= free  # it holds nothing while it waits
        t += 0.01
        tick(sched, model, t)
    # admitted when busy finished: the pull started at that step, holding the prompt's blocks
    assert link.started == {"r": (len(PROMPT) - 1, t)}
    assert sched.requests["r"].status == RequestStatus.WAITING_FOR_REMOTE_KVS
    assert sched.kv_fetch_stages() == (0, 1, 0)
    assert len(sched.requests["r"].block_ids) == -(-len(PROMPT) // 16)
    out = tick(sched, model, t + LINK_S / 2)
    assert out.scheduled == () and link.ended == []  # still on the link
    out = tick(sched, model, t + LINK_S)  # landed: only the last prompt token is computed
    (first,) = out.scheduled
    assert first.start_position == len(PROMPT) - 1 and first.num_new_tokens == 1
    assert link.ended == [("r", True)]
    assert sched.stats.external_prefix_cache_hits == len(PROMPT) - 1
    done = run(sched, model)
    assert done["r"].output_token_ids == expected
    assert done["r"].num_cached_tokens == len(PROMPT) - 1


def test_pulls_queue_on_the_link_in_the_order_they_start():
    sched, model, link = decode_pod()
    for rid in ("a", "b"):
        sched.add_request(pulled(rid))
    tick(sched, model, 1.0)
    assert link.started == {"a": (99, 1.0), "b": (99, 1.0)}
    assert [sched.requests[r].status for r in "ab"] == [RequestStatus.WAITING_FOR_REMOTE_KVS] * 2
    tick(sched, model, 1.0 + LINK_S)
    assert link.ended == [("a", True)]  # b is behind it on the link
    tick(sched, model, 1.0 + 2 * LINK_S)
    assert link.ended == [("a", True), ("b", True)]


def test_a_request_that_ends_first_lets_the_prefill_pod_go_once():
    sched, model, link = decode_pod(max_num_seqs=1)
    sched.add_request(request("busy", list(range(200, 230)), 50, ignore_eos=True))
    tick(sched, model, 0.0)
    sched.add_request(pulled("waits"))  # expected, not started
    sched.abort("waits")
    sched.check_integrity()
    assert link.ended == [("waits", False)] and sched.kv_fetch_stages() == (0, 0, 0)
    sched.abort("busy")
    sched.add_request(pulled("pulling"))
    tick(sched, model, 1.0)
    assert sched.requests["pulling"].status == RequestStatus.WAITING_FOR_REMOTE_KVS
    sched.abort("pulling")  # mid-transfer
    sched.check_integrity()
    assert link.ended == [("waits", False), ("pulling", False)]
    assert sched.pool.num_free + sched.cache.evictable_blocks == 64  # every block released
    assert sched.kv_fetch_stages() == (0, 0, 0) and sched.next_load_end() is None


def test_only_what_the_device_does_not_hold_is_pulled():
    """vLLM's connector loads the tokens past the device's own prefix-cache hit (whole
    blocks): none when the device holds all the prefill pod would send."""
    sched, model, link = decode_pod()
    short = PROMPT[:97]  # all but its last token fill six blocks
    for rid, prompt in (("first", PROMPT), ("first-short", short)):
        sched.add_request(request(rid, prompt, 2, ignore_eos=True))
    run(sched, model)  # both prompts are in the device's prefix cache now
    sched.add_request(pulled("again"))  # 99 tokens held remotely, 96 here
    short_again = request("short-again", short, 2, ignore_eos=True)
    short_again.num_remote_tokens = len(short) - 1
    sched.add_request(short_again)
    out = tick(sched, model, 1.0)
    assert link.started == {"again": (3, 1.0)}
    assert link.ended == [("short-again", False)]  # told, not read
    assert [s.request_id for s in out.scheduled] == ["short-again"]
