"""`/v1/completions`: prompts → engine requests, and vLLM 0.33.0's response and SSE chunk shapes
(`vllm/entrypoints/openai/completion/serving.py`).

Prompts: a string, a list of strings, token ids or a list of token-id lists; each prompt gets
`n` choices. With `add_special_tokens` (the default) a text prompt starts with BOS, as vLLM's
tokenization of a Llama-3 prompt does. `echo` prepends the prompt's text to each choice.
`logprobs: k` returns the emulated log-probabilities (`server.frontend.logprobs`) of the generated
tokens.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from server.engine.intake import Limits
from server.engine.interface import EngineRequest, TokenChunk
from server.engine.tokenizer import Tokenizer
from server.frontend.logprobs import Logprobs, completion_logprobs, echo_logprobs, prompt_logprobs
from server.http import lengths, sampling
from server.http.errors import bad_request, vllm_invalid
from server.http.generate import Choice, Run
from server.http.per_request_metrics import per_request_metrics
from server.http.protocol import CompletionRequest, passed_on


def prompt_ids(req: CompletionRequest, tok: Tokenizer,
               encode: Callable[[str], list[int]] | None = None) -> list[list[int]]:
    """Each prompt's token ids (a 400 for an empty prompt list); `encode`: the tokenizer's
    (`encode_unlocked` in a thread)."""
    encode = encode or tok.encode
    p = req.prompt
    if isinstance(p, str):
        texts: Sequence[str | list[int]] = [p]
    elif not p:  # vLLM's renderer: `prompt_to_seq([])` gives no prompt at all
        raise vllm_invalid("You must pass at least one prompt", "prompt")
    elif all(isinstance(x, int) for x in p):
        texts = [list(p)]  # type: ignore[arg-type]
    else:
        texts = list(p)  # type: ignore[arg-type]
    out = []
    for t in texts:
        if isinstance(t, str):
            ids = encode(t)
            if req.add_special_tokens and ids:
                ids = [tok.bos_token_id, *ids]
            out.append(ids)
        elif not t:  # vLLM's input processor: a token prompt of no token
            raise vllm_invalid("The decoder prompt cannot be empty")
        else:
            out.append(list(t))
    return out


def prompt_texts(req: CompletionRequest) -> list[str]:
    """The text prompts of a request (what max_prompt_bytes counts)."""
    p = req.prompt
    return [p] if isinstance(p, str) else [t for t in p or () if isinstance(t, str)]


def echo_only(req: CompletionRequest) -> bool:
    """`echo` with `max_tokens: 0`: the answer is the prompt alone (lm-eval's log-likelihood
    requests); one token is generated and not shown, as vLLM's `echo_without_generation`."""
    return bool(req.echo) and req.max_tokens == 0


def engine_requests(req: CompletionRequest, request_id: str, prompts: list[list[int]],
                    limits: Limits) -> tuple[list[EngineRequest], int]:
    """One engine request per prompt (the n choices are fanned out later) and n; each one's
    budget clamped to the context (`lengths.output_budget`)."""
    asked = 1 if echo_only(req) else req.max_tokens
    n = sampling.check_common(req, asked)
    sampling.check_logprobs(req.logprobs, "logprobs", limits.max_logprobs)
    sampling.check_prompt_logprobs(req.prompt_logprobs, limits.max_logprobs)
    if req.suffix is not None:
        raise bad_request("suffix is not currently supported", "suffix")
    constraint = sampling.constraint(req)
    out = []
    for i, ids in enumerate(prompts):
        rid = request_id if len(prompts) == 1 else f"{request_id}_{i}"
        budget = lengths.output_budget(asked, len(ids), limits.max_model_len, req.min_tokens)
        sp = sampling.sampling_params(req, budget)
        out.append(EngineRequest(request_id=rid, prompt_token_ids=tuple(ids), sampling=sp,
                                 constraint=constraint, **passed_on(req)))
    return out, n


