"""The `llm` model's OpenAI-compatible backend (avatar/llm/openai_api.py).

Three levels: the wire format alone; the client against a scripted HTTP server that
misbehaves on purpose (malformed chunks, a slow or stalling server, a refused key, a
client that goes away); and a REAL llama.cpp server (`llama-cpp-python[server]`, built
and installed by scripts/setup.sh --tests) on the packaged SmolLM2 GGUF, in process and
behind the `llm` model on a real tritonserver: streaming, a stop mid-reply that closes
the HTTP stream, the server dying mid-stream, and a bad key.
"""

from __future__ import annotations

import contextlib
import json
import queue
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from avatar.llm.backend import Reply
from avatar.llm.engine import ChatEngine, EngineConfig
from avatar.llm.openai_api import (
    Endpoint,
    EndpointError,
    OpenAIBackend,
    parse_chunk,
    request_body,
)
from avatar.llm.sampling import SamplingParams
from avatar.llm.scheduler import Event
from avatar.llm.settings import llm_settings
from avatar.llm.template import Message
from avatar.model_parameters import ModelParameters
from serving.local_services import LlamaServer

KEY = "test-key-0123456789"
HELLO = json.dumps([{"role": "user", "content": "Hello! What is your name?"}])
GREEDY = json.dumps({"temperature": 0, "max_tokens": 48})


# ------------------------------------------------------------------------ the wire format


def test_request_body_carries_messages_and_openai_sampling_only():
    endpoint = Endpoint("http://h:1/v1", "qwen", extra_body={"top_k": 40})
    sampling = SamplingParams(temperature=0.2, max_tokens=30, stop=("\n\n",), seed=3)
    body = request_body(endpoint, [Message("user", "hi")], sampling)
    assert body == {
        "model": "qwen",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        "temperature": 0.2,
        "top_p": 0.9,
        "max_tokens": 30,
        "stop": ["\n\n"],
        "seed": 3,
        "top_k": 40,
    }


def test_chunks_parse_and_malformed_ones_are_named():
    delta = parse_chunk('{"choices":[{"delta":{"content":"Hi"},"finish_reason":null}]}')
    assert delta.text == "Hi" and delta.finish_reason is None
    last = parse_chunk('{"choices":[{"delta":{},"finish_reason":"length"}]}')
    assert last.text == "" and last.finish_reason == "length"
    for bad, words in [
        ("{not json", "not JSON"),
        ("[1, 2]", "not an object"),
        ('{"choices": []}', "no choices"),
        ('{"choices":[{"delta":{"content":5}}]}', "not text"),
        ('{"error":{"message":"model overloaded"}}', "model overloaded"),
    ]:
        with pytest.raises(EndpointError, match=words):
            parse_chunk(bad)


def test_endpoint_is_checked_and_its_key_never_shown():
    with pytest.raises(ValueError, match="expected http"):
        Endpoint("localhost:8080")
    with pytest.raises(ValueError, match="first_token_timeout_s"):
        Endpoint("http://h/v1", first_token_timeout_s=0)
    endpoint = Endpoint("http://user:pw@h:8/v1/", "m", KEY)
    assert KEY not in repr(endpoint) and "pw" not in endpoint.address
    assert endpoint.address == "http://h:8/v1" and endpoint.path("models") == "/v1/models"
    assert endpoint.masked(f"echo {KEY}") == "echo ***"


def test_settings_choose_the_backend_from_parameters_then_the_environment(tmp_path):
    def params(**values: str) -> ModelParameters:
        return ModelParameters(
            {"name": "llm", "parameters": {k: {"string_value": v} for k, v in values.items()}}
        )

    assert llm_settings(params(), "P", {}).backend == "decoder"
    key_file = tmp_path / "key"
    key_file.write_text(KEY + "\n")
    env = {"AVATAR_LLM_URL": "http://e:1/v1", "AVATAR_LLM_API_KEY_FILE": str(key_file)}
    chosen = llm_settings(params(), "P", env)
    assert chosen.backend == "openai" and chosen.endpoint is not None
    assert chosen.endpoint.api_key == KEY and KEY not in chosen.describe()
    # a parameter that is set wins over the environment
    assert llm_settings(params(backend="decoder"), "P", env).backend == "decoder"
    assert llm_settings(params(llm_url="http://p:2/v1"), "P", env).endpoint.address == (
        "http://p:2/v1"
    )
    with pytest.raises(ValueError, match="needs an endpoint"):
        llm_settings(params(backend="openai"), "P", {})
    with pytest.raises(ValueError, match="not one of"):
        llm_settings(params(backend="gpt"), "P", {})


