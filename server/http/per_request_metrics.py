"""vLLM's `--enable-per-request-metrics`: an answer's `metrics`, its own timings, from the
emulated timeline (`build_per_request_timing_metrics` in vLLM 0.34.0's
`vllm/entrypoints/generate/base/serving.py`, followed, not copied).

Why it exists: a client that wants one request's queue time, TTFT and inter-token latency
without scraping `/metrics` asks the pod, and on doppelchip the numbers are the emulated
chip's, not the host's. vLLM computes them from the request's engine timestamps (queued,
first scheduled, first and last token):

- `time_to_first_token_ms`: first scheduled -> first token (vLLM's field counts no queueing;
  the `vllm:time_to_first_token_seconds` histogram does);
- `generation_time_ms`: first -> last token; `queue_time_ms`: queued -> first scheduled;
- `mean_itl_ms`: the generation time over the tokens after the first (more than one token);
- `tokens_per_second`: the tokens over first scheduled -> last token.

Only an answer to one prompt with n = 1 gets them (vLLM: timings of several sequences cannot be
attributed to the request); the non-streamed answer writes every field (None included, as
`model_dump()`), the last usage chunk of a stream leaves the None ones out.

`speculative_decoding` is vLLM's `--per-request-spec-decode-metrics` (independent of this flag:
either one gives the answer its `metrics`): the acceptance tally the engine sent with the
request's finish (server/engine/spec_metrics.py).
"""

from __future__ import annotations

from typing import Any

from server.http.generate import Run


def per_request_metrics(run: Run, dump: bool, timing: bool, spec: bool = True
                        ) -> dict[str, Any] | None:
    """The run's `metrics`: its timings when `timing` (`--enable-per-request-metrics`), its
    `speculative_decoding` when `spec` and the engine sent one; None when it is not one
    prompt with n = 1 or there is neither. `dump`: every field, as a non-streamed answer
    writes them; otherwise the None ones are left out."""
    if len(run.prompt_lens) != 1 or run.n != 1 or not run.choices:
        return None
    choice = run.choices[0]
    tally = choice.finish.spec_decode_metrics if spec and choice.finish is not None else None
    if not timing and tally is None:
        return None
    out: dict[str, Any] = dict.fromkeys(("time_to_first_token_ms", "generation_time_ms",
                                         "queue_time_ms", "mean_itl_ms", "tokens_per_second"))
    if timing and choice.finish is not None:
        tokens = len(choice.ids)
        t = choice.finish.timings
        out["queue_time_ms"] = t.queue_s * 1000
        if tokens:  # the timestamps of a first and a last token exist
            out["time_to_first_token_ms"] = t.prefill_s * 1000
            out["generation_time_ms"] = t.decode_s * 1000
            if tokens > 1:
                out["mean_itl_ms"] = t.decode_s / (tokens - 1) * 1000
            inference = t.prefill_s + t.decode_s
            if inference > 0:
                out["tokens_per_second"] = tokens / inference
    out["speculative_decoding"] = tally.to_dict() if tally is not None else None
    return out if dump else _without_none(out)


def _without_none(value: Any) -> Any:
    """`exclude_none`, as vLLM's stream chunks are written: at every depth."""
    if isinstance(value, dict):
        return {k: _without_none(v) for k, v in value.items() if v is not None}
    return value
