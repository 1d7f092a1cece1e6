#!/usr/bin/env python3
"""Regenerate (--write) or check (--check) the outputs quoted in README.md and docs/*.md.

    .venv/bin/python scripts/docs_outputs.py --check            # exit 1 and a diff if stale
    .venv/bin/python scripts/docs_outputs.py --write [FILE ...] # rewrite them from real runs

Only blocks followed by a ```` ```text output ```` fence, and ```` ```console ```` blocks, are
run (the convention: docs/DOCS_TESTS.md); tests/docs runs every block and checks the same.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scripts.doccheck.blocks import doc_files, shell_blocks  # noqa: E402
from scripts.doccheck.outputs import mismatch, rewrite  # noqa: E402
from scripts.doccheck.runner import run_block, talks_to_server  # noqa: E402
from scripts.doccheck.shared import SharedServer  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="rewrite the quoted outputs")
    mode.add_argument("--check", action="store_true", help="fail when one has changed")
    p.add_argument("docs", nargs="*", type=Path, help="Markdown files (default: README.md "
                   "and docs/*.md)")
    p.add_argument("--root", type=Path, default=ROOT,
                   help="the repository whose .venv runs the commands (default: this one)")
    args = p.parse_args(argv)
    paths = args.docs or doc_files(args.root)
    shared = SharedServer(args.root)
    failed = 0
    try:
        # rewrite from the last block up so that earlier blocks' line numbers stay valid
        for path in paths:
            blocks = [b for b in shell_blocks(path)
                      if b.not_run is None and b.quoted_output is not None]
            for block in reversed(blocks):
                offset = shared.ensure() if talks_to_server(block) else None
                result = run_block(block, args.root, offset)
                if not result.ok:
                    print(f"{block.where}: exited {result.returncode}\n{result.output}",
                          file=sys.stderr)
                    failed += 1
                elif args.write:
                    if rewrite(block, result):
                        print(f"{block.where}: rewritten", file=sys.stderr)
                elif (diff := mismatch(block, result)) is not None:
                    print(diff, file=sys.stderr)
                    failed += 1
    finally:
        shared.stop()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
