"""`/v1/chat/completions`: messages → the tokenizer's chat template → engine requests, and
vLLM 0.33.0's response and SSE chunk shapes (`vllm/entrypoints/openai/chat_completion/`).

Messages are rendered by the tokenizer's own template (`Tokenizer.apply_chat_template`):
content given as parts is joined (text parts, one per line); an assistant message's tool calls
are written after its content as `{"name": …, "parameters": …}` JSON, as Llama 3.1's template
writes them. `tools` and `tool_choice` are served by `server.http.tools` (the grammar writes
schema-valid calls); `logprobs` / `top_logprobs` by `server.frontend.logprobs`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from server.engine.intake import Limits
from server.engine.interface import EngineRequest, TokenChunk
from server.engine.tokenizer import Tokenizer
from server.frontend.logprobs import Logprobs, chat_logprobs, prompt_logprobs
from server.http import lengths, sampling, tools
from server.http.completions import stop_reason, weight_versions
from server.http.errors import bad_request
from server.http.generate import Choice, Run
from server.http.parser_metrics import Recorder
from server.http.per_request_metrics import per_request_metrics
from server.http.protocol import ChatCompletionRequest, ChatMessage, passed_on


def _content(m: ChatMessage) -> str:
    c = m.content
    if c is None:
        text = ""
    elif isinstance(c, str):
        text = c
    else:
        text = "\n".join(p.get("text", "") for p in c
                         if isinstance(p, dict) and p.get("type", "text") == "text")
    for call in m.tool_calls or ():
        fn = call.get("function", {}) if isinstance(call, dict) else {}
        args = fn.get("arguments", "{}")
        try:
            params = json.loads(args) if isinstance(args, str) else args
        except ValueError:
            params = args
        text += json.dumps({"name": fn.get("name", ""), "parameters": params})
    return text


def message_text(messages: list[ChatMessage]) -> str:
    """The messages' contents (what max_prompt_bytes counts for a chat request)."""
    return "".join(_content(m) for m in messages)


def render(messages: list[ChatMessage], tok: Tokenizer, add_generation_prompt: bool,
           continue_final_message: bool = False,
           encode: Callable[[str], list[int]] | None = None) -> list[int]:
    """The prompt's token ids, through the tokenizer's chat template."""
    if add_generation_prompt and continue_final_message:
        raise bad_request("Cannot set both `continue_final_message` and "
                          "`add_generation_prompt` to True.", "continue_final_message")
    plain = [{"role": m.role, "content": _content(m)} for m in messages]
    text = tok.apply_chat_template(plain, add_generation_prompt)
    if continue_final_message:
        text = text.removesuffix(tok.eos_token)
    return (encode or tok.encode)(text)


def engine_request(req: ChatCompletionRequest, request_id: str, ids: list[int],
                   plan: tools.ToolPlan, limits: Limits) -> tuple[EngineRequest, int]:
    """The engine request and n; its budget is clamped to the deployment's context
    (`lengths`), its logprobs to its --max-logprobs."""
    max_tokens = req.max_tokens if req.max_completion_tokens is None \
        else req.max_completion_tokens
    n = sampling.check_common(req, max_tokens)
    max_tokens = lengths.output_budget(max_tokens, len(ids), limits.max_model_len,
                                       req.min_tokens)
    top = sampling.check_logprobs(req.top_logprobs, "top_logprobs", limits.max_logprobs)
    sampling.check_prompt_logprobs(req.prompt_logprobs, limits.max_logprobs)
    if top and not req.logprobs:
        raise bad_request("when using `top_logprobs`, `logprobs` must be set to true.",
                          "top_logprobs")
    constraint = sampling.constraint(req)
    if plan.constraint is not None:
        if constraint is not None:
            raise bad_request("You can only either use constraints for structured outputs "
                              "or tools, not both.", "tool_choice")
        constraint = plan.constraint
    return EngineRequest(request_id=request_id, prompt_token_ids=tuple(ids),
                         sampling=sampling.sampling_params(req, max_tokens),
                         constraint=constraint, **passed_on(req)), n


def finish_reason(f, plan: tools.ToolPlan, called: bool) -> str | None:
    """vLLM's `resolve_finish_reason`: "tool_calls" when the choice made calls and stopped by
    itself, except for a forced named tool ("stop"); "length" stays visible."""
    if f is None:
        return None
    reason = f.reason.value
    if called and reason == "stop" and plan.mode == "array":
        return "tool_calls"
    return reason


