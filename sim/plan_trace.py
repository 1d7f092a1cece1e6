"""The workload shape `plan` sizes from when the flags do not give it: a trace's requests, or
arrivals drawn from a rate shape, read off the very conversations a candidate's run replays.

Why it exists: the analytic model (sim.plan_space) needs the offered rate, the prompt and the
output lengths. For the synthetic kinds the flags say them (`--rate`, `--isl`, `--osl`); a
trace carries its own timestamps and lengths and ignores those flags, and a rate shape
(`--rate-shape`) replaces `--rate`. Sizing such a plan from the flags started the search from
a replica count of a traffic nobody offered (too many replicas: a dearer winner than the
cheapest; too few: only more candidates simulated).

Contract: `observed_shape(spec, eos_mean)` iterates the workload once (`stream_workload`,
with the engine's tokenizer for a trace's text prompts) and returns the mean rate (every
request, follow-up turns included, over the span of the first turns' starts), the mean
prompt (each turn's new tokens: a conversation's history is in the prefix cache), the mean
expected output (each request's `max_tokens`, or the engine's EOS draw bounded by it), the
largest `max_tokens`, the longest context a conversation reaches and the prompts'
quantiles. A workload whose requests all start at one instant has no rate: ValueError, as for
an empty trace. With `rate` given (a synthetic workload whose lengths vary: the flags say
its rate, not its lengths' quantiles) the span is not read; `shared` tokens of every prompt
(a shared-prefix group's system prompt) are taken as cached, and so is every leading block
of `BLOCK` tokens an earlier prompt began with (a trace's shared system prompts and
documents: Mooncake's hash ids, JSONL token ids). The prompt is the prefill bound's
(sim.plan_space), a lower bound: the best case, where every repeated prefix hits a cache.
"""

from __future__ import annotations

import dataclasses

from clients.workloads import WorkloadSpec, stream_workload
from server.engine.tokenizer import get_tokenizer
from sim.plan_space import WorkloadShape, output_mean, prompt_quantiles

BLOCK = 16  # tokens: the smallest KV block an engine here takes by default (vLLM's on AMD,
#              the others'); a larger one rounds a hit down further, so this is the best case
MAX_SEEN_BLOCKS = 1 << 20  # prefix blocks remembered (~70 MB); later ones are not added


class SeenPrefixes:
    """Which leading blocks of the prompts so far were seen: `hit(ids)` is how many leading
    tokens of `ids` (whole blocks) an earlier prompt began with; it then remembers `ids`'."""

    def __init__(self) -> None:
        self.blocks: set[int] = set()

    def hit(self, ids: tuple[int, ...]) -> int:
        h, hit, missed = 0, 0, False
        for start in range(0, len(ids) - BLOCK + 1, BLOCK):
            h = hash((h, ids[start:start + BLOCK]))  # the block and everything before it
            if not missed and h in self.blocks:
                hit = start + BLOCK
                continue
            missed = True
            if len(self.blocks) < MAX_SEEN_BLOCKS:
                self.blocks.add(h)
        return hit


def observed_shape(spec: WorkloadSpec, eos_mean: float, rate: float | None = None,
                   shared: int = 0) -> WorkloadShape:
    """The workload's shape as its conversations have it (see the module's contract)."""
    tok = get_tokenizer()
    spec = dataclasses.replace(spec, vocab_size=tok.vocab_size)
    conversations = requests = prompt = 0
    output, output_max, context = 0.0, 0, 0
    first = last = None
    prompts: list[int] = []
    seen = SeenPrefixes()
    for conv in stream_workload(spec, encode=tok.encode):
        conversations += 1
        first = conv.start_s if first is None else min(first, conv.start_s)
        last = conv.start_s if last is None else max(last, conv.start_s)
        reach = 0
        for turn in conv.turns:
            requests += 1
            ids = tuple(turn.user_ids)
            new = max(1, len(ids) - max(shared, seen.hit(ids)))
            prompt += new
            prompts.append(new)
            output += output_mean(turn.max_tokens, conv.ignore_eos, eos_mean)
            output_max = max(output_max, turn.max_tokens)
            reach += len(turn.user_ids) + turn.max_tokens
        context = max(context, reach)
    what = ("the trace" if spec.kind == "trace" else
            f"the rate shape {spec.rate_shape!r}" if spec.rate_shape else "the workload")
    if first is None or last is None or not requests:
        raise ValueError(f"{what} has no request to plan for")
    span = last - first
    if rate is None and span <= 0:
        raise ValueError(f"{what}: every request starts at one instant, so there is no rate to "
                         "plan for (plan sizes a fleet for traffic over time)")
    # n conversations start over the span from the first to the last: n - 1 gaps
    if rate is None:
        rate = (conversations - 1) / span * (requests / conversations)
    return WorkloadShape(rate=rate,
                         prompt=round(prompt / requests), output_mean=output / requests,
                         output_max=output_max, context=context,
                         prompt_quantiles=prompt_quantiles(prompts))

