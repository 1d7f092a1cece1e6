"""How fast is the device model? `python -m benchmarks.bench_estimate [--seconds S]`.

The engine calls ``step_cost`` once per step — thousands of times per second of virtual time —
and ``doppelchip estimate`` must answer well under a second. Measures, in one run:

* the calibration fit (paid once per process, on first use);
* ``place`` and ``estimate`` per call;
* ``step_cost`` calls per second for a few batch shapes, and the ratio of its time to a
  baseline measured alongside: building the same ``BatchShape`` and summing its contexts in
  plain Python (work the engine does anyway to describe the step).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable


def rate(fn: Callable[[], object], seconds: float) -> float:
    """Calls per second of ``fn`` over about ``seconds`` of wall time (best of 3 runs)."""
    best = 0.0
    for _ in range(3):
        n, t0 = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - t0) < seconds / 3:
            for _ in range(50):
                fn()
            n += 50
        best = max(best, n / elapsed)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=0.6,
                        help="wall time spent on each measurement")
    args = parser.parse_args()

    t0 = time.perf_counter()
    from devices import BatchShape, DeploymentSpec, estimate, place, step_cost
    from devices.calibration import fitted_factors

    fitted_factors()
    print(f"import + calibration fit: {(time.perf_counter() - t0) * 1e3:.0f} ms (once)")

    specs = {
        "vllm h100 8B": DeploymentSpec("llama-3.1-8b", "bf16", "h100-sxm", "vllm"),
        "llama.cpp 4090 70B": DeploymentSpec("llama-3.1-70b", "q4_k_m", "rtx-4090", "llama.cpp"),
        "groq 70B (578 chips)": DeploymentSpec("llama-2-70b", "f16", "groq-lpu-v1", "groq"),
    }
    print(f"\n{'deployment':24} {'place ms':>9} {'estimate b1 ms':>15} {'estimate b4 ms':>16}")
    for name, spec in specs.items():
        p = 1e3 / rate(lambda s=spec: place(s), args.seconds / 3)
        e1 = 1e3 / rate(lambda s=spec: estimate(s, 512, 128, 1), args.seconds / 3)
        e4 = 1e3 / rate(lambda s=spec: estimate(s, 512, 128, 4), args.seconds / 3)
        print(f"{name:24} {p:9.3f} {e1:15.3f} {e4:16.3f}")

    shapes = {
        "decode x1": ((), (1000,)),
        "decode x256": ((), tuple(range(500, 756))),
        "mixed 2048+64": (((2048, 0),), tuple(range(1000, 1064))),
    }
    print(f"\n{'deployment':24} {'batch':15} {'step_cost/s':>12} {'baseline/s':>12} {'ratio':>7}")
    for name, spec in specs.items():
        pl = place(spec)
        for label, (pre, dec) in shapes.items():
            batch = BatchShape(prefill=pre, decode=dec)
            cost_rate = rate(lambda pl=pl, b=batch: step_cost(pl, b), args.seconds)
            base_rate = rate(lambda p=pre, d=dec: sum(BatchShape(prefill=p, decode=d).decode),
                             args.seconds)
            print(f"{name:24} {label:15} {cost_rate:12,.0f} {base_rate:12,.0f} "
                  f"{base_rate / cost_rate:7.1f}x")


if __name__ == "__main__":
    main()
