"""AIPerf (NVIDIA's load tool) against an embedding model's vLLM pod: its `embeddings`
endpoint type (`/v1/embeddings`) and its `cohere-rankings` one (`/v2/rerank`, vLLM's Cohere
alias). Small and bounded: 16 requests each, a few seconds of load. Every request succeeds,
AIPerf reads the vectors and the rankings it expects, and the server counted them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from server_proc import ServerProcess

from server.engine.tokenizer import TOKENIZER_DIR

AIPERF = Path(sys.executable).parent / "aiperf"
REPO = "Qwen/Qwen3-Embedding-0.6B"
N = 16


@pytest.fixture(scope="module")
def pod():
    with ServerProcess(None, REPO, "--max-model-len", "1k", "--time-scale", "0.05",
                       vllm=True) as server:
        yield server


def profile(pod, tmp_path: Path, *argv: str) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}  # see docs/TOKENIZER
    cmd = [str(AIPERF), "profile", "-m", REPO, "--url", pod.http_url, *argv,
           "--tokenizer", str(TOKENIZER_DIR), "--request-count", str(N), "--concurrency", "4",
           "--ui", "none", "--no-gpu-telemetry", "--artifact-dir", str(tmp_path)]
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return [json.loads(line) for line in
            (tmp_path / "profile_export.jsonl").read_text().splitlines()]


def served(pod) -> float:
    return sum(float(line.split()[-1]) for line in pod.scrape().splitlines()
               if line.startswith("vllm:request_success_total{") and 'reason="stop"' in line)


def test_aiperf_embeddings(pod, tmp_path):
    before = served(pod)
    records = profile(pod, tmp_path, "--endpoint-type", "embeddings", "--isl", "64",
                      "--isl-stddev", "0")
    assert len(records) == N and not any(r.get("error") for r in records)
    assert all(r["metrics"]["request_latency"]["value"] > 0 for r in records)
    assert served(pod) - before == N


def test_aiperf_cohere_rankings(pod, tmp_path):
    before = served(pod)
    records = profile(pod, tmp_path, "--endpoint-type", "cohere-rankings",
                      "--rankings-passages-mean", "4", "--rankings-passages-stddev", "0",
                      "--rankings-passages-prompt-token-mean", "32",
                      "--rankings-query-prompt-token-mean", "16")
    assert len(records) == N and not any(r.get("error") for r in records)
    assert served(pod) - before == N * 5  # a query and 4 passages pooled per request
