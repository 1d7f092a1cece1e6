"""`doppelchip vllm serve` takes vLLM 0.33.0's whole command line: every option of vLLM's
own parser (doppelchip/vllm_serve_flags.json, dumped from it by scripts/vllm_serve_flags.py)
parses with vLLM's strings and value shapes, and each is translated, passed through, accepted
silently (loading, logging), refused with its reason, or accepted with a warning naming it —
never an argparse error for a flag vLLM takes, and still one for a flag vLLM dropped."""

from __future__ import annotations

import argparse

import pytest

from doppelchip import exit_codes
from doppelchip.cli import build_parser, main
from doppelchip.cmd_vllm import translate, understood
from doppelchip.vllm_argv import vllm_argv
from doppelchip.vllm_flags import (
    ACCEPTED,
    BY_FLAG,
    PASSTHROUGH,
    POOLING,
    REFUSED,
    VLLM_OPTIONS,
    VLLM_VERSION,
    VllmOption,
)

REPO = "meta-llama/Llama-3.1-8B-Instruct"
# translated by cmd_vllm.translate itself (their values are checked there)
TRANSLATED = {"--model", "--config", "--host", "--port", "--grpc-port", "--grpc", "--log-level",
              "--tensor-parallel-size", "--pipeline-parallel-size", "--dtype", "--quantization",
              "--gpu-memory-utilization", "--kv-cache-memory-bytes", "--max-model-len",
              "--max-num-batched-tokens", "--enable-prefix-caching", "--enable-chunked-prefill",
              "--scheduling-policy", "--enforce-eager", "--seed", "--shutdown-timeout",
              # which data-parallel ranks a pod runs: tests/cli/test_cli_vllm_dp.py
              "--data-parallel-rank", "--data-parallel-start-rank", "--data-parallel-size-local",
              "--nnodes", "--node-rank", "--data-parallel-external-lb",
              "--data-parallel-hybrid-lb", "--headless",
              # one pod per local rank behind a supervisor: tests/cli/test_cli_vllm_multiport.py
              "--data-parallel-multi-port-external-lb", "--data-parallel-supervisor-port",
              "--dp-supervisor-probe-interval-s", "--dp-supervisor-probe-timeout-s",
              "--dp-supervisor-probe-failure-threshold",
              # --speculative-config's shorthands: test_the_spec_shorthands_fill_the_config
              "--spec-method", "--spec-model", "--spec-tokens"}
# passed through, on an external data-parallel rank only (vLLM 0.34.0's fault tolerance)
EXTERNAL_RANK = {"--enable-fault-tolerance", "--fault-tolerance-config"}
# a value each passed-through option's `doppelchip serve` flag accepts
PASS_VALUES = {"--fault-tolerance-config": '{"engine_recovery_timeout_sec": 60}',
               "--kv-cache-dtype": "fp8", "--speculative-config": '{"method": "ngram"}',
               "--kv-events-config": '{"enable_kv_cache_events": true}',
               "--lora-modules": "a=b", "--prefix-caching-hash-algo": "xxhash",
               "--max-lora-rank": "16", "--kv-transfer-config": '{"kv_role": "kv_both"}',
               "--profiler-config": '{"profiler": "torch", "torch_profiler_dir": "/tmp"}',
               "--kv-cache-metrics-sample": "0.5", "--custom-histogram-buckets": "{}",
               "--hf-overrides": '{"is_matryoshka": true}',
               "--pooler-config": '{"pooling_type": "MEAN"}'}


CHAT_TEMPLATE_WARNING = ("--chat-template renders a cross-encoder's /score and /rerank pairs "
                         "only; chat requests render with the packaged tokenizer's template")


PARSER = build_parser("vllm")
SERVE = PARSER._subparsers._group_actions[0].choices["vllm"]._subparsers._group_actions[0] \
    .choices["serve"]
DEST = {s: a.dest for a in SERVE._actions for s in a.option_strings}


def parse(*argv: str) -> argparse.Namespace:
    return PARSER.parse_args(vllm_argv(["vllm", "serve", *argv], set()))


def given(option: VllmOption, value: str = "1") -> list[str]:
    """`option` on a command line: a switch as itself, else with a value of its shape."""
    if option.shape == "switch":
        return [option.name]
    return [option.name, option.choices[0] if option.choices else value]


def test_the_table_is_vllms_whole_command_line():
    assert VLLM_VERSION == "0.34.0" and len(VLLM_OPTIONS) > 300
    # the lists name vLLM's own options, each once (a typo would name nothing)
    named = [*TRANSLATED, *(n for n, _ in PASSTHROUGH), *ACCEPTED, *REFUSED, *POOLING]
    assert len(named) == len(set(named))
    assert all(n in BY_FLAG and BY_FLAG[n].name == n for n in named), \
        [n for n in named if n not in BY_FLAG or BY_FLAG[n].name != n]


