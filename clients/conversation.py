"""What a workload is made of: conversations of turns (a single request is a one-turn
conversation), shared by the workload builders, trace replay and the load generator."""

from __future__ import annotations

from dataclasses import dataclass

# Ids below this are left to special tokens (eos, bos, ...) of any tokenizer we ship.
FIRST_ORDINARY_ID = 16


@dataclass(frozen=True)
class Turn:
    """One user message and how much to generate for it."""

    user_ids: tuple[int, ...]
    max_tokens: int
    think_time_s: float = 0.0  # after the previous turn finished, before this one is sent


@dataclass(frozen=True)
class Conversation:
    conversation_id: str
    start_s: float  # scheduled send time of the first turn, seconds from the start of the run
    turns: tuple[Turn, ...]
    ignore_eos: bool = True
    seed: int = 0  # the sampler seed of every turn
    constraint: tuple[str, str] | None = None  # structured output: (kind, text), every turn
    slo_class: str = ""  # SLO class (e.g. interactive, batch; "" untagged): sim/pools.py routes
    #                      by it and reports per class (issue 16)


def turn_prompt(
    history: tuple[int, ...], turn: Turn
) -> tuple[int, ...]:
    """The prompt of a turn: the conversation so far (prompts and outputs), then the message."""
    return history + turn.user_ids
