"""KV cache events on a TensorRT-LLM pod: TensorRT-LLM keeps them when its YAML sets
`kv_cache_config.event_buffer_max_size` > 0 with block reuse on, and its gRPC service streams
them to smg's cache-aware router (`SubscribeKvEvents`). `doppelchip trtllm-serve` turns that
setting into the pod's own publisher, which `trtllm.TrtllmService` relays."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import grpc
import pytest
from server_proc import ServerProcess
from smg_grpc_proto import trtllm_service_pb2 as tpb
from smg_grpc_proto import trtllm_service_pb2_grpc as tpb_grpc
from smg_grpc_proto.generated import common_pb2

from doppelchip import exit_codes
from doppelchip.cli import build_parser, main
from doppelchip.cmd_trtllm import translate

REPO = "meta-llama/Llama-3.1-8B-Instruct"


def events_config(tmp_path: Path, yaml: str) -> str | None:
    """The `--kv-events-config` a trtllm-serve command line with this YAML gives its pod."""
    path = tmp_path / "extra.yaml"
    path.write_text(yaml)
    argv = translate(build_parser("trtllm-serve").parse_args(
        ["trtllm-serve", REPO, "--grpc", "--config", str(path)]))[0]
    return argv[argv.index("--kv-events-config") + 1] if "--kv-events-config" in argv else None


def test_an_event_buffer_turns_the_pods_kv_events_on(tmp_path, capsys, monkeypatch):
    on = events_config(tmp_path, "kv_cache_config:\n  event_buffer_max_size: 1024\n")
    assert on is not None and json.loads(on)["enable_kv_cache_events"] is True
    assert events_config(tmp_path, "max_batch_size: 8\n") is None  # TensorRT-LLM's default: 0
    assert events_config(tmp_path, "kv_cache_config:\n  event_buffer_max_size: 1024\n"
                                   "  enable_block_reuse: false\n") is None  # nothing reused
    monkeypatch.setattr("doppelchip.cmd_serve.cmd_serve", lambda a: pytest.fail("served"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("kv_cache_config:\n  event_buffer_max_size: -1\n")
    assert main(["trtllm-serve", REPO, "--grpc", "--config", str(bad)]) == exit_codes.USAGE
    assert "event_buffer_max_size must be a non-negative integer (got -1)" in \
        capsys.readouterr().err


async def test_subscribe_kv_events_streams_the_pods_stored_blocks(tmp_path):
    path = tmp_path / "extra.yaml"
    path.write_text("kv_cache_config:\n  event_buffer_max_size: 1024\n")
    pod_argv = translate(build_parser("trtllm-serve").parse_args(
        ["trtllm-serve", REPO, "--grpc", "--config", str(path)]))[0]
    keep = pod_argv.index("--kv-events-config")
    with ServerProcess(None, "--chip", "h100-sxm", "--engine", "tensorrt-llm", "--model",
                       "llama-3.1-8b", "--quant", "bf16", "--grpc-api", "trtllm",
                       "--max-model-len", "2048", "--block-size", "32", "--time-scale", "0.05",
                       *pod_argv[keep:keep + 2]) as pod:
        async with grpc.aio.insecure_channel(pod.target) as channel:
            stub = tpb_grpc.TrtllmServiceStub(channel)
            events = stub.SubscribeKvEvents(common_pb2.SubscribeKvEventsRequest())
            await events.initial_metadata()  # subscribed: nothing sent later is missed
            prompt = list(range(1, 101))  # 100 tokens: three full 32-token blocks
            [m async for m in stub.Generate(tpb.GenerateRequest(
                request_id="kv-1", tokenized=tpb.TokenizedInput(input_token_ids=prompt),
                max_tokens=2))]
            stored: list[int] = []
            while len(stored) < 96:
                batch = await asyncio.wait_for(events.read(), 30)
                stored += [t for e in batch.events if e.WhichOneof("data") == "stored"
                           for block in e.stored.blocks for t in block.token_ids]
            assert stored[:96] == prompt[:96]  # the prompt's full blocks, in order
            events.cancel()
