"""`doppelchip vllm serve`: vLLM 0.33.0's command line, translated into `doppelchip serve`'s
pod mode. A checkpoint repository names its catalogue model and weight format, vLLM's flag
names and value shapes (`-tp`, `--max-model-len 32k`, `--no-enable-prefix-caching`) carry
their meaning over, and what cannot be served is refused with exit status 2 before anything
starts. The server these arguments start is tested in tests/http/test_http_vllm_serve.py."""

from __future__ import annotations

import argparse
import json

import pytest

from devices import place
from doppelchip import exit_codes
from doppelchip.cli import build_parser, main
from doppelchip.cmd_serve import pod_fleet
from doppelchip.cmd_vllm import translate
from doppelchip.vllm_parser import human_readable_int
from server.config import load_fleet


def serve_args(*argv: str) -> argparse.Namespace:
    """`doppelchip serve`'s parsed arguments for `vllm serve ARGV`, after vLLM's rewrites
    (`--config FILE.yaml`, `--max_model_len`)."""
    from doppelchip.cli import _negatable
    from doppelchip.vllm_argv import vllm_argv

    parser = build_parser("vllm")
    out, _ = translate(parser.parse_args(vllm_argv(["vllm", "serve", *argv],
                                                   _negatable(parser))))
    return build_parser("serve").parse_args(["serve", *out])


def warnings(*argv: str) -> list[str]:
    return translate(build_parser("vllm").parse_args(["vllm", "serve", *argv]))[1]


def test_a_checkpoint_names_its_catalogue_model_and_weight_format():
    a = serve_args("meta-llama/Llama-3.1-8B-Instruct")
    assert (a.model, a.quant, a.engine, a.chip) == ("llama-3.1-8b", "bf16", "vllm", "h100-sxm")
    assert a.served_model_name == ["meta-llama/Llama-3.1-8B-Instruct"]  # vLLM's default
    assert serve_args("meta-llama/Llama-2-7b-chat-hf").quant == "f16"  # torch_dtype float16
    assert serve_args("openai/gpt-oss-20b").quant == "mxfp4"  # its quantization_config
    # the Hub resolves ids case-insensitively; the name clients send stays as typed
    lower = serve_args("qwen/qwen3-30b-a3b-fp8")
    assert (lower.model, lower.quant) == ("qwen3-30b-a3b", "fp8")
    assert lower.served_model_name == ["qwen/qwen3-30b-a3b-fp8"]


def test_the_positional_model_wins_over_model_and_a_catalogue_id_serves_too():
    a = serve_args("mistralai/Mistral-7B-Instruct-v0.3", "--model", "llama-2-7b")
    assert a.model == "mistral-7b"
    assert serve_args("--model", "llama-2-7b").model == "llama-2-7b"


def test_vllms_engine_flags_map_onto_the_pod():
    a = serve_args("meta-llama/Llama-3.1-70B-Instruct", "-tp", "4", "-pp", "2", "-dp", "2",
                   "--max-model-len", "32k", "--max-num-batched-tokens", "4K",
                   "--max-num-seqs", "128", "--gpu-memory-utilization", "0.8",
                   "--no-enable-prefix-caching", "--enforce-eager", "--block-size", "32",
                   "--num-gpu-blocks-override", "4000", "--scheduling-policy", "priority",
                   "--kv-cache-dtype", "fp8_e4m3", "--served-model-name", "a", "b",
                   "--chip", "b200")
    assert (a.tp, a.pp, a.data_parallel_size) == (4, 2, 2)
    assert (a.max_model_len, a.max_num_batched_tokens, a.max_num_seqs) == (32000, 4096, 128)
    assert a.gpu_memory_utilization == 0.8 and a.enforce_eager and a.prefix_cache == "off"
    assert (a.block_size, a.kv_blocks, a.policy, a.kv_cache_dtype) == (32, 4000, "priority",
                                                                      "fp8")
    assert a.served_model_name == ["a", "b"] and a.chip == "b200"
    out, _ = translate(build_parser("vllm").parse_args(
        ["vllm", "serve", "llama-2-7b", "--served-model-name", "a"]))
    assert out.count("--served-model-name") == 1
    assert serve_args("meta-llama/Llama-3.1-8B", "--max-model-len", "auto").max_model_len is None
    sized = serve_args("meta-llama/Llama-3.1-8B", "--kv-cache-memory-bytes", "8G")
    assert sized.kv_cache_memory_bytes == 8 * 2**30  # vLLM: G is binary, g decimal
    (pod,) = pod_fleet(sized, load_fleet(None)).deployments
    assert place(pod.spec()).kv_tokens == 8 * 2**30 // (2 * 32 * 8 * 128 * 2)  # 8B bf16
    offload = ("meta-llama/Llama-3.1-70B-Instruct", "--cpu-offload-gb", "80")  # 141 GB of bf16
    (pod,) = pod_fleet(serve_args(*offload), load_fleet(None)).deployments
    assert dict(place(pod.spec()).weight_bytes)["host_dram"] == 80 * 2**30  # on one H100
    assert warnings(*offload) == []  # emulated, no longer "accepted but not emulated"


