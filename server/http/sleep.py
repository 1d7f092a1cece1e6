"""Sleep mode over HTTP, as vLLM 0.33.0 serves it (vllm/entrypoints/serve/dev/sleep/
api_router.py and metrics.py): `POST /sleep?level=&mode=` → `{"status": "sleeping", "level"}`,
`POST /wake_up?tags=...` → `{"status": "awake" | "sleeping", "tags"}`, `GET /is_sleeping`, and
the sleep-mode operation metrics.

vLLM mounts these only with VLLM_SERVER_DEV_MODE=1; here they are always there (issue 13:
sleep mode always available, `--enable-sleep-mode` accepted). The command reaches every
deployment this front end serves (a pod serves one) and returns when every engine applied it:
a wake-up returns once the weights are back on the emulated timeline. A level outside 0..2 or
an unknown mode is FastAPI's validation error (400, as vLLM answers it); an unknown tag a 400.

- `/wake_up`'s status is "awake" once nothing is asleep any more (vLLM's `fully_awake`), else
  "sleeping" (a wake-up of some tags only); `tags` echoes the tags asked for, null for none.
- `/is_sleeping` is true while an engine sleeps or while `/pause` holds it, as vLLM 0.33.0's
  `is_sleeping` (`is_scheduler_paused() or executor sleeping`).
- `POST /release_kv_cache_memory` → `{"status": "kv_cache_released"}`: after a completed
  `/pause` (no request left) the prefix cache is emptied and the KV cache sleeps until a
  wake-up; otherwise vLLM's 500 "Call to release_kv_cache_memory method failed: ...".
- `vllm:sleep_mode_operation_duration_seconds{operation}` and
  `vllm:sleep_mode_operations_in_flight{operation}` (`sleep`, `release_kv_cache_memory`,
  `wake`; vLLM's labels, buckets and
  multiprocess mode `livesum`) are created by the first sleep-mode call, as vLLM creates them,
  and kept in prometheus_client's multiprocess files with the HTTP series. The duration is in
  emulated seconds (a wake-up's weights coming back takes its emulated time at any
  `time_scale`), as every vllm: latency here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Annotated, Literal

from fastapi import FastAPI, Query
from prometheus_client import CollectorRegistry, Gauge, Histogram
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from server.engine.errors import CheckpointBlocked, EngineError, InvalidRequest
from server.engine_proc.sleep import TAGS
from server.http.errors import HttpError, error_response
from server.http.state import HttpState
from server.ipc import messages as m

BUCKETS = (0.01, 0.1, 1, 10, 30, 60, 120, 300, 600)  # vLLM's


class SleepModeOperationMetrics:
    """vLLM's two sleep-mode series, created on the first operation (as vLLM's are)."""

    def __init__(self, now: Callable[[], float]) -> None:
        registry = CollectorRegistry(auto_describe=False)  # values go to the multiprocess files
        self.now = now
        self.duration = Histogram("vllm:sleep_mode_operation_duration_seconds",
                                  "Duration of one sleep-mode operation.", ["operation"],
                                  buckets=BUCKETS, registry=registry)
        self.in_flight = Gauge("vllm:sleep_mode_operations_in_flight",
                               "Sleep-mode operations currently awaited.", ["operation"],
                               multiprocess_mode="livesum", registry=registry)

    @contextmanager
    def record(self, operation: str) -> Iterator[None]:
        active = self.in_flight.labels(operation)
        started = self.now()
        active.inc()
        try:
            yield
        finally:
            active.dec()
            self.duration.labels(operation).observe(max(0.0, self.now() - started))


def add_sleep_routes(app: FastAPI, state: HttpState) -> None:
    metrics: list[SleepModeOperationMetrics] = []  # created by the first operation

    def record(operation: str):
        if not metrics:
            metrics.append(SleepModeOperationMetrics(state.now))
        return metrics[0].record(operation)

    async def run(make, operation: str,
                  refused: Callable[[InvalidRequest], HttpError] = lambda e: HttpError(
                      400, str(e), "BadRequestError")) -> Response | None:
        """Send the command to every deployment; None when all applied it, else the error
        (`refused`: the answer to an engine's refusal)."""
        try:
            with record(operation):
                await state.fleet.control(make)
        except InvalidRequest as e:
            return error_response(refused(e), "")
        except CheckpointBlocked as e:  # vLLM's engine RuntimeError: its generic 500
            return error_response(HttpError(500, str(e), "InternalServerError"), "")
        except EngineError as e:
            return error_response(HttpError(503, str(e), "ServiceUnavailableError"), "")
        return None

    @app.post("/sleep")
    async def sleep(level: Annotated[int, Query(ge=0, le=2)] = 1,
                    mode: Annotated[Literal["abort", "wait", "keep"], Query()] = "abort",
                    reset_connector: Annotated[bool, Query()] = True) -> Response:
        failed = await run(lambda fe, seq: m.Sleep(fe, seq, level, mode, reset_connector),
                           "sleep")
        return failed or JSONResponse({"status": "sleeping", "level": level})

    @app.post("/release_kv_cache_memory")
    async def release_kv_cache_memory(reset_connector: Annotated[bool, Query()] = True
                                      ) -> Response:
        """After a completed pause, the KV cache's memory is discarded until a wake-up;
        refused otherwise with vLLM's 500 (its engine's RuntimeError)."""
        failed = await run(lambda fe, seq: m.ReleaseKvCache(fe, seq, reset_connector),
                           "release_kv_cache_memory",
                           lambda e: HttpError(500, "Call to release_kv_cache_memory method "
                                               f"failed: {e}", "InternalServerError"))
        return failed or JSONResponse({"status": "kv_cache_released"})

    @app.post("/wake_up")
    async def wake_up(request: Request) -> Response:
        tags = tuple(request.query_params.getlist("tags"))
        bad = [t for t in tags if t not in TAGS]
        if bad:
            return error_response(HttpError(400, f"unknown wake_up tags {bad}; known: "
                                            f"{list(TAGS)}", "BadRequestError", "tags"), "")
        failed = await run(lambda fe, seq: m.WakeUp(fe, seq, tags), "wake")
        awake = not any(c.is_sleeping() for c in state.fleet.clients.values())
        return failed or JSONResponse({"status": "awake" if awake else "sleeping",
                                       "tags": list(tags) or None})

    @app.get("/is_sleeping")
    async def is_sleeping() -> JSONResponse:
        return JSONResponse({"is_sleeping": any(
            c.is_paused() for c in state.fleet.clients.values())})
