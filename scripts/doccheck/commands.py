"""Documented commands made runnable here: ports moved to free ones, servers started and probed.

The docs write the defaults a reader types (gRPC 50051, HTTP 8000, smg 30000, ...). On a shared
machine those may be taken, so the runner moves every port a command names (after making the
defaults explicit: `serve` gets `--port 50051 --http-port 8000`, `vllm serve` `--port 8000
--grpc-port 50051` (with `-dpm` no gRPC port: its ranks take free ones), `sglang serve`
`--port 30000 --grpc-port 50051` (`--port 30000` alone with `--smg-grpc-mode`),
`trtllm-serve` `--port 8000 --grpc-port 50051` (`--port 8000 --http-port 8001` with
`--grpc`), a client without `--target` gets `--target 127.0.0.1:50051`, a KV-events config
without an endpoint gets vLLM's `tcp://*:5557`). `Moves` maps each hundred of documented
ports (50000-50099, 8000-8099, ...) to a free hundred below the kernel's ephemeral range, so
successive ports (pods, replicas) stay successive and no outgoing connection's local port
collides with a listener.
A server command becomes `__dc_server N KIND TARGET 'CMD'` (scripts/doccheck/prelude.sh): started
in its own process group, probed until ready, stopped with SIGTERM at the end of the block or
when the next foreground server command starts (a reader stops one and tries the next).
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass

# host:port, *:port, --*port N, --*port=N, *_PORT=N
_PORT = re.compile(r"(?P<pre>(?:[\w.*\]-]+:)|(?:--[\w-]*port[= ])|(?:_PORT=))(?P<port>\d{4,5})\b")
_ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=\S*$")
CLIENTS = ("generate", "load", "status")
MAKE_READY_TIMEOUT_S = 600  # `make run` / `make gateway` create and install the venv first


@dataclass(frozen=True)
class Server:
    """How a server command is recognised and when it is ready."""

    kind: str  # serve | pods | gateway | smg
    probe: str  # "http:PORT/PATH" (a GET answers 2xx) or "log:TEXT" (its log prints TEXT)


def words(command: str) -> list[str]:
    try:
        return shlex.split(command, comments=True)
    except ValueError:
        return command.split()


def program(ws: list[str]) -> list[str]:
    """The words after leading VAR=value assignments, with `.venv/bin/` dropped."""
    i = 0
    while i < len(ws) and _ENV.match(ws[i]):
        i += 1
    rest = ws[i:]
    if rest and rest[0].startswith(".venv/bin/"):
        rest = [rest[0].removeprefix(".venv/bin/"), *rest[1:]]
    return rest


def server_of(command: str) -> Server | None:
    ws = program(words(command))
    if ws[:2] == ["doppelchip", "serve"] and _flag(ws, "--ssl-certfile") is not None:
        return Server("serve", "log:front end 0 up")  # TLS: /health needs its certificates
    if ws[:2] == ["make", "run"] or ws[:2] == ["doppelchip", "serve"]:
        return Server("serve", f"http:{_flag(ws, '--http-port', '--metrics-port') or 8000}/health")
    if _vllm_serve(ws):  # vLLM's command line: --port is the HTTP port
        return Server("serve", f"http:{_flag(ws, '--port') or 8000}/health")
    if _sglang_serve(ws):  # SGLang's: --port is the HTTP port (30000 by default), or with
        port = int(_flag(ws, "--port") or 30000)  # --smg-grpc-mode the gRPC one (HTTP: + 1)
        if _smg_grpc_mode(ws):
            port = int(_flag(ws, "--smg-http-sidecar-port") or port + 1)
        return Server("serve", f"http:{port}/health")
    if _trtllm_serve(ws):  # TensorRT-LLM's: --port is HTTP, or with --grpc the gRPC one
        return Server("serve", f"http:{_trtllm_http_port(ws)}/health")  # (HTTP: --http-port)
    if ws[:2] == ["doppelchip", "pods"]:
        return Server("pods", "log:pods up")
    if ws[:2] == ["make", "gateway"] or ws[:2] == ["doppelchip", "gateway"]:
        return Server("gateway", "log:doppelchip gateway: OpenAI API on")
    if ws[:2] == ["smg", "launch"]:
        return Server("smg", f"http:{_flag(ws, '--port') or 30000}/readiness")
    return None


def _vllm_serve(ws: list[str]) -> bool:
    """`doppelchip vllm serve ...` or `doppelchip-vllm serve ...`."""
    return ws[:3] == ["doppelchip", "vllm", "serve"] or ws[:2] == ["doppelchip-vllm", "serve"]


def _sglang_serve(ws: list[str]) -> bool:
    """`doppelchip sglang serve|launch_server ...` or `doppelchip-sglang serve ...`."""
    verbs = ("serve", "launch_server")
    return (ws[:2] == ["doppelchip", "sglang"] and ws[2:3] and ws[2] in verbs) or (
        ws[:1] == ["doppelchip-sglang"] and ws[1:2] and ws[1] in verbs)


def _trtllm_serve(ws: list[str]) -> bool:
    """`doppelchip trtllm-serve ...` or `doppelchip-trtllm-serve ...`."""
    return ws[:2] == ["doppelchip", "trtllm-serve"] or ws[:1] == ["doppelchip-trtllm-serve"]


def _trtllm_http_port(ws: list[str]) -> int:
    """`trtllm-serve`'s HTTP port: --port (8000); with --grpc, --http-port, default --port + 1."""
    port = int(_flag(ws, "--port") or 8000)
    if "--grpc" not in ws:
        return port
    given = _flag(ws, "--http-port")
    return int(given) if given is not None else port + 1


