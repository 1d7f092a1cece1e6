"""An SGLang pod's gRPC scheduler service (`sglang.grpc.scheduler.SglangScheduler`, what
smg-grpc-servicer serves for `--smg-grpc-mode`) over real gRPC, without the gateway: the
shapes smg reads (chunks with deltas and cumulative counts, the complete, `index` for n),
SGLang's limits and refusals, the management calls, and every request freed however it ends."""

from __future__ import annotations

import itertools
import re
from collections.abc import AsyncIterator

import grpc
import httpx
import pytest
from engine_service_checks import (
    Wire,
    check_cancelled_stream,
    check_health_and_tokenizer,
    check_owned_abort,
    check_storm,
    released,
)
from server_proc import ServerProcess, metric, until
from smg_grpc_proto import sglang_scheduler_pb2 as spb
from smg_grpc_proto import sglang_scheduler_pb2_grpc as spb_grpc
from smg_grpc_proto.generated import common_pb2

from clients.client import AsyncClient
from server.engine.tokenizer import get_tokenizer
from server.sglang_servicer import SERVICE_NAME

TOK = get_tokenizer()
CTX = 512
POD = ("--chip", "h100-sxm", "--engine", "sglang", "--model", "llama-3.1-8b", "--quant",
       "bf16", "--max-model-len", str(CTX), "--http-api", "sglang")
IDS = TOK.encode("hello world, the scheduler speaks")


@pytest.fixture(scope="module")
def pod():
    with ServerProcess(None, *POD, "--time-scale", "0.05", "--enable-metrics") as s:
        yield s


@pytest.fixture(scope="module")
def slow_pod():
    """Real time, one request running at a time: a stream is still running when its Abort
    comes, and a second request waits."""
    with ServerProcess(None, *POD, "--time-scale", "1", "--max-num-seqs", "1") as s:
        yield s


@pytest.fixture
async def stub(pod) -> AsyncIterator[spb_grpc.SglangSchedulerStub]:
    async with grpc.aio.insecure_channel(pod.target) as channel:
        yield spb_grpc.SglangSchedulerStub(channel)


def gen(ids=IDS, rid: str = "", stream: bool = True, **sampling) -> spb.GenerateRequest:
    sampling.setdefault("temperature", 1.0)
    return spb.GenerateRequest(request_id=rid, tokenized=spb.TokenizedInput(input_ids=ids),
                               sampling_params=spb.SamplingParams(**sampling), stream=stream,
                               logprob_start_len=-1)


async def responses(stub, request) -> list[spb.GenerateResponse]:
    return [r async for r in stub.Generate(request)]


async def test_a_stream_is_chunks_of_new_ids_then_the_complete(stub, pod):
    call = stub.Generate(gen(rid="s-1", max_new_tokens=12, ignore_eos=True))
    assert ("x-request-id", "s-1") in tuple(await call.initial_metadata())
    msgs = [m async for m in call]
    assert all(m.request_id == "s-1" for m in msgs)
    assert [m.WhichOneof("response") for m in msgs][-2:] == ["chunk", "complete"]
    chunks = [m.chunk for m in msgs[:-1]]
    assert [c.completion_tokens for c in chunks] == list(  # cumulative, as SGLang's meta_info
        itertools.accumulate(len(c.token_ids) for c in chunks))
    assert chunks[-1].completion_tokens == 12 and all(c.prompt_tokens == len(IDS)
                                                       for c in chunks)
    done = msgs[-1].complete
    assert (done.finish_reason, done.completion_tokens, done.prompt_tokens) == \
        ("length", 12, len(IDS))
    assert list(done.output_ids) == list(chunks[-1].token_ids)  # the last delta, as SGLang's
    whole = (await responses(stub, gen(stream=False, max_new_tokens=12, ignore_eos=True)))
    assert [m.WhichOneof("response") for m in whole] == ["complete"]
    assert list(whole[0].complete.output_ids) == [t for c in chunks for t in c.token_ids]
    await released(pod)


