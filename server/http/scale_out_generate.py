"""`/inference/v1/generate` (vLLM 0.33.0's token-in/token-out route,
vllm/entrypoints/scale_out/token_in_token_out/serving.py): a `GenerateRequest` run as the
completions request over its token ids that it is (`completion_body`), and its answer in vLLM's
shapes (`GenerateShapes`): `GenerateTokensResponse` — token ids, logprobs by token id — or,
with `output_mode: "text"`, `GenerateTextResponse` (the text too, chat-style logprobs); JSON,
or SSE chunks of the new token ids with a usage chunk at the end (`stream_options`) and
`data: [DONE]`.

Logprobs are doppelchip's emulated ones (server/http/logprobs.py): the sampled token is
always the most likely (rank 1), so the candidates listed are the top `logprobs` (at least
the sampled one), as vLLM lists the sampled token then its top k.
"""

from __future__ import annotations

from server.engine.interface import TokenChunk
from server.engine.tokenizer import Tokenizer
from server.frontend.logprobs import Logprobs, chat_logprobs, prompt_logprobs
from server.http.completions import stop_reason, weight_versions
from server.http.generate import Choice, Run
from server.http.per_request_metrics import per_request_metrics
from server.http.protocol import CompletionRequest
from server.http.scale_out_protocol import GenerateRequest


def completion_body(body: GenerateRequest) -> CompletionRequest:
    """The completions request the token ids and sampling parameters are: the same checks,
    the same engine request. `max_tokens` left out of `sampling_params` means "to the end of
    the context", as vLLM defaults it server-side."""
    sp = body.sampling_params
    data = {
        "model": body.model, "prompt": body.token_ids, "n": sp.n,
        "temperature": sp.temperature, "top_p": sp.top_p, "top_k": sp.top_k,
        "min_p": sp.min_p, "seed": sp.seed, "stop": sp.stop,
        "stop_token_ids": sp.stop_token_ids, "ignore_eos": sp.ignore_eos,
        "max_tokens": sp.max_tokens if "max_tokens" in sp.model_fields_set else None,
        "min_tokens": sp.min_tokens, "logprobs": sp.logprobs,
        "prompt_logprobs": sp.prompt_logprobs, "presence_penalty": sp.presence_penalty,
        "frequency_penalty": sp.frequency_penalty,
        "repetition_penalty": sp.repetition_penalty,
        "skip_special_tokens": sp.skip_special_tokens,
        "include_stop_str_in_output": sp.include_stop_str_in_output,
        "stream": bool(body.stream), "priority": body.priority,
        "kv_transfer_params": body.kv_transfer_params, "cache_salt": body.cache_salt,
        "return_weight_versions": True,  # vLLM's generate always answers them
    }
    mode = (sp.extra_args or {}).get("kv_cache_report_mode")
    if isinstance(mode, str):  # the engine reads it from extra_args, as vLLM's Request does
        data["vllm_xargs"] = {"kv_cache_report_mode": mode}
    if sp.structured_outputs is not None:
        data["structured_outputs"] = sp.structured_outputs
    if body.stream and body.stream_options is not None:
        data["stream_options"] = body.stream_options
    return CompletionRequest.model_validate(data)


class GenerateShapes:
    """Builds one generate request's response body and stream events."""

    def __init__(self, body: GenerateRequest, run: Run, rid: str, model: str,
                 tok: Tokenizer, prompt: list[int], created: int) -> None:
        self.run, self.rid, self.model, self.created = run, rid, model, created
        self.text = body.output_mode == "text"
        self.k = body.sampling_params.logprobs
        self.lps = ({c.index: Logprobs(tok, c.seed) for c in run.choices}
                    if self.k is not None else None)
        self.prompt = prompt if body.return_token_ids else None
        k = body.sampling_params.prompt_logprobs
        self.prompt_lp = prompt_logprobs(Logprobs(tok, 0), prompt, k) if k is not None \
            else None
        opts = body.stream_options
        self.include_usage = bool(opts and opts.include_usage)
        self.usage_each = bool(opts and opts.usage_each)
        self.first = True

    def _logprobs(self, c: Choice, ids, start: int) -> dict | None:
        if self.lps is None:
            return None
        lp, k = self.lps[c.index], self.k or 0
        if self.text:  # vLLM's ChatCompletionLogProbs
            return {"content": chat_logprobs(lp, ids, start, k)}
        content = []
        for j, token in enumerate(ids):
            top = lp.top(start + j, token, max(k, 1))
            content.append({"token_id": token, "logprob": top[0][1], "rank": 1,
                            "top_logprobs": [{"token_id": t, "logprob": v, "rank": r + 1}
                                             for r, (t, v) in enumerate(top)]})
        return {"content": content}

    def _choice(self, c: Choice, ids, text: str, start: int, finish) -> dict:
        out = {"index": c.index, "finish_reason": finish, "stop_reason": stop_reason(c.finish)
               if finish is not None else None, "token_ids": list(ids),
               "routed_experts": None, "sampling_mask": None,
               "weight_versions": weight_versions(c.finish) if finish is not None else None}
        if self.text:
            out["text"] = text
        out["logprobs"] = self._logprobs(c, ids, start)
        return out

    def response(self) -> dict:
        choices = [self._choice(c, c.ids, "".join(c.text), 0,
                                c.finish.reason.value if c.finish is not None else "stop")
                   for c in self.run.choices]
        return {"request_id": self.rid, "model": self.model, "created": self.created,
                "usage": self.run.usage_dump(), "prompt_logprobs": self.prompt_lp,
                "prompt_token_id_logprobs": None, "prompt_token_ids": self.prompt,
                "mm_placeholders": None, "metrics": self._metrics(dump=True),
                "kv_transfer_params": self.run.kv_transfer_params(),
                "ec_transfer_params": None,
                "output_mode": "text" if self.text else "tokens", "choices": choices}

    def chunks(self, c: Choice, chunk: TokenChunk) -> list[dict]:
        f = chunk.finish
        if not (chunk.token_ids or f is not None or (self.text and chunk.text)):
            return []
        event: dict = {"request_id": self.rid,
                       "usage": self.run.choice_usage(c) if self.usage_each else None}
        if self.first and self.prompt is not None:
            event["prompt_token_ids"] = self.prompt
        self.first = False
        event["output_mode"] = "text" if self.text else "tokens"
        event["choices"] = [self._choice(c, chunk.token_ids, chunk.text, chunk.index,
                                         f.reason.value if f is not None else None)]
        return [event]

    def tail(self) -> list[dict]:
        if not self.include_usage:
            return []
        last = {"request_id": self.rid, "usage": self.run.usage(),
                "output_mode": "text" if self.text else "tokens", "choices": []}
        if (metrics := self._metrics(dump=False)) is not None:
            last["metrics"] = metrics
        return [last]

    def _metrics(self, dump: bool) -> dict | None:
        """vLLM 0.34.0's: only `speculative_decoding` (--per-request-spec-decode-metrics),
        for n = 1; never the timings."""
        return per_request_metrics(self.run, dump, timing=False)
