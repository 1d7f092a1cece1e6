"""`vllm serve --data-parallel-multi-port-external-lb` (doppelchip/vllm_multiport.py): vLLM
0.34.0's DP supervisor. Each local rank is its own pod on `--port + i`; the supervisor's
`/health`, `/ready` and `/readyz` answer once every rank does; a rank that dies takes the
others down; SIGTERM is forwarded; what vLLM refuses is refused in its words."""

from __future__ import annotations

import json
import re
import signal

import httpx
import psutil
import pytest
from multiport_pod import MOE, MultiPortPod

from doppelchip.cli import build_parser
from doppelchip.cmd_vllm import cmd_vllm_serve, translate
from doppelchip.vllm_argv import vllm_argv
from doppelchip.vllm_multiport import rank_args

DENSE = "meta-llama/Llama-3.1-8B-Instruct"
PARSER = build_parser("vllm")


def parse(*argv: str, repo: str = MOE):
    return PARSER.parse_args(vllm_argv(["vllm", "serve", repo, *argv], set()))


@pytest.mark.parametrize("argv, says", [
    (["-dp", "4", "-dpl", "2", "--grpc"], "does not support --grpc"),
    (["-dp", "4", "-dpl", "2", "--grpc-port", "50061"], "its frontends would share the same "
                                                        "gRPC port"),
    (["-dp", "4", "-dpl", "2", "--ssl-keyfile", "k.pem"], "must be provided together"),
    (["-dp", "4", "-dpl", "2", "--api-server-count", "2"], "requires --api-server-count=1"),
    (["-dp", "4", "-dpl", "2", "--data-parallel-rank", "1"], "manages child "
                                                             "--data-parallel-rank values"),
    (["-dp", "4", "-dpl", "2", "-dpe"], "cannot be combined with --data-parallel-external-lb"),
    (["-dp", "4", "-dpl", "2", "-dph"], "cannot be combined with --data-parallel-external-lb"),
    (["-dpl", "2"], "requires --data-parallel-size > 1"),
    (["-dp", "4"], "requires --data-parallel-size-local >= 2"),
    (["-dp", "4", "-dpl", "1"], "requires --data-parallel-size-local >= 2"),
    (["-dp", "2", "-dpl", "4"], "--data-parallel-size-local cannot exceed"),
    (["-dp", "6", "-dpl", "4"], "must be divisible by --data-parallel-size-local"),
    (["-dp", "4", "-dpl", "2", "-dpr", "3"], "would exceed --data-parallel-size"),
    (["-dp", "8", "-dpl", "4", "--node-rank", "2"], "would exceed --data-parallel-size"),
    (["-dp", "4", "-dpl", "2", "--port", "9255"], "--data-parallel-supervisor-port 9256 "
                                                  "overlaps with child rank ports 9255-9256"),
])
def test_what_vllm_refuses_is_refused_before_anything_starts(argv, says, capsys):
    assert cmd_vllm_serve(parse("-dpm", *argv)) == 2
    assert re.search(re.escape(says), capsys.readouterr().err)


def test_a_dense_model_is_refused_as_each_rank_would_refuse_it(capsys):
    assert cmd_vllm_serve(parse("-dpm", "-dp", "2", "-dpl", "2", repo=DENSE)) == 2
    assert "Non-MoE models do not support external data parallel mode" in capsys.readouterr().err


@pytest.mark.parametrize("argv, first", [
    (["-dp", "8", "-dpl", "4"], 0),
    (["-dp", "8", "-dpl", "4", "--node-rank", "1"], 4),  # node rank x local ranks
    (["-dp", "8", "-dpl", "4", "-dpr", "2"], 2),  # the start rank wins
])
def test_each_local_rank_is_an_external_rank_on_its_own_port(argv, first):
    ranks = rank_args(parse("-dpm", "--port", "8100", *argv))
    assert [(r.data_parallel_rank, r.port) for r in ranks] == [
        (first + i, 8100 + i) for i in range(4)]
    out, warnings = translate(ranks[2])
    assert out[out.index("--http-port") + 1] == "8102"
    assert out[out.index("--data-parallel-start-rank") + 1] == str(first + 2)
    assert out[out.index("--data-parallel-size-local") + 1] == "1"
    assert out[out.index("--port") + 1] == "0"  # gRPC: a free port per rank
    assert not any("multi-port" in w for w in warnings)  # emulated: not "accepted but not"


