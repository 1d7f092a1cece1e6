"""`doppelchip vllm serve`: vLLM's own command line, served by doppelchip (docs/VLLM_SERVE.md).

Why it exists: a platform team's manifests (llm-d's model service, the production stack's
Helm chart, KServe) start `vllm serve <Hugging Face repo> --port 8000 -tp 2 ...`. With this
command (also installed as `doppelchip-vllm`, and as `vllm` in the container image) the same
arguments start a doppelchip pod: the repository names a catalogue checkpoint
(`devices/catalog/checkpoints.toml`; a local folder is read from its config.json,
`devices/hf_config.py`), clients send the repository id as `model`, and every
flag vLLM 0.33.0 gives a meaning doppelchip emulates maps onto `doppelchip serve`'s pod mode.
Flags that only load weights, log or configure CORS are accepted and have no effect; flags
whose effect is not emulated are accepted with a warning naming them; anything else is
vLLM's argparse error (exit status 2).
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
from typing import Any

from doppelchip.vllm_flags import (
    ACCEPTED_FLAGS,
    ACCEPTED_SWITCHES,
    PASSTHROUGH,
    UNMODELLED_FLAGS,
    UNMODELLED_SWITCHES,
)

DEFAULT_CHIP = "h100-sxm"
DTYPES = {"half": "f16", "float16": "f16", "bfloat16": "bf16"}  # vLLM ModelDType -> quant
KV_DTYPES = {"auto": "auto", "fp8": "fp8", "fp8_e4m3": "fp8", "fp8_e5m2": "fp8"}
LOG_LEVELS = {"CRITICAL": "error", "ERROR": "error", "WARNING": "warning", "INFO": "info",
              "DEBUG": "debug", "NOTSET": "debug"}  # vLLM's LogLevel -> serve's --log-level


def human_readable_int(value: str) -> int:
    """vLLM's integers: '1k' is 1,000, '1K' 1,024, '25.6k' 25,600; '-1' and 'auto' are -1
    (--max-model-len: the longest context that fits)."""
    value = value.strip()
    if value == "-1" or value.lower() == "auto":
        return -1
    found = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", value)
    if not found:
        return int(value)
    number, suffix = found.groups()
    if suffix.islower():
        return int(float(number) * 10 ** (3 * "kmgt".index(suffix) + 3))
    if "." in number:
        raise argparse.ArgumentTypeError(
            f"Decimals are not allowed with binary suffixes like {suffix}. Did you mean to use "
            f"{number}{suffix.lower()} instead?")
    return int(number) * 2 ** (10 * "KMGT".index(suffix) + 10)


def register(subparsers: Any) -> None:
    v = subparsers.add_parser(
        "vllm", help="vLLM's command line (`vllm serve REPO ...`), served by doppelchip",
        description="vLLM's command line: `doppelchip vllm serve meta-llama/Llama-3.1-8B-"
        "Instruct -tp 2 --port 8000` starts the pod `vllm serve` would, on an emulated chip "
        "(--chip, default $DOPPELCHIP_CHIP or h100-sxm). Also installed as `doppelchip-vllm`.")
    sub = v.add_subparsers(dest="vllm_command", required=True, metavar="COMMAND",
                           help="serve (the only vLLM command emulated)")
    p = sub.add_parser("serve", usage="vllm serve [model_tag] [options]",
                       help="start a vLLM-shaped pod (OpenAI HTTP, /metrics, gRPC)",
                       description="vLLM 0.33.0's `vllm serve` flags; docs/VLLM_SERVE.md lists "
                       "what each one does here.")
    p.add_argument("model_tag", nargs="?", help="Hugging Face repository id or catalogue model")
    p.add_argument("--model", help="as the positional model_tag (which wins when both given)")
    p.add_argument("--config", metavar="FILE.yaml", help="flags from a YAML file, as vLLM "
                   "reads it (the command line wins; doppelchip/vllm_argv.py)")
    f = p.add_argument_group("front end (vLLM's FrontendArgs)")
    f.add_argument("--host", help="address to bind (default: $DOPPELCHIP_HOST or 127.0.0.1; "
                   "vLLM binds every interface)")
    f.add_argument("--port", type=int, default=8000, help="HTTP port (default 8000)")
    f.add_argument("--grpc-port", type=int, default=50051,
                   help="gRPC port: doppelchip.v1, vllm.grpc.engine and health (default 50051)")
    f.add_argument("--uds", help="refused: doppelchip listens on TCP only")
    f.add_argument("--log-level", type=str.upper,
                   choices=["CRITICAL", "ERROR", "WARNING", "INFO", "DEBUG", "NOTSET"],
                   help="logging verbosity (default INFO)")
    e = p.add_argument_group("engine (vLLM's EngineArgs)")
    e.add_argument("--tensor-parallel-size", "-tp", type=int, dest="tp",
                   help="chips each layer is sharded over")
    e.add_argument("--pipeline-parallel-size", "-pp", type=int, dest="pp",
                   help="pipeline stages (chips = tp x pp per data-parallel rank)")
    e.add_argument("--dtype", choices=["auto", "half", "float16", "bfloat16", "float",
                                       "float32"], default="auto",
                   help="16-bit weights: the checkpoint's (auto), f16 or bf16")
    e.add_argument("--quantization", "-q", metavar="METHOD",
                   help="vLLM's method name: fp8, awq, gptq, modelopt_fp4, mxfp4, ...")
    e.add_argument("--gpu-memory-utilization", "--device-memory-utilization", type=float,
                   dest="gpu_memory_utilization", metavar="FRACTION",
                   help="share of each chip's memory the engine may use (default 0.92)")
    e.add_argument("--kv-cache-memory-bytes", type=human_readable_int, metavar="BYTES",
                   help="the KV cache per GPU, whatever --gpu-memory-utilization "
                   "(8g: 8e9, 8G: 8 GiB)")
    e.add_argument("--max-model-len", type=human_readable_int, metavar="N",
                   help="context length: 32k, 32K, 32768, or auto (-1: the longest that fits)")
    e.add_argument("--max-num-batched-tokens", type=human_readable_int, metavar="N",
                   help="token budget per step (8k, 8K, 8192)")
    e.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction,
                   help="automatic prefix caching (default on)")
    e.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction,
                   help="chunked prefill (always on here; --no-... is refused)")
    e.add_argument("--scheduling-policy", choices=["fcfs", "priority"],
                   help="queue order (default fcfs)")
    e.add_argument("--enforce-eager", action=argparse.BooleanOptionalAction,
                   help="no CUDA/HIP graphs: the host launches every kernel")
    e.add_argument("--seed", type=int, help="accepted; each deployment is seeded already")
    for flags, kwargs in PASSTHROUGH:
        e.add_argument(*flags, **kwargs, help="as `doppelchip serve`'s flag of this name")
    d = p.add_argument_group("doppelchip (no vLLM equivalent)")
    d.add_argument("--chip", default=os.environ.get("DOPPELCHIP_CHIP", DEFAULT_CHIP),
                   help="the emulated chip (default $DOPPELCHIP_CHIP or h100-sxm)")
    # a string default goes through `type` too: a bad $DOPPELCHIP_TIME_SCALE is argparse's error
    d.add_argument("--time-scale", type=float, default=os.environ.get("DOPPELCHIP_TIME_SCALE"),
                   help="wall seconds per emulated second (default $DOPPELCHIP_TIME_SCALE, "
                   "else 1)")
    d.add_argument("--cold", action="store_true",
                   default=os.environ.get("DOPPELCHIP_COLD", "") not in ("", "0"),
                   help="start cold, as a new vLLM pod: load the weights before serving "
                   "(default $DOPPELCHIP_COLD)")
    d.add_argument("--check-integrity", action="store_true",
                   help="engines check their KV pool and queues when idle (tests)")
    a = p.add_argument_group("accepted, no effect here (weights are not loaded)")
    for flags in ACCEPTED_FLAGS + UNMODELLED_FLAGS:
        a.add_argument(*flags, nargs="?", const=True, help=argparse.SUPPRESS)
    for flags in ACCEPTED_SWITCHES + UNMODELLED_SWITCHES:
        a.add_argument(*flags, action=argparse.BooleanOptionalAction, help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_vllm_serve)


def _dest(flags: tuple[str, ...]) -> str:
    return flags[0].lstrip("-").replace("-", "_")


def translate(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """(`doppelchip serve` arguments, warnings) for a parsed `vllm serve` command line;
    ValueError says what cannot be served."""
    from devices import catalog
    from devices.errors import UnknownId

    tag = args.model_tag or args.model
    if not tag:
        raise ValueError("no model: give it as `vllm serve MODEL` (a Hugging Face repository "
                         "id such as meta-llama/Llama-3.1-8B-Instruct, or a catalogue model)")
    if args.uds:
        raise ValueError("--uds: doppelchip listens on TCP only (use --host and --port)")
    if os.path.exists(tag):  # a local checkpoint (a mounted volume): what its config.json says
        from devices.hf_config import model_for, quant_for, read_config

        config = read_config(tag)
        model, quant = model_for(config).id, quant_for(config)
    else:
        try:
            ckpt = catalog.get_checkpoint(tag)
            model, quant = ckpt.model, ckpt.quant
        except UnknownId as e:
            if tag not in {m.id for m in catalog.list_models()}:
                raise ValueError(f"{e} (or a catalogue model: `doppelchip devices`; or a "
                                 "local checkpoint folder with its config.json)") from None
            model, quant = tag, "bf16"  # a catalogue id: dtype auto on a bf16 checkpoint
    if args.dtype in ("float", "float32"):
        raise ValueError(f"--dtype {args.dtype}: the catalogue has no 32-bit weight format")
    if args.quantization:
        try:
            quant = catalog.quant_for_vllm(args.quantization).id
        except UnknownId as e:
            raise ValueError(f"--quantization: {e}") from None
    elif args.dtype in DTYPES and catalog.get_quant(quant).family == "float":
        quant = DTYPES[args.dtype]
    kv = getattr(args, "kv_cache_dtype", None)
    if kv is not None and kv not in KV_DTYPES:
        raise ValueError(f"--kv-cache-dtype {kv}: emulated are {', '.join(KV_DTYPES)}")
    if args.enable_chunked_prefill is False:
        raise ValueError("--no-enable-chunked-prefill: doppelchip's vLLM always chunks "
                         "prefills (vLLM v1's default); not emulated")
    out = ["--chip", args.chip, "--engine", "vllm", "--model", model, "--quant", quant,
           "--served-model-name", *(args.served_model_name or [tag]),
           "--host", args.host or os.environ.get("DOPPELCHIP_HOST", "127.0.0.1"),
           "--port", str(args.grpc_port), "--http-port", str(args.port)]
    values = {"served_model_name": None,  # given above
              "tp": args.tp, "pp": args.pp, "kv_cache_dtype": KV_DTYPES.get(kv or ""),
              "gpu_memory_utilization": args.gpu_memory_utilization,
              "kv_cache_memory_bytes": args.kv_cache_memory_bytes,
              "max_model_len": None if args.max_model_len == -1 else args.max_model_len,
              "max_num_batched_tokens": args.max_num_batched_tokens,
              "policy": args.scheduling_policy, "time_scale": args.time_scale,
              "log_level": LOG_LEVELS.get(args.log_level or ""),
              "enforce_eager": args.enforce_eager, "check_integrity": args.check_integrity,
              "cold": args.cold, "prefix_cache": {True: "on", False: "off"}.get(
                  args.enable_prefix_caching)}
    for flags, _ in PASSTHROUGH:
        dest = _dest(flags)
        if dest not in values:
            values[dest] = getattr(args, dest)
    for dest, value in values.items():
        flag = "--" + dest.replace("_", "-")
        if value is True:
            out.append(flag)
        elif isinstance(value, list):
            out += [flag, *map(str, value)]
        elif value is not None and value is not False:
            out += [flag, str(value)]
    warnings = [f"{flags[0]} is accepted but not emulated: it changes nothing here"
                for flags in UNMODELLED_FLAGS + UNMODELLED_SWITCHES
                if getattr(args, _dest(flags)) not in (None, False)]
    if args.seed is not None:
        warnings.append("--seed: each deployment's sampler is seeded already (0)")
    return out, warnings


def _serve_args(argv: list[str]) -> argparse.Namespace:
    """`doppelchip serve ARGV`, parsed by serve's own parser."""
    from doppelchip import cmd_serve

    parser = argparse.ArgumentParser(prog="doppelchip")
    cmd_serve.register(parser.add_subparsers(dest="command"))
    return parser.parse_args(["serve", *argv])


