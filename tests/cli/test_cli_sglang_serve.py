"""`doppelchip sglang serve`: SGLang 0.5.23's launch command line, translated into `doppelchip
serve`'s pod mode speaking SGLang's HTTP API. A checkpoint resolves as for `vllm serve`,
SGLang's flag names and value shapes (`--tp 2`, `--context-length 32Ki`, `--chunked-prefill-size
-1`) carry their meaning over, and what cannot be served is refused with exit status 2 before
anything starts. No server is started here: `doppelchip serve`'s entry point is replaced."""

from __future__ import annotations

import argparse
import json
import tomllib
from pathlib import Path

import pytest

from doppelchip import exit_codes
from doppelchip.cli import build_parser, main
from doppelchip.cmd_sglang import translate
from doppelchip.sglang_argv import sglang_argv

REPO = "meta-llama/Llama-3.1-8B-Instruct"
ROOT = Path(__file__).resolve().parents[2]


def parse(*argv: str) -> argparse.Namespace:
    """`sglang serve ARGV` parsed, after SGLang's rewrites (`sglang serve REPO`, --config)."""
    return build_parser("sglang").parse_args(sglang_argv(["sglang", "serve", *argv]))


def serve_args(*argv: str) -> argparse.Namespace:
    """`doppelchip serve`'s own parser on the translation of `sglang serve ARGV`."""
    return build_parser("serve").parse_args(["serve", *translate(parse(*argv))[0]])


def warnings(*argv: str) -> list[str]:
    return translate(parse(*argv))[1]


def test_a_typical_launch_command_is_an_sglang_pod():
    out, said = translate(parse("--model-path", REPO, "--tp", "2", "--port", "30000"))
    assert out == ["--chip", "h100-sxm", "--engine", "sglang", "--http-api", "sglang",
                   "--model", "llama-3.1-8b", "--quant", "bf16", "--served-model-name", REPO,
                   "--host", "127.0.0.1", "--port", "50051", "--http-port", "30000",
                   "--policy", "fcfs", "--tp", "2"]
    assert said == []
    # SGLang's defaults: HTTP on 30000, fcfs (0.5.23's Schedule.schedule_policy)
    a = serve_args(REPO)
    assert (a.http_port, a.port, a.policy, a.http_api, a.tp) == (30000, 50051, "fcfs",
                                                                 "sglang", None)
    assert (serve_args("--model", "llama-2-7b").model, parse(REPO).model_path) == \
        ("llama-2-7b", REPO)


@pytest.mark.parametrize("argv, dest, value", [
    (["--tp-size", "4"], "tp", 4), (["--tensor-parallel-size", "4"], "tp", 4),
    (["--tp", "4"], "tp", 4),  # a unique prefix of --tp-size, as SGLang's argparse reads it
    (["--pp-size", "2"], "pp", 2), (["--dp", "2"], "data_parallel_size", 2),
    (["--context-length", "32Ki"], "max_model_len", 32768),
    (["--context-length", "25.6k"], "max_model_len", 25600),
    (["--mem-fraction-static", "0.8"], "gpu_memory_utilization", 0.8),
    (["--max-running-requests", "64"], "max_num_seqs", 64),
    (["--chunked-prefill-size", "4096"], "max_num_batched_tokens", 4096),
    (["--chunked-prefill-size", "-1"], "chunked_prefill", "off"),
    (["--page-size", "32"], "block_size", 32), (["--disable-radix-cache"], "prefix_cache", "off"),
    (["--served-model-name", "m"], "served_model_name", ["m"]),
    (["--enable-metrics"], "enable_metrics", True), (["--api-key", "k"], "api_key", ["k"]),
    (["--dtype", "half"], "quant", "f16"), (["--quantization", "fp8"], "quant", "fp8"),
    (["--quantization", "w8a8_fp8"], "quant", "fp8"),
    (["--kv-cache-dtype", "fp8_e5m2"], "kv_cache_dtype", "fp8"),
    (["--kv-cache-dtype", "bfloat16"], "kv_cache_dtype", "bf16"),
    (["--schedule-policy", "lpm"], "policy", "lpm"),
    (["--schedule-policy", "lpm", "--disable-radix-cache"], "policy", "fcfs"),
    (["--enable-priority-scheduling", "--schedule-low-priority-values-first"], "policy",
     "priority"),
    (["--disable-cuda-graph"], "enforce_eager", True),
    (["--cuda-graph-backend-decode", "disabled"], "enforce_eager", True),
    (["--stream-interval", "4"], "stream_interval", 4), (["--log-level", "WARNING"],
                                                         "log_level", "warning"),
    (["--cpu-offload-gb", "20"], "cpu_offload_gb", 20.0),
    (["--ssl-keyfile", "k.pem", "--ssl-certfile", "c.pem"], "ssl_certfile", "c.pem"),
    (["--host", "0.0.0.0"], "host", "0.0.0.0"), (["--port", "8080"], "http_port", 8080),
    (["--grpc-port", "50100"], "port", 50100), (["--chip", "b200"], "chip", "b200"),
    (["--time-scale", "0.5"], "time_scale", 0.5), (["--cold"], "cold", True),
])
def test_each_translated_flag_reaches_serves_parser(argv, dest, value):
    assert getattr(serve_args(REPO, *argv), dest) == value


