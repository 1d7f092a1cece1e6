"""`doppelchip trtllm-serve MODEL` without --grpc: trtllm-serve's OpenAI HTTP server, as the pod's
`--http-api trtllm` on trtllm-serve's --port, doppelchip's gRPC port on --grpc-port (default
50051, `doppelchip vllm serve`'s convention). The `--config` YAML's `return_perf_metrics` and
`enable_iter_perf_stats` turn on the pod's `--enable-metrics`; what TensorRT-LLM's gRPC mode
refuses is decided per option here. One test starts a real pod. The --grpc mode:
test_cli_trtllm_serve.py."""

from __future__ import annotations

import argparse
import json
import signal
import urllib.request
from pathlib import Path

import pytest
from server_proc import TrtllmServe
from test_cli_trtllm_serve import REPO, parse, serve_args, warnings

from doppelchip import exit_codes
from doppelchip.cli import main
from doppelchip.cmd_trtllm import translate

HTTP_POD = ["--chip", "h100-sxm", "--engine", "tensorrt-llm", "--http-api", "trtllm",
            "--model", "llama-3.1-8b", "--quant", "bf16", "--served-model-name", REPO]
NOT_EMULATED = "is accepted but not emulated: it changes nothing here"



def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "extra.yaml"
    path.write_text(text)
    return str(path)


def test_without_grpc_the_pod_serves_trtllm_serves_http_server_on_port():
    """trtllm-serve's --port (8000) is the HTTP server's; doppelchip's gRPC port is --grpc-port,
    50051 by default, where `doppelchip vllm serve` puts it."""
    out, said = translate(parse(REPO, "--host", "127.0.0.1", "--port", "9000",
                                "--max_seq_len", "4096"))
    assert out == [*HTTP_POD, "--host", "127.0.0.1", "--port", "50051", "--http-port", "9000",
                   "--max-num-seqs", "2048", "--max-num-batched-tokens", "8192",
                   "--max-model-len", "4096", "--chunked-prefill", "off", "--block-size", "32"]
    assert said == []
    a = serve_args(REPO)  # trtllm-serve's defaults: localhost:8000
    assert (a.host, a.http_port, a.port, a.http_api, a.grpc_api, a.engine, a.enable_metrics) == \
        ("127.0.0.1", 8000, 50051, "trtllm", None, "tensorrt-llm", None)
    a = serve_args(REPO, "--port", "9000", "--grpc-port", "9100")
    assert (a.http_port, a.port) == (9000, 9100)
    a = serve_args(REPO, "--port", "0")  # free ports, both
    assert (a.http_port, a.port) == (0, 0)


@pytest.mark.parametrize("text, metrics, says", [
    ("return_perf_metrics: true\nenable_iter_perf_stats: true\n", True, None),
    ("return_perf_metrics: true\n", True, "return_perf_metrics without enable_iter_perf_stats: "
     "/metrics lists the iteration stats as well (TensorRT-LLM answers [])"),
    ("enable_iter_perf_stats: true\n", True, "enable_iter_perf_stats without "
     "return_perf_metrics: /prometheus/metrics (the trtllm_ series) is mounted as well"),
    ("return_perf_metrics: false\nenable_iter_perf_stats: false\n", None, None),
])
def test_the_yamls_metrics_settings_turn_on_the_pods_metrics(tmp_path, text, metrics, says):
    """TensorRT-LLM's return_perf_metrics mounts /prometheus/metrics, enable_iter_perf_stats
    fills /metrics; the pod's --enable-metrics does both, so one alone is named in a warning.
    Either is an LlmArgs field merged here, not a key 'accepted but not emulated'."""
    path = write(tmp_path, text)
    assert serve_args(REPO, "--max_seq_len", "4096", "--config", path).enable_metrics is metrics
    said = warnings(REPO, "--max_seq_len", "4096", "--config", path)
    assert said == ([] if says is None else [f"--config {path}: {says}; doppelchip serves both "
                                             "together"])


