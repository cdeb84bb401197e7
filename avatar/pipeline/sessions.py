"""Barge-in bookkeeping: one active turn per session; a new turn cancels the old one."""

from __future__ import annotations

import itertools
import threading


class TurnToken:
    """The cancellation flag of one turn, set when a newer turn of its session starts."""

    def __init__(self, session_id: str, number: int):
        self.session_id, self.number = session_id, number
        self._superseded = threading.Event()

    def supersede(self) -> None:
        self._superseded.set()

    @property
    def superseded(self) -> bool:
        return self._superseded.is_set()


class SessionTurns:
    """Thread-safe map session id -> its active turn. Turns without a session never clash."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._active: dict[str, TurnToken] = {}
        self._numbers = itertools.count(1)

    def begin(self, session_id: str) -> TurnToken:
        token = TurnToken(session_id, next(self._numbers))
        if not session_id:
            return token
        with self._lock:
            old = self._active.get(session_id)
            self._active[session_id] = token
        if old is not None:
            old.supersede()
        return token

    def end(self, token: TurnToken) -> None:
        with self._lock:
            if self._active.get(token.session_id) is token:
                del self._active[token.session_id]

    def active(self) -> int:
        with self._lock:
            return len(self._active)
