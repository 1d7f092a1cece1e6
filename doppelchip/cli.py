"""The `doppelchip` command. Each subcommand imports its layer lazily, when it runs."""

from __future__ import annotations

import argparse
import logging
import sys


def _serve(args: argparse.Namespace) -> int:
    from server.app import run
    from server.config import ConfigError, load_fleet

    logging.basicConfig(
        level=getattr(logging, args.log_level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        fleet = load_fleet(args.config).with_server(
            host=args.host, port=args.port, metrics_port=args.metrics_port,
            time_scale=args.time_scale, default_deployment=args.default_deployment,
            drain_grace_s=args.drain_grace, event_loop=args.event_loop,
            vllm_engine_deployment=args.vllm_engine_deployment,
        )
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if fleet.server.time_scale <= 0:
        print("error: --time-scale must be > 0", file=sys.stderr)
        return 2
    if fleet.default_deployment not in {d.name for d in fleet.deployments}:
        print(f"error: unknown default deployment {fleet.default_deployment!r}", file=sys.stderr)
        return 2
    if fleet.vllm_engine_deployment not in {d.name for d in fleet.deployments}:
        print(f"error: unknown --vllm-engine-deployment {fleet.vllm_engine_deployment!r}",
              file=sys.stderr)
        return 2
    return run(fleet)


def _generate(args: argparse.Namespace) -> int:
    from clients.generate import read_constraint, run_generate

    try:
        constraint = read_constraint(json_schema=args.json_schema, regex=args.regex,
                                     choice=args.choice, grammar=args.grammar)
    except OSError as e:
        print(f"error: cannot read {e.filename}: {e.strerror}", file=sys.stderr)
        return 2
    return run_generate(
        args.target, args.prompt, timeout=args.timeout, deployment=args.deployment,
        max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed,
        ignore_eos=args.ignore_eos, stop=args.stop or None, **constraint,
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="doppelchip",
        description="An LLM-serving stand-in: a real gRPC server over emulated accelerators.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("serve", help="serve a fleet of emulated deployments over gRPC",
                       description="Serve a fleet (the built-in default unless --config) over "
                       "gRPC, with Prometheus metrics. SIGTERM/SIGINT drains and exits 0.")
    p.add_argument("--config", metavar="FILE", help="fleet TOML file (default: built-in fleet)")
    p.add_argument("--host", help="address to bind gRPC and metrics to (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="gRPC port (default 50051; 0 picks a free port)")
    p.add_argument("--metrics-port", type=int,
                   help="Prometheus /metrics port (default 8000; 0 picks a free port)")
    p.add_argument("--time-scale", type=float,
                   help="wall seconds per emulated second (1.0 true speed; 0.01 is 100x faster)")
    p.add_argument("--default-deployment", metavar="NAME",
                   help="deployment used when a request names none")
    p.add_argument("--drain-grace", type=float, metavar="SECONDS",
                   help="on shutdown, how long in-flight streams may run before being aborted")
    p.add_argument("--event-loop", choices=["auto", "uvloop", "asyncio"],
                   help="event loop implementation (auto: the measured faster one)")
    p.add_argument("--vllm-engine-deployment", metavar="NAME",
                   help="deployment the vLLM engine gRPC service (vllm.grpc.engine.VllmEngine, "
                   "what the smg gateway speaks) fronts on this port (default: the default "
                   "deployment)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"],
                   help="logging verbosity (default info)")
    p.set_defaults(func=_serve)

    g = sub.add_parser("generate", help="stream one completion to the terminal",
                       description="Send one prompt, stream the generated text to stdout, and "
                       "print a summary line (tokens, TTFT, tokens/s) to stderr.")
    g.add_argument("prompt", help="the prompt text")
    g.add_argument("--target", default="127.0.0.1:50051",
                   help="server address host:port (default 127.0.0.1:50051)")
    g.add_argument("--deployment", default="", metavar="NAME",
                   help="deployment to use (default: the fleet's default deployment)")
    g.add_argument("--max-tokens", type=int, default=None, metavar="N",
                   help="maximum tokens to generate (default: until EOS or the context is full)")
    g.add_argument("--temperature", type=float, default=None, help="sampling temperature")
    g.add_argument("--seed", type=int, default=None, help="sampler seed (default 0)")
    g.add_argument("--ignore-eos", action="store_true",
                   help="keep generating past end-of-sequence until --max-tokens")
    g.add_argument("--stop", action="append", metavar="TEXT",
                   help="stop when the output contains TEXT (repeatable)")
    g.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                   help="deadline for the whole request")
    c = g.add_argument_group("structured output (at most one)").add_mutually_exclusive_group()
    c.add_argument("--json-schema", metavar="FILE",
                   help="the output is JSON valid against the JSON Schema in FILE (- for stdin)")
    c.add_argument("--regex", metavar="REGEX", help="the output matches REGEX")
    c.add_argument("--choice", action="append", metavar="TEXT",
                   help="the output is exactly one of the TEXTs (repeatable)")
    c.add_argument("--grammar", metavar="FILE",
                   help="the output follows the Lark (or GBNF) grammar in FILE (- for stdin)")
    g.set_defaults(func=_generate)

    # argparse only; each command imports its layers when it runs
    from doppelchip import cmd_devices, cmd_gateway, cmd_load, cmd_simulate, cmd_whatif

    cmd_devices.register(sub)
    cmd_simulate.register(sub)
    cmd_load.register(sub)
    cmd_whatif.register(sub)
    cmd_gateway.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except BrokenPipeError:  # `doppelchip devices | head`: the reader left; not an error
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
