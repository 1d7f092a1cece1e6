"""`/score` and `/rerank` of a classifier of one label: vLLM 0.33.0's cross-encoder scoring
(`CrossEncoderIOProcessor` in `vllm/entrypoints/pooling/scoring/io_processor.py`).

Each (query, document) pair is one prompt, pooled on the deployment as one engine request:
1. the query and the document are cut to `max_tokens_per_query` / `max_tokens_per_doc` tokens
   (vLLM's `truncate_text_to_tokens`: the first N tokens, decoded back to text);
2. the pair is rendered through the deployment's `--chat-template` (`server.engine.
   score_template`: messages `query` and `document`, the request's `chat_template_kwargs` with
   its `instruction`); without one, a native cross-encoder (BERT, XLM-RoBERTa: vLLM's
   `use_sep_token`, true by default) tokenizes the two as a pair with the tokenizer's
   separators (`Tokenizer.encode_pair`), and a model converted from a language model takes
   the two texts back to back (`use_sep_token` false, `as_seq_cls_model`'s default);
3. the prompt is tokenized with the special tokens, truncated and checked as any pooling
   prompt;
4. the pair's score is the classifier's probability (`classified.pair_logit` through the
   sigmoid; the logit with `use_activation` false).
Every pair of one call shares the rendered text before its document, so a deployment with the
prefix cache computes the template and the query once (what makes reranking N documents cheap
on a converted language model; an encoder keeps no KV cache and computes every pair whole).
"""

from __future__ import annotations

import numpy as np
from starlette.requests import Request

from server.engine.score_template import render
from server.frontend.classified import activated, pair_logit
from server.frontend.deployment import DeploymentClient
from server.frontend.pooled import text_vector
from server.http import pooling
from server.http.errors import vllm_invalid
from server.http.pooling_protocol import ScoringFields
from server.http.prompts import check_texts
from server.http.state import HttpState


def _cut(text: str, cap: int, state: HttpState) -> str:
    """vLLM's `truncate_text_to_tokens` (0: no cap)."""
    if not cap:
        return text
    tok = state.tokenizer
    ids = tok.encode(text)
    return text if len(ids) <= cap else tok.decode(ids[:cap])


def _kwargs(body: ScoringFields) -> dict:
    """The template's keyword arguments: `chat_template_kwargs`, with `instruction` unless
    they give one (vLLM's `_merge_instruction_into_kwargs`)."""
    kwargs = dict(body.chat_template_kwargs or {})
    if body.instruction is not None:
        kwargs.setdefault("instruction", body.instruction)
    return kwargs


async def cross_scores(state: HttpState, request: Request, body: ScoringFields,
                       client: DeploymentClient, name: str, queries: list[str],
                       docs: list[str], caps: tuple[int, int], rid: str, response_id: str
                       ) -> tuple[list[float], int]:
    """(each pair's score, the prompt tokens pooled); HttpError when a pair cannot be run."""
    queries = [_cut(q, caps[0], state) for q in queries]  # (before a lone query is repeated)
    docs = [_cut(d, caps[1], state) for d in docs]
    if len(queries) == 1:
        queries = queries * len(docs)
    template, kwargs = client.info.chat_template, _kwargs(body)
    pairs = zip(queries, docs, strict=True)
    prompts: list[str | list[int]]
    try:
        if template:
            prompts = [render(template, q, d, kwargs) for q, d in pairs]
        elif client.limits.use_sep_token:  # (the texts' size checked before they are encoded)
            check_texts([*queries, *docs], client.limits)
            prompts = [state.tokenizer.encode_pair(q, d) for q, d in pairs]
        else:
            prompts = [q + d for q, d in pairs]
    except ValueError as e:
        raise vllm_invalid(str(e)) from None
    ids = await pooling.prompt_ids(prompts, client, state, True, body.truncate_prompt_tokens,
                                   body.truncation_side)
    params = pooling.check_params(client, name, "classify", None, body.use_activation)
    await pooling.run(request, client, rid, response_id, ids, params, body.priority)
    tok, limits = state.tokenizer, client.limits
    vectors = {t: text_vector(tok.encode(t), limits.embedding_size, tok.special_token_ids)
               for t in {*queries, *docs}}  # (a query shared by N documents: made once)
    scores = [activated(np.array([pair_logit(vectors[q], vectors[d])]), params.use_activation,
                        limits.logit_mean, limits.logit_sigma)[0]
              for q, d in zip(queries, docs, strict=True)]
    return scores, sum(map(len, ids))
