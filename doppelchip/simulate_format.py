"""The text a `simulate` (or `load`) summary prints: the summary lines, and a fleet's pool and
class tables. Printing only: the summary is the plain dict the simulation returned."""

from __future__ import annotations

from typing import Any


def format_fleet(s: dict[str, Any]) -> str:
    """--- fleet (issue 16) --- the per-pool and per-class tables, and the router's refusals."""
    lines = []
    lat = f"{'TTFT p50':>9} {'TTFT p99':>9} {'TPOT p50':>9} {'TPOT p99':>9}"
    if s.get("pools"):
        lines.append(f"{'pools':<16}{'role':<8} {'classes':<18} {'n':>3} {'requests':>8} "
                     f"{'errors':>6} {lat} {'$/h':>8}")
        for r in s["pools"]:
            lines.append(f"  {r['name']:<14}{r['role']:<8} {','.join(r['classes']) or 'any':<18} "
                         f"{r['replicas']:>3} {r['requests']:8d} {r['errors']:6d} "
                         f"{_latencies(r)} {r['usd_per_hour']:8.2f}")
    if s.get("classes"):
        lines.append(f"{'classes':<16}{'requests':>8} {'errors':>6} {lat}")
        for name, r in s["classes"].items():
            lines.append(f"  {name:<14}{r['requests']:8d} {r['errors']:6d} {_latencies(r)}")
    return "\n".join(lines + fleet_notes(s))


def fleet_notes(s: dict[str, Any]) -> list[str]:
    """The router's refusals and the P/D KV transfers, a line each (when there are any)."""
    lines = []
    if "admission_refused" in s:
        lines.append(f"admission       {s['admission_refused']} requests refused at the router "
                     "(RESOURCE_EXHAUSTED)")
    if "kv_transfers" in s:
        kv = s["kv_transfers"]
        lines.append(f"KV transfers    {kv['count']} prefill→decode, {kv['bytes'] / 1e9:.3f} GB, "
                     f"{kv['seconds'] * 1e3:.1f} ms on the links")
    return lines


def _latencies(r: dict[str, Any]) -> str:
    return " ".join(f"{r[k][q] * 1e3:7.1f}ms" for k in ("ttft_s", "tpot_s") for q in ("p50", "p99"))


def format_summary(s: dict[str, Any]) -> str:
    lines = [
        f"deployment      {s['deployment']}",
        f"requests        {s['requests']} ok, errors {s['errors'] or 'none'}"
        f" ({s['error_rate'] * 100:.1f}%)",
        f"duration        {s['duration_s']:.3f} s (emulated)",
        f"throughput      {s['requests_per_s']:.2f} req/s, "
        f"{s['output_tokens_per_s']:.1f} output tok/s, {s['input_tokens_per_s']:.1f} input tok/s"
        " (per emulated second)",
    ]
    if not s["requests"]:  # zeros would read as latencies
        lines.append("latencies       none: no request succeeded")
    for key in ("ttft_s", "tpot_s", "itl_s", "e2e_s") if s["requests"] else ():
        st = s[key]
        lines.append(f"{key[:-2]:<15} mean {st['mean'] * 1e3:9.2f} ms  p50 {st['p50'] * 1e3:9.2f}"
                     f"  p90 {st['p90'] * 1e3:9.2f}  p99 {st['p99'] * 1e3:9.2f}")
    if "goodput" in s:
        slo = ", ".join(f"{k} <= {v:g} s" for k, v in s["slo"].items())
        lines.append(f"goodput         {s['goodput']['requests_per_s']:.2f} req/s emulated "
                     f"({s['goodput']['fraction'] * 100:.1f}% of requests met {slo})")
    if "prefix_cache_hit_rate" not in s:  # a gRPC target: the server's side is in /metrics
        lines.append(f"prefix cache    {s['cached_prompt_tokens']} of {s['prompt_tokens']} "
                     "prompt tokens served from the cache")
        if "joules_per_mtok" in s:
            lines.append(f"energy, cost    {s['joules_per_mtok']:.4g} J and "
                         f"${s['usd_per_mtok']:.4g} per million output tokens (server metrics)")
        return "\n".join(lines)
    lines += [
        f"prefix cache    {s['prefix_cache_hit_rate'] * 100:.1f}% of prompt tokens hit, "
        f"{s['prefill_tokens']} tokens prefilled",
        *([f"CPU KV tier     {o['hit_tokens']} prompt tokens loaded instead of prefilled, "
           f"{o['loads']} loads ({o['load_bytes'] / 1e9:.3g} GB, {o['load_seconds']:.3g} s on "
           f"the host links)"] if (o := s.get("kv_offload")) else []),
        f"scheduler       {s['preemptions']} preemptions, peak {s['peak_running']} running, "
        f"KV usage mean {s['kv_usage_mean'] * 100:.1f}% peak {s['kv_usage_peak'] * 100:.1f}%",
        f"compile         {s['compiles']} compiles, {s['compile_stall_s']:.3f} s stalled"
        + (f"; cold start {s['cold_start_s']:.1f} s before serving" if s.get("cold_start_s")
           else ""),
        f"jump-forward    {s['jump_forward_tokens']} of {s['output_tokens']} output tokens "
        f"forced by the grammar, not decoded (jump-forward "
        f"{'on' if s.get('jump_forward') else 'off'})",
        f"energy, cost    {s['joules_per_mtok']:.4g} J and ${s['usd_per_mtok']:.4g} "
        f"per million output tokens" if "pooling" not in s else
        f"energy, cost    {s['pooling']['joules_per_m_input_tok']:.4g} J and "
        f"${s['pooling']['usd_per_m_input_tok']:.4g} per million input tokens (pooled)",
    ]
    return "\n".join(lines)


def replica_lines(s: dict[str, Any]) -> list[str]:
    """--- virtual-time clusters (issue 16) --- one line per replica: what it served, what it
    prefilled for a decode replica (P/D), its own prefix-cache hit rate."""
    out = []
    for r in s.get("replicas", ()):
        prefilled = f", {r['prefills']} prefilled" if r.get("prefills") else ""
        out.append(f"replica         {r['name']:<24} {r['requests']:6d} requests{prefilled}, "
                   f"prefix cache {r['prefix_cache_hit_rate'] * 100:5.1f}% hit ({r['chip']})")
    return out
