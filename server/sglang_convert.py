"""SGLang scheduler wire (`sglang.grpc.scheduler`, from smg-grpc-proto) <-> engine conversions.

Pure functions, as `server/vllm_convert.py` is for vLLM's. The shapes follow smg-grpc-servicer
0.14.1's SGLang servicer (`SGLangSchedulerServicer`, `GrpcRequestManager`), which is what the
smg gateway reads:
- the input is `tokenized` only ("Tokenized input must be provided");
- sampling: proto3 cannot tell an unset scalar from its zero, so top_p 0 means 1, top_k 0
  means -1 and repetition_penalty 0 means 1, as there; temperature is taken as sent (0:
  greedy); unset `max_new_tokens` runs to the scheduler's `max_req_len`, and a larger one is
  clipped to it (`Scheduler.init_req_max_new_tokens`), not refused;
- refusals in SGLang's words: `SamplingParams.verify` (`server/frontend/sglang_pod.py`) and
  the scheduler's input-length check (`validate_input_length`), INVALID_ARGUMENT;
- streaming: one chunk per engine chunk — the new token ids, the cumulative prompt,
  completion and cached counts, `index` for one of n outputs — and at the finish a `complete`
  carrying that last delta; not streaming: one `complete` with every output id;
- `finish_reason` is "stop", "length" or "abort"; a stop's match is `matched_stop_str` or
  `matched_token_id` (the EOS id when the model ended it, as SGLang's FINISH_MATCHED_TOKEN).
"""

from __future__ import annotations

from collections.abc import Sequence

from smg_grpc_proto import sglang_scheduler_pb2 as spb

from server.engine.errors import InvalidRequest
from server.engine.interface import Constraint, EngineRequest, SamplingParams, TokenChunk
from server.frontend.logprobs import too_many
from server.frontend.outputs import Counts, finish_fields
from server.frontend.parallel import MAX_N, child_requests
from server.frontend.sglang_pod import check_sampling

UNLIMITED = 1 << 30  # SGLang's stand-in for an unset max_new_tokens


def sampling_dict(sp: spb.SamplingParams) -> dict:
    """The request's sampling parameters under SGLang's names, unset zeros resolved."""
    return {
        "temperature": sp.temperature, "top_p": sp.top_p if sp.top_p != 0.0 else 1.0,
        "top_k": sp.top_k if sp.top_k != 0 else -1, "min_p": sp.min_p,
        "frequency_penalty": sp.frequency_penalty, "presence_penalty": sp.presence_penalty,
        "repetition_penalty": sp.repetition_penalty if sp.repetition_penalty != 0.0 else 1.0,
        "max_new_tokens": sp.max_new_tokens if sp.HasField("max_new_tokens") else None,
        "min_new_tokens": sp.min_new_tokens, "n": sp.n or 1,
    }


def _constraint(sp: spb.SamplingParams) -> Constraint | None:
    kind = sp.WhichOneof("constraint")
    if kind is None:
        return None
    if kind == "structural_tag":
        raise InvalidRequest("structural_tag constraints are not supported")
    return Constraint({"ebnf_grammar": "grammar"}.get(kind, kind), text=getattr(sp, kind))


def _refuse_unserved(req: spb.GenerateRequest) -> None:
    if req.HasField("mm_inputs") or len(req.input_embeds):
        raise InvalidRequest("multimodal inputs are not supported (text-only model)")
    if req.return_hidden_states:
        raise InvalidRequest("return_hidden_states is not supported (the emulated model has "
                             "no hidden states)")
    if req.lora_id:
        raise InvalidRequest(f"lora_id {req.lora_id!r}: LoRA adapters are not served on an "
                             "SGLang pod")
    if req.HasField("disaggregated_params"):
        raise InvalidRequest("disaggregated_params: SGLang's prefill/decode disaggregation is "
                             "not emulated")
    if len(req.token_ids_logprob):
        raise InvalidRequest("token_ids_logprob is not supported")
    if req.return_logprob and req.logprob_start_len >= 0:
        raise InvalidRequest("input logprobs are not served: send logprob_start_len -1 "
                             "(output logprobs only)")


