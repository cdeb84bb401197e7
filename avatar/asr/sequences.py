"""Whisper decoder steps whose caches stay with the decoder: the contract `asr_decoder` is
served under (Triton's sequence batcher with implicit state, config.pbtxt).

One window of audio is one sequence (a correlation id). Its START step carries the window's
cross-attention K/V (`encoder_kv`, computed once by the encoder) with the first tokens; every
later step carries only new token ids and gets the logits of the last position back. The
cross-attention K/V (7 MB for a 3-s question, 37 MB for a 30-s window) and the growing
self-attention cache never cross the BLS boundary again. The step flagged END frees the
sequence; so does `idle_timeout_s` without a step.

`WhisperSequences` keeps the caches for the embedded runner (avatar/triton/whisper_runner.py)
and runs a stateless decoder step (`WhisperRuntime.decode` over the exported step graph).
Steps of sequences with equal shapes run as one call. The rows of one lockstep batch stay
together as one `_Rows` block, so a step of the same rows feeds the block as it is: nothing
is copied unless the set of rows changes (a row ended, or rows of other requests join).

`SequenceWindows` is the caller's side (`WhisperRuntime.decoding` of a runtime that talks
to such a decoder): it numbers the rows' sequences, sends `encoder_kv` once, and ends a
finished row on the next step its batch takes anyway.
"""

from __future__ import annotations

import abc
import dataclasses
import itertools
import os
import time
from collections.abc import Callable, Sequence

import numpy as np

from avatar.asr.greedy import WindowDecoding
from avatar.errors import RequestError
from avatar.held_sequences import HeldSequences