def _smg_grpc_mode(ws: list[str]) -> bool:
    return "--smg-grpc-mode" in ws or "--grpc-mode" in ws


def _multi_port(ws: list[str]) -> bool:
    """`vllm serve -dpm`: one pod per rank, whose gRPC servers take free ports."""
    return "-dpm" in ws or "--data-parallel-multi-port-external-lb" in ws


def _flag(ws: list[str], *names: str) -> str | None:
    for i, w in enumerate(ws):
        for name in names:
            if w == name and i + 1 < len(ws):
                return ws[i + 1]
            if w.startswith(name + "="):
                return w.split("=", 1)[1]
    return None


def explicit_defaults(command: str) -> str:
    """The command with the ports and target it uses by default written out."""
    ws = program(words(command))
    head = ws[:2]
    if head == ["make", "test"] and "PYTEST_ARGS" not in command:
        # the suite is what runs this check: install, fetch and collect it, do not recurse
        return command.replace("make test", "make test PYTEST_ARGS='--collect-only -qq'", 1)
    if ws[1:3] == ["-m", "pytest"]:  # the same: a documented part of the suite is collected
        return command.replace("-m pytest", "-m pytest --collect-only -qq", 1)
    if head == ["make", "run"] and "ARGS=" not in command:
        return command.replace("make run", "make run ARGS='--port 50051 --http-port 8000'", 1)
    if head == ["make", "gateway"] and "ARGS=" not in command:
        return command.replace("make gateway", "make gateway ARGS='--port 50051 --http-port "
                               "8000 --gateway-port 30000 --prometheus-port 29000'", 1)
    if _vllm_serve(ws):
        add = [*(["--port", "8000"] if _flag(ws, "--port") is None else []),
               *(["--grpc-port", "50051"] if _flag(ws, "--grpc-port") is None
                 and not _smg_grpc_mode(ws) and not _multi_port(ws) else [])]
        return re.sub(r"\b(doppelchip[ -]vllm serve)", lambda m: " ".join([m[1], *add]),
                      command, count=1) if add else command
    if _sglang_serve(ws):
        add = [*(["--port", "30000"] if _flag(ws, "--port") is None else []),
               *(["--grpc-port", "50051"] if _flag(ws, "--grpc-port") is None
                 and not _smg_grpc_mode(ws) else [])]
        return re.sub(r"\b(doppelchip[ -]sglang (?:serve|launch_server))",
                      lambda m: " ".join([m[1], *add]), command, count=1) if add else command
    if _trtllm_serve(ws):
        other = (["--http-port", str(_trtllm_http_port(ws))] if "--grpc" in ws
                 else ["--grpc-port", "50051"])
        add = [*(["--port", "8000"] if _flag(ws, "--port") is None else []),
               *(other if _flag(ws, other[0]) is None else [])]
        return re.sub(r"\b(doppelchip[ -]trtllm-serve)", lambda m: " ".join([m[1], *add]),
                      command, count=1) if add else command
    add: list[str] = []
    if head in (["doppelchip", "serve"], ["doppelchip", "pods"], ["doppelchip", "gateway"]):
        if _flag(ws, "--port") is None:
            add += ["--port", "50051"]
        if _flag(ws, "--http-port", "--metrics-port") is None:
            add += ["--http-port", "8000"]
        if head[1] == "gateway":
            if _flag(ws, "--gateway-port") is None:
                add += ["--gateway-port", "30000"]
            if _flag(ws, "--prometheus-port") is None:
                add += ["--prometheus-port", "29000"]
    elif len(ws) > 1 and ws[0] == "doppelchip" and ws[1] in CLIENTS \
            and _flag(ws, "--target") is None:
        add += ["--target", "127.0.0.1:50051"]
    if add:
        command = re.sub(r"\b(doppelchip \w+)", lambda m: m[1] + " " + " ".join(add),
                         command, count=1)
    return _kv_events_endpoint(command)


