"""Tool calls through the grammar machinery: the mock model writes the call, constrained by a
JSON schema built from the request's `tools`, so its arguments always validate.

- `tool_choice` named: the output is the function's arguments (its `parameters` schema, an
  empty object schema when it has none); one call, `finish_reason` "stop" (vLLM and OpenAI
  report "stop" for a forced named tool).
- `required`: the output is a JSON array of `{"name": <one of the tools>, "parameters": {…}}`
  (vLLM 0.33.0's schema, `vllm/tool_parsers/utils.py` `_get_json_schema_from_tools`: at least
  one item, at most one when `parallel_tool_calls` is false, `$defs` lifted to the top);
  `finish_reason` "tool_calls".
- `auto`: doppelchip's deterministic rule — a tool is called (as with `required`) when the
  conversation's last message is not a tool result; after a tool result the model answers in
  text. An agent loop therefore calls a tool, gets its result, and ends with text.
- `none` (the default without tools): text.
A call cut short by `max_tokens` keeps `finish_reason` "length" (its arguments may be
incomplete JSON); the message's `content` is "" when tools were called, as vLLM sends it.
"""

from __future__ import annotations

import copy
import json
import uuid
from dataclasses import dataclass, field

from server.engine.interface import Constraint
from server.http.errors import bad_request
from server.http.protocol import ChatCompletionRequest, NamedToolChoice

EMPTY_OBJECT = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class ToolPlan:
    """How one chat request uses its tools: `mode` is "text", "named" or "array"."""

    mode: str
    constraint: Constraint | None = None
    name: str = ""  # the forced function (mode "named")
    auto: bool = False  # tool_choice "auto": where vLLM runs its tool parser (its metric)


def plan(req: ChatCompletionRequest) -> ToolPlan:
    """The request's tool mode and constraint; a 400 for an inconsistent tool_choice."""
    choice = req.tool_choice
    if req.tools is not None and not req.tools and not isinstance(choice, NamedToolChoice):
        return ToolPlan("text")  # an empty array is an omitted one (vLLM 0.34.0, as OpenAI)
    if choice is None:
        choice = "auto" if req.tools else "none"
    if choice == "none":
        return ToolPlan("text")
    if not req.tools:
        raise bad_request("When using `tool_choice`, `tools` must be set.", "tool_choice")
    if isinstance(choice, NamedToolChoice):
        tools = {t.function.name: t for t in req.tools}
        tool = tools.get(choice.function.name)
        if tool is None:
            raise bad_request(f"The tool `{choice.function.name}` specified in `tool_choice` "
                              "does not match any of the specified `tools`", "tool_choice")
        params = tool.function.parameters or EMPTY_OBJECT
        return ToolPlan("named", Constraint("json_schema", json.dumps(params)), tool.function.name)
    auto = choice == "auto"
    if auto and req.messages and req.messages[-1].role == "tool":
        return ToolPlan("text", auto=True)
    return ToolPlan("array", Constraint("json_schema", json.dumps(array_schema(req))), auto=auto)


def array_schema(req: ChatCompletionRequest) -> dict:
    """vLLM's schema for tool_choice "required": an array of calls of the given tools."""
    items, defs = [], {}
    for tool in req.tools or ():
        params = copy.deepcopy(tool.function.parameters) if tool.function.parameters else None
        if params is not None:
            for name, schema in (params.pop("$defs", None) or {}).items():
                if name in defs and defs[name] != schema:
                    raise bad_request(f"Tool definition '{name}' has multiple schemas, which "
                                      "is not supported.", "tools")
                defs[name] = schema
        items.append({"properties": {"name": {"type": "string", "enum": [tool.function.name]},
                                     "parameters": params or EMPTY_OBJECT},
                      "required": ["name", "parameters"]})
    schema: dict = {"type": "array", "minItems": 1, "items": {"type": "object", "anyOf": items}}
    if req.parallel_tool_calls is False:
        schema["maxItems"] = 1
    if defs:
        schema["$defs"] = defs
    return schema


