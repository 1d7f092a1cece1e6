"""The front door of `doppelchip load`: build the workload, run it against a gRPC server or
in virtual time (`sim:`), and summarise both the same way."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import csv
import dataclasses
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc

from clients.report import RequestResult, goodput, summarize
from clients.workloads import build_workload


class LoadError(Exception):
    """The load cannot run; the message says why."""


def _sim_target(spec: str) -> tuple[str | None, str]:
    """`sim:` → (None, ""); `sim:NAME` → (None, NAME); `sim:FILE.toml#NAME` → (FILE, NAME)."""
    rest = spec.removeprefix("sim:")
    if "#" in rest:
        path, name = rest.split("#", 1)
        return path, name
    if rest.endswith(".toml"):
        return rest, ""
    return None, rest


SERVER_ONLY = {"deployment": "", "time_limit": 3600.0, "api_key": None, "tls": False,
               "ssl_ca_certs": None, "ssl_certfile": None, "ssl_keyfile": None}


def check_target_flags(args: argparse.Namespace) -> None:
    """A sim: target runs every request to its end in virtual time: the flags that only a
    server target reads (its deployment, the emulated time limit, credentials) are refused
    by name instead of ignored."""
    if not args.target.startswith("sim:"):
        return
    for dest, default in SERVER_ONLY.items():
        if getattr(args, dest, default) != default:
            flag = "--" + dest.replace("_", "-")
            hint = (" (a sim: target names its deployment: sim:[FLEET.toml#]DEPLOYMENT)"
                    if dest == "deployment" else "")
            raise LoadError(f"{flag} applies to a server target, not to {args.target!r}{hint}")


def run_once(args: argparse.Namespace, spec, slo: dict[str, float]
              ) -> tuple[dict[str, Any], list[RequestResult]]:
    if args.target.startswith("sim:"):
        summary, results = _run_sim(args.target, spec, args.concurrency)
    else:
        summary, results = _run_grpc(args, spec)
    if slo:
        summary["slo"] = slo
        summary["goodput"] = goodput(results, slo)
    return summary, results


def _run_sim(target: str, spec, concurrency: int | None
             ) -> tuple[dict[str, Any], list[RequestResult]]:
    from server.config import ConfigError, load_fleet
    from sim.simulation import SimulationError, simulate_conversations

    path, name = _sim_target(target)
    try:
        fleet = load_fleet(path)
    except ConfigError as e:
        raise LoadError(str(e)) from e
    name = name or fleet.default_deployment
    options = next((d for d in fleet.deployments if d.name == name), None)
    if options is None:
        known = ", ".join(d.name for d in fleet.deployments)
        raise LoadError(f"unknown deployment {name!r} in {path or 'the built-in fleet'} "
                        f"(known: {known})")
    if options.replicas > 1 or options.autoscaling is not None:
        # a sim: target is one engine core; the pool runs behind a router in `simulate`
        pool = "replicas = " + str(options.replicas) if options.replicas > 1 else "autoscaling"
        raise LoadError(f"deployment {name!r} has {pool}: a sim: target simulates one "
                        f"replica; run the pool with `doppelchip simulate --config "
                        f"{path or 'FLEET.toml'} --deployment {name}` (docs/PLANNING.md)")
    try:
        return simulate_conversations(options, spec, concurrency)
    except SimulationError as e:
        raise LoadError(str(e)) from e


def _run_grpc(args: argparse.Namespace, spec) -> tuple[dict[str, Any], list[RequestResult]]:
    from clients.client import Client
    from clients.loadgen import run_load

    host = args.target.rsplit(":", 1)[0]
    if host not in ("127.0.0.1", "localhost", "[::1]"):
        raise LoadError(f"load tests only target loopback addresses, not {host!r}")
    from doppelchip.client_flags import client_security

    try:
        security = client_security(args)
    except ValueError as e:
        raise LoadError(str(e)) from e
    try:
        with Client(args.target, **security) as client:
            listing = client.list_deployments(timeout=10)
    except grpc.RpcError as e:
        raise LoadError(f"cannot reach {args.target}: {e.code().name}: {e.details()}") from e
    names = {d.name: d for d in listing.deployments}
    name = args.deployment or listing.default_deployment
    if name not in names:
        raise LoadError(f"unknown deployment {name!r} on {args.target}")
    # doppelchip ships one tokenizer: its vocabulary bounds the workload's token ids
    spec = dataclasses.replace(spec, vocab_size=_vocab_size())
    try:
        conversations = build_workload(spec, encode=_encode)
    except (ValueError, OSError) as e:
        raise LoadError(str(e)) from e
    metrics_url = (f"http://{host}:{listing.metrics_port}/metrics"
                   if listing.metrics_port else None)
    with _progress(args, sum(len(c.turns) for c in conversations)) as advance:
        run = asyncio.run(run_load(
            args.target, conversations, deployment=name, concurrency=args.concurrency,
            time_scale=listing.time_scale or 1.0, time_limit_s=args.time_limit,
            on_result=advance, probe=lambda: _scrape(metrics_url, name), security=security,
        ))
    from clients.server_metrics import per_million_tokens

    out_tokens = sum(r.output_tokens for r in run.results if r.ok)
    energy = per_million_tokens(run.probe_before, run.probe_after, out_tokens)
    if energy:  # the raw readings the rates come from, for whoever wants to check them
        energy["server_counters"] = {"before": run.probe_before, "after": run.probe_after}
    summary = summarize(run.results, deployment=name, target=args.target,
                        max_in_flight=run.max_in_flight, max_send_lag_s=run.max_send_lag_s,
                        warnings=run.warnings, **energy)
    return summary, run.results


def _scrape(url: str | None, deployment: str) -> dict[str, float]:
    """The server's energy and cost counters, or {} when it exposes none (no error)."""
    from clients.server_metrics import scrape

    if url is None:
        return {}
    try:
        return scrape(url, deployment)
    except (OSError, ValueError):
        return {}


@contextlib.contextmanager
def _progress(args: argparse.Namespace, total: int) -> Iterator[Callable[[RequestResult], None]]:
    """A rich progress bar on stderr (requests done, errors) while the load runs."""
    show = getattr(args, "progress", "auto")
    if show == "off" or (show == "auto" and not sys.stderr.isatty()):
        yield lambda result: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("[bold]load"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[errors]} errors"), TimeElapsedColumn(),
                  console=Console(stderr=True), transient=False) as bar:
        task = bar.add_task("requests", total=total, errors=0)
        errors = 0

        def advance(result: RequestResult) -> None:
            nonlocal errors
            errors += result.error is not None
            bar.update(task, advance=1, errors=errors)

        yield advance


def _vocab_size() -> int:
    from server.engine.tokenizer import get_tokenizer

    return get_tokenizer().vocab_size


def _encode(text: str) -> list[int]:
    from server.engine.tokenizer import get_tokenizer

    return get_tokenizer().encode(text)


def write_outputs(summary: dict[str, Any], results: list[RequestResult],
                  json_path: str | None, csv_path: str | None) -> None:
    rows = [dataclasses.asdict(r) | {"ttft_s": r.ttft, "tpot_s": r.tpot, "e2e_s": r.e2e}
            for r in results]
    if json_path:
        Path(json_path).write_text(json.dumps({"summary": summary, "requests": rows}, indent=1))
    if csv_path:
        with open(csv_path, "w", newline="") as f:
            fields = [k for k in rows[0] if k != "token_times"] if rows else []
            writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)
