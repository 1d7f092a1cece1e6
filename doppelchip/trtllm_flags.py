"""Every `trtllm-serve` option, and what `doppelchip trtllm-serve` does with each.

TensorRT-LLM's `trtllm-serve` (tensorrt_llm/commands/serve.py, a click command) spells its
options with underscores (`--max_batch_size`, `--tp_size`); the table below is the union of
the options of the releases that have `--grpc` (docs/TRTLLM_SERVE.md names the commits read),
each with the role it has here: translated onto `doppelchip serve`'s pod (cmd_trtllm.py);
accepted with no effect (loading, logging, processes: nothing a client sees changes); accepted
with a warning naming it (it changes speed, memory or answers in TensorRT-LLM in a way
doppelchip does not emulate); refused by TensorRT-LLM's own gRPC server (the router handles
it); or refused here. An option whose meaning differs between trtllm-serve's two servers (its
OpenAI HTTP server, and with `--grpc` its gRPC worker) has a second role, `http`, for the HTTP
mode: TensorRT-LLM's gRPC-mode refusals are the router's business there, while the HTTP server
parses tools, renders chat templates and can join a disaggregated cluster itself. A flag not in
the table is argparse's error, as it is click's there.

Why a module of its own: the table is data, longer than the code that uses it.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

TRANSLATED, SILENT, WARNED, GRPC_REFUSED, REFUSED = (
    "translated", "accepted, no effect", "accepted with a warning",
    "refused with --grpc, as TensorRT-LLM's gRPC server refuses them (without --grpc: as "
    "each says)", "refused here")
BACKENDS = ("pytorch", "tensorrt", "trt", "_autodeploy")  # trt: click's alias of tensorrt
LOG_LEVELS = {"internal_error": "error", "error": "error", "warning": "warning",
              "info": "info", "verbose": "debug", "debug": "debug", "trace": "debug"}
GRPC_PORT = 50051  # without --grpc, doppelchip's gRPC port (as `doppelchip vllm serve`'s)
SUBCOMMANDS = ("disaggregated", "disaggregated_mpi_worker", "mm_embedding_serve",
               "embeddings")  # trtllm-serve's other commands, not emulated


@dataclass(frozen=True)
class TrtllmOption:
    """One `trtllm-serve` option: every string that sets it, its parameter name there (the
    LlmArgs field where it is one), its value `kind` ('int', 'float', 'str', 'switch',
    'negatable' (--X/--no-X), 'append' (repeatable)), its role here and what it does here."""

    flags: tuple[str, ...]
    dest: str
    kind: str
    role: str
    help: str
    choices: tuple[str, ...] | None = None
    http: str = ""

    @property
    def name(self) -> str:
        return self.flags[0]

    def role_in(self, grpc: bool) -> str:
        """Its role with --grpc (gRPC mode) or without (trtllm-serve's OpenAI HTTP server)."""
        return self.role if grpc or not self.http else self.http


def _o(flags: str, kind: str, role: str, help: str, dest: str = "",
       choices: tuple[str, ...] | None = None, http: str = "") -> TrtllmOption:
    names = tuple(flags.split())
    return TrtllmOption(names, dest or names[0].lstrip("-").replace("-", "_"), kind, role, help,
                        choices, http)


T, S, W, G, R = TRANSLATED, SILENT, WARNED, GRPC_REFUSED, REFUSED
REFUSED_GRPC = ("with --grpc refused, as TensorRT-LLM's gRPC mode refuses it (the router does "
                "this)")
REFUSED_DISAGG = (REFUSED_GRPC + "; without, refused too: TensorRT-LLM's disaggregated serving "
                  "is not emulated")
REFUSED_VISUAL = ("refused: TensorRT-LLM's VisualGen server (image and video generation) is not "
                  "emulated, and has no gRPC mode")
OPTIONS: tuple[TrtllmOption, ...] = (
    _o("--grpc", "switch", T, "serve TensorRT-LLM's gRPC service, trtllm.TrtllmService (what "
       "smg's gateway speaks), on --port; without it, trtllm-serve's OpenAI HTTP server"),
    _o("--grpc-protocol", "str", T, "with --grpc: smg (default); openengine is refused. Without "
       "--grpc, no effect", choices=("smg", "openengine"), http=S),
    _o("--host", "str", T, "address to bind (default: $DOPPELCHIP_HOST, else localhost, bound "
       "as 127.0.0.1)"),
    _o("--port", "int", T, "the HTTP port, or with --grpc the gRPC port (default 8000; 0 "
       "picks a free one)"),
    _o("--backend", "str", T, "pytorch (default) or tensorrt (trt): the tensorrt-llm engine "
       "either way; _autodeploy is served as pytorch, with a warning", choices=BACKENDS),
    _o("--served_model_name", "str", T, "the model name served (default: MODEL as given)"),
    _o("--max_batch_size", "int", T, "requests scheduled at once: --max-num-seqs (default "
       "2048)"),
    _o("--max_num_tokens", "int", T, "tokens one step takes: --max-num-batched-tokens "
       "(default 8192)"),
    _o("--max_seq_len", "int", T, "prompt + output tokens of a request: --max-model-len "
       "(default: the model's)"),
    _o("--max_beam_width", "int", T, "1 (default); above 1 is refused: no beam search here"),
    _o("--tensor_parallel_size --tp_size", "int", T, "--tp (default 1)"),
    _o("--pipeline_parallel_size --pp_size", "int", T, "--pp (default 1)"),
    _o("--context_parallel_size --cp_size", "int", T, "1 (default); above 1 is refused"),
    _o("--moe_expert_parallel_size --ep_size", "int", T, "--ep for a MoE model; it must divide "
       "the tp size (TensorRT-LLM's Mapping)"),
    _o("--free_gpu_memory_fraction --kv_cache_free_gpu_memory_fraction", "float", T,
       "share of the memory weights and activations leave free that the KV cache takes, (0, "
       "1]: --gpu-memory-utilization (default 0.9)"),
    _o("--kv_cache_dtype", "str", T, "--kv-cache-dtype auto (default) or fp8; nvfp4 is refused",
       choices=("auto", "fp8", "nvfp4")),
    _o("--enable_chunked_prefill", "switch", T, "prefill long prompts in chunks (TensorRT-LLM's "
       "default: off)"),
    _o("--enable_attention_dp", "switch", T, "attention data parallel: --count tp x pp --tp 1"),
    _o("--config --extra_llm_api_options", "str", T, "YAML file of LlmArgs fields; an explicit "
       "flag wins over it (docs/TRTLLM_SERVE.md)", dest="extra_llm_api_options"),
    _o("--log_level", "str", T, "--log-level (verbose and trace: debug; internal_error: error)",
       choices=tuple(LOG_LEVELS)),
    # loading, logging, processes, parsing done by the router in gRPC mode
    _o("--tokenizer", "str", S, "the tokenizer (doppelchip's own serves)"),
    _o("--custom_tokenizer", "str", S, "a tokenizer class"),
    _o("--custom_module_dirs", "append", S, "modules to import"),
    _o("--trust_remote_code", "switch", S, "for Hugging Face loading"),
    _o("--hf_revision --revision", "str", S, "checkpoint revision", dest="revision"),
    _o("--gpus_per_node", "int", S, "GPUs per node (detected by default)"),
    _o("--num_postprocess_workers", "int", S, "detokenizing processes"),
    _o("--num_serve_frontends", "int", S, "HTTP front-end processes"),
    _o("--num_input_processor_workers", "int", S, "multimodal preprocessing threads"),
    _o("--num_media_load_workers", "int", S, "media decoding threads"),
    _o("--reasoning_parser", "str", S, "reasoning output parser: with --grpc no effect (the "
       "router parses); without, accepted with a warning (no reasoning_content is split off)",
       http=W),
    _o("--fail_fast_on_attention_window_too_large", "switch", S, "deprecated"),
    _o("--otlp_traces_endpoint", "str", S, "OpenTelemetry traces"),
    _o("--telemetry --no-telemetry", "negatable", S, "usage telemetry (or --no-telemetry)"),
    # accepted with a warning: not emulated
    _o("--post_processor_hook", "str", W, "a hook rewriting outputs"),
    _o("--moe_cluster_parallel_size --cluster_size", "int", W, "deprecated in TensorRT-LLM"),
    _o("--media_io_kwargs", "str", W, "JSON of media loader arguments (checked as JSON)"),
    _o("--video_pruning_rate", "float", W, "video frame pruning"),
    _o("--agent_percentage", "float", W, "agent request scheduling"),
    _o("--agent_types", "str", W, "agent request scheduling"),
    _o("--generation-config", "str", W, "sampling defaults from generation_config.json",
       choices=("auto", "trtllm")),
    _o("--report_addr", "str", W, "where to report the server's address"),
    # TensorRT-LLM's gRPC mode refuses these ("Argument '...' is not supported when running
    # in gRPC mode"): the router handles tool parsing, chat templates, disaggregation
    # in gRPC mode the router handles tool parsing, chat templates, disaggregation. The HTTP
    # server does these itself: tool calls here are written under the request's tools (a
    # parser finds nothing more), chat renders with the model's own template, no middleware is
    # loaded, and disaggregated serving is not emulated
    _o("--tool_parser", "str", G, REFUSED_GRPC + "; without, no effect: tool calls are written "
       "under the request's tools already", http=S),
    _o("--chat_template", "str", G, REFUSED_GRPC + "; without, accepted with a warning: chat "
       "renders with the model's own template", http=W),
    _o("--allow_request_chat_template", "switch", G, REFUSED_GRPC + "; without, accepted with "
       "a warning: a request's chat_template is ignored", http=W),
    _o("--middleware", "append", G, REFUSED_GRPC + "; without, accepted with a warning: no "
       "middleware is loaded", http=W),
    _o("--metadata_server_config_file", "str", G, REFUSED_DISAGG, http=R),
    _o("--server_role", "str", G, REFUSED_DISAGG, http=R),
    _o("--disagg_cluster_uri", "str", G, REFUSED_DISAGG, http=R),
    # TensorRT-LLM: "--grpc is not supported by the VisualGen server"
    _o("--enable_visual_gen", "switch", R, REFUSED_VISUAL),
    _o("--visual_gen_args", "str", R, REFUSED_VISUAL),
)
BY_DEST: dict[str, TrtllmOption] = {o.dest: o for o in OPTIONS}
GRPC_NAMES = {"disagg_cluster_uri": "disagg_cluster_config"}  # TensorRT-LLM's name in its error
_TYPES = {"int": int, "float": float, "str": str}
_METAVARS = {"host": "HOST", "port": "PORT", "extra_llm_api_options": "FILE", "model": "NAME",
             "served_model_name": "NAME", "free_gpu_memory_fraction": "FRACTION"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """MODEL and every option of OPTIONS (each defaulting to None: given or not), grouped by
    role, then doppelchip's own (`--chip`, `--time-scale`, `--cold`, `--grpc-port`,
    `--http-port`)."""
    from doppelchip.vllm_parser import add_doppelchip_arguments

    p.add_argument("model", metavar="MODEL", help="a Hugging Face repository id of the "
                   "catalogue, a local checkpoint folder or a catalogue model id")
    groups = {role: p.add_argument_group(f"trtllm-serve's options: {role}")
              for role in (T, S, W, G, R)}
    for o in OPTIONS:
        g, h = groups[o.role], o.help
        if o.kind == "negatable":
            g.add_argument(o.flags[0], dest=o.dest, action="store_true", default=None, help=h)
            g.add_argument(o.flags[1], dest=o.dest, action="store_false", default=None,
                           help=argparse.SUPPRESS)
        elif o.kind == "switch":
            g.add_argument(*o.flags, dest=o.dest, action="store_true", default=None, help=h)
        elif o.kind == "append":
            g.add_argument(*o.flags, dest=o.dest, action="append", default=None, help=h,
                           metavar="VALUE")
        else:
            g.add_argument(*o.flags, dest=o.dest, type=_TYPES[o.kind], choices=o.choices,
                           default=None, help=h, metavar=None if o.choices else _METAVARS.get(
                               o.dest, {"int": "N", "float": "X", "str": "VALUE"}[o.kind]))
    d = add_doppelchip_arguments(p, "TensorRT-LLM")
    d.add_argument("--grpc-port", type=int, metavar="PORT",
                   help="without --grpc: the pod's gRPC port (doppelchip.v1 and "
                   "trtllm.TrtllmService; trtllm-serve's HTTP server has none); default "
                   f"{GRPC_PORT}, or 0 (a free port) with --port 0")
    d.add_argument("--http-port", type=int, metavar="PORT",
                   help="with --grpc: the pod's HTTP port, doppelchip's OpenAI server and "
                   "/metrics (TensorRT-LLM's gRPC mode serves no HTTP); default --port + 1, or "
                   "0 (a free port) with --port 0")


def trtllm_argv(argv: list[str]) -> list[str]:
    """`trtllm-serve`'s command group as click resolves it: a first argument `serve` is its
    default command named; its other commands are not emulated (ValueError)."""
    if len(argv) > 1 and argv[1] == "serve":
        return [argv[0], *argv[2:]]
    if len(argv) > 1 and argv[1] in SUBCOMMANDS:
        raise ValueError(f"trtllm-serve {argv[1]}: not emulated; `doppelchip trtllm-serve "
                         "MODEL` serves one model with trtllm-serve's OpenAI server (with "
                         "--grpc, as TensorRT-LLM's gRPC worker)")
    return argv
