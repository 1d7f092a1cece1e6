"""LoRA adapters on a served pod (issue 13): vLLM's load/unload routes and errors, adapters in
/v1/models and ListDeployments, requests selecting an adapter by `model`, two adapters with
max_loras=1 serialized on the emulated timeline, vllm:lora_requests_info."""

from __future__ import annotations

import asyncio
import re

import httpx
from fleets import assert_released, fleet_doc
from server_proc import ServerProcess, metric, until

from clients.client import AsyncClient

LORA = {"name": "lora", "model": "llama-3.1-8b", "quant": "bf16", "chip": "h100-sxm",
        "engine": "vllm", "max_model_len": 1024, "enable_lora": True, "max_loras": 1,
        "lora_modules": ["a=/adapters/a", '{"name": "b", "path": "/adapters/b", "rank": 8}']}


# a1's length: ~4 s of the emulated (here wall) timeline, so that the polls that follow it and
# the requests sent while it runs fit inside its life on a loaded 2-core host (150 tokens, ~1 s,
# once did not)
A1_TOKENS = 600


def lora_info(text: str) -> list[tuple[float, dict[str, str]]]:
    """The vllm:lora_requests_info samples: (value, labels)."""
    out = []
    for line in text.splitlines():
        if line.startswith("vllm:lora_requests_info{"):
            body, _, value = line.rpartition(" ")
            out.append((float(value), dict(re.findall(r'(\w+)="([^"]*)"', body))))
    return out


async def final(client: AsyncClient, model: str, max_tokens: int):
    async for chunk in client.generate("tell me", model=model, max_tokens=max_tokens,
                                       ignore_eos=True, timeout=60):
        if chunk.HasField("final"):
            return chunk.final
    raise AssertionError("no final chunk")


async def test_load_unload_round_trip_and_errors():
    with ServerProcess(fleet_doc({"time_scale": 0.05}, [LORA])) as server:
        async with httpx.AsyncClient(base_url=server.http_url, timeout=30) as h, \
                AsyncClient(server.target) as client:
            ids = [m["id"] for m in (await h.get("/v1/models")).json()["data"]]
            assert ids == ["llama-3.1-8b", "a", "b"]
            r = await h.post("/v1/load_lora_adapter", json={"lora_name": "c",
                                                            "lora_path": "/adapters/c"})
            assert r.status_code == 200
            assert r.text == "Success: LoRA adapter 'c' added successfully."
            cards = {m["id"]: m for m in (await h.get("/v1/models")).json()["data"]}
            assert cards["c"]["parent"] == "llama-3.1-8b" and cards["c"]["root"] == "/adapters/c"
            dep = (await client.list_deployments()).deployments[0]
            assert [(a.name, a.id, a.rank) for a in dep.adapters] == [
                ("a", 1, 16), ("b", 2, 8), ("c", 3, 16)]
            r = await h.post("/v1/completions", json={"model": "c", "prompt": "hi",
                                                      "max_tokens": 3})
            assert r.status_code == 200 and r.json()["model"] == "c"

            dup = await h.post("/v1/load_lora_adapter", json={"lora_name": "c",
                                                              "lora_path": "/x"})
            assert dup.status_code == 400
            assert dup.json()["error"]["type"] == "InvalidUserInput"
            assert "has already been loaded" in dup.json()["error"]["message"]
            missing = await h.post("/v1/load_lora_adapter", json={"lora_name": "d",
                                                                  "lora_path": ""})
            assert missing.status_code == 400

            r = await h.post("/v1/unload_lora_adapter", json={"lora_name": "c"})
            assert r.status_code == 200
            assert r.text == "Success: LoRA adapter 'c' removed successfully."
            gone = await h.post("/v1/unload_lora_adapter", json={"lora_name": "c"})
            assert gone.status_code == 404
            assert gone.json()["error"] == {
                "message": "The lora adapter 'c' cannot be found.", "type": "NotFoundError",
                "param": None, "code": 404}
            r = await h.post("/v1/completions", json={"model": "c", "prompt": "hi",
                                                      "max_tokens": 3})
            assert r.status_code == 404  # the adapter's name no longer selects anything
            assert "c" not in [m["id"] for m in (await h.get("/v1/models")).json()["data"]]
            await assert_released(client, "lora")