def test_with_grpc_the_metrics_settings_have_no_http_server_to_change(tmp_path):
    path = write(tmp_path, "return_perf_metrics: true\nenable_iter_perf_stats: true\n")
    a = serve_args(REPO, "--grpc", "--max_seq_len", "4096", "--config", path)
    assert (a.enable_metrics, a.http_api, a.grpc_api) == (None, None, "trtllm")
    (said,) = warnings(REPO, "--grpc", "--max_seq_len", "4096", "--config", path)
    assert said == (f"--config {path}: return_perf_metrics, --config {path}: "
                    "enable_iter_perf_stats: no effect with --grpc (TensorRT-LLM's gRPC server "
                    "has no HTTP routes; the pod's HTTP port serves doppelchip's "
                    "vLLM-compatible /metrics)")


def test_grpc_mode_refusals_are_decided_per_option_without_grpc(tmp_path):
    """The router's work in gRPC mode is the HTTP server's: a tool parser changes nothing (tool
    calls are written under the request's tools), chat templates, middleware and a reasoning
    parser are named in a warning; --grpc-protocol only picks the gRPC server."""
    base = (REPO, "--max_seq_len", "4096")
    assert warnings(*base, "--tool_parser", "qwen3", "--grpc-protocol", "openengine") == []
    said = warnings(*base, "--chat_template", "t.jinja", "--allow_request_chat_template",
                    "--middleware", "m.M", "--reasoning_parser", "qwen3")
    assert said == [f"{flag} {NOT_EMULATED}" for flag in (
        "--reasoning_parser", "--chat_template", "--allow_request_chat_template",
        "--middleware")]
    assert warnings(*base, "--grpc", "--reasoning_parser", "qwen3") == []  # the router's
    path = write(tmp_path, "reasoning_parser: qwen3\n")  # the YAML's field alike
    assert warnings(*base, "--config", path) == [
        f"--config {path}: reasoning_parser: accepted but not emulated: it changes nothing here"]
    assert warnings(*base, "--grpc", "--config", path) == []


def test_kv_cache_events_are_published_with_a_replay_socket(tmp_path):
    """The HTTP route reads the publisher's replay socket, so the pod always binds one; no
    warning: POST /kv_cache_events serves the events (tests/http/test_http_trtllm_kv_events.py)."""
    path = write(tmp_path, "kv_cache_config:\n  event_buffer_max_size: 1024\n")
    a = serve_args(REPO, "--max_seq_len", "4096", "--config", path)
    cfg = json.loads(a.kv_events_config)
    assert cfg["enable_kv_cache_events"] is True and cfg["replay_endpoint"]
    assert cfg["buffer_steps"] == 1024  # at least the events TensorRT-LLM's buffer keeps
    assert warnings(REPO, "--max_seq_len", "4096", "--config", path) == []


@pytest.mark.parametrize("argv, says", [
    (["--server_role", "CONTEXT"], "--server_role: TensorRT-LLM's disaggregated serving is "
     "not emulated"),
    (["--metadata_server_config_file", "m.yaml"], "disaggregated serving is not emulated"),
    (["--disagg_cluster_uri", "http://x"], "disaggregated serving is not emulated"),
    (["--enable_visual_gen"], "--enable_visual_gen: TensorRT-LLM's VisualGen server: image "
     "and video generation is not emulated"),
    (["--visual_gen_args", "v.yaml"], "image and video generation is not emulated"),
    (["--http-port", "9001"], "--http-port: without --grpc trtllm-serve's HTTP server is on "
     "--port"),
    (["--port", "50051"], "--port 50051: the gRPC port (--grpc-port, default 50051) is the "
     "same port"),
    (["--grpc-port", "70000"], "--grpc-port 70000: not a TCP port"),
    (["--max_beam_width", "2"], "beam search is not emulated"),
    (["--media_io_kwargs", "{bad"], "Invalid JSON for media_io_kwargs"),
])
def test_what_the_http_server_cannot_serve_is_refused(capsys, monkeypatch, argv, says):
    monkeypatch.setattr("doppelchip.cmd_serve.cmd_serve", lambda a: pytest.fail("served"))
    assert main(["trtllm-serve", REPO, *argv]) == exit_codes.USAGE
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err and "gRPC mode" not in err, err
    assert err.strip().splitlines()[-1].startswith("error: "), err