def call_id() -> str:
    return f"chatcmpl-tool-{uuid.uuid4().hex}"


def parse_calls(p: ToolPlan, text: str) -> list[dict]:
    """The tool calls of a finished output (`[]` when it is not a complete call list)."""
    if p.mode == "named":
        if not text.strip():
            return []
        return [{"id": call_id(), "type": "function",
                 "function": {"name": p.name, "arguments": text}}]
    try:
        calls = json.loads(text)
    except ValueError:
        return []
    if not isinstance(calls, list):
        return []
    return [{"id": call_id(), "type": "function",
             "function": {"name": c["name"],
                          "arguments": json.dumps(c["parameters"], ensure_ascii=False)}}
            for c in calls if isinstance(c, dict) and "name" in c and "parameters" in c]


@dataclass
class _Call:
    name: str | None = None
    args: list[str] = field(default_factory=list)
    sent_header: bool = False
    sent_args: int = 0


class ToolStreamer:
    """Turns one choice's streamed text into `tool_calls` deltas as the calls are written.

    Mode "named": the whole output is the arguments. Mode "array": a small scanner follows the
    compact JSON the grammar produces (`[{"name":"…","parameters":{…}},…]`, strings and
    nesting respected) and streams each call's header once its name is known, then its
    arguments text as it arrives."""

    def __init__(self, p: ToolPlan) -> None:
        self.plan = p
        self.calls: list[_Call] = []
        self._depth = 0  # [ and { outside strings, in the call list
        self._state = "start"
        self._key = ""
        self._raw: list[str] = []
        self._vd = 0  # nesting inside the current value
        self._str = self._esc = False
        if p.mode == "named":
            self.calls.append(_Call(p.name))

    def feed(self, text: str) -> list[dict]:
        """The `tool_calls` delta entries for this much more text (may be none)."""
        if self.plan.mode == "named":
            self.calls[0].args.append(text)
        else:
            for c in text:
                self._char(c)
        return self._deltas()

    def _deltas(self) -> list[dict]:
        out = []
        for i, call in enumerate(self.calls):
            if call.name is None:
                continue
            args = "".join(call.args)
            new = args[call.sent_args:]
            if not call.sent_header:
                call.sent_header = True
                out.append({"index": i, "id": call_id(), "type": "function",
                            "function": {"name": call.name, "arguments": new}})
            elif new:
                out.append({"index": i, "function": {"arguments": new}})
            call.sent_args = len(args)
        return out

    def _char(self, c: str) -> None:
        st = self._state
        if st == "value":
            self._value_char(c)
        elif st == "key":
            if self._str:
                if self._esc:
                    self._esc = False
                elif c == "\\":
                    self._esc = True
                elif c == '"':
                    self._str = False
                    self._key = json.loads("".join(self._raw) + '"')
                    return
                self._raw.append(c)
            elif c == '"':
                self._str, self._raw = True, ['"']
            elif c == ":":
                self._state, self._raw, self._vd = "value", [], 0
        elif c == "[" and self._depth == 0:
            self._depth = 1
        elif c == "{" and self._depth == 1:
            self._depth, self._state = 2, "key"
            self.calls.append(_Call())

    def _value_char(self, c: str) -> None:
        call = self.calls[-1]
        if self._str:
            if self._esc:
                self._esc = False
            elif c == "\\":
                self._esc = True
            elif c == '"':
                self._str = False
        elif c == '"':
            self._str = True
        elif c in "{[":
            self._vd += 1
        elif c in "}]" and self._vd:
            self._vd -= 1
        elif c in ",}" and not self._vd:  # the value ended (the call object's punctuation)
            if self._key == "name":
                try:
                    call.name = str(json.loads("".join(self._raw)))
                except ValueError:
                    call.name = "".join(self._raw)
            self._state = "key" if c == "," else "start"
            if c == "}":
                self._depth = 1
            return
        self._raw.append(c)
        if self._key == "parameters":
            call.args.append(c)
