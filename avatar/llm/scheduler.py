"""Batched decoding of concurrent generations over a `SequenceDecoder`.

Each loop iteration admits new generations (one start step each: the decoder runs the
prompt, reusing what it has cached) and then runs ONE decode step for all active
generations together. The decoder keeps every sequence's KV cache (Triton's sequence
batching with implicit state, avatar/llm/sequences.py), so a step sends one token id per
generation and gets logits back. A finished generation's sequence is closed by an `end`
step in the next batch, which also feeds its last token (the cached conversation then
ends where the next turn's prompt continues). Cancellation is checked before every step,
so a cancelled stream stops within one step.

A generation with a `Choice` (avatar.llm.grounding's candidates) is decoded as several
candidates of its first sentence, side by side in the same decode steps: the extra ones
start on the same prompt (the decoder's prefix cache holds it, so each runs one token;
Triton batches their equal shapes) and sample with their own seeds. Their text is held
until every one has said its first sentence (a candidate that has waits, out of the
batch); the one `Choice.score` rates highest then streams what it held and goes on, and
the others are released. Candidates only take rows the batch has free.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import logging
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable

from avatar.errors import RequestError, StageError
from avatar.llm.sampling import Sampler
from avatar.llm.sequences import SequenceDecoder, Step
from avatar.llm.stream import Chunk, SentenceSplitter, TextStream
from avatar.sentences import sentence_end, spoken_text

log = logging.getLogger(__name__)
# a candidate that has not ended its first sentence after this many tokens is judged on them
FIRST_SENTENCE_TOKENS = 48


@dataclasses.dataclass
class Event:
    """What a generation reports: text chunks, and at the end a finish reason + stats."""

    chunks: list[Chunk]
    finish_reason: str | None = None  # "stop" | "length" | "cancelled" | "error"
    stats: dict[str, float] | None = None
    error: str | None = None  # with finish_reason "error"


@dataclasses.dataclass(frozen=True)
class Choice:
    """Decode `count` candidates of a reply's first sentence and go on with the one that
    `score` (its first sentence -> agreement with the sources) rates highest; ties go to
    the earliest. `sampler(i)` and `stream()` make the i-th extra candidate's (i >= 1)."""

    count: int
    sampler: Callable[[int], Sampler]
    stream: Callable[[], TextStream]
    score: Callable[[list[str]], list[float]]
    # choose once each has its first piece for TTS (a first clause may be one: the
    # splitter's first_clause_words), not its whole first sentence
    first_piece: bool = False


@dataclasses.dataclass(eq=False)
class _Candidates:
    """The candidates of one reply while their first sentences are decoded."""

    members: list[Generation]
    score: Callable[[list[str]], list[float]]


@dataclasses.dataclass(eq=False)
class Generation:
    """One sequence being generated. `emit` is called from the scheduler thread."""

    prompt: list[int]
    sampler: Sampler
    stream: TextStream
    emit: Callable[[Event], None]
    is_cancelled: Callable[[], bool] = lambda: False
    splitter: SentenceSplitter = dataclasses.field(default_factory=SentenceSplitter)
    generated: list[int] = dataclasses.field(default_factory=list)
    sequence_id: int = 0  # set on admission
    fed: int = 0  # tokens in the decoder's cache for this sequence
    next_token: int | None = None  # sampled, not yet fed
    cached_tokens: int | None = None
    submitted: float = dataclasses.field(default_factory=time.monotonic)
    first_token: float | None = None
    done: bool = False
    stopped: bool = False  # set by a stop request (another thread); ends it as "cancelled"
    choice: Choice | None = None  # decode candidates of the first sentence
    # while it is one of several candidates: its events, held until the choice
    held: list[Event] | None = None
    said: str = ""  # its text so far, while a candidate
    ready: bool = False  # a candidate that has said its first sentence (it waits)
    pending_end: Step | None = None  # the end step of a candidate that finished
    chosen: dict[str, float] = dataclasses.field(default_factory=dict)  # for its stats


