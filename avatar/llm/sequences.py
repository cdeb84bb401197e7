"""Decoders that keep each sequence's KV cache themselves: the contract of Triton's sequence
batcher with implicit state, which `llm_decoder` is served under.

A generation is one sequence (a correlation id). Its first step (`start`) carries the whole
prompt, later steps one token each; the decoder keeps the KV cache between steps, so a step
sends token ids and receives logits, never the cache. The step flagged `end` releases the
sequence (its ids are still run: that is how a final token joins the cache). A sequence
idle for longer than `idle_timeout_s` is dropped, as the sequence batcher's
`max_sequence_idle_microseconds` does.

`KvCacheSequences` implements the contract over a stateless `Decoder` step: in-process for
the engine's own tests and benchmarks, and inside the embedded `llm_decoder` runner
(avatar/triton/sequence_runner.py), so both serve the same code. It batches the steps of
concurrent sequences by left-padding their caches (mask 0 on the padding) and keeps a
prefix cache: a started sequence reuses the KV of the longest prompt prefix it has seen
start or end, so the persona, a session's earlier turns and a prompt started again (a
reply's candidates, avatar/llm/scheduler.py) are not run again.
"""

from __future__ import annotations

import abc
import dataclasses
import time
from collections.abc import Sequence

import numpy as np

from avatar.errors import RequestError
from avatar.held_sequences import HeldSequences
from avatar.llm.cache import PrefixCache
from avatar.llm.decoder import Decoder, Past, positions, stack_pasts, unstack_presents


@dataclasses.dataclass(frozen=True)
class Step:
    """One sequence's part of a decode step.

    ids: the new token ids (the whole prompt when `start`); position: tokens already in
    the sequence's cache before this step (0 when `start`).
    """

    sequence_id: int
    ids: Sequence[int]
    position: int = 0
    start: bool = False
    end: bool = False


class SequenceDecoder(abc.ABC):
    """A decoder step over sequences whose KV caches the decoder holds."""

    @abc.abstractmethod
    def run(self, steps: Sequence[Step]) -> list[np.ndarray]:
        """Logits [V] of the last position of each step, in order. A step that fails
        raises for the whole call (the caller fails those sequences)."""

    def cached_tokens(self, sequence_id: int) -> int | None:
        """Prompt tokens the sequence's start took from a cache (None: not known here)."""
        return None

    def release(self, sequence_id: int) -> None:  # noqa: B027 - optional, idle timeout frees
        """Forget a sequence that will get no `end` step (e.g. after a failed step)."""


@dataclasses.dataclass
class _Held:
    ids: list[int]  # the token ids whose KV `past` holds
    past: Past  # 2L arrays [1, H, len(ids), D]
    touched: float
    cached: int = 0


class KvCacheSequences(HeldSequences, SequenceDecoder):
    """The sequence contract over a stateless decoder step, thread-safe."""

    def __init__(
        self,
        decoder: Decoder,
        prefix_cache: PrefixCache | None = None,
        idle_timeout_s: float = 60.0,
        max_sequences: int = 64,
    ):
        super().__init__(idle_timeout_s, max_sequences)
        self.decoder = decoder
        self.cache = prefix_cache if prefix_cache is not None else PrefixCache(0)

    def check(self, step: Step) -> None:
        """Raise RequestError saying what is wrong with a step, before any is run."""
        if step.start:
            if not len(step.ids) or step.position:
                raise RequestError(
                    f"sequence {step.sequence_id}: a start step carries the whole prompt "
                    f"(got {len(step.ids)} ids after {step.position} past positions)"
                )
            self._check_room(step.sequence_id)
            return
        entry = self._held_state(step.sequence_id)
        if len(step.ids) != 1 or step.position != len(entry.ids):
            raise RequestError(
                f"sequence {step.sequence_id}: a step after the start takes one token at "
                f"position {len(entry.ids)}, got {len(step.ids)} at position {step.position}"
            )

    def run(self, steps: Sequence[Step]) -> list[np.ndarray]:
        self._drop_idle()
        self._check_distinct([s.sequence_id for s in steps])
        for step in steps:
            self.check(step)
        logits: dict[int, np.ndarray] = {}
        for step in steps:
            if step.start:
                logits[step.sequence_id] = self._start(step)
        rest = [s for s in steps if not s.start]
        if rest:
            logits.update(zip([s.sequence_id for s in rest], self._continue(rest), strict=True))
        for step in steps:
            if step.end:
                self._end(step.sequence_id)
        return [logits[s.sequence_id] for s in steps]

    def cached_tokens(self, sequence_id: int) -> int | None:
        held = self._held.get(sequence_id)
        return held.cached if held else None

    # ------------------------------------------------------------------ internals

    def _start(self, step: Step) -> np.ndarray:
        prompt = [int(i) for i in step.ids]
        n, past = self.cache.lookup(prompt)
        if past is None:
            past = self.decoder.layout.empty(1)
        new = np.asarray([prompt[n:]], np.int64)
        mask = np.ones((1, len(prompt)), np.int64)
        logits, presents = self.decoder.step(new, mask, positions(mask, new.shape[1]), past)
        with self._lock:
            self._held[step.sequence_id] = _Held(prompt, presents, time.monotonic(), n)
        # another sequence started on the same prompt (a reply's extra candidates, a
        # repeated turn) runs only its last token
        self.cache.put(prompt, presents)
        return logits[0, -1]

    def _continue(self, steps: Sequence[Step]) -> list[np.ndarray]:
        held = [self._held[step.sequence_id] for step in steps]  # checked in run()
        lengths = [len(h.ids) for h in held]
        past, past_mask = stack_pasts([h.past for h in held], lengths)
        mask = np.concatenate([past_mask, np.ones((len(held), 1), np.int64)], axis=1)
        new = np.asarray([list(s.ids) for s in steps], np.int64)
        logits, presents = self.decoder.step(new, mask, positions(mask, 1), past)
        now = time.monotonic()
        rows = unstack_presents(presents, [n + 1 for n in lengths])
        for h, step, row in zip(held, steps, rows, strict=True):
            h.ids.append(int(step.ids[0]))
            h.past, h.touched = row, now
        return list(logits[:, -1])

    def _end(self, sequence_id: int) -> None:
        """Release the sequence; its conversation so far joins the prefix cache (copied:
        views would keep whole batch tensors alive)."""
        with self._lock:
            held = self._held.pop(sequence_id, None)
        if held is not None and held.ids:
            self.cache.put(held.ids, [np.ascontiguousarray(p) for p in held.past])
