"""The deployment and workload flags shared by several commands: `add_deployment_args`
(simulate; serve's pod mode; load's `sim:` target), with its failure-injection group
(`fault_flags.py`), `add_workload_args` (simulate, load, plan) and `add_traffic_args`
(simulate, plan: traffic over time).

Why it exists apart from `cmd_simulate`: these groups are parsing only, used by four commands;
each command's own flags and its run stay in its `cmd_*.py`.
"""

from __future__ import annotations

import argparse
import math

from doppelchip.fault_flags import add_fault_args

SELECTING = ("config", "deployment", "chip", "engine", "model", "quant")


def add_deployment_args(p: argparse.ArgumentParser, verb: str = "simulate",
                        with_config: bool = True) -> tuple[tuple[str, str], ...]:
    """The deployment flags shared by simulate, serve's pod mode (and the load generator's
    sim: target). Returns (dest, flag) of each one that shapes the deployment rather than
    selects it (SELECTING): `serve` refuses those without pod mode instead of ignoring them."""
    first = len(p._actions)
    g = p.add_argument_group("deployment (a fleet file's deployment, or flags as in estimate)")
    if with_config:
        g.add_argument("--config", metavar="FILE",
                       help="fleet TOML file to take a deployment from")
    g.add_argument("--deployment", metavar="NAME",
                   help=f"deployment of --config (or of the built-in fleet) to {verb}")
    g.add_argument("--chip", help="chip id, e.g. h100-sxm (see `doppelchip devices`)")
    g.add_argument("--engine", help="engine id, e.g. vllm, sglang, llama.cpp, groq")
    g.add_argument("--model", help="model id, e.g. llama-3.1-8b")
    g.add_argument("--quant", help="weight format id, e.g. bf16, fp8, q4_k_m")
    g.add_argument("--count", type=int, help="total chips (default: tp × pp, or computed)")
    g.add_argument("--tp", type=int, help="tensor-parallel degree")
    g.add_argument("--pp", type=int, help="pipeline-parallel degree")
    g.add_argument("--ep", type=int,
                   help="expert-parallel degree (MoE): experts over ep of a stage's tp × dp "
                   "chips; without --tp, attention runs data parallel (count = tp × pp × dp)")
    g.add_argument("--kv-cache-dtype", choices=["auto", "fp8", "bf16", "f16"],
                   help="KV cache element type (auto: the quantisation's; the others: "
                   "devices.placed.KV_DTYPE_BYTES)")
    g.add_argument("--speculative-config", metavar="JSON",
                   help="vLLM's speculative_config JSON plus acceptance_rate, e.g. "
                   '\'{"method": "eagle3", "num_speculative_tokens": 3, '
                   '"acceptance_rate": 0.7}\' (or SGLang\'s simulated acceptance_length, '
                   "acceptance_method, and an EAGLE tree's eagle_topk, num_draft_tokens: "
                   "devices/speculative.py)")
    g.add_argument("--n-gpu-layers", type=int, help="llama.cpp: layers on the GPU")
    g.add_argument("--built-for", help="TensorRT-LLM: GPU architecture the engine was built for")
    g.add_argument("--max-model-len", type=int, help="context length (default: model's, capped)")
    g.add_argument("--max-num-seqs", type=int, help="sequence cap per step (engine default)")
    g.add_argument("--max-num-active-seqs", type=int, metavar="N",
                   help="as vLLM's flag: at most N requests running at once, while "
                   "--max-num-seqs still sizes memory (default: --max-num-seqs)")
    g.add_argument("--max-num-batched-tokens", type=int, help="token budget per step")
    g.add_argument("--long-prefill-token-threshold", type=int, metavar="N",
                   help="as vLLM's flag: while others run or wait, a request gets at most N "
                   "tokens a step (0: off, the default)")
    g.add_argument("--long-prefill-token-threshold-adaptive", action="store_true",
                   default=None, help="as vLLM's flag: the cap is at least the step budget's "
                   "fair share")
    g.add_argument("--max-num-inflight-kv-loads", type=int, metavar="N",
                   help="as vLLM 0.34's flag: at most N requests hold blocks for async KV "
                   "loads (P/D pulls, the CPU tier), and P/D pulls may start while every "
                   "seat is taken (default: no cap, pulls wait for a seat)")
    g.add_argument("--cache-aware-admission-window", type=int, metavar="N",
                   help="as vLLM 0.34's flag: among the first N waiting requests, those with "
                   "the deepest cached prefix are admitted first (FCFS with prefix caching; "
                   "0, the default, is off)")
    g.add_argument("--cache-aware-admission-threshold", type=float, metavar="F",
                   help="as vLLM 0.34's flag: the KV usage from which the window applies "
                   "(default 0.5)")
    g.add_argument("--max-logprobs", type=int, metavar="N",
                   help="as vLLM's flag: the most (prompt) logprobs a request may ask for "
                   "(default 20; -1: the whole vocabulary)")
    g.add_argument("--max-num-queued-reqs", type=int, metavar="N",
                   help="as vLLM's flag: refuse a request (UNAVAILABLE, HTTP 503) while N are "
                   "unfinished (default: no limit)")
    g.add_argument("--max-num-queued-tokens", type=int, metavar="N",
                   help="as vLLM's flag: refuse a request (UNAVAILABLE, HTTP 503) while the "
                   "prompts not yet past their prefill hold N tokens (default: no limit)")
    g.add_argument("--block-size", type=int, help="KV block size in tokens (default: the "
                   "engine's on the chip, engines.toml kv_block_size: vLLM 0.34.0's 64, 16 "
                   "on AMD; TensorRT-LLM's 32; 16 elsewhere)")
    g.add_argument("--num-gpu-blocks-override", type=int, dest="kv_blocks", metavar="N",
                   help="as vLLM's flag: a KV pool of N blocks, whatever fits")
    g.add_argument("--cpu-offload-gb", type=float, metavar="GIB",
                   help="as vLLM's and SGLang's flag: GiB of weights per chip kept in host "
                   "memory and read over the host link every step")
    g.add_argument("--kv-cache-memory-bytes", type=int, metavar="BYTES",
                   help="as vLLM's flag: the KV cache per chip, whatever the memory share")
    g.add_argument("--gpu-memory-utilization", type=float, metavar="FRACTION",
                   help="the engine's memory share, (0, 1]: vLLM's --gpu-memory-utilization, "
                   "SGLang's --mem-fraction-static, TensorRT-LLM's free_gpu_memory_fraction "
                   "(default: the engine's, e.g. vLLM 0.92)")
    g.add_argument("--enforce-eager", action="store_true", default=None,
                   help="as vLLM's flag: no CUDA/HIP graphs, the host launches every kernel "
                   "(engines that replay graphs only)")
    g.add_argument("--policy", choices=["fcfs", "priority", "lpm"], help="queue policy")
    g.add_argument("--prefix-cache", choices=["on", "off"], help="radix prefix cache on/off")
    g.add_argument("--chunked-prefill", choices=["on", "off"],
                   help="chunked prefill on/off (default: on where the engine has a step "
                   "budget and the model keeps a KV cache; off for an encoder)")
    g.add_argument("--kv-layout", choices=["paged", "contiguous"],
                   help="paged blocks, or the pre-vLLM contiguous max-length reservation")
    g.add_argument("--batching", choices=["continuous", "static"], help="batching baseline")
    g.add_argument("--output-len-mean", type=float,
                   help="mean output length when EOS is sampled (default 128)")
    g.add_argument("--cold", action="store_true", help="start cold: pay the build/compile time")
    g.add_argument("--jump-forward", choices=["on", "off"],
                   help="structured output: append grammar-forced tokens without decoding "
                   "them (default: the engine's; on for sglang)")
    # ---- request limits (issue 14; docs/OPERATIONS.md) -------------------------------------
    g.add_argument("--max-prompt-bytes", type=int, metavar="BYTES",
                   help="largest prompt text, checked before tokenizing (default 2000000)")
    g.add_argument("--max-stop-strings", type=int, metavar="N",
                   help="stop strings per request (default 256)")
    g.add_argument("--max-stop-bytes", type=int, metavar="BYTES",
                   help="longest stop string (default 1024)")
    g.add_argument("--max-grammar-bytes", type=int, metavar="BYTES",
                   help="largest constraint: regex, JSON schema or grammar (default 65536)")
    g.add_argument("--max-grammar-depth", type=int, metavar="N",
                   help="deepest nesting a constraint may have (default 100)")
    # ---- end request limits ----------------------------------------------------------------
    # --- KV events (issue 13) ---
    g.add_argument("--kv-events-config", metavar="JSON",
                   help="vLLM's KV-cache events config, e.g. "
                   '\'{"enable_kv_cache_events": true, "publisher": "zmq", '
                   '"replay_endpoint": "tcp://*:5558"}\' (ZeroMQ on 127.0.0.1:5557 by '
                   "default; docs/KV_EVENTS.md)")
    g.add_argument("--prefix-caching-hash-algo",
                   choices=["sha256", "sha256_cbor", "xxhash", "xxhash_cbor"],
                   help="vLLM's block hash of the prefix cache and its KV events "
                   "(default sha256)")
    # --- LoRA (issue 13): vLLM's flags (docs/LORA.md) ---
    g.add_argument("--enable-lora", action="store_true", default=None,
                   help="serve LoRA adapters (selected by a request's model name)")
    g.add_argument("--max-loras", type=int, help="LoRA adapters one batch may run (default 1)")
    g.add_argument("--max-lora-rank", type=int,
                   help="largest adapter rank (default 16; 1, 8, 16, 32, 64, 128, 256, 320, 512)")
    g.add_argument("--max-cpu-loras", type=int,
                   help="adapters kept in host memory, LRU (default: --max-loras)")
    g.add_argument("--lora-modules", nargs="+", metavar="NAME=PATH|JSON",
                   help='adapters at start-up: name=path or \'{"name": ..., "path": ..., '
                   '"base_model_name": ..., "rank": ...}\' (the path is recorded, not read)')
    # --- P/D and sleep mode (issue 13) ---
    g.add_argument("--kv-transfer-config", metavar="JSON",
                   help="vLLM's KV transfer config for disaggregated prefill/decode, e.g. "
                   '\'{"kv_connector":"NixlConnector","kv_role":"kv_both"}\' '
                   '(kv_connector_extra_config.link: a link id; docs/PD.md)')
    g.add_argument("--kv-offloading-size", type=float, metavar="GIB",
                   help="vLLM's CPU KV offloading: GiB of host memory (all chips) kept as a "
                   "second prefix-cache tier, loaded back over the host link "
                   "(docs/KV_OFFLOAD.md)")
    g.add_argument("--kv-offloading-backend", choices=("native", "lmcache"),
                   help="native (vLLM's OffloadingConnector; default) or lmcache (not "
                   "emulated: it needs an LMCache server)")
    g.add_argument("--hf-overrides", metavar="JSON",
                   help="vLLM's config.json overrides; emulated: is_matryoshka and "
                   "matryoshka_dimensions of an embedding model, and architectures, "
                   "classifier_from_token, method and is_original_qwen3_reranker of a "
                   "generative checkpoint served as a classifier (docs/EMBEDDINGS.md)")
    g.add_argument("--runner", choices=("auto", "generate", "pooling", "draft"),
                   help="vLLM's --runner: pooling serves the model's pooled hidden states "
                   "(default auto: what the checkpoint and --convert say)")
    g.add_argument("--convert", choices=("auto", "none", "embed", "classify"),
                   help="vLLM's --convert: a generative checkpoint served as an embedding "
                   "model or a classifier (classify needs --hf-overrides classifier_from_token "
                   "and method; docs/EMBEDDINGS.md)")
    g.add_argument("--chat-template", metavar="FILE|TEMPLATE",
                   help="vLLM's --chat-template, for a cross-encoder's /score and /rerank: "
                   "each (query, document) pair rendered through it, e.g. examples/pooling/"
                   "score/template/qwen3_reranker.jinja (chat requests use the tokenizer's)")
    g.add_argument("--pooler-config", metavar="JSON",
                   help="vLLM's --pooler-config for a pooling model; emulated: pooling_type / "
                   "seq_pooling_type (MEAN or CLS on a decoder turns off prefix caching and "
                   "chunked prefill), use_activation and dimensions (request defaults), "
                   "logit_mean and logit_sigma (a classifier's calibration), task "
                   "(docs/EMBEDDINGS.md)")
    g.add_argument("--enable-sleep-mode", action="store_true",
                   help="as vLLM's flag: sleep mode is always available; with it, vLLM "
                   "0.34.0's /checkpoint/prepare, /checkpoint/restore and /checkpoint/status")
    if verb.startswith("serve"):
        g.add_argument("--checkpoint-prepare-on-startup", action="store_true",
                       help="as vLLM 0.34.0's flag (with --enable-sleep-mode): the engine "
                       "starts prepared for a process checkpoint, paused with its KV cache "
                       "released, until POST /checkpoint/restore")
        g.add_argument("--enable-fault-tolerance", action="store_true", default=None,
                       help="as vLLM 0.34.0's flag (a pod of one engine): an engine fault "
                       "(--fault-crash) aborts the requests and waits for POST "
                       "/v1/fault_tolerance/apply (retry, scale_down) instead of ending the "
                       "engine; GET /v1/fault_tolerance/status")
        g.add_argument("--fault-tolerance-config", metavar="JSON",
                       help="as vLLM's: '{\"engine_recovery_timeout_sec\": 120}' (emulated "
                       "seconds; enables fault tolerance)")
    # --- vLLM's observability flags (docs/OBSERVABILITY.md) ---
    g.add_argument("--kv-cache-metrics", action="store_true", default=None,
                   help="as vLLM's flag: export the KV residency histograms "
                   "(vllm:kv_block_{lifetime,idle_before_evict,reuse_gap}_seconds) of a sample "
                   "of the blocks, on the emulated timeline")
    g.add_argument("--kv-cache-metrics-sample", type=float, metavar="FRACTION",
                   help="share of the KV blocks --kv-cache-metrics follows, (0, 1] (default "
                   "0.01, vLLM's)")
    g.add_argument("--per-request-spec-decode-metrics", choices=("none", "summary", "detailed"),
                   help="as vLLM's flag (with --speculative-config): each answer's "
                   "metrics.speculative_decoding, the request's acceptance histogram; detailed "
                   "adds each verification step's counts (default none)")
    add_fault_args(p)
    return tuple((a.dest, a.option_strings[0]) for a in p._actions[first:]
                 if a.dest not in SELECTING)


