"""The `doppelchip` command. Each subcommand imports its layer lazily, when it runs."""

from __future__ import annotations

import argparse
import sys


def _generate(args: argparse.Namespace) -> int:
    from clients.generate import read_constraint, run_generate
    from doppelchip.client_flags import client_security

    try:
        constraint = read_constraint(json_schema=args.json_schema, regex=args.regex,
                                     choice=args.choice, grammar=args.grammar)
        security = client_security(args)
    except OSError as e:
        print(f"error: cannot read {e.filename}: {e.strerror}", file=sys.stderr)
        return 2
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return run_generate(
        args.target, args.prompt, timeout=args.timeout, security=security,
        deployment=args.deployment,
        max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed,
        ignore_eos=args.ignore_eos, stop=args.stop or None, **constraint,
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="doppelchip",
        description="An LLM-serving stand-in: a real gRPC server over emulated accelerators.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

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
    from doppelchip.client_flags import add_client_security_args

    add_client_security_args(g)
    g.set_defaults(func=_generate)

    # argparse only; each command imports its layers when it runs
    from doppelchip import (
        cmd_devices,
        cmd_gateway,
        cmd_load,
        cmd_plan,
        cmd_pods,
        cmd_serve,
        cmd_simulate,
        cmd_whatif,
    )

    cmd_serve.register(sub)
    cmd_pods.register(sub)
    cmd_devices.register(sub)
    cmd_simulate.register(sub)
    cmd_load.register(sub)
    cmd_whatif.register(sub)
    cmd_plan.register(sub)
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