def test_weight_formats_follow_dtype_and_quantization():
    assert serve_args("meta-llama/Llama-3.1-8B", "--dtype", "half").quant == "f16"
    assert serve_args("meta-llama/Llama-3.1-8B", "-q", "fp8").quant == "fp8"
    assert serve_args("meta-llama/Llama-3.1-8B", "-q", "awq_marlin").quant == "awq-int4"
    assert serve_args("meta-llama/Llama-3.1-8B", "-q", "modelopt_fp4").quant == "nvfp4"
    # --dtype is the activations' type: it leaves a quantised checkpoint's weights alone
    assert serve_args("openai/gpt-oss-120b", "--dtype", "bfloat16").quant == "mxfp4"


def test_front_end_flags_pass_through():
    a = serve_args("meta-llama/Llama-3.1-8B", "--host", "0.0.0.0", "--port", "8100",
                   "--grpc-port", "50100", "--api-key", "k1", "--enable-server-load-tracking",
                   "--enable-lora", "--lora-modules", "sql=/x", "--max-loras", "2",
                   "--tool-call-parser", "hermes", "--enable-auto-tool-choice",
                   "--kv-events-config", '{"enable_kv_cache_events": true}',
                   "--log-level", "WARNING", "--time-scale", "0.5", "-asc", "2")
    assert (a.host, a.http_port, a.port) == ("0.0.0.0", 8100, 50100)
    assert a.api_key == ["k1"] and a.enable_server_load_tracking and a.enable_lora
    assert (a.lora_modules, a.max_loras, a.tool_call_parser) == (["sql=/x"], 2, "hermes")
    assert a.enable_auto_tool_choice and a.kv_events_config == '{"enable_kv_cache_events": true}'
    assert (a.log_level, a.time_scale, a.api_server_count) == ("warning", 0.5, 2)
    default = serve_args("meta-llama/Llama-3.1-8B")
    assert (default.host, default.http_port, default.port) == ("127.0.0.1", 8000, 50051)


def test_doppelchips_own_settings_come_from_the_environment(monkeypatch, capsys):
    """A manifest written for vLLM keeps its args and sets these in its env block."""
    monkeypatch.setenv("DOPPELCHIP_HOST", "0.0.0.0")  # the container image's setting
    monkeypatch.setenv("DOPPELCHIP_CHIP", "mi300x")
    monkeypatch.setenv("DOPPELCHIP_TIME_SCALE", "0.25")
    monkeypatch.setenv("DOPPELCHIP_COLD", "1")
    args = build_parser("vllm").parse_args(["vllm", "serve", "meta-llama/Llama-3.1-8B"])
    a = build_parser("serve").parse_args(["serve", *translate(args)[0]])
    assert (a.host, a.chip, a.time_scale, a.cold) == ("0.0.0.0", "mi300x", 0.25, True)
    monkeypatch.setenv("DOPPELCHIP_TIME_SCALE", "fast")
    with pytest.raises(SystemExit) as exit_:
        build_parser("vllm").parse_args(["vllm", "serve", "meta-llama/Llama-3.1-8B"])
    assert exit_.value.code == exit_codes.USAGE
    assert "--time-scale: invalid float value: 'fast'" in capsys.readouterr().err