class _GivenRate(argparse.Action):
    """--rate that also records it was given (`rate_given`): --rate-shape refuses an explicit
    rate, not the default one."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        setattr(namespace, self.dest, values)
        namespace.rate_given = True


def add_workload_args(p: argparse.ArgumentParser, default_rate: float = math.inf) -> None:
    """The workload flags of simulate and load; `default_rate` is --rate's default (inf: every
    request at t=0, load's default; simulate passes SIMULATE_DEFAULT_RATE)."""
    g = p.add_argument_group("workload")
    g.add_argument("--workload", default="random",
                   choices=["random", "shared-prefix", "multi-turn", "structured", "mix",
                            "trace"],
                   help="workload kind (structured: JSON-schema output with long fixed keys; "
                   "mix: --mix weights; trace: replay --trace FILE)")
    g.add_argument("--mix", default="random=1", metavar="KIND=W,...",
                   help="mix: weights of the workloads to interleave, e.g. "
                   "random=0.6,shared-prefix=0.3,structured=0.1")
    g.add_argument("--trace", metavar="FILE",
                   help="JSONL trace to replay: timestamp, prompt_token_ids | prompt | "
                   "input_length, max_tokens per line (see clients/trace.py)")
    g.add_argument("--isl", type=int, default=128, help="input (user message) tokens")
    g.add_argument("--osl", type=int, default=128, help="output tokens (max_tokens)")
    g.add_argument("--num-requests", type=int, default=None,
                   help="requests (conversations for multi-turn); default 100")
    g.add_argument("--duration", type=float, default=None,
                   help="seconds of arrivals at --rate (instead of --num-requests)")
    rate_help = ("arrivals per second (inf: all at once; the default)" if math.isinf(default_rate)
                 else f"arrivals per second, --arrival poisson by default (default "
                 f"{default_rate:g}; inf: all at once)")
    g.add_argument("--rate", type=float, default=default_rate, help=rate_help, action=_GivenRate)
    g.add_argument("--arrival", default="poisson", choices=["poisson", "constant", "gamma"],
                   help="arrival process for a finite --rate")
    g.add_argument("--burstiness", type=float, default=1.0,
                   help="gamma arrivals: shape of the gaps (< 1 burstier than Poisson)")
    g.add_argument("--ramp-up", type=float, default=0.0, metavar="SECONDS",
                   help="the rate grows linearly from 0 to --rate over this many seconds")
    g.add_argument("--length-dist", default="fixed",
                   choices=["fixed", "uniform", "normal", "histogram"],
                   help="input/output lengths around --isl/--osl (default fixed), or drawn "
                   "from --length-file")
    g.add_argument("--length-file", metavar="FILE",
                   help="histogram of lengths: CSV rows input,output,weight")
    g.add_argument("--length-spread", type=float, default=0.0,
                   help="uniform: ± this fraction of the mean; normal: std as this fraction")
    g.add_argument("--seed", type=int, default=0, help="workload seed")
    g.add_argument("--ignore-eos", action="store_true",
                   help="generate exactly --osl tokens (otherwise EOS is sampled)")
    g.add_argument("--system-prompt-len", type=int, default=1024,
                   help="shared-prefix: tokens of each shared system prompt")
    g.add_argument("--num-prefixes", type=int, default=4, help="shared-prefix: groups")
    g.add_argument("--users-per-prefix", type=int, default=0,
                   help="shared-prefix: users per group (0: spread evenly)")
    g.add_argument("--turns", type=int, default=3, help="multi-turn: turns per conversation")
    g.add_argument("--think-time", type=float, default=0.0,
                   help="multi-turn: seconds between a reply and the next user turn")


def add_traffic_args(g: argparse._ArgumentGroup) -> None:
    """Traffic over time (issue 16): a time-varying rate and a public trace's format, into
    `g` (simulate's autoscaling group; plan's workload)."""
    g.add_argument("--rate-shape", metavar="SHAPE",
                   help="time-varying arrivals (non-homogeneous Poisson) instead of --rate: "
                   "ramp:from=1,to=20,over=600 | diurnal:period=3600,min=2,max=20 | "
                   "burst:low=1,high=20,on=10,off=50 | piecewise:0=1,300=20,600=1 "
                   "(with --duration and/or --num-requests)")
    g.add_argument("--trace-format", default="auto",
                   choices=["auto", "jsonl", "azure", "burstgpt", "mooncake"],
                   help="format of --trace (default: sniffed from the file)")
