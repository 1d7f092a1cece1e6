"""Running one HTTP generation request: its choices (one engine request each), collected for a
JSON answer or streamed as server-sent events, always freed.

A request has one or more prompts (completions accept a list) and `n` choices per prompt;
choice `index` = prompt × n + j, as vLLM numbers them. All choices are admitted or none
(`server.frontend.parallel.submit_all`). Whatever way a request ends — finished, client
disconnect (non-streaming: a task watches for `http.disconnect`; streaming: Starlette cancels
the stream), engine failure, error — `finally` aborts the choices still running, which frees
their KV blocks (`DeploymentClient.abort` is a no-op for finished ones).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
from starlette.requests import Request

from server.engine.errors import EngineError
from server.engine.interface import EngineRequest, Finish, TokenChunk
from server.frontend import parallel
from server.frontend.deployment import DeploymentClient
from server.frontend.stream import RequestStream, StreamCut, StreamFailed
from server.http.errors import HttpError, bad_request, engine_failed, from_engine

log = logging.getLogger("doppelchip.http")

_json = msgspec.json.Encoder()


@dataclass(frozen=True)
class Framing:
    """How an answer's stream events are written and its errors answered. OpenAI's (`OPENAI`):
    `data:` lines closed by `data: [DONE]`, errors as `{"error": …}`; the Messages API's
    (`server.http.messages.FRAMING`): named events with no closing line, its own error body;
    the Responses API's (`server.http.responses.framing`): named, numbered events."""

    event: Callable[[dict], Any]  # bytes on the wire (a background run keeps the dicts)
    stream_error: Callable[[HttpError], Any]  # an engine failure in the middle of a stream
    done: bytes  # after the last event (none if empty)
    error_body: Callable[[HttpError], dict]  # a JSON answer's error


def named_event(event: dict) -> bytes:
    """A server-sent event named by its `type` (the Messages and Responses APIs' framing)."""
    return f"event: {event['type']}\ndata: ".encode() + _json.encode(event) + b"\n\n"


OPENAI = Framing(lambda e: b"data: " + _json.encode(e) + b"\n\n",
                 lambda e: b"data: " + e.json() + b"\n\n", b"data: [DONE]\n\n", HttpError.body)


@dataclass
class Choice:
    """One choice's output so far."""

    index: int
    prompt: int  # which prompt it continues
    seed: int
    ids: list[int] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    finish: Finish | None = None
    sent: int = 0  # tokens already streamed (logprob positions)

    def add(self, chunk: TokenChunk) -> None:
        self.ids.extend(chunk.token_ids)
        self.text.append(chunk.text)
        if chunk.finish is not None:
            self.finish = chunk.finish


@dataclass
class Run:
    """The admitted choices of one request and where they go."""

    client: DeploymentClient
    streams: list[RequestStream]
    choices: list[Choice]
    prompt_lens: list[int]

    def abort(self) -> None:
        parallel.abort_all(self.client, self.streams)

    def usage(self) -> dict:
        """vLLM's usage: each prompt counted once, every choice's completion tokens; the
        prefix-cache hits of each prompt's first choice in `prompt_tokens_details`."""
        prompt = sum(self.prompt_lens)
        completion = sum(len(c.ids) for c in self.choices)
        cached = sum(c.finish.usage.cached_prompt_tokens for c in self.choices
                     if c.finish is not None and c.index == c.prompt * self.n)
        return {"prompt_tokens": prompt, "total_tokens": prompt + completion,
                "completion_tokens": completion,
                "prompt_tokens_details": {"cached_tokens": cached}}

    def usage_dump(self) -> dict:
        """`usage` as vLLM's non-streamed answer writes it (`UsageInfo.model_dump()`): every
        field, None included; streamed answers leave the None ones out (`usage`)."""
        usage = self.usage()
        return {**usage, "prompt_tokens_details": {
            **usage["prompt_tokens_details"], "created_cache_tokens": None,
            "multimodal_tokens": None}, "completion_tokens_details": None}

    def choice_usage(self, c: Choice) -> dict:
        """vLLM's `continuous_usage_stats`: one choice's usage so far, on each of its chunks."""
        p, done = self.prompt_lens[c.prompt], len(c.ids)
        return {"prompt_tokens": p, "completion_tokens": done, "total_tokens": p + done}

    @property
    def n(self) -> int:
        return len(self.choices) // max(1, len(self.prompt_lens))

    def kv_transfer_params(self) -> dict | None:
        """P/D (issue 13): vLLM's response `kv_transfer_params` — the first choice's, as
        vLLM takes them from the request's final output (None unless a prefill held KV)."""
        first = self.choices[0].finish if self.choices else None
        return first.kv_transfer_params if first is not None else None


