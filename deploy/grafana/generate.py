"""Generate doppelchip's Grafana dashboards (the JSON next to this file is its output).

    python deploy/grafana/generate.py            # rewrite deploy/grafana/dashboards/*.json
    python deploy/grafana/generate.py --check    # exit 1 if the committed JSON is stale

Two dashboards, both with a `deployment` variable (multi-select, compared side by side):
- serving: latency percentiles, throughput, scheduler state, KV usage, prefix-cache hit rate,
  finish reasons, preemptions (vLLM's metric names, so vLLM deployments show up too);
- devices: bandwidth and FLOP utilisation, bound, memory tiers, SSD page-ins, compile stalls,
  energy and cost per token (doppelchip's own `doppelchip_` metrics); a row of the CPU KV tier
  (prompt tokens by source, offload traffic, hit rate, pinned share: vLLM's names); and a row
  of injected faults (failures by type, stream cuts, device faults, hang/slowdown/lost KV).
No query hides missing data behind a fallback (`or vector(0)` and the like): an empty panel
means the metric is missing. `tests/observability/test_obs_panels.py` runs every query against
a real Prometheus scraping a loaded server. docs/OBSERVABILITY.md describes each panel.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
OUT = HERE / "dashboards"
DS = {"type": "prometheus", "uid": "${datasource}"}
SEL = 'deployment=~"$deployment"'
RI = "$__rate_interval"

Target = tuple[str, str]  # (PromQL, legend)


def rate(metric: str, by: str = "deployment", extra: str = "") -> str:
    sel = SEL + (f",{extra}" if extra else "")
    return f"sum by ({by}) (rate({metric}{{{sel}}}[{RI}]))"


def quantile(q: float, hist: str) -> str:
    return f"histogram_quantile({q}, {rate(hist + '_bucket', 'le, deployment')})"


def percentiles(hist: str) -> list[Target]:
    return [(quantile(q, hist), f"p{round(q * 100)} {{{{deployment}}}}") for q in (0.5, 0.9, 0.99)]


def per_busy_second(metric: str, by: str = "deployment") -> str:
    busy = rate("doppelchip_busy_seconds_total")
    return f"{rate(metric, by)} / on (deployment) group_left {busy}"


def panel(title: str, description: str, targets: list[Target], unit: str = "short",
          kind: str = "timeseries", stack: bool = False) -> dict[str, Any]:
    p: dict[str, Any] = {
        "type": kind,
        "title": title,
        "description": description,
        "datasource": DS,
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "targets": [
            {"datasource": DS, "refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend}
            for i, (expr, legend) in enumerate(targets)
        ],
    }
    if stack:
        p["fieldConfig"]["defaults"]["custom"] = {"stacking": {"mode": "normal"}}
    return p


def dashboard(uid: str, title: str, description: str, panels: list[dict[str, Any]]) -> dict:
    for i, p in enumerate(panels):  # two panels per row, 12 × 8 each
        p["id"] = i + 1
        p["gridPos"] = {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)}
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["doppelchip", "vllm"],
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "refresh": "10s",
        "time": {"from": "now-30m", "to": "now"},
        "timezone": "browser",
        "templating": {"list": [
            {"name": "datasource", "type": "datasource", "query": "prometheus",
             "label": "Data source", "current": {}, "hide": 0},
            {"name": "deployment", "type": "query", "datasource": DS, "label": "Deployment",
             "query": {"query": "label_values(vllm:num_requests_running, deployment)",
                       "refId": "deployments"},
             "definition": "label_values(vllm:num_requests_running, deployment)",
             "multi": True, "includeAll": True, "allValue": ".*", "refresh": 2,
             "current": {"text": "All", "value": "$__all"}, "sort": 1, "hide": 0},
        ]},
        "annotations": {"list": []},
        "panels": panels,
    }


def serving() -> dict:
    tokens = "vllm:generation_tokens_total"
    return dashboard("doppelchip-serving", "doppelchip — serving overview",
                     "Request latency, throughput and scheduler state per deployment "
                     "(vLLM metric names; emulated seconds).", [
        panel("Time to first token", "Arrival → first token; percentiles from "
              "vllm:time_to_first_token_seconds.",
              percentiles("vllm:time_to_first_token_seconds"), "s"),
        panel("Inter-token latency", "Between successive tokens of a request (interval/n for "
              "n tokens at once); vllm:inter_token_latency_seconds.",
              percentiles("vllm:inter_token_latency_seconds"), "s"),
        panel("End-to-end latency", "Arrival → last token; vllm:e2e_request_latency_seconds.",
              percentiles("vllm:e2e_request_latency_seconds"), "s"),
        panel("Token throughput", "Prompt and generated tokens per second.", [
            (rate("vllm:prompt_tokens_total"), "prompt {{deployment}}"),
            (rate(tokens), "generation {{deployment}}")], "short"),
        panel("Scheduler state", "Requests running (in the batch) and waiting.", [
            (f"sum by (deployment) (vllm:num_requests_running{{{SEL}}})",
             "running {{deployment}}"),
            (f"sum by (deployment) (vllm:num_requests_waiting{{{SEL}}})",
             "waiting {{deployment}}")], "short"),
        panel("KV-cache usage", "Share of KV blocks in use (1 = full).", [
            (f"max by (deployment) (vllm:kv_cache_usage_perc{{{SEL}}})", "{{deployment}}")],
              "percentunit"),
        panel("Prefix-cache hit rate", "Prompt tokens served from the prefix cache / prompt "
              "tokens looked up; no series for a deployment that looks nothing up (prefix "
              "caching off, or an encoder: vLLM counts no query then).", [
            (f"{rate('vllm:prefix_cache_hits_total')} / "
             f"({rate('vllm:prefix_cache_queries_total')} > 0)", "{{deployment}}")],
              "percentunit"),
        panel("Finish reasons", "Finished requests per second by reason (stop, length, abort, "
              "error).", [
            (rate("vllm:request_success_total", "deployment, finished_reason"),
             "{{finished_reason}} {{deployment}}")], "reqps", stack=True),
        panel("Preemptions", "Requests preempted (KV recomputed) per second.", [
            (rate("vllm:num_preemptions_total"), "{{deployment}}")], "short"),
        panel("Speculative decoding", "Drafts accepted per draft verified (vllm:spec_decode_"
              "num_accepted_tokens_total / _num_draft_tokens_total), and tokens per "
              "verification step, the bonus token included (1 + accepted / steps: vLLM's mean "
              "acceptance length); no series for a deployment that does not speculate.", [
            (f"{rate('vllm:spec_decode_num_accepted_tokens_total')} / "
             f"({rate('vllm:spec_decode_num_draft_tokens_total')} > 0)",
             "acceptance rate {{deployment}}"),
            (f"1 + {rate('vllm:spec_decode_num_accepted_tokens_total')} / "
             f"({rate('vllm:spec_decode_num_drafts_total')} > 0)",
             "tokens per step {{deployment}}")], "short"),
        panel("Queue, prefill and decode time (p90)", "Per-request phases: queue = arrival → "
              "scheduled, prefill = scheduled → first token, decode = first → last token.", [
            (quantile(0.9, "vllm:request_queue_time_seconds"), "queue {{deployment}}"),
            (quantile(0.9, "vllm:request_prefill_time_seconds"), "prefill {{deployment}}"),
            (quantile(0.9, "vllm:request_decode_time_seconds"), "decode {{deployment}}")], "s"),
        panel("Tokens per engine step (p50 / p99)", "vllm:iteration_tokens_total.", [
            (quantile(0.5, "vllm:iteration_tokens_total"), "p50 {{deployment}}"),
            (quantile(0.99, "vllm:iteration_tokens_total"), "p99 {{deployment}}")], "short"),
        panel("Real-time lag", "How far the last step ended behind its emulated deadline: "
              "non-zero means the host cannot keep up with the emulated device.", [
            (f"max by (deployment) (doppelchip_realtime_lag_seconds{{{SEL}}})",
             "{{deployment}}")], "s"),
        # --- LoRA (issue 13) ---
        panel("LoRA adapters running / waiting", "vllm:lora_requests_info: the newest sample "
              "(its value is the Unix time it was last current) names the adapters running "
              "and waiting; max_lora = --max-loras.", [
            (f"topk by (deployment) (1, vllm:lora_requests_info{{{SEL}}})",
             "running [{{running_lora_adapters}}] waiting [{{waiting_lora_adapters}}] "
             "{{deployment}}")], "dateTimeAsIso", kind="table"),
        panel("Requests deferred by max_loras", "Waiting requests the scheduler skipped "
              "because their adapter would exceed --max-loras in the batch "
              "(vllm:num_requests_waiting_by_reason{reason=\"deferred\"}).", [
            (f"sum by (deployment) (vllm:num_requests_waiting_by_reason"
             f"{{{SEL},reason=\"deferred\"}})", "{{deployment}}")], "short"),
    ])


def devices() -> dict:
    gen = rate("vllm:generation_tokens_total")
    return dashboard("doppelchip-devices", "doppelchip — devices",
                     "The emulated accelerators: utilisation, bound, memory tiers, compile "
                     "stalls, energy and cost, compared across deployments.", [
        panel("Bandwidth utilisation per tier", "Bytes moved per busy second / the tier's "
              "peak bandwidth (all chips).", [
            (f"{per_busy_second('doppelchip_tier_bytes_total', 'deployment, tier')} / on "
             f"(deployment, tier) sum by (deployment, tier) "
             f"(doppelchip_tier_peak_bandwidth_bytes_per_second{{{SEL}}})",
             "{{tier}} {{deployment}}")], "percentunit"),
        panel("FLOP utilisation", "FLOPs per busy second / dense peak FLOP/s (all chips).", [
            (f"{per_busy_second('doppelchip_flops_total')} / sum by (deployment) "
             f"(doppelchip_peak_flops_per_second{{{SEL}}})", "{{deployment}}")],
              "percentunit"),
        panel("Bound", "Share of busy time bounded by memory, compute, overhead or links.", [
            (per_busy_second("doppelchip_bound_seconds_total", "deployment, bound"),
             "{{bound}} {{deployment}}")], "percentunit", stack=True),
        panel("Weights resident per tier", "Where the weights live (bytes).", [
            (f"sum by (deployment, tier) (doppelchip_weights_resident_bytes{{{SEL}}})",
             "{{tier}} {{deployment}}")], "bytes"),
        panel("KV cache resident per tier", "KV bytes in use.", [
            (f"sum by (deployment, tier) (doppelchip_kv_resident_bytes{{{SEL}}})",
             "{{tier}} {{deployment}}")], "bytes"),
        panel("SSD page-ins", "Weight bytes re-read from SSD per second (llama.cpp, model "
              "larger than RAM).", [
            (rate("doppelchip_ssd_page_in_bytes_total"), "{{deployment}}")], "Bps"),
        panel("Compile stalls", "Compiles per second by reason (new shape, recompile, "
              "cold start).", [
            (rate("doppelchip_compile_events_total", "deployment, reason"),
             "{{reason}} {{deployment}}")], "short"),
        panel("Compile and pipeline-idle seconds", "Emulated seconds per second spent "
              "compiling (by reason) and with the pipeline idle waiting on a compile.", [
            (rate("doppelchip_compile_seconds_total", "deployment, reason"),
             "compile {{reason}} {{deployment}}"),
            (rate("doppelchip_pipeline_idle_seconds_total"), "pipeline idle {{deployment}}")],
              "s"),
        panel("Energy per token", "Joules drawn (busy, stalled and idle) per generated token.",
              [(f"{rate('doppelchip_energy_joules_total')} / ({gen} > 0)", "{{deployment}}")],
              "J"),
        panel("Cost per million tokens", "The deployment's price for its time per million "
              "generated tokens (USD); no series for a deployment that generates none.", [
            (f"1e6 * {rate('doppelchip_cost_dollars_total')} / ({gen} > 0)", "{{deployment}}")],
              "currencyUSD"),
        panel("Cost per million prompt tokens", "The deployment's price for its time per "
              "million prompt tokens (USD): how an embedding model or a reranker is priced.", [
            (f"1e6 * {rate('doppelchip_cost_dollars_total')} / "
             f"({rate('vllm:prompt_tokens_total')} > 0)", "{{deployment}}")], "currencyUSD"),
        panel("Step time (p50 / p99)", "Emulated duration of an engine step, stalls included.",
              [(quantile(0.5, "doppelchip_step_seconds"), "p50 {{deployment}}"),
               (quantile(0.99, "doppelchip_step_seconds"), "p99 {{deployment}}")], "s"),
        panel("Inter-token latency, fine (p50 / p99)", "Sub-millisecond buckets "
              "(doppelchip_inter_token_latency_seconds) for SRAM chips.", [
            (quantile(0.5, "doppelchip_inter_token_latency_seconds"), "p50 {{deployment}}"),
            (quantile(0.99, "doppelchip_inter_token_latency_seconds"), "p99 {{deployment}}")],
              "s"),
        panel("Jump-forward tokens", "Output tokens forced by a grammar per second.", [
            (rate("doppelchip_jump_forward_tokens_total"), "{{deployment}}")], "short"),
        panel("Chips", "Chips each deployment is placed on.", [
            (f"sum by (deployment, chip) (doppelchip_chips{{{SEL}}})",
             "{{chip}} {{deployment}}")], "short", kind="stat"),
        *pd_sleep_panels(),
        *kv_tier_panels(),
        *fault_panels(),
    ])


# --- vLLM's CPU KV offloading (docs/KV_OFFLOAD.md): a row of the devices dashboard ----------
def kv_tier_panels() -> list[dict[str, Any]]:
    return [
        panel("Prompt tokens by source", "Prompt tokens per second computed on the chip, found "
              "in its prefix cache, or received from outside it (the CPU tier, a P/D "
              "transfer): vllm:prompt_tokens_by_source_total.", [
            (rate("vllm:prompt_tokens_by_source_total", "deployment, source"),
             "{{source}} {{deployment}}")], "short", stack=True),
        panel("CPU KV tier traffic", "KV bytes per second stored to the CPU tier (GPU→CPU) "
              "and loaded back (CPU→GPU), over the host link: vllm:kv_offload_store_bytes, "
              "vllm:kv_offload_load_bytes.", [
            (rate("vllm:kv_offload_store_bytes_total"), "GPU→CPU {{deployment}}"),
            (rate("vllm:kv_offload_load_bytes_total"), "CPU→GPU {{deployment}}")], "Bps"),
        panel("CPU KV tier hit rate", "Prompt tokens found in the CPU tier / tokens looked up "
              "there (those past the device's own hit): vllm:external_prefix_cache_*.", [
            (f"{rate('vllm:external_prefix_cache_hits_total')} / "
             f"({rate('vllm:external_prefix_cache_queries_total')} > 0)", "{{deployment}}")],
              "percentunit"),
        panel("CPU KV tier pinned", "Share of the CPU tier pinned by transfers in flight "
              "(vllm:kv_offload_cpu_cache_usage_perc; 1 = stores may be dropped).", [
            (f"max by (deployment) (vllm:kv_offload_cpu_cache_usage_perc{{{SEL}}})",
             "{{deployment}}")], "percentunit"),
    ]


# --- P/D and sleep mode (issue 13): the last row of the devices dashboard ------------------
def pd_sleep_panels() -> list[dict[str, Any]]:
    return [
        panel("Sleep state", "vllm:engine_sleep_state: awake, weights offloaded (level 1) or "
              "discarded (level 2).", [
            (f"max by (deployment, sleep_state) (vllm:engine_sleep_state{{{SEL}}})",
             "{{sleep_state}} {{deployment}}")], "short"),
        panel("Wake-up time", "Emulated seconds per second spent bringing weights back "
              "(host link after level 1, storage after level 2).", [
            (rate("doppelchip_wake_seconds_total"), "{{deployment}}")], "s"),
        panel("KV transfers (P/D)", "KV-cache transfers a decode pod pulled from prefill pods "
              "per second, by outcome (failed: the prefill pod no longer held the blocks).", [
            (rate("doppelchip_kv_transfers_total", "deployment, outcome"),
             "{{outcome}} {{deployment}}")], "short"),
        panel("KV transfer bytes and held blocks (P/D)", "KV bytes pulled per second (decode "
              "pods); blocks a prefill pod holds for its decode side.", [
            (rate("doppelchip_kv_transfer_bytes_total"), "pulled {{deployment}}"),
            (f"sum by (deployment) (doppelchip_kv_held_blocks{{{SEL}}})",
             "held blocks {{deployment}}")], "short"),
        panel("Requests fetching KV, by stage", "vllm:num_requests_kv_fetch_by_stage (KV "
              "consumers: P/D decode pods, CPU tiers): not started, in progress, arrived and "
              "not yet running.", [
            (f"sum by (deployment, stage) (vllm:num_requests_kv_fetch_by_stage{{{SEL}}})",
             "{{stage}} {{deployment}}")], "short"),
    ]


def fault_panels() -> list[dict[str, Any]]:
    """Failure injection (issue 13; docs/FAULTS.md): one row of request-level faults, one of
    device faults."""
    return [
        panel("Injected failures", "Generation requests refused by failure injection per "
              "second, by llm-d-inference-sim's failure type.", [
            (rate("doppelchip_failure_injections_total", "deployment, failure_type"),
             "{{failure_type}} {{deployment}}")], "reqps", stack=True),
        panel("Stream cuts", "Streams cut mid-response by fault injection per second.", [
            (rate("doppelchip_stream_cuts_total"), "{{deployment}}")], "short"),
        panel("Device faults", "Faults started per second (slowdown, hang, crash, lost "
              "chips) and which are in force now.", [
            (rate("doppelchip_fault_events_total", "deployment, fault"),
             "started {{fault}} {{deployment}}"),
            (f"max by (deployment, fault) (doppelchip_fault_active{{{SEL}}})",
             "active {{fault}} {{deployment}}")], "short"),
        panel("Hang, slowdown and lost KV", "Seconds per second without progress (hang), the "
              "step-time factor in force (slowdown) and KV blocks lost with chips.", [
            (rate("doppelchip_hang_seconds_total"), "hang s/s {{deployment}}"),
            (f"max by (deployment) (doppelchip_slowdown_factor{{{SEL}}})",
             "slowdown × {{deployment}}"),
            (f"max by (deployment) (doppelchip_kv_lost_blocks{{{SEL}}})",
             "lost blocks {{deployment}}")], "short"),
    ]


DASHBOARDS = {"serving.json": serving, "devices.json": devices}


def render() -> dict[str, str]:
    return {name: json.dumps(build(), indent=2, sort_keys=True) + "\n"
            for name, build in DASHBOARDS.items()}


def main(argv: list[str]) -> int:
    files = render()
    if "--check" in argv:
        stale = [n for n, text in files.items()
                 if not (OUT / n).exists() or (OUT / n).read_text() != text]
        if stale:
            print(f"stale: {', '.join(stale)}; run python deploy/grafana/generate.py")
        return 1 if stale else 0
    OUT.mkdir(exist_ok=True)
    for name, text in files.items():
        (OUT / name).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
