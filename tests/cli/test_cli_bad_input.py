"""Bad input to simulate, load, plan and whatif ends in one `error: ...` line on stderr and exit
status 2 (exit_codes.USAGE): no traceback, no hang, no silently accepted value, and an output
path that cannot be written is refused before the run, not after it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from doppelchip import exit_codes
from doppelchip.cli import main

ROOT = Path(__file__).resolve().parents[2]
SIM = ["simulate", "--deployment", "vllm-h100", "--isl", "16", "--osl", "4", "--ignore-eos"]
LOAD = ["load", "--target", "sim:vllm-h100", "--isl", "16", "--osl", "4", "--ignore-eos",
        "--progress", "off"]


def usage_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """Run `doppelchip ARGV` in this process; assert exit 2 and one `error:` line; the line."""
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == exit_codes.USAGE, (rc, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def usage_error_within(argv: list[str], timeout_s: float = 30) -> str:
    """`usage_error` in a child process, for input that used to hang: killed at `timeout_s`."""
    try:
        done = subprocess.run([sys.executable, "-m", "doppelchip.cli", *argv], cwd=ROOT,
                              capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        pytest.fail(f"doppelchip {' '.join(argv)} still ran after {timeout_s} s")
    assert done.returncode == exit_codes.USAGE, (done.returncode, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    return lines[0]


# --- 1. rate shapes that cannot produce the requested arrivals -----------------------------
def test_a_ramp_down_to_zero_refuses_more_requests_than_can_arrive():
    """The tester's hang: the rate is 0 from 10 s on and ~5 requests arrive before, never 30."""
    line = usage_error_within([*SIM, "--rate-shape", "ramp:from=1,to=0,over=10",
                               "--num-requests", "30"])
    assert "rate is 0 from 10 s on" in line and "30 requests" in line


def test_a_ramp_down_to_zero_is_bounded_by_a_duration(capsys: pytest.CaptureFixture[str]):
    for tail in (["--num-requests", "30", "--duration", "40"], []):  # or by where it falls to 0
        argv = [*SIM, "--rate-shape", "ramp:from=1,to=0,over=10", "--seed", "1", "--json", *tail]
        assert main(argv) == exit_codes.OK
        assert '"requests":' in capsys.readouterr().out


@pytest.mark.parametrize(("shape", "why"), [
    ("burst:low=0,high=5,on=0,off=10", "rate is 0 everywhere"),  # never high: rate 0 for ever
    ("burst:low=5,high=0,on=10,off=0", "rate is 0 everywhere"),  # never low: rate 0 for ever
    ("diurnal:period=10,min=5,max=1", "min must be <= max"),
    ("piecewise:10=1,0=5", "times must increase"),
    ("piecewise:0=1,0.0=5", "times must increase"),
])
def test_bad_rate_shapes_are_refused(shape: str, why: str):
    line = usage_error_within([*SIM, "--rate-shape", shape, "--num-requests", "5"])
    assert why in line


# --- 2. tracebacks: non-finite durations, unknown ids, unwritable outputs -------------------
@pytest.mark.parametrize("duration", ["nan", "inf", "0", "-1"])
def test_duration_must_be_finite_and_positive(capsys: pytest.CaptureFixture[str],
                                              duration: str):
    assert "--duration" in usage_error(capsys, [*SIM, "--duration", duration])


def test_whatif_unknown_model(capsys: pytest.CaptureFixture[str]):
    line = usage_error(capsys, ["whatif", "--model", "nope", "--batches", "1"])
    assert "unknown model 'nope'" in line


@pytest.fixture
def blocked(tmp_path: Path) -> Path:
    """A path under a regular file: unwritable even for root."""
    (tmp_path / "file").write_text("")
    return tmp_path / "file" / "out"


