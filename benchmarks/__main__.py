"""`python -m benchmarks` (`make bench`): run every benchmark module in this folder."""

from __future__ import annotations

import pkgutil
import runpy
import sys
from pathlib import Path

for info in sorted(pkgutil.iter_modules([str(Path(__file__).parent)]), key=lambda m: m.name):
    if info.name.startswith("bench_"):
        print(f"== benchmarks.{info.name}", flush=True)
        sys.argv = [info.name]
        runpy.run_module(f"benchmarks.{info.name}", run_name="__main__")
