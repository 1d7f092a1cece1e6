"""Structured output: regex, JSON-schema, choice and Lark-grammar constraints via llguidance.

Contract:
- ``ConstraintCompiler.start(spec, max_bytes)`` validates and compiles a `Constraint` against
  the deployment's tokenizer and returns a fresh per-request `ConstraintState`, or raises
  `InvalidRequest` naming the problem (too large, empty choice list, a regex, schema or grammar
  that does not compile). Compiled grammars are cached by (kind, text): a request copies the
  cached matcher, so a repeated schema is compiled once.
- ``ConstraintState`` follows the output tokens of one request. ``next_token(r, closing)`` is
  the constrained sampler: a token the grammar allows, a pure function of the matcher state
  (itself a function of the output so far), the mock model's hash ``r`` and ``closing``.
  Forced tokens ("fast-forward": the grammar admits exactly one continuation) come out one at
  a time in the order llguidance computed them; ``forced_run(room)`` instead takes the whole
  forced run at once (jump-forward). Both paths yield the same token sequence, so jump-forward
  on and off produce identical output.
- When the grammar is complete (``done``) the only allowed token is EOS; with jump-forward the
  EOS is part of the forced run.
- JSON schemas compile to compact JSON (no optional whitespace, as SGLang's default
  separators): fixed keys and punctuation are then forced, which is what jump-forward saves.
"""

from __future__ import annotations

import functools
import json
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from server.engine.errors import InvalidRequest
from server.engine.interface import Constraint
from server.engine.tokenizer import Tokenizer

if TYPE_CHECKING:  # imported where a constraint is first compiled: most runs have none
    import llguidance

CACHE_SIZE = 256  # compiled grammars kept per tokenizer (LRU)
MAX_DEPTH = 64  # default max_grammar_depth: nesting levels a constraint may have
_ERROR_CHARS = 300  # llguidance messages can quote the whole grammar; keep the head
_CLOSERS = (b"}", b"]", b'"', b")", b",")  # preferred, in order, when the sampler wraps up
_JSON_OPTIONS = {"whitespace_flexible": False}
_NARROW = 16  # a closer is taken only if at most this many tokens may follow it


@dataclass(frozen=True)
class _Vocab:
    """What the sampler needs to know about the vocabulary, computed once per tokenizer."""

    eos: int
    closers: tuple[int, ...]  # single-token closers in preference order
    punct: np.ndarray  # bool per id: the token is only ASCII punctuation
    whole: np.ndarray  # bool per id: a normal token (complete UTF-8 on its own)


def _vocab(tok: Tokenizer) -> _Vocab:
    by_bytes = {tok.token_bytes(i): i for i in range(tok.vocab_size)
                if i not in tok.special_token_ids}
    punct = np.zeros(tok.vocab_size, dtype=bool)
    for b, i in by_bytes.items():
        punct[i] = bool(b) and all(33 <= c < 127 and not chr(c).isalnum() for c in b)
    closers = tuple(by_bytes[c] for c in _CLOSERS if c in by_bytes)
    whole = np.zeros(tok.vocab_size, dtype=bool)
    whole[tok.normal_token_ids] = True
    return _Vocab(tok.eos_token_id, closers, punct, whole)


class ConstraintState:
    """One request's grammar state. Written by the engine loop only."""

    __slots__ = ("_pending", "_vocab", "matcher")

    def __init__(self, matcher: llguidance.LLMatcher, vocab: _Vocab) -> None:
        self.matcher = matcher
        self._vocab = vocab
        self._pending: deque[int] = deque()  # the rest of a forced run, not yet emitted

    @property
    def done(self) -> bool:
        """The grammar admits no more text (or failed): only EOS may follow."""
        return self.matcher.is_stopped()

    def allowed(self) -> np.ndarray:
        """Ids the grammar allows next, ascending (EOS alone when the grammar is done)."""
        if self.done:
            return np.array([self._vocab.eos])
        mask = np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8)
        bits = np.unpackbits(mask, bitorder="little")[: self._vocab.punct.size]
        ids = np.flatnonzero(bits)
        return ids if ids.size else np.array([self._vocab.eos])

    def _forced(self) -> deque[int]:
        if not self._pending and not self.done:
            self._pending.extend(self.matcher.compute_ff_tokens())
        return self._pending

    def _consume(self, token: int) -> None:
        if not self.done or token != self._vocab.eos:
            self.matcher.consume_token(token)

    def next_token(self, r: int, closing: bool) -> int:
        """The sampled token: the next forced token if any, else one the grammar allows.

        ``closing`` (the mock model winding the output down) prefers EOS, then a closing
        punctuation token that leaves the grammar at a structural spot (one token of
        lookahead), then any punctuation; otherwise a uniform pick by ``r`` among the allowed
        tokens that are whole characters (``Tokenizer.normal_token_ids``; a UTF-8 fragment only
        when the grammar allows nothing else, EOS only when nothing at all)."""
        forced = self._forced()
        token = forced.popleft() if forced else self._choose(self.allowed(), r, closing)
        self._consume(token)
        return token

    def _choose(self, ids: np.ndarray, r: int, closing: bool) -> int:
        v = self._vocab
        eos_ok = bool(np.any(ids == v.eos))
        if closing:
            if eos_ok:
                return v.eos
            allowed = set(ids.tolist())
            for c in v.closers:  # a closer that really closes: few tokens may follow it
                if c in allowed and self._narrow_after(c):
                    return c
            punct = ids[v.punct[ids]]
            if punct.size:
                return int(punct[r % punct.size])
        free = ids[ids != v.eos]
        whole = free[v.whole[free]]  # a UTF-8 fragment only where the grammar allows no other
        if whole.size:
            free = whole
        return int(free[r % free.size]) if free.size else v.eos

    def _narrow_after(self, token: int) -> bool:
        """Would `token` leave the grammar in a structural spot (at most `_NARROW` tokens
        allowed next) rather than in free text? E.g. `"` inside a JSON string, not `}`."""
        m = self.matcher
        if not m.consume_token(token):
            return False
        narrow = m.is_stopped() or int(np.unpackbits(
            np.frombuffer(m.compute_bitmask(), dtype=np.uint8)).sum()) <= _NARROW
        m.rollback(1)
        return narrow

    def forced_run(self, room: int) -> list[int]:
        """Jump-forward: every token the grammar now forces (EOS too once it is complete), at
        most ``room`` of them, consumed at once."""
        run: list[int] = []
        while len(run) < room:
            forced = self._forced()
            if not forced:
                break
            token = forced.popleft()
            self._consume(token)
            run.append(token)
        if len(run) < room and self.done:
            run.append(self._vocab.eos)
        return run