@pytest.mark.parametrize(("argv", "flag"), [
    ([*SIM, "--num-requests", "2", "--html"], "--html"),
    ([*LOAD, "--num-requests", "2", "--html"], "--html"),
    ([*LOAD, "--num-requests", "2", "--output-csv"], "--output-csv"),
    ([*LOAD, "--num-requests", "2", "--output-json"], "--output-json"),
    (["whatif", "--batches", "1", "--out"], "--out"),
])
def test_unwritable_outputs_are_refused(capsys: pytest.CaptureFixture[str], blocked: Path,
                                        argv: list[str], flag: str):
    line = usage_error(capsys, [*argv, str(blocked)])
    assert line.startswith(f"error: {flag} {blocked}")


@pytest.mark.parametrize("flag", ["--html", "--write-fleet", "--write-k8s"])
def test_plan_refuses_an_unwritable_output_before_its_search(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        blocked: Path, flag: str):
    """One output blocked, the others writable: refused before the search, and the check
    leaves no file or folder behind at the writable paths."""
    import sim.plan

    def no_search(*args: object, **kwargs: object) -> None:
        raise AssertionError("the search ran before the output path was checked")

    monkeypatch.setattr(sim.plan, "search", no_search)
    fine = tmp_path / "fine"
    fine.mkdir()
    outputs = {"--html": fine / "plan.html", "--write-fleet": fine / "fleet.toml",
               "--write-k8s": fine / "k8s" / "pods"} | {flag: blocked}
    line = usage_error(capsys, ["plan", "--slo", "ttft=1", "--rate", "1", "--num-requests", "5",
                                "--chips", "h100-sxm", "--engines", "vllm", "--quants", "bf16",
                                "--jobs", "1", *(x for f, path in outputs.items()
                                                 for x in (f, str(path)))])
    assert line.startswith(f"error: {flag} {blocked}")
    assert list(fine.iterdir()) == []


# --- 3. a rate sweep is open loop ------------------------------------------------------------
def test_load_refuses_concurrency_with_a_rate_sweep(capsys: pytest.CaptureFixture[str]):
    line = usage_error(capsys, [*LOAD, "--num-requests", "5", "--concurrency", "4",
                                "--sweep-rates", "1,2"])
    assert "--concurrency" in line and "--sweep-rates" in line


# --- 4. values out of range, each refused by its flag's name --------------------------------
@pytest.mark.parametrize(("argv", "flag"), [
    ([*LOAD, "--slo", "ttft=1", "--slo-attainment", "0"], "--slo-attainment"),
    ([*LOAD, "--slo", "ttft=1", "--slo-attainment", "1.5"], "--slo-attainment"),
    ([*SIM, "--max-num-seqs", "0"], "--max-num-seqs"),
    ([*SIM, "--max-model-len", "0"], "--max-model-len"),
    ([*SIM, "--max-num-batched-tokens", "0"], "--max-num-batched-tokens"),
    ([*SIM, "--workload", "multi-turn", "--turns", "2", "--think-time", "-1"], "--think-time"),
    ([*SIM, "--length-dist", "uniform", "--length-spread", "1"], "--length-spread"),
    ([*SIM, "--length-dist", "normal", "--length-spread", "-0.5"], "--length-spread"),
    ([*SIM, "--workload", "shared-prefix", "--system-prompt-len", "-1"], "--system-prompt-len"),
])
def test_out_of_range_values_name_their_flag(capsys: pytest.CaptureFixture[str],
                                             argv: list[str], flag: str):
    assert flag in usage_error(capsys, [*argv, "--num-requests", "3"])


@pytest.mark.parametrize(("argv", "flag"), [
    ([*SIM, "--ramp-up", "inf"], "--ramp-up"),  # arrivals at infinity: the run never ended
    ([*SIM, "--arrival", "gamma", "--burstiness", "nan"], "--burstiness"),  # NaN times: hung
])
def test_arrival_parameters_that_used_to_hang(argv: list[str], flag: str):
    assert flag in usage_error_within([*argv, "--num-requests", "3"])


# --- 5. a flag the run would ignore is refused, not silently dropped -------------------------
PLAN = ["plan", "--slo", "ttft=1", "--rate", "1", "--chips", "h100-sxm", "--engines", "vllm",
        "--quants", "bf16", "--jobs", "1"]


