"""Batched decoding of concurrent generations over an abstract `Decoder`.

Each loop iteration admits new generations (one prefill each, reusing the longest cached
prefix of their prompt) and then runs ONE decode step for all active generations together:
their pasts of different lengths are left-padded into one batch with an attention mask.
Cancellation is checked before every step, so a cancelled stream stops within one step.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import deque
from collections.abc import Callable

import numpy as np

from avatar.llm.cache import PrefixCache
from avatar.llm.decoder import Decoder, Past, positions, stack_pasts, unstack_presents
from avatar.llm.sampling import Sampler
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
    cache_prefix: int = 0  # the first n prompt ids are worth caching (the system prompt)
    splitter: SentenceSplitter = dataclasses.field(default_factory=SentenceSplitter)
    generated: list[int] = dataclasses.field(default_factory=list)
    past: Past | None = None
    cached_tokens: int = 0
    submitted: float = dataclasses.field(default_factory=time.monotonic)
    first_token: float | None = None
    done: bool = False
    stopped: bool = False  # set by a stop request (another thread); ends it as "cancelled"

    @property
    def length(self) -> int:
        """Tokens in the KV cache (the last sampled token is not in it yet)."""
        return len(self.prompt) + len(self.generated) - 1


class Scheduler:
    """Runs generations on `decoder`, at most `max_batch` decode rows per step."""

    def __init__(
        self,
        decoder: Decoder,
        stop_ids: frozenset[int],
        prefix_cache: PrefixCache | None = None,
        max_batch: int = 8,
        max_context: int = 2048,
    ):
        self.decoder, self.stop_ids = decoder, stop_ids
        self.cache = prefix_cache if prefix_cache is not None else PrefixCache()
        self.max_batch, self.max_context = max_batch, max_context
        self._queue: deque[Generation] = deque()
        self._active: list[Generation] = []
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
            return not self._queue and not self._active

    def step(self) -> None:
        """Admit waiting generations (prefill) and run one batched decode step."""
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
        if self._active:
            try:
                self._decode(self._active)
            except Exception as error:  # a failing decoder fails its rows, not the server
                log.exception("decode step failed")
                for generation in self._active:
                    self._finish(generation, "error", str(error))
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

    def run_until_idle(self) -> None:
        """Drive the loop in the calling thread until every submitted generation ended."""
        while not self.idle():
            self.step()

    # ------------------------------------------------------------------ internals

    def _loop(self) -> None:
        while True:
            with self._wake:
                while not self._stopping and not self._queue and not self._active:
                    self._wake.wait()
                if self._stopping:
                    return
            self.step()

    def _guard(self, generation: Generation, action: Callable[[Generation], None]) -> None:
        try:
            action(generation)
        except Exception as error:
            log.exception("generation failed")
            self._finish(generation, "error", str(error))

    def _prefill(self, g: Generation) -> None:
        """Run the prompt (minus its cached prefix) and sample the first token."""
        if g.stopped or g.is_cancelled():
            self._finish(g, "cancelled")
            return
        n, past = self.cache.lookup(g.prompt)
        if past is None:
            past = self.decoder.layout.empty(1)
        ids = np.asarray([g.prompt[n:]], np.int64)
        mask = np.ones((1, len(g.prompt)), np.int64)
        logits, presents = self.decoder.step(ids, mask, positions(mask, ids.shape[1]), past)
        g.cached_tokens = n
        if g.cache_prefix > n:
            prefix = g.prompt[: g.cache_prefix]
            self.cache.put(prefix, [np.ascontiguousarray(p[:, :, : len(prefix)]) for p in presents])
        g.past = presents
        self._accept(g, g.sampler.choose(logits[0, -1], g.prompt))

    def _decode(self, rows: list[Generation]) -> None:
        lengths = [g.length for g in rows]
        past, past_mask = stack_pasts([g.past for g in rows], lengths)
        mask = np.concatenate([past_mask, np.ones((len(rows), 1), np.int64)], axis=1)
        ids = np.asarray([[g.generated[-1]] for g in rows], np.int64)
        logits, presents = self.decoder.step(ids, mask, positions(mask, 1), past)
        self.steps += 1
        self.batch_rows += len(rows)
        for g, row_past, row_logits in zip(
            rows, unstack_presents(presents, [n + 1 for n in lengths]), logits[:, -1], strict=True
        ):
            g.past = row_past
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
        if token in self.stop_ids:
            self._finish(g, "stop")
            return
        g.generated.append(token)
        delta = g.stream.push(token)
        if delta:
            g.emit(Event(g.splitter.push(delta)))
        if g.stream.stopped:
            self._finish(g, "stop")
        elif len(g.generated) >= g.sampler.params.max_tokens or g.length + 1 >= self.max_context:
            self._finish(g, "length")

    def _finish(self, g: Generation, reason: str, error: str = "") -> None:
        if g.done:
            return
        g.done = True
        chunks = g.splitter.push(g.stream.finish()) if reason != "error" else []
        sentence = g.splitter.flush()
        if sentence:
            chunks.append(Chunk("", sentence))
        if g.past is not None and reason in ("stop", "length") and g.generated:
            # The conversation so far, for the next turn of this session. The key is taken
            # from what the cache really holds: a generation that ends on a stop id has fed
            # its last token (unlike `length` assumes), and a key one token off would shift
            # every position of the entry. Copied: views would keep batch tensors alive.
            held = g.past[0].shape[2]
            ids = (g.prompt + g.generated)[:held]
            if len(ids) == held:
                self.cache.put(ids, [np.ascontiguousarray(p) for p in g.past])
        now = time.monotonic()
        stats = {
            "prompt_tokens": float(len(g.prompt)),
            "cached_tokens": float(g.cached_tokens),
            "completion_tokens": float(len(g.generated)),
            "ttft_ms": ((g.first_token or now) - g.submitted) * 1000,
            "total_ms": (now - g.submitted) * 1000,
        }
        if error:
            log.warning("generation ended with error: %s", error)
        g.emit(Event(chunks, reason, stats, error or None))
        g.past = None
