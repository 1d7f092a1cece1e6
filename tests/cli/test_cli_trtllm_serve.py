"""`doppelchip trtllm-serve`: TensorRT-LLM's `trtllm-serve MODEL --grpc` command line, translated
into `doppelchip serve`'s pod mode serving `trtllm.TrtllmService` on --port. TensorRT-LLM's
spellings (`--tp_size`, `--kv_cache_free_gpu_memory_fraction`), defaults (2048 sequences, 8192
tokens a step, 32-token KV blocks) and `--config` YAML merge carry over; what cannot be served
is refused with exit status 2 before anything starts. One test starts a real pod. The mode
without --grpc (trtllm-serve's OpenAI HTTP server): test_cli_trtllm_serve_http.py."""

from __future__ import annotations

import argparse
import signal
import tomllib
import urllib.request
from pathlib import Path

import pytest
from server_proc import TrtllmServe

from doppelchip import exit_codes
from doppelchip.cli import build_parser, main
from doppelchip.cmd_trtllm import translate

REPO = "meta-llama/Llama-3.1-8B-Instruct"
MOE = "Qwen/Qwen3-30B-A3B"
ROOT = Path(__file__).resolve().parents[2]
POD = ["--chip", "h100-sxm", "--engine", "tensorrt-llm", "--grpc-api", "trtllm",
       "--model", "llama-3.1-8b", "--quant", "bf16", "--served-model-name", REPO]


def parse(*argv: str) -> argparse.Namespace:
    return build_parser("trtllm-serve").parse_args(["trtllm-serve", *argv])


def serve_args(*argv: str) -> argparse.Namespace:
    """`doppelchip serve`'s own parser on the translation of `trtllm-serve ARGV`."""
    return build_parser("serve").parse_args(["serve", *translate(parse(*argv))[0]])


def warnings(*argv: str) -> list[str]:
    return translate(parse(*argv))[1]


def test_the_smg_launchers_command_line_is_a_trtllm_pod(monkeypatch):
    """smg's TrtllmWorkerLauncher: `python -m tensorrt_llm.commands.serve MODEL --grpc --host H
    --port P` plus the user's flags with underscores (`--tensor_parallel_size`: trtllm-serve's
    own spelling, beside `--tp_size`)."""
    out, said = translate(parse(REPO, "--grpc", "--host", "127.0.0.1", "--port", "31000",
                                "--tensor_parallel_size", "2", "--max_seq_len", "8192"))
    assert out == [*POD, "--host", "127.0.0.1", "--port", "31000", "--http-port", "31001",
                   "--tp", "2", "--max-num-seqs", "2048", "--max-num-batched-tokens", "8192",
                   "--max-model-len", "8192", "--chunked-prefill", "off", "--block-size", "32"]
    assert said == []
    a = serve_args(REPO, "--grpc")  # trtllm-serve's defaults: localhost:8000
    assert (a.host, a.port, a.http_port, a.grpc_api, a.engine, a.tp) == \
        ("127.0.0.1", 8000, 8001, "trtllm", "tensorrt-llm", None)
    assert (a.max_num_seqs, a.max_num_batched_tokens, a.block_size, a.chunked_prefill,
            a.prefix_cache, a.gpu_memory_utilization) == (2048, 8192, 32, None, None, None)
    monkeypatch.setenv("DOPPELCHIP_HOST", "0.0.0.0")  # (the container image sets it)
    assert serve_args(REPO, "--grpc").host == "0.0.0.0"


@pytest.mark.parametrize("argv, dest, value", [
    (["--tp_size", "4"], "tp", 4), (["--tensor_parallel_size", "4"], "tp", 4),
    (["--pp_size", "2"], "pp", 2), (["--pipeline_parallel_size", "2"], "pp", 2),
    (["--max_batch_size", "64"], "max_num_seqs", 64),
    (["--max_num_tokens", "4096"], "max_num_batched_tokens", 4096),
    (["--max_seq_len", "4096"], "max_model_len", 4096),
    (["--max_seq_len", "4096"], "chunked_prefill", "off"),  # whole prompts fit a step
    (["--enable_chunked_prefill", "--max_seq_len", "4096"], "chunked_prefill", None),
    (["--kv_cache_free_gpu_memory_fraction", "0.5"], "gpu_memory_utilization", 0.5),
    (["--free_gpu_memory_fraction", "0.5"], "gpu_memory_utilization", 0.5),
    (["--kv_cache_dtype", "fp8"], "kv_cache_dtype", "fp8"),
    (["--served_model_name", "m"], "served_model_name", ["m"]),
    (["--log_level", "verbose"], "log_level", "debug"),
    (["--log_level", "internal_error"], "log_level", "error"),
    (["--host", "localhost"], "host", "127.0.0.1"), (["--host", "0.0.0.0"], "host", "0.0.0.0"),
    (["--port", "0"], "http_port", 0), (["--http-port", "9100"], "http_port", 9100),
    (["--backend", "trt"], "engine", "tensorrt-llm"), (["--chip", "b200"], "chip", "b200"),
    (["--time-scale", "0.5"], "time_scale", 0.5), (["--cold"], "cold", True),
])
def test_each_translated_flag_reaches_serves_parser(argv, dest, value):
    assert getattr(serve_args(REPO, "--grpc", *argv), dest) == value