def cmd_vllm_serve(args: argparse.Namespace) -> int:
    try:
        argv, warnings = translate(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for warning in warnings:
        print(f"doppelchip vllm serve: warning: {warning}", file=sys.stderr)
    print(f"doppelchip vllm serve: doppelchip serve {shlex.join(argv)}", file=sys.stderr)
    serve = _serve_args(argv)
    serve.model_path = args.model_tag or args.model  # /v1/models' root, as vLLM's (no flag)
    problem = _unplaceable(serve, fit_model_len=args.max_model_len is None)
    if problem:  # vLLM stops when the model cannot load; a pod that never serves is worse
        print(f"error: {problem}", file=sys.stderr)
        return 2
    return serve.func(serve)


def _unplaceable(serve: argparse.Namespace, fit_model_len: bool) -> str:
    """Why the pod's deployment cannot be placed ("" when it can). `fit_model_len` (no
    --max-model-len given): as vLLM, the KV cache must hold one request of the model's whole
    context; `auto` (-1) takes the longest that fits instead."""
    from devices import DeviceError, place
    from doppelchip.cmd_serve import pod_fleet
    from server.config import load_fleet

    try:
        deployment = pod_fleet(serve, load_fleet(None)).deployments[0]
        placed = place(deployment.spec())
    except (DeviceError, ValueError) as e:
        return str(e)
    if fit_model_len and placed.max_context < placed.model.max_context:
        return _kv_too_small(placed)
    return ""


def _kv_too_small(placed: Any) -> str:
    """vLLM 0.33.0's start-up error (`_check_enough_kv_cache_memory`), per worker."""
    workers = placed.chips / placed.dp
    per_token = (sum(placed.memory_bytes(1).values())
                 - sum(placed.memory_bytes(0).values())) / workers
    gib = 2**30
    need, have = per_token * placed.model.max_context, per_token * placed.max_context
    return (f"To serve at least one request with the model's max seq len "
            f"({placed.model.max_context}), ({round(need / gib, 2)} GiB KV cache is needed, "
            f"which is larger than the available KV cache memory ({round(have / gib, 2)} GiB). "
            f"Based on the available memory, the estimated maximum model length is "
            f"{placed.max_context}. Try increasing `gpu_memory_utilization` or decreasing "
            f"`max_model_len` when initializing the engine.")
