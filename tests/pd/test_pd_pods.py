"""P/D between two real pods on loopback, the test acting as llm-d's routing sidecar (prefill
with do_remote_decode and max_tokens 1, then decode with the returned kv_transfer_params):
the decode pod's emulated TTFT includes the KV transfer computed here from the catalogue
(bytes ÷ bandwidth), it computes only the last prompt token, and its tokens equal the
aggregated deployment's."""

from __future__ import annotations

import os

import httpx
import pytest
from server_proc import ServerProcess, free_run, metric

from devices import catalog
from devices.transfer import get_link

MODEL, CHIP = "llama-3.1-8b", "h100-sxm"
LINK = "eth-10g"  # a slow link, so the transfer dominates the decode pod's TTFT
POD = ["--chip", CHIP, "--engine", "vllm", "--model", MODEL, "--quant", "bf16",
       "--time-scale", "0.05"]
PROMPT = [(13 * i) % 5000 + 100 for i in range(4000)]


def kv_config(role: str, **extra) -> str:
    import json
    return json.dumps({"kv_connector": "NixlConnector", "kv_role": role,
                       "kv_connector_extra_config": {"link": LINK, **extra}})


def pod(role: str, port: int, **env: str) -> ServerProcess:
    os.environ.update({"VLLM_NIXL_SIDE_CHANNEL_PORT": str(port), **env})
    try:
        return ServerProcess(None, "--deployment", role, *POD,
                             "--kv-transfer-config", kv_config("kv_both")).start()
    finally:
        for k in ("VLLM_NIXL_SIDE_CHANNEL_PORT", *env):
            os.environ.pop(k, None)


def block_size() -> int:
    """Tokens per KV block: the pods name none, so the engine's on the chip (the catalogue's)."""
    return catalog.get_engine("vllm").block_size_on(catalog.get_chip(CHIP))


def kv_bytes_per_token() -> float:
    """K and V, every layer, every KV head, 2 bytes (bf16): from the model's catalogue entry."""
    m = catalog.get_model(MODEL)
    return 2 * m.n_layers * m.n_kv_heads * m.head_dim * catalog.get_quant("bf16").kv_bytes


def body(prompt=PROMPT, **extra) -> dict:
    return {"model": MODEL, "prompt": prompt, "max_tokens": 12, "seed": 7,
            "ignore_eos": True, **extra}


def scraped(server: ServerProcess) -> dict[str, float]:
    text = server.scrape()
    return {
        "ttft_sum": metric(text, "vllm:time_to_first_token_seconds_sum"),
        "ttft_n": metric(text, "vllm:time_to_first_token_seconds_count"),
        "local": metric(text, "vllm:prompt_tokens_by_source_total", source="local_compute"),
        "external": metric(text, "vllm:prompt_tokens_by_source_total",
                           source="external_kv_transfer"),
        "ok": metric(text, "doppelchip_kv_transfers_total", outcome="ok"),
        "failed": metric(text, "doppelchip_kv_transfers_total", outcome="failed"),
        "held": metric(text, "doppelchip_kv_held_blocks"),
        # vLLM 0.33.0's NIXL connector families (NixlPromMetrics)
        **{f"{name}_{part}": metric(text, f"vllm:nixl_{name}_{part}")
           for name in ("xfer_time_seconds", "post_time_seconds", "bytes_transferred",
                        "num_descriptors") for part in ("count", "sum")},
        **{name: metric(text, f"vllm:nixl_{name}_total")
           for name in ("num_failed_transfers", "num_failed_notifications",
                        "num_kv_expired_reqs", "num_notifications_after_expiry")},
    }


@pytest.fixture(scope="module")
def pods():
    base = free_run(2)
    prefill, decode = pod("prefill", base), pod("decode", base + 1)
    yield prefill, decode
    prefill.stop()
    decode.stop()