async def test_n_outputs_are_told_apart_by_index(stub, pod):
    msgs = await responses(stub, gen(max_new_tokens=6, ignore_eos=True, n=2))
    done = {m.complete.index: m.complete for m in msgs if m.HasField("complete")}
    assert sorted(done) == [0, 1]
    for i in (0, 1):
        ids = [t for m in msgs if m.HasField("chunk") and m.chunk.index == i
               for t in m.chunk.token_ids]
        assert len(ids) == 6 and done[i].completion_tokens == 6
    assert [list(d.output_ids) for d in done.values()] != [[]] * 2
    whole = await responses(stub, gen(stream=False, max_new_tokens=6, ignore_eos=True, n=3))
    assert [m.complete.index for m in whole] == [0, 1, 2]  # together, in index order
    outs = [tuple(m.complete.output_ids) for m in whole]
    assert len(set(outs)) == 3 and all(len(o) == 6 for o in outs)  # seeds 0, 1, 2
    await released(pod)


async def test_stops_report_what_matched(stub):
    full = (await responses(stub, gen(stream=False, max_new_tokens=16, ignore_eos=True)))
    out = list(full[0].complete.output_ids)
    stopped = (await responses(stub, gen(stream=False, max_new_tokens=16, ignore_eos=True,
                                         stop_token_ids=[out[4]])))[0].complete
    first = out.index(out[4])
    assert (stopped.finish_reason, stopped.matched_token_id) == ("stop", out[4])
    assert stopped.completion_tokens == first + 1
    word = TOK.decode(out[5:6]).strip() or TOK.decode(out[5:7])
    by_str = (await responses(stub, gen(stream=False, max_new_tokens=16, ignore_eos=True,
                                        stop=[word])))[0].complete
    assert by_str.WhichOneof("matched_stop") == "matched_stop_str"
    assert (by_str.finish_reason, by_str.matched_stop_str) == ("stop", word)


async def test_logprobs_streamed_equal_logprobs_whole(stub):
    def req(stream: bool) -> spb.GenerateRequest:
        r = gen(stream=stream, max_new_tokens=5, ignore_eos=True)
        r.return_logprob, r.top_logprobs_num = True, 3
        return r

    whole = (await responses(stub, req(False)))[0].complete.output_logprobs
    assert list(whole.token_ids) == list(
        (await responses(stub, req(False)))[0].complete.output_ids)
    assert len(whole.token_logprobs) == 5 and all(lp <= 0 for lp in whole.token_logprobs)
    assert all(len(t.values) == 3 and t.token_ids[0] == tid and t.values[0] == lp
               for t, tid, lp in zip(whole.top_logprobs, whole.token_ids,
                                     whole.token_logprobs, strict=True))
    streamed = [m.chunk.output_logprobs for m in await responses(stub, req(True))
                if m.HasField("chunk")]
    assert [v for c in streamed for v in c.token_logprobs] == list(whole.token_logprobs)


async def test_max_new_tokens_runs_to_the_schedulers_limit(stub, pod):
    """Unset, it runs to `max_req_len` (context less one); asked for more, it is clipped
    there, not refused (`Scheduler.init_req_max_new_tokens`)."""
    limit = CTX - 1 - len(IDS) - 1
    for sampling in ({}, {"max_new_tokens": 100_000}):
        done = (await responses(stub, gen(stream=False, ignore_eos=True, **sampling)))
        assert (done[0].complete.completion_tokens, done[0].complete.finish_reason) == \
            (limit, "length")
    await released(pod)


@pytest.mark.parametrize("request_, says", [
    (spb.GenerateRequest(request_id="x"), "Tokenized input must be provided"),
    (gen([1] * (CTX - 6)), f"Input length ({CTX - 6} tokens) exceeds the maximum allowed "
                          f"length ({CTX - 6} tokens). Use a shorter input or enable "
                          "--allow-auto-truncate."),  # max_req_len - 5: (CTX - 1) - 5
    (gen(top_p=3.0), "top_p must be in (0, 1], got 3.0."),
    (gen(temperature=-1.0), "temperature must be a non-negative finite number"),
    (gen(min_new_tokens=9, max_new_tokens=4), "min_new_tokens must be in [0, "
                                              "max_new_tokens(4)], got 9."),
    (gen(structural_tag="{}"), "structural_tag constraints are not supported"),
    (gen(max_new_tokens=0), "prefill-only request"),
    (gen(n=1000), "n must be in [1, 128]"),
    (gen([]), "prompt is empty"),
    (gen(rid="bad\nid"), "control character"),
    (spb.GenerateRequest(tokenized=spb.TokenizedInput(input_ids=IDS), lora_id="sql"),
     "LoRA adapters are not served"),
    (spb.GenerateRequest(tokenized=spb.TokenizedInput(input_ids=IDS), return_logprob=True),
     "logprob_start_len -1"),
    (spb.GenerateRequest(tokenized=spb.TokenizedInput(input_ids=IDS), return_logprob=True,
                         logprob_start_len=-1, top_logprobs_num=2000),  # --max-logprobs 20
     "Requested sample logprobs of 2000, which is greater than max allowed: 20"),
])
async def test_refusals_are_invalid_argument_in_sglangs_words(stub, pod, request_, says):
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await responses(stub, request_)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert says in err.value.details()
    await released(pod)


