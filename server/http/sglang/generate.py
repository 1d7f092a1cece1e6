"""SGLang's native `/generate` (POST or PUT), answered in SGLang 0.5.23's shapes
(`TokenizerManager._handle_batch_output`, `http_server.generate_request`):

- JSON: `{"text", "output_ids", "meta_info"}` for one prompt, a list of them for a batch (or
  `n` > 1), in choice order;
- SSE (`stream: true`): one `data:` event per engine chunk carrying the text and output ids
  so far (SGLang's default, non-incremental streaming), `index` when the request had several
  outputs, then `data: [DONE]`;
- `meta_info`: `id` (the request's `rid`), `finish_reason` (None until the end, then
  `{"type": "length", "length": N}`, `{"type": "stop", "matched": token id or string}` or
  `{"type": "abort", ...}`), `prompt_tokens`, `weight_version`, `num_retractions` (the
  request's preemptions), `reasoning_tokens`, `completion_tokens`, `cached_tokens`,
  `cached_tokens_details` when some prompt tokens were cached, and `e2e_latency` at the
  finish — on the emulated timeline, as every time this server reports — followed, on a
  speculating pod, by SGLang's `spec_*` counts of the request's verification steps;
- `return_logprob`: `output_token_logprobs` `[[logprob, token id, None], ...]` (and
  `output_top_logprobs` with `top_logprobs_num`), the emulated distribution
  (`server.frontend.logprobs`); `input_token_logprobs` is empty (SGLang's default
  `logprob_start_len` -1).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from server.engine.interface import FinishReason, TokenChunk
from server.frontend.logprobs import Logprobs
from server.http import prompts
from server.http.answering import answer
from server.http.errors import HttpError, draining
from server.http.generate import Choice, Run
from server.http.pod_app import pod_client
from server.http.routes import data_parallel_rank, start_completion
from server.http.sglang.errors import FRAMING, sglang_error
from server.http.sglang.protocol import (
    MAX_NEW_TOKENS,
    GenerateInput,
    check_length,
    completion_body,
    invalid,
    parse,
)
from server.http.state import HttpState


class Shapes:
    """Builds one `/generate` request's answers from its run."""

    def __init__(self, inp: GenerateInput, run: Run, state: HttpState, eos: int) -> None:
        self.inp, self.run, self.eos = inp, run, eos
        self.many = inp.batch or inp.n > 1
        self.lps = ({c.index: Logprobs(state.tokenizer, c.seed) for c in run.choices}
                    if inp.return_logprob else None)
        # each choice's tokens' top logprobs so far: a cumulative stream repeats them all in
        # every event, each computed once
        self.tops: dict[int, list[list[tuple[int, float]]]] = {}

    def _finish_reason(self, c: Choice) -> dict | None:
        f = c.finish
        if f is None:
            return None
        if f.reason is FinishReason.LENGTH:
            return {"type": "length", "length": len(c.ids)}
        if f.reason is FinishReason.STOP:
            matched = f.stop_str if f.stop_str is not None else (
                f.stop_token_id if f.stop_token_id is not None else self.eos)
            return {"type": "stop", "matched": matched}
        status = 400 if f.reason is FinishReason.ABORT else 500
        return {"type": "abort", "message": "Abort in waiting queue" if not c.ids else
                "Aborted", "status_code": status, "err_type": None}

    def meta(self, c: Choice) -> dict:
        f = c.finish
        stream = self.run.streams[c.index]
        cached = f.usage.cached_prompt_tokens if f is not None else stream.cached
        out: dict = {"id": self.inp.rids[c.index], "finish_reason": self._finish_reason(c),
                     "prompt_tokens": self.run.prompt_lens[c.prompt],
                     "weight_version": "default", "num_retractions": stream.preemptions}
        if self.lps is not None:
            lp, k = self.lps[c.index], self.inp.top_logprobs_num
            tops = self.tops.setdefault(c.index, [])
            tops += [lp.top(i, c.ids[i], max(1, k)) for i in range(len(tops), len(c.ids))]
            out["input_token_logprobs"] = []
            out["output_token_logprobs"] = [[top[0][1], t, None]
                                            for t, top in zip(c.ids, tops, strict=True)]
            if k:
                out["input_top_logprobs"] = []
                out["output_top_logprobs"] = [[[v, tid, None] for tid, v in top]
                                              for top in tops]
        out.update({"reasoning_tokens": 0, "completion_tokens": len(c.ids),
                    "cached_tokens": cached})
        if cached:
            out["cached_tokens_details"] = {"device": cached, "host": 0}
        if f is not None:
            out["e2e_latency"] = f.timings.e2e_s
            if f.spec_decode_metrics is not None:  # a speculating pod (doppelchip/sglang_spec)
                out.update(f.spec_decode_metrics.sglang_meta(len(c.ids)))
        return out

    def one(self, c: Choice) -> dict:
        return {"text": "".join(c.text), "output_ids": list(c.ids), "meta_info": self.meta(c)}

    def response(self) -> dict | list[dict]:
        outs = [self.one(c) for c in self.run.choices]
        return outs if self.many else outs[0]

    def chunks(self, c: Choice, chunk: TokenChunk) -> list[dict]:
        if not (chunk.token_ids or chunk.finish is not None):
            return []
        out = self.one(c)
        if self.many:
            out["index"] = c.index
        return [out]


async def generate(state: HttpState, request: Request, body: object) -> Response:
    """One `/generate` request's answer (its refusal in SGLang's shape)."""
    try:
        inp = parse(body)
        if state.draining:
            raise draining()
        client = pod_client(state)
        limits, tok = client.limits, state.tokenizer
        ids = []
        for p in inp.prompts:
            if isinstance(p, str):
                ids.append([tok.bos_token_id, *await prompts.text_prompt(p, tok, limits)])
            elif not p:
                raise invalid("The input_ids is empty")
            else:
                ids.append(p)
        for p in ids:
            check_length(len(p), inp.sampling.get("max_new_tokens", MAX_NEW_TOKENS),
                         limits.max_model_len)
        run, _ = await start_completion(state, client,
                                        completion_body(inp, client.info.model_name, ids),
                                        inp.rids[0], inp.rids[0], data_parallel_rank(request))
    except HttpError as e:
        return sglang_error(e)
    shapes = Shapes(inp, run, state, tok.eos_token_id)
    return await answer(request, run, inp.stream, shapes.response, shapes.chunks, [],
                        list, inp.rids[0], FRAMING)