def test_modelopt_keeps_a_modelopt_checkpoints_format(tmp_path):
    """SGLang's `modelopt` detects FP8 or NVFP4 from the checkpoint, else means FP8."""
    folder = tmp_path / "Llama-3.1-8B-Instruct-NVFP4"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "hidden_size": 4096, "max_position_embeddings": 131072, "num_attention_heads": 32,
        "num_hidden_layers": 32, "num_key_value_heads": 8, "vocab_size": 128256,
        "quantization_config": {"quant_method": "modelopt_fp4"}}))
    assert serve_args(str(folder), "--quantization", "modelopt").quant == "nvfp4"
    assert serve_args(str(folder)).served_model_name == [str(folder)]  # a local folder too
    assert serve_args(REPO, "--quantization", "modelopt").quant == "fp8"  # its default


@pytest.mark.parametrize("argv", [
    ("--tp", "8", "--dp", "8", "--enable-dp-attention", "--ep", "8"),  # the deprecated form
    ("--tp", "8", "--attn-dp-size", "8", "--ep", "8"),
])
def test_attention_data_parallelism_keeps_tp_chips_as_attention_replicas(argv):
    from doppelchip.dropin import serve_args as pod_args
    from doppelchip.dropin import unplaceable

    args = parse("deepseek-ai/DeepSeek-V3", "--chip", "h200-sxm", *argv)
    out = translate(args)[0]
    a = pod_args(out)
    assert (a.count, a.tp, a.ep, a.data_parallel_size) == (8, 1, 8, None)
    assert unplaceable(a, fit_model_len=False) == ""
    expert = serve_args("deepseek-ai/DeepSeek-V3", "--tp", "8", "--ep", "8")
    assert (expert.count, expert.tp, expert.ep) == (None, 8, 8)


def test_sglang_serve_takes_the_model_as_its_first_argument_and_launch_server_does_not():
    assert parse(REPO, "--tp", "2").model_path == REPO
    assert build_parser("sglang").parse_args(sglang_argv(
        ["sglang", "launch_server", "--model-path", REPO])).model_path == REPO
    with pytest.raises(SystemExit):
        build_parser("sglang").parse_args(sglang_argv(["sglang", "launch_server", REPO]))
    assert parse(REPO, "--model-type", "llm").model_path == REPO
    assert parse("--model-type=auto", REPO).model_path == REPO


@pytest.mark.parametrize("argv, says", [
    ([REPO, "--model-type", "diffusion"], "diffusion server is not emulated"),
    ([REPO, "--model-type", "vlm"], "Unknown serve backend 'vlm'"),
    ([REPO, "--model-type"], "--model-type requires a value"),
    ([REPO, "--config", "c.json"], "Config file must be YAML format, got: .json"),
    ([REPO, "--config", "/nonexistent.yaml"], "Config file not found"),
    ([REPO, "--config"], "No config file specified after --config flag!"),
])
def test_sglangs_rewrites_refuse_what_sglang_refuses(capsys, argv, says):
    assert main(["sglang", "serve", *argv]) == exit_codes.USAGE
    assert says in capsys.readouterr().err


def test_a_yaml_config_file_holds_flags_as_sglang_reads_it(tmp_path, capsys):
    path = tmp_path / "config.yaml"
    path.write_text(f"model-path: {REPO}\ntp-size: 2\ncontext-length: 16Ki\nenable-metrics: true\n"
                    "disable-radix-cache: false\nlog-requests-target: [stdout, /tmp/l]\n"
                    "port: 8100\n")
    a = serve_args("--config", str(path), "--port", "8200")  # the command line wins
    assert (a.model, a.tp, a.max_model_len, a.enable_metrics) == ("llama-3.1-8b", 2, 16384, True)
    assert (a.prefix_cache, a.http_port) == (None, 8200)
    path.write_text(f"model-path: {REPO}\ntp_size: 2\n")  # SGLang writes the key as given
    with pytest.raises(SystemExit):
        main(["sglang", "serve", "--config", str(path)])
    assert "unrecognized arguments: --tp_size 2" in capsys.readouterr().err
    path.write_text(f"model-path: {REPO}\nenable-tf32-matmul: true\n")  # a --no-X switch
    assert main(["sglang", "serve", "--config", str(path)]) == exit_codes.USAGE
    assert "Unsupported config option 'enable_tf32_matmul'" in capsys.readouterr().err
    path.write_text("- a\n")
    assert main(["sglang", "serve", "--config", str(path)]) == exit_codes.USAGE
    assert "dictionary at root level" in capsys.readouterr().err