async def test_grpc_requests_count_in_the_sglang_metrics(stub, pod):
    async with httpx.AsyncClient(base_url=pod.http_url, timeout=30) as h:
        def grew(before: str, after: str, streaming: str) -> float:
            return metric(after, "sglang:num_requests_total", is_streaming=streaming) - \
                metric(before, "sglang:num_requests_total", is_streaming=streaming)

        before = (await h.get("/metrics")).text
        await responses(stub, gen(max_new_tokens=3))
        await responses(stub, gen(stream=False, max_new_tokens=3, n=2))
        assert (await stub.HealthCheck(spb.HealthCheckRequest())).healthy  # not counted
        await released(pod)
        after = (await h.get("/metrics")).text
        assert (grew(before, after, "true"), grew(before, after, "false")) == (1, 2)
        tokens = [metric(text, "sglang:generation_tokens_total", is_streaming="false")
                  for text in (before, after)]
        assert tokens[1] - tokens[0] == 6


async def _healthy(stub) -> bool:
    return (await stub.HealthCheck(spb.HealthCheckRequest())).healthy


WIRE = Wire(spb_grpc.SglangSchedulerStub,
            lambda rid, streaming, max_new, n: gen(rid=rid, stream=streaming, ignore_eos=True,
                                                   max_new_tokens=max_new, n=n),
            lambda rid: spb.AbortRequest(request_id=rid),
            lambda m: m.complete.finish_reason if m.HasField("complete") else "",
            "abort", _healthy)


async def test_health_model_server_info_and_tokenizer(stub, pod):
    await check_health_and_tokenizer(pod, WIRE, SERVICE_NAME)
    model = await stub.GetModelInfo(spb.GetModelInfoRequest())
    assert (model.served_model_name, model.is_generation, model.max_context_length,
            model.max_req_input_len) == ("llama-3.1-8b", True, CTX, CTX - 6)
    assert list(model.eos_token_ids) == [TOK.eos_token_id]
    info = await stub.GetServerInfo(spb.GetServerInfoRequest())
    assert (info.server_type, info.sglang_version) == ("grpc", "0.5.23")
    args = dict(info.server_args)
    assert (args["tp_size"], args["context_length"], args["page_size"]) == (1, CTX, 16)
    assert info.max_total_num_tokens == args["max_total_num_tokens"] > 0
    with pytest.raises(grpc.aio.AioRpcError) as err:  # no --kv-events-config: smg's words
        async for _ in stub.SubscribeKvEvents(common_pb2.SubscribeKvEventsRequest()):
            pass
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert err.value.details() == ("KV cache events not enabled. Start SGLang with "
                                   "--kv-events-config '{\"publisher\": \"zmq\"}'")


async def test_abort_is_owned_and_frees_the_request(slow_pod):
    await check_owned_abort(slow_pod, WIRE)


async def test_a_cancelled_stream_frees_the_request(slow_pod):
    await check_cancelled_stream(slow_pod, WIRE)