class Scheduler:
    """Runs generations on `decoder`, at most `max_batch` decode rows per step."""

    def __init__(
        self,
        decoder: SequenceDecoder,
        stop_ids: frozenset[int],
        max_batch: int = 8,
        max_context: int = 2048,
    ):
        self.decoder, self.stop_ids = decoder, stop_ids
        self.max_batch, self.max_context = max_batch, max_context
        self._queue: deque[Generation] = deque()
        self._active: list[Generation] = []
        self._closing: list[Step] = []  # end steps of finished sequences, for the next batch
        # random start: sequence ids must not collide with another instance's on one decoder
        self._ids = itertools.count(secrets.randbits(48) + 1)
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.steps = 0
        self.batch_rows = 0  # sum of batch sizes over steps: mean batch = rows / steps
        self._candidates: list[_Candidates] = []  # undecided
        self._started: list[Generation] = []  # extra candidates started by this step
        self._room = 0  # decode rows free for extra candidates in this step

    # ------------------------------------------------------------------ public API

    def submit(self, generation: Generation) -> None:
        with self._wake:
            self._queue.append(generation)
            self._wake.notify()

    @property
    def threaded(self) -> bool:
        return self._thread is not None

    def idle(self) -> bool:
        with self._wake:
            return self.idle_locked()

    def idle_locked(self) -> bool:
        return not self._queue and not self._active and not self._closing

    def step(self) -> None:
        """Admit waiting generations (start steps) and run one batched decode step."""
        with self._wake:
            room = self.max_batch - len(self._active)
            admitted = [self._queue.popleft() for _ in range(min(room, len(self._queue)))]
        self._room = room - len(admitted) - len(self._queue)
        for generation in admitted:
            self._guard(generation, self._prefill)
        self._active = [g for g in self._active + admitted + self._started if not g.done]
        self._started = []
        for generation in self._active:
            if generation.stopped or generation.is_cancelled():
                self._finish(generation, "cancelled")
        self._active = [g for g in self._active if not g.done]
        # end steps ride along in the batch (at least one per step, so none waits long)
        room = max(1, self.max_batch - len(self._active))
        closing, self._closing = self._closing[:room], self._closing[room:]
        rows = [g for g in self._active if not g.ready]  # ready candidates wait
        if rows or closing:
            try:
                self._decode(rows, closing)
            except Exception as error:  # a failing decoder fails its rows, not the server
                _log_failure("decode step failed", error)
                for generation in rows:
                    self._finish(generation, "error", str(error))
                for step in closing:
                    self.decoder.release(step.sequence_id)
        self._choose()
        self._active = [g for g in self._active if not g.done]

    def start(self) -> None:
        """Serve from a background thread until `stop()`."""
        self._thread = threading.Thread(target=self._loop, name="llm-scheduler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the loop; every generation still waiting or running ends with a final
        "error" event, so that its stream is closed rather than left open."""
        with self._wake:
            self._stopping = True
            self._wake.notify()
        if self._thread:
            self._thread.join(timeout=30)
        with self._wake:
            left = [*self._queue, *self._active]
            self._queue.clear()
            self._active = []
        for generation in left:
            self._finish(generation, "error", "the llm model is shutting down")
        self._choose()
        for step in self._closing:
            self.decoder.release(step.sequence_id)
        self._closing = []

    def run_until_idle(self) -> None:
        """Drive the loop in the calling thread until every submitted generation ended."""
        while not self.idle():
            self.step()

    # ------------------------------------------------------------------ internals

    def _loop(self) -> None:
        while True:
            with self._wake:
                while not self._stopping and self.idle_locked():
                    self._wake.wait()
                if self._stopping:
                    return
            self.step()

    def _guard(self, generation: Generation, action: Callable[[Generation], None]) -> None:
        try:
            action(generation)
        except Exception as error:
            _log_failure("generation failed", error)
            self._finish(generation, "error", str(error))

    def _prefill(self, g: Generation) -> None:
        """Start the sequence with the whole prompt and sample the first token."""
        if g.stopped or g.is_cancelled():
            self._finish(g, "cancelled")
            return
        g.sequence_id = next(self._ids)
        try:
            (logits,) = self.decoder.run([Step(g.sequence_id, g.prompt, 0, start=True)])
        except Exception:
            self.decoder.release(g.sequence_id)
            raise
        g.fed = len(g.prompt)
        g.cached_tokens = self.decoder.cached_tokens(g.sequence_id)
        if g.choice is not None and g.choice.count > 1 and self._room > 0:
            self._start_candidates(g, min(g.choice.count - 1, self._room))
        self._accept(g, g.sampler.choose(logits, g.prompt))

    def _start_candidates(self, lead: Generation, extra: int) -> None:
        """Start `extra` more candidates of `lead` on its prompt (which the decoder has
        just run: it caches it) and sample their first tokens; the lead becomes one."""
        assert lead.choice is not None
        siblings = [
            Generation(
                prompt=lead.prompt,
                sampler=lead.choice.sampler(i),
                stream=lead.choice.stream(),
                emit=lead.emit,
                is_cancelled=lead.is_cancelled,
                splitter=copy.deepcopy(lead.splitter),  # not yet fed: the same settings
                sequence_id=next(self._ids),
                submitted=lead.submitted,
                choice=lead.choice,
            )
            for i in range(1, extra + 1)
        ]
        try:
            starts = [Step(s.sequence_id, s.prompt, 0, start=True) for s in siblings]
            logits = self.decoder.run(starts)
        except Exception as error:  # the reply goes on alone
            _log_failure("candidates failed to start", error)
            for sibling in siblings:
                self.decoder.release(sibling.sequence_id)
            return
        self._room -= extra
        group = _Candidates([lead, *siblings], lead.choice.score)
        for member in group.members:
            member.held = []
        self._candidates.append(group)
        for sibling, row in zip(siblings, logits, strict=True):
            sibling.fed = len(sibling.prompt)
            sibling.cached_tokens = self.decoder.cached_tokens(sibling.sequence_id)
            self._guard(sibling, lambda g, lg=row: self._accept(g, g.sampler.choose(lg, g.prompt)))
        self._started += siblings

    def _choose(self) -> None:
        """For every reply whose candidates have all said their first sentence (or ended):
        the one with the highest score streams what it held and goes on; the others are
        released without a word."""
        waiting = []
        for group in self._candidates:
            if not all(m.ready or m.done for m in group.members):
                waiting.append(group)
                continue
            failed = [bool(m.held) and m.held[-1].finish_reason == "error" for m in group.members]
            try:
                scores = group.score([m.said for m in group.members])
            except Exception as error:  # the first candidate goes on
                _log_failure("candidates could not be scored", error)
                scores = [0.0] * len(group.members)
            ranked = [
                float("-inf") if bad else score for bad, score in zip(failed, scores, strict=True)
            ]
            best = max(range(len(ranked)), key=lambda i: (ranked[i], -i))
            for i, member in enumerate(group.members):
                held, member.held, member.ready = member.held or [], None, False
                if i != best:
                    self._drop(member)
                    continue
                member.chosen = {"candidates": float(len(group.members)), "chosen": float(i)}
                if member.pending_end is not None:
                    self._closing.append(member.pending_end)
                if held and held[-1].finish_reason is not None:
                    held[-1].stats = {**(held[-1].stats or {}), **member.chosen}
                for event in held:
                    member.emit(event)
        self._candidates = waiting

    def _drop(self, g: Generation) -> None:
        """A candidate not chosen: its sequence is released, nothing of it is said."""
        if not g.done:
            g.done = True
            self.decoder.release(g.sequence_id)
        elif g.pending_end is not None:
            self.decoder.release(g.pending_end.sequence_id)
        g.pending_end = None

    def _decode(self, rows: list[Generation], closing: list[Step]) -> None:
        steps = [Step(g.sequence_id, [g.next_token], g.fed) for g in rows]
        logits = self.decoder.run([*steps, *closing])
        self.steps += 1
        self.batch_rows += len(steps) + len(closing)
        for g, row_logits in zip(rows, logits, strict=False):
            g.fed += 1
            self._guard(
                g,
                lambda g, lg=row_logits: self._accept(
                    g, g.sampler.choose(lg, g.prompt + g.generated)
                ),
            )

    def _accept(self, g: Generation, token: int) -> None:
        """Record a sampled token, stream its text, and end the generation when due."""
        if g.first_token is None:
            g.first_token = time.monotonic()
        g.next_token = token
        if token in self.stop_ids:
            self._finish(g, "stop")
            return
        g.generated.append(token)
        delta = g.stream.push(token)
        pieces = g.splitter.push(delta) if delta else []
        if pieces:
            self._send(g, Event(pieces))
        if g.held is not None:
            g.said += delta
            self._check_ready(g, pieces)
        if g.stream.stopped:
            self._finish(g, "stop")
        elif len(g.generated) >= g.sampler.params.max_tokens or g.fed + 1 >= self.max_context:
            self._finish(g, "length")

    def _finish(self, g: Generation, reason: str, error: str = "") -> None:
        if g.done:
            return
        g.done = True
        chunks = g.splitter.push(g.stream.finish()) if reason != "error" else []
        sentence = g.splitter.flush()
        if sentence:
            chunks.append(Chunk("", sentence))
        end = None
        if g.fed and reason != "error" and g.next_token is not None:
            # the end step feeds the last sampled token, so the decoder's cached
            # conversation ends where the session's next prompt goes on
            end = Step(g.sequence_id, [g.next_token], g.fed, end=True)
        elif g.fed:
            self.decoder.release(g.sequence_id)
        if g.held is None and end is not None:
            self._closing.append(end)
        else:
            g.pending_end = end  # a candidate: ended if it is chosen, else released
        now = time.monotonic()
        stats = {
            "prompt_tokens": float(len(g.prompt)),
            "completion_tokens": float(len(g.generated)),
            "ttft_ms": ((g.first_token or now) - g.submitted) * 1000,
            "total_ms": (now - g.submitted) * 1000,
        }
        if g.cached_tokens is not None:
            stats["cached_tokens"] = float(g.cached_tokens)
        stats.update(g.chosen)
        if error:
            log.warning("generation ended with error: %s", error)
        self._send(g, Event(chunks, reason, stats, error or None))

    @staticmethod
    def _check_ready(g: Generation, pieces: list[Chunk]) -> None:
        """A candidate is judged once it said its first sentence (or piece, or enough)."""
        if g.choice is not None and g.choice.first_piece:
            said = any(c.sentence and spoken_text(c.sentence) for c in pieces)
        else:
            cut = sentence_end(g.said)
            said = bool(cut and spoken_text(g.said[:cut]))
        g.ready = g.ready or said or len(g.generated) >= FIRST_SENTENCE_TOKENS

    @staticmethod
    def _send(g: Generation, event: Event) -> None:
        """Emit, or hold while the generation is one of several candidates."""
        if g.held is not None:
            g.held.append(event)
        else:
            g.emit(event)


def _log_failure(what: str, error: Exception) -> None:
    """A callee's refusal (StageError: e.g. the decoder model is still loading) is logged
    as its message; anything else with its traceback (a bug here)."""
    if isinstance(error, StageError | RequestError):
        log.warning("%s: %s", what, error)
    else:
        log.exception(what)
