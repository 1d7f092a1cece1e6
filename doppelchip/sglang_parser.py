"""The `sglang serve` parser of `doppelchip sglang serve`: SGLang 0.5.23's every option, with
the strings, value shapes, types and choices SGLang's own parser gives it
(doppelchip/sglang_flags.py), so any manifest `sglang serve` (or `python -m
sglang.launch_server`) starts parses here too — and what SGLang refuses is argparse's error
here, unique prefixes included as argparse reads them: `--tp 2` is `--tp-size 2`, `--pp 2` is
ambiguous (`--pp-size`, `--pp-max-micro-batch-size`, `--pp-async-batch-depth`), as in SGLang.

Why a module of its own: the translation (doppelchip/cmd_sglang.py) reads a parsed command
line; building that parser from SGLang's option table is a separate, longer step.
"""

from __future__ import annotations

import argparse

from doppelchip.sglang_flags import ACCEPTED, REFUSED, SGLANG_OPTIONS, add_sglang_option
from doppelchip.vllm_parser import add_doppelchip_arguments

# the options cmd_sglang.translate reads, each with what it does here (its help)
TRANSLATED: dict[str, str] = {
    "--host": "address to bind (default: $DOPPELCHIP_HOST or 127.0.0.1, SGLang's)",
    "--port": "the HTTP port: SGLang's API, and /metrics with --enable-metrics (default "
              "30000); with --smg-grpc-mode, the gRPC port",
    "--grpc-port": "gRPC port: doppelchip.v1, SGLang's scheduler service "
                   "(sglang.grpc.scheduler) and health (default 50051); SGLang's native gRPC "
                   "server is not emulated",
    "--smg-grpc-mode": "serve SGLang's scheduler service for smg on --port, as SGLang does; "
                       "the HTTP API moves to --smg-http-sidecar-port",
    "--grpc-mode": "deprecated: --smg-grpc-mode",
    "--smg-http-sidecar-port": "with --smg-grpc-mode: the HTTP port (SGLang's sidecar with "
                               "/metrics; here SGLang's whole HTTP API), default --port + 1",
    "--log-level": "logging verbosity (default info)",
    "--api-key": "require 'Authorization: Bearer KEY' on every route but /health*, /ready* "
                 "and /metrics*",
    "--served-model-name": "the model name clients send (default: --model-path)",
    "--enable-metrics": "serve /metrics with SGLang's sglang: series",
    "--stream-interval": "send every N tokens of a stream in one message (default 1)",
    "--ssl-keyfile": "TLS private key (PEM), both ports",
    "--ssl-certfile": "TLS certificate chain (PEM), both ports",
    "--ssl-ca-certs": "CA certificates (PEM) client certificates are verified against",
    "--tp-size": "chips each layer is sharded over (default 1)",
    "--pp-size": "pipeline stages (default 1)",
    "--dp-size": "data-parallel replicas, each a full tp x pp copy (default 1)",
    "--ep-size": "chips a MoE model's experts are spread over; must equal --tp-size",
    "--attn-dp-size": "attention data-parallel groups inside the tp chips (DeepSeek's DP "
                      "attention)",
    "--enable-dp-attention": "deprecated: --dp-size N becomes --attn-dp-size N",
    "--nnodes": "nodes the tp x pp x dp chips span (the node-rank 0 pod emulates them all)",
    "--node-rank": "this node; above 0 the pod idles until SIGTERM, as SGLang's other nodes "
                   "serve no HTTP",
    "--context-length": "context length: 32k (32,000), 32Ki (32,768), 32768 (default: the "
                        "model's, capped by the KV cache)",
    "--mem-fraction-static": "share of each chip's memory for weights and the KV pool (default: "
                             "SGLang's formula by GPU memory)",
    "--max-running-requests": "most requests running at once (default: by the KV pool)",
    "--chunked-prefill-size": "prefill tokens per step (default by GPU memory); -1 turns "
                              "chunked prefill off",
    "--max-prefill-tokens": "accepted; the step budget is --chunked-prefill-size's",
    "--page-size": "KV block size in tokens (default 16 here)",
    "--kv-events-config": "SGLang's KV-event publisher JSON ({\"publisher\": \"zmq\", "
                          "\"endpoint\", \"replay_endpoint\", \"topic\", ...}): the pod "
                          "publishes its cache's events in SGLang's wire form",
    "--disable-radix-cache": "no prefix cache",
    "--dtype": "16-bit weights: the checkpoint's (auto), half/float16 or bfloat16",
    "--quantization": "SGLang's method name: fp8, modelopt_fp8, w8a8_fp8, modelopt_fp4, mxfp4, "
                      "awq, gptq, ...",
    "--kv-cache-dtype": "KV element type: auto, fp8_e4m3, fp8_e5m2, bf16, bfloat16",
    "--schedule-policy": "queue order: fcfs (default) or lpm (longest prefix match)",
    "--enable-priority-scheduling": "queue by request priority (needs "
                                    "--schedule-low-priority-values-first here)",
    "--schedule-low-priority-values-first": "with --enable-priority-scheduling: lower values "
                                            "first",
    "--disable-cuda-graph": "no CUDA graphs: the host launches every kernel",
    "--cuda-graph-backend-decode": "disabled: as --disable-cuda-graph",
    "--cpu-offload-gb": "GiB of weights per chip kept in host memory, read every step",
    "--random-seed": "accepted; each deployment is seeded already",
    "--is-embedding": "an embedding checkpoint only",
    "--enable-lora": "refused: LoRA adapters are not emulated on an SGLang pod",
    "--lora-paths": "refused: LoRA adapters are not emulated on an SGLang pod",
    "--speculative-algorithm": "EAGLE, EAGLE3 or NEXTN (the model's MTP layer); the "
                               "acceptance from SGLANG_SIMULATE_ACC_LEN (docs/SGLANG_SERVE.md)",
    "--speculative-draft-model-path": "the draft head's checkpoint (EAGLE, EAGLE3)",
    "--speculative-num-steps": "drafts per verification (default: SGLang's by architecture)",
    "--speculative-eagle-topk": "1 only (a chain); tree drafts are not emulated",
    "--speculative-num-draft-tokens": "with topk 1: steps + 1, as SGLang sets it",
    "--disaggregation-mode": "null only: SGLang's prefill/decode disaggregation is not emulated",
    "--config": "flags from a YAML file, as SGLang reads it (doppelchip/sglang_argv.py)",
}