@pytest.mark.parametrize(("argv", "says"), [
    ([*SIM, "--trace", "t.jsonl"], "--trace FILE needs --workload trace"),
    ([*LOAD, "--trace", "t.jsonl"], "--trace FILE needs --workload trace"),
    ([*PLAN, "--trace", "t.jsonl"], "--trace FILE needs --workload trace"),
    ([*SIM, "--trace-format", "azure"], "--trace-format azure needs --workload trace"),
    ([*SIM, "--mix", "random=1,structured=1"], "--mix needs --workload mix"),
    ([*SIM, "--burstiness", "0.5"], "needs --arrival gamma"),
    ([*SIM, "--length-file", "lengths.csv"], "--length-file needs --length-dist histogram"),
    ([*SIM, "--length-spread", "0.2"], "--length-spread needs --length-dist uniform or normal"),
    ([*LOAD, "--deployment", "vllm-h100"], "sim:[FLEET.toml#]DEPLOYMENT"),
    ([*LOAD, "--time-limit", "60"], "--time-limit applies to a server target"),
    ([*LOAD, "--api-key", "k"], "--api-key applies to a server target"),
])
def test_a_flag_the_run_would_ignore_is_refused(capsys: pytest.CaptureFixture[str],
                                                argv: list[str], says: str):
    assert says in usage_error(capsys, [*argv, "--num-requests", "3"])


def test_the_flags_run_where_they_apply(capsys: pytest.CaptureFixture[str]):
    """The same flags with the workload, arrival or distribution they shape are accepted."""
    for extra in (["--workload", "mix", "--mix", "random=1,structured=1"],
                  ["--arrival", "gamma", "--burstiness", "0.5"],
                  ["--length-dist", "uniform", "--length-spread", "0.2"]):
        assert main([*SIM, *extra, "--num-requests", "3", "--json"]) == exit_codes.OK, extra
        assert '"requests": 3' in capsys.readouterr().out


# --- 5. SLO bounds that no latency can be compared with; whatif's context and fit --------
@pytest.mark.parametrize("slo", ["ttft=nan", "ttft=inf", "tpot=0", "e2e=-1"])
@pytest.mark.parametrize("cmd", [SIM, LOAD])
def test_an_slo_bound_must_be_a_finite_positive_time(capsys: pytest.CaptureFixture[str],
                                                      cmd: list[str], slo: str):
    """NaN once passed every request (no comparison with it is true) and `--json` wrote
    `NaN`, which is not JSON."""
    line = usage_error(capsys, [*cmd, "--num-requests", "2", "--slo", slo])
    assert "SLO bound" in line and slo.split("=")[0] in line


@pytest.mark.parametrize("slo", ["ttft_p99=nan", "goodput=nan", "e2e_p50=inf"])
def test_plan_statistics_must_be_finite(capsys: pytest.CaptureFixture[str], slo: str):
    line = usage_error(capsys, ["plan", "--slo", f"ttft=1,{slo}", "--rate", "1",
                                "--num-requests", "5"])
    assert "must be" in line and slo.split("=")[0] in line


def test_whatif_refuses_a_workload_longer_than_the_models_context(
        capsys: pytest.CaptureFixture[str]):
    line = usage_error(capsys, ["whatif", "--isl", "200000", "--batches", "1"])
    assert "context is 131072" in line


@pytest.mark.parametrize("model", ["bge-m3", "qwen3-embedding-0.6b"])
def test_whatif_refuses_a_pooling_model(capsys: pytest.CaptureFixture[str], model: str):
    # it divided by the time per output token a pooling model does not have
    line = usage_error(capsys, ["whatif", "--model", model, "--batches", "1"])
    assert f"{model} is a pooling model (embed)" in line and "doppelchip plan" in line


def test_whatif_bounds_its_batches(capsys: pytest.CaptureFixture[str]):
    # batch 100000 was 100000 simulated requests per engine: hours
    line = usage_error(capsys, ["whatif", "--batches", "1,100000"])
    assert "--batches: at most 4096" in line and "100000" in line