class ChatShapes:
    """Builds one request's response bodies and stream events."""

    def __init__(self, req: ChatCompletionRequest, run: Run, rid: str, model: str,
                 tok: Tokenizer, plan: tools.ToolPlan, prompt: list[int],
                 record_tool: Recorder | None = None, role: str = "assistant",
                 timing: bool = False, spec: bool = False) -> None:
        """`role`: the answer's when the request adds a generation prompt (vLLM's
        --response-role); otherwise its last message's. `timing`: the answer carries its
        `metrics` (vLLM's --enable-per-request-metrics); `spec`: and the engine's
        speculative-decoding tally (a vLLM pod's answer)."""
        self.req, self.run, self.rid, self.model, self.plan = req, run, rid, model, plan
        self.timing, self.spec = timing, spec
        self.record_tool = record_tool  # vLLM's tool parser metric (tool_choice "auto")
        self.prompt = prompt if req.return_token_ids else None  # (vLLM's return_token_ids)
        self.created = int(time.time())
        self.role = role if req.add_generation_prompt else (
            req.messages[-1].role if req.messages else role)
        self.lps = ({c.index: Logprobs(tok, c.seed, bool(req.return_tokens_as_token_ids))
                     for c in run.choices} if req.logprobs else None)
        self.streamers = ({c.index: tools.ToolStreamer(plan) for c in run.choices}
                          if plan.mode != "text" else None)
        self.called = {c.index: False for c in run.choices}
        # the rendered prompt's logprobs (chat template included), at the response's top level
        self.prompt_lp = (prompt_logprobs(Logprobs(tok, 0), prompt, req.prompt_logprobs)
                          if req.prompt_logprobs is not None else None)
        self.usage_each = req.stream_options is not None and req.stream_options.usage_each
        # `echo`: the last message's content first, when it is the answer's role (vLLM)
        last = req.messages[-1] if req.messages else None
        self.echo = (_content(last) if req.echo and last is not None and last.role == self.role
                     else "")

    def _base(self, obj: str) -> dict:
        return {"id": self.rid, "object": obj, "created": self.created, "model": self.model}

    def _logprobs(self, c: Choice, ids, start: int) -> dict | None:
        if self.lps is None:
            return None
        return {"content": chat_logprobs(self.lps[c.index], ids, start,
                                         self.req.top_logprobs or 0)}

    def response(self) -> dict:
        choices = []
        for c in self.run.choices:
            text = "".join(c.text)
            calls = tools.parse_calls(self.plan, text) if self.plan.mode != "text" else []
            if self.record_tool is not None:
                self.record_tool(False, bool(calls))
            # vLLM's ChatMessage.model_dump(): None fields kept but annotations (left out
            # since vLLM 0.34.0), tool_calls only when made
            message = {"role": self.role,
                       "content": self.echo + ("" if self.plan.mode != "text" else text),
                       "refusal": None, "audio": None,
                       "function_call": None, **({"tool_calls": calls} if calls else {}),
                       "reasoning": None}
            choices.append({"index": c.index, "message": message,
                            "logprobs": self._logprobs(c, c.ids, 0),
                            "finish_reason": finish_reason(c.finish, self.plan, bool(calls)),
                            "stop_reason": stop_reason(c.finish),
                            "token_ids": list(c.ids) if self.prompt is not None else None,
                            "routed_experts": None,
                            "weight_versions": weight_versions(c.finish)})
        return {**self._base("chat.completion"), "choices": choices, "service_tier": None,
                "system_fingerprint": None, "usage": self.run.usage_dump(),
                "prompt_logprobs": self.prompt_lp, "prompt_token_ids": self.prompt,
                "prompt_text": None,
                "kv_transfer_params": self.run.kv_transfer_params(),
                "ec_transfer_params": None,
                "metrics": per_request_metrics(self.run, True, self.timing, self.spec)}

    def head(self) -> list[dict]:
        """The role chunk of each choice (with continuous usage stats, its usage: no
        completion tokens yet, as vLLM's first chunk), then with `echo` the echoed content."""
        events = [{**self._base("chat.completion.chunk"), "choices": [{
            "index": c.index, "delta": {"role": self.role, "content": ""}, "logprobs": None,
            "finish_reason": None}], "prompt_token_ids": self.prompt, "prompt_text": None}
            for c in self.run.choices]
        if self.echo:
            events += [{**self._base("chat.completion.chunk"), "choices": [{
                "index": c.index, "delta": {"content": self.echo}, "logprobs": None,
                "finish_reason": None}]} for c in self.run.choices]
        if self.usage_each:
            for event in events:
                c = self.run.choices[event["choices"][0]["index"]]
                p = self.run.prompt_lens[c.prompt]
                event["usage"] = {"prompt_tokens": p, "completion_tokens": 0, "total_tokens": p}
        return events

    def chunks(self, c: Choice, chunk: TokenChunk) -> list[dict]:
        f = chunk.finish
        calls = []
        if self.streamers is None:
            delta: dict = {"content": chunk.text}
        else:
            calls = self.streamers[c.index].feed(chunk.text)
            if calls:
                self.called[c.index] = True
            delta = {"tool_calls": calls} if calls else {}
        if self.record_tool is not None:
            self.record_tool(True, bool(calls))
        lp = self._logprobs(c, chunk.token_ids, chunk.index)
        if not delta and f is None and lp is None:
            return []
        choice = {"index": c.index, "delta": delta, "logprobs": lp,
                  "finish_reason": finish_reason(f, self.plan, self.called[c.index]),
                  "token_ids": list(chunk.token_ids) if self.prompt is not None else None}
        if f is not None:
            choice["stop_reason"] = stop_reason(f)
            choice["weight_versions"] = weight_versions(f)
        event = {**self._base("chat.completion.chunk"), "choices": [choice]}
        if self.usage_each:
            event["usage"] = self.run.choice_usage(c)
        return [event]

    def tail(self) -> list[dict]:
        opts = self.req.stream_options
        if opts is None or not opts.include_usage:
            return []
        last = {**self._base("chat.completion.chunk"), "choices": [], "usage": self.run.usage()}
        if (metrics := per_request_metrics(self.run, False, self.timing, self.spec)) \
                is not None:
            last["metrics"] = metrics  # (on the usage chunk, as vLLM's)
        return [last]
