"""Any OpenAI-compatible chat-completions endpoint (DeepSeek, Qwen, vLLM, SGLang, NIM,
TensorRT-LLM's server, llama.cpp's server) as the source of a reply, streamed.

The client is the standard library's `http.client`, not the `openai` package or httpx:
both import `ssl` when they are imported, and the python-backend stub of the embedded
Triton cannot load `ssl` ("_ssl...so: undefined symbol _PyModule_Add": the stub's
libpython is 3.11.2, the interpreter's lib-dynload another patch release), so the `llm`
model would not load. `http.client` needs `ssl` only for an https:// endpoint (NGC's
Triton containers have it; here a clear error says so at load time).

What the wire carries: POST {base}/chat/completions with `stream: true`; the answer is
server-sent events, `data: {json}` per chunk (`choices[0].delta.content`,
`choices[0].finish_reason`), then `data: [DONE]`. The key travels as
`Authorization: Bearer ...`; it is never logged, and is masked in any error text.

Every wait is bounded: the TCP connect by `connect_timeout_s`; the first content by
`first_token_timeout_s` from the request; each later chunk by `idle_timeout_s`. A
watchdog thread enforces them and the stops (barge-in, a cancelled Triton request) by
shutting the stream's socket, which ends a blocked read at once: the HTTP stream is
closed, the server sees the client go, and the reply ends with one final event.
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import json
import logging
import socket
import threading
import time
import urllib.parse
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from avatar.errors import StageError
from avatar.llm.backend import Reply, ReplyBackend
from avatar.llm.sampling import SamplingParams
from avatar.llm.scheduler import Event
from avatar.llm.template import Message

log = logging.getLogger(__name__)

WHAT = "llm endpoint"
MAX_LINE = 1 << 20  # one server-sent-event line; a chunk is a few hundred bytes
MAX_ERROR_BODY = 4096
WATCH_EVERY_S = 0.05  # how often stops and deadlines are checked


class EndpointError(StageError):
    """The endpoint failed a reply: unreachable, refused, slow, or sent a malformed
    stream. The message says which, with the endpoint's address (never its key)."""

    def __init__(self, message: str):
        super().__init__(WHAT, message)