def test_whatif_reports_an_engine_that_cannot_hold_the_model():
    """A model too big for the Apple chip: its long-prompt series says why, the rest runs."""
    from sim.whatif import WhatIfConfig, long_prompt_ttft

    r = long_prompt_ttft(WhatIfConfig(model="llama-3.1-405b"), prompts=(256,))
    assert not r["series"] and set(r["failed"]) == {"mlx", "llama.cpp"}
    assert all("does not fit" in why for why in r["failed"].values())


def test_a_sim_target_refuses_a_pool_it_would_run_as_one_replica(
        capsys: pytest.CaptureFixture[str], tmp_path: Path):
    """`replicas = 3` once ran as one replica (3× the load on it) without a word."""
    fleet = tmp_path / "f.toml"
    fleet.write_text('[[deployments]]\nname = "a"\nengine = "vllm"\nchip = "h100-sxm"\n'
                     'model = "llama-3.1-8b"\nquant = "bf16"\nreplicas = 3\n')
    line = usage_error(capsys, [*LOAD[:1], "--target", f"sim:{fleet}#a", *LOAD[3:],
                                "--num-requests", "2"])
    assert "replicas = 3" in line and f"simulate --config {fleet} --deployment a" in line
    line = usage_error(capsys, [*LOAD[:1], "--target", f"sim:{fleet}#b", *LOAD[3:],
                                "--num-requests", "2"])
    assert "unknown deployment 'b'" in line and "(known: a)" in line


@pytest.mark.parametrize(("argv", "says"), [
    (["--seed", "-1"], "seed must be >= 0"),
    (["--workload", "mix", "--mix", "random=inf,structured=1"], "mix weights must be finite"),
    (["--workload", "shared-prefix", "--users-per-prefix", "-1"], "users_per_prefix"),
])
def test_workload_numbers_are_checked_by_name(capsys: pytest.CaptureFixture[str],
                                              argv: list[str], says: str):
    assert says in usage_error(capsys, [*SIM, "--num-requests", "4", *argv])


def test_a_run_where_every_request_failed_prints_no_latencies(capsys: pytest.CaptureFixture[str]):
    assert main([*SIM, "--num-requests", "3", "--isl", "200000"]) == 0
    out = capsys.readouterr().out
    assert "latencies       none: no request succeeded" in out and "ttft " not in out


EST = ["estimate", "--chip", "h100-sxm", "--engine", "vllm", "--model", "llama-3.1-8b",
       "--quant", "bf16"]


@pytest.mark.parametrize(("argv", "says"), [
    ([*EST, "--prompt", "-1"], "--prompt must be >= 0"),  # a flag, not "does not fit:"
    ([*EST, "--max-context", "0"], "--max-context must be >= 1"),
    (["simulate", "--deployment", "x", "--num-requests", "2"], "(known: vllm-h100, "),
    (["plan", "--chips", "rtx-4090", "--engines", "mlx", "--rate", "1", "--slo", "ttft=1",
      "--num-requests", "5"], "no engine of mlx runs on rtx-4090: the search space is empty"),
    (["plan", "--chips", "h100-sxm", "--engines", "vllm", "--quants", "q4_k_m", "--rate", "1",
      "--slo", "ttft=1", "--num-requests", "5"], "no quantisation of q4_k_m runs on vllm"),
])
def test_usage_errors_say_what_to_change(capsys: pytest.CaptureFixture[str], argv: list[str],
                                         says: str):
    assert says in usage_error(capsys, argv)


@pytest.mark.parametrize(("argv", "says"), [
    ([*SIM, "--num-requests", "4", "--timeline", "0"], "--timeline must be > 0"),  # was ignored
    ([*LOAD, "--num-requests", "4", "--sweep-rates", ""], "--sweep-rates needs"),  # ran once
    ([*LOAD, "--num-requests", "4", "--sweep-concurrency", ""], "--sweep-concurrency needs"),
    ([*SIM, "--num-requests", "4", "--autoscale", "metric=kv,target=2"], "fraction of the KV"),
])
def test_a_falsy_value_is_checked_not_dropped(capsys: pytest.CaptureFixture[str],
                                              argv: list[str], says: str):
    assert says in usage_error(capsys, argv)

