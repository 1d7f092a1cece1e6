"""The `doppelchip` command. Each subcommand imports its layer lazily, when it runs."""

from __future__ import annotations

import argparse
import sys
from types import ModuleType

from doppelchip import exit_codes


def _generate(args: argparse.Namespace) -> int:
    from clients.generate import read_constraint, read_text, run_generate
    from doppelchip.client_flags import client_security

    if [args.prompt_file, args.json_schema, args.grammar].count("-") > 1:
        print("error: only one of --prompt-file, --json-schema and --grammar can read "
              "standard input (-)", file=sys.stderr)
        return exit_codes.USAGE
    try:
        prompt = read_text(args.prompt_file) if args.prompt_file is not None else args.prompt
        constraint = read_constraint(json_schema=args.json_schema, regex=args.regex,
                                     choice=args.choice, grammar=args.grammar)
        security = client_security(args)
    except OSError as e:
        print(f"error: cannot read {e.filename}: {e.strerror}", file=sys.stderr)
        return exit_codes.USAGE
    except (ValueError, UnicodeDecodeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return exit_codes.USAGE
    return run_generate(
        args.target, prompt, timeout=args.timeout, security=security,
        deployment=args.deployment,
        max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed,
        ignore_eos=args.ignore_eos, stop=args.stop or None, **constraint,
    )


# The modules that register the other commands, in `doppelchip --help` order, and the commands
# each registers: a command line naming one of them builds (and imports) only that module.
_MODULES = ("cmd_serve", "cmd_pods", "cmd_devices", "cmd_simulate", "cmd_load", "cmd_whatif",
            "cmd_plan", "cmd_gateway", "cmd_status", "cmd_vllm", "cmd_sglang", "cmd_trtllm")
_COMMANDS = {"serve": "cmd_serve", "pods": "cmd_pods", "devices": "cmd_devices",
             "estimate": "cmd_devices", "simulate": "cmd_simulate", "load": "cmd_load",
             "whatif": "cmd_whatif", "plan": "cmd_plan", "gateway": "cmd_gateway",
             "status": "cmd_status", "vllm": "cmd_vllm", "sglang": "cmd_sglang",
             "trtllm-serve": "cmd_trtllm"}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; with ``command`` (a subcommand name) only that subcommand's
    parser, so a run imports just its own command module (the top-level help, which lists
    every command, needs them all). Either parses that command's arguments alike."""
    parser = argparse.ArgumentParser(
        prog="doppelchip",
        description="An LLM-serving stand-in: a real gRPC server over emulated accelerators.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    if command in (None, "generate"):
        _add_generate(sub)
    modules = [_COMMANDS[command]] if command in _COMMANDS else (
        [] if command == "generate" else list(_MODULES))
    for name in modules:  # argparse only; each command imports its layers when it runs
        _module(name).register(sub)
    for subparser in sub.choices.values():  # one exit-status table for every command
        exit_codes.document(subparser)
    return parser


def _module(name: str) -> ModuleType:
    """The command module ``name``, imported now (spelled out, so the import graph and its
    cycle check in tests/test_layering.py see every edge)."""
    if name == "cmd_serve":
        from doppelchip import cmd_serve as m
    elif name == "cmd_pods":
        from doppelchip import cmd_pods as m
    elif name == "cmd_devices":
        from doppelchip import cmd_devices as m
    elif name == "cmd_simulate":
        from doppelchip import cmd_simulate as m
    elif name == "cmd_load":
        from doppelchip import cmd_load as m
    elif name == "cmd_whatif":
        from doppelchip import cmd_whatif as m
    elif name == "cmd_plan":
        from doppelchip import cmd_plan as m
    elif name == "cmd_gateway":
        from doppelchip import cmd_gateway as m
    elif name == "cmd_status":
        from doppelchip import cmd_status as m
    elif name == "cmd_vllm":
        from doppelchip import cmd_vllm as m
    elif name == "cmd_sglang":
        from doppelchip import cmd_sglang as m
    elif name == "cmd_trtllm":
        from doppelchip import cmd_trtllm as m
    else:
        raise KeyError(name)
    return m


def _add_generate(sub: argparse._SubParsersAction) -> None:
    g = sub.add_parser("generate", help="stream one completion to the terminal",
                       description="Send one prompt, stream the generated text to stdout, and "
                       "print a summary line to stderr: tokens, finish reason, TTFT, decode "
                       "tokens/s and total time, each on the server's emulated timeline and in "
                       "wall time. Ctrl-C cancels the request on the server, prints the summary "
                       "so far and exits 130.")
    p = g.add_mutually_exclusive_group(required=True)
    p.add_argument("prompt", nargs="?", help="the prompt text (or --prompt-file)")
    p.add_argument("--prompt-file", metavar="FILE",
                   help="read the prompt from FILE (- for stdin); for prompts too long for "
                   "the command line")
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


def _negatable(parser: argparse.ArgumentParser) -> set[str]:
    """Every `--no-X` flag of `parser`'s subcommands, however deep."""
    out: set[str] = set()
    for action in parser._actions:
        out |= {o for o in action.option_strings if o.startswith("--no-")}
        for sub in (action.choices or {}).values() if isinstance(action.choices, dict) else ():
            out |= _negatable(sub)
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    first = argv[0] if argv else None
    parser = build_parser(first if first in (*_COMMANDS, "generate") else None)
    if first == "vllm":  # vLLM's own rewrites first: --config FILE.yaml, --max_model_len
        from doppelchip.vllm_argv import vllm_argv

        try:
            argv = vllm_argv(argv, _negatable(parser))
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return exit_codes.USAGE
    if first == "sglang":  # SGLang's: `sglang serve REPO`, --model-type, --config FILE.yaml
        from doppelchip.sglang_argv import sglang_argv

        try:
            argv = sglang_argv(argv)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return exit_codes.USAGE
    if first == "trtllm-serve":  # click's command group: `trtllm-serve serve MODEL`
        from doppelchip.trtllm_flags import trtllm_argv

        try:
            argv = trtllm_argv(argv)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return exit_codes.USAGE
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except BrokenPipeError:  # `doppelchip devices | head`: the reader left; not an error
        sys.stderr.close()
        return exit_codes.OK
    except KeyboardInterrupt:  # Ctrl-C in a command without its own handling: no traceback
        print("\ninterrupted", file=sys.stderr)
        return exit_codes.INTERRUPTED
    except Exception as e:
        import grpc

        if isinstance(e, grpc.RpcError) and hasattr(e, "code"):  # a status, not a bug
            print(f"error: {e.code().name}: {e.details()}", file=sys.stderr)
            return exit_codes.FAILED
        raise


def vllm_main() -> int:
    """`doppelchip-vllm` (installed as `vllm` in the container image): `vllm serve ...` is
    `doppelchip vllm serve ...` (doppelchip/cmd_vllm.py)."""
    return main(["vllm", *sys.argv[1:]])


def sglang_main() -> int:
    """`doppelchip-sglang`: `sglang serve ...` is `doppelchip sglang serve ...`
    (doppelchip/cmd_sglang.py)."""
    return main(["sglang", *sys.argv[1:]])


def trtllm_serve_main() -> int:
    """`doppelchip-trtllm-serve`: `trtllm-serve MODEL [--grpc] ...` is `doppelchip trtllm-serve
    MODEL [--grpc] ...` (doppelchip/cmd_trtllm.py)."""
    return main(["trtllm-serve", *sys.argv[1:]])


if __name__ == "__main__":
    sys.exit(main())