async def test_two_adapters_serialize_with_max_loras_1_and_show_in_lora_info():
    """a1 (adapter a) runs; b1 (adapter b) and a2 (adapter a) arrive while it does: a2 joins
    the batch at once, b1 waits until a1 and a2 are done (vLLM's max_loras rule), and the
    info gauge's newest sample says running a, waiting b."""
    with ServerProcess(fleet_doc({"time_scale": 1.0}, [LORA])) as server:
        async with AsyncClient(server.target) as client:
            a1 = asyncio.create_task(final(client, "a", A1_TOKENS))
            await until(client, "lora", lambda d: d.load.num_running == 1)
            b1 = asyncio.create_task(final(client, "b", 4))
            await until(client, "lora", lambda d: d.load.num_waiting == 1)
            a2 = asyncio.create_task(final(client, "a", 4))
            await until(client, "lora", lambda d: d.load.num_running == 2)
            text = server.scrape()
            newest = max(lora_info(text), key=lambda s: s[0])[1]
            assert metric(text, "vllm:num_requests_waiting_by_reason", reason="deferred") == 1
            assert newest == {"deployment": "lora", "max_lora": "1",  # fleet mode's label
                              "running_lora_adapters": "a", "waiting_lora_adapters": "b"}
            order: list[str] = []
            for name, task in (("a1", a1), ("a2", a2), ("b1", b1)):
                task.add_done_callback(lambda _, n=name: order.append(n))
            _, f_a2, f_b1 = await asyncio.gather(a1, a2, b1)
            assert order == ["a2", "a1", "b1"]
            # on the emulated timeline: b1 waited through a2's whole life and beyond
            assert f_b1.timings.queue_s > f_a2.timings.e2e_s
            assert f_a2.timings.queue_s < f_a2.timings.e2e_s / 2
            text = server.scrape()
            samples = lora_info(text)
            assert max(samples, key=lambda s: s[0])[1]["running_lora_adapters"] == ""
            assert {s[1]["running_lora_adapters"] for s in samples} >= {"a", "b"}
            await assert_released(client, "lora")


async def test_max_loras_2_runs_both_adapters_at_once():
    """The control: with two slots the same b1 does not wait for a1."""
    doc = fleet_doc({"time_scale": 1.0}, [{**LORA, "max_loras": 2}])
    with ServerProcess(doc) as server:
        async with AsyncClient(server.target) as client:
            a1 = asyncio.create_task(final(client, "a", A1_TOKENS))
            await until(client, "lora", lambda d: d.load.num_running == 1)
            f_b1 = await final(client, "b", 4)
            assert not a1.done()
            assert f_b1.timings.queue_s < f_b1.timings.e2e_s / 2
            await a1
            await assert_released(client, "lora")


async def test_adapter_cost_in_token_times():
    """The emulated token times a client gets: a rank-16 adapter decodes slower than a rank-8
    one, which decodes slower than the base model; the first request of an adapter also pays
    its copy onto the device (a longer first token than the next request of it)."""
    with ServerProcess(fleet_doc({"time_scale": 0.05}, [LORA])) as server:
        async with AsyncClient(server.target) as client:
            async def times(model: str) -> list[float]:
                out: list[float] = []
                async for chunk in client.generate("same prompt", model=model, max_tokens=8,
                                                   ignore_eos=True, return_token_times=True,
                                                   timeout=60):
                    out.extend(chunk.token_times)
                return out

            base = await times("llama-3.1-8b")
            # (a prompt shorter than one KV block: no prefix-cache hit makes a rerun faster)
            b_first, b_again = await times("b"), await times("b")  # rank 8
            a_first = await times("a")  # rank 16
            gap = [t[-1] - t[1] for t in (base, b_again, a_first)]
            assert gap[0] < gap[1] < gap[2]
            assert b_first[0] > b_again[0]  # the copy over PCIe, once
            await assert_released(client, "lora")