class CompletionShapes:
    """Builds one request's response bodies and stream events."""

    def __init__(self, req: CompletionRequest, run: Run, rid: str, model: str,
                 tok: Tokenizer, prompts: list[list[int]], timing: bool = False,
                 spec: bool = False) -> None:
        """`timing`: the answer carries its `metrics` (vLLM's --enable-per-request-metrics);
        `spec`: and the engine's speculative-decoding tally (a vLLM pod's answer)."""
        self.req, self.run, self.rid, self.model, self.tok = req, run, rid, model, tok
        self.timing, self.spec = timing, spec
        self.created = int(time.time())
        # echo: a text prompt's text; a token-id prompt decoded as vLLM's renderer decodes it
        # (`tokenizer.decode`: special tokens written out, BOS included)
        self.echo = [tok.decode(p) if isinstance(req.prompt, str) or isinstance(req.prompt[i], str)
                     else tok.decode_with_special(p) for i, p in enumerate(prompts)
                     ] if req.echo else None
        ids_only = bool(req.return_tokens_as_token_ids)
        self.lps = ({c.index: Logprobs(tok, c.seed, ids_only) for c in run.choices}
                    if req.logprobs is not None else None)
        # the prompt's logprobs (vLLM: `prompt_logprobs`, or `logprobs` with `echo`) depend on
        # the prompt alone; with echo the completions logprobs begin with them
        k = sampling.prompt_logprobs_asked(req)
        self.prompt_lp = [prompt_logprobs(Logprobs(tok, 0), p, k) for p in prompts
                          ] if k is not None else None
        self.heads = [echo_logprobs(Logprobs(tok, 0, ids_only), p, req.logprobs or 0)
                      for p in prompts
                      ] if req.echo and req.logprobs is not None else None
        self.offsets = {c.index: _end(self.heads[c.prompt]) if self.heads else
                        len(self.echo[c.prompt]) if self.echo else 0 for c in run.choices}
        self.usage_each = req.stream_options is not None and req.stream_options.usage_each
        self.hidden = echo_only(req)  # the one generated token is not shown
        self.prompts = prompts if req.return_token_ids else None  # (vLLM's return_token_ids)

    def _base(self) -> dict:
        return {"id": self.rid, "object": "text_completion", "created": self.created,
                "model": self.model}

    def _logprobs(self, c: Choice, ids: Sequence[int], start: int) -> dict | None:
        if self.lps is None:
            return None
        out = completion_logprobs(self.lps[c.index], ids, start, self.req.logprobs or 0,
                                  self.offsets[c.index])
        if out["tokens"]:
            self.offsets[c.index] = _end(out)
        if self.heads and start == 0:  # echo: the prompt's positions come first
            out = {key: self.heads[c.prompt][key] + out[key] for key in out}
        return out

    def response(self) -> dict:
        choices = []
        for c in self.run.choices:
            text = "" if self.hidden else "".join(c.text)
            if self.echo:
                text = self.echo[c.prompt] + text
            f, ids = c.finish, [] if self.hidden else c.ids
            back = self.prompts  # the token ids asked for back (return_token_ids)
            choices.append({"index": c.index, "text": text,
                            "logprobs": self._logprobs(c, ids, 0),
                            "finish_reason": f.reason.value if f else None,
                            "stop_reason": stop_reason(f),
                            "token_ids": list(ids) if back else None,
                            "prompt_logprobs": self.prompt_lp[c.prompt] if self.prompt_lp
                            else None,
                            "prompt_token_ids": back[c.prompt] if back else None,
                            "routed_experts": None,
                            "weight_versions": weight_versions(f)})
        # vLLM's CompletionResponse.model_dump(): every field, None included
        return {**self._base(), "choices": choices, "service_tier": None,
                "system_fingerprint": None, "usage": self.run.usage_dump(),
                "kv_transfer_params": self.run.kv_transfer_params(),
                "ec_transfer_params": None,
                "metrics": per_request_metrics(self.run, True, self.timing, self.spec)}

    def chunks(self, c: Choice, chunk: TokenChunk) -> list[dict]:
        text, ids = ("", []) if self.hidden else (chunk.text, chunk.token_ids)
        if self.echo and chunk.index == 0:
            text = self.echo[c.prompt] + text
        f, back = chunk.finish, self.prompts
        # the fields vLLM's stream choice sets (None too: it dumps with exclude_unset)
        event = {**self._base(), "choices": [{
            "index": c.index, "text": text,
            "logprobs": self._logprobs(c, ids, chunk.index),
            "finish_reason": f.reason.value if f else None, "stop_reason": stop_reason(f),
            "prompt_token_ids": back[c.prompt] if back and chunk.index == 0 else None,
            "token_ids": list(ids) if back else None,
            "weight_versions": weight_versions(f)}]}
        if self.usage_each:
            event["usage"] = self.run.choice_usage(c)
        return [event]

    def tail(self) -> list[dict]:
        opts = self.req.stream_options
        if opts is None or not opts.include_usage:
            return []
        last = {**self._base(), "choices": [], "usage": self.run.usage()}
        if (metrics := per_request_metrics(self.run, False, self.timing, self.spec)) \
                is not None:
            last["metrics"] = metrics  # (on the usage chunk, as vLLM's)
        return [last]


def _end(lps: dict) -> int:
    """Where the text after a logprobs object's tokens starts (its `text_offset`s' end)."""
    return lps["text_offset"][-1] + len(lps["tokens"][-1]) if lps["tokens"] else 0


def weight_versions(f) -> list[dict] | None:
    """vLLM's `weight_versions` of a finished choice that asked for them (its WeightVersionSpan
    list: which weight version sampled output tokens [start, end)); None otherwise."""
    if f is None or f.weight_versions is None:
        return None
    return [{"version": v, "start": s, "end": e} for v, s, e in f.weight_versions]


def stop_reason(f) -> str | int | None:
    """vLLM's `stop_reason`: the stop string or stop token id that ended the choice."""
    if f is None:
        return None
    return f.stop_str if f.stop_str is not None else f.stop_token_id
