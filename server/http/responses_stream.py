"""A chat stream rewritten as the Responses API's events (vLLM's `process_simple_stream`,
`vllm/entrypoints/openai/responses/simple_streaming_events.py`), as the chat shapes make them.

`response.created` and `response.in_progress` (the response so far: no output, no usage)
open the stream. Text deltas open a `message` item (`response.output_item.added`, then
`response.content_part.added` with an empty `output_text` part) and arrive as
`response.output_text.delta`; a tool call's header closes the open item and opens a
`function_call` item whose arguments arrive as `response.function_call_arguments.delta`. An
item closes with its done events (`response.output_text.done`, `response.content_part.done`,
`response.output_item.done`; or `response.function_call_arguments.done`,
`response.output_item.done`). The usage chunk at the end closes the open item and becomes
`response.completed`, carrying the whole response: its items are the streamed ones, same ids.
Every event has its `sequence_number`, from 0.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from server.engine.interface import TokenChunk
from server.http.chat import ChatShapes
from server.http.errors import HttpError
from server.http.generate import Choice
from server.http.responses import (
    budget,
    call_item,
    error_event,
    logprobs,
    new_id,
    shell,
    text_item,
    usage,
)
from server.http.responses_protocol import ResponsesRequest

Event = dict[str, Any]


class ResponseEvents:
    """`head` / `chunks` / `tail` of a streamed `/v1/responses` answer (`generate.sse`'s
    arguments), over the chat request's `ChatShapes`; `error` is its stream's error event;
    `on_done` gets the final response (to store it)."""

    def __init__(self, req: ResponsesRequest, shapes: ChatShapes, max_model_len: int,
                 on_done: Callable[[Event], None] | None = None) -> None:
        self.req, self.shapes, self.on_done = req, shapes, on_done
        self.created = int(time.time())
        self.max_tokens = budget(req, shapes.run.prompt_lens[0], max_model_len)
        self.seq = 0
        self.output: list[Event] = []  # the finished items
        self.open: Event | None = None  # the open item (as it will be when done)
        self.text: list[str] = []
        self.lps: list[Event] | None = [] if req.logprobs_included() else None
        self.finish: str | None = None

    def head(self) -> list[Event]:
        self.shapes.head()  # (the role chunk: nothing of it is sent)
        now = self._response([], "in_progress", None)
        return [self._n({"type": "response.created", "response": now}),
                self._n({"type": "response.in_progress", "response": now})]

    def chunks(self, c: Choice, chunk: TokenChunk) -> list[Event]:
        out: list[Event] = []
        for e in self.shapes.chunks(c, chunk):
            choice = e["choices"][0]
            if choice.get("finish_reason") is not None:
                self.finish = choice["finish_reason"]
            delta = choice["delta"]
            if delta.get("content"):
                out += self._text(delta["content"], choice.get("logprobs"))
            for call in delta.get("tool_calls") or ():
                out += self._call(call)
        return out

    def tail(self) -> list[Event]:
        out = self._close()
        last = self.shapes.tail()
        status = "incomplete" if self.finish == "length" else "completed"
        done = self._response(self.output, status, usage(last[-1]["usage"]))
        if self.on_done is not None:
            self.on_done(done)  # (stored: VLLM_ENABLE_RESPONSES_API_STORE)
        out.append(self._n({"type": "response.completed", "response": done}))
        return out

    def error(self, e: HttpError) -> Event:
        event = error_event(e, self.seq)
        self.seq += 1
        return event

    def _text(self, text: str, lp: Event | None) -> list[Event]:
        out: list[Event] = []
        if self.open is None or self.open["type"] != "message":
            out += self._close()
            self.open, self.text = text_item(new_id("msg"), "", None), []
            out += [self._n({"type": "response.output_item.added", **self._at(),
                             "item": {**self.open, "status": "in_progress", "content": []}}),
                    self._n({"type": "response.content_part.added", **self._at(),
                             "item_id": self.open["id"], "content_index": 0,
                             "part": {"type": "output_text", "text": "", "annotations": [],
                                      "logprobs": []}})]
        self.text.append(text)
        if lp is not None and self.lps is not None:
            self.lps += logprobs(lp["content"])
        out.append(self._n({"type": "response.output_text.delta", **self._at(),
                            "item_id": self.open["id"], "content_index": 0, "delta": text,
                            "logprobs": logprobs(lp["content"], stream=True) if lp else []}))
        return out

    def _call(self, call: Event) -> list[Event]:
        out: list[Event] = []
        fn = call.get("function") or {}
        if call.get("id") is not None and fn.get("name") is not None:  # a new call's header
            out += self._close()
            self.open = call_item(new_id("fc"), call["id"], fn["name"], "")
            out.append(self._n({"type": "response.output_item.added", **self._at(),
                                "item": {**self.open, "status": "in_progress"}}))
        args = fn.get("arguments")
        if args and self.open is not None and self.open["type"] == "function_call":
            self.open["arguments"] += args
            out.append(self._n({"type": "response.function_call_arguments.delta",
                                **self._at(), "item_id": self.open["id"], "delta": args}))
        return out

    def _close(self) -> list[Event]:
        item, self.open = self.open, None
        if item is None:
            return []
        at = {"output_index": len(self.output)}
        if item["type"] == "message":
            text = "".join(self.text)
            item = text_item(item["id"], text, self.lps)
            part = item["content"][0]
            out = [self._n({"type": "response.output_text.done", **at, "item_id": item["id"],
                            "content_index": 0, "text": text, "logprobs": self.lps or []}),
                   self._n({"type": "response.content_part.done", **at,
                            "item_id": item["id"], "content_index": 0, "part": part})]
        else:
            out = [self._n({"type": "response.function_call_arguments.done", **at,
                            "item_id": item["id"], "name": item["name"],
                            "arguments": item["arguments"]})]
        out.append(self._n({"type": "response.output_item.done", **at, "item": item}))
        self.output.append(item)
        return out

    def _at(self) -> Event:
        return {"output_index": len(self.output)}

    def _n(self, event: Event) -> Event:
        event["sequence_number"] = self.seq
        self.seq += 1
        return event

    def _response(self, output: list[Event], status: str, use: Event | None) -> Event:
        return shell(self.req, self.shapes.model, self.created, self.max_tokens,
                     output, status, use)
