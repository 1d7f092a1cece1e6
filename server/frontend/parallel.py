"""`n` > 1: parallel sampling as vLLM v1 does it, in the front end, for every protocol.

A request for n sequences becomes n engine requests with the same prompt (the deployment's
prefix cache then shares the prompt's KV blocks among them) and different seeds. The rule is
vLLM's `ParentRequest.get_child_info` (`vllm/v1/engine/parallel_sampling.py`, 0.33.0): child i
has the id `f"{i}_{request_id}"` and the seed `seed + i`; doppelchip's unset seed is 0 (so
identical requests stream identical tokens), hence child i of an unseeded request has seed i.
With n = 1 the request goes through unchanged.

`submit_all` admits every child or none: if one is refused, those already admitted are aborted
and the refusal is raised. `abort_all` frees whatever is still running (client disconnect,
error, early end); it is safe to call any number of times. `merged` interleaves the children's
chunks as they come (HTTP: each chunk names its choice `index`); `in_order` yields one child's
chunks after the other's (gRPC, whose response has no sequence index: the children run
concurrently in the engine, and a later child's tokens wait in its stream until it is read).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence

import msgspec

from server.engine.interface import EngineRequest, TokenChunk
from server.frontend.deployment import DeploymentClient
from server.frontend.stream import RequestStream

MAX_N = 128  # more sequences than this per request is refused (INVALID_ARGUMENT / 400)


def child_requests(request: EngineRequest, n: int) -> list[EngineRequest]:
    """The n engine requests of a request for n sequences (itself when n == 1)."""
    if n == 1:
        return [request]
    base = request.sampling.seed or 0
    return [
        msgspec.structs.replace(
            request, request_id=f"{i}_{request.request_id}",
            sampling=msgspec.structs.replace(request.sampling, seed=base + i))
        for i in range(n)
    ]


async def submit_all(client: DeploymentClient, requests: Sequence[EngineRequest],
                     client_id: str | None = None) -> list[RequestStream]:
    """Admit every request (concurrently) or none: the first refusal is raised after the
    admitted ones are aborted. `client_id`: the client's id for the whole request, claimed
    on the deployment (AlreadyExists while another request holds it) until its streams end.
    Failure injection (issue 13, `frontend/faults.py`) refuses it first, or arms a cut."""
    faults = client.faults
    k = faults.admit() if faults is not None else 0
    streams = await _submit_all(client, requests, client_id)
    if faults is not None:
        faults.arm(k, streams)
    return streams


async def _submit_all(client: DeploymentClient, requests: Sequence[EngineRequest],
                      client_id: str | None) -> list[RequestStream]:
    if client_id is not None:
        client.claim(client_id)
    try:
        if len(requests) == 1:
            return [await client.submit(requests[0], client_id)]
        results = await asyncio.gather(*(client.submit(r, client_id) for r in requests),
                                       return_exceptions=True)
        streams = [r for r in results if isinstance(r, RequestStream)]
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            abort_all(client, streams)
            raise errors[0]
        return streams
    finally:
        if client_id is not None:
            client.unclaim_if_idle(client_id)


def abort_all(client: DeploymentClient, streams: Sequence[RequestStream]) -> None:
    for stream in streams:
        client.abort(stream)


def in_order(streams: Sequence[RequestStream]) -> AsyncIterator[TokenChunk]:
    """Every chunk of child 0, then child 1's, ... (one stream: its own iterator, no layer)."""
    if len(streams) == 1:
        return streams[0].outputs()
    return _one_after_another(streams)


async def _one_after_another(streams: Sequence[RequestStream]) -> AsyncIterator[TokenChunk]:
    for stream in streams:
        async for chunk in stream.outputs():
            yield chunk


async def merged(streams: Sequence[RequestStream]) -> AsyncIterator[tuple[int, TokenChunk]]:
    """(child index, chunk) in arrival order; each child's chunks in their own order. A
    child's StreamFailed is raised here (after the other children stop being read)."""
    if len(streams) == 1:
        async for chunk in streams[0].outputs():
            yield 0, chunk
        return
    queue: asyncio.Queue[tuple[int, TokenChunk | BaseException | None]] = asyncio.Queue()

    async def pump(i: int, stream: RequestStream) -> None:
        try:
            async for chunk in stream.outputs():
                queue.put_nowait((i, chunk))
        except Exception as e:  # handed to the consumer, raised there
            queue.put_nowait((i, e))
            return
        queue.put_nowait((i, None))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        left = len(tasks)
        while left:
            i, item = await queue.get()
            if item is None:
                left -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield i, item
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
