"""A fleet and a known load that exercise every metric the dashboards read.

- `vllm-small-kv`: Llama 3.1 8B on an H100 with vLLM and only 40 KV blocks (640 tokens): six
  400-token generations, the rest sent once the first streams, outgrow the pool and preempt
  each other; their prompts share a prefix (prefix-cache hits);
- `mlx-m4max`: a cold start (weights load), then MLX compiles every new shape
  (`mx.compile`): compile stalls;
- `groq-recompile`: Llama 2 70B on Groq LPUs, `shape_policy = "recompile"`: changing batch
  sizes recompile the whole program while the pipeline idles;
- `llamacpp-ssd`: Llama 3.1 70B f16 on an RTX 4090 box: the CPU layers exceed host RAM and
  are re-read from SSD every token (SSD page-ins).
- `vllm-offload`: the same H100 with 40 KV blocks and a CPU tier (`kv_offloading_size`):
  three 300-token prompts in turn evict the first from the device, and the first again comes
  back from host memory (CPU KV tier stores, loads and hits).
- `vllm-spec`: the same H100 speculating with an EAGLE-3 head (3 drafts, 60 % acceptance):
  the spec-decode counters.
`mlx-m4max` also has a hang scheduled far beyond the test, so the failure-injection series
(docs/FAULTS.md) are exported, at zero.
time_scale 0.002: an emulated second takes 2 ms of wall time, so the slowest deployment
(~17 s per llama.cpp token) still finishes in a fraction of a second.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from server_proc import until

from clients.client import AsyncClient
from doppelchip.v1 import inference_pb2 as pb

TIME_SCALE = 0.002
PREFIX = "You are a careful assistant. Answer briefly and precisely, citing the source: "

# The two vLLM deployments pin 16-token KV blocks (vLLM 0.34.0's default is 64): their pools
# of 40 blocks are sized in 16-token blocks for the load below.
DEPLOYMENTS = [
    {"name": "vllm-small-kv", "model": "llama-3.1-8b", "quant": "bf16", "chip": "h100-sxm",
     "engine": "vllm", "max_model_len": 512, "block_size": 16, "kv_blocks": 40,
     "enable_lora": True},  # LoRA on, unused: vllm:lora_requests_info for the dashboard
    {"name": "mlx-m4max", "model": "llama-3.1-8b", "quant": "mlx-4bit", "chip": "m4-max-40",
     "engine": "mlx", "max_model_len": 512, "start": "cold",
     # failure injection configured, never due during the test: the fault panels have series
     "fault_hang": ["at=1e9,for=1"]},
    {"name": "groq-recompile", "model": "llama-2-70b", "quant": "f16", "chip": "groq-lpu-v1",
     "engine": "groq", "max_model_len": 4096, "max_num_seqs": 4, "shape_policy": "recompile"},
    {"name": "llamacpp-ssd", "model": "llama-3.1-70b", "quant": "f16", "chip": "rtx-4090",
     "engine": "llama.cpp", "max_model_len": 512, "max_num_seqs": 1},
    {"name": "vllm-offload", "model": "llama-3.1-8b", "quant": "bf16", "chip": "h100-sxm",
     "engine": "vllm", "max_model_len": 512, "block_size": 16, "kv_blocks": 40,
     "kv_offloading_size": 1.0},
    {"name": "vllm-spec", "model": "llama-3.1-8b", "quant": "bf16", "chip": "h100-sxm",
     "engine": "vllm", "max_model_len": 512,
     "speculative_config": '{"method": "eagle3", "num_speculative_tokens": 3, '
                           '"acceptance_rate": 0.6}'},
]

# deployment -> [(prompt, max_tokens)]
LOAD: dict[str, list[tuple[str, int]]] = {
    "vllm-small-kv": [(f"{PREFIX}question {i}?", 400) for i in range(6)],
    "mlx-m4max": [("short", 6), ("a somewhat longer prompt here", 6),
                  ("the longest prompt of the three, with a few more words in it", 6)],
    # Groq batches statically: the two later requests queue behind the first (a batch of 1)
    # and run together as a batch of 2, which recompiles the program
    "groq-recompile": [("first, long", 2000), ("second", 8), ("third one", 8)],
    "llamacpp-ssd": [("page in", 3), ("page in again", 3)],
    # one after another: the third evicts the first from the device; the first comes back
    "vllm-offload": [(word * 300, 4) for word in (" apple", " banana", " green", " apple")],
    "vllm-spec": [("draft and verify", 48), ("draft, then verify again", 48)],
}
SEQUENTIAL = ("vllm-offload",)


def fleet_doc() -> dict:
    return {
        "server": {"time_scale": TIME_SCALE, "default_deployment": "vllm-small-kv",
                   "drain_grace_s": 5.0},
        "deployments": DEPLOYMENTS,
    }


@dataclass
class Result:
    deployment: str
    tokens: int  # token ids the client received
    prompt_tokens: int
    completion_tokens: int
    ttft_s: float
    e2e_s: float
    finish_reason: int


async def one(client: AsyncClient, deployment: str, prompt: str, max_tokens: int,
              first_token: asyncio.Event | None = None) -> Result:
    tokens, final = 0, None
    async for chunk in client.generate(prompt, deployment=deployment, max_tokens=max_tokens,
                                       ignore_eos=True, timeout=60):
        tokens += len(chunk.token_ids)
        if first_token is not None and tokens:
            first_token.set()
        if chunk.HasField("final"):
            final = chunk.final
    assert final is not None
    u, t = final.usage, final.timings
    return Result(deployment, tokens, u.prompt_tokens, u.completion_tokens, t.ttft_s, t.e2e_s,
                  final.finish_reason)


async def staggered(client: AsyncClient, deployment: str) -> list[Result]:
    """The first request, then the others once the first has streamed a token."""
    (p1, n1), *rest = LOAD[deployment]
    started = asyncio.Event()
    first = asyncio.create_task(one(client, deployment, p1, n1, started))
    await started.wait()
    later = await asyncio.gather(*(one(client, deployment, p, n) for p, n in rest))
    return [await first, *later]


async def drive(client: AsyncClient) -> list[Result]:
    """Every request of LOAD at once; the first two deployments staggered (see above)."""
    for d in DEPLOYMENTS:  # the cold deployment must have built first
        await until(client, d["name"], lambda s: s.state == pb.DEPLOYMENT_STATE_READY)
    stagger = ("vllm-small-kv", "groq-recompile")
    jobs = [one(client, d, p, n) for d, reqs in LOAD.items()
            if d not in stagger + SEQUENTIAL for p, n in reqs]
    *staged, rest = await asyncio.gather(*(staggered(client, d) for d in stagger),
                                         *(in_turn(client, d) for d in SEQUENTIAL),
                                         asyncio.gather(*jobs))
    return [r for group in (*staged, rest) for r in group]


async def in_turn(client: AsyncClient, deployment: str) -> list[Result]:
    """Each request once the one before it has finished."""
    return [await one(client, deployment, p, n) for p, n in LOAD[deployment]]