@dataclasses.dataclass(frozen=True)
class Endpoint:
    """Where an OpenAI-compatible server is and how long to wait for it."""

    url: str  # base URL with the API version: http://127.0.0.1:8080/v1
    model: str = ""  # the `model` field; some servers (llama.cpp) serve one and ignore it
    api_key: str = dataclasses.field(default="", repr=False)
    connect_timeout_s: float = 5.0
    first_token_timeout_s: float = 20.0
    idle_timeout_s: float = 20.0
    # merged into every request body: server-specific sampling (e.g. {"top_k": 40})
    extra_body: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        parts = urllib.parse.urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(
                f"LLM endpoint {self.url!r}: expected http(s)://HOST[:PORT]/PATH, e.g. "
                "http://127.0.0.1:8080/v1"
            )
        for name in ("connect_timeout_s", "first_token_timeout_s", "idle_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"LLM endpoint: {name} must be > 0")
        if parts.scheme == "https" and not _has_ssl():
            raise ValueError(
                f"LLM endpoint {self.url}: https needs Python's ssl module, which this "
                "interpreter cannot load (the embedded python-backend stub); use an http:// "
                "endpoint on a trusted network or a TLS proxy beside it"
            )

    @property
    def address(self) -> str:
        """The endpoint as logs and errors show it (no key, no credentials in the URL)."""
        parts = urllib.parse.urlsplit(self.url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
        return f"{parts.scheme}://{host}{port}{parts.path.rstrip('/')}"

    def connection(self) -> http.client.HTTPConnection:
        parts = urllib.parse.urlsplit(self.url)
        kind = (
            http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        )
        return kind(parts.hostname or "", parts.port, timeout=self.connect_timeout_s)

    def path(self, name: str) -> str:
        return urllib.parse.urlsplit(self.url).path.rstrip("/") + "/" + name

    def headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    def masked(self, text: str) -> str:
        """`text` with the key (should a server echo it) replaced."""
        return text.replace(self.api_key, "***") if self.api_key else text


def _has_ssl() -> bool:
    try:
        import ssl  # noqa: F401
    except ImportError:
        return False
    return True


def request_body(
    endpoint: Endpoint, messages: list[Message], sampling: SamplingParams
) -> dict[str, Any]:
    """The chat-completions request for `messages`. Only OpenAI's own sampling fields are
    sent (top_k and repetition_penalty are not among them: `extra_body` adds a server's)."""
    body: dict[str, Any] = {
        "model": endpoint.model or "default",
        "messages": [m.to_json() for m in messages],
        "stream": True,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "max_tokens": sampling.max_tokens,
    }
    if sampling.stop:
        body["stop"] = list(sampling.stop)
    if sampling.seed is not None:
        body["seed"] = sampling.seed
    body.update(endpoint.extra_body)
    return body


@dataclasses.dataclass(frozen=True)
class Delta:
    """What one chunk says: new text, and on the last one why the reply ended."""

    text: str = ""
    finish_reason: str | None = None
    usage: Mapping[str, Any] | None = None


def parse_chunk(data: str) -> Delta:
    """One `data:` payload -> Delta; EndpointError when it is not a chat-completion chunk."""
    try:
        chunk = json.loads(data)
    except json.JSONDecodeError:
        raise EndpointError(f"malformed chunk (not JSON): {data[:120]!r}") from None
    if not isinstance(chunk, dict):
        raise EndpointError(f"malformed chunk (not an object): {data[:120]!r}")
    if "error" in chunk:
        error = chunk["error"]
        message = error.get("message") if isinstance(error, dict) else error
        raise EndpointError(f"the server failed the reply: {message}")
    choices = chunk.get("choices")
    usage = chunk.get("usage") if isinstance(chunk.get("usage"), dict) else None
    if choices == [] and usage:  # the usage-only last chunk (stream_options.include_usage)
        return Delta(usage=usage)
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise EndpointError(f"malformed chunk (no choices): {data[:120]!r}")
    choice = choices[0]
    delta = choice.get("delta") or {}
    text = delta.get("content") if isinstance(delta, dict) else None
    if text is not None and not isinstance(text, str):
        raise EndpointError(f"malformed chunk (content is not text): {data[:120]!r}")
    finish = choice.get("finish_reason")
    return Delta(text or "", str(finish) if finish else None, usage)


class ChatStream:
    """One streamed chat completion. `deltas()` runs on one thread; `abort()` may come
    from any other and ends a blocked read at once (the socket is shut down)."""

    def __init__(self, endpoint: Endpoint, body: Mapping[str, Any]):
        self.endpoint, self.body = endpoint, body
        self.started = time.monotonic()
        self.last_data: float | None = None  # when content last came (None: not yet)
        self.aborted: str = ""  # why it was aborted ("" while it was not)
        self._lock = threading.Lock()
        self._conn: http.client.HTTPConnection | None = None
        # the socket, kept: the connection forgets it once a `Connection: close` response
        # owns it, and an abort must still reach it
        self._sock: socket.socket | None = None

    def overdue(self, now: float) -> str:
        """Why this stream waited too long ("" while it has not)."""
        if self.last_data is None:
            if now - self.started > self.endpoint.first_token_timeout_s:
                limit = self.endpoint.first_token_timeout_s
                return f"no reply within the first-token timeout of {limit:g} s"
        elif now - self.last_data > self.endpoint.idle_timeout_s:
            return f"the stream stalled for more than {self.endpoint.idle_timeout_s:g} s"
        return ""

    def abort(self, reason: str) -> None:
        with self._lock:
            if self.aborted:
                return
            self.aborted = reason
            sock = self._sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        with self._lock:
            conn, self._conn, self._sock = self._conn, None, None
        if conn is not None:
            conn.close()

    def deltas(self) -> Iterator[Delta]:
        """The reply's chunks, in order, until the last; EndpointError on any failure
        (including an abort: its reason is the message)."""
        try:
            yield from self._deltas()
        except EndpointError:
            raise
        except (OSError, http.client.HTTPException, ValueError) as error:
            if self.aborted:
                raise EndpointError(self.aborted) from None
            raise EndpointError(self._describe(error)) from None
        finally:
            self.close()

    def _describe(self, error: Exception) -> str:
        where = self.endpoint.address
        if isinstance(error, ConnectionRefusedError):
            return f"{where} refused the connection (is the server running?)"
        if isinstance(error, TimeoutError | socket.timeout):
            if self._sock is None:
                return f"{where}: no connection within {self.endpoint.connect_timeout_s:g} s"
            return f"{where}: the socket timed out"
        if isinstance(error, http.client.IncompleteRead | http.client.RemoteDisconnected):
            return f"{where} closed the stream before the reply was complete"
        return self.endpoint.masked(f"{where}: {type(error).__name__}: {error}")

    def _deltas(self) -> Iterator[Delta]:
        conn = self.endpoint.connection()
        with self._lock:
            self._conn = conn
        conn.connect()  # bounded by connect_timeout_s
        with self._lock:
            self._sock = conn.sock
        if self.aborted:  # a stop or deadline came while connecting
            raise EndpointError(self.aborted)
        # later reads: the watchdog's deadlines end them; this only backs it up
        assert conn.sock is not None
        conn.sock.settimeout(
            self.endpoint.first_token_timeout_s + self.endpoint.idle_timeout_s + 5.0
        )
        payload = json.dumps(self.body).encode()
        conn.request(
            "POST", self.endpoint.path("chat/completions"), payload, self.endpoint.headers()
        )
        response = conn.getresponse()
        if response.status != 200:
            raise EndpointError(self._refusal(response))
        kind = response.getheader("Content-Type", "")
        if "text/event-stream" not in kind:
            raise EndpointError(f"{self.endpoint.address} answered {kind!r}, not a stream")
        finished = False
        for data in _events(response):
            if data.strip() == "[DONE]":
                return
            delta = parse_chunk(data)
            if delta.text:
                self.last_data = time.monotonic()
            finished = finished or delta.finish_reason is not None
            yield delta
        if self.aborted:  # the watchdog shut the socket: the read saw its end
            raise EndpointError(self.aborted)
        if not finished:
            raise EndpointError(
                f"{self.endpoint.address} ended the stream before the reply was complete"
            )

    def _refusal(self, response: http.client.HTTPResponse) -> str:
        body = response.read(MAX_ERROR_BODY).decode("utf-8", "replace")
        try:
            data = json.loads(body)
            error = data.get("error", data) if isinstance(data, dict) else data
            detail = error.get("message", error) if isinstance(error, dict) else error
        except json.JSONDecodeError:
            detail = body.strip()[:300]
        what = {401: "refused the API key", 403: "refused the API key"}.get(
            response.status, "refused the request"
        )
        return self.endpoint.masked(
            f"{self.endpoint.address} {what} (HTTP {response.status}): {detail}"
        )


def _events(response: http.client.HTTPResponse) -> Iterator[str]:
    """The `data` of each server-sent event (lines joined; comments and other fields
    skipped)."""
    data: list[str] = []
    while True:
        raw = response.readline(MAX_LINE)
        if not raw:
            if data:
                yield "\n".join(data)
            return
        if not raw.endswith(b"\n") and len(raw) >= MAX_LINE:
            raise EndpointError(f"a stream line longer than {MAX_LINE} bytes")
        line = raw.decode("utf-8", "replace").rstrip("\r\n")
        if not line:
            if data:
                yield "\n".join(data)
                data = []
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))


