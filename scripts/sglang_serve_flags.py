"""Write `doppelchip/sglang_serve_flags.json`: every option of SGLang's own `sglang serve`
parser (`python -m sglang.launch_server` reads the same one).

Run it with a Python where SGLang is installed (it is not a doppelchip dependency, and nothing
downloads it at run time); the file it writes is committed. How the 0.5.23 file was made
(docs/SGLANG_SERVE.md, "Every SGLang flag"): the parser needs SGLang's imports, not a GPU:

    python3.11 -m venv /tmp/sgv
    /tmp/sgv/bin/pip install --no-deps sglang==0.5.23
    /tmp/sgv/bin/pip install msgspec numpy orjson psutil pybase64 requests torch packaging \
        pillow starlette pydantic pyzmq tqdm ipython aiohttp
    /tmp/sgv/bin/python scripts/sglang_serve_flags.py

Only the command line's shape is kept — each option's strings, how many values it takes, its
value type and choices — not its help or its defaults.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "doppelchip" / "sglang_serve_flags.json"


def shape(action: argparse.Action) -> str:
    """'switch' (no value: True, or False by one of its `negative` strings), 'value' (one),
    'values' (one or more), 'any' (zero or more), 'optional' (zero or one)."""
    if action.nargs == 0:
        return "switch"
    return {None: "value", "+": "values", "*": "any", "?": "optional"}[action.nargs]


def type_name(action: argparse.Action) -> str:
    """'int', 'float', 'human_readable_int' (SGLang's 1k / 1Ki integers) or 'str' (text, JSON
    and SGLang's own string parsers alike)."""
    name = getattr(action.type, "__name__", "str")
    return name if name in ("int", "float", "human_readable_int") else "str"


def choices(action: argparse.Action) -> list[str] | None:
    """The values it takes, as text (a set's sorted: `--sampling-backend`'s is one)."""
    if not action.choices:
        return None
    values = [str(c) for c in action.choices]
    return sorted(values) if isinstance(action.choices, (set, frozenset)) else values


def main() -> int:
    from sglang.srt.server_args import ServerArgs
    from sglang.version import __version__

    parser = argparse.ArgumentParser(prog="sglang serve")  # prepare_server_args' parser
    ServerArgs.add_cli_args(parser)
    options = []
    for action in parser._actions:
        if not action.option_strings or isinstance(action, argparse._HelpAction):
            continue
        negative = [s for s in action.option_strings if s.startswith("--no-")] \
            if isinstance(action, argparse.BooleanOptionalAction) else []
        options.append({"flags": list(action.option_strings), "negative": negative,
                        "shape": shape(action), "dest": action.dest,
                        "type": None if action.nargs == 0 else type_name(action),
                        "choices": choices(action)})
    doc = {"sglang": __version__, "source": "sglang.srt.server_args.ServerArgs.add_cli_args("
           "argparse.ArgumentParser(prog='sglang serve'))", "options": options}
    lines = ",\n".join(json.dumps(o) for o in options)  # one option a line: diffs stay readable
    head = json.dumps({k: v for k, v in doc.items() if k != "options"})[:-1]
    OUT.write_text(f'{head}, "options": [\n{lines}\n]}}\n')
    print(f"{len(options)} options of SGLang {__version__} -> {OUT}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
