"""Batched decoding of concurrent generations over a `SequenceDecoder`.

Each loop iteration admits new generations (one start step each: the decoder runs the
prompt, reusing what it has cached) and then runs ONE decode step for all active
generations together. The decoder keeps every sequence's KV cache (Triton's sequence
batching with implicit state, avatar/llm/sequences.py), so a step sends one token id per
generation and gets logits back. A finished generation's sequence is closed by an `end`
step in the next batch, which also feeds its last token (the cached conversation then
ends where the next turn's prompt continues). Cancellation is checked before every step,
so a cancelled stream stops within one step.
"""

from __future__ import annotations

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

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Event:
    """What a generation reports: text chunks, and at the end a finish reason + stats."""

    chunks: list[Chunk]
    finish_reason: str | None = None  # "stop" | "length" | "cancelled" | "error"
    stats: dict[str, float] | None = None
    error: str | None = None  # with finish_reason "error"


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
        for generation in admitted:
            self._guard(generation, self._prefill)
        self._active = [g for g in self._active + admitted if not g.done]
        for generation in self._active:
            if generation.stopped or generation.is_cancelled():
                self._finish(generation, "cancelled")
        self._active = [g for g in self._active if not g.done]
        # end steps ride along in the batch (at least one per step, so none waits long)
        room = max(1, self.max_batch - len(self._active))
        closing, self._closing = self._closing[:room], self._closing[room:]
        if self._active or closing:
            try:
                self._decode(self._active, closing)
            except Exception as error:  # a failing decoder fails its rows, not the server
                _log_failure("decode step failed", error)
                for generation in self._active:
                    self._finish(generation, "error", str(error))
                for step in closing:
                    self.decoder.release(step.sequence_id)
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
        self._accept(g, g.sampler.choose(logits, g.prompt))

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
        if delta:
            g.emit(Event(g.splitter.push(delta)))
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
        if g.fed and reason != "error" and g.next_token is not None:
            # the end step feeds the last sampled token, so the decoder's cached
            # conversation ends where the session's next prompt goes on
            self._closing.append(Step(g.sequence_id, [g.next_token], g.fed, end=True))
        elif g.fed:
            self.decoder.release(g.sequence_id)
        now = time.monotonic()
        stats = {
            "prompt_tokens": float(len(g.prompt)),
            "completion_tokens": float(len(g.generated)),
            "ttft_ms": ((g.first_token or now) - g.submitted) * 1000,
            "total_ms": (now - g.submitted) * 1000,
        }
        if g.cached_tokens is not None:
            stats["cached_tokens"] = float(g.cached_tokens)
        if error:
            log.warning("generation ended with error: %s", error)
        g.emit(Event(chunks, reason, stats, error or None))


def _log_failure(what: str, error: Exception) -> None:
    """A callee's refusal (StageError: e.g. the decoder model is still loading) is logged
    as its message; anything else with its traceback (a bug here)."""
    if isinstance(error, StageError | RequestError):
        log.warning("%s: %s", what, error)
    else:
        log.exception(what)
