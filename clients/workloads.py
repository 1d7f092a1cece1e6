"""Synthetic workloads: what to send and when, as plain data shared by every target.

A workload is a sequence of `Conversation`s (`build_workload`: a list; `stream_workload`: made
as they are needed). A single request is a one-turn conversation; a
multi-turn conversation sends turn k+1 only after turn k finished (plus think time), with the
whole history — earlier prompts and the tokens the server actually generated — resent as its
prompt, as a chat client does. The same workload drives the in-process virtual-time engine
(`doppelchip simulate`) and a gRPC server (the load generator), so both give the same report.

Prompts are token ids drawn from a seeded generator, so a workload is reproducible from its
arguments alone and needs no tokenizer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace

import numpy as np

from clients.arrivals import arrival_times, parse_rate_shape, shaped_arrival_times
from clients.conversation import FIRST_ORDINARY_ID, Conversation, Turn
from clients.lengths import length_draw
from clients.structured import structured_constraint


@dataclass(frozen=True)
class WorkloadSpec:
    """The knobs every built-in workload shares (CLI flags map onto these one to one)."""

    kind: str = "random"  # random | shared-prefix | multi-turn | structured | mix | trace
    num_requests: int = 100  # conversations, for multi-turn
    isl: int = 128  # input (user message) length in tokens
    osl: int = 128  # output length in tokens (max_tokens)
    rate: float = float("inf")  # conversations per second; inf: all at t=0
    arrival: str = "poisson"  # poisson | constant | gamma
    burstiness: float = 1.0  # gamma arrivals: shape (< 1 burstier than Poisson)
    ramp_up_s: float = 0.0  # the rate ramps linearly from 0 over this many seconds
    length_dist: str = "fixed"  # fixed | uniform | normal (around isl and osl) | histogram
    length_file: str = ""  # histogram: CSV rows "input,output,weight" (see clients/lengths.py)
    mix: tuple[tuple[str, float], ...] = ()  # mix: (workload kind, weight) pairs
    length_spread: float = 0.0  # uniform: ± this fraction; normal: std as this fraction
    seed: int = 0
    ignore_eos: bool = True
    system_prompt_len: int = 1024  # shared-prefix
    num_prefixes: int = 4  # shared-prefix
    users_per_prefix: int = 0  # shared-prefix: 0 = num_requests / num_prefixes
    turns: int = 3  # multi-turn
    think_time_s: float = 0.0  # multi-turn
    trace_path: str = ""  # trace: a JSONL file to replay (see clients/trace.py)
    slo_class_mix: tuple[tuple[str, float], ...] = ()  # (SLO class, weight): see with_classes
    # --- time-varying traffic and trace formats (issue 16; docs/AUTOSCALING.md) ---
    rate_shape: str = ""  # e.g. "diurnal:period=3600,min=2,max=20" (replaces `rate`)
    duration_s: float | None = None  # rate_shape: arrivals in [0, duration_s)
    trace_format: str = "auto"  # auto | jsonl | azure | burstgpt | mooncake
    # --- end time-varying traffic ---
    vocab_size: int = 8192


def _ids(rng: np.random.Generator, n: int, vocab_size: int) -> tuple[int, ...]:
    return tuple(rng.integers(FIRST_ORDINARY_ID, vocab_size, size=n).tolist())


def _id_rows(rng: np.random.Generator, k: int, n: int, vocab_size: int) -> list[tuple[int, ...]]:
    """`k` prompts of `n` ids in one draw: the values of `k` calls of `_ids`."""
    return [tuple(row) for row in
            rng.integers(FIRST_ORDINARY_ID, vocab_size, size=(k, n)).tolist()]


_BLOCK = 64  # fixed-length prompts drawn this many at a time,
_BLOCK_TOKENS = 1 << 20  # or fewer, so that a block holds at most this many ids
MAX_LENGTH = 1 << 24  # tokens of a prompt or an output: beyond any catalogued model's context


def _prompts(spec: WorkloadSpec, rng: np.random.Generator,
             count: int) -> Iterator[tuple[tuple[int, ...], int]]:
    """`count` (prompt ids, output length) pairs, each prompt drawn after its lengths. With
    fixed lengths (no randomness in the lengths) a block of prompts is one draw: NumPy's
    generator gives the same values for one (k, n) draw as for k draws of n, and leaves the
    same state — only faster (the values are the same workload). The lengths' arguments are
    checked now, the prompts drawn as they are iterated."""
    draw = length_draw(spec.length_dist, spec.isl, spec.osl, spec.length_spread,
                       spec.length_file, rng)

    def each() -> Iterator[tuple[tuple[int, ...], int]]:
        if spec.length_dist != "fixed":
            for _ in range(count):
                isl, osl = draw()
                yield _ids(rng, isl, spec.vocab_size), osl
            return
        block = max(1, min(_BLOCK, _BLOCK_TOKENS // spec.isl))
        for start in range(0, count, block):
            for ids in _id_rows(rng, min(block, count - start), spec.isl, spec.vocab_size):
                yield ids, spec.osl
    return each()


class Workload:
    """A workload's conversations in order of their scheduled start, each made as it is
    iterated, so a run of a million requests never holds a million prompts (issue 16: memory
    flat with request count). Iterating again draws the very same conversations again (the
    generator is re-seeded). `count` is how many there are; `multi_turn` whether any has more
    than one turn (a virtual run then cannot macro-step across replicas)."""

    def __init__(self, make: Callable[[], Iterator[Conversation]], count: int,
                 multi_turn: bool) -> None:
        self._make, self.count, self.multi_turn = make, count, multi_turn
        self._first: Iterator[Conversation] | None = make()  # bad arguments raise here

    def __iter__(self) -> Iterator[Conversation]:
        first, self._first = self._first, None
        return first if first is not None else self._make()

    def __len__(self) -> int:
        return self.count


def build_workload(
    spec: WorkloadSpec, encode: Callable[[str], list[int]] | None = None
) -> list[Conversation]:
    """The conversations of a built-in workload, in order of their scheduled start.
    `encode` tokenizes the text prompts of a trace."""
    return list(stream_workload(spec, encode))


def stream_workload(
    spec: WorkloadSpec, encode: Callable[[str], list[int]] | None = None
) -> Workload:
    """`build_workload`'s conversations, made lazily (a trace and a mix are read or built
    whole first: a mix draws each kind's requests in turn, then sorts them by start)."""
    if spec.seed < 0:  # (NumPy's own words do not say which number)
        raise ValueError(f"seed must be >= 0, got {spec.seed}")
    if spec.kind == "trace":
        from clients.trace import load_trace

        if not spec.trace_path:
            raise ValueError("the trace workload needs a trace file")
        trace = load_trace(spec.trace_path, spec.vocab_size, encode, spec.seed,
                           spec.trace_format)
        return Workload(lambda: with_classes(trace, spec, len(trace)), len(trace),
                        any(len(c.turns) > 1 for c in trace))
    rng = np.random.default_rng(spec.seed)
    if spec.rate_shape:  # --- time-varying traffic (issue 16) ---
        starts = shaped_arrival_times(parse_rate_shape(spec.rate_shape), rng,
                                      spec.num_requests or None, spec.duration_s)
        if not starts:
            raise ValueError(f"rate shape {spec.rate_shape!r}: no arrival in the run")
        spec = replace(spec, num_requests=len(starts))
    if spec.num_requests <= 0:
        raise ValueError("num_requests must be > 0")
    if spec.isl <= 0 or spec.osl <= 0:
        raise ValueError("isl and osl must be > 0")
    if max(spec.isl, spec.osl) > MAX_LENGTH:
        raise ValueError(f"isl and osl must be at most {MAX_LENGTH} tokens (longer than any "
                         f"model's context), got isl {spec.isl}, osl {spec.osl}")
    if spec.users_per_prefix < 0:
        raise ValueError(f"users_per_prefix must be >= 1 (0: the requests split evenly over "
                         f"the prefixes), got {spec.users_per_prefix}")
    if not spec.rate_shape:
        starts = arrival_times(spec.num_requests, spec.rate, spec.arrival, rng,
                               spec.burstiness, spec.ramp_up_s)
    builders = {**_BUILDERS, "mix": _mix}
    if spec.kind not in builders:
        raise ValueError(f"unknown workload {spec.kind!r}; one of {', '.join(builders)}")
    builder, state = builders[spec.kind], rng.bit_generator.state  # after the arrivals

    def make() -> Iterator[Conversation]:
        again = np.random.Generator(np.random.PCG64())
        again.bit_generator.state = state
        return with_classes(builder(spec, again, starts), spec, spec.num_requests)

    kinds = [k for k, _ in spec.mix] if spec.kind == "mix" else [spec.kind]
    return Workload(make, spec.num_requests, "multi-turn" in kinds and spec.turns > 1)


