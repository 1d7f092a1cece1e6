"""A TensorRT-LLM pod's gRPC service (`trtllm.TrtllmService`, what `trtllm-serve --grpc`
serves) over real gRPC, without the gateway: the shapes smg reads (chunks with deltas and
cumulative counts, one complete per sequence with all its ids, `sequence_index`), TensorRT-LLM's
limits and refusals, the management calls, and every request freed however it ends."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator

import grpc
import pytest
from engine_service_checks import (
    Wire,
    check_cancelled_stream,
    check_health_and_tokenizer,
    check_owned_abort,
    check_storm,
    released,
)
from server_proc import ServerProcess
from smg_grpc_proto import trtllm_service_pb2 as tpb
from smg_grpc_proto import trtllm_service_pb2_grpc as tpb_grpc

from server.engine.tokenizer import get_tokenizer
from server.trtllm_servicer import SERVICE_NAME

TOK = get_tokenizer()
CTX = 512
POD = ("--chip", "h100-sxm", "--engine", "tensorrt-llm", "--model", "llama-3.1-8b", "--quant",
       "bf16", "--max-model-len", str(CTX), "--grpc-api", "trtllm")
IDS = TOK.encode("hello world, the executor speaks")


@pytest.fixture(scope="module")
def pod():
    with ServerProcess(None, *POD, "--time-scale", "0.05") as s:
        yield s


@pytest.fixture(scope="module")
def slow_pod():
    """Real time, one request running at a time: a stream is still running when its Abort
    comes."""
    with ServerProcess(None, *POD, "--time-scale", "1", "--max-num-seqs", "1") as s:
        yield s


@pytest.fixture
async def stub(pod) -> AsyncIterator[tpb_grpc.TrtllmServiceStub]:
    async with grpc.aio.insecure_channel(pod.target) as channel:
        yield tpb_grpc.TrtllmServiceStub(channel)


def gen(ids=IDS, rid: str = "", streaming: bool = True, max_tokens: int = 16, k: int | None = None,
        **sampling) -> tpb.GenerateRequest:
    sampling.setdefault("temperature", 1.0)
    fields = {key: sampling.pop(key) for key in ("stop", "stop_token_ids", "ignore_eos",
                                                 "guided_decoding") if key in sampling}
    return tpb.GenerateRequest(
        request_id=rid, tokenized=tpb.TokenizedInput(input_token_ids=ids), max_tokens=max_tokens,
        streaming=streaming, sampling_config=tpb.SamplingConfig(**sampling),
        output_config=tpb.OutputConfig(logprobs=k) if k is not None else None, **fields)


async def responses(stub, request) -> list[tpb.GenerateResponse]:
    return [r async for r in stub.Generate(request)]


async def test_a_stream_is_chunks_of_new_ids_then_the_complete_with_all(stub, pod):
    call = stub.Generate(gen(rid="t-1", max_tokens=12, ignore_eos=True))
    assert ("x-request-id", "t-1") in tuple(await call.initial_metadata())
    msgs = [m async for m in call]
    assert all(m.request_id == "t-1" for m in msgs)
    kinds = [m.WhichOneof("response") for m in msgs]
    assert kinds[-1] == "complete" and set(kinds[:-1]) == {"chunk"}
    chunks = [m.chunk for m in msgs[:-1]]
    assert all(c.token_ids for c in chunks)  # a chunk only when there are new tokens
    assert [c.completion_tokens for c in chunks] == list(
        itertools.accumulate(len(c.token_ids) for c in chunks))
    assert all(c.prompt_tokens == len(IDS) for c in chunks)
    done = msgs[-1].complete
    assert (done.finish_reason, done.completion_tokens, done.prompt_tokens) == \
        ("length", 12, len(IDS))
    assert list(done.output_token_ids) == [t for c in chunks for t in c.token_ids]  # all ids
    whole = await responses(stub, gen(streaming=False, max_tokens=12, ignore_eos=True))
    assert [m.WhichOneof("response") for m in whole] == ["complete"]
    assert whole[0].complete.output_token_ids == done.output_token_ids
    await released(pod)


async def test_n_sequences_are_told_apart_by_sequence_index(stub, pod):
    msgs = await responses(stub, gen(max_tokens=6, ignore_eos=True, num_return_sequences=2))
    kinds = [m.WhichOneof("response") for m in msgs]
    assert kinds[-2:] == ["complete", "complete"] and "complete" not in kinds[:-2]  # at the end
    done = [m.complete for m in msgs[-2:]]
    assert [d.sequence_index for d in done] == [0, 1]
    for d in done:
        ids = [t for m in msgs if m.HasField("chunk") and m.chunk.sequence_index ==
               d.sequence_index for t in m.chunk.token_ids]
        assert ids == list(d.output_token_ids) and len(ids) == 6
    assert done[0].output_token_ids != done[1].output_token_ids  # seeds 0 and 1
    whole = await responses(stub, gen(streaming=False, max_tokens=6, ignore_eos=True,
                                      num_return_sequences=3))
    assert [m.complete.sequence_index for m in whole] == [0, 1, 2]
    await released(pod)


async def test_stops_report_what_matched_and_eos_matches_nothing(stub):
    full = (await responses(stub, gen(streaming=False, ignore_eos=True)))[0].complete
    out = list(full.output_token_ids)
    stopped = (await responses(stub, gen(streaming=False, ignore_eos=True,
                                         stop_token_ids=[out[4]])))[0].complete
    assert (stopped.finish_reason, stopped.matched_token_id) == ("stop", out[4])
    assert stopped.completion_tokens == out.index(out[4]) + 1
    word = TOK.decode(out[5:6]).strip() or TOK.decode(out[5:7])
    by_str = (await responses(stub, gen(streaming=False, ignore_eos=True,
                                        stop=[word])))[0].complete
    assert (by_str.finish_reason, by_str.WhichOneof("matched_stop"), by_str.matched_stop_str) \
        == ("stop", "matched_stop_str", word)
    # 16 seeds: the mock model's end of sequence (mean length 128) ends some before 400
    runs = await asyncio.gather(*(responses(stub, gen(streaming=False, max_tokens=400, seed=s))
                                  for s in range(16)))
    ends = [(r[0].complete.finish_reason, r[0].complete.WhichOneof("matched_stop"))
            for r in runs]
    assert ("stop", None) in ends  # END_ID: a stop that matched nothing
    assert set(ends) <= {("stop", None), ("length", None)}


async def test_logprobs_streamed_equal_logprobs_whole(stub):
    whole = (await responses(stub, gen(streaming=False, max_tokens=5, ignore_eos=True,
                                       k=3)))[0].complete
    assert [lp.token_id for lp in whole.logprobs] == list(whole.output_token_ids)
    assert all(lp.logprob <= 0 and len(lp.top_logprobs) == 3
               and (lp.top_logprobs[0].token_id, lp.top_logprobs[0].logprob) ==
               (lp.token_id, lp.logprob) for lp in whole.logprobs)
    streamed = [lp for m in await responses(stub, gen(max_tokens=5, ignore_eos=True, k=3))
                if m.HasField("chunk") for lp in m.chunk.logprobs]
    assert streamed == list(whole.logprobs)
    none = (await responses(stub, gen(streaming=False, max_tokens=5, k=0)))[0].complete
    assert not none.logprobs


async def test_max_tokens_past_max_seq_len_is_clipped_not_refused(stub, pod):
    done = (await responses(stub, gen(streaming=False, ignore_eos=True,
                                      max_tokens=100_000)))[0].complete
    assert (done.completion_tokens, done.finish_reason) == (CTX - len(IDS), "length")
    await released(pod)


@pytest.mark.parametrize("request_, says", [
    (tpb.GenerateRequest(request_id="x", max_tokens=4), "Missing tokenized input"),
    (gen([1] * CTX), f"Prompt length ({CTX}) exceeds maximum input length ({CTX - 1})."),
    (gen(max_tokens=0), "max_tokens must be > 0, got 0"),
    (gen(beam_width=2), "beam search (beam_width > 1) is not emulated"),
    (gen(num_return_sequences=2, top_p=0.0), "Greedy decoding in the LLM API does not allow "
                                             "multiple returns"),
    (gen(num_return_sequences=1000), "n must be in [1, 128]"),
    (gen([]), "prompt is empty"),
    (gen(rid="bad\nid"), "control character"),
    (gen(k=2000), "Requested sample logprobs of 2000, which is greater than max allowed: 20"),
    (gen(guided_decoding=tpb.GuidedDecodingParams(
        guide_type=tpb.GuidedDecodingParams.GUIDE_TYPE_STRUCTURAL_TAG, guide="{}")),
     "structural_tag guided decoding is not supported"),
    (tpb.GenerateRequest(tokenized=tpb.TokenizedInput(input_token_ids=IDS), max_tokens=2,
                         lora_config=tpb.LoraConfig(task_id=3)), "LoRA adapters are not served"),
    (tpb.GenerateRequest(tokenized=tpb.TokenizedInput(input_token_ids=IDS), max_tokens=2,
                         output_config=tpb.OutputConfig(prompt_logprobs=1)),
     "prompt_logprobs are not served"),
    (tpb.GenerateRequest(tokenized=tpb.TokenizedInput(input_token_ids=IDS), max_tokens=2,
                         disaggregated_params=tpb.DisaggregatedParams()),
     "disaggregated serving is not emulated"),
])
async def test_refusals_are_invalid_argument(stub, pod, request_, says):
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await responses(stub, request_)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert says in err.value.details()
    await released(pod)


async def test_guided_decoding_constrains_the_output(stub):
    regex = tpb.GuidedDecodingParams(guide_type=tpb.GuidedDecodingParams.GUIDE_TYPE_REGEX,
                                     guide="(yes|no)")
    done = (await responses(stub, gen(streaming=False, max_tokens=10,
                                      guided_decoding=regex)))[0].complete
    assert TOK.decode(list(done.output_token_ids)).strip(TOK.decode([TOK.eos_token_id])) in \
        ("yes", "no")


async def _healthy(stub) -> bool:
    return (await stub.HealthCheck(tpb.HealthCheckRequest())).status == "OK"


WIRE = Wire(tpb_grpc.TrtllmServiceStub,
            lambda rid, streaming, max_tokens, n: gen(rid=rid, streaming=streaming,
                                                      max_tokens=max_tokens, ignore_eos=True,
                                                      num_return_sequences=n),
            lambda rid: tpb.AbortRequest(request_id=rid),
            lambda m: m.complete.finish_reason if m.HasField("complete") else "",
            "cancelled", _healthy)


async def test_health_model_server_info_and_tokenizer(stub, pod):
    await check_health_and_tokenizer(pod, WIRE, SERVICE_NAME)
    model = await stub.GetModelInfo(tpb.GetModelInfoRequest())
    assert (model.model_id, model.max_seq_len, model.max_input_len, model.vocab_size) == \
        ("llama-3.1-8b", CTX, CTX, TOK.vocab_size)  # max_input_len: min(1024, max_seq_len)
    info = await stub.GetServerInfo(tpb.GetServerInfoRequest())
    assert (info.backend, info.tensor_parallel_size, info.world_size) == ("tensorrt-llm", 1, 1)
    assert info.version.startswith("1.")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Embed(tpb.EmbedRequest(tokenized=tpb.TokenizedInput(input_token_ids=IDS)))
    assert (err.value.code(), err.value.details()) == (grpc.StatusCode.UNIMPLEMENTED,
                                                       "Embed RPC not yet implemented")


async def test_abort_is_owned_and_frees_the_request(slow_pod):
    await check_owned_abort(slow_pod, WIRE)


async def test_a_cancelled_stream_frees_the_request(slow_pod):
    await check_cancelled_stream(slow_pod, WIRE)


async def test_a_cancellation_storm_leaves_the_pool_idle(pod):
    await check_storm(pod, WIRE, seed=11)