@pytest.mark.parametrize("option", VLLM_OPTIONS, ids=[o.name for o in VLLM_OPTIONS])
def test_every_vllm_option_parses_with_every_string_vllm_gives_it(option):
    if option.name == "--config":  # a YAML file, read before parsing (test_cli_vllm_serve)
        return
    for flag in option.flags:
        argv = [REPO, flag] if option.shape == "switch" else [REPO, flag,
                                                             *given(option)[1:]]
        value = getattr(parse(*argv), DEST[flag])
        if option.shape == "switch":
            assert value is (flag not in option.negative), (flag, value)
        else:
            assert value not in (None, False), (flag, value)


def test_each_option_is_translated_passed_accepted_refused_or_warned():
    for option in VLLM_OPTIONS:
        if option.name in TRANSLATED:
            continue
        argv = given(option, PASS_VALUES.get(option.name, "1"))
        if option.name in EXTERNAL_RANK:  # (refused without one: test_cli_vllm_dp.py)
            argv = [*argv, "--data-parallel-rank", "0"]
        if option.name in REFUSED:
            with pytest.raises(ValueError, match=option.name):
                translate(parse(REPO, *argv))
            continue
        serve, warnings = translate(parse(REPO, *argv))
        warned = [w for w in warnings if w.startswith(option.name + " ")]
        if option.name in POOLING:
            assert not warned  # auto / generate: a generative model, as served
        elif option.name == "--chat-template":  # passed, but a generative model's chat
            assert warned == [CHAT_TEMPLATE_WARNING] and option.name in serve  # ignores it
        elif option.name == "--pooler-config":  # passed; a generative model ignores it
            assert warned == ["--pooler-config is ignored: the model is served by the generate "
                              "runner"] and option.name in serve
        elif option.name in dict(PASSTHROUGH):
            assert option.name in serve, option.name
            assert not warned or warned == [  # (vLLM's own warning: a config enables it)
                "--fault-tolerance-config was passed. Fault tolerance is being "
                "automatically enabled."], option.name
        elif option.name in ACCEPTED:
            assert not warned and option.name not in serve, option.name
        elif understood(option.name, parse(REPO, *argv)):  # its whole effect is emulated
            assert not warned, option.name
        else:
            assert warned == [f"{option.name} is accepted but not emulated: it changes "
                              "nothing here"], (option.name, warnings)


def test_vllms_inverse_switches_mean_what_they_mean_in_vllm():
    serve_off = translate(parse(REPO, "--disable-prefix-caching"))[0]
    assert serve_off[serve_off.index("--prefix-cache") + 1] == "off"
    hidden = translate(parse(REPO, "--no-enable-prefix-caching"))[0]
    assert hidden[hidden.index("--prefix-cache") + 1] == "off"
    on = translate(parse(REPO, "--enable-prefix-caching"))[0]
    assert on[on.index("--prefix-cache") + 1] == "on"
    for off in ("--disable-chunked-prefill", "--no-enable-chunked-prefill"):
        argv = translate(parse(REPO, off))[0]
        assert argv[argv.index("--chunked-prefill") + 1] == "off"
    assert "--chunked-prefill" not in translate(parse(REPO))[0]  # (the default decides)
    # logging switches are silent either way; turning an unemulated one off asks nothing
    assert translate(parse(REPO, "--disable-log-requests", "--disable-log-outputs"))[1] == []
    assert translate(parse(REPO, "-ep"))[0].count("--enable-expert-parallel") == 1
    assert "--enable-expert-parallel" not in translate(parse(REPO, "--disable-expert-parallel"))[0]


def test_vllms_argument_rewrites_optimization_level_and_dotted_json():
    args = parse(REPO, "-O3", "-cc.mode=3", "-cc.cudagraph_mode", "FULL")
    assert args.optimization_level == "3"
    assert args.compilation_config == '{"mode": 3, "cudagraph_mode": "FULL"}'
    # -O3 is vLLM's default O2 (graphs, emulated); the compilation config's mode is not
    assert [w.split()[0] for w in translate(args)[1]] == ["--compilation-config"]