TEXT_CONTEXT = 448  # Whisper's decoder positions (n_text_ctx)
StatelessStep = Callable[[np.ndarray, np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]


@dataclasses.dataclass(frozen=True)
class WindowStep:
    """One sequence's part of a decoder step. tokens [n] int64; encoder_kv [2L, H, positions,
    Dh] float32 on the START step only."""

    sequence_id: int
    tokens: np.ndarray
    encoder_kv: np.ndarray | None = None
    start: bool = False
    end: bool = False


@dataclasses.dataclass(eq=False)
class _Rows:
    """The caches of sequences that took their last step together, one row each."""

    cross_kv: np.ndarray  # [rows, 2L, H, positions, Dh]
    self_kv: np.ndarray  # [rows, 2L, H, past, Dh]


@dataclasses.dataclass
class _Held:
    rows: _Rows
    row: int
    touched: float


class WhisperSequences(HeldSequences):
    """The sequence contract over a stateless decoder step, thread-safe.

    kv_shape: (2L, H, Dh) of the cross-attention K/V the model takes; vocab: its logits'
    size (token ids must be below it)."""

    def __init__(
        self,
        step: StatelessStep,
        kv_shape: tuple[int, int, int],
        vocab: int,
        idle_timeout_s: float = 5.0,
        max_sequences: int = 64,
    ):
        super().__init__(idle_timeout_s, max_sequences)
        self._step, self.kv_shape, self.vocab = step, tuple(kv_shape), vocab

    def check(self, step: WindowStep) -> None:
        """Raise RequestError saying what is wrong with a step, before any is run."""
        name = f"sequence {step.sequence_id}"
        tokens = step.tokens
        if tokens.ndim != 1 or not tokens.size:
            raise RequestError(f"{name}: tokens must be [n] token ids, n >= 1; got {tokens.shape}")
        if tokens.min() < 0 or tokens.max() >= self.vocab:
            raise RequestError(f"{name}: token ids must be in [0, {self.vocab}); got {tokens}")
        if step.start:
            kv = step.encoder_kv
            if (
                kv is None
                or kv.ndim != 4
                or (kv.shape[0], kv.shape[1], kv.shape[3]) != self.kv_shape
                or not kv.shape[2]
            ):
                got = None if kv is None else list(kv.shape)
                raise RequestError(
                    f"{name}: the START step carries the window's encoder_kv "
                    f"[{self.kv_shape[0]}, {self.kv_shape[1]}, positions >= 1, "
                    f"{self.kv_shape[2]}] (the asr_encoder's cross_kv); got {got}"
                )
            self._check_room(step.sequence_id)
            past = 0
        else:
            if step.encoder_kv is not None and step.encoder_kv.size:
                raise RequestError(
                    f"{name}: encoder_kv is sent once, on the START step; later steps send "
                    "it empty (positions 0)"
                )
            past = self._held_state(step.sequence_id).rows.self_kv.shape[3]
        if past + tokens.size > TEXT_CONTEXT:
            raise RequestError(
                f"{name}: {past} past + {tokens.size} new tokens exceed Whisper's "
                f"{TEXT_CONTEXT}-token text context"
            )

    def run(self, steps: Sequence[WindowStep]) -> list[np.ndarray]:
        """Logits [vocab] of each step's last position, in order."""
        self._drop_idle()
        ids = [s.sequence_id for s in steps]
        self._check_distinct(ids)
        for step in steps:
            self.check(step)
        now = time.monotonic()
        with self._lock:
            for step in steps:
                if step.start:  # a block of one row; rows that start together merge below
                    kv = np.asarray(step.encoder_kv, np.float32)[None]
                    empty = np.zeros((*kv.shape[:3], 0, kv.shape[4]), np.float32)
                    self._held[step.sequence_id] = _Held(_Rows(kv, empty), 0, now)
            held = [self._held[i] for i in ids]
        groups: dict[tuple[int, int, int], list[int]] = {}
        for k, (step, h) in enumerate(zip(steps, held, strict=True)):
            key = (h.rows.cross_kv.shape[3], h.rows.self_kv.shape[3], step.tokens.size)
            groups.setdefault(key, []).append(k)
        logits: list[np.ndarray | None] = [None] * len(steps)
        for members in groups.values():
            members.sort(key=lambda k: (id(held[k].rows), held[k].row))
            rows = self._rows([held[k] for k in members])
            tokens = np.stack([steps[k].tokens for k in members]).astype(np.int64, copy=False)
            out, self_kv = self._step(tokens, rows.self_kv, rows.cross_kv)
            after = _Rows(rows.cross_kv, self_kv)
            for row, k in enumerate(members):
                held[k].rows, held[k].row, held[k].touched = after, row, now
                logits[k] = out[row]
        with self._lock:
            for step in steps:
                if step.end:
                    self._held.pop(step.sequence_id, None)
        return logits  # type: ignore[return-value]

    @staticmethod
    def _rows(members: list[_Held]) -> _Rows:
        """The block to feed: the members' own block when they are all its rows, in order;
        else a new block of their rows (a copy, made when the set of rows changes)."""
        first = members[0].rows
        if (
            all(h.rows is first for h in members)
            and [h.row for h in members] == list(range(len(members)))
            and first.cross_kv.shape[0] == len(members)
        ):
            return first
        return _Rows(
            np.concatenate([h.rows.cross_kv[h.row : h.row + 1] for h in members]),
            np.concatenate([h.rows.self_kv[h.row : h.row + 1] for h in members]),
        )


_SEQUENCE_IDS = itertools.count(1)


def new_sequence_id() -> int:
    """A correlation id no other process or window of this server uses at the same time:
    the process id in the high bits (several `asr` instances share one decoder)."""
    return (os.getpid() << 32) | (next(_SEQUENCE_IDS) & 0xFFFFFFFF)


class SequenceWindows(WindowDecoding):
    """One batch of windows decoded as sequences of a decoder that keeps their caches.

    The first step starts a sequence per row with its encoder K/V; a row that finished is
    ended on the next step (its eot is run with the others' tokens), and `close` ends the
    rows still open. `end_token`: the token fed to a row's last step (Whisper's eot)."""

    def __init__(self, cross_kv: np.ndarray, end_token: int):
        self.cross_kv, self.end_token = cross_kv, end_token
        self.ids = [new_sequence_id() for _ in range(cross_kv.shape[0])]
        self.open = np.ones(cross_kv.shape[0], bool)
        self.started = False

    @abc.abstractmethod
    def send(self, steps: list[WindowStep]) -> list[np.ndarray]:
        """Run the steps (one per open row) and return their logits [vocab], in order."""

    @abc.abstractmethod
    def send_last(self, steps: list[WindowStep]) -> None:
        """Run END steps whose logits nobody reads (may return before they ran)."""

    def step(self, tokens: np.ndarray, done: np.ndarray) -> np.ndarray:
        rows = np.flatnonzero(self.open)
        steps = [
            WindowStep(
                self.ids[k],
                tokens[k],
                None if self.started else self.cross_kv[k],
                start=not self.started,
                end=bool(done[k]),
            )
            for k in rows
        ]
        out = self.send(steps)
        self.started = True
        self.open[rows[done[rows]]] = False
        logits = np.zeros((len(self.ids), out[0].shape[-1]), np.float32)
        logits[rows] = np.stack(out)
        return logits

    def close(self) -> None:
        rows = np.flatnonzero(self.open) if self.started else []
        self.open[:] = False
        if len(rows):
            token = np.array([self.end_token], np.int64)
            self.send_last([WindowStep(self.ids[k], token, end=True) for k in rows])


class InProcessWindows(SequenceWindows):
    """`SequenceWindows` over a `WhisperSequences` in this process (tests, benchmarks)."""

    def __init__(self, sequences: WhisperSequences, cross_kv: np.ndarray, end_token: int):
        super().__init__(cross_kv, end_token)
        self.sequences = sequences

    def send(self, steps: list[WindowStep]) -> list[np.ndarray]:
        return self.sequences.run(steps)

    def send_last(self, steps: list[WindowStep]) -> None:
        for step in steps:  # the logits would be discarded: release without running
            self.sequences.release(step.sequence_id)
