"""Write `doppelchip/vllm_serve_flags.json`: every option of vLLM's own `vllm serve` parser.

Run it with a Python where vLLM is installed (it is not a doppelchip dependency, and nothing
downloads it at run time); the file it writes is committed. How the 0.34.0 file was made
(docs/VLLM_SERVE.md, "Every vLLM flag"):

    python -m venv /tmp/vv && /tmp/vv/bin/pip install vllm==0.34.0 --no-deps
    /tmp/vv/bin/pip install torch==2.14.0 <vLLM's other requirements, but the CUDA kernels'>
    VLLM_TARGET_DEVICE=cpu /tmp/vv/bin/python scripts/vllm_serve_flags.py

Only the command line's shape is kept — each option's strings, whether it takes a value and
how many, its choices — not its help or its defaults.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "doppelchip" / "vllm_serve_flags.json"


def shape(action: argparse.Action) -> str:
    """'switch' (no value: True, or False by one of its `negative` strings), 'value' (one),
    'values' (one or more), 'optional' (zero or one), 'append' (one, the option repeatable).
    `hidden` strings are accepted but left out of vLLM's help (`--no-enable-prefix-caching`)."""
    if action.nargs == 0:
        return "switch"
    if isinstance(action, argparse._AppendAction):
        return "append"
    return {None: "value", "+": "values", "*": "values", "?": "optional"}[action.nargs]


def main() -> int:
    import vllm
    from vllm.entrypoints.common.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser())
    options = []
    for action in parser._actions:
        if not action.option_strings or isinstance(action, argparse._HelpAction):
            continue
        negative = set(getattr(action, "negative_option_strings", ()))
        options.append({"flags": list(action.option_strings),
                        "hidden": sorted(negative - set(action.option_strings)),
                        "negative": sorted(negative),
                        "shape": shape(action), "dest": action.dest,
                        "choices": [str(c) for c in action.choices] if action.choices else None})
    doc = {"vllm": vllm.__version__, "source": "vllm.entrypoints.common.cli_args."
           "make_arg_parser(FlexibleArgumentParser())", "options": options}
    lines = ",\n".join(json.dumps(o) for o in options)  # one option a line: diffs stay readable
    head = json.dumps({k: v for k, v in doc.items() if k != "options"})[:-1]
    OUT.write_text(f'{head}, "options": [\n{lines}\n]}}\n')
    print(f"{len(options)} options of vLLM {vllm.__version__} -> {OUT}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