def to_engine_requests(req: spb.GenerateRequest, rid: str, max_req_len: int,
                       max_req_input_len: int, max_logprobs: int) -> list[EngineRequest]:
    """The engine requests of one GenerateRequest (n of them for `n` > 1: children sharing
    the prompt, `server/frontend/parallel.py`); raises InvalidRequest saying what is wrong.
    `max_logprobs`: the deployment's `--max-logprobs`, which bounds `top_logprobs_num` as it
    bounds the pod's HTTP routes (SGLang sets no bound)."""
    if not req.HasField("tokenized"):
        raise InvalidRequest("Tokenized input must be provided")
    _refuse_unserved(req)
    if req.return_logprob and max_logprobs >= 0 and (
            refusal := too_many(req.top_logprobs_num, max_logprobs)):
        raise InvalidRequest(refusal)
    sp = req.sampling_params
    values = sampling_dict(sp)
    check_sampling(values)
    n = values["n"]
    if n > MAX_N:
        raise InvalidRequest(f"n must be in [1, {MAX_N}], got {n}")
    ids = tuple(req.tokenized.input_ids)
    if not ids:
        raise InvalidRequest("prompt is empty (no input_ids)")
    if len(ids) >= max_req_input_len:
        raise InvalidRequest(
            f"Input length ({len(ids)} tokens) exceeds the maximum allowed length "
            f"({max_req_input_len} tokens). Use a shorter input or enable "
            f"--allow-auto-truncate.")
    asked = values["max_new_tokens"]
    max_new = max(0, min(UNLIMITED if asked is None else asked, max_req_len - len(ids) - 1))
    if max_new == 0:
        raise InvalidRequest("max_new_tokens 0 (a prefill-only request) is not emulated")
    sampling = SamplingParams(
        max_tokens=max_new, min_tokens=min(values["min_new_tokens"], max_new),
        temperature=values["temperature"], top_p=values["top_p"], top_k=values["top_k"],
        min_p=values["min_p"], repetition_penalty=values["repetition_penalty"],
        presence_penalty=values["presence_penalty"],
        frequency_penalty=values["frequency_penalty"], ignore_eos=sp.ignore_eos,
        stop=tuple(sp.stop), stop_token_ids=tuple(sp.stop_token_ids),
        include_stop_str_in_output=sp.no_stop_trim, skip_special_tokens=sp.skip_special_tokens)
    sampling.validate()
    rank = req.data_parallel_rank if req.HasField("data_parallel_rank") else None
    request = EngineRequest(request_id=rid, prompt_token_ids=ids, sampling=sampling,
                            constraint=_constraint(sp), data_parallel_rank=rank,
                            stream=req.stream)
    return child_requests(request, n)


def output_logprobs(tops: list[list[tuple[int, float]]], k: int) -> spb.OutputLogProbs:
    """Each position's emulated top tokens (the generated one first: `server/frontend/
    logprobs.py`) as SGLang's OutputLogProbs; `k` top alternatives per position when asked."""
    return spb.OutputLogProbs(
        token_logprobs=[top[0][1] for top in tops], token_ids=[top[0][0] for top in tops],
        top_logprobs=[spb.TopLogProbs(values=[v for _, v in top[:k]],
                                      token_ids=[t for t, _ in top[:k]])
                      for top in tops] if k else [])


def to_chunk(ids: Sequence[int], counts: Counts, index: int,
             logprobs: spb.OutputLogProbs | None) -> spb.GenerateStreamChunk:
    return spb.GenerateStreamChunk(
        token_ids=ids, prompt_tokens=counts.prompt_tokens,
        completion_tokens=counts.completion_tokens, cached_tokens=counts.cached_tokens,
        output_logprobs=logprobs, index=index)


def to_complete(chunk: TokenChunk, ids: Sequence[int], counts: Counts, index: int, eos: int,
                logprobs: spb.OutputLogProbs | None) -> spb.GenerateComplete:
    """The finish; on a speculating pod with the request's accepted and proposed drafts, as
    smg-grpc-servicer takes them from SGLang's meta_info (`spec_num_correct_drafts`,
    `spec_num_proposed_drafts`)."""
    f = chunk.finish
    spec = (f.spec_decode_metrics.sglang_meta(counts.completion_tokens)
            if f is not None and f.spec_decode_metrics is not None else {})
    return spb.GenerateComplete(
        output_ids=ids, prompt_tokens=counts.prompt_tokens,
        completion_tokens=counts.completion_tokens, cached_tokens=counts.cached_tokens,
        output_logprobs=logprobs, index=index,
        spec_accepted_tokens=spec.get("spec_num_correct_drafts", 0),
        spec_draft_tokens=spec.get("spec_num_proposed_drafts", 0),
        **finish_fields(chunk, eos, "abort"))


def to_scheduler_load(snapshot: dict) -> spb.SchedulerLoad:
    """One rank's LoadSnapshot dict (`sglang_pod.load_snapshot`) as GetLoads carries it,
    its `memory`, `speculative` and `queues` sections when they were included."""
    load = spb.SchedulerLoad(**{key: snapshot[key] for key in (
        "dp_rank", "num_running_reqs", "num_waiting_reqs", "num_used_tokens",
        "max_total_num_tokens", "token_usage", "gen_throughput", "cache_hit_rate",
        "utilization", "max_running_requests", "num_waiting_uncached_tokens")},
        num_total_reqs=snapshot["num_running_reqs"] + snapshot["num_waiting_reqs"])
    if "memory" in snapshot:
        load.memory.CopyFrom(spb.MemoryMetrics(**snapshot["memory"]))
    if "speculative" in snapshot:
        load.speculative.CopyFrom(spb.SpeculativeMetrics(**snapshot["speculative"]))
    if "queues" in snapshot:
        q = snapshot["queues"]
        load.queues.CopyFrom(spb.QueueMetrics(waiting=q["waiting"], grammar=q["grammar"],
                                              paused=q["paused"], retracted=q["retracted"]))
    return load


def aggregate(loads: list[spb.SchedulerLoad]) -> spb.AggregateMetrics:
    """Over the ranks reported, rounded as smg-grpc-servicer rounds them."""
    if not loads:
        return spb.AggregateMetrics()
    n = len(loads)
    running = sum(x.num_running_reqs for x in loads)
    waiting = sum(x.num_waiting_reqs for x in loads)
    return spb.AggregateMetrics(
        total_running_reqs=running, total_waiting_reqs=waiting, total_reqs=running + waiting,
        avg_token_usage=round(sum(x.token_usage for x in loads) / n, 4),
        avg_throughput=round(sum(x.gen_throughput for x in loads) / n, 2),
        avg_utilization=round(sum(x.utilization for x in loads) / n, 4))
