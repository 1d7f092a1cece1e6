"""vLLM 0.34.0's `--sse-keep-alive-interval`: an SSE comment on a stream that has sent nothing
for a while (`vllm/entrypoints/serve/utils/sse_keep_alive.py`, followed, not copied).

Why it exists: a reverse proxy or tunnel in front of a pod (NGINX's `proxy_read_timeout`, an
ALB, Cloudflare Tunnel) closes a connection that sends no byte for its read timeout. A
completion waiting in the queue, prefilling or between tokens sends none, so vLLM's completions
and chat routes wrap their stream: after `interval` wall seconds without an event it sends the
comment line `: keep-alive` (and a blank line), which SSE clients skip. The interval is wall
time, as a proxy's timeout is, whatever the pod's `--time-scale`.

Contract: with `interval` <= 0 (the default) the stream is returned as it is. Otherwise the
events are the stream's, in order, with comments between them only; closing the wrapper (the
client gone) closes the stream, so its `finally` (which aborts the request) runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator

KEEP_ALIVE = b": keep-alive\n\n"


def with_sse_keep_alive(events: AsyncIterator[bytes], interval: float) -> AsyncIterator[bytes]:
    """`events`, with a keep-alive comment after each `interval` seconds of silence."""
    if not (interval > 0 and math.isfinite(interval)):
        return events
    return _kept_alive(events, interval)


async def _kept_alive(events: AsyncIterator[bytes], interval: float) -> AsyncIterator[bytes]:
    # One pending `anext` task at a time: `asyncio.wait` times out without cancelling it
    # (`wait_for` would cancel the stream in the middle of producing an event).
    pending: asyncio.Task[bytes] = asyncio.ensure_future(anext(events))
    try:
        while True:
            done, _ = await asyncio.wait({pending}, timeout=interval)
            if not done:
                yield KEEP_ALIVE
                continue
            try:
                event = pending.result()
            except StopAsyncIteration:
                return
            yield event
            pending = asyncio.ensure_future(anext(events))
    finally:
        pending.cancel()
        with contextlib.suppress(BaseException):
            await pending
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            with contextlib.suppress(BaseException):
                await aclose()
