"""How fast does virtual time run? `python -m benchmarks.bench_simulate [--quick]`.

1. Vidur's comparison workload (issue 16), as a user runs it: the whole `doppelchip simulate`
   command in a child process, start-up included — wall and CPU seconds (the child's user +
   system), macro-stepped (the default) and single-stepped (`--no-macro-steps`) in the same
   run, and their ratio; the child's peak RSS for 1,000, 10,000 and 100,000 requests (memory
   against request count: flat, the summaries being streamed).
2. A 100,000-request cluster run: `simulate --config benchmarks/fleet8.toml --router
   least-requests` (eight H100 replicas) on the same workload shape at 80 req/s.
3. Requests simulated per CPU second in process for growing request counts (the random
   workload, 128 in / 128 out, all at once, on Llama 3.1 8B / H100 / vLLM) and how that rate
   holds as load grows.

`--quick` runs 1/10 of every request count (a smoke test of the script).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

FLEET = Path(__file__).with_name("fleet8.toml")
WORKLOAD = ["--workload", "random", "--isl", "512", "--osl", "256"]
VIDUR = ["simulate", "--chip", "h100-sxm", "--engine", "vllm", "--model", "llama-2-7b",
         "--quant", "bf16", *WORKLOAD]


def command(args: list[str]) -> dict:
    """Wall and CPU seconds and peak RSS of `doppelchip ARGS --json` in a child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    # the child's peak RSS alone: GNU time would need a package; /proc is read by the child
    out = subprocess.run([sys.executable, "-c", _CHILD, *args, "--json"], check=True,
                         capture_output=True, text=True, env=_env()).stdout
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    lines = out.strip().splitlines()
    summary, rss = json.loads(lines[-2]), int(lines[-1])
    return {"command": "doppelchip " + " ".join(args), "wall_s": round(wall, 2),
            "cpu_s": round(cpu, 2), "peak_rss_mb": round(rss / 1024), "steps": summary["steps"],
            "requests": summary["requests"]}


_CHILD = """import resource, sys
from doppelchip.cli import main
code = main(sys.argv[1:])
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
sys.exit(code)
"""


def _env() -> dict[str, str]:
    """As installed: byte-code cached (this machine sets PYTHONDONTWRITEBYTECODE)."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def vidur(n: int) -> dict:
    args = [*VIDUR, "--num-requests", str(n), "--rate", "10"]
    macro, single = command(args), command([*args, "--no-macro-steps"])
    return {"macro": macro, "single": single,
            "single_over_macro_wall": round(single["wall_s"] / macro["wall_s"], 2),
            "single_over_macro_cpu": round(single["cpu_s"] / macro["cpu_s"], 2)}


def in_process(scale: float) -> dict:
    from clients.workloads import WorkloadSpec
    from server.engine.options import EngineOptions
    from sim.simulation import simulate_options

    # every request queued (the default intake limit, 1,024 waiting, would refuse most of an
    # all-at-once burst: then the rate measured would be of refusals)
    h100 = EngineOptions(name="h100", model="llama-3.1-8b", quant="bf16", chip="h100-sxm",
                         engine="vllm", max_waiting=1_000_000)
    rows = []
    for n in (int(1_000 * scale), int(3_000 * scale), int(10_000 * scale)):
        t0 = time.process_time()
        s = simulate_options(h100, WorkloadSpec(num_requests=n, isl=128, osl=128,
                                                ignore_eos=True))
        cpu = time.process_time() - t0
        assert s["requests"] == n, s["errors"]
        rows.append({"requests": n, "cpu_s": round(cpu, 3), "requests_per_cpu_s": round(n / cpu),
                     "steps": s["steps"], "emulated_s": round(s["emulated_s"], 2)})
    return {"runs": rows, "rate_ratio_largest_over_smallest": round(
        rows[-1]["requests_per_cpu_s"] / rows[0]["requests_per_cpu_s"], 3)}


def main() -> None:
    scale = 0.1 if "--quick" in sys.argv else 1.0
    command([*VIDUR, "--num-requests", "1"])  # warm the byte-code cache
    out = {"vidur_command": vidur(int(10_000 * scale))}
    for n in (1_000, 100_000):  # memory against request count (streamed summaries)
        out[f"vidur_memory_{n}"] = command([*VIDUR, "--num-requests", str(int(n * scale)),
                                            "--rate", "10"])
    cluster = ["simulate", "--config", str(FLEET), "--router", "least-requests", *WORKLOAD,
               "--num-requests", str(int(100_000 * scale)), "--rate", "80"]
    out["cluster"] = command(cluster)
    out["in_process"] = in_process(scale)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
