"""What every emulated implicit state shares: per-sequence state held between the steps of
a sequence (a correlation id), freed on END, on `release` and after `idle_timeout_s`
without a step, as Triton's sequence batcher frees a sequence after
`max_sequence_idle_microseconds`. avatar.llm.sequences and avatar.asr.sequences hold their
caches in it; what the state is stays theirs.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from avatar.errors import RequestError

log = logging.getLogger(__name__)


class HeldSequences:
    """The held states by sequence id (each has a `touched` monotonic time), thread-safe."""

    def __init__(self, idle_timeout_s: float, max_sequences: int):
        self.idle_timeout_s, self.max_sequences = idle_timeout_s, max_sequences
        self._held: dict[int, Any] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._held)

    def release(self, sequence_id: int) -> None:
        """Forget a sequence that will get no END step (e.g. after a failed step)."""
        with self._lock:
            self._held.pop(sequence_id, None)

    def _check_room(self, sequence_id: int) -> None:
        """RequestError when a sequence would start with every place taken."""
        if len(self._held) >= self.max_sequences and sequence_id not in self._held:
            raise RequestError(
                f"{len(self._held)} sequences are open, the most this decoder keeps: end "
                "finished sequences (the END flag) or wait for idle ones to time out"
            )

    def _held_state(self, sequence_id: int) -> Any:
        """The sequence's state, or RequestError saying why there is none."""
        held = self._held.get(sequence_id)
        if held is None:
            raise RequestError(
                f"sequence {sequence_id} has no state here: it was never started, it ended, "
                f"or it was idle for more than {self.idle_timeout_s:g} s"
            )
        return held

    @staticmethod
    def _check_distinct(ids: Sequence[int]) -> None:
        if len(set(ids)) != len(ids):
            raise RequestError(f"a sequence may take one step per batch (ids {list(ids)})")

    def _drop_idle(self) -> None:
        limit = time.monotonic() - self.idle_timeout_s
        with self._lock:
            idle = [k for k, h in self._held.items() if h.touched < limit]
            for key in idle:
                del self._held[key]
        if idle:
            log.warning("dropped %d sequences idle for over %g s", len(idle), self.idle_timeout_s)