def test_decode_pod_charges_the_transfer_and_never_prefills_the_prompt(pods):
    prefill, decode = pods
    with httpx.Client(timeout=60) as http:
        aggregated = http.post(f"{prefill.http_url}/v1/completions", json=body()).json()
        assert aggregated["kv_transfer_params"] is None  # no P/D asked: nothing held
        # the sidecar's prefill request: do_remote_decode, max_tokens 1, not streamed
        p = http.post(f"{prefill.http_url}/v1/completions", json=body(
            max_tokens=1, kv_transfer_params={
                "do_remote_decode": True, "do_remote_prefill": False,
                "remote_engine_id": None, "remote_block_ids": None, "remote_host": None,
                "remote_port": None})).json()
        params = p["kv_transfer_params"]
        assert params["do_remote_prefill"] is True and params["do_remote_decode"] is False
        assert params["remote_host"] == "127.0.0.1" and params["tp_size"] == 1
        assert len(params["remote_block_ids"]) == -(-len(PROMPT) // block_size())
        assert scraped(prefill)["held"] == len(params["remote_block_ids"])
        before = scraped(decode)
        d = http.post(f"{decode.http_url}/v1/completions",
                      json=body(kv_transfer_params=params)).json()
    after = scraped(decode)
    assert d["choices"][0]["text"] == aggregated["choices"][0]["text"]  # same tokens
    assert d["usage"]["prompt_tokens_details"]["cached_tokens"] == len(PROMPT) - 1
    # the decode pod computed only the last prompt token (vLLM recomputes it for logits)
    assert after["local"] - before["local"] == 1
    assert after["external"] - before["external"] == len(PROMPT) - 1
    assert after["ok"] - before["ok"] == 1
    link = get_link(LINK)
    transfer = link.latency_s + kv_bytes_per_token() * (len(PROMPT) - 1) / link.bandwidth_bps
    ttft = after["ttft_sum"] - before["ttft_sum"]
    assert after["ttft_n"] - before["ttft_n"] == 1
    agg_ttft = scraped(prefill)["ttft_sum"] / scraped(prefill)["ttft_n"]
    assert transfer <= ttft < transfer + 0.5 * agg_ttft  # the transfer, then one short step
    # vLLM's NIXL families: one transfer by the pod's one worker, its time on the link, its
    # bytes, a descriptor per block and region (32 layers, K and V apart); no post time
    grew = {k: after[k] - before[k] for k in after}
    assert grew["xfer_time_seconds_count"] == grew["post_time_seconds_count"] == 1
    assert grew["xfer_time_seconds_sum"] == pytest.approx(transfer)
    assert grew["post_time_seconds_sum"] == 0
    assert grew["bytes_transferred_sum"] == pytest.approx(
        kv_bytes_per_token() * (len(PROMPT) - 1))
    layers = catalog.get_model(MODEL).n_layers
    assert grew["num_descriptors_sum"] == -(-(len(PROMPT) - 1) // block_size()) * layers * 2
    assert grew["num_failed_transfers"] == grew["num_kv_expired_reqs"] == 0
    assert scraped(prefill)["held"] == 0  # the decode side's notification freed the blocks


def test_released_blocks_are_recomputed_as_vllm_does(pods):
    """The prefill pod released the blocks (here: its hold expired at once) — the decode side's
    load fails and kv_load_failure_policy "recompute" (vLLM's default) prefills locally."""
    base = free_run(1)
    prefill = pod("prefill", base, VLLM_NIXL_ABORT_REQUEST_TIMEOUT="0")
    decode = pods[1]
    prompt = [(17 * i) % 5000 + 90 for i in range(1000)]  # not in the decode pod's cache
    try:
        with httpx.Client(timeout=60) as http:
            p = http.post(f"{prefill.http_url}/v1/completions", json=body(
                prompt, max_tokens=1, kv_transfer_params={"do_remote_decode": True})).json()
            params = p["kv_transfer_params"]
            before = scraped(decode)
            d = http.post(f"{decode.http_url}/v1/completions",
                          json=body(prompt, kv_transfer_params=params)).json()
            ref = http.post(f"{prefill.http_url}/v1/completions", json=body(prompt)).json()
        after = scraped(decode)
        assert d["choices"][0]["text"] == ref["choices"][0]["text"]
        assert after["failed"] - before["failed"] == 1
        assert after["num_failed_transfers"] - before["num_failed_transfers"] == 1
        assert after["xfer_time_seconds_count"] == before["xfer_time_seconds_count"]
        told = scraped(prefill)  # the prefill side: the hold expired, then the read came
        assert told["num_kv_expired_reqs"] == told["num_notifications_after_expiry"] == 1
        assert after["local"] - before["local"] == len(prompt)  # recomputed locally
        assert after["external"] == before["external"]
        assert "Releasing expired KV blocks" in prefill.log
    finally:
        prefill.stop()