def test_expert_and_attention_data_parallelism():
    from doppelchip.dropin import serve_args as pod_args
    from doppelchip.dropin import unplaceable

    a = serve_args(MOE, "--grpc", "--tp_size", "4", "--ep_size", "2")
    assert (a.tp, a.ep, a.count) == (4, 2, None)
    assert serve_args(REPO, "--grpc", "--tp_size", "2", "--ep_size", "2").ep is None  # dense
    out = translate(parse("deepseek-ai/DeepSeek-V3", "--grpc", "--chip", "h200-sxm",
                          "--tp_size", "8", "--ep_size", "8", "--enable_attention_dp"))[0]
    a = pod_args(out)
    assert (a.count, a.tp, a.ep) == (8, 1, 8)
    assert unplaceable(a, fit_model_len=False) == ""


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "extra.yaml"
    path.write_text(text)
    return str(path)


YAML = """\
tensor_parallel_size: 2
max_batch_size: 128
enable_chunked_prefill: true
trust_remote_code: true
kv_cache_config:
  enable_block_reuse: false
  free_gpu_memory_fraction: 0.7
  tokens_per_block: 64
  dtype: fp8
  max_tokens: 100000
cuda_graph_config:
  max_batch_size: 64
"""


@pytest.mark.parametrize("flag", ["--config", "--extra_llm_api_options"])
def test_yaml_sets_what_the_flags_did_not(tmp_path, flag):
    path = write(tmp_path, YAML)
    a = serve_args(REPO, "--grpc", flag, path)
    assert (a.tp, a.max_num_seqs, a.prefix_cache, a.gpu_memory_utilization, a.block_size,
            a.kv_cache_dtype, a.chunked_prefill) == (2, 128, "off", 0.7, 64, "fp8", None)
    (said,) = warnings(REPO, "--grpc", flag, path)  # chunked: no warning about it
    assert said == (f"--config {path}: kv_cache_config.max_tokens, cuda_graph_config: accepted "
                    "but not emulated: they change nothing here")  # (not trust_remote_code)


def test_an_explicit_flag_wins_over_the_yaml_as_in_tensorrt_llm(tmp_path):
    """TensorRT-LLM's update_llm_args_with_extra_dict: a flag typed on the command line wins
    (with its warning); kv_cache_config is merged key by key, so the file's block reuse stays."""
    path = write(tmp_path, YAML)
    argv = (REPO, "--grpc", "--config", path, "--max_batch_size", "64",
            "--kv_cache_free_gpu_memory_fraction", "0.5")
    a = serve_args(*argv)
    assert (a.max_num_seqs, a.gpu_memory_utilization, a.prefix_cache, a.tp) == \
        (64, 0.5, "off", 2)
    assert warnings(*argv)[0] == (
        "Explicit CLI flag(s) ['kv_cache_config.free_gpu_memory_fraction', 'max_batch_size'] "
        "override the value(s) set in the YAML config; CLI takes precedence.")
    empty = write(tmp_path, "")
    assert serve_args(REPO, "--grpc", "--config", empty).max_num_seqs == 2048


