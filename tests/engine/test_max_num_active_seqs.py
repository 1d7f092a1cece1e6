"""vLLM's `--max-num-active-seqs`: at most that many requests run at once, while
`--max-num-seqs` still sizes the runner's memory (its sampler warm-up over max_num_seqs
requests), so decode batches stay small without changing the KV pool; more than
`max_num_seqs` is vLLM's error."""

from __future__ import annotations

import pytest
from engine_drive import request

from server.engine.build import build_core
from server.engine.options import EngineOptions

BASE = dict(name="a", model="llama-3.1-8b", quant="bf16", chip="h100-sxm", engine="vllm",
            max_model_len=4096)


def test_the_admission_cap_is_active_seqs_and_memory_is_still_sized_by_max_num_seqs():
    capped = build_core(EngineOptions(**BASE, max_num_seqs=1024, max_num_active_seqs=2))
    small = build_core(EngineOptions(**BASE, max_num_seqs=2))
    assert capped.scheduler.config.max_num_seqs == 2
    assert capped.placement.spec.max_batch == 1024
    assert capped.placement.kv_tokens < small.placement.kv_tokens  # the warm-up of 1024


def test_no_more_than_active_seqs_requests_run_at_once():
    core = build_core(EngineOptions(**BASE, max_num_seqs=1024, max_num_active_seqs=2))
    for i in range(5):
        core.add_request(request(f"r{i}", list(range(10 + i, 60 + i)), 4, ignore_eos=True))
    most = 0
    while core.has_unfinished():
        core.step()
        core.scheduler.check_integrity()
        most = max(most, len(core.scheduler.running))
    assert most == 2


def test_more_active_than_max_num_seqs_is_vllms_error():
    with pytest.raises(ValueError, match=r"max_num_active_seqs \(9\) cannot be greater than "
                                         r"max_num_seqs \(8\)\."):
        build_core(EngineOptions(**BASE, max_num_seqs=8, max_num_active_seqs=9))