def test_loading_flags_are_accepted_and_unemulated_ones_warned():
    quiet = ("--trust-remote-code", "--download-dir", "/models", "--load-format", "safetensors",
             "--tokenizer", "x/y", "--revision", "main", "--disable-uvicorn-access-log",
             "--uvicorn-log-level", "warning", "--hf-token")
    assert warnings("meta-llama/Llama-3.1-8B", *quiet) == []
    said = warnings("meta-llama/Llama-3.1-8B", "--logprobs-mode", "raw_logits", "-cc",
                    '{"level": 3}', "--performance-mode", "throughput", "--seed", "7")
    assert [w.split()[0] for w in said] == ["--logprobs-mode", "--compilation-config",
                                            "--performance-mode", "--seed:"]
    # vLLM 0.33.0 schedules asynchronously by default: asking for it asks for nothing new,
    # and turning it off is what is not emulated
    assert warnings("meta-llama/Llama-3.1-8B", "--async-scheduling") == []
    (off,) = warnings("meta-llama/Llama-3.1-8B", "--no-async-scheduling")
    assert off.startswith("--no-async-scheduling is accepted but not emulated")


@pytest.mark.parametrize("argv, says", [
    ([], "no model"),
    (["org/not-a-model"], "unknown checkpoint 'org/not-a-model'"),
    (["meta-llama/Llama-3.1-8B", "--dtype", "float32"], "no 32-bit weight format"),
    (["meta-llama/Llama-3.1-8B", "-q", "bitsandbytes"], "vLLM quantization method"),
    (["meta-llama/Llama-3.1-8B", "--kv-cache-dtype", "int8_per_token_head"], "emulated are"),
    (["meta-llama/Llama-3.1-8B", "--no-enable-chunked-prefill", "--max-num-batched-tokens",
      "2048"], "max_num_batched_tokens (2048) is smaller than max_model_len (131072)"),
    (["meta-llama/Llama-3.1-8B", "--uds", "/tmp/s"], "TCP only"),
    (["meta-llama/Llama-3.1-8B", "--gpu-memory-utilization", "1.5"], "(0, 1]"),
    (["meta-llama/Llama-3.1-8B", "--seed", "-1"], "--seed must be in [0, 4294967295], got -1"),
    (["meta-llama/Llama-3.1-8B", "--seed", str(2**32)], "--seed must be in [0, 4294967295]"),
    (["meta-llama/Llama-3.1-8B", "--kv-cache-memory-bytes", "90G"], "kv_cache_memory_bytes"),
    (["meta-llama/Llama-3.1-405B-Instruct", "--chip", "rtx-4090"], "error: "),
])
def test_what_cannot_be_served_is_refused_before_it_starts(capsys, argv, says):
    rc = main(["vllm", "serve", *argv])
    err = capsys.readouterr().err
    assert rc == exit_codes.USAGE, err
    assert says in err and "Traceback" not in err, err
    assert "listening on" not in err


def test_an_unknown_flag_is_argparse_s_error_as_in_vllm(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["vllm", "serve", "meta-llama/Llama-3.1-8B", "--swap-space", "4"])
    assert exit_.value.code == exit_codes.USAGE  # removed from vLLM before 0.33.0
    assert "unrecognized arguments: --swap-space 4" in capsys.readouterr().err


def test_human_readable_integers_are_vllms():
    assert [human_readable_int(v) for v in ("1k", "1K", "25.6k", "2M", "4096", "auto", "-1")] \
        == [1000, 1024, 25600, 2 * 2**20, 4096, -1, -1]
    with pytest.raises(argparse.ArgumentTypeError, match="Decimals are not allowed"):
        human_readable_int("1.5K")


def test_the_doppelchip_vllm_script_is_vllms_command(monkeypatch, capsys):
    """`doppelchip-vllm` (`vllm` in the container image) reads `serve ...` as `vllm` does."""
    from doppelchip.cli import vllm_main as script

    monkeypatch.setattr("sys.argv", ["vllm", "serve", "org/none"])
    assert script() == exit_codes.USAGE
    assert "unknown checkpoint 'org/none'" in capsys.readouterr().err


