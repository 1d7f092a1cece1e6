"""Run documented shell blocks: in a scratch folder that sees the repository, on free ports.

The scratch folder holds a symlink to every top-level entry of the repository, so the docs'
relative paths (`examples/order.json`, `server/default_fleet.toml`, `.venv/bin/doppelchip`)
resolve while the files commands write (`sweep.html`, `whatif/`, certificates) land in the
scratch folder, one per block. `make` runs in the repository itself (`make -C`): a pip run from
the scratch folder would write the scratch path into the venv's scripts. `doppelchip` on PATH
is the repository's venv's. PYTHONUNBUFFERED keeps stdout and stderr in the order a terminal
shows them, which the quoted outputs record. Blocks run concurrently (`run_blocks`): most of
their time is servers starting and real-time streams, not CPU.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from scripts.doccheck.blocks import ShellBlock
from scripts.doccheck.commands import Moves, block_ports, explicit_defaults, script, server_of
from server.ports import check_free

PRELUDE = (Path(__file__).parent / "prelude.sh").read_text()
BLOCK_TIMEOUT_S = 240.0
STOP_GRACE_S = 120.0  # a timed-out block's own clean-up: SIGTERM to its servers, 30 s each
SUCCESSIVE = 12  # a pod fleet or gateway uses successive ports after the one it names
# moved ports live in [LOW, HIGH): above the well-known ones, below Linux's ephemeral range
# (32768-60999), where an outgoing connection's local port could collide with a listener
LOW, HIGH = 10000, 32700
_held: dict[int, socket.socket] = {}  # hundreds handed to blocks running now, with their locks
_lock = threading.Lock()


def _hold(base: int) -> socket.socket | None:
    """An exclusive lock on the hundred `base` for every docs run on this machine (an abstract
    unix socket, as server.ports.claim: gone when its holder exits); None if another holds it.
    Two suites at once (two clones' `make test`) would otherwise pick the same hundred, each
    find it free, and race to bind it."""
    lock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        lock.bind(f"\0doppelchip-doccheck-{base}")
    except OSError:
        lock.close()
        return None
    return lock


@dataclass
class Result:
    """What one block did: its exit status, its output (stdout and stderr, as a terminal)."""

    block: ShellBlock
    returncode: int
    output: str
    moves: Moves
    logs: str
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def starts_server(block: ShellBlock) -> bool:
    return any(server_of(explicit_defaults(c)) for c in block.commands)


def talks_to_server(block: ShellBlock) -> bool:
    """A block with no server of its own whose commands name a loopback port."""
    return not starts_server(block) and bool(block_ports(block.commands))


def _free(port: int) -> bool:
    """Nothing listens on 127.0.0.1:port (the servers' own check, server.ports)."""
    try:
        check_free("127.0.0.1", port, "documented")
    except OSError:  # PortInUse, or a port this host cannot bind
        return False
    return True


def allocate(documented: set[int], fixed: Moves | None = None) -> Moves:
    """A free hundred for each hundred of documented ports (those in `fixed` keep theirs)."""
    moves: Moves = dict(fixed or {})
    rng = random.Random()
    with _lock:
        for hundred in sorted({p // 100 * 100 for p in documented} - set(moves)):
            offsets = [p % 100 + i for p in documented if p // 100 * 100 == hundred
                       for i in range(SUCCESSIVE)]
            for _ in range(500):
                base = rng.randrange(LOW // 100, HIGH // 100 - 1) * 100
                if base in _held or base in moves.values():
                    continue
                if all(_free(base + o) for o in offsets if o < 100) and (lock := _hold(base)):
                    break
            else:
                raise RuntimeError("no free ports for the documented commands")
            moves[hundred] = base
            _held[base] = lock
    return moves


def release(moves: Moves, keep: Moves | None = None) -> None:
    with _lock:
        for hundred, base in moves.items():
            if (not keep or keep.get(hundred) != base) and (lock := _held.pop(base, None)):
                lock.close()


def scratch(root: Path) -> Path:
    d = Path(tempfile.mkdtemp(prefix="doccheck-"))
    for entry in root.iterdir():
        if entry.name != ".git":
            (d / entry.name).symlink_to(entry)
    return d


def run_block(block: ShellBlock, root: Path, fixed: Moves | None = None,
              timeout: float = BLOCK_TIMEOUT_S, in_place: bool = False) -> Result:
    """Run one block as a bash script; `fixed`: ports already moved (the shared server's);
    `in_place`: in `root` itself, not in a scratch folder (a throwaway clone)."""
    start = time.monotonic()
    moves = allocate(block_ports(block.commands), fixed)
    try:
        return _run(block, root, moves, timeout, start, in_place)
    finally:
        release(moves, keep=fixed)


def _run(block: ShellBlock, root: Path, moves: Moves, timeout: float, start: float,
         in_place: bool) -> Result:
    body = script(block.commands, moves)
    cwd = root if in_place else scratch(root)
    logs = Path(tempfile.mkdtemp(prefix="doccheck-logs-"))
    env = dict(os.environ)
    env.update(PATH=f"{root / '.venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}",
               PYTHONUNBUFFERED="1", DC_LOGS=str(logs), DC_ROOT=str(root), NO_COLOR="1",
               COLUMNS="100", TERM="dumb")
    env.pop("VIRTUAL_ENV", None)
    proc = subprocess.Popen(["bash", "-c", PRELUDE + body], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True, text=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        out = _stop(proc, logs / "groups")
        out += f"\ndocs test: the block took more than {timeout:.0f} s"
        proc.returncode = -1
    _kill_leftovers(logs / "groups")
    server_logs = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')}"
                            for p in sorted(logs.iterdir()) if p.suffix == ".log")
    shutil.rmtree(logs, ignore_errors=True)
    if not in_place:
        shutil.rmtree(cwd, ignore_errors=True)
    return Result(block, proc.returncode, out.replace(str(cwd), "."), moves, server_logs,
                  time.monotonic() - start)


def run_blocks(blocks: list[ShellBlock], root: Path, shared_moves: Callable[[], Moves],
               workers: int = 4) -> dict[str, Result]:
    """Every block, `workers` at a time; a block that talks to a server it does not start gets
    the shared server's ports (`shared_moves` starts it on first use)."""
    def one(block: ShellBlock) -> Result:
        fixed = shared_moves() if talks_to_server(block) else None
        return run_block(block, root, fixed)

    # the slow ones first, so that they do not end up alone at the end
    order = sorted(blocks, key=lambda b: -len(b.commands) - 10 * starts_server(b))
    with ThreadPoolExecutor(workers) as pool:
        return {r.block.where: r for r in pool.map(one, order)}


def _stop(proc: subprocess.Popen, groups: Path) -> str:
    """A block past its time: SIGTERM (its clean-up stops its servers, 30 s each at most), then
    SIGKILL for it and its servers' groups; its output so far. Bounded: a server still holding
    the output pipe would otherwise keep `communicate` waiting for ever."""
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        return proc.communicate(timeout=STOP_GRACE_S)[0]
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        _kill_leftovers(groups)
        return proc.communicate(timeout=STOP_GRACE_S)[0]


def _kill_leftovers(groups: Path) -> None:
    """Servers the block's own clean-up did not stop (it was killed): SIGKILL their groups."""
    if not groups.exists():
        return
    for line in groups.read_text().split():
        with contextlib.suppress(ProcessLookupError, PermissionError, ValueError):
            os.killpg(int(line), signal.SIGKILL)