def with_classes(conversations: Iterable[Conversation], spec: WorkloadSpec,
                 count: int) -> Iterator[Conversation]:
    """Each untagged conversation (of `count`) gets an SLO class drawn by
    `spec.slo_class_mix`'s weights (issue 16), from a generator of its own seeded by
    `spec.seed`, so adding a mix changes no prompt, length or arrival of the workload. A trace
    line's own `slo_class` is kept."""
    if not spec.slo_class_mix:
        return iter(conversations)
    names = [n for n, _ in spec.slo_class_mix]
    weights = np.asarray([w for _, w in spec.slo_class_mix], dtype=float)
    if any(not n for n in names) or len(set(names)) != len(names):
        raise ValueError("SLO class mix: class names must be distinct and not empty")
    if not np.isfinite(weights).all() or (weights < 0).any() or weights.sum() <= 0:
        raise ValueError("SLO class mix: weights must be finite, >= 0 and not all 0")
    rng = np.random.default_rng([spec.seed, _CLASS_STREAM])
    drawn = rng.choice(len(names), size=count, p=weights / weights.sum())
    return (c if c.slo_class else replace(c, slo_class=names[int(k)])
            for c, k in zip(conversations, drawn.tolist(), strict=True))


_CLASS_STREAM = 0x51C  # the class draw's own stream of the workload seed


