"""`--kv-events-config`: vLLM's keys and defaults, clear errors, loopback only (unless the
server binds off loopback), vLLM's bind/connect rule, and the per-deployment / per-rank port
offsets of a fleet."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from server.config import ConfigError, parse_fleet
from server.engine.kv_events_config import (
    Endpoint,
    KVEventsConfig,
    endpoint_problem,
    resolve,
    with_port_offsets,
)

ON = {"enable_kv_cache_events": True}


def dep(name: str, cfg: dict | None, dp: int = 1) -> dict:
    d = {"name": name, "model": "llama-3.1-8b", "quant": "bf16", "chip": "h100-sxm",
         "engine": "vllm", "data_parallel_size": dp}
    if cfg is not None:
        d["kv_events_config"] = json.dumps(cfg)
    return d


def test_vllm_defaults() -> None:
    cfg = KVEventsConfig.parse(json.dumps(ON))
    assert cfg.enabled and cfg.publisher == "zmq" and cfg.endpoint == "tcp://*:5557"
    assert (cfg.buffer_steps, cfg.hwm, cfg.replay_endpoint, cfg.topic) == (10000, 100000, None, "")
    assert not KVEventsConfig.parse(None).enabled
    assert not KVEventsConfig.parse('{"enable_kv_cache_events": true, "publisher": "null"}'
                                    ).enabled


@pytest.mark.parametrize(("text", "words"), [
    ("{", "not valid JSON"),
    ('{"enable_kv_cache_events": true, "bogus": 1}', "unknown key(s) bogus"),
    ('{"enable_kv_cache_events": true, "publisher": "kafka"}', "publisher must be"),
    ('{"enable_kv_cache_events": true, "buffer_steps": 0}', "buffer_steps"),
    ('{"enable_kv_cache_events": true, "endpoint": "udp://x"}', "must be tcp://"),
])
def test_bad_configs_say_what_is_wrong(text: str, words: str) -> None:
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        KVEventsConfig.parse(text)
    doc = {"deployments": [{**dep("a", None), "kv_events_config": text}]}
    with pytest.raises(ConfigError, match="deployments\\[0\\]"):
        parse_fleet(doc)


def test_bind_or_connect_as_vllm_on_loopback() -> None:
    assert resolve("tcp://*:5557", 0).url == "tcp://127.0.0.1:5557"
    assert resolve("tcp://*:5557", 0).bind
    assert not resolve("tcp://127.0.0.1:6000", 0).bind  # vLLM connects to a bound subscriber
    assert resolve("tcp://*:5557", 2).url == "tcp://127.0.0.1:5559"
    assert resolve("tcp://*:0", 3).url == "tcp://127.0.0.1:0"  # the OS picks; no offset
    assert resolve("ipc:///tmp/kv", 1).url == "ipc:///tmp/kv_dp1"
    assert resolve("tcp://127.0.0.1:5558", 0, replay=True).bind


def test_off_loopback_only_on_a_server_that_binds_off_loopback() -> None:
    """A server on loopback (the default) publishes on loopback only; one bound to every
    interface (--host 0.0.0.0, a container) uses the endpoints as vLLM does: `*` binds every
    interface and a subscriber in another pod (llm-d's indexer) is connected to."""
    remote = {**ON, "endpoint": "tcp://epp.llm-d.svc:5557", "replay_endpoint": "tcp://*:5558"}
    with pytest.raises(ConfigError, match=r"deployments\[0\]: .*loopback only"):
        parse_fleet({"deployments": [dep("a", remote)]})
    fleet = parse_fleet({"server": {"host": "0.0.0.0"}, "deployments": [dep("a", remote)]})
    assert fleet.deployments[0].kv_events_config == json.dumps(remote)
    assert resolve("tcp://epp.llm-d.svc:5557", 1, exposed=True) \
        == Endpoint("tcp://epp.llm-d.svc:5558", False)
    assert resolve("tcp://*:5557", 0, exposed=True) == Endpoint("tcp://*:5557", True)
    assert resolve("tcp://*:5557", 0) == Endpoint("tcp://127.0.0.1:5557", True)
    assert endpoint_problem(json.dumps(remote), "localhost")
    assert endpoint_problem(json.dumps(remote), "0.0.0.0") == ""
    with pytest.raises(ValueError, match="loopback only"):
        resolve("tcp://10.0.0.5:5557", 0)


def test_serve_checks_the_endpoints_against_the_host_it_binds(tmp_path) -> None:
    """`--host` can move a fleet file's server back onto loopback: `serve` checks again and
    stops before anything starts (a child process: a missed check would serve, not hang
    the suite)."""
    path = tmp_path / "fleet.toml"
    remote = dep("a", {**ON, "endpoint": "tcp://10.1.2.3:5557"})
    path.write_text('[server]\nhost = "0.0.0.0"\n\n[[deployments]]\n'
                    + "".join(f"{k} = {json.dumps(v)}\n" for k, v in remote.items()))
    try:
        done = subprocess.run([sys.executable, "-m", "doppelchip.cli", "serve", "--config",
                               str(path), "--host", "127.0.0.1", "--port", "0", "--http-port",
                               "0"], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("serve started with a KV-events endpoint off loopback")
    assert done.returncode == 2 and "loopback only" in done.stderr, done.stderr


def test_fleet_deployments_sharing_an_endpoint_get_consecutive_ports() -> None:
    fleet = parse_fleet({"deployments": [dep("a", ON, dp=2), dep("b", None), dep("c", ON),
                                         dep("d", {**ON, "endpoint": "tcp://*:7000"})]})
    offsets = {d.name: d.kv_events_port_offset for d in with_port_offsets(fleet.deployments)}
    assert offsets == {"a": 0, "b": 0, "c": 2, "d": 0}  # a: 5557-5558, c: 5559, d: 7000
    with pytest.raises(ConfigError, match="set by the server"):
        parse_fleet({"deployments": [{**dep("a", ON), "kv_events_port_offset": 3}]})
    with pytest.raises(ConfigError, match="prefix_caching_hash_algo"):
        parse_fleet({"deployments": [{**dep("a", ON), "prefix_caching_hash_algo": "md5"}]})


def test_xxhash_without_its_package_is_refused_with_vllms_words(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "xxhash", None)  # `import xxhash` raises ImportError
    with pytest.raises(ConfigError, match=r"Install it via `pip install xxhash`"):
        parse_fleet({"deployments": [{**dep("a", ON), "prefix_caching_hash_algo": "xxhash"}]})


@pytest.mark.parametrize(("host", "exposed"), [("127.0.0.1", False), ("localhost", False),
                                               ("0.0.0.0", True)])
def test_an_engine_is_told_whether_its_server_is_exposed(host: str, exposed: bool) -> None:
    """The supervisor passes the server's exposure to each engine (EngineSpec.exposed), whose
    publisher resolves its endpoints with it."""
    from server.supervisor import ServeOptions, Supervisor
    from server.supervisor_engines import EngineSlot

    fleet = parse_fleet({"server": {"host": host}, "deployments": [dep("a", ON)]})
    sup = Supervisor(fleet, ServeOptions())
    try:
        spec = sup._engine_spec(EngineSlot(0, 0, fleet.deployments[0]), cold=False)
    finally:
        sup.run_dir.remove()
    assert spec.exposed is exposed


def test_a_trtllm_pod_needs_the_replay_socket_its_http_route_reads() -> None:
    """POST /kv_cache_events (server/http/trtllm/kv_cache_events.py) reads the publisher's
    replay socket; a TensorRT-LLM pod publishing without one is refused, with what to give."""
    server = {"pod": True, "http_api": "trtllm"}
    trt = {**dep("a", ON), "engine": "tensorrt-llm"}
    with pytest.raises(ConfigError, match=r"give a replay_endpoint \(e.g. \"tcp://\*:0\"\)"):
        parse_fleet({"server": server, "deployments": [trt]})
    parse_fleet({"server": server, "deployments": [
        {**trt, "kv_events_config": json.dumps({**ON, "replay_endpoint": "tcp://*:0"})}]})
    parse_fleet({"deployments": [trt]})  # a vLLM-API pod reads no replay socket
