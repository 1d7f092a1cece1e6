"""vLLM 0.34.0's fault tolerance, unit by unit (server/engine_proc/sentinel.py): the sentinel's
instructions and vLLM's reasons for refusing them (scale_down's checks of the ranks it
removes, cumulative over rounds), and what `serve` refuses before starting: a fleet (it is a
pod's), more than one API server, several local ranks, a config vLLM would not take."""

from __future__ import annotations

import dataclasses
import json

import pytest

from server.config import load_fleet
from server.engine.options import EngineOptions
from server.engine_proc.sentinel import Sentinel, fault_tolerance_problem


def faulted(rank: int = 1, size: int = 4) -> Sentinel:
    s = Sentinel(rank, size, timeout_s=120)
    s.on_fault(10.0)
    return s


def test_a_fault_pushes_diagnosing_then_unhealthy_and_sets_the_deadline():
    s = faulted()
    assert (s.status, s.fault_info, s.pushes) == ("unhealthy", "RuntimeError", 2)
    assert not s.expired(129.9) and s.expired(130.0)
    assert s.handle("retry", "{}") is None
    assert (s.status, s.pushes, s.deadline) == ("healthy", 3, None)
    assert not s.expired(1e9)  # recovered: no deadline left


@pytest.mark.parametrize("params, says", [
    ({}, "'removed_dp_ranks'"),
    ({"removed_dp_ranks": []}, "Invalid removed_dp_ranks []"),
    ({"removed_dp_ranks": [1]}, "Invalid removed_dp_ranks [1] for engine 1"),  # itself
    ({"removed_dp_ranks": [4]}, "Invalid removed_dp_ranks [4]"),  # out of range
    ({"removed_dp_ranks": [0, 2, 3]}, None),  # (leaves rank 1 only: allowed)
    ({"removed_dp_ranks": [0]}, "dp_store_port and dp_master_ip required when the store "
                                "master (rank 0) is removed"),
])
def test_scale_down_checks_the_ranks_as_vllm(params, says):
    s = faulted()
    if says is None:
        params = {**params, "dp_store_port": 29500, "dp_master_ip": "10.0.0.2"}
    reason = s.handle("scale_down", json.dumps(params))
    if says is None:
        assert reason is None and s.dead_dp_ranks == {0, 2, 3} and s.status == "healthy"
    else:
        assert reason is not None and reason.startswith(says)
        assert s.status == "unhealthy" and not s.dead_dp_ranks  # nothing committed


def test_the_dead_set_accumulates_and_a_rank_is_not_removed_twice():
    s = faulted()
    assert s.handle("scale_down", json.dumps({"removed_dp_ranks": [3]})) is None
    s.on_fault(50.0)
    assert s.handle("scale_down", json.dumps({"removed_dp_ranks": [3]})).startswith(
        "Invalid removed_dp_ranks [3] for engine 1 (dp_rank=1, dead_dp_ranks=[3])")
    assert s.handle("scale_down", json.dumps({"removed_dp_ranks": [2]})) is None
    assert s.dead_dp_ranks == {2, 3}


def test_instructions_are_refused_unless_unhealthy_or_unknown():
    s = Sentinel(0, 1, 120)
    assert s.handle("retry", "{}") == "[FT] Rejecting retry on engine 0: status is HEALTHY"
    s.on_fault(0.0)
    assert s.handle("reboot", "{}") == "[FT] Rejecting unknown instruction 'reboot' on engine 0"
    assert s.handle("scale_down", "{}") == ("scale_down requires data_parallel_size > 1; a "
                                            "dp=1 engine has no ranks to remove")


def test_serve_refuses_what_vllm_would_not_start():
    fleet = load_fleet(None)
    first = dataclasses.replace(fleet.deployments[0], enable_fault_tolerance=True)
    pod = dataclasses.replace(fleet, deployments=(first,),
                              server=dataclasses.replace(fleet.server, pod=True))
    assert fault_tolerance_problem(pod) == ""
    whole = dataclasses.replace(fleet, deployments=(first, *fleet.deployments[1:]))
    assert "needs pod mode" in fault_tolerance_problem(whole)
    sglang = dataclasses.replace(pod, server=dataclasses.replace(pod.server, http_api="sglang"))
    assert "not on an --http-api sglang pod" in fault_tolerance_problem(sglang)
    two = dataclasses.replace(pod, server=dataclasses.replace(pod.server, api_server_count=2))
    assert fault_tolerance_problem(two).startswith(
        "Fault tolerance requires a single API server process (--api-server-count=1), but got 2")
    bad = dataclasses.replace(first, fault_tolerance_config='{"timeout": 3}')
    assert "engine_recovery_timeout_sec" in fault_tolerance_problem(
        dataclasses.replace(pod, deployments=(bad,)))
    base = dict(name="x", model="llama-3.1-8b", quant="bf16", chip="h100-sxm", engine="vllm")
    assert EngineOptions(**base, fault_tolerance_config="{}").recovery_timeout_s() == 120.0
    assert EngineOptions(**base).recovery_timeout_s() is None
    with pytest.raises(ValueError, match="Internal LB mode is not supported"):
        EngineOptions(**base, enable_fault_tolerance=True,
                      data_parallel_size=2).check_vllm_config()
