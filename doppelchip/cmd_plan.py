"""`doppelchip plan`: parse the question, hand it to sim.plan, print the answer (terminal,
one JSON line, an HTML report) and write the winner out (fleet file, Kubernetes manifests).

The search runs `doppelchip simulate` itself: each candidate's task is a simulate argument
list that `run_simulate` below parses with simulate's own parser and runs on simulate's own
path, so the printed `simulate_command` reproduces the candidate's result exactly."""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import sys
from typing import Any

from doppelchip.cmd_simulate import ROUTERS
from doppelchip.sim_flags import add_traffic_args, add_workload_args

DEFAULT_MODEL = "llama-3.1-8b"


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "plan", help="search for the cheapest fleet that meets an SLO at a rate",
        description="Search chips × engines × quantisations × TP/PP/EP × max_num_seqs × "
        "replicas for the cheapest fleet ($/hour) that meets --slo at --rate: the analytic "
        "model prunes, the cluster simulator decides (docs/PLAN.md). Prints the winner, the "
        "runners-up and the Pareto frontier of cost vs latency.")
    add_workload_args(p)
    add_traffic_args(p.add_argument_group("traffic over time (docs/AUTOSCALING.md)"))
    g = p.add_argument_group("the question")
    g.add_argument("--model", default=DEFAULT_MODEL, help=f"model id (default {DEFAULT_MODEL})")
    g.add_argument("--hf-overrides", metavar="JSON",
                   help="vLLM's config.json overrides of every candidate: a generative model "
                   "served as a classifier, e.g. a Qwen3-Reranker (docs/EMBEDDINGS.md)")
    g.add_argument("--pooler-config", metavar="JSON",
                   help="vLLM's --pooler-config of every candidate: how a pooling model pools "
                   "(MEAN or CLS on a decoder: no prefix caching, no chunked prefill)")
    g.add_argument("--slo", required=True, metavar="TERMS",
                   help="ttft=S,tpot=S,e2e=S: per-request bounds (as load --slo); goodput=F: "
                   "the share of requests meeting all of them (default 0.9); ttft_p99=S "
                   "(ttft/tpot/itl/e2e × p50/p90/p95/p99/mean): a statistic of the run")
    g = p.add_argument_group("search space (comma lists; default: all the catalogue allows)")
    g.add_argument("--chips", metavar="A,B", help="chip ids (default: every accelerator)")
    g.add_argument("--engines", metavar="A,B", help="engine ids (default: every engine)")
    g.add_argument("--quants", metavar="A,B", help="weight formats (default: every one)")
    g.add_argument("--tp", default="1,2,4,8", metavar="N,M", help="TP degrees (1,2,4,8)")
    g.add_argument("--pp", default="1", metavar="N,M", help="PP degrees (1)")
    g.add_argument("--ep", default="", metavar="N,M", help="EP degrees (MoE; default none)")
    g.add_argument("--dp", default="1", metavar="N,M",
                   help="data-parallel ranks per replica (vLLM's --data-parallel-size: a MoE "
                   "model's ranks share its experts; default 1)")
    g.add_argument("--kv-offloading-size", default="", metavar="GIB,...",
                   help="CPU KV tiers to search, GiB (vLLM's --kv-offloading-size; 0: none; "
                   "default none; docs/KV_OFFLOAD.md)")
    g.add_argument("--max-num-seqs", default="", metavar="N,M",
                   help="sequence caps (default: the engine's)")
    g.add_argument("--modes", default="aggregated", metavar="MODE,...",
                   help="serving modes (aggregated; P/D pools: see docs/PLAN.md)")
    g.add_argument("--max-replicas", type=int, default=64, help="replicas per fleet (64)")
    g.add_argument("--router", choices=ROUTERS, default="least-requests",
                   help="every candidate's router (default least-requests)")
    g.add_argument("--runners-up", type=int, default=3, metavar="K",
                   help="also find the next K cheapest configs meeting the SLO (3)")
    g = p.add_argument_group("where candidates run")
    g.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                   help="candidates at once (default: the cores)")
    g.add_argument("--ray", metavar="ADDRESS",
                   help="run candidates on the Ray cluster at ADDRESS (ray.init's address: "
                   "auto, ray://HOST:10001, ...) or 'local' for a new local instance of --jobs "
                   "CPUs; needs doppelchip[ray]")
    g = p.add_argument_group("output")
    g.add_argument("--json", action="store_true", help="print the plan as one JSON object")
    g.add_argument("--html", metavar="FILE", help="write an HTML report with the frontier plot")
    g.add_argument("--write-fleet", metavar="FILE", help="write the winner's fleet file")
    g.add_argument("--write-k8s", metavar="DIR",
                   help="write the winner's Kubernetes manifests (deploy/k8s's pods)")
    p.set_defaults(func=cmd_plan)


