"""`vllm:lora_requests_info` exactly as vLLM exports it (issue 13).

vLLM (`vllm/v1/metrics/loggers.py`, `PrometheusStatLogger`: `gauge_lora_info`, registered only
with `--enable-lora`, multiprocess mode `sum`): a gauge named `vllm:lora_requests_info`, help
"Running stats on lora requests.", labels `max_lora` (the `--max-loras` value),
`waiting_lora_adapters`, `running_lora_adapters` (adapter names joined by ","; "" when none)
— no `model_name`, no `engine` — set to the current Unix time (`set_to_current_time()`) for
the current combination every time stats are recorded; old combinations keep their last time,
so a reader takes the sample with the largest value. Here the engine records the combinations
(`server/engine_proc/lora.py`) and this renders them; in fleet mode a `deployment` label is
added, as on every series.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from server.engine.lora import LoraAdapter

LORA_INFO = "vllm:lora_requests_info"
LORA_INFO_HELP = "Running stats on lora requests."

Labels = list[tuple[str, str]]


def lora_file(stats_path: Path) -> Path:
    """The engine's adapter file, beside its stats file: `e{d}.{rank}.lora.json` (written by
    `server/engine_proc/lora.py`, read by front ends and scrapes)."""
    return stats_path.with_suffix(".lora.json")


def read_lora_file(path: Path) -> dict:
    """The file's document, or an empty one (no LoRA, engine not up yet)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {"adapters": [], "info": [], "max_lora": 0}


def adapters_of(doc: dict) -> list[LoraAdapter]:
    return [LoraAdapter(*a) for a in doc.get("adapters", [])]


def lora_info_lines(stats_paths: list[Path], max_lora: int, extra: Labels
                    ) -> Callable[[object], list[tuple[Labels, float]]]:
    """The scrape-time source of the gauge's samples for one deployment (all its ranks)."""
    paths = [lora_file(p) for p in stats_paths]

    def lines(_scrape: object) -> list[tuple[Labels, float]]:
        latest: dict[tuple[str, str], float] = {}
        for path in paths:
            for running, waiting, t in read_lora_file(path).get("info", []):
                key = (running, waiting)
                latest[key] = max(latest.get(key, 0.0), float(t))
        return [([*extra, ("max_lora", str(max_lora)), ("running_lora_adapters", running),
                  ("waiting_lora_adapters", waiting)], t)
                for (running, waiting), t in latest.items()]
    return lines
