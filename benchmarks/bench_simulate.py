"""How fast does virtual time run? `python -m benchmarks.bench_simulate`.

Simulates the random workload (128 in / 128 out, all at once) on Llama 3.1 8B / H100 / vLLM
for growing request counts and reports requests simulated per CPU second, and how that rate
holds up as load grows (the ratio of the largest run's rate to the smallest's; ~1 means the
cost per request does not grow with the number of requests in flight).
"""

from __future__ import annotations

import json
import time

from clients.workloads import WorkloadSpec
from server.engine.build import EngineOptions
from sim.simulation import simulate_options

H100 = EngineOptions(name="h100", model="llama-3.1-8b", quant="bf16", chip="h100-sxm",
                     engine="vllm")


def main() -> None:
    rows = []
    for n in (1_000, 3_000, 10_000):
        t0 = time.process_time()
        s = simulate_options(H100, WorkloadSpec(num_requests=n, isl=128, osl=128,
                                                ignore_eos=True))
        cpu = time.process_time() - t0
        rows.append({"requests": n, "cpu_s": round(cpu, 3), "requests_per_cpu_s": round(n / cpu),
                     "steps": s["steps"], "emulated_s": round(s["emulated_s"], 2)})
    summary = {"runs": rows,
               "rate_ratio_largest_over_smallest": round(
                   rows[-1]["requests_per_cpu_s"] / rows[0]["requests_per_cpu_s"], 3)}
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
