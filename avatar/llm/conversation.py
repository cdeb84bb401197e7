"""Conversation memory per session, with a bounded context: the oldest turns are dropped
(the system prompt is kept) so that prompt + reply fit in the context budget.

Two stores, one interface (`history`, `save`): `MemoryStore`, in this process (the
embedded single server's default), and `RedisStore`, shared by every replica so that a
conversation survives the replica that held it. A session's record is written whole, in
one command, once per turn (so a reader never sees half a turn), and expires after
`ttl_s` without a turn. The LLM's KV/prefix cache stays local to a replica: the load
balancer's session affinity makes it hit; correctness never depends on it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
import time
import urllib.parse
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from avatar.errors import RequestError
from avatar.llm.template import Message

log = logging.getLogger(__name__)
SESSION_TTL_S = 24 * 3600.0  # a conversation untouched this long is forgotten
STORE_URL_ENV = "AVATAR_REDIS_URL"  # the llm model's store when its config names none


class StoreError(RuntimeError):
    """The shared store did not answer (down, slow, or refused): the turn goes on without
    that memory; the message says what failed."""


class ConversationStore(Protocol):
    def history(self, session_id: str) -> list[Message]: ...

    def save(self, session_id: str, messages: Sequence[Message]) -> None: ...


class MemoryStore:
    """session id -> message history in this process, thread-safe; at most `capacity`
    sessions, each forgotten `ttl_s` after its last turn.

    When full, a new conversation evicts the least recently used one that has had at most
    one exchange before any longer one: conversations that cost a stranger a single turn
    each cannot push out the real ones (the gateway also caps connections per address)."""

    def __init__(self, capacity: int = 4096, ttl_s: float = SESSION_TTL_S):
        self.capacity, self.ttl_s = capacity, ttl_s
        self._sessions: OrderedDict[str, tuple[float, list[Message]]] = OrderedDict()
        self._lock = threading.Lock()

    def history(self, session_id: str) -> list[Message]:
        with self._lock:
            entry = self._sessions.get(session_id)
            if entry is None:
                return []
            if time.monotonic() - entry[0] > self.ttl_s:
                del self._sessions[session_id]
                return []
            return list(entry[1])

    def save(self, session_id: str, messages: Sequence[Message]) -> None:
        with self._lock:
            now = time.monotonic()
            self._sessions[session_id] = (now, list(messages))
            self._sessions.move_to_end(session_id)
            while self._sessions:
                oldest, (touched, _) = next(iter(self._sessions.items()))
                if now - touched <= self.ttl_s:
                    break
                del self._sessions[oldest]  # expired (in order of last use)
            while len(self._sessions) > self.capacity:
                del self._sessions[self._victim(session_id)]

    def _victim(self, keep: str) -> str:
        """The session to evict: the least recently used short one, else the LRU one."""
        for session_id, (_, messages) in self._sessions.items():
            if session_id != keep and sum(m.role == "user" for m in messages) <= 1:
                return session_id
        return next(iter(self._sessions))

    def __len__(self) -> int:
        return len(self._sessions)


class RespClient:
    """A Redis connection speaking RESP2 over a socket: the few commands the store needs,
    each bounded by `timeout_s`, one at a time (a lock), reconnecting after a failure.

    Not redis-py: it imports `ssl`, which the python-backend stub's embedded Python lacks
    (the `llm` model failed to load with it), and the store needs three commands."""

    def __init__(self, url: str, timeout_s: float) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme != "redis" or not parts.hostname:
            raise ValueError(f"session store {url!r}: expected redis://[:PASSWORD@]HOST:PORT/DB")
        self.address = (parts.hostname, parts.port or 6379)
        self.password = urllib.parse.unquote(parts.password) if parts.password else ""
        self.username = urllib.parse.unquote(parts.username) if parts.username else ""
        self.db = int(parts.path.strip("/") or 0)
        self.timeout_s = timeout_s
        self._socket: socket.socket | None = None
        self._reader: Any = None
        self._lock = threading.Lock()

    def command(self, *args: str | bytes | int) -> Any:
        """One command's reply: bytes, int, None or a list; RedisError for an error reply,
        OSError when the server does not answer in time."""
        with self._lock:
            try:
                if self._socket is None:
                    self._connect()
                return self._roundtrip(args)
            except OSError:
                self._close()
                raise

    def _connect(self) -> None:
        self._socket = socket.create_connection(self.address, timeout=self.timeout_s)
        self._reader = self._socket.makefile("rb")
        if self.password:
            auth = (self.username, self.password) if self.username else (self.password,)
            self._roundtrip(("AUTH", *auth))
        if self.db:
            self._roundtrip(("SELECT", self.db))

    def _roundtrip(self, args: Sequence[str | bytes | int]) -> Any:
        encoded = [a if isinstance(a, bytes) else str(a).encode() for a in args]
        message = b"*%d\r\n" % len(encoded) + b"".join(
            b"$%d\r\n%s\r\n" % (len(a), a) for a in encoded
        )
        assert self._socket is not None
        self._socket.sendall(message)
        return self._reply()

    def _reply(self) -> Any:
        line = self._reader.readline()
        if not line.endswith(b"\r\n"):
            raise ConnectionError("the Redis connection closed")
        kind, body = line[:1], line[1:-2]
        if kind == b"+":
            return body
        if kind == b"-":
            raise RedisError(body.decode(errors="replace"))
        if kind == b":":
            return int(body)
        if kind == b"$":
            size = int(body)
            return None if size < 0 else self._reader.read(size + 2)[:-2]
        if kind == b"*":
            size = int(body)
            return None if size < 0 else [self._reply() for _ in range(size)]
        raise ConnectionError(f"not a Redis reply: {line[:20]!r}")

    def _close(self) -> None:
        if self._socket is not None:
            with contextlib.suppress(OSError):
                self._socket.close()
        self._socket, self._reader = None, None


class RedisError(RuntimeError):
    """Redis answered with an error reply (e.g. a wrong password, out of memory)."""


class RedisStore:
    """The conversations in Redis (`url`: redis://[:PASSWORD@]HOST:PORT/DB), one JSON value
    per session (`avatar:session:<id>`), set with its time-to-live in one command. Every
    call is bounded by `timeout_s`; after a failure the store is skipped for
    `retry_after_s` (a dead Redis costs one timeout, not one per turn). Failures raise
    StoreError."""

    KEY = "avatar:session:"

    def __init__(
        self,
        url: str,
        ttl_s: float = SESSION_TTL_S,
        timeout_s: float = 0.5,
        retry_after_s: float = 2.0,
    ) -> None:
        self.url, self.ttl_s, self.retry_after_s = url, ttl_s, retry_after_s
        self.client = RespClient(url, timeout_s)
        self._down_until = 0.0
        self.failures = 0

    def _call(self, what: str, *command: str | bytes | int) -> Any:
        if time.monotonic() < self._down_until:
            raise StoreError(f"conversation store {what}: skipped, it failed moments ago")
        try:
            return self.client.command(*command)
        except (OSError, RedisError) as error:
            self.failures += 1
            self._down_until = time.monotonic() + self.retry_after_s
            log.warning("conversation store %s failed: %s", what, error)
            raise StoreError(f"conversation store {what} failed ({type(error).__name__})") from None

    def history(self, session_id: str) -> list[Message]:
        raw = self._call("read", "GET", self.KEY + session_id)
        if raw is None:
            return []
        try:
            record = json.loads(raw)
            return [Message(m["role"], m["content"]) for m in record["messages"]]
        except (ValueError, KeyError, TypeError):
            raise StoreError(f"conversation store: session {session_id} is not a record") from None

    def save(self, session_id: str, messages: Sequence[Message]) -> None:
        record = {"v": 1, "messages": [{"role": m.role, "content": m.content} for m in messages]}
        value = json.dumps(record, ensure_ascii=False).encode()
        ttl = max(1, int(self.ttl_s))
        self._call("write", "SET", self.KEY + session_id, value, "EX", ttl)


def open_store(
    url: str = "", capacity: int = 4096, ttl_s: float = SESSION_TTL_S
) -> ConversationStore:
    """The store a URL names: redis://... -> RedisStore, "" -> MemoryStore."""
    if not url:
        return MemoryStore(capacity, ttl_s)
    if not url.startswith("redis://"):
        raise ValueError(f"session store {url!r}: expected redis://HOST:PORT/DB or empty")
    return RedisStore(url, ttl_s)


def bound_context(
    messages: Sequence[Message],
    count_tokens: Callable[[Sequence[Message]], int],
    budget: int,
    keep: int | None = None,
) -> list[Message]:
    """Drop the oldest non-system messages until `count_tokens(messages) <= budget`, and
    once any must go, down to `keep` tokens (default: the budget).

    Why `keep`: the decoder reuses the KV cache of the prompt's longest prefix it has seen.
    Dropping one turn at a time changes the prefix at every turn once the context is full,
    so each re-reads the whole history (~880 tokens: ~4 s to the first token on 2 cores
    against ~0.3 s); dropping down to `keep` lets the next turns extend the same prefix.
    The system prompt and the last user message are always kept; if those alone exceed
    the budget the request is refused.
    """
    kept = list(messages)
    system = 1 if kept and kept[0].role == "system" else 0
    target = budget if keep is None or count_tokens(kept) <= budget else min(keep, budget)
    while count_tokens(kept) > target:
        if len(kept) - system <= 1:
            if count_tokens(kept) <= budget:
                break  # the question alone is over `keep`, not over the budget
            raise RequestError(
                f"the prompt needs {count_tokens(kept)} tokens; the context allows {budget} "
                "(shorten the message or lower max_tokens)"
            )
        del kept[system]
        while len(kept) - system > 1 and kept[system].role != "user":
            del kept[system]  # a conversation restarts at a user turn
    return kept
