"""What ListDeployments says about an AsyncEngine (a snapshot; reads only)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from server.engine.interface import Capacity, DeploymentStatus

if TYPE_CHECKING:
    from server.engine.async_engine import AsyncEngine


def deployment_status(engine: AsyncEngine) -> DeploymentStatus:
    o, core = engine.options, engine.core
    if core is None:  # could not be placed: describe what was asked for
        return DeploymentStatus(
            name=o.name, model=o.model, quant=o.quant, engine=o.engine, chip=o.chip,
            chip_count=o.count or 0, tensor_parallel=o.tp or 0, pipeline_parallel=o.pp or 0,
            state=engine.state, state_message=engine.state_message,
            capacity=Capacity(0, 0, o.block_size, 0, 0, 0, o.max_waiting),
            num_running=0, num_waiting=0,
        )
    p, sched = core.placement, core.scheduler
    cfg = sched.config
    free = sched.pool.num_free + sched.cache.evictable_blocks
    per_request = -(-cfg.max_model_len // cfg.block_size)
    return DeploymentStatus(
        name=o.name, model=o.model, quant=o.quant, engine=o.engine, chip=o.chip,
        chip_count=p.chips, tensor_parallel=p.tp, pipeline_parallel=p.pp,
        state=engine.state, state_message=engine.state_message,
        capacity=Capacity(
            kv_blocks_total=cfg.num_blocks, kv_blocks_free=free, block_size=cfg.block_size,
            max_model_len=cfg.max_model_len, max_num_seqs=cfg.max_num_seqs,
            max_concurrency=min(cfg.max_num_seqs, cfg.num_blocks // per_request),
            max_waiting=o.max_waiting,
        ),
        num_running=sched.num_running,
        num_waiting=engine.num_queued(),
    )
