"""Disaggregated P/D pools in virtual time (issue 16; sim/pd.py, the P/D hop of
sim/virtual_pd.py): each request is prefilled on a prefill replica (max_tokens 1),
its KV crosses the catalogue link in exactly `devices.transfer.transfer_seconds` once the
decode replica admits it (a seat taken delays the pull), and it is decoded there without
recomputing the prompt. Against the same chips
aggregated, on long prompts, decode is steadier (no prefill chunk in its steps)."""

from __future__ import annotations

import json
import re
from html import escape as html_escape

import pytest
from fleet_helpers import H100, assert_all_released, pool, run, sessions

from devices import catalog
from devices.transfer import get_link, kv_link, transfer_seconds
from doppelchip.cli import main
from sim.pools import FleetError

LONG = dict(kind="random", num_requests=60, isl=4096, osl=64, rate=8.0)
PD = [pool(H100, "prefill", replicas=2, role="prefill"),
      pool(H100, "decode", replicas=2, role="decode")]
AGG = [pool(H100, "agg", replicas=4)]


def expected_transfer(prompt_tokens: int, link=None) -> float:
    """From the model's own KV size (layers × KV heads × head dim × K and V × bf16), not
    from the placement the simulator reads."""
    per_token = catalog.get_model("llama-3.1-8b").kv_bytes_per_token(2.0)
    chip = catalog.get_chip("h100-sxm")
    return transfer_seconds(per_token * (prompt_tokens - 1), link or kv_link(chip, chip), 1)


def test_pd_moves_the_kv_and_decodes_without_recompute():
    cr, results, s = run(PD, "round-robin", sessions(**LONG))
    assert s["requests"] == 60 and not s["errors"]
    for rec, res in zip(cr.run.records, results, strict=True):
        assert rec.prefill_replica in (0, 1) and rec.replica in (2, 3)  # both replicas shown
        assert rec.kv_transfer_s == pytest.approx(expected_transfer(rec.prompt_tokens),
                                                  rel=1e-12)
        assert rec.token_times[0] >= rec.prefill_end_s + rec.kv_transfer_s
        assert rec.prefill_end_s > rec.scheduled_s and res.ttft >= rec.kv_transfer_s
        assert rec.output_tokens == 64  # all from the decode side (the prefill's 1 is not sent)
    stats = [r.core.scheduler.stats for r in cr.replicas]
    assert stats[0].num_prefill_tokens + stats[1].num_prefill_tokens == 60 * 4096
    assert stats[2].num_prefill_tokens + stats[3].num_prefill_tokens == 60  # the last token
    assert stats[2].external_prefix_cache_hits + stats[3].external_prefix_cache_hits == \
        60 * 4095
    assert cr.dispatch.links.transfers == 60
    assert_all_released(cr)  # nothing held on the prefill side, nothing left on decode


def test_transfers_on_one_decode_link_queue():
    work = sessions(**{**LONG, "num_requests": 4, "rate": float("inf")})
    cr, _, _ = run([pool(H100, "p", replicas=4, role="prefill"),
                    pool(H100, "d", role="decode")], "round-robin", work)
    recs = sorted(cr.run.records, key=lambda r: r.token_times[0])
    t, x = recs[0].prefill_end_s, recs[0].kv_transfer_s
    assert {r.prefill_replica for r in recs} == {0, 1, 2, 3}
    assert all(r.prefill_end_s == t and r.kv_transfer_s == x for r in recs)  # together
    # four transfers to the one decode replica follow each other on its link
    assert cr.dispatch.links.free_at[4] == pytest.approx(t + 4 * x, rel=1e-12)
    for i, r in enumerate(recs):
        assert r.token_times[0] >= t + (i + 1) * x
    assert recs[-1].token_times[0] - recs[0].token_times[0] >= 3 * x * (1 - 1e-9)


def test_pd_trades_ttft_for_steadier_decode_on_long_prompts():
    work = sessions(**LONG)
    _, _, pd = run(PD, "least-requests", work)
    _, _, agg = run(AGG, "least-requests", work)
    assert pd["requests"] == agg["requests"] == 60
    assert pd["tpot_s"]["p99"] < agg["tpot_s"]["p99"]
    assert pd["itl_s"]["p99"] < agg["itl_s"]["p99"] / 5  # no 4096-token chunk in a decode step
    assert pd["ttft_s"]["mean"] > agg["ttft_s"]["mean"]  # the price: transfer, fewer prefillers


def test_a_named_link_is_used():
    cfg = ('{"kv_connector":"NixlConnector","kv_role":"kv_both",'
           '"kv_connector_extra_config":{"link":"eth-100g"}}')
    fleet = [PD[0], pool(H100, "decode", replicas=2, role="decode", kv_transfer_config=cfg)]
    cr, _, _ = run(fleet, "round-robin", sessions(**{**LONG, "num_requests": 4}))
    for rec in cr.run.records:
        assert rec.kv_transfer_s == pytest.approx(
            expected_transfer(rec.prompt_tokens, get_link("eth-100g")), rel=1e-12)


@pytest.mark.parametrize("fleet, why", [
    ([PD[0]], "needs a decode pool"),
    ([PD[1], pool(H100, "x")], "needs a prefill pool"),
    ([*PD, pool(H100, "x")], "give x a role"),
    ([PD[0], pool(H100, "d", role="decode", model="llama-3.1-70b", tp=4)], "same model"),
])
def test_pools_that_cannot_serve_are_refused(fleet, why):
    with pytest.raises(FleetError, match=why):
        run(fleet, "round-robin", sessions(kind="random", num_requests=2))


