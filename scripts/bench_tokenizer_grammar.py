"""How long structured output takes to set up and sample with a tokenizer directory.

    .venv/bin/python scripts/bench_tokenizer_grammar.py [DIR ...]   # default: the packaged one

For each directory (``tokenizer.json`` + ``tokenizer_config.json``) it prints, in wall-clock
seconds on this host: building llguidance's tokenizer (``ConstraintCompiler`` setup, once per
process), compiling each grammar of a small fixed set (JSON schemas, regexes, a choice) up to
its first token mask (the median and the largest), and sampling the order schema token by token
with the mock model's constrained sampler (mean per token). Used to compare tokenizers
(docs/TOKENIZER.md); not a test: the numbers depend on the host.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

from clients.structured import ORDER_SCHEMA
from server.engine.constraints import ConstraintCompiler
from server.engine.interface import Constraint
from server.engine.tokenizer import TOKENIZER_DIR, Tokenizer

NESTED = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 10},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 4},
        "address": {"type": "object", "properties": {"city": {"type": "string"},
                                                     "zip": {"type": "string",
                                                             "pattern": "^[0-9]{5}$"}}},
    },
    "required": ["name", "age"],
}
CONSTRAINTS = [
    Constraint("json_schema", json.dumps(ORDER_SCHEMA)),
    Constraint("json_schema", json.dumps(NESTED)),
    Constraint("json_schema", json.dumps({"type": "object"})),
    Constraint("regex", r"[0-9]{3}-[0-9]{4}"),
    Constraint("regex", r"[A-Z][a-z]{1,8}( [A-Z][a-z]{1,8}){0,2}"),
    Constraint("choice", choices=("positive", "negative", "neutral")),
]


def bench(directory: Path, samples: int) -> dict[str, float]:
    tok = Tokenizer(directory)
    compiler = ConstraintCompiler(tok)
    t0 = time.perf_counter()
    compiler._setup()
    setup = time.perf_counter() - t0
    compile_s = []
    for c in CONSTRAINTS:
        t0 = time.perf_counter()
        compiler.start(c, 1 << 20).allowed()  # llguidance builds its lexer lazily
        compile_s.append(time.perf_counter() - t0)
    rng = random.Random(0)  # the mock model's per-token hash, as a seeded stream
    tokens, t0 = 0, time.perf_counter()
    for _ in range(samples):
        state = compiler.start(CONSTRAINTS[0], 1 << 20)
        for n in range(400):
            token = state.next_token(rng.getrandbits(64), closing=n > 100)
            tokens += 1
            if token == tok.eos_token_id:
                break
    sample = (time.perf_counter() - t0) / tokens
    return {"vocab_size": tok.vocab_size, "setup_s": setup,
            "compile_median_s": statistics.median(compile_s), "compile_max_s": max(compile_s),
            "sample_per_token_ms": sample * 1e3}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dirs", type=Path, nargs="*", default=[TOKENIZER_DIR])
    ap.add_argument("--samples", type=int, default=20, help="order-schema outputs to sample")
    args = ap.parse_args()
    for d in args.dirs:
        r = bench(d, args.samples)
        print(f"{d}: vocab {r['vocab_size']}, setup {r['setup_s']:.3f} s, compile median "
              f"{r['compile_median_s'] * 1e3:.1f} ms / max {r['compile_max_s'] * 1e3:.1f} ms, "
              f"sampling {r['sample_per_token_ms']:.3f} ms/token")


if __name__ == "__main__":
    main()