@pytest.mark.parametrize("argv, eager, warned", [
    (["-O0"], True, []),  # vLLM's O0: "no compilation, no cudagraphs"
    (["-O", "2"], False, []),
    (["-O1"], False, ["--optimization-level"]),  # piecewise graphs only: not emulated
    (["-cc.cudagraph_mode", "NONE"], True, []),
    (["-cc", '{"cudagraph_mode": "NONE", "mode": 0}'], True, ["--compilation-config"]),
    (["-cc.cudagraph_mode", "FULL"], False, ["--compilation-config"]),
])
def test_running_without_graphs_is_enforce_eager(argv, eager, warned):
    out, warnings = translate(parse(REPO, *argv))
    assert ("--enforce-eager" in out) is eager
    assert [w.split()[0] for w in warnings] == warned


@pytest.mark.parametrize("argv, says", [
    (["--convert", "classify"], "--convert classify: Llama 3.1 8B's checkpoint has no "
                                "classifier (score) weights"),
    (["--runner", "generate", "--convert", "embed"], "--convert embed needs --runner pooling"),
    (["--runner", "pooling", "--convert", "none"], "serve it with --convert embed or classify"),
    (["--hf-overrides", '{"architectures": ["LlamaForSequenceClassification"]}'],
     "has no classifier (score) weights"),
    (["--hf-overrides", '{"architectures": ["LlamaForSequenceClassification"], '
      '"classifier_from_token": ["a", "b", "c"], "method": "from_2_way_softmax"}'],
     "from_2_way_softmax takes 2 classifier_from_token (got 3)"),
    (["--runner", "generate", "--hf-overrides",
      '{"architectures": ["LlamaForSequenceClassification"]}'],
     "--runner generate: Llama 3.1 8B is served as a pooling model"),
    (["--runner", "draft"], "--runner draft: a speculative draft model's runner"),
    (["--headless", "--api-server-count", "2"], "cannot be used with --headless"),
    (["--grpc", "--grpc-port", "50052"], "mutually exclusive"),
])
def test_what_vllm_would_serve_differently_is_refused(argv, says):
    # (`main` prints it and exits 2 before anything starts: test_cli_vllm_serve.py)
    with pytest.raises(ValueError) as refused:
        translate(parse(REPO, *argv))
    assert says in str(refused.value)


def test_runner_generate_and_convert_none_serve_as_usual():
    serve, warnings = translate(parse(REPO, "--runner", "generate", "--convert", "none"))
    assert warnings == [] and "--model" in serve


@pytest.mark.parametrize("argv", [(), ("--runner", "pooling"), ("--convert", "embed"),
                                  ("--runner", "pooling", "--convert", "embed")])
def test_an_embedding_checkpoint_is_served_as_vllm_serves_it(argv):
    serve, warnings = translate(parse("Qwen/Qwen3-Embedding-8B", *argv))
    assert warnings == []
    assert serve[serve.index("--model") + 1] == "qwen3-embedding-8b"


def test_hf_overrides_pass_through_and_name_the_keys_they_ignore():
    serve, warnings = translate(parse("Qwen/Qwen3-Embedding-8B", "--hf-overrides",
                                      '{"is_matryoshka": true, "rope_theta": 5}'))
    assert serve[serve.index("--hf-overrides") + 1] == '{"is_matryoshka": true, "rope_theta": 5}'
    assert warnings == ["--hf-overrides: rope_theta accepted but not emulated (only "
                        "is_matryoshka, matryoshka_dimensions, architectures, "
                        "classifier_from_token, method, is_original_qwen3_reranker, "
                        "use_sep_token change anything here)"]
    for bad in ("[1]", "{", '{"matryoshka_dimensions": [0]}', '{"is_matryoshka": 1}',
                '{"architectures": "LlamaForSequenceClassification"}',
                '{"classifier_from_token": [1, 2]}', '{"method": "from_3_way_softmax"}',
                '{"use_sep_token": "yes"}'):
        with pytest.raises(ValueError, match="--hf-overrides"):
            translate(parse(REPO, "--hf-overrides", bad))


@pytest.mark.parametrize("repo, argv, says", [
    ("Qwen/Qwen3-Embedding-8B", ("--runner", "generate"),
     "--runner generate: Qwen3-Embedding-8B is served as a pooling model"),
    ("Qwen/Qwen3-Embedding-8B", ("--convert", "classify"),
     "--convert classify: Qwen3-Embedding-8B is an embedding model"),
    ("BAAI/bge-reranker-v2-m3", ("--convert", "embed"),
     "--convert embed: bge-reranker-v2-m3 is a classifier; serve it with --convert classify"),
    ("BAAI/bge-reranker-v2-m3", ("--runner", "generate"),
     "--runner generate: bge-reranker-v2-m3 is served as a pooling"),
])
def test_a_pooling_checkpoint_stays_what_it_is(repo, argv, says):
    with pytest.raises(ValueError) as refused:
        translate(parse(repo, *argv))
    assert says in str(refused.value)


