"""The fleet file: defaults, strictness, and CLI overrides."""

from __future__ import annotations

import dataclasses

import pytest

from server.config import ConfigError, load_fleet, parse_fleet
from server.server_config import ServerConfig, server_problem


def test_default_fleet_covers_every_system_in_the_design_notes():
    fleet = load_fleet()
    engines = {d.engine for d in fleet.deployments}
    assert engines == {"vllm", "sglang", "tensorrt-llm", "llama.cpp", "mlx", "jetstream",
                       "groq", "cerebras"}
    assert fleet.default_deployment == "vllm-h100"
    assert fleet.server.host == "127.0.0.1" and fleet.server.port == 50051
    assert fleet.server.metrics_port == 8000


def test_overrides_replace_only_given_values():
    fleet = load_fleet().with_server(port=6000, host=None)
    assert fleet.server.port == 6000 and fleet.server.host == "127.0.0.1"


DEP = {"name": "a", "model": "m", "quant": "bf16", "chip": "h100-sxm", "engine": "vllm"}


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"deployments": [{**DEP, "colour": "red"}]}, "unknown key(s) colour"),
        ({"deployments": [{k: v for k, v in DEP.items() if k != "chip"}]}, "missing key(s) chip"),
        ({"deployments": [{**DEP, "count": "8"}]}, "count must be a int"),
        ({"deployments": [{**DEP, "count": True}]}, "count must be a int"),
        ({"deployments": [DEP, DEP]}, "duplicate deployment name(s) a"),
        ({"deployments": []}, "no deployments"),
        ({"server": {"default_deployment": "b"}, "deployments": [DEP]}, "is not one of"),
        ({"server": {"event_loop": "trio"}, "deployments": [DEP]}, "event_loop must be"),
        ({"fleet": {}, "deployments": [DEP]}, "unknown section(s) fleet"),
        ({"deployments": [{**DEP, "kv_cache_metrics_sample": 0}]},
         "kv_cache_metrics_sample must be in (0, 1], got 0"),
        ({"deployments": [{**DEP, "gpu_memory_utilization": 1.2}]},
         "gpu_memory_utilization must be in (0, 1], got 1.2"),
        ({"deployments": [{**DEP, "enforce_eager": "yes"}]}, "enforce_eager must be a bool"),
        ({"deployments": [{**DEP, "data_parallel_size": 4, "data_parallel_start_rank": 3,
                           "data_parallel_size_local": 2}]},
         "name ranks outside 0..3 (data_parallel_size 4)"),
        ({"deployments": [{**DEP, "data_parallel_start_rank": -1}]},
         "data_parallel_start_rank must be >= 0, got -1"),
        # vLLM 0.34.0's scheduler keys (Field(ge=1), Field(ge=0), Field(ge=0, le=1))
        ({"deployments": [{**DEP, "max_num_inflight_kv_loads": 0}]},
         "max_num_inflight_kv_loads must be >= 1, got 0"),
        ({"deployments": [{**DEP, "cache_aware_admission_window": -1}]},
         "cache_aware_admission_window must be >= 0, got -1"),
        ({"deployments": [{**DEP, "cache_aware_admission_threshold": 1.5}]},
         "cache_aware_admission_threshold must be in [0, 1], got 1.5"),
        ({"deployments": [{**DEP, "checkpoint_prepare_on_startup": True}]},  # vLLM 0.34.0's
         "checkpoint_prepare_on_startup requires enable_sleep_mode"),
    ],
)
def test_bad_fleet_files_name_the_problem(doc, message):
    with pytest.raises(ConfigError) as err:
        parse_fleet(doc, "f.toml")
    assert message in str(err.value) and "f.toml" in str(err.value)


def test_int_is_accepted_for_float():
    fleet = parse_fleet({"server": {"time_scale": 1}, "deployments": [DEP]})
    assert fleet.server.time_scale == 1.0 and isinstance(fleet.server.time_scale, float)