def test_a_yaml_disagg_cluster_is_refused_without_grpc_too(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("doppelchip.cmd_serve.cmd_serve", lambda a: pytest.fail("served"))
    path = write(tmp_path, "disagg_cluster:\n  cluster_uri: http://x\n")
    assert main(["trtllm-serve", REPO, "--config", path]) == exit_codes.USAGE
    assert capsys.readouterr().err.strip() == (
        f"error: --config {path}: disagg_cluster: disaggregated serving is not emulated")


def test_the_http_pod_starts_serve_and_the_help_says_so(capsys, monkeypatch):
    served: list[argparse.Namespace] = []
    monkeypatch.setattr("doppelchip.cmd_serve.cmd_serve", lambda a: served.append(a) or 0)
    assert main(["trtllm-serve", "serve", REPO, "--port", "9000", "--max_seq_len", "4096",
                 "--middleware", "m.M"]) == exit_codes.OK
    (a,) = served
    assert (a.http_api, a.grpc_api, a.http_port, a.port, a.model_path) == \
        ("trtllm", None, 9000, 50051, REPO)
    err = capsys.readouterr().err
    assert f"doppelchip trtllm-serve: warning: --middleware {NOT_EMULATED}" in err
    assert "doppelchip trtllm-serve: doppelchip serve --chip h100-sxm --engine tensorrt-llm " \
        "--http-api trtllm " in err
    with pytest.raises(SystemExit):
        main(["trtllm-serve", "--help"])
    out = capsys.readouterr().out
    assert "Without --grpc: trtllm-serve's OpenAI HTTP server on --port" in " ".join(out.split())
    assert "--grpc-port PORT" in out


def get(url: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.status, r.read()


def test_a_trtllm_serve_pod_without_grpc_answers_as_trtllm_serves_http_server(tmp_path):
    """What llm-d starts: trtllm-serve's OpenAI server on --port (0: a free one, as is the gRPC
    port then), with the YAML's return_perf_metrics mounting /prometheus/metrics, whose
    trtllm_num_requests_waiting llm-d's endpoint picker reads."""
    path = write(tmp_path, "return_perf_metrics: true\n")
    with TrtllmServe(None, REPO, "--host", "127.0.0.1", "--port", "0", "--max_seq_len", "4096",
                     "--config", path) as pod:
        assert "--http-api trtllm" in pod.log and "--enable-metrics" in pod.log
        assert get(f"{pod.http_url}/health")[0] == 200
        (card,) = json.loads(get(f"{pod.http_url}/v1/models")[1])["data"]
        assert (card["id"], card["owned_by"]) == (REPO, "tensorrt_llm")
        body = json.dumps({"model": REPO, "prompt": "Where is New York?", "max_tokens": 4})
        request = urllib.request.Request(f"{pod.http_url}/v1/completions", body.encode(),
                                         {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as r:
            answer = json.loads(r.read())
        assert (answer["object"], answer["model"]) == ("text_completion", REPO)
        assert answer["usage"]["completion_tokens"] >= 1
        status, text = get(f"{pod.http_url}/prometheus/metrics")
        assert status == 200
        assert any(line.startswith("trtllm_num_requests_waiting{")
                   for line in text.decode().splitlines())
        pod.signal(signal.SIGTERM)
        assert pod.proc is not None and pod.proc.wait(30) == 0
