"""A headless Chromium driven over the DevTools protocol on a pipe (--remote-debugging-pipe:
JSON messages separated by NUL on fds 3 and 4), for the report tests: load a page, evaluate
JavaScript in it, collect its console messages and failed loads. No new dependency."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def find_chromium() -> tuple[str | None, str]:
    """(path, "") or (None, why not): installs it with scripts/install_chromium.sh if need be."""
    found = shutil.which("chromium")
    if found:
        return found, ""
    run = subprocess.run([str(ROOT / "scripts/install_chromium.sh")], capture_output=True,
                         text=True, timeout=600)
    if run.returncode == 0 and shutil.which("chromium"):
        return shutil.which("chromium"), ""
    return None, f"chromium not installed and scripts/install_chromium.sh failed: {run.stderr}"


class Browser:
    """One headless Chromium process and one page target."""

    STARTS = 3  # a Chromium that dies while starting (seen once on a loaded 2-core CI) is
    #             started again; the page checks themselves are never retried

    def __init__(self, binary: str) -> None:
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 (open for the browser's life)
        for attempt in range(1, self.STARTS + 1):
            try:
                self._start(binary)
                return
            except (BrokenPipeError, RuntimeError):
                self._stop_process()
                if attempt == self.STARTS:
                    self._log.seek(0)
                    tail = self._log.read()[-2000:].decode(errors="replace")
                    raise RuntimeError(f"chromium did not start ({self.STARTS} tries); its "
                                       f"stderr ends:\n{tail}") from None

    def _start(self, binary: str) -> None:
        self._to_r, self._to_w = os.pipe()
        self._from_r, self._from_w = os.pipe()
        self._profile = tempfile.TemporaryDirectory()
        # the child reads commands on fd 3 and writes replies on fd 4
        self.proc = subprocess.Popen(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--remote-debugging-pipe", f"--user-data-dir={self._profile.name}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self._log,
            pass_fds=(3, 4), preexec_fn=self._dup_fds)
        os.close(self._to_r)
        os.close(self._from_w)
        self._buf = b""
        self._id = 0
        self.events: list[dict[str, Any]] = []
        targets = self.call("Target.getTargets")["targetInfos"]
        page = next(t for t in targets if t["type"] == "page")
        self.session = self.call("Target.attachToTarget", targetId=page["targetId"],
                                 flatten=True)["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable", session=self.session)

    def _dup_fds(self) -> None:
        os.dup2(self._to_r, 3)
        os.dup2(self._from_w, 4)

    def _read(self) -> dict[str, Any]:
        while b"\0" not in self._buf:
            chunk = os.read(self._from_r, 1 << 16)
            if not chunk:
                raise RuntimeError("chromium closed the DevTools pipe")
            self._buf += chunk
        msg, self._buf = self._buf.split(b"\0", 1)
        return json.loads(msg)

    def call(self, method: str, session: str | None = None, **params: Any) -> dict[str, Any]:
        self._id += 1
        msg: dict[str, Any] = {"id": self._id, "method": method, "params": params}
        if session:
            msg["sessionId"] = session
        os.write(self._to_w, json.dumps(msg).encode() + b"\0")
        while True:
            reply = self._read()
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_event(self, method: str) -> dict[str, Any]:
        for event in self.events:
            if event.get("method") == method:
                return event
        while True:
            event = self._read()
            self.events.append(event)
            if event.get("method") == method:
                return event

    def open(self, url: str) -> None:
        self.call("Page.navigate", session=self.session, url=url)
        self.wait_event("Page.loadEventFired")

    def evaluate(self, expression: str) -> Any:
        out = self.call("Runtime.evaluate", session=self.session, expression=expression,
                        returnByValue=True)
        return out["result"].get("value")

    def console_errors(self) -> list[str]:
        """Console messages of level error and failed loads the page reported."""
        errors = []
        for e in self.events:
            p = e.get("params", {})
            if e.get("method") == "Runtime.consoleAPICalled" and p.get("type") == "error":
                errors.append(" ".join(str(a.get("value")) for a in p.get("args", [])))
            elif e.get("method") == "Runtime.exceptionThrown":
                errors.append(str(p.get("exceptionDetails")))
            elif e.get("method") == "Log.entryAdded" and p["entry"]["level"] == "error":
                errors.append(p["entry"]["text"])
        return errors

    def close(self) -> None:
        with contextlib.suppress(RuntimeError, OSError):
            self.call("Browser.close")
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._to_w)
        os.close(self._from_r)
        self._profile.cleanup()
        self._log.close()

    def _stop_process(self) -> None:
        """A start that failed: kill what is left of it and close its pipes and profile."""
        with contextlib.suppress(OSError):
            self.proc.kill()
        self.proc.wait()
        for fd in (self._to_w, self._from_r):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._profile.cleanup()