def test_the_supervisors_flags_have_vllms_types_and_defaults():
    args = parse("-dpm", "-dp", "2", "-dpl", "2")
    assert (args.data_parallel_supervisor_port, args.dp_supervisor_probe_interval_s,
            args.dp_supervisor_probe_timeout_s, args.dp_supervisor_probe_failure_threshold) \
        == (9256, 5.0, 5.0, 3)
    args = parse("-dpm", "--dp-supervisor-probe-interval-s", "0.5",
                 "--dp-supervisor-probe-failure-threshold", "7")
    assert (args.dp_supervisor_probe_interval_s, args.dp_supervisor_probe_failure_threshold) \
        == (0.5, 7)
    with pytest.raises(SystemExit):  # argparse's error, as vLLM's int option gives it
        parse("-dpm", "--data-parallel-supervisor-port", "x")


def _family(rank_port: int) -> psutil.Process | None:
    """The rank pod's process listening on `rank_port` (None when none does)."""
    for c in psutil.net_connections("tcp"):
        if c.status == "LISTEN" and c.laddr.port == rank_port and c.pid:
            return psutil.Process(c.pid)
    return None


@pytest.fixture
def pod(tmp_path):
    """The pod, publishing KV events on an ipc:// endpoint (each rank on its own: vLLM's)."""
    endpoint = f"ipc://{tmp_path}/kv"
    p = MultiPortPod("--kv-events-config", json.dumps(
        {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": endpoint}))
    p.endpoint = endpoint
    yield p
    p.stop()


def _engine_label(text: str) -> set[str]:
    return set(re.findall(r'^vllm:cache_config_info\{[^}]*engine="(\d+)"', text, re.M))


def test_each_rank_serves_on_its_port_and_sigterm_stops_them_all(pod):
    pod.wait_ready()
    text = "".join(pod.lines)
    # its own port opens only after both ranks listen (a probe never sees it while they start)
    assert text.count("doppelchip: listening on") == 2
    assert text.rindex("doppelchip: listening on") < text.index("Started DPSupervisor on")
    base = f"http://127.0.0.1:{pod.supervisor}"
    for path in ("/health", "/ready", "/readyz"):
        assert httpx.get(base + path).status_code == 200
    assert len(pod.ranks()) == 2
    tree = psutil.Process(pod.proc.pid).children(recursive=True)  # ranks, engines, front ends
    for rank in (0, 1):  # each port is its own rank, with that rank's prefix cache and metrics
        url = f"http://127.0.0.1:{pod.port + rank}"
        r = httpx.post(url + "/v1/completions", timeout=60,
                       json={"model": MOE, "prompt": "hi", "max_tokens": 2, "ignore_eos": True})
        assert r.status_code == 200, r.text
        assert _engine_label(httpx.get(url + "/metrics").text) == {str(rank)}
        sources = httpx.get(url + "/kv_event_sources").json()  # offset by the global rank
        assert list(sources) == [str(rank)]
        assert sources[str(rank)]["endpoint"] == pod.endpoint + ("_dp1" if rank else "")
    pod.proc.send_signal(signal.SIGTERM)
    assert pod.proc.wait(timeout=60) == 0
    text = "".join(pod.lines)
    assert "DPSupervisor forwarding SIGTERM to DP Servers." in text
    assert "force killing" not in text
    _, alive = psutil.wait_procs(tree, timeout=30)
    assert not alive


def test_a_rank_that_dies_takes_the_pod_down_with_status_1(pod):
    pod.wait_ready()
    victim = _family(pod.port + 1)  # the rank-1 pod's HTTP front end ...
    assert victim is not None
    top = next(p for p in pod.ranks() if victim.pid in
               {p.pid, *(c.pid for c in p.children(recursive=True))})
    tree = psutil.Process(pod.proc.pid).children(recursive=True)
    top.kill()  # ... and the rank process it belongs to, killed outright
    assert pod.proc.wait(timeout=60) == 1
    text = "".join(pod.lines)
    assert "DPSupervisor found 1 exited DP Servers." in text
    assert "DPSupervisor forwarding SIGTERM to DP Servers." in text
    _, alive = psutil.wait_procs(tree, timeout=30)  # the other rank was stopped, and the
    assert not alive  # killed one's engine and front end followed it (their lifeline)
    assert _family(pod.port) is None
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{pod.supervisor}/health")


def test_ranks_whose_supervisor_was_killed_stop_themselves(pod):
    pod.wait_ready()
    tree = psutil.Process(pod.proc.pid).children(recursive=True)
    assert len(pod.ranks()) == 2
    pod.proc.kill()  # no signal forwarded: each rank sees its parent gone
    pod.proc.wait()
    _, alive = psutil.wait_procs(tree, timeout=60)
    assert not alive
    assert _family(pod.port) is None and _family(pod.port + 1) is None
