"""A chat stream rewritten as the Messages API's events (vLLM's `message_stream_converter`,
`vllm/entrypoints/anthropic/serving.py`), event by event as the chat shapes make them.

The chat stream is asked for usage on every chunk (`messages.to_chat`): its first chunk (the
role) becomes `message_start` with the prompt's tokens; text deltas open a `text` block
(`content_block_start`, then `content_block_delta` / `text_delta` each); a tool call's header
closes the open block and opens a `tool_use` block whose arguments arrive as `input_json_delta`;
the usage chunk at the end closes the open block and becomes `message_delta` (stop reason and
usage); then `message_stop`. Blocks are numbered from 0 in the order they open.
"""

from __future__ import annotations

from typing import Any

from server.engine.interface import TokenChunk
from server.http.chat import ChatShapes
from server.http.generate import Choice
from server.http.messages import STOP_REASONS

Event = dict[str, Any]


class MessageEvents:
    """`head` / `chunks` / `tail` of a streamed `/v1/messages` answer (`generate.sse`'s
    arguments), over the chat request's `ChatShapes`."""

    def __init__(self, shapes: ChatShapes) -> None:
        self.shapes = shapes
        self.started = False
        self.next_index = 0  # the next block's index
        self.open: str | None = None  # the open block's type
        self.open_id: str | None = None  # the open tool_use block's call id
        self.ids: dict[int, str] = {}  # tool call index -> its id
        self.finish: str | None = None

    def head(self) -> list[Event]:
        return self._events(self.shapes.head())

    def chunks(self, c: Choice, chunk: TokenChunk) -> list[Event]:
        return self._events(self.shapes.chunks(c, chunk))

    def tail(self) -> list[Event]:
        return [*self._events(self.shapes.tail()), {"type": "message_stop"}]

    def _events(self, chat_events: list[Event]) -> list[Event]:
        out: list[Event] = []
        for e in chat_events:
            if not self.started:  # the role chunk: its usage has the prompt's tokens
                self.started = True
                out.append({"type": "message_start", "message": {
                    "id": e["id"], "type": "message", "role": "assistant", "content": [],
                    "model": e["model"], "stop_reason": None, "stop_sequence": None,
                    "usage": {"input_tokens": _usage(e)[0], "output_tokens": 0}}})
            elif not e["choices"]:  # the usage chunk: the end
                out += self._close()
                prompt, done = _usage(e)
                out.append({"type": "message_delta",
                            "delta": {"stop_reason": STOP_REASONS.get(self.finish or "stop")},
                            "usage": {"input_tokens": prompt, "output_tokens": done}})
            else:
                out += self._choice(e["choices"][0])
        return out

    def _choice(self, choice: Event) -> list[Event]:
        out: list[Event] = []
        if choice.get("finish_reason") is not None:
            self.finish = choice["finish_reason"]
        delta = choice["delta"]
        if delta.get("content"):
            if self.open != "text":
                out += self._close()
                out.append(self._start({"type": "text", "text": ""}))
            out.append(self._delta({"type": "text_delta", "text": delta["content"]}))
        for call in delta.get("tool_calls") or ():
            args = (call.get("function") or {}).get("arguments")
            if call.get("id") is not None:
                self.ids[call["index"]] = call["id"]
                name = (call.get("function") or {}).get("name")
                if self.open_id != call["id"] and name is not None:
                    out += self._close()
                    out.append(self._start({"type": "tool_use", "id": call["id"],
                                            "name": name, "input": {}}))
                    self.open_id = call["id"]
                call_id = call["id"]
            else:
                call_id = self.ids.get(call["index"])
            if args and call_id is not None and self.open_id == call_id:
                out.append(self._delta({"type": "input_json_delta", "partial_json": args}))
        return out

    def _start(self, block: Event) -> Event:
        self.open = block["type"]
        return {"type": "content_block_start", "index": self.next_index, "content_block": block}

    def _delta(self, delta: Event) -> Event:
        return {"type": "content_block_delta", "index": self.next_index, "delta": delta}

    def _close(self) -> list[Event]:
        if self.open is None:
            return []
        event = {"type": "content_block_stop", "index": self.next_index}
        self.open = self.open_id = None
        self.next_index += 1
        return [event]


def _usage(e: Event) -> tuple[int, int]:
    usage = e.get("usage") or {}
    return usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)