@pytest.mark.parametrize("argv, says", [
    (["--disaggregation-mode", "prefill"], "--disaggregation-mode prefill: SGLang's "
                                           "prefill/decode disaggregation"),
    (["--disaggregation-mode", "decode"], "is not emulated"),
    (["--is-embedding"], "--is-embedding: meta-llama/Llama-3.1-8B-Instruct is a generative"),
    (["--enable-lora"], "LoRA adapters are not emulated"),
    (["--lora-paths", "sql=/a"], "LoRA adapters are not emulated"),
    (["--encoder-only"], "encoder-only server"),
    (["--schedule-policy", "lof"], "--schedule-policy lof: emulated are fcfs, lpm"),
    (["--enable-priority-scheduling"], "--schedule-low-priority-values-first"),
    (["--enable-priority-scheduling", "--schedule-policy", "lpm"], "must be 'fcfs' or 'lof'"),
    (["--kv-cache-dtype", "nvfp4"], "--kv-cache-dtype nvfp4: emulated are"),
    (["--quantization", "bitsandbytes"], "no catalogue weight format"),
    (["--dtype", "float32"], "no 32-bit weight format"),
    (["--log-level", "loud"], "--log-level loud: not a logging level"),
    (["--ep", "8"], "ep_size * moe_dp_size must be less than or equal to tp_size"),
    (["--tp", "8", "--ep", "4"], "ep_size * moe_dp_size must be equal to tp_size"),
    (["--tp", "8", "--dp", "2", "--attn-dp-size", "4"], "are not supported"),
    (["--tp", "6", "--attn-dp-size", "4"], "tp_size must be divisible by attn_dp_size"),
    (["--mem-fraction-static", "1.5"], "(0, 1]"),
    (["--chip", "rtx-4090", "--tp", "1", "--model-path", "meta-llama/Llama-3.1-405B-Instruct"],
     "error: "),
    (["--kv-events-config", '{"publisher": "zmq", "snapshot_endpoint": "tcp://*:5560"}'],
     "snapshot_endpoint: SGLang's placement snapshots are not emulated"),
    (["--kv-events-config", '{"publisher": "zmq", "enable_kv_cache_events": true}'],
     "--kv-events-config: unknown key(s) enable_kv_cache_events"),
    (["--kv-events-config", "{zmq"], "--kv-events-config is not valid JSON"),
])
def test_what_cannot_be_served_is_refused_before_it_starts(capsys, monkeypatch, argv, says):
    monkeypatch.setattr("doppelchip.cmd_serve.cmd_serve", lambda a: pytest.fail("served"))
    assert main(["sglang", "serve", "--model-path", REPO, *argv]) == exit_codes.USAGE
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err, err
    assert err.strip().splitlines()[-1].startswith("error: "), err


@pytest.mark.parametrize("argv, says", [
    (["--gpu-memory-utilization", "0.8"], "unrecognized arguments"),  # vLLM's, not SGLang's
    (["--max-model-len", "4096"], "unrecognized arguments"),
    (["--pp", "2"], "ambiguous option: --pp could match --pp-size"),  # as in SGLang
    (["--context-length", "32K"], "Suffixes are case-sensitive"),
    ([], "the following arguments are required: --model-path/--model"),
])
def test_what_sglang_does_not_take_is_argparses_error(capsys, argv, says):
    with pytest.raises(SystemExit) as exit_:
        main(["sglang", "serve", *([REPO] if argv else []), *argv])
    assert exit_.value.code == exit_codes.USAGE
    assert says in capsys.readouterr().err