def list_models(endpoint: Endpoint) -> list[str]:
    """GET {base}/models: the ids the server serves (a reachability and key check for the
    log at start-up); EndpointError when it cannot say."""
    conn = endpoint.connection()
    try:
        conn.request("GET", endpoint.path("models"), headers=endpoint.headers())
        conn.sock.settimeout(endpoint.first_token_timeout_s)  # type: ignore[union-attr]
        response = conn.getresponse()
        body = response.read(1 << 20)
        if response.status != 200:
            raise EndpointError(
                endpoint.masked(f"{endpoint.address}/models: HTTP {response.status}")
            )
        data = json.loads(body)
        return [str(m.get("id")) for m in data.get("data", []) if isinstance(m, dict)]
    except (OSError, http.client.HTTPException, ValueError, AttributeError) as error:
        raise EndpointError(f"{endpoint.address}: {type(error).__name__}: {error}") from None
    finally:
        conn.close()


class OpenAIBackend(ReplyBackend):
    """Replies from an OpenAI-compatible endpoint: one streamed request per reply, on a
    pool of `max_streams` threads (later ones wait for a free thread), and one watchdog
    thread that ends streams that are stopped, cancelled or past a deadline."""

    name = "openai"

    def __init__(self, endpoint: Endpoint, max_streams: int = 8):
        self.endpoint = endpoint
        self._pool = ThreadPoolExecutor(max_streams, thread_name_prefix="llm-endpoint")
        self._active: dict[int, tuple[Reply, ChatStream]] = {}
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._watchdog = threading.Thread(target=self._watch, name="llm-watchdog", daemon=True)
        self._watchdog.start()
        self.failures = 0  # replies that ended with an error

    def submit(self, reply: Reply) -> None:
        if self._closing.is_set():
            reply.emit(Event([], "error", _stats(time.monotonic()), "the llm model is stopping"))
            return
        self._pool.submit(self._run, reply)

    def idle(self) -> bool:
        with self._lock:
            return not self._active

    def stop(self) -> None:
        """Ends every running stream "error" and stops the threads."""
        self._closing.set()
        with self._lock:
            running = list(self._active.values())
        for _, stream in running:
            stream.abort("the llm model is shutting down")
        self._pool.shutdown(wait=True, cancel_futures=False)
        self._watchdog.join(timeout=5)

    def _watch(self) -> None:
        while not self._closing.wait(WATCH_EVERY_S):
            now = time.monotonic()
            with self._lock:
                running = list(self._active.values())
            for reply, stream in running:
                try:
                    ended = reply.ended()
                except Exception as error:  # e.g. the request is gone: treat as cancelled
                    log.debug("cancellation check failed: %s", error)
                    ended = True
                if ended:
                    stream.abort("cancelled")
                elif reason := stream.overdue(now):
                    stream.abort(f"{self.endpoint.address}: {reason}")

    def _run(self, reply: Reply) -> None:
        started = time.monotonic()
        if self._closing.is_set() or reply.ended():
            reason = "error" if self._closing.is_set() else "cancelled"
            reply.emit(Event(reply.final_chunks(), reason, _stats(started)))
            return
        stream = ChatStream(
            self.endpoint, request_body(self.endpoint, reply.messages, reply.sampling)
        )
        key = id(stream)
        with self._lock:
            self._active[key] = (reply, stream)
        first: float | None = None
        pieces, usage, finish = 0, None, None
        try:
            for delta in stream.deltas():
                if delta.text:
                    first = first or time.monotonic()
                    pieces += 1
                    chunks = reply.splitter.push(delta.text)
                    if chunks:
                        reply.emit(Event(chunks))
                usage = delta.usage or usage
                finish = delta.finish_reason or finish
        except EndpointError as error:
            with self._lock:
                self._active.pop(key, None)
            stats = _stats(started, first, pieces, usage)
            if stream.aborted == "cancelled":
                reply.emit(Event(reply.final_chunks(), "cancelled", stats))
                return
            self.failures += 1
            log.warning("reply failed: %s", error)
            reply.emit(Event([], "error", stats, str(error)))
            return
        except Exception as error:  # a bug here: the reply still ends
            with self._lock:
                self._active.pop(key, None)
            log.exception("reply failed")
            reply.emit(Event([], "error", _stats(started, first, pieces), repr(error)))
            return
        with self._lock:
            self._active.pop(key, None)
        reason = "length" if finish == "length" else "stop"
        if reply.ended():
            reason = "cancelled"
        reply.emit(Event(reply.final_chunks(), reason, _stats(started, first, pieces, usage)))


def _stats(
    started: float,
    first: float | None = None,
    pieces: int = 0,
    usage: Mapping[str, Any] | None = None,
) -> dict[str, float]:
    """The final event's stats: as the decoder's (tokens from the server's usage when it
    sends one, else the count of content chunks, about one token each)."""
    now = time.monotonic()
    stats = {
        "completion_tokens": float(pieces),
        "ttft_ms": ((first or now) - started) * 1000,
        "total_ms": (now - started) * 1000,
    }
    if usage:
        for key in ("prompt_tokens", "completion_tokens"):
            if isinstance(usage.get(key), int | float):
                stats[key] = float(usage[key])
    return stats