@pytest.mark.parametrize("text, says", [
    (None, "cannot read it: No such file or directory"),
    ("a: [1", "not YAML"),
    ("- 1\n- 2\n", "Configuration file root must be a mapping."),
    ("kv_cache_config: 0.5\n", "kv_cache_config must be a mapping"),
    ("max_batch_size: -1\n", "max_batch_size must be a positive integer (got -1)"),
    ("kv_cache_config:\n  free_gpu_memory_fraction: 1.5\n", "must be a fraction in (0, 1]"),
    ("enable_chunked_prefill: maybe\n", "enable_chunked_prefill must be true or false"),
    ("max_beam_width: 2\n", "max_beam_width 2: beam search is not emulated"),
    ("return_perf_metrics: 1\n", "return_perf_metrics must be true or false (got 1)"),
    ("disagg_cluster:\n  cluster_uri: http://x\n", "disaggregated serving is not emulated"),
])
def test_a_bad_yaml_file_is_refused(tmp_path, capsys, monkeypatch, text, says):
    monkeypatch.setattr("doppelchip.cmd_serve.cmd_serve", lambda a: pytest.fail("served"))
    path = str(tmp_path / "missing.yaml") if text is None else write(tmp_path, text)
    assert main(["trtllm-serve", REPO, "--grpc", "--config", path]) == exit_codes.USAGE
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err, err


@pytest.mark.parametrize("argv, says", [
    (["--grpc", "--tool_parser", "qwen3"], "Argument 'tool_parser' is not supported when "
     "running in gRPC mode"),
    (["--grpc", "--chat_template", "t"], "Argument 'chat_template' is not supported"),
    (["--grpc", "--allow_request_chat_template"], "Argument 'allow_request_chat_template'"),
    (["--grpc", "--middleware", "m.M"], "Argument 'middleware' is not supported"),
    (["--grpc", "--server_role", "CONTEXT"], "disaggregated serving is not emulated"),
    (["--grpc", "--disagg_cluster_uri", "http://x"], "Argument 'disagg_cluster_config'"),
    (["--grpc", "--metadata_server_config_file", "m.yaml"], "disaggregated serving"),
    (["--grpc", "--enable_visual_gen"], "--grpc is not supported by the VisualGen server"),
    (["--grpc", "--grpc-protocol", "openengine"], "OpenEngine protocol is not emulated"),
    (["--grpc", "--max_beam_width", "4"], "beam search is not emulated"),
    (["--grpc", "--cp_size", "2"], "context parallelism"),
    (["--grpc", "--kv_cache_dtype", "nvfp4"], "an NVFP4 KV cache is not"),
    (["--grpc", "--media_io_kwargs", "{bad"], "Invalid JSON for media_io_kwargs"),
    (["--grpc", "--max_batch_size", "-1"], "--max_batch_size must be a positive integer"),
    (["--grpc", "--max_num_tokens", "0"], "--max_num_tokens must be a positive integer"),
    (["--grpc", "--tp_size", "0"], "--tensor_parallel_size/--tp_size must be a positive"),
    (["--grpc", "--kv_cache_free_gpu_memory_fraction", "1.5"], "fraction in (0, 1] (got 1.5)"),
    (["--grpc", "--free_gpu_memory_fraction", "0"], "fraction in (0, 1] (got 0.0)"),
    (["--grpc", "--tp_size", "4", "--ep_size", "3"], "tp_size must equal to moe_tp_size * "
     "moe_ep_size * moe_cluster_size, but got 4 != 1 * 3 * 1"),
    (["--grpc", "--port", "70000"], "--port 70000: not a TCP port"),
    (["--grpc", "--grpc-port", "9000"], "--grpc-port: with --grpc the gRPC service is on --port"),
    (["--grpc", "--chip", "rtx-4090", "--max_seq_len", "4096"], "error: "),  # 8B bf16 > 24 GB
])
def test_what_cannot_be_served_is_refused_before_it_starts(capsys, monkeypatch, argv, says):
    monkeypatch.setattr("doppelchip.cmd_serve.cmd_serve", lambda a: pytest.fail("served"))
    model = "meta-llama/Llama-3.1-70B-Instruct" if "rtx-4090" in argv else REPO
    assert main(["trtllm-serve", model, *argv]) == exit_codes.USAGE
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err, err
    assert err.strip().splitlines()[-1].startswith("error: "), err


@pytest.mark.parametrize("argv, says", [
    (["--max-batch-size", "8"], "unrecognized arguments: --max-batch-size"),  # click's spelling
    (["--tp", "2"], "unrecognized arguments: --tp"),  # no prefixes: click has none
    (["--max_batch", "8"], "unrecognized arguments: --max_batch"),
    (["--backend", "vllm"], "invalid choice: 'vllm'"),
])
def test_what_trtllm_serve_does_not_define_is_argparses_error(capsys, argv, says):
    with pytest.raises(SystemExit) as exit_:
        main(["trtllm-serve", REPO, "--grpc", *argv])
    assert exit_.value.code == exit_codes.USAGE
    assert says in capsys.readouterr().err