class ConstraintCompiler:
    """Compiles constraints for one tokenizer; `start()` is what intake calls."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self._lltok: llguidance.LLTokenizer | None = None
        self._vocab: _Vocab | None = None
        self._cache: OrderedDict[tuple[str, str], llguidance.LLMatcher | str] = OrderedDict()

    def _setup(self) -> tuple[llguidance.LLTokenizer, _Vocab]:
        if self._lltok is None or self._vocab is None:  # lazily: most deployments never need it
            import llguidance

            tok = self.tokenizer
            self._lltok = llguidance.LLTokenizer(tok.to_json(), n_vocab=tok.vocab_size,
                                                 eos_token=tok.eos_token_id)
            self._vocab = _vocab(tok)
        return self._lltok, self._vocab

    def start(self, spec: Constraint, max_bytes: int,
              max_depth: int = MAX_DEPTH) -> ConstraintState:
        """A fresh state for one request, or InvalidRequest saying what is wrong."""
        text = spec.key_text()
        size = len(text.encode())
        if size > max_bytes:
            raise InvalidRequest(f"{spec.kind} constraint is {size} bytes; this deployment "
                                 f"accepts at most {max_bytes} (max_grammar_bytes)")
        if (depth := nesting(text, "" if spec.kind == "regex" else "\"'")) > max_depth:
            raise InvalidRequest(f"{spec.kind} constraint nests {depth} levels deep; this "
                                 f"deployment accepts at most {max_depth} (max_grammar_depth)")
        if spec.kind == "choice" and not spec.choices:
            raise InvalidRequest("choice constraint needs at least one choice")
        if spec.kind != "choice" and not text.strip():
            raise InvalidRequest(f"{spec.kind} constraint is empty")
        lltok, vocab = self._setup()
        key = (spec.kind, text)
        compiled = self._cache.get(key)
        if compiled is None:
            compiled = _compile(lltok, spec)
            self._cache[key] = compiled
            if len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(key)
        if isinstance(compiled, str):
            raise InvalidRequest(compiled)
        return ConstraintState(compiled.deep_copy(), vocab)

    @property
    def cache_size(self) -> int:
        return len(self._cache)


def nesting(text: str, quotes: str = "\"'") -> int:
    """The deepest nesting of (), [] and {} in `text`, outside string literals (`quotes`; a
    backslash escapes the next character) — counted without recursion, so a hostile
    constraint is refused before a parser recurses through it."""
    depth = deepest = 0
    quote = ""
    escaped = False
    for ch in text:
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif quote:
            if ch == quote:
                quote = ""
        elif ch in quotes:
            quote = ch
        elif ch in "([{":
            depth += 1
            if depth > deepest:
                deepest = depth
        elif ch in ")]}":
            depth -= 1
    return deepest


def _grammar(spec: Constraint) -> str:
    """The llguidance grammar of a constraint; ValueError when it cannot even be read."""
    import llguidance

    if spec.kind == "regex":
        return llguidance.LLMatcher.grammar_from_regex(spec.text)
    if spec.kind == "json_schema":
        try:
            schema = json.loads(spec.text)
        except json.JSONDecodeError as e:
            raise ValueError(f"not valid JSON: {e}") from e
        except RecursionError as e:  # deeper than Python's parser goes
            raise ValueError("the schema nests too deeply") from e
        if not isinstance(schema, dict | bool):
            raise ValueError("a JSON schema must be an object or a boolean")
        return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=_JSON_OPTIONS)
    if spec.kind == "choice":
        return llguidance.grammar_from("choice", json.dumps(list(spec.choices)))
    if spec.kind == "grammar":
        return llguidance.grammar_from("grammar", spec.text)  # Lark, or GBNF converted to Lark
    raise ValueError(f"unknown constraint kind {spec.kind!r}")


def _compile(lltok: llguidance.LLTokenizer, spec: Constraint) -> llguidance.LLMatcher | str:
    """A matcher in its start state, or the error message for the client."""
    import llguidance

    try:
        grammar = _grammar(spec)
    except ValueError as e:
        return _message(spec, str(e))
    matcher = llguidance.LLMatcher(lltok, grammar, log_level=0)
    if matcher.is_error():
        return _message(spec, matcher.get_error())
    return matcher


def _message(spec: Constraint, error: str) -> str:
    error = " ".join(error.split())
    if len(error) > _ERROR_CHARS:
        error = error[:_ERROR_CHARS] + "…"
    return f"{spec.kind} constraint does not compile: {error}"


@functools.cache
def compiler_for(tokenizer: Tokenizer) -> ConstraintCompiler:
    """The compiler (and its grammar cache) shared by every deployment using `tokenizer`."""
    return ConstraintCompiler(tokenizer)