def add_serve_arguments(p: argparse.ArgumentParser) -> set[str]:
    """Every `sglang serve` option on `p`; the names (first flags) of the options left
    unemulated, which `translate` warns about when given."""
    add_sglang_option(p, "--model-path", required=True, metavar="REPO",
                      help="Hugging Face repository id, catalogue model, or local checkpoint "
                      "folder (`sglang serve REPO` too)")
    g = p.add_argument_group("SGLang's flags translated (docs/SGLANG_SERVE.md)")
    for name, text in TRANSLATED.items():
        add_sglang_option(g, name, help=text)
    add_doppelchip_arguments(p, "SGLang")
    quiet = p.add_argument_group("accepted, no effect here (weights are not loaded)")
    for name in ACCEPTED:
        add_sglang_option(quiet, name, help=argparse.SUPPRESS)
    rest = p.add_argument_group("SGLang's other flags: accepted, each named in a warning")
    unemulated: set[str] = set()
    taken = {"--model-path", *TRANSLATED, *ACCEPTED}
    for option in SGLANG_OPTIONS:
        if option.name in taken:
            continue
        refused = REFUSED.get(option.name)
        add_sglang_option(rest, option.name, help=f"refused: {refused}" if refused
                          else argparse.SUPPRESS)
        if not refused:
            unemulated.add(option.name)
    return unemulated