def _kv_events_endpoint(command: str) -> str:
    flag = _flag(words(command), "--kv-events-config")
    if flag is None:
        return command
    try:
        config = json.loads(flag)
    except ValueError:
        return command
    if "endpoint" in config:
        return command
    config["endpoint"] = "tcp://*:5557"
    return command.replace(flag, json.dumps(config), 1) if flag in command else command


Moves = dict[int, int]  # a documented hundred (50000) -> the hundred it runs on (23400)


def move(port: int, moves: Moves) -> int:
    return moves[port // 100 * 100] + port % 100


def ports(command: str) -> set[int]:
    return {int(m["port"]) for m in _PORT.finditer(command)}


def shift_ports(text: str, moves: Moves) -> str:
    return _PORT.sub(lambda m: f"{m['pre']}{move(int(m['port']), moves)}", text)


_BACKGROUND = re.compile(r"\s&\s*(#.*)?$")


def script(commands: list[str], moves: Moves) -> str:
    """The block as a bash script body (after the prelude), its ports moved by `moves`."""
    lines: list[str] = []
    for n, command in enumerate(commands):
        command = explicit_defaults(command)
        server = server_of(command)
        moved = shift_ports(command, moves)
        if program(words(command))[:1] == ["make"]:
            moved = re.sub(r"\bmake ", 'make -C "$DC_ROOT" ', moved, count=1)
        lines.append(f"printf '\\036DC{n}\\n'")
        if server is None:
            lines.append(moved)
            continue
        background = bool(_BACKGROUND.search(moved))
        if background:
            moved = _BACKGROUND.sub("", moved)
        kind, _, target = server.probe.partition(":")
        if kind == "http":
            port, _, path = target.partition("/")
            target = f"{move(int(port), moves)}/{path}"
        call = "__dc_server" if background else "__dc_foreground"
        if program(words(command))[:1] == ["make"]:  # it installs the venv first
            call = f"DC_READY_TIMEOUT={MAKE_READY_TIMEOUT_S} {call}"
        lines.append(f"{call} {n} {kind} {shlex.quote(target)} {shlex.quote(moved)}")
    return "\n".join(lines) + "\n"


def block_ports(commands: list[str]) -> set[int]:
    """Every documented port the block's commands name or use by default."""
    return {p for c in commands for p in ports(explicit_defaults(c))}