def test_a_yaml_config_file_holds_flags_as_vllm_reads_it(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("model: meta-llama/Llama-3.1-70B-Instruct\ntensor_parallel_size: 4\n"
                    "max-model-len: 16k\nenable-prefix-caching: false\nenforce-eager: true\n"
                    "trust-remote-code: true\nserved-model-name: [a, b]\nport: 8100\n"
                    "kv-events-config:\n  enable_kv_cache_events: true\n")
    a = serve_args("--config", str(path))
    assert (a.model, a.tp, a.max_model_len, a.prefix_cache) == ("llama-3.1-70b", 4, 16000, "off")
    assert a.enforce_eager and a.served_model_name == ["a", "b"] and a.http_port == 8100
    assert a.kv_events_config == '{"enable_kv_cache_events": true}'
    # the command line wins over the file, the positional model over the file's
    b = serve_args("mistralai/Mistral-7B-Instruct-v0.3", "--config", str(path), "-tp", "2",
                 "--max_model_len=8k")
    assert (b.model, b.tp, b.max_model_len) == ("mistral-7b", 2, 8000)


@pytest.mark.parametrize("text, name, says", [
    ("tensor-parallel-size: 2\n", "c.yaml", "No model specified"),
    ("model: x\n", "c.json", "must be of a yaml/yml type"),
    ("- a\n- b\n", "c.yaml", "expected a mapping"),
    ("model: [unclosed\n", "c.yaml", "cannot read the config file"),
])
def test_a_bad_config_file_is_a_usage_error(tmp_path, capsys, text, name, says):
    path = tmp_path / name
    path.write_text(text)
    assert main(["vllm", "serve", "--config", str(path)]) == exit_codes.USAGE
    assert says in capsys.readouterr().err
    assert main(["vllm", "serve", "m", "--config"]) == exit_codes.USAGE
    assert main(["vllm", "serve", "--config", str(path), "--config", str(path)]) \
        == exit_codes.USAGE


def test_without_max_model_len_the_kv_cache_must_hold_the_models_whole_context(capsys):
    """vLLM 0.33.0 stops when one request of the model's max seq len does not fit the KV
    cache (Llama 3.1 8B's 131,072 tokens on a 24 GB card); `auto` takes what fits."""
    from devices import DeploymentSpec, place
    from doppelchip.dropin import serve_args, unplaceable

    rc = main(["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct", "--chip", "rtx-4090"])
    err = capsys.readouterr().err
    fits = place(DeploymentSpec(model="llama-3.1-8b", quant="bf16", chip="rtx-4090",
                                engine="vllm")).max_context
    assert rc == exit_codes.USAGE and 4096 < fits < 131072
    assert "To serve at least one request with the model's max seq len (131072)" in err
    assert f"the estimated maximum model length is {fits}." in err
    for given in ("auto", "32k"):  # both fit: the longest that fits, or a shorter one
        vllm = build_parser("vllm").parse_args(
            ["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct", "--chip", "rtx-4090",
             "--max-model-len", given])
        serve = serve_args(translate(vllm)[0])
        assert unplaceable(serve, fit_model_len=vllm.max_model_len is None) == ""


def test_a_local_checkpoint_folder_is_read_from_its_config_json(tmp_path, capsys):
    """`vllm serve /models/NAME`: the folder's config.json names the model and weight format;
    the path is the served name, as in vLLM."""
    folder = tmp_path / "Llama-3.1-8B-Instruct-FP8"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "hidden_size": 4096, "max_position_embeddings": 131072, "num_attention_heads": 32,
        "num_hidden_layers": 32, "num_key_value_heads": 8, "vocab_size": 128256,
        "quantization_config": {"quant_method": "fp8"}}))
    a = serve_args(str(folder))
    assert (a.model, a.quant, a.served_model_name) == ("llama-3.1-8b", "fp8", [str(folder)])
    (folder / "config.json").write_text('{"num_hidden_layers": 3}')
    assert main(["vllm", "serve", str(folder)]) == exit_codes.USAGE
    assert "no catalogue model has this config.json's figures" in capsys.readouterr().err
