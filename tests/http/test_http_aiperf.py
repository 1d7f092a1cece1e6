"""AIPerf (`aiperf profile`, NVIDIA's load tool) through doppelchip's own HTTP, without server
token counts: the tokens it counts by re-tokenizing the streamed text are the tokens the server
generated (the mock's free text re-tokenizes to itself), and its server-metrics collection reads
`/metrics`. Small and bounded: 24 requests, a few seconds of load."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from server.engine.mock_model import MockModel, OutputLengths
from server.engine.request import Request, SamplingParams
from server.engine.tokenizer import TOKENIZER_DIR, get_tokenizer

AIPERF = Path(sys.executable).parent / "aiperf"
N, ISL, OSL = 24, 48, 24


def test_mock_free_text_retokenizes_to_itself():
    tok = get_tokenizer()
    model = MockModel.from_tokenizer(tok, OutputLengths("geometric", 1e9))
    for seed in range(5):
        req = Request("r", tok.encode("Once upon a time"), SamplingParams(
            max_tokens=400, ignore_eos=True, seed=seed))
        while req.num_output_tokens < 400:
            req.token_ids.append(model.next_token(req))
        ids = req.output_token_ids
        assert set(ids) <= set(tok.free_text_token_ids)
        assert tok.encode(tok.decode(ids)) == list(ids)
    assert len(tok.free_text_token_ids) > 10_000  # a rich vocabulary, not a handful of words


def test_aiperf_profile_counts_what_the_server_generated(server, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}  # see docs/TOKENIZER
    url = server.http_url
    cmd = [str(AIPERF), "profile", "-m", "llama-3.1-8b", "--url", url,
           "--endpoint-type", "completions", "--streaming", "--tokenizer", str(TOKENIZER_DIR),
           "--request-count", str(N), "--concurrency", "4", "--isl", str(ISL), "--isl-stddev",
           "0", "--osl", str(OSL), "--extra-inputs", "ignore_eos:true", "--ui", "none",
           "--no-gpu-telemetry", "--server-metrics", f"{url}/metrics",
           "--artifact-dir", str(tmp_path)]
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    records = [json.loads(line) for line in
               (tmp_path / "profile_export.jsonl").read_text().splitlines()]
    assert len(records) == N
    for r in records:
        m = r["metrics"]
        assert m["output_sequence_length"]["value"] == OSL  # counted by AIPerf's tokenizer
        assert m["usage_completion_tokens"]["value"] == OSL  # what the server says
        # the server adds BOS to a completion prompt, as vLLM does for Llama 3
        assert m["usage_prompt_tokens"]["value"] - m["input_sequence_length"]["value"] in (0, 1)
    summary = json.loads((tmp_path / "profile_export_aiperf.json").read_text())
    assert summary["request_count"]["avg"] == N
    scraped = json.loads((tmp_path / "server_metrics_export.json").read_text())
    assert scraped["summary"]["endpoints_successful"] == [f"{url}/metrics"]
    metrics = scraped["metrics"]
    fast = [s for s in metrics["vllm:generation_tokens"]["series"]
            if s["labels"]["deployment"] == "fast"]
    assert fast[0]["stats"]["total"] >= N * OSL
    assert any(k.startswith("http_request") for k in metrics)  # the HTTP series, scraped too
