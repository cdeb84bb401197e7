"""Barge-in bookkeeping: one active turn per conversation; a new turn cancels the old one."""

from __future__ import annotations

import itertools
import threading


class TurnToken:
    """The cancellation flag of one turn, set when a newer turn of its session starts, and
    the turn it superseded (whose end the new turn may wait for)."""

    def __init__(self, session_id: str, number: int, previous: TurnToken | None = None):
        self.session_id, self.number, self.previous = session_id, number, previous
        self._superseded = threading.Event()
        self._ended = threading.Event()

    def supersede(self) -> None:
        self._superseded.set()

    @property
    def superseded(self) -> bool:
        return self._superseded.is_set()

    def wait_previous(self, timeout: float) -> bool:
        """Block until the superseded turn has ended (its memory settled); False on timeout."""
        previous, self.previous = self.previous, None  # no chain of finished turns is kept
        return previous is None or previous._ended.wait(timeout)


class SessionTurns:
    """Thread-safe map session id -> its active turn. Turns without a session never clash."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._active: dict[str, TurnToken] = {}
        self._numbers = itertools.count(1)

    def begin(self, session_id: str) -> TurnToken:
        if not session_id:
            return TurnToken(session_id, next(self._numbers))
        with self._lock:
            old = self._active.get(session_id)
            token = TurnToken(session_id, next(self._numbers), old)
            self._active[session_id] = token
        if old is not None:
            old.supersede()
        return token

    def end(self, token: TurnToken) -> None:
        token._ended.set()
        with self._lock:
            if self._active.get(token.session_id) is token:
                del self._active[token.session_id]

    def active(self) -> int:
        with self._lock:
            return len(self._active)