def test_loading_flags_are_silent_and_unemulated_ones_warned():
    quiet = ("--trust_remote_code", "--tokenizer", "x/y", "--gpus_per_node", "8",
             "--num_postprocess_workers", "2", "--reasoning_parser", "qwen3", "--no-telemetry",
             "--hf_revision", "main", "--custom_module_dirs", "d", "--max_seq_len", "4096",
             "--backend", "pytorch")
    assert warnings(REPO, "--grpc", *quiet) == []
    said = warnings(REPO, "--grpc", "--max_seq_len", "4096", "--cluster_size", "2",
                    "--generation-config", "auto", "--media_io_kwargs", "{}",
                    "--backend", "_autodeploy")
    assert said == [f"{flag} is accepted but not emulated: it changes nothing here" for flag in
                    ("--moe_cluster_parallel_size", "--media_io_kwargs", "--generation-config")
                    ] + ["backend _autodeploy is served as the PyTorch backend: AutoDeploy's "
                         "graph transformations are not emulated"]
    (chunks,) = warnings(REPO, "--grpc")  # 131,072-token requests, 8,192 tokens a step
    assert chunks.startswith("without --enable_chunked_prefill TensorRT-LLM refuses prompts")


def test_a_pod_starts_serve_and_prints_its_command(capsys, monkeypatch):
    served: list[argparse.Namespace] = []
    monkeypatch.setattr("doppelchip.cmd_serve.cmd_serve", lambda a: served.append(a) or 0)
    # click's command group: `trtllm-serve serve MODEL` names its default command
    assert main(["trtllm-serve", "serve", REPO, "--grpc", "--port", "9000",
                 "--max_seq_len", "4096", "--agent_types", "x"]) == exit_codes.OK
    (a,) = served
    assert (a.grpc_api, a.engine, a.port, a.http_port, a.model_path) == \
        ("trtllm", "tensorrt-llm", 9000, 9001, REPO)
    err = capsys.readouterr().err
    assert "doppelchip trtllm-serve: warning: --agent_types is accepted but not emulated" in err
    assert "doppelchip trtllm-serve: doppelchip serve --chip h100-sxm --engine tensorrt-llm " \
        "--grpc-api trtllm " in err
    assert main(["trtllm-serve", "disaggregated", "-c", "d.yaml"]) == exit_codes.USAGE
    assert "trtllm-serve disaggregated: not emulated" in capsys.readouterr().err


def test_help_and_the_doppelchip_trtllm_serve_script(monkeypatch, capsys):
    from doppelchip.cli import trtllm_serve_main as script

    with pytest.raises(SystemExit) as exit_:
        main(["trtllm-serve", "--help"])
    out = capsys.readouterr().out
    assert exit_.value.code == 0 and "--kv_cache_free_gpu_memory_fraction" in out
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["doppelchip-trtllm-serve"] == "doppelchip.cli:trtllm_serve_main"
    monkeypatch.setattr("sys.argv", ["trtllm-serve", "org/none", "--grpc"])
    assert script() == exit_codes.USAGE
    assert "unknown checkpoint 'org/none'" in capsys.readouterr().err


def test_a_trtllm_serve_pod_serves_trtllm_service_on_its_grpc_port():
    """What smg's launcher starts: TensorRT-LLM's service on --port (reflection lists it, in
    place of vLLM's engine service), doppelchip's HTTP API on another port (0: a free one)."""
    import grpc
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
        ProtoReflectionDescriptorDatabase,
    )

    with TrtllmServe(None, REPO, "--grpc", "--host", "127.0.0.1", "--port", "0",
                     "--max_seq_len", "4096") as pod:
        assert "doppelchip trtllm-serve: doppelchip serve " in pod.log
        with grpc.insecure_channel(pod.target) as channel:
            names = set(ProtoReflectionDescriptorDatabase(channel).get_services())
        assert "trtllm.TrtllmService" in names
        assert "vllm.grpc.engine.VllmEngine" not in names
        with urllib.request.urlopen(f"{pod.http_url}/health", timeout=10) as r:
            assert r.status == 200
        pod.signal(signal.SIGTERM)
        assert pod.proc is not None and pod.proc.wait(30) == 0
