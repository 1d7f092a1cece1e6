"""The test fleet and the helpers tests share with it: imported by name (`from fleets import
...`), never from conftest.py, which holds fixtures only (a conftest is imported as the module
`conftest`, and a second one anywhere under tests/ would shadow the first for every test
module collected after it)."""

from __future__ import annotations

from server_proc import released

from server.config import parse_fleet

# time_scale 0.05: an emulated second takes 50 ms of wall time.
TEST_FLEET = {
    "server": {"time_scale": 0.05, "default_deployment": "fast", "drain_grace_s": 5.0},
    "deployments": [
        # Llama 3.1 8B on an H100 with vLLM: ~6 ms per output token (0.3 ms of wall time).
        # 16-token KV blocks (vLLM 0.34.0's default is 64: test_block_size.py), so that the
        # prefix-cache, KV-event and offload tests see several blocks in a 256-token context.
        {"name": "fast", "model": "llama-3.1-8b", "quant": "bf16", "chip": "h100-sxm",
         "engine": "vllm", "max_model_len": 256, "block_size": 16},
        # Llama 3.1 70B Q4 on an RTX 4090 box with llama.cpp offload: ~0.3 s per token (15 ms
        # of wall time), for cancel/deadline/drain tests; one sequence at a time and a
        # two-deep waiting queue for admission control.
        {"name": "slow", "model": "llama-3.1-70b", "quant": "q4_k_m", "chip": "rtx-4090",
         "engine": "llama.cpp", "max_num_seqs": 1, "max_waiting": 2},
    ],
}


def fleet_doc(server: dict | None = None, deployments: list[dict] | None = None) -> dict:
    """The test fleet's document with `server` keys overridden / other deployments."""
    doc = {"server": {**TEST_FLEET["server"], **(server or {})},
           "deployments": list(deployments or TEST_FLEET["deployments"])}
    if deployments:
        doc["server"].setdefault("default_deployment", deployments[0]["name"])
        if doc["server"]["default_deployment"] not in {d["name"] for d in deployments}:
            doc["server"]["default_deployment"] = deployments[0]["name"]
    return doc


def make_fleet(overrides: dict | None = None):
    """The test fleet as a parsed FleetConfig (for tests of configuration, not serving)."""
    return parse_fleet(fleet_doc(overrides), "test fleet")


async def assert_released(client, name: str) -> None:
    """Deployment `name` holds no request and no KV block (see server_proc.released)."""
    await released(client, name)


async def sigterm_mid_stream(server, **request) -> list:
    """Start one long stream on `server` (`request`: build_request's keywords), send the
    server SIGTERM after its first message, and return the messages that followed."""
    import signal

    import grpc

    from clients.client import AsyncClient, build_request

    async with AsyncClient(server.target) as c:
        call = c.stub.Generate(build_request("long", max_tokens=3000, ignore_eos=True,
                                             **request))
        await call.read()
        server.signal(signal.SIGTERM)
        rest = []
        while (msg := await call.read()) is not grpc.aio.EOF:
            rest.append(msg)
    return rest


def vllm_pod_options(*argv: str):
    """The deployment (`EngineOptions`) `doppelchip vllm serve ARGV` serves, built as
    cmd_vllm_serve builds it, without starting anything."""
    from doppelchip.cli import build_parser
    from doppelchip.cmd_serve import pod_fleet
    from doppelchip.cmd_vllm import translate
    from doppelchip.dropin import serve_args
    from doppelchip.vllm_argv import vllm_argv
    from server.config import load_fleet

    vllm = build_parser("vllm").parse_args(vllm_argv(["vllm", "serve", *argv], set()))
    serve = serve_args(translate(vllm)[0])
    serve.model_path = vllm.model_tag or vllm.model
    (d,) = pod_fleet(serve, load_fleet(None)).deployments
    return d