def test_the_command_reports_both_sides(capsys):
    assert main(["simulate", "--config", "examples/fleet-pd.toml", "--router", "round-robin",
                 "--num-requests", "8", "--isl", "2048", "--osl", "8", "--json"]) == 0
    s = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert [(p["name"], p["role"], p.get("prefills")) for p in s["pools"]] == [
        ("prefill", "prefill", 8), ("decode", "decode", None)]
    assert [r["prefills"] for r in s["replicas"]] == [4, 4, 0, 0]
    assert [r["requests"] for r in s["replicas"]] == [0, 0, 4, 4]
    assert s["kv_transfers"]["count"] == 8
    assert s["kv_transfers"]["seconds"] == pytest.approx(8 * expected_transfer(2048))


def test_the_terminal_and_the_html_report_show_what_each_replica_did(tmp_path, capsys):
    html = tmp_path / "pd.html"
    assert main(["simulate", "--config", "examples/fleet-pd.toml", "--router", "round-robin",
                 "--num-requests", "8", "--isl", "2048", "--osl", "8", "--html", str(html)]) == 0
    out = capsys.readouterr().out.splitlines()
    replicas = [line.split() for line in out if line.startswith("replica ")]
    # prefill replicas serve no request themselves: the line says what they prefilled
    assert [r[1:6] for r in replicas[:2]] == [[f"prefill/{k}", "0", "requests,", "4",
                                              "prefilled,"] for k in (0, 1)]
    assert all("prefilled," not in r for r in replicas[2:])
    page = html.read_text()
    # the terminal's summary lines are the page's summary table, one row each
    rows = re.findall(r"<tr><td>([^<]*)</td><td>([^<]*)</td></tr>",
                      page.split('id="summary"')[1].split("</table>")[0])
    said = [line for line in out if line[:16].strip() and not line.startswith(
        ("replica ", "pools ", "  "))]
    assert rows == [(html_escape(line[:16].strip()), html_escape(line[16:].strip()))
                    for line in said]
    assert any(k == "KV transfers" for k, _ in rows)
    cells = re.findall(r"<td>([^<]*)</td>", page.split('id="replicas"')[1].split("</table>")[0])
    assert cells[:7] == ["prefill/0", "prefill", "h100-sxm", "0", "0", "4", "0.0%"]
    assert 'id="pools"' in page


def _full_decode_replica(**decode: object) -> tuple:
    """Two long prompts 0.5 s apart through one prefill replica and a decode replica of one
    seat: the run, its records by end, and the second one's transfer time."""
    fleet = [pool(H100, "prefill", role="prefill"),
             pool(H100, "decode", role="decode", max_num_seqs=1, **decode)]
    work = sessions(kind="random", num_requests=2, isl=4096, osl=400, rate=2.0,
                    ignore_eos=True)
    cr, _, s = run(fleet, "round-robin", work)
    assert s["requests"] == 2 and not s["errors"]
    first, second = sorted(cr.run.records, key=lambda r: r.end_s)
    # `second`'s prefill ended while `first` held the decode replica's seat
    assert first.token_times[0] < second.prefill_end_s < first.end_s
    transfer = expected_transfer(second.prompt_tokens)
    assert second.kv_transfer_s == pytest.approx(transfer, rel=1e-12)
    return cr, first, second, transfer


def test_a_full_decode_replica_pulls_only_when_a_seat_frees():
    """As a real-time decode pod (vLLM's scheduler): with its one seat taken, the decode
    replica starts the next request's pull only when the seat frees, so that request's first
    token comes after the other's end and its own whole transfer; the prefill replica held
    its blocks meanwhile, and every block is released at the end."""
    cr, first, second, transfer = _full_decode_replica()
    # its pull began when `first` ended, not when its prefill did
    assert second.token_times[0] > first.end_s + transfer > second.prefill_end_s + transfer
    assert_all_released(cr)


def test_with_the_inflight_cap_a_full_decode_replica_pulls_at_once():
    """vLLM 0.34.0's --max-num-inflight-kv-loads: the same run, but the second request's pull
    starts when its prefill ends, while the seat is still taken, so its first token comes
    right after the first request's end rather than a whole transfer later."""
    cr, first, second, transfer = _full_decode_replica(max_num_inflight_kv_loads=2)
    assert second.prefill_end_s + transfer < first.end_s  # landed while first still ran
    assert first.end_s < second.token_times[0] < first.end_s + transfer
    assert_all_released(cr)


def test_one_token_prompts_move_nothing_and_release_the_prefill_side():
    """All but the last prompt token cross the link: of a one-token prompt, nothing; the
    prefill replica's held block goes when its prefill ends."""
    fleet = [pool(H100, "prefill", role="prefill"), pool(H100, "decode", role="decode")]
    cr, _, s = run(fleet, "round-robin", sessions(kind="random", num_requests=3, isl=1,
                                                  osl=5, rate=10.0, ignore_eos=True))
    assert s["requests"] == 3 and not s["errors"]
    assert [r.kv_transfer_s for r in cr.run.records] == [0.0] * 3
    assert_all_released(cr)
