"""vLLM's in-memory response store, on when `VLLM_ENABLE_RESPONSES_API_STORE=1` (vLLM's
environment variable, read at start-up; off by default, as in vLLM): what lets a Responses
request continue an earlier one (`previous_response_id`), be fetched again (`GET
/v1/responses/{id}`, a background stream replayed from `starting_after`), run in the background
and be cancelled.

Why it exists apart from the routes: it is the one writer of that state, and it is bounded.
vLLM keeps every response forever ("This may cause a memory leak since we never remove
responses from the store"); a stand-in under load tests must not, so the oldest finished
responses (with their messages and events) are dropped beyond `capacity` responses or
`max_chars` characters of stored text (prompts and answers: a 2 MB prompt counts), and the
oldest finished background streams' events beyond `event_logs` streams (a stream keeps one
event per token) — a response still running in the background is never dropped. Each front
end has its own store, as each of vLLM's API servers has (`--api-server-count` > 1: a later
request may land on a front end that never saw the response, and get vLLM's 404).
"""

from __future__ import annotations

import asyncio
import os
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterable
from typing import Any

ENV = "VLLM_ENABLE_RESPONSES_API_STORE"
CAPACITY = 4096  # responses kept (each with its input messages)
MAX_CHARS = 50_000_000  # characters of stored prompt and answer text, all responses together
EVENT_LOGS = 256  # background streams whose events are kept (for `starting_after` replays)

Event = dict[str, Any]


class ResponseStore:
    """Stored responses by id, each with the chat messages it was made from (the history a
    later `previous_response_id` continues), a background stream's events, and the background
    task still running it."""

    def __init__(self, capacity: int = CAPACITY, max_chars: int = MAX_CHARS,
                 event_logs: int = EVENT_LOGS) -> None:
        self.capacity, self.max_chars, self.event_logs = capacity, max_chars, event_logs
        self.responses: OrderedDict[str, Event] = OrderedDict()
        self.messages: dict[str, list[Event]] = {}
        self.events: dict[str, tuple[list[Event], asyncio.Event]] = {}
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.chars: dict[str, int] = {}  # each response's stored text
        self.total_chars = 0

    @classmethod
    def from_env(cls) -> ResponseStore | None:
        """A store when vLLM's variable asks for one (`1`), else None (vLLM's default)."""
        return cls() if os.environ.get(ENV, "0").strip() not in ("", "0") else None

    def get(self, response_id: str) -> Event | None:
        return self.responses.get(response_id)

    def put(self, response: Event, messages: list[Event] | None = None) -> None:
        """Stores (or updates) a response; a cancelled one keeps its status, as vLLM keeps it."""
        rid = response["id"]
        old = self.responses.get(rid)
        if old is not None and old["status"] == "cancelled":
            return
        self.responses[rid] = response
        if messages is not None:
            self.messages[rid] = messages
        size = _chars(self.messages.get(rid, ()), response)
        self.total_chars += size - self.chars.get(rid, 0)
        self.chars[rid] = size
        self._bound()

    def history(self, response_id: str) -> list[Event]:
        """The chat messages a continuation starts from: the stored request's messages, then
        its answer's text (vLLM's `construct_input_messages`: calls and reasoning left out)."""
        prev = self.responses[response_id]
        out = list(self.messages.get(response_id, ()))
        for item in prev["output"]:
            if item["type"] == "message":
                out += [{"role": "assistant", "content": part["text"]}
                        for part in item["content"]]
        return out

    def run(self, response_id: str, task: asyncio.Task[None]) -> None:
        self.tasks[response_id] = task
        task.add_done_callback(lambda _: self.tasks.pop(response_id, None))

    def open_events(self, response_id: str) -> tuple[list[Event], asyncio.Event]:
        self.events[response_id] = (events := [], signal := asyncio.Event())
        self._bound()
        return events, signal

    async def replay(self, response_id: str, starting_after: int | None
                     ) -> AsyncIterator[Event]:
        """A background stream's events after `starting_after`, then each as it comes, until
        its last (vLLM's `responses_background_stream_generator`)."""
        events, signal = self.events[response_id]
        i = 0 if starting_after is None else starting_after + 1
        while True:
            signal.clear()
            while i < len(events):
                yield events[i]
                if events[i]["type"] in ("response.completed", "error"):
                    return
                i += 1
            if response_id not in self.tasks:  # (cancelled: nothing more will come)
                return
            await signal.wait()

    async def cancel(self, response_id: str) -> None:
        """Cancels a background run and waits for it (its requests are aborted)."""
        task = self.tasks.get(response_id)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if response_id in self.events:
            self.events[response_id][1].set()

    def _bound(self) -> None:
        """Drops the oldest finished responses past the bounds (their events with them), then
        the oldest finished streams' events past `event_logs`."""
        while len(self.responses) > self.capacity or self.total_chars > self.max_chars:
            rid = next((r for r in self.responses if r not in self.tasks), None)
            if rid is None:
                break
            del self.responses[rid]
            self.messages.pop(rid, None)
            self.events.pop(rid, None)
            self.total_chars -= self.chars.pop(rid, 0)
        while len(self.events) > self.event_logs:
            rid = next((r for r in self.events if r not in self.tasks), None)
            if rid is None:
                break
            del self.events[rid]


def _chars(messages: Iterable[Event], response: Event) -> int:
    """The text a stored response holds: its messages' and its output's (what can be large)."""
    n = 0
    for m in messages:
        content = m.get("content")
        n += len(content) if isinstance(content, str) else sum(
            len(str(p.get("text", ""))) for p in content or () if isinstance(p, dict))
    for item in response.get("output", ()):
        n += len(item.get("arguments", "")) + sum(len(p.get("text", ""))
                                                  for p in item.get("content", ()))
    return n