def run_simulate(argv: list[str]) -> dict[str, Any]:
    """`doppelchip simulate ARGV`'s summary (run in the workers), parsed by the parser that
    `doppelchip simulate` registers and run on its cluster path."""
    from doppelchip.cmd_simulate import register as register_simulate
    from sim.fleet_simulation import simulate_fleet, wants_cluster

    parser = argparse.ArgumentParser(prog="doppelchip")
    register_simulate(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    assert wants_cluster(args)  # --router is always given: simulate's cluster path
    return simulate_fleet(args)


def workload_argv(args: argparse.Namespace) -> list[str]:
    """The workload flags of `args` that differ from simulate's defaults, as simulate takes
    them (the same argument group, so every one is known to simulate); files by absolute
    path."""
    ref = argparse.ArgumentParser(add_help=False)
    add_workload_args(ref)
    add_traffic_args(ref.add_argument_group())
    out: list[str] = []
    for action in ref._actions:
        value = getattr(args, action.dest)
        if value == action.default:
            continue
        flag = action.option_strings[0]
        if action.dest in FILE_FLAGS:  # workers (a Ray node) may run in another folder
            value = os.path.abspath(value)
        out += [flag] if action.nargs == 0 else [flag, str(value)]
    return out


FILE_FLAGS = ("trace", "length_file")  # the workload flags naming a file


def _ints(text: str, flag: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise ValueError(f"{flag}: comma-separated integers, got {text!r}") from None
    if any(v < 1 for v in values):
        raise ValueError(f"{flag}: every value must be >= 1")
    return values


def _gibs(text: str) -> tuple[float | None, ...]:
    """`--kv-offloading-size` of plan: sizes in GiB, 0 for no tier (default: none)."""
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"--kv-offloading-size: comma-separated GiB, got {text!r}") from None
    if any(not (math.isfinite(v) and v >= 0) for v in values):
        raise ValueError("--kv-offloading-size: every size must be a finite GiB >= 0")
    return tuple(dict.fromkeys(v or None for v in values)) or (None,)


def build_inputs(args: argparse.Namespace):
    from devices import catalog
    from server.engine import pooler_config
    from sim.plan import PlanInputs
    from sim.plan_slo import parse_plan_slo
    from sim.plan_space import MODES, PD_AVAILABLE, SearchSpace, check_ids, check_not_empty
    from sim.sim_args import workload_from_args
    from sim.simulation import SimulationError

    if args.workload != "trace" and not args.rate_shape and (  # (their own arrivals)
            not math.isfinite(args.rate) or args.rate <= 0):
        raise ValueError("--rate: a finite rate > 0 (requests per second) to plan for")
    if args.jobs < 1 or args.max_replicas < 1:
        raise ValueError("--jobs and --max-replicas must be >= 1")
    if args.runners_up < 0:
        raise ValueError("--runners-up must be >= 0")
    lists = {}
    for flag, listed in (("chips", catalog.list_chips()), ("engines", catalog.list_engines()),
                         ("quants", catalog.list_quants())):
        known = [x.id for x in listed]
        given = getattr(args, flag)
        chosen = [v.strip() for v in given.split(",") if v.strip()] if given else known
        check_ids(flag[:-1], chosen, known)
        lists[flag] = tuple(chosen)
    check_ids("model", [args.model], [m.id for m in catalog.list_models()])
    pooler_config.parse(args.pooler_config)  # (a bad one: vLLM's words, before any candidate)
    modes = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    if "pd" in modes and not PD_AVAILABLE:
        raise ValueError("--modes pd: P/D pools need the fleet file's `role` key, which this "
                         "build does not have yet (docs/PLAN.md)")
    check_ids("serving mode", modes, MODES)
    try:
        workload = workload_from_args(args)
    except SimulationError as e:
        raise ValueError(str(e)) from e
    space = SearchSpace(model=args.model, chips=lists["chips"], engines=lists["engines"],
                        quants=lists["quants"], tps=_ints(args.tp, "--tp"),
                        pps=_ints(args.pp, "--pp"), eps=_ints(args.ep, "--ep") or (None,),
                        dps=_ints(args.dp, "--dp") or (1,),
                        offloads=_gibs(args.kv_offloading_size),
                        max_num_seqs=_ints(args.max_num_seqs, "--max-num-seqs") or (None,),
                        modes=modes, max_replicas=args.max_replicas,
                        hf_overrides=args.hf_overrides, pooler_config=args.pooler_config)
    check_not_empty(space)
    inputs = PlanInputs(space, workload, workload_argv(args), parse_plan_slo(args.slo),
                        router=args.router, runners_up=args.runners_up)
    inputs.workload_shape()  # a trace's or a rate shape's traffic: read (and checked) now
    return inputs


def cmd_plan(args: argparse.Namespace) -> int:
    from doppelchip.outpaths import unwritable
    from sim.plan import search
    from sim.plan_exec import ExecError, make_executor

    try:
        inputs = build_inputs(args)
        problem = unwritable([("--html", args.html), ("--write-fleet", args.write_fleet)],
                             [("--write-k8s", args.write_k8s)])
        if problem:  # before the search, not after it
            raise ValueError(problem)
        executor = make_executor(args.ray, args.jobs)
    except (ValueError, ExecError) as e:
        print(json.dumps({"error": str(e)}) if args.json else f"error: {e}", file=sys.stderr)
        return 2
    try:
        plan = search(inputs, executor, run_simulate,
                      progress=None if args.json else lambda m: print(m, file=sys.stderr))
    finally:
        executor.close()
    plan["executor"] = {"name": executor.name, "jobs": executor.jobs,
                        "address": getattr(executor, "address", None),
                        "driver_pid": os.getpid(),  # candidates ran elsewhere: their pids differ
                        "driver_worker_id": getattr(executor, "driver_worker_id", None)}
    fleet_path = args.write_fleet or "FLEET.toml"
    finish(plan, fleet_path)
    if plan["winner"] and args.write_fleet:
        with open(args.write_fleet, "w") as f:
            f.write(plan["winner"]["fleet"])
    failed = None
    if plan["winner"] and args.write_k8s:
        from sim.plan_deploy import write_k8s

        try:
            plan["k8s_files"] = write_k8s(plan["winner"], args.write_k8s)
        except RuntimeError as e:
            failed = str(e)
    lines = conclusions(plan)
    if args.html:
        from sim.plan_report import render

        with open(args.html, "w") as f:
            f.write(render(plan, lines))
    if failed:
        print(f"error: {failed}", file=sys.stderr)
    if args.json:
        print(json.dumps(json_output(plan)))
    else:
        print("\n".join(lines))
    return 2 if failed else 0 if plan["winner"] else 1


def finish(plan: dict[str, Any], fleet_path: str) -> None:
    """Each shown candidate's `simulate_command` (the winner's fleet at `fleet_path`, the
    others' at FLEET.toml) and the winner's `serve` pod commands."""
    from sim.plan_fleet import command_line

    for rec in plan["candidates"]:
        rec["simulate_command"] = command_line(
            tuple(rec["argv"]), fleet_path if rec is plan["winner"] else "FLEET.toml")
    if plan["winner"]:
        w = plan["winner"]
        pools = [(w["pool_shapes"][p]["deployment"], n) for p, n in w["pools"].items()] \
            if "pools" in w else [(w["deployment"], w["replicas"])]
        names = [name for name, n in pools for _ in range(n)]
        w["serve_commands"] = [shlex.join(
            ["doppelchip", "serve", "--config", fleet_path, "--deployment", name,
             "--host", "127.0.0.1", "--port", str(50051 + i), "--http-port", str(8000 + i)])
            for i, name in enumerate(names)]  # as `doppelchip pods`: pod i on port + i


def json_output(plan: dict[str, Any]) -> dict[str, Any]:
    """The winner at the top level, with `runners_up` and `frontier` (and the search's
    bookkeeping); without a winner, `error` and the closest candidates."""
    def slim(rec: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in rec.items() if k not in ("argv", "badness", "progress")}

    rest = {"runners_up": [slim(r) for r in plan["runners_up"]],
            "frontier": [slim(r) for r in plan["frontier"]],
            "frontier_metric": plan["frontier_metric"], "slo": plan["slo"],
            "rate": plan["rate"], "router": plan["router"], "searched": plan["searched"],
            "executor": plan["executor"], "pruned": plan["pruned"], "configs": plan["configs"]}
    if plan.get("k8s_files"):
        rest["k8s_files"] = plan["k8s_files"]
    if plan["winner"] is None:
        return {"error": "no candidate met the SLO", **rest,
                "closest": [slim(r) for r in plan["closest"]]}
    return {**slim(plan["winner"]), **rest}


def _describe(r: dict[str, Any]) -> str:
    from sim.plan_fleet import label

    return (f"{label(r)} ({r['chips']} chips): "
            f"${r['usd_per_hour']:.4g}/h, "
            + (f"${r['usd_per_m_input_tok']:.3g} per million input tokens; "
               if "usd_per_m_input_tok" in r else
               f"${r['usd_per_mtok']:.3g} per million output tokens; ")
            + f"TTFT p99 {r['latency']['ttft_p99'] * 1e3:.1f} ms, TPOT p99 "
            f"{r['latency']['tpot_p99'] * 1e3:.1f} ms"
            + (f", goodput {r['goodput_fraction']:.0%}" if r.get("goodput_fraction")
               is not None else ""))


def conclusions(plan: dict[str, Any]) -> list[str]:
    """What the terminal prints and the HTML report opens with: the same lines."""
    from sim.plan_fleet import label

    s = plan["searched"]
    ex = plan["executor"]
    where = f"on Ray ({ex['address']})" if ex["name"] == "ray" else \
        f"on a process pool of {ex['jobs']}"
    out = [f"plan for {plan['slo']} at {plan['rate']:g} req/s of emulated time "
           f"(router {plan['router']})"]
    w = plan["winner"]
    if w is None and not plan["closest"]:
        out.append("no candidate met the SLO: the analytic model pruned every config, e.g.")
        out += [f"  {p['deployment']}: {p['why']}" for p in plan["pruned"][:5]]
    elif w is None:
        out.append("no candidate met the SLO; the closest:")
        out += [f"  {_describe(r)}; missed: {'; '.join(r['misses'])}"
                if "latency" in r else f"  {r['deployment']}: {'; '.join(r['misses'])}"
                for r in plan["closest"]]
    else:
        out.append(f"winner: {_describe(w)}")
        out.append(f"reproduce: {w['simulate_command']}")
        out += [f"serve: {c}" for c in w["serve_commands"]]
        if plan["runners_up"]:
            out.append("runners-up (the next cheapest configs meeting the SLO):")
            out += [f"  {_describe(r)}" for r in plan["runners_up"]]
        out.append(f"Pareto frontier, cost vs {plan['frontier_metric']}:")
        out += [f"  ${r['usd_per_hour']:.4g}/h  {r['frontier_latency_s'] * 1e3:8.1f} ms  "
                f"{label(r)}" for r in plan["frontier"]]
    out.append(f"searched {s['configs']} configs: {s['pruned']} pruned by the analytic model, "
               f"{s['simulated']} candidates simulated in {s['batches']} batches {where}, "
               f"{s['wall_s']:.1f} s")
    return out