async def test_loads_are_the_schedulers(slow_pod):
    async with grpc.aio.insecure_channel(slow_pod.target) as channel, \
            AsyncClient(slow_pod.target) as client:
        stub = spb_grpc.SglangSchedulerStub(channel)
        calls = [stub.Generate(gen(rid=f"q-{i}", ignore_eos=True)) for i in range(2)]
        name = (await client.list_deployments()).deployments[0].name
        await until(client, name, lambda d: (d.load.num_running, d.load.num_waiting) == (1, 1))
        loads = await stub.GetLoads(spb.GetLoadsRequest())
        assert (loads.version, loads.dp_rank_count) == ("0.5.23", 1)
        (load,) = loads.loads
        assert (load.num_running_reqs, load.num_waiting_reqs, load.num_total_reqs,
                load.max_running_requests) == (1, 1, 2, 1)
        assert 0 < load.token_usage < 1 and load.num_used_tokens > 0
        assert load.HasField("memory") and load.memory.token_capacity == \
            load.max_total_num_tokens
        assert load.queues.waiting == 1
        assert (loads.aggregate.total_running_reqs, loads.aggregate.total_reqs) == (1, 2)
        core = (await stub.GetLoads(spb.GetLoadsRequest(include=["core"]))).loads[0]
        assert not core.HasField("memory") and not core.HasField("queues")
        assert not (await stub.GetLoads(spb.GetLoadsRequest(dp_rank=3))).loads
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.GetLoads(spb.GetLoadsRequest(include=["gpu"]))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "Invalid include sections" in err.value.details()
        info = await stub.GetServerInfo(spb.GetServerInfoRequest())
        assert info.active_requests == 2
        for i in range(2):
            assert (await stub.Abort(spb.AbortRequest(request_id=f"q-{i}"))).success
        for call in calls:
            assert [m async for m in call][-1].complete.finish_reason == "abort"
    await released(slow_pod)


async def test_a_cancellation_storm_leaves_the_pool_idle(pod):
    await check_storm(pod, WIRE, seed=7)


async def test_an_embedding_pods_embed_and_health_pool():
    """On an embedding model's SGLang pod: Embed answers SGLang's flat EmbedResponse (the
    vector /encode gives for the same ids), the health probe pools, Generate is refused."""
    with ServerProcess(None, "--chip", "h100-sxm", "--engine", "sglang", "--model",
                       "qwen3-embedding-8b", "--quant", "bf16", "--time-scale", "0.05",
                       "--http-api", "sglang") as pod:
        async with grpc.aio.insecure_channel(pod.target) as channel, \
                httpx.AsyncClient(base_url=pod.http_url, timeout=30) as h:
            stub = spb_grpc.SglangSchedulerStub(channel)
            out = await stub.Embed(spb.EmbedRequest(
                request_id="e-1", tokenized=spb.TokenizedInput(input_ids=IDS)))
            assert out.prompt_tokens == len(IDS) and out.embedding_dim == len(out.embedding)
            direct = (await h.post("/encode", json={"input_ids": IDS})).json()
            assert list(out.embedding) == pytest.approx(direct["embedding"], rel=1e-6)
            assert (await stub.HealthCheck(spb.HealthCheckRequest())).healthy
            assert not (await stub.GetModelInfo(spb.GetModelInfoRequest())).is_generation
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await responses(stub, gen(max_new_tokens=2))
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        await released(pod)


async def test_data_parallel_rank_pins_and_loads_are_per_rank():
    """smg's dp-aware routing pins a request to a rank (`data_parallel_rank`, explicit
    presence: a pin to rank 0 is told from no pin) and reads one load per rank."""
    with ServerProcess(None, *POD, "--time-scale", "0.05", "--data-parallel-size", "2") as dp:
        async with grpc.aio.insecure_channel(dp.target) as channel:
            stub = spb_grpc.SglangSchedulerStub(channel)
            for i, rank in enumerate((1, 0, 1, 1)):
                request = gen(rid=f"pin-{i}", stream=False, max_new_tokens=2)
                request.data_parallel_rank = rank
                await responses(stub, request)
            ranks = re.findall(r"engine\[[^\]]*/(\d)\] doppelchip\.engine: \[request_id=pin-(\d)"
                               r"\] queued", dp.log)
            assert sorted((int(i), int(r)) for r, i in ranks) == [(0, 1), (1, 0), (2, 1),
                                                                   (3, 1)]
            loads = await stub.GetLoads(spb.GetLoadsRequest())
            assert [load.dp_rank for load in loads.loads] == [0, 1]
            only = await stub.GetLoads(spb.GetLoadsRequest(dp_rank=1))
            assert [load.dp_rank for load in only.loads] == [1]
            request = gen(max_new_tokens=2)
            request.data_parallel_rank = 2
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await responses(stub, request)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "data_parallel_rank 2 is out of range" in err.value.details()
        await released(dp)