def _mix(spec: WorkloadSpec, rng: np.random.Generator,
         starts: list[float]) -> Iterator[Conversation]:
    """Several workloads interleaved: each request's kind is drawn by weight, then each kind's
    requests are built as that workload would build them, and all share one arrival stream."""
    kinds = [k for k, _ in spec.mix]
    if not kinds or any(k in ("mix", "trace") or k not in _BUILDERS for k in kinds):
        raise ValueError("mix needs weights over random, shared-prefix, multi-turn, structured")
    weights = np.asarray([w for _, w in spec.mix], dtype=float)
    if not np.isfinite(weights).all() or (weights < 0).any() or weights.sum() <= 0:
        raise ValueError("mix weights must be finite, >= 0 and not all 0")
    drawn = rng.choice(len(kinds), size=spec.num_requests, p=weights / weights.sum())
    out: list[Conversation] = []
    for k, kind in enumerate(kinds):
        slots = [i for i in range(spec.num_requests) if drawn[i] == k]
        if not slots:
            continue
        part = _BUILDERS[kind](replace(spec, kind=kind, num_requests=len(slots)), rng,
                               [starts[i] for i in slots])
        out += part
    return iter(sorted(out, key=lambda c: c.start_s))


# Each builder checks its arguments and draws what its requests share (a shared prefix) when
# called, then draws one conversation at a time as it is iterated (see `Workload`).
def _random(spec: WorkloadSpec, rng: np.random.Generator,
            starts: list[float]) -> Iterator[Conversation]:
    prompts = _prompts(spec, rng, spec.num_requests)

    def each() -> Iterator[Conversation]:
        for i, (ids, osl) in enumerate(prompts):
            yield Conversation(f"r{i}", starts[i], (Turn(ids, osl),), spec.ignore_eos, seed=i)
    return each()


def _structured(spec: WorkloadSpec, rng: np.random.Generator,
                starts: list[float]) -> Iterator[Conversation]:
    """Random prompts, each asking for JSON of `clients.structured.ORDER_SCHEMA`; the output
    ends when the JSON is complete (EOS is never ignored), or at `osl` tokens."""
    prompts = _prompts(spec, rng, spec.num_requests)

    def each() -> Iterator[Conversation]:
        for i, (ids, osl) in enumerate(prompts):
            yield Conversation(f"j{i}", starts[i], (Turn(ids, osl),), ignore_eos=False, seed=i,
                               constraint=structured_constraint())
    return each()


def _shared_prefix(spec: WorkloadSpec, rng: np.random.Generator,
                   starts: list[float]) -> Iterator[Conversation]:
    """Groups of users sharing one long system prompt; each asks its own question."""
    if spec.num_prefixes <= 0:
        raise ValueError("num_prefixes must be > 0")
    if spec.system_prompt_len < 0:
        raise ValueError("system_prompt_len must be >= 0")
    if spec.num_prefixes * spec.system_prompt_len > MAX_LENGTH:  # all held, drawn up front
        raise ValueError(f"the shared prefixes (num_prefixes {spec.num_prefixes} × "
                         f"system_prompt_len {spec.system_prompt_len} tokens) must total at "
                         f"most {MAX_LENGTH} tokens")
    prefixes = [_ids(rng, spec.system_prompt_len, spec.vocab_size)
                for _ in range(spec.num_prefixes)]
    per = spec.users_per_prefix or -(-spec.num_requests // spec.num_prefixes)
    prompts = _prompts(spec, rng, spec.num_requests)

    def each() -> Iterator[Conversation]:
        for i, (ids, osl) in enumerate(prompts):
            turn = Turn(prefixes[(i // per) % spec.num_prefixes] + ids, osl)
            yield Conversation(f"p{i}", starts[i], (turn,), spec.ignore_eos, seed=i)
    return each()


def _multi_turn(spec: WorkloadSpec, rng: np.random.Generator,
                starts: list[float]) -> Iterator[Conversation]:
    """Conversations of `turns` turns; each turn resends the history (see module docstring)."""
    if spec.turns <= 0:
        raise ValueError("turns must be > 0")
    if spec.turns * (spec.isl + spec.osl) > MAX_LENGTH:
        raise ValueError(f"a conversation of {spec.turns} turns of isl {spec.isl} + osl "
                         f"{spec.osl} reaches more than {MAX_LENGTH} tokens (longer than any "
                         "model's context)")
    prompts = _prompts(spec, rng, spec.num_requests * spec.turns)

    def each() -> Iterator[Conversation]:
        for i in range(spec.num_requests):
            turns = []
            for k in range(spec.turns):
                ids, osl = next(prompts)
                turns.append(Turn(ids, osl, think_time_s=spec.think_time_s if k else 0.0))
            yield Conversation(f"c{i}", starts[i], tuple(turns), spec.ignore_eos, seed=i)
    return each()


_BUILDERS = {
    "random": _random,
    "shared-prefix": _shared_prefix,
    "multi-turn": _multi_turn,
    "structured": _structured,
}
