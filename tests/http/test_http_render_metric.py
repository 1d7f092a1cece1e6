"""vLLM 0.34.0's `vllm:request_render_duration_seconds{model_name, request_type}` on a real
server: absent until the first render (vLLM registers it lazily), then one observation per
request rendered where vLLM's online renderer observes one — chat completions, /v1/messages and
its count_tokens, the chat render route as "chat"; completions (one per request, whatever its
prompts) and the completions render route as "completion" — and none for /tokenize,
/v1/responses and its render route, the batch chat route, /inference/v1/generate, or a request
refused while it was rendered. Name, type, help, labels and buckets are vLLM's
(vllm_reference.json)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fleets import TEST_FLEET
from http_helpers import http_client
from prometheus_client.parser import text_string_to_metric_families
from server_proc import ServerProcess

MODEL = "llama-3.1-8b"  # the test fleet's default deployment, max_model_len 256
NAME = "vllm:request_render_duration_seconds"
SPEC = json.loads((Path(__file__).parent.parent / "observability" / "vllm_reference.json")
                  .read_text())["series"][NAME]
MESSAGES = [{"role": "user", "content": "Hi there"}]


@pytest.fixture(scope="module")
def server():
    with ServerProcess(TEST_FLEET, "--enable-scale-out") as s:
        yield s


def renders(server) -> dict[str, float] | None:
    """Observations by request_type (None: the family is not exposed), after checking the
    family's shape against vLLM's."""
    fams = {f.name: f for f in text_string_to_metric_families(server.scrape())}
    fam = fams.get(NAME)
    if fam is None:
        return None
    assert fam.type == SPEC["type"] and fam.documentation == SPEC["help"]
    counts, bounds = {}, {}
    for s in fam.samples:
        assert set(s.labels) - {"le"} == set(SPEC["labels"]), s.labels
        assert s.labels["model_name"] == MODEL
        kind = s.labels["request_type"]
        if s.name == NAME + "_count":
            counts[kind] = s.value
        elif s.name == NAME + "_bucket" and s.labels["le"] != "+Inf":
            bounds.setdefault(kind, []).append(float(s.labels["le"]))
    assert all(b == SPEC["buckets"] for b in bounds.values()), bounds
    return counts


async def test_each_rendering_route_observes_once_and_the_others_never(server):
    assert renders(server) is None  # nothing rendered yet: not registered
    async with http_client(server) as h:
        ok = [await h.post("/tokenize", json={"model": MODEL, "messages": MESSAGES}),
              await h.post("/v1/responses", json={"model": MODEL, "input": "Hi",
                                                  "max_output_tokens": 2}),
              await h.post("/v1/responses/render", json={"model": MODEL, "input": "Hi"}),
              await h.post("/inference/v1/generate", json={
                  "model": MODEL, "token_ids": [1, 2, 3],
                  "sampling_params": {"max_tokens": 2}}),
              await h.post("/v1/chat/completions/batch", json={
                  "model": MODEL, "messages": [MESSAGES, MESSAGES], "max_tokens": 2})]
        assert [r.status_code for r in ok] == [200] * 5, [r.text for r in ok]
        assert renders(server) is None
        refused = await h.post("/v1/chat/completions", json={
            "model": MODEL, "messages": MESSAGES, "max_tokens": 10_000})  # past the context
        assert refused.status_code == 400
        assert renders(server) is None
        chat = {"model": MODEL, "messages": MESSAGES, "max_tokens": 2}
        ok = [await h.post("/v1/chat/completions", json=chat),
              await h.post("/v1/chat/completions/render", json=chat),
              await h.post("/v1/messages", json={**chat, "max_tokens": 2}),
              await h.post("/v1/messages/count_tokens", json={"model": MODEL,
                                                              "messages": MESSAGES}),
              await h.post("/v1/completions", json={"model": MODEL, "prompt": ["a b", "c"],
                                                    "max_tokens": 2}),
              await h.post("/v1/completions/render", json={"model": MODEL, "prompt": "a b",
                                                           "max_tokens": 2})]
        assert [r.status_code for r in ok] == [200] * 6, [r.text for r in ok]
    assert renders(server) == {"chat": 4, "completion": 2}
