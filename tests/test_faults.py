"""Faults on a real embedded tritonserver: a python-backend stub killed mid-run, and a
stage that raises inside a turn.

What Triton 2.51 does when a stub dies (measured here): the request in flight on it ends
with an error, the next request to that model finds the stub unhealthy and the python
backend restarts the stub (the model's `initialize` runs again); once it is up, requests
are served again without restarting the server. A stage failing inside an `avatar` turn
does not fail the turn: the pipeline speaks the configured fallback reply and the final
response lists the error.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from grpc_calls import Reply, call, strings

from avatar.deployment import build_repository
from avatar.server import EmbeddedServer, ServerOptions
from perf import probe

pytestmark = pytest.mark.server
MODELS = ["avatar", "llm", "llm_decoder", "tts", "tts_vits"]
PARAGRAPH = " ".join(f"Here is sentence number {n} of a long announcement." for n in range(1, 16))
FALLBACK = "Sorry, I need a moment. Could you say that again?"


@pytest.fixture(scope="module")
def fragile(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    """A server of its own: these tests kill its processes."""
    repo: Path = tmp_path_factory.mktemp("faults") / "repository"
    build_repository(repo, "embedded", MODELS)
    with EmbeddedServer(ServerOptions(repo, startup_timeout_s=600)) as server:
        yield server


def _kill_stub(server: EmbeddedServer, model: str) -> int:
    pid = probe.stub_pids(server.pid)[model]
    os.kill(pid, signal.SIGKILL)
    return pid


def _until_served(url: str, model: str, inputs: dict, timeout_s: float = 180) -> list[Reply]:
    """Send requests one after another until one is served; all replies in order."""
    replies, deadline = [], time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        replies.append(call(url, model, inputs, timeout_s=120))
        if replies[-1].error is None:
            return replies
        time.sleep(0.5)
    pytest.fail(f"{model} not served {timeout_s} s after its stub was killed: {replies[-3:]}")


def test_killed_tts_stub_is_restarted_and_service_recovers(fragile):
    url = fragile.grpc_url
    in_flight: list[Reply] = []
    thread = threading.Thread(
        target=lambda: in_flight.append(call(url, "tts", {"text": strings(PARAGRAPH)}))
    )
    thread.start()
    time.sleep(1.5)  # the stream has started speaking its sentences
    killed_at = time.monotonic()
    old = _kill_stub(fragile, "tts")
    thread.join(timeout=120)
    assert in_flight, "the in-flight stream never ended"
    interrupted = in_flight[0]
    print(f"in-flight stream: {len(interrupted.responses)} sentences, error {interrupted.error}")
    assert interrupted.error is not None or len(interrupted.responses) < 15

    replies = _until_served(url, "tts", {"text": strings("Hello again.")})
    recovered = time.monotonic() - killed_at
    errors = [r.error for r in replies if r.error]
    print(f"recovered {recovered:.1f} s after the kill; {len(errors)} refused first: {errors}")
    assert all("tts" in e for e in errors), errors
    new = probe.stub_pids(fragile.pid)["tts"]
    assert new != old and fragile.is_running()
    log = fragile.log_path.read_text(errors="replace")
    noted = [line for line in log.splitlines() if "tts" in line and "health" in line.lower()]
    print("\n".join(noted))
    assert noted, "the server log does not say that the tts stub was unhealthy"


def test_stage_that_raises_falls_back_to_the_configured_reply(fragile):
    """The llm refuses a persona far beyond its context: the llm stage raises inside the
    turn, the avatar speaks the fallback reply and lists the error in the final response."""
    persona = " ".join(f"rule{n}x{n * 7}q" for n in range(360))[:3990]  # ~3000 tokens
    controls = json.dumps({"persona": persona, "max_tokens": 16})
    reply = call(
        fragile.grpc_url, "avatar", {"text": strings("Hello"), "controls": strings(controls)}
    )
    assert reply.error is None, reply.error
    sentences = [r for r in reply.responses if r["kind"].reshape(-1)[0] == b"sentence"]
    final = reply.responses[-1]
    assert final["kind"].reshape(-1)[0] == b"final"
    errors = json.loads(final["error"].reshape(-1)[0])
    assert any(e.startswith("llm:") and "tokens" in e for e in errors), errors
    assert any("fallback" in e for e in errors), errors
    assert [s["text"].reshape(-1)[0].decode() for s in sentences] == [FALLBACK]
    assert sentences[0]["audio"].size > 0  # the fallback is spoken


def test_tts_stub_killed_during_a_turn_ends_the_turn_with_its_error(fragile):
    url = fragile.grpc_url
    turn = {
        "text": strings("Please tell me a long story about a lighthouse keeper."),
        "controls": strings('{"max_tokens": 200, "seed": 2}'),
    }
    result: list[Reply] = []
    thread = threading.Thread(target=lambda: result.append(call(url, "avatar", turn)))
    thread.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # kill once the turn is speaking
        if probe.gauge(probe.metrics(fragile.metrics_url), "tts", "requests") > 0:
            break
        time.sleep(0.05)
    _kill_stub(fragile, "tts")
    thread.join(timeout=180)
    assert result, "the turn never ended"
    reply = result[0]
    if reply.error is None:  # the turn ended with a final response naming the failure
        final = reply.responses[-1]
        assert final["kind"].reshape(-1)[0] == b"final"
        sentence_errors = [r["error"].reshape(-1)[0] for r in reply.responses[:-1] if "error" in r]
        listed = json.loads(final["error"].reshape(-1)[0])
        assert listed or any(sentence_errors), reply.responses
    else:
        assert "tts" in reply.error, reply.error
    # the next turn is served once the stub is back
    replies = _until_served(
        url, "avatar", {"text": strings("Hi"), "controls": strings('{"max_tokens": 8}')}
    )
    final = replies[-1].responses[-1]
    assert json.loads(final["error"].reshape(-1)[0]) == [] or len(replies) > 1
