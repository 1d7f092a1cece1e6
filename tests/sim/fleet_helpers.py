"""Shared by the fleet tests (issue 16): deployments, workloads and a run."""

from __future__ import annotations

import dataclasses

from clients.report import summarize
from clients.workloads import WorkloadSpec, build_workload
from server.engine.options import EngineOptions
from server.engine.tokenizer import get_tokenizer
from sim.cluster import build_replicas, run_replicas

H100 = EngineOptions(name="gpu", model="llama-3.1-8b", quant="bf16", chip="h100-sxm",
                     engine="vllm", max_model_len=8192)
SRAM = EngineOptions(name="sram", model="llama-3.1-8b", quant="bf16", chip="cerebras-cs3",
                     engine="cerebras", max_model_len=8192)


def pool(base: EngineOptions, name: str, **kw) -> EngineOptions:
    return dataclasses.replace(base, name=name, **kw)


def sessions(**spec):
    tok = get_tokenizer()
    spec = {"seed": 1, **spec}
    return build_workload(WorkloadSpec(vocab_size=tok.vocab_size, **spec), encode=tok.encode)


def run(deployments, router, work, **kw):
    cr = run_replicas(build_replicas(deployments), work, router, **kw)
    results = cr.run.records
    return cr, results, summarize(results)


def assert_all_released(cr) -> None:
    """Every replica idle, its invariants hold, no KV held for a remote decode, and only
    the prefix cache keeps blocks."""
    for r in cr.replicas:
        sched = r.core.scheduler
        sched.check_integrity()
        assert not r.core.has_unfinished()
        assert not sched.held
        assert sched.pool.num_used == sched.cache.evictable_blocks
