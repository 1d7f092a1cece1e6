"""Logprobs on the vLLM engine gRPC service (`OutputLogProbs`, `InputLogProbs`), so a gateway in
front of a pod (smg) answers `logprobs` / `top_logprobs` / `prompt_logprobs` as the pod's own
HTTP routes do: the same emulated distribution (server/frontend/logprobs.py), so a request
gets the same numbers over either protocol.

As smg-grpc-servicer 0.14.1's `VllmEngineServicer` builds them from vLLM's outputs
(`_build_output_logprobs`, `_build_input_logprobs`, `_build_top_logprobs`):
- `logprobs` k (≥ 0; -1: the whole vocabulary): every output token's logprob and id, and with
  k > 0 its k most likely tokens, the generated one first (vLLM's dict, sliced to k);
- `prompt_logprobs` k: every prompt token's id and logprob, the first one's unset (nothing
  precedes it), with k > 0 each position's top k (the first position's empty);
- a streamed request's chunks carry the logprobs of their own tokens (the gateway
  accumulates), the prompt's on the first chunk; its `complete` repeats its last delta's;
  a request that is not streamed gets them all on its `complete`.
vLLM's checks, in its words: more than `--max-logprobs` allows is "Requested sample logprobs of
N, which is greater than max allowed: M" ("prompt logprobs" for the prompt's).

Why a module of its own: the service (server/vllm_servicer.py) stays a thin loop over the
engine's chunks; the numbers are the front end's rule, the shapes the wire's.
"""

from __future__ import annotations

from collections.abc import Sequence

from smg_grpc_proto import vllm_engine_pb2 as vpb

from server.engine.errors import InvalidRequest
from server.frontend.logprobs import PROMPT, Logprobs, too_many


def asked(sp: vpb.SamplingParams, max_logprobs: int, vocab_size: int
          ) -> tuple[int | None, int | None]:
    """(`logprobs`, `prompt_logprobs`) of a request, -1 resolved to the vocabulary, each None
    when not asked; InvalidRequest past the deployment's `--max-logprobs` (-1: no bound)."""
    out: list[int | None] = []
    for field, what in (("logprobs", "sample"), ("prompt_logprobs", "prompt")):
        if not sp.HasField(field):
            out.append(None)
            continue
        k = getattr(sp, field)
        if k < -1:
            raise InvalidRequest(f"{field} must be non-negative or -1, got {k}.")
        k = vocab_size if k == -1 else k
        allowed = vocab_size if max_logprobs == -1 else max_logprobs
        if refusal := too_many(k, allowed, what):
            raise InvalidRequest(refusal)
        out.append(k)
    return out[0], out[1]


def _top(lp: Logprobs, position: int, token: int, k: int) -> vpb.TopLogProbs:
    top = lp.top(position, token, k)
    return vpb.TopLogProbs(values=[v for _, v in top], token_ids=[t for t, _ in top])


def output(lp: Logprobs, ids: Sequence[int], start: int, k: int) -> vpb.OutputLogProbs | None:
    """Output tokens `ids` at positions `start`…: their logprobs (and top k)."""
    if not ids:
        return None
    msg = vpb.OutputLogProbs()
    for j, t in enumerate(ids):
        msg.token_ids.append(t)
        msg.token_logprobs.append(lp.top(start + j, t, 1)[0][1])
        if k:
            msg.top_logprobs.append(_top(lp, start + j, t, k))
    return msg


def prompt(lp: Logprobs, ids: Sequence[int], k: int) -> vpb.InputLogProbs | None:
    """The prompt's tokens: the first without a logprob (and an empty top), then each one's
    logprob at its own prompt position (and top k)."""
    if not ids:
        return None
    msg = vpb.InputLogProbs()
    for i, t in enumerate(ids):
        entry = vpb.InputTokenLogProb()
        if i:
            entry.value = lp.top(PROMPT + i, t, 1)[0][1]
        msg.token_logprobs.append(entry)
        msg.token_ids.append(t)
        if k:
            msg.top_logprobs.append(_top(lp, PROMPT + i, t, k) if i else vpb.TopLogProbs())
    return msg