def test_smg_grpc_mode_serves_the_scheduler_on_port_and_http_on_the_sidecar():
    """smg-grpc-servicer binds the scheduler service to --port; SGLang's HTTP sidecar (here
    the whole HTTP API) is on --smg-http-sidecar-port, default --port + 1."""
    a = serve_args(REPO, "--smg-grpc-mode", "--port", "31000")
    assert (a.port, a.http_port, a.http_api) == (31000, 31001, "sglang")
    a = serve_args(REPO, "--smg-grpc-mode", "--smg-http-sidecar-port", "9100")
    assert (a.port, a.http_port) == (30000, 9100)
    assert (serve_args(REPO, "--grpc-mode").port, warnings(REPO, "--smg-grpc-mode")) == \
        (30000, [])
    (said,) = warnings(REPO, "--grpc-mode")  # SGLang's own deprecation warning
    assert said.startswith("--grpc-mode is deprecated") and "--smg-grpc-mode" in said
    (said,) = warnings(REPO, "--smg-grpc-mode", "--grpc-port", "50100")
    assert "--grpc-port is not used with --smg-grpc-mode" in said
    assert serve_args(REPO, "--smg-http-sidecar-port", "9100").http_port == 30000  # HTTP mode


def test_loading_flags_are_silent_and_unemulated_ones_warned():
    quiet = ("--trust-remote-code", "--download-dir", "/models", "--load-format", "safetensors",
             "--tokenizer-path", "x/y", "--skip-server-warmup", "--log-requests",
             "--dist-init-addr", "10.0.0.1:5000", "--nnodes", "1")
    assert warnings(REPO, *quiet) == []
    said = warnings(REPO, "--attention-backend", "fa3", "--enable-mixed-chunk",
                    "--max-prefill-tokens", "8k", "--random-seed", "7")
    assert [w.split()[0] for w in said] == ["--enable-mixed-chunk", "--attention-backend",
                                            "--max-prefill-tokens", "--random-seed:"]
    assert said[0] == "--enable-mixed-chunk is accepted but not emulated: it changes nothing here"


def test_a_pod_starts_serve_with_sglangs_api_and_prints_its_command(capsys, monkeypatch):
    """SGLang starts whatever its KV pool holds (vLLM would stop: test_cli_vllm_serve)."""
    served: list[argparse.Namespace] = []
    monkeypatch.setattr("doppelchip.cmd_serve.cmd_serve", lambda a: served.append(a) or 0)
    assert main(["sglang", "serve", REPO, "--chip", "rtx-4090", "--enable-metrics",
                 "--attention-backend", "fa3"]) == exit_codes.OK
    (a,) = served
    assert (a.http_api, a.engine, a.enable_metrics, a.model_path) == ("sglang", "sglang", True,
                                                                     REPO)
    err = capsys.readouterr().err
    assert "doppelchip sglang serve: warning: --attention-backend is accepted but not " \
        "emulated" in err
    assert "doppelchip sglang serve: doppelchip serve --chip rtx-4090 --engine sglang " \
        "--http-api sglang " in err


def test_a_follower_nodes_pod_idles(monkeypatch):
    idled: list[str] = []
    monkeypatch.setattr("doppelchip.cmd_vllm._idle", lambda note: idled.append(note) or 0)
    monkeypatch.setattr("doppelchip.cmd_serve.cmd_serve", lambda a: pytest.fail("served"))
    assert main(["sglang", "serve", "deepseek-ai/DeepSeek-V3", "--tp", "16", "--nnodes", "2",
                 "--node-rank", "1"]) == exit_codes.OK
    assert idled and "node rank 0" in idled[0] and "waits for SIGTERM" in idled[0]


def test_help_lists_sglangs_flags_and_what_they_do_here(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["sglang", "serve", "--help"])
    out = capsys.readouterr().out
    assert exit_.value.code == 0
    assert "--mem-fraction-static" in out and "SGLang 0.5.23" in out and "--chip" in out


def test_the_doppelchip_sglang_script_is_sglangs_command(monkeypatch, capsys):
    from doppelchip.cli import sglang_main as script

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["doppelchip-sglang"] == "doppelchip.cli:sglang_main"
    monkeypatch.setattr("sys.argv", ["sglang", "serve", "org/none"])
    assert script() == exit_codes.USAGE
    assert "unknown checkpoint 'org/none'" in capsys.readouterr().err


def test_sglangs_kv_events_config_becomes_the_pods():
    """SGLang's JSON has no enable_kv_cache_events: a "zmq" publisher is events on, "null" (its
    default) none; the endpoints, buffer and topic carry over, and the pod publishes in
    SGLang's wire form (tests/service/test_kv_events_sglang.py)."""
    cfg = {"publisher": "zmq", "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558",
           "topic": "kv", "buffer_steps": 100}
    a = serve_args(REPO, "--kv-events-config", json.dumps(cfg))
    assert json.loads(a.kv_events_config) == {"enable_kv_cache_events": True, **cfg}
    assert serve_args(REPO, "--kv-events-config", '{"endpoint": "tcp://*:5557"}'
                      ).kv_events_config is None
    assert serve_args(REPO).kv_events_config is None
    assert warnings(REPO, "--kv-events-config", json.dumps(cfg)) == []