@pytest.mark.parametrize("repo, model, argv", [
    ("BAAI/bge-m3", "bge-m3", ()), ("BAAI/bge-m3", "bge-m3", ("--convert", "embed")),
    ("BAAI/bge-reranker-v2-m3", "bge-reranker-v2-m3", ()),
    ("BAAI/bge-reranker-v2-m3", "bge-reranker-v2-m3", ("--convert", "classify")),
    ("sentence-transformers/all-MiniLM-L6-v2", "all-minilm-l6-v2", ("--runner", "pooling")),
])
def test_an_encoder_checkpoint_is_served_in_float16(repo, model, argv):
    serve, warnings = translate(parse(repo, *argv))
    assert warnings == []
    assert [serve[serve.index(f) + 1] for f in ("--model", "--quant")] == [model, "f16"]


RERANKER = ('{"architectures": ["Qwen3ForSequenceClassification"], '
            '"classifier_from_token": ["no", "yes"], "is_original_qwen3_reranker": true}')


def test_vllm_docs_qwen3_reranker_command_serves_a_cross_encoder():
    template = "examples/pooling/score/template/qwen3_reranker.jinja"
    serve, warnings = translate(parse("Qwen/Qwen3-Reranker-0.6B", "--hf-overrides", RERANKER,
                                      "--chat-template", template))
    assert warnings == []
    assert serve[serve.index("--model") + 1] == "qwen3-reranker-0.6b"
    assert serve[serve.index("--hf-overrides") + 1] == RERANKER
    assert serve[serve.index("--chat-template") + 1] == template
    # served as published (no overrides): a language model, and the template is for scoring
    serve, warnings = translate(parse("Qwen/Qwen3-Reranker-0.6B", "--chat-template", template))
    assert warnings == [CHAT_TEMPLATE_WARNING]


@pytest.mark.parametrize("argv", [("--runner", "pooling"), ("--convert", "embed"),
                                  ("--runner", "pooling", "--convert", "embed")])
def test_a_generative_checkpoint_converts_into_an_embedding_model(argv):
    serve, warnings = translate(parse(REPO, *argv))
    assert warnings == []
    assert [serve[serve.index(f) + 1] for f in ("--runner", "--convert")
            if f in serve] == [v for f, v in zip(argv[::2], argv[1::2], strict=True)]


@pytest.mark.parametrize("flag", ["--swap-space", "--num-scheduler-steps", "--task",
                                  "--max-seq-len-to-capture", "--preemption-mode"])
def test_flags_vllm_dropped_before_0_33_are_still_argparse_errors(capsys, flag):
    with pytest.raises(SystemExit) as exit_:
        main(["vllm", "serve", REPO, flag, "1"])
    assert exit_.value.code == exit_codes.USAGE
    assert f"unrecognized arguments: {flag} 1" in capsys.readouterr().err


def test_grpc_serves_grpc_on_port_and_shutdown_timeout_is_the_drain():
    serve = translate(parse(REPO, "--grpc", "--port", "20001", "--shutdown-timeout", "30"))[0]
    assert serve[serve.index("--port") + 1] == "20001"  # doppelchip serve's gRPC port
    assert serve[serve.index("--http-port") + 1] == "0"  # the HTTP front end: a free port
    assert serve[serve.index("--drain-grace") + 1] == "30"
    plain = translate(parse(REPO, "--port", "8001"))[0]
    assert plain[plain.index("--port") + 1] == "50051"
    assert plain[plain.index("--http-port") + 1] == "8001"
    assert plain[plain.index("--drain-grace") + 1] == "0"  # vLLM's default: abort at once


def test_pooler_config_passes_through_and_names_what_it_ignores():
    config = '{"pooling_type": "MEAN", "max_embed_len": 9000}'
    serve, warnings = translate(parse("Qwen/Qwen3-Embedding-8B", "--pooler-config", config))
    assert serve[serve.index("--pooler-config") + 1] == config
    assert warnings == ["--pooler-config: max_embed_len accepted but not emulated (only task, "
                        "pooling_type, seq_pooling_type, use_activation, dimensions, "
                        "logit_mean, logit_sigma change anything here)"]
    _, warnings = translate(parse(REPO, "--pooler-config", config))
    assert warnings == ["--pooler-config is ignored: the model is served by the generate runner"]
    with pytest.raises(ValueError, match="Unsupported task: 'embed'"):
        translate(parse("BAAI/bge-reranker-v2-m3", "--pooler-config", '{"task": "embed"}'))