async def start(client: DeploymentClient, prompts: list[EngineRequest], n: int,
                client_id: str | None = None) -> Run:
    """Admit n choices per prompt (all or none), under the client's request id (a duplicate
    in flight is AlreadyExists); raises the engine's typed error."""
    requests, choices = [], []
    for p, request in enumerate(prompts):
        for j, child in enumerate(parallel.child_requests(request, n)):
            requests.append(child)
            choices.append(Choice(p * n + j, p, child.sampling.seed or 0))
    streams = await parallel.submit_all(client, requests, client_id)
    lens = [len(streams[p * n].out.prompt_ids) for p in range(len(prompts))]
    return Run(client, streams, choices, lens)


async def collect(run: Run, request: Request | None) -> None:
    """Every choice to its end; raises HttpError 500 if the engine died. A client that
    disconnects first cancels the collection (the request is aborted) and gets, as vLLM
    answers it, a 400 "Client disconnected" that nobody reads. No `request`: nobody waits
    (a background response), so nothing is watched."""
    for stream in run.streams:  # stream cuts (issue 13) cut streamed responses only
        stream.cut = None

    async def gather() -> None:
        async with contextlib.aclosing(parallel.merged(run.streams)) as chunks:
            async for i, chunk in chunks:
                run.choices[i].add(chunk)

    work = asyncio.ensure_future(gather())
    watch = asyncio.ensure_future(_disconnected(request) if request is not None
                                  else asyncio.Event().wait())
    try:
        await asyncio.wait((work, watch), return_when=asyncio.FIRST_COMPLETED)
        if not work.done():
            log.info("client disconnected: aborting %d choice(s)", len(run.streams))
            work.cancel()
            raise bad_request("Client disconnected")
        try:
            work.result()
        except StreamFailed as e:
            raise engine_failed(str(e)) from None
    finally:
        watch.cancel()
        if not work.done():
            work.cancel()
        with contextlib.suppress(BaseException):
            await work
        run.abort()


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


Chunker = Callable[[Choice, TokenChunk], list[dict]]


async def sse(run: Run, chunks: Chunker, head: list[dict], tail: Callable[[], list[dict]],
              framing: Framing = OPENAI) -> AsyncIterator[bytes]:
    """Server-sent events: `head` events, then `chunks(choice, chunk)` per engine chunk, then
    `tail()` (e.g. the usage chunk), then `framing.done` (`data: [DONE]`). An engine failure
    becomes an error event. The generator's `finally` aborts what is still running."""
    event = framing.event
    try:
        for e in head:
            yield event(e)
        async with contextlib.aclosing(parallel.merged(run.streams)) as merged:
            async for i, chunk in merged:
                choice = run.choices[i]
                choice.add(chunk)
                for e in chunks(choice, chunk):
                    yield event(e)
        for e in tail():
            yield event(e)
    except StreamCut:  # fault injection: the connection is cut, no [DONE] (issue 13)
        raise
    except StreamFailed as e:
        yield framing.stream_error(engine_failed(str(e)))
    finally:
        run.abort()
    if framing.done:
        yield framing.done


async def admitted(client: DeploymentClient, prompts: list[EngineRequest], n: int,
                   client_id: str | None = None) -> Run:
    """`start`, with an admission refusal turned into its HTTP answer."""
    try:
        return await start(client, prompts, n, client_id)
    except EngineError as e:
        raise from_engine(e) from None


def encode(body: dict) -> bytes:
    return _json.encode(body)
