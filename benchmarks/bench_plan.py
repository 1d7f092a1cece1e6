"""How long does `doppelchip plan` take on its default search space? `python -m
benchmarks.bench_plan`.

Runs the command as a new process (start-up included) for the issue's example question and
for one ten times the rate with ten times the requests, and reports wall seconds, CPU seconds
of the command and its pool workers, the candidates simulated, the winner, and the machine's
load average (the 2-core machine is shared: wall time is only comparable at equal load).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time

QUESTIONS = [
    ["--workload", "random", "--isl", "512", "--osl", "256", "--rate", "20",
     "--slo", "ttft=0.2,tpot=0.05"],
    ["--workload", "random", "--isl", "512", "--osl", "256", "--rate", "200",
     "--num-requests", "1000", "--slo", "ttft=0.2,tpot=0.05"],
]


def main() -> None:
    for question in QUESTIONS:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        load = os.getloadavg()[0]
        t0 = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "doppelchip.cli", "plan", *question,
                               "--json"], capture_output=True, text=True, check=True)
        wall = time.monotonic() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        plan = json.loads(proc.stdout.strip().splitlines()[-1])
        print(json.dumps({
            "command": "doppelchip plan " + " ".join(question),
            "wall_s": round(wall, 1),
            "cpu_s": round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime,
                           1),
            "load_average_1min": round(load, 1),
            "configs": plan["searched"]["configs"], "pruned": plan["searched"]["pruned"],
            "simulated": plan["searched"]["simulated"],
            "winner": f"{plan['replicas']} × {plan['deployment']}",
            "usd_per_hour": round(plan["usd_per_hour"], 3)}), flush=True)


if __name__ == "__main__":
    main()
