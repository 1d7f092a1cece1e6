"""`doppelchip vllm serve REPO ...` is a pod a vLLM client cannot tell from `vllm serve REPO`
by its names: the OpenAI client sends the repository id as `model`, `/v1/models` lists it,
every vllm: series carries it as `model_name`, and vLLM's memory and scheduling flags reach
the emulated engine (`vllm:cache_config_info` reports them; the KV pool is the size the
device layer gives for that memory share)."""

from __future__ import annotations

import asyncio

import grpc
import openai
import pytest
from fleets import sigterm_mid_stream, vllm_pod_options
from prometheus_client.parser import text_string_to_metric_families
from server_proc import ServerProcess
from smg_grpc_proto import vllm_engine_pb2 as vpb
from smg_grpc_proto import vllm_engine_pb2_grpc as vpb_grpc

from devices import DeploymentSpec, catalog, place
from doppelchip.v1 import inference_pb2 as pb

REPO = "meta-llama/Llama-3.1-8B-Instruct"
# the tokens per KV block vLLM picks on the pod's chip when `vllm serve` names no --block-size
DEFAULT_BLOCK = catalog.get_engine("vllm").block_size_on(catalog.get_chip("h100-sxm"))
ARGV = (REPO, "-tp", "2", "--gpu-memory-utilization", "0.5", "--max-model-len", "4k",
        "--max-num-seqs", "64", "--no-enable-prefix-caching", "--trust-remote-code",
        "--download-dir", "/models", "--disable-uvicorn-access-log", "--time-scale", "0.01")


@pytest.fixture(scope="module")
def pod():
    with ServerProcess(None, *ARGV, vllm=True) as server:
        yield server


def test_the_openai_client_uses_the_repository_id(pod):
    oai = openai.OpenAI(base_url=f"{pod.http_url}/v1", api_key="none", timeout=60)
    (card,) = oai.models.list().data
    assert card.id == REPO and card.model_extra["root"] == REPO  # vLLM's root: --model's
    chat = oai.chat.completions.create(model=REPO, max_tokens=4,
                                       messages=[{"role": "user", "content": "hello"}])
    assert chat.model == REPO and chat.usage.completion_tokens >= 1
    with pytest.raises(openai.NotFoundError):  # the catalogue id is not a served name
        oai.completions.create(model="llama-3.1-8b", prompt="hi", max_tokens=2)


def test_vllms_flags_reach_the_engine(pod):
    families = {m.name: m for m in text_string_to_metric_families(pod.scrape())}
    info = families["vllm:cache_config_info"].samples[0].labels
    assert info["model_name"] == REPO
    assert info["gpu_memory_utilization"] == "0.5"
    assert info["enable_prefix_caching"] == "False"
    placed = place(DeploymentSpec(model="llama-3.1-8b", quant="bf16", chip="h100-sxm",
                                  engine="vllm", tp=2, gpu_mem_utilisation=0.5,
                                  max_context=4000, max_batch=64))
    default = place(DeploymentSpec(model="llama-3.1-8b", quant="bf16", chip="h100-sxm",
                                   engine="vllm", tp=2, max_context=4000, max_batch=64))
    assert info["block_size"] == str(DEFAULT_BLOCK)
    assert int(info["num_gpu_blocks"]) == placed.kv_blocks(DEFAULT_BLOCK) < default.kv_blocks(
        DEFAULT_BLOCK)
    assert "doppelchip serve --chip h100-sxm --engine vllm --model llama-3.1-8b" in pod.log


def test_the_vllm_engine_grpc_names_the_repository_as_vllm_does(pod):
    """smg reads GetModelInfo: model_path is what --model named, as vLLM's gRPC server."""
    with grpc.insecure_channel(pod.target) as channel:
        info = vpb_grpc.VllmEngineStub(channel).GetModelInfo(vpb.GetModelInfoRequest(),
                                                             timeout=30)
    assert (info.model_path, info.served_model_name) == (REPO, REPO)
    assert info.max_context_length == 4000


async def test_sigterm_aborts_what_is_in_flight_as_vllm_without_shutdown_timeout():
    """vLLM 0.33.0 stops in mode `abort` unless --shutdown-timeout gives in-flight requests
    time (and --grpc serves gRPC on --port, as smg's workers reach vLLM)."""
    with ServerProcess(None, REPO, "--grpc", "--max-model-len", "4k", "--time-scale", "1",
                       vllm=True) as server:
        rest = await sigterm_mid_stream(server)
        assert rest[-1].final.finish_reason == pb.FINISH_REASON_ABORT
        assert sum(len(m.token_ids) for m in rest) < 3000
        assert await asyncio.to_thread(server.stop) == 0
        assert "draining: 1 requests in flight, grace 0.0s" in server.log
        assert "grace expired: aborting 1 requests" in server.log


def test_a_checkpoint_declaring_an_fp8_kv_cache_reports_it_as_vllm_resolves_it():
    """vLLM resolves `--kv-cache-dtype auto` to the checkpoint's KV-cache scheme, and its
    cache_config_info says `fp8`; the pool holds FP8 elements."""
    repo = "nvidia/Llama-3.1-8B-Instruct-FP8"
    with ServerProcess(None, repo, "--max-model-len", "4k", vllm=True) as server:
        families = {m.name: m for m in text_string_to_metric_families(server.scrape())}
    info = families["vllm:cache_config_info"].samples[0].labels
    assert info["cache_dtype"] == "fp8"
    placed = place(vllm_pod_options(repo, "--max-model-len", "4k").spec())
    half = place(vllm_pod_options(repo, "--max-model-len", "4k", "--kv-cache-dtype", "bfloat16")
                 .spec())
    assert info["block_size"] == str(DEFAULT_BLOCK)
    assert int(info["num_gpu_blocks"]) == placed.kv_blocks(DEFAULT_BLOCK) > 1.9 * half.kv_blocks(
        DEFAULT_BLOCK)