# --------------------------------------------------- a scripted server that misbehaves


def _sse(*chunks: str) -> list[bytes]:
    return [f"data: {c}\n\n".encode() for c in chunks]


def _content(text: str, finish: str | None = None) -> str:
    return json.dumps({"choices": [{"delta": {"content": text}, "finish_reason": finish}]})


class Script:
    """What the scripted server does with the next chat request."""

    def __init__(self) -> None:
        self.status = 200
        self.lines: list[bytes] = _sse(_content("Hello there. "), _content("I am Mia.", "stop"))
        self.lines.append(b"data: [DONE]\n\n")
        self.delay_first_s = 0.0
        self.delay_each_s = 0.0
        self.stall_after = -1  # stop sending (keep the connection) after this many lines
        self.bodies: list[dict] = []
        self.headers: list[dict] = []
        self.keep_alive = True  # after the lines, comments until the client leaves
        self.client_left = threading.Event()  # a write failed: the client closed the stream


@contextlib.contextmanager
def scripted_server() -> Iterator[tuple[str, Script]]:
    script = Script()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            script.bodies.append(body)
            script.headers.append(dict(self.headers))
            if script.status != 200:
                payload = json.dumps({"error": {"message": "Invalid API Key"}}).encode()
                self.send_response(script.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
                return
            time.sleep(script.delay_first_s)
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            try:
                for i, line in enumerate(script.lines):
                    if i == script.stall_after:
                        time.sleep(30)
                        return
                    self.wfile.write(line)
                    self.wfile.flush()
                    time.sleep(script.delay_each_s)
                # a client that went away is seen at the next writes
                for _ in range(50 if script.keep_alive else 0):
                    self.wfile.write(b": keep-alive\n\n")
                    self.wfile.flush()
                    time.sleep(0.02)
            except OSError:
                script.client_left.set()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads, server.block_on_close = True, False
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1", script
    finally:
        server.shutdown()
        server.server_close()


def _reply(backend: OpenAIBackend, text: str = "Hi", **sampling) -> tuple[Reply, queue.Queue]:
    events: queue.Queue[Event] = queue.Queue()
    reply = Reply([Message("user", text)], SamplingParams(**sampling), events.put)
    backend.submit(reply)
    return reply, events


def _final(events: queue.Queue, timeout: float = 30) -> tuple[str, Event]:
    """(the streamed text, the final event)."""
    text = ""
    while True:
        event = events.get(timeout=timeout)
        text += "".join(c.text for c in event.chunks)
        if event.finish_reason is not None:
            return text, event


@contextlib.contextmanager
def backend_for(url: str, **timeouts: float) -> Iterator[OpenAIBackend]:
    backend = OpenAIBackend(Endpoint(url, "m", KEY, **timeouts), max_streams=4)
    try:
        yield backend
    finally:
        backend.stop()


def test_a_streamed_reply_is_split_into_sentences_with_stats():
    with scripted_server() as (url, script), backend_for(url) as backend:
        _, events = _reply(backend)
        chunks = []
        while True:
            event = events.get(timeout=10)
            chunks += event.chunks
            if event.finish_reason:
                break
    assert "".join(c.text for c in chunks) == "Hello there. I am Mia."
    assert [c.sentence for c in chunks if c.sentence] == ["Hello there.", "I am Mia."]
    assert event.finish_reason == "stop" and event.stats["completion_tokens"] == 2
    assert script.headers[0]["Authorization"] == f"Bearer {KEY}"
    assert script.bodies[0]["stream"] is True


@pytest.mark.parametrize(
    ("setup", "words"),
    [
        (lambda s: setattr(s, "lines", [b"data: {oops\n\n"]), "malformed chunk"),
        (lambda s: setattr(s, "status", 401), "refused the API key (HTTP 401): Invalid API Key"),
        (lambda s: setattr(s, "delay_first_s", 5), "first-token timeout of 3 s"),
        (lambda s: setattr(s, "stall_after", 1), "stalled for more than 1 s"),
        # the server's process ends mid-reply: the stream ends without its last chunk
        (
            lambda s: (setattr(s, "lines", s.lines[:1]), setattr(s, "keep_alive", False)),
            "ended the stream before the reply",
        ),
    ],
)
def test_a_misbehaving_server_ends_the_reply_with_a_clear_error(setup, words):
    with (
        scripted_server() as (url, script),
        # the first token may take 3 s: under a loaded CI the scripted server's first line once
        # took over 1 s, so a stall read as a first-token timeout
        backend_for(url, first_token_timeout_s=3, idle_timeout_s=1) as backend,
    ):
        setup(script)
        started = time.monotonic()
        _, events = _reply(backend)
        _, final = _final(events)
        elapsed = time.monotonic() - started
    assert final.finish_reason == "error" and words in final.error, final.error
    assert KEY not in final.error
    assert elapsed < 8  # bounded by the timeouts, never a hang


def test_nobody_listening_is_a_clear_error():
    with socket.socket() as sock:  # a port with no server
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with backend_for(f"http://127.0.0.1:{port}/v1") as backend:
        _, events = _reply(backend)
        _, final = _final(events)
    assert final.finish_reason == "error" and "refused the connection" in final.error


def test_a_stop_closes_the_http_stream_at_once():
    with scripted_server() as (url, script), backend_for(url) as backend:
        script.lines = _sse(*[_content(f"Word {i}. ") for i in range(200)])
        script.delay_each_s = 0.05
        reply, events = _reply(backend)
        first = events.get(timeout=10)
        assert first.chunks and first.finish_reason is None
        reply.stopped = True  # what ChatEngine.stop does on a barge-in
        _, final = _final(events, timeout=2)
        assert final.finish_reason == "cancelled"
        assert script.client_left.wait(5)  # the server saw the connection close
    assert final.stats["completion_tokens"] < 50


def test_the_engine_keeps_memory_and_stops_by_request_id():
    """The same engine as the packaged decoder: session memory, stop with what was spoken."""
    with scripted_server() as (url, script), backend_for(url) as backend:
        engine = ChatEngine(backend, None, EngineConfig(persona="You are Mia."))
        *_, last = engine.chat(HELLO, "s1", GREEDY)
        assert last.finish_reason == "stop"
        engine.chat(json.dumps([{"role": "user", "content": "And yours?"}]), "s1").__next__()
        backend.run_until_idle()
        time.sleep(0.2)
        sent = script.bodies[-1]["messages"]
        assert [m["role"] for m in sent] == ["system", "user", "assistant", "user"]
        assert sent[0]["content"] == "You are Mia." and sent[2]["content"] == (
            "Hello there. I am Mia."
        )
        assert script.bodies[0]["temperature"] == 0 and script.bodies[0]["max_tokens"] == 48
        # a long reply stopped by id: the session keeps what was spoken
        script.lines = _sse(*[_content(f"Word {i}. ") for i in range(200)])
        script.delay_each_s = 0.05
        events: queue.Queue[Event] = queue.Queue()
        request = engine.parse(json.dumps([{"role": "user", "content": "Tell me more"}]), "s1")
        engine.submit(request, events.put, request_id="r1")
        events.get(timeout=10)
        assert engine.stop("r1", "Word 0.", "s1") == "stopped"
        assert _final(events, timeout=3)[1].finish_reason == "cancelled"
        history = engine.sessions.history("s1")
        assert history[-1] == Message("assistant", "Word 0.")


# ------------------------------------------------------------ a real llama.cpp server


@pytest.fixture(scope="module")
def gguf() -> Path:
    from export.llm.convert import packaged_smollm2

    checkpoint = packaged_smollm2()
    return checkpoint.folder / str(checkpoint.gguf_file)


@pytest.fixture(scope="module")
def llama(gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    if not LlamaServer.installed():
        pytest.skip(
            "llama-cpp-python[server] is not installed: scripts/setup.sh --tests builds and "
            "installs it (a cached wheel under the artifact cache)"
        )
    server = LlamaServer(gguf, api_key=KEY).start(tmp_path_factory.mktemp("llama"))
    yield server
    server.stop()


def test_real_server_streams_a_reply_through_the_engine(llama):
    with backend_for(llama.url) as backend:
        engine = ChatEngine(backend, None, EngineConfig(first_clause_words=4))
        events = list(engine.chat(HELLO, "", GREEDY))
    final = events[-1]
    assert final.finish_reason in ("stop", "length"), final.error
    text = "".join(c.text for e in events for c in e.chunks)
    assert len([e for e in events if e.chunks]) > 3 and any(c.isalpha() for c in text)
    assert any(c.sentence for e in events for c in e.chunks)
    assert 0 < final.stats["ttft_ms"] <= final.stats["total_ms"]


def test_real_server_refuses_a_bad_key(llama):
    with backend_for(llama.url) as good:
        _, events = _reply(good, max_tokens=4)
        assert _final(events)[1].finish_reason in ("stop", "length")
    bad = OpenAIBackend(Endpoint(llama.url, "m", "wrong-key"))
    try:
        _, events = _reply(bad, max_tokens=4)
        final = _final(events)[1]
    finally:
        bad.stop()
    assert final.finish_reason == "error" and "refused the API key (HTTP 401)" in final.error
    assert "wrong-key" not in final.error


def test_real_server_stop_mid_reply_closes_the_stream(llama):
    with backend_for(llama.url) as backend:
        reply, events = _reply(backend, "Write a long story about a dragon.", max_tokens=400)
        events.get(timeout=60)
        reply.stopped = True
        stopped = time.monotonic()
        _, final = _final(events, timeout=5)
        assert time.monotonic() - stopped < 1.0
        assert final.finish_reason == "cancelled"
        assert final.stats["completion_tokens"] < 100
        # the server is free again at once: a new reply streams
        _, events = _reply(backend, "Hi", max_tokens=4, temperature=0)
        assert _final(events, timeout=60)[1].finish_reason in ("stop", "length")


def test_real_server_dying_mid_stream_ends_the_reply_with_an_error(gguf, tmp_path):
    if not LlamaServer.installed():
        pytest.skip("llama-cpp-python[server] is not installed (scripts/setup.sh --tests)")
    server = LlamaServer(gguf).start(tmp_path)
    try:
        with backend_for(server.url, first_token_timeout_s=5, idle_timeout_s=5) as backend:
            _, events = _reply(backend, "Write a long story about a dragon.", max_tokens=400)
            events.get(timeout=60)
            server.stop(kill=True)
            started = time.monotonic()
            _, final = _final(events, timeout=10)
            assert time.monotonic() - started < 6
    finally:
        server.stop()
    assert final.finish_reason == "error"
    assert "before the reply was complete" in final.error or "stalled" in final.error


# ------------------------------------- the `llm` model on tritonserver, over llama.cpp


@pytest.fixture(scope="module")
def llm_url(llama: LlamaServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A tritonserver serving only `llm`, configured as `avatar serve --llm URL` does
    (the environment), the key from a file: no `llm_decoder` is needed."""
    from serving.deployment import build_repository
    from serving.server import EmbeddedServer, ServerOptions

    folder = tmp_path_factory.mktemp("openai-llm")
    build_repository(folder / "repository", "embedded", ["llm"])
    (folder / "key").write_text(KEY)
    env = {"AVATAR_LLM_URL": llama.url, "AVATAR_LLM_API_KEY_FILE": str(folder / "key")}
    options = ServerOptions(folder / "repository", env=env, startup_timeout_s=300)
    with EmbeddedServer(options) as server:
        yield server.grpc_url
    assert KEY not in server.log_path.read_text()  # never logged


def _llm_call(url: str, messages: str, sampling: dict, **extra):
    from grpc_calls import call, strings

    inputs = {"messages": strings(messages), "sampling": strings(json.dumps(sampling))}
    inputs.update({k: strings(v) for k, v in extra.items()})
    return call(url, "llm", inputs, timeout_s=60)


def _texts(reply, name: str) -> list[str]:
    return [r[name].reshape(-1)[0].decode() for r in reply.responses if name in r]


def test_llm_model_streams_from_the_endpoint(llm_url):
    reply = _llm_call(llm_url, HELLO, {"temperature": 0, "max_tokens": 40})
    assert reply.error is None, reply.error
    finish = _texts(reply, "finish_reason")
    assert finish[-1] in ("stop", "length") and len(reply.responses) > 3
    assert "".join(_texts(reply, "text")).strip()
    assert any(_texts(reply, "sentence"))
    assert json.loads(_texts(reply, "stats")[-1])["ttft_ms"] > 0


def _stream_with_stop(url: str, messages: str, sampling: dict) -> list[dict[str, str]]:
    """One `llm` stream sent with a request id; on its first text a second request stops
    it, saying what was spoken (the `avatar` model's barge-in). The responses as text."""
    import numpy as np
    import tritonclient.grpc as grpcclient

    def inputs(**values) -> list:
        tensors = []
        for name, value in values.items():
            kind, array = (
                ("BOOL", np.array([value]))
                if isinstance(value, bool)
                else ("BYTES", np.array([value.encode()], dtype=object))
            )
            tensors.append(grpcclient.InferInput(name, [1], kind))
            tensors[-1].set_data_from_numpy(array)
        return tensors

    got: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    responses: list[dict[str, str]] = []
    try:
        client.async_stream_infer(
            "llm",
            inputs(messages=messages, session_id="barge", sampling=json.dumps(sampling)),
            request_id="turn-1",
            enable_empty_final_response=True,
        )
        while True:
            result, error = got.get(timeout=60)
            assert error is None, error.message()
            response = result.get_response()
            if response.outputs:
                responses.append(
                    {o.name: result.as_numpy(o.name)[0].decode() for o in response.outputs}
                )
                if len(responses) == 1:  # a second call, as the avatar model makes it
                    stop = inputs(stop=True, spoken="Once upon a time.", session_id="barge")
                    with grpcclient.InferenceServerClient(url) as other:
                        other.start_stream(callback=lambda result, error: None)
                        other.async_stream_infer("llm", stop, request_id="turn-1")
                        time.sleep(0.5)
                        other.stop_stream()
            if response.parameters["triton_final_response"].bool_param and any(
                r["finish_reason"] == "cancelled" for r in responses
            ):
                return responses
    finally:
        client.stop_stream()
        client.close()


def test_llm_model_stop_mid_reply_closes_the_endpoint_stream(llm_url, llama):
    """Barge-in: the `stop` input ends the reply within moments, its HTTP stream closed;
    the session keeps what was spoken."""
    story = json.dumps([{"role": "user", "content": "Write a long story about a dragon."}])
    responses = _stream_with_stop(llm_url, story, {"max_tokens": 600})
    final = next(r for r in responses if r["finish_reason"] == "cancelled")
    assert json.loads(final["stats"])["completion_tokens"] < 200  # not 600
    # cancelling the gRPC stream (a client that went away) ends it too
    from grpc_calls import call, strings

    inputs = {"messages": strings(story), "sampling": strings('{"max_tokens": 600}')}
    assert len(call(llm_url, "llm", inputs, timeout_s=60, cancel_after=2).responses) == 2
    # the llama.cpp server serves one stream at a time: a new reply at once means both
    # were closed, not left to run their 600 tokens
    started = time.monotonic()
    after = _llm_call(llm_url, HELLO, {"temperature": 0, "max_tokens": 8})
    assert after.error is None and _texts(after, "finish_reason")[-1] in ("stop", "length")
    assert time.monotonic() - started < 5


def test_llm_model_endpoint_dying_mid_stream_gives_a_clear_error(llm_url, llama):
    """Runs last: it kills the module's llama.cpp server."""
    got: queue.Queue = queue.Queue()
    story = json.dumps([{"role": "user", "content": "Write a long story about a dragon."}])

    def call_it() -> None:
        # no sentence budget: the persona's default (3 sentences) can end within a second
        sampling = {"temperature": 0, "max_tokens": 600, "max_sentences": 0}
        got.put(_llm_call(llm_url, story, sampling))

    thread = threading.Thread(target=call_it)
    thread.start()
    time.sleep(1.0)  # streaming by now (600 tokens take the server seconds)
    llama.stop(kill=True)
    thread.join(timeout=40)
    reply = got.get(timeout=1)
    assert reply.error is not None and "generation failed" in reply.error
    assert "before the reply was complete" in reply.error or "stalled" in reply.error
    # the server is down: the next turn fails at once, saying so
    down = _llm_call(llm_url, HELLO, {"max_tokens": 8})
    assert down.error is not None and "refused the connection" in down.error
    assert down.seconds < 10
