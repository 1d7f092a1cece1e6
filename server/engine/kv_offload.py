"""vLLM's native CPU KV offloading (`--kv-offloading-size`, or `--kv-transfer-config` naming
the `OffloadingConnector` with `cpu_bytes_to_use`): a second tier of the prefix cache in host
memory, kept by the engine core.

Why it exists: a prompt whose prefix the device cache evicted long ago is prefilled again
unless the KV survives somewhere cheaper. vLLM's connector copies every full block to pinned
host memory as it is computed and, when a waiting request's prompt continues there past its
device hit, loads those blocks back over PCIe instead of recomputing them. llm-d's tiered
prefix cache runs exactly this, and its precise prefix-cache scorer reads the tier's KV events
(medium "CPU"). Routers, planners and dashboards see the effect only if the emulated engine
has the tier: hits past the device's, loads that take PCIe time, CPU events, `vllm:kv_offload_*`.

Followed (vLLM 0.33.0): `vllm/config/vllm.py` `_post_init_kv_transfer_config` (the flag makes
an OffloadingConnector with `cpu_bytes_to_use` = GiB × 2³⁰; backend `lmcache` needs an LMCache
server, not emulated); `vllm/v1/kv_offload/cpu/spec.py` (chunks = bytes ÷ one block's KV over
every worker; eviction policy `lru` by default); the connector's scheduler side
(`.../kv_connector/v1/offloading/scheduler.py`: the lookup continues the device hit, at least
one prompt token is computed, the load is asynchronous and the request waits
(WAITING_FOR_REMOTE_KVS) holding its device blocks; stores of every block a step fills);
`events.py` (CPU BlockStored carries only the hash unless `self_describing_kv_events`);
`cpu/manager.py` (`get_load_source`: "host").

The model:
- The tier is the device cache's radix tree (`RadixCache`) over a pool of host blocks, one per
  device block (vLLM's default chunk of one block); least recently used unlocked leaves are
  evicted to make room. A store that cannot make room is skipped (vLLM's allocation failure).
- Store (write-through): every full block of the prompt the device cache is offered
  (`KVCacheManager.cache_blocks`) that the tier does not hold yet; the output's blocks too
  with `offload_prompt_only` false (vLLM's default is true). ASSUMPTION: a store
  completes within the step that filled the block and costs that step nothing (vLLM copies on
  another CUDA stream; a block is KBs to MBs over a 32-64 GB/s link, microseconds against a
  step's milliseconds). Its seconds are counted for `vllm:kv_offload_store_time`.
- Load: `transfer_seconds(bytes, host_link(chip), lanes=chips)`: each chip loads its own shard
  over its own link. Loads queue on the link in the order they start; one starts at the step
  that admits its request, and the request is scheduled from the first step at or after its end.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from devices import Placement
from devices.transfer import Link, host_link, transfer_seconds

from .block_pool import BlockPool
from .kv_events import MEDIUM_CPU, KvEventLog, MediumLog
from .kv_offload_config import GIB, OffloadConfig
from .prefix_cache import PrefixMatch
from .radix_cache import RadixCache
from .request import Request
from .scheduler_config import SchedulerConfig

PAGE = 4096  # vLLM pads a chunk to SharedOffloadRegion.BLOCK_SIZE_ALIGNMENT (mmap.PAGESIZE)


def padded(block_bytes: float) -> int:
    """One block's bytes on every worker, rounded up to a page (vLLM's chunk size)."""
    return -(-int(block_bytes) // PAGE) * PAGE


def num_host_blocks(cpu_bytes: int, block_bytes: float) -> int:
    """Host blocks `cpu_bytes` holds: vLLM's `cpu_bytes_to_use // round_up(bytes of one
    block on every worker, page)` (`CPUOffloadingSpec`)."""
    size = padded(block_bytes)
    return int(cpu_bytes) // size if size else 0


@dataclass
class Load:
    """A request's blocks coming back from the tier: the tokens past its device hit, when
    they have landed, and the tier's node locked until then."""

    req: Request
    num_tokens: int
    ready_at: float
    node: Any


@dataclass
class OffloadStats:
    """Cumulative counters (the engine's stats writer takes deltas): vLLM's
    `vllm:kv_offload_{load,store}_{bytes,time}` and their sizes, allocation failures."""

    loads: int = 0
    load_bytes: float = 0.0
    load_seconds: float = 0.0
    load_sizes: list[float] = field(default_factory=list)  # drained by the stats writer
    stores: int = 0
    store_bytes: float = 0.0
    store_seconds: float = 0.0
    store_sizes: list[float] = field(default_factory=list)
    store_chunks: list[int] = field(default_factory=list)  # chunks each store allocated
    allocation_failures: int = 0


class HostKvTier:
    """The CPU tier of one engine core (see the module docstring). The scheduler is its one
    caller: `store` from the KV manager, `lookup`/`start` at admission, `landed` each step."""

    def __init__(self, config: OffloadConfig, num_blocks: int, block_size: int,
                 block_bytes: float, link: Link, lanes: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"--kv-offloading-size: {config.cpu_bytes / GIB:g} GiB holds no "
                             f"block of {block_bytes:,.0f} bytes")
        self.config = config
        self.pool = BlockPool(num_blocks, block_size)
        self.cache = RadixCache(self.pool)
        self.block_size, self.block_bytes = block_size, block_bytes
        self.link, self.lanes = link, lanes
        self.free_at = 0.0  # when the link ends its last load
        self.loads: dict[str, Load] = {}  # request id -> its load in flight
        self.cursors: dict[str, Any] = {}  # request id -> the node its last store ended at
        self.stats = OffloadStats()

    def attach_events(self, log: KvEventLog) -> None:
        """Report the tier's stores and evictions to the device cache's log, medium CPU."""
        self.cache.attach_events(MediumLog(log, MEDIUM_CPU, self.config.self_describing_events))

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def padded_block_bytes(self) -> int:
        return padded(self.block_bytes)

    @property
    def loading_blocks(self) -> int:
        """Host blocks pinned by loads in flight (`vllm:kv_offload_cpu_cache_read_usage_perc`)."""
        return sum(-(-ld.num_tokens // self.block_size) for ld in self.loads.values())

    # -- store -----------------------------------------------------------------------------
    def store(self, req: Request, num_blocks: int) -> None:
        """Store the first `num_blocks` full blocks of `req`'s tokens where the tier lacks
        them. The walk starts where the request's last store ended (`cursors`) while that
        node is still in the tree, not at the root: a decode stores one block at a time."""
        bs, cache, pool = self.block_size, self.cache, self.pool
        if self.config.prompt_only:  # vLLM's default: the decode's blocks are not stored
            num_blocks = min(num_blocks, req.num_prompt_tokens // bs)
        tokens, ns, end = req.token_ids, req.cache_ns, num_blocks * bs
        start = self.cursors.get(req.request_id)
        known = _end(start, bs) if start is not None else -1
        node, have = cache._walk(tokens, touch=False, split=True, ns=ns, limit=end,
                                 start=(start, known) if known >= 0 else None)
        new = num_blocks - have // bs
        if new <= 0:
            self.cursors[req.request_id] = node
            return
        if new > pool.num_free:
            cache.lock(node)  # the path found must stay while room is made
            room = pool.num_free + cache.evictable_blocks >= new
            if room:
                cache.evict(new - pool.num_free)
            cache.unlock(node)
            if not room:
                self.stats.allocation_failures += 1  # vLLM: prepare_store finds no room
                return
        blocks = pool.allocate(new)
        leaf, _ = cache.insert(tokens[:end], [-1] * (have // bs) + blocks,
                               start=(node, have), ns=ns)
        pool.free(blocks)  # the tree holds them now, evictable
        self.cursors[req.request_id] = leaf
        nbytes = new * self.block_bytes
        st = self.stats
        st.stores += 1
        st.store_bytes += nbytes
        st.store_seconds += transfer_seconds(nbytes, self.link, self.lanes)
        st.store_sizes.append(nbytes)
        st.store_chunks.append(new)

    # -- load ------------------------------------------------------------------------------
    def lookup(self, req: Request, device_hit: int) -> PrefixMatch | None:
        """The tier's match for a waiting request when it reaches past its `device_hit`
        tokens (never the whole request: its last token is computed), else None."""
        tokens = req.token_ids
        limit = len(tokens) - 1
        if limit - device_hit < self.block_size:
            return None
        match = self.cache.match_prefix(tokens, req.cache_ns, num_tokens=limit)
        return match if match.num_tokens > device_hit else None

    def start(self, req: Request, match: PrefixMatch, device_hit: int, now: float) -> Load:
        """Begin loading the tokens of `match` past `device_hit`, after the loads before it
        on the link; the tier keeps those blocks until it lands (`finish`)."""
        n = match.num_tokens - device_hit
        self.cache.lock(match.node)
        nbytes = n // self.block_size * self.block_bytes
        seconds = transfer_seconds(nbytes, self.link, self.lanes)
        start = max(now, self.free_at)
        self.free_at = start + seconds
        load = Load(req, n, self.free_at, match.node)
        self.loads[req.request_id] = load
        st = self.stats
        st.loads += 1
        st.load_bytes += nbytes
        st.load_seconds += seconds
        st.load_sizes.append(nbytes)
        return load

    def landed(self, now: float) -> list[Load]:
        """The loads that ended by `now`, in the order they started (the scheduler orders
        every loader's by their end); the tier lets go of them."""
        done = [ld for ld in self.loads.values() if ld.ready_at <= now]
        for ld in done:
            self.finish(ld.req.request_id)
        return done

    def finish(self, request_id: str) -> Load | None:
        """Forget a load (it landed, or its request ended): unlock its blocks in the tier."""
        load = self.loads.pop(request_id, None)
        if load is not None:
            self.cache.touch_unlock(load.node)
        return load

    def next_ready(self) -> float | None:
        return min((ld.ready_at for ld in self.loads.values()), default=None)

    def reset(self) -> bool:
        """Empty the tier (vLLM's reset_prefix_cache with reset_external): refused while a
        load holds blocks. Each block is reported removed."""
        if self.loads:
            return False
        self.cache.evict(self.cache.cached_blocks)
        return True

    def forget(self, request_id: str) -> None:
        """The request let go of its device blocks: its store cursor goes too."""
        self.cursors.pop(request_id, None)

    def check_integrity(self) -> None:
        """The tier's tree and pool: every host block is the tree's alone or free, and only
        loads in flight lock it."""
        self.pool.check_integrity()
        self.cache.check_integrity()
        if self.pool.num_used != self.cache.cached_blocks:
            raise AssertionError(f"host tier: {self.pool.num_used} blocks used, "
                                 f"{self.cache.cached_blocks} in the tree")
        locked = self.cache.cached_blocks - self.cache.evictable_blocks
        if not self.loads and locked:
            raise AssertionError(f"host tier: {locked} blocks locked with no load in flight")


def host_tier(config: OffloadConfig, placement: Placement, sched: SchedulerConfig) -> HostKvTier:
    """The CPU tier of `config` for this placement: blocks of the scheduler's size holding
    the whole deployment's KV, loaded over each chip's host link at once. ValueError when the
    chip has no host link (unified memory: nothing to offload to) or the prefix cache is off
    (the tier is keyed by it, as vLLM's by block hashes)."""
    link = host_link(placement.chip)
    if link is None:
        raise ValueError(f"--kv-offloading-size: {placement.chip.id} has no host link (its "
                         "memory is the host's): nothing to offload to")
    if config.chunk_tokens not in (None, sched.block_size):
        if config.chunk_tokens % sched.block_size:
            raise ValueError(f"'block_size'={config.chunk_tokens} in kv_connector_extra_config "
                             "must be a multiple of the GPU KV cache block size "
                             f"({sched.block_size} tokens).")
        raise ValueError("kv_connector_extra_config: a block_size of several device blocks is "
                         "not emulated (a chunk is one device block)")
    if not sched.kv_cache:
        raise ValueError(f"--kv-offloading-size: {placement.model.name} keeps no KV cache (an "
                         "encoder): nothing to offload")
    if not sched.enable_prefix_caching:
        raise ValueError("--kv-offloading-size needs the prefix cache on (its blocks are "
                         "found by their prefix, as vLLM's by block hashes)")
    block_bytes = placement.kv_bytes_per_token * sched.block_size
    return HostKvTier(config, num_host_blocks(config.cpu_bytes, block_bytes), sched.block_size,
                      block_bytes, link, placement.chips)


def _end(node: Any, bs: int) -> int:
    """The token position `node` ends at, or -1 when eviction took it out of the tree (a
    root, which has no parent, ends at 0)."""
    if node.parent is None:
        return 0 if not node.key else -1
    n = 0
    while node.parent is not None:
        n += len(node.block_ids)
        node = node.parent
    return n * bs
