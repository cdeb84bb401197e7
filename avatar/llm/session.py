"""Conversation memory per session id with a bounded context: the oldest turns are dropped
(the system prompt is kept) so that prompt + reply fit in the context budget."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence

from avatar.errors import RequestError
from avatar.llm.template import Message


class SessionStore:
    """session id -> message history (LRU, at most `capacity` sessions), thread-safe."""

    def __init__(self, capacity: int = 256):
        self.capacity = capacity
        self._sessions: OrderedDict[str, list[Message]] = OrderedDict()
        self._lock = threading.Lock()
        self._touched: dict[str, float] = {}

    def history(self, session_id: str) -> list[Message]:
        with self._lock:
            return list(self._sessions.get(session_id, []))

    def save(self, session_id: str, messages: Sequence[Message]) -> None:
        with self._lock:
            self._sessions[session_id] = list(messages)
            self._sessions.move_to_end(session_id)
            self._touched[session_id] = time.monotonic()
            while len(self._sessions) > self.capacity:
                old, _ = self._sessions.popitem(last=False)
                self._touched.pop(old, None)

    def __len__(self) -> int:
        return len(self._sessions)


def bound_context(
    messages: Sequence[Message],
    count_tokens: Callable[[Sequence[Message]], int],
    budget: int,
) -> list[Message]:
    """Drop the oldest non-system messages until `count_tokens(messages) <= budget`.

    The system prompt and the last user message are always kept; if those alone exceed
    the budget the request is refused.
    """
    kept = list(messages)
    system = 1 if kept and kept[0].role == "system" else 0
    while count_tokens(kept) > budget:
        if len(kept) - system <= 1:
            raise RequestError(
                f"the prompt needs {count_tokens(kept)} tokens; the context allows {budget} "
                "(shorten the message or lower max_tokens)"
            )
        del kept[system]
        while len(kept) - system > 1 and kept[system].role != "user":
            del kept[system]  # a conversation restarts at a user turn
    return kept