def test_unreadable_and_invalid_files(tmp_path):
    with pytest.raises(ConfigError, match="cannot read fleet file"):
        load_fleet(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[server\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_fleet(bad)


def test_custom_histogram_buckets_as_a_table_or_the_flags_json():
    """[server] custom_histogram_buckets: a TOML table reads as vLLM's flag JSON would."""
    import json

    table = {"time_to_first_token": [0.1, 1.0]}
    as_table = parse_fleet({"server": {"custom_histogram_buckets": table}, "deployments": [DEP]})
    as_json = parse_fleet({"server": {"custom_histogram_buckets": json.dumps(table)},
                           "deployments": [DEP]})
    assert json.loads(as_table.server.custom_histogram_buckets) == table
    assert as_table.server == as_json.server


def test_vllms_memory_share_and_eager_mode_are_deployment_keys():
    """`gpu_memory_utilization` and `enforce_eager` reach the device layer's spec."""
    (opts,) = parse_fleet({"deployments": [{**DEP, "gpu_memory_utilization": 0.6,
                                            "enforce_eager": True}]}).deployments
    spec = opts.spec()
    assert (spec.gpu_mem_utilisation, spec.enforce_eager) == (0.6, True)
    (plain,) = parse_fleet({"deployments": [DEP]}).deployments
    assert (plain.spec().gpu_mem_utilisation, plain.spec().enforce_eager) == (None, False)
    (sized,) = parse_fleet({"deployments": [{**DEP, "kv_cache_memory_bytes": 10**9}]}).deployments
    assert sized.spec().kv_cache_memory_bytes == 10**9
    with pytest.raises(ConfigError, match="kv_cache_memory_bytes must be >= 1"):
        parse_fleet({"deployments": [{**DEP, "kv_cache_memory_bytes": 0}]})
    (off,) = parse_fleet({"deployments": [{**DEP, "cpu_offload_gb": 1.5}]}).deployments
    assert off.spec().cpu_offload_bytes == 3 * 2**29  # GiB, as vLLM
    with pytest.raises(ConfigError, match="cpu_offload_gb must be >= 0"):
        parse_fleet({"deployments": [{**DEP, "cpu_offload_gb": -1}]})


def test_grpc_api_trtllm_needs_a_vllm_api_pod():
    """`grpc_api` picks the engine service on the gRPC port (docs/TRTLLM.md): TensorRT-LLM's
    on a vLLM-API pod only; by default it follows `http_api`."""
    assert server_problem(ServerConfig(grpc_api="trtllm", pod=True)) == ""
    assert ServerConfig(grpc_api="trtllm", pod=True).engine_api == "trtllm"
    assert ServerConfig(http_api="sglang", pod=True).engine_api == "sglang"
    assert ServerConfig().engine_api == "vllm"
    assert "TrtllmService" in server_problem(ServerConfig(grpc_api="trtllm"))  # not a pod
    assert "TrtllmService" in server_problem(ServerConfig(grpc_api="trtllm", pod=True,
                                                          http_api="sglang"))
    assert "grpc_api 'sglang' with http_api 'vllm'" in server_problem(
        ServerConfig(grpc_api="sglang", pod=True))
    assert "grpc_api must be one of vllm, sglang, trtllm, mlx" in server_problem(
        dataclasses.replace(ServerConfig(), grpc_api="tokenspeed"))


def test_grpc_api_mlx_needs_a_vllm_api_pod():
    """`grpc_api = "mlx"` serves MLX's MlxEngine in VllmEngine's place (docs/MLX.md), as
    "trtllm" does TrtllmService: on a vLLM-API pod in pod mode only."""
    assert server_problem(ServerConfig(grpc_api="mlx", pod=True)) == ""
    assert ServerConfig(grpc_api="mlx", pod=True).engine_api == "mlx"
    assert "MlxEngine" in server_problem(ServerConfig(grpc_api="mlx"))  # not a pod
    for http_api in ("sglang", "trtllm"):
        assert f"grpc_api 'mlx' with http_api {http_api!r}" in server_problem(
            ServerConfig(grpc_api="mlx", pod=True, http_api=http_api))


def test_serve_takes_grpc_api_mlx():
    """`doppelchip serve --grpc-api mlx` (docs/MLX.md) is a choice of the serve command."""
    from doppelchip.cli import build_parser

    args = build_parser("serve").parse_args(["serve", "--deployment", "mlx-m4max",
                                             "--grpc-api", "mlx"])
    assert (args.grpc_api, args.deployment) == ("mlx", "mlx-m4max")


def test_http_api_trtllm_is_a_pod_whose_grpc_port_serves_trtllm():
    """`http_api = "trtllm"` (trtllm-serve's HTTP server, docs/TRTLLM.md) serves one model, and
    its gRPC port follows it: TrtllmService; no other engine service goes with it."""
    pod = ServerConfig(http_api="trtllm", pod=True)
    assert server_problem(pod) == "" and pod.engine_api == "trtllm"
    assert server_problem(ServerConfig(http_api="trtllm", grpc_api="trtllm", pod=True)) == ""
    assert "'trtllm' serves one deployment, as a trtllm-serve server" in server_problem(
        ServerConfig(http_api="trtllm"))
    assert "grpc_api 'vllm' with http_api 'trtllm'" in server_problem(
        ServerConfig(http_api="trtllm", grpc_api="vllm", pod=True))
