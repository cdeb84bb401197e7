"""Faults on a real embedded tritonserver: a python-backend stub killed mid-run, the
server process killed, and a stage that raises inside a turn.

What Triton 2.51 does when a stub dies (shown by the first test): the stream in flight on it
ends with an error; the model stays READY, but every later request fails at once with
"Stub process '<model>_0_0' is not healthy." - this python backend never restarts the
stub. Unloading and loading the model (explicit model control) starts a new stub and
service recovers without restarting the server (a plain load of the loaded model did not
restart the stub in our runs). `ServerOptions(heal=True)` runs
serving.supervisor, which does that reload by itself for the ONNX runner models, restarts
the server when the stub of a BLS model died (the models it called stay blocked answering
it), and restarts a server that exited.
A stage failing inside an `avatar` turn does not fail the turn: the pipeline speaks the
configured fallback reply and the final response lists the error.
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

from avatar.pipeline import PipelineConfig
from perf import probe
from serving.deployment import build_repository
from serving.server import EmbeddedServer, ServerOptions
from serving.supervisor import Supervisor

pytestmark = pytest.mark.server
MODELS = ["avatar", "emotion_encoder", "llm", "llm_decoder", "tts", "tts_vits"]
PARAGRAPH = " ".join(f"Here is sentence number {n} of a long announcement." for n in range(1, 16))
FALLBACK = PipelineConfig.fallback_reply  # the avatar config sets none
HELLO = {"text": strings("Hello again.")}


@pytest.fixture(scope="module")
def fragile(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    """A server of its own (these tests kill its processes), healed by a supervisor."""
    repo: Path = tmp_path_factory.mktemp("faults") / "repository"
    build_repository(repo, "embedded", MODELS)
    with EmbeddedServer(ServerOptions(repo, startup_timeout_s=600, heal=True)) as server:
        yield server


def _kill_stub(server: EmbeddedServer, model: str) -> int:
    pid = probe.stub_pids(server.pid)[model]
    os.kill(pid, signal.SIGKILL)
    return pid


def _until_served(url: str, model: str, inputs: dict, timeout_s: float = 120) -> list[Reply]:
    """Send requests one after another until one is served; all replies in order."""
    replies, deadline = [], time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        replies.append(call(url, model, inputs, timeout_s=120))
        if replies[-1].error is None:
            return replies
        time.sleep(0.5)
    pytest.fail(f"{model} not served {timeout_s} s after its stub was killed: {replies[-3:]}")


@pytest.mark.slow
def test_killed_stub_stays_dead_until_its_model_is_reloaded(fragile):
    """Triton 2.51 alone (the supervisor paused): no stub restart; unload + load recovers."""
    import tritonclient.grpc as grpcclient

    url = fragile.grpc_url
    fragile.supervisor.stop()
    try:
        in_flight: list[Reply] = []
        thread = threading.Thread(
            target=lambda: in_flight.append(call(url, "tts", {"text": strings(PARAGRAPH)}))
        )
        thread.start()
        time.sleep(1.5)  # the stream is speaking its sentences
        old = _kill_stub(fragile, "tts")
        thread.join(timeout=120)
        interrupted = in_flight[0]
        print(f"in flight: {len(interrupted.responses)} of 15 sentences, then {interrupted.error}")
        assert interrupted.error is not None or len(interrupted.responses) < 15

        later = [call(url, "tts", HELLO) for _ in range(3)]
        for reply in later:
            assert reply.error is not None and "is not healthy" in reply.error, reply.error
        print(f"later requests: {later[0].error!r}, refused in {later[0].seconds:.2f} s")
        with grpcclient.InferenceServerClient(url) as client:
            assert client.is_model_ready("tts")  # READY, yet it cannot serve
            started = time.monotonic()
            client.unload_model("tts")
            while client.is_model_ready("tts"):
                time.sleep(0.1)
            client.load_model("tts")
            print(f"unload + load of tts: {time.monotonic() - started:.1f} s")
        assert call(url, "tts", HELLO).error is None
        assert probe.stub_pids(fragile.pid)["tts"] != old
    finally:
        fragile.supervisor = Supervisor(fragile).start()


@pytest.mark.slow
def test_supervisor_reloads_a_runner_model_whose_stub_died(fragile):
    url = fragile.grpc_url
    killed_at = time.monotonic()
    old = _kill_stub(fragile, "tts_vits")
    replies = _until_served(url, "tts", HELLO)
    recovered = time.monotonic() - killed_at
    errors = [r.error for r in replies if r.error]
    print(f"served again {recovered:.1f} s after the kill; {len(errors)} refused before")
    assert recovered < 30, recovered
    # before the reload: the dead stub; during it (unload + load): no version loaded
    assert all("not healthy" in e or "tts_vits" in e for e in errors), errors
    assert any(e.startswith("reloaded tts_vits") for e in fragile.supervisor.events)
    assert old not in probe.stub_processes(fragile.pid)["tts_vits"] and fragile.is_running()


def _turns(url: str, count: int, timeout_s: float) -> tuple[list[threading.Thread], list[Reply]]:
    """`count` concurrent long `avatar` turns; each ends by itself within `timeout_s`."""
    turn = {
        "text": strings("Please tell me a long story about a lighthouse keeper."),
        "controls": strings('{"max_tokens": 200, "seed": 2}'),
    }
    replies: list[Reply] = []
    threads = [
        threading.Thread(
            target=lambda: replies.append(call(url, "avatar", turn, timeout_s=timeout_s))
        )
        for _ in range(count)
    ]
    for thread in threads:
        thread.start()
    return threads, replies


def _when_speaking(server: EmbeddedServer, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if probe.gauge(probe.metrics(server.metrics_url), "tts", "requests") > 0:
            return
        time.sleep(0.05)
    pytest.fail("no turn reached tts")


@pytest.mark.slow
def test_avatar_stub_killed_during_three_turns_ends_them_and_heals(fragile):
    """Every stream in flight ends (an error) within seconds of the kill, not at a client
    timeout; the supervisor restarts the server; the next turn is whole."""
    url = fragile.grpc_url
    threads, replies = _turns(url, 3, timeout_s=120)
    _when_speaking(fragile)
    killed_at = time.monotonic()
    _kill_stub(fragile, "avatar")
    for thread in threads:
        thread.join(timeout=150)
    ended = time.monotonic() - killed_at
    print(f"3 turns ended {ended:.1f} s after the kill: {[r.error for r in replies]}")
    assert len(replies) == 3, "a turn never ended"
    assert all(r.error is not None and "stream cancelled" not in r.error for r in replies), [
        r.error for r in replies
    ]
    assert ended < 60, ended  # the supervisor's restart closed them, not a client timeout
    assert any(e.startswith("restarted tritonserver") for e in fragile.supervisor.events)
    reply = _until_served(
        url,
        "avatar",
        {"text": strings("Hi"), "controls": strings('{"max_tokens": 8}')},
        timeout_s=300,
    )[-1]
    assert reply.responses[-1]["kind"].reshape(-1)[0] == b"final"
    assert json.loads(reply.responses[-1]["error"].reshape(-1)[0]) == []


def test_stage_that_raises_falls_back_to_the_configured_reply(triton_server):
    """The llm refuses a persona far beyond its context: the llm stage raises inside the
    turn, the avatar speaks the fallback reply and lists the error in the final response."""
    persona = " ".join(f"rule{n}x{n * 7}q" for n in range(360))[:3990]  # ~3000 tokens
    controls = json.dumps({"persona": persona, "max_tokens": 16})
    reply = call(
        triton_server.grpc_url, "avatar", {"text": strings("Hello"), "controls": strings(controls)}
    )
    assert reply.error is None, reply.error
    sentences = [r for r in reply.responses if r["kind"].reshape(-1)[0] == b"sentence"]
    final = reply.responses[-1]
    assert final["kind"].reshape(-1)[0] == b"final"
    errors = json.loads(final["error"].reshape(-1)[0])
    assert any(e.startswith("llm:") and "tokens" in e for e in errors), errors
    assert any("fallback" in e for e in errors), errors
    assert " ".join(s["text"].reshape(-1)[0].decode() for s in sentences) == FALLBACK
    assert all(s["audio"].size > 0 for s in sentences)  # the fallback is spoken


@pytest.mark.slow
def test_tts_stub_killed_during_a_turn_ends_the_turn_with_its_error(fragile):
    url = fragile.grpc_url
    (thread,), result = _turns(url, 1, timeout_s=120)
    _when_speaking(fragile)
    _kill_stub(fragile, "tts")
    thread.join(timeout=180)
    assert result, "the turn never ended"
    reply = result[0]
    sentence_errors = [
        r["error"].reshape(-1)[0].decode() for r in reply.responses[:-1] if "error" in r
    ]
    print(f"turn: stream error {reply.error}; sentence errors {sentence_errors}")
    if reply.error is None:  # the turn ended with a final response naming the failure
        final = reply.responses[-1]
        assert final["kind"].reshape(-1)[0] == b"final"
        listed = json.loads(final["error"].reshape(-1)[0])
        print(f"final errors: {listed}")
        assert any("tts" in e for e in [*listed, *sentence_errors]), reply.responses
    else:  # the stage's error, or the connection closed by the supervisor's restart
        assert "stream cancelled" not in reply.error, reply.error
    # turns are whole again once the supervisor has restarted the server
    clean, deadline = None, time.monotonic() + 180
    hi = {"text": strings("Hi"), "controls": strings('{"max_tokens": 8}')}
    while clean is None and time.monotonic() < deadline:
        reply = call(url, "avatar", hi, timeout_s=60)
        if reply.error is None and json.loads(reply.responses[-1]["error"].reshape(-1)[0]) == []:
            clean = reply
    assert clean is not None, "no clean turn within 180 s of the tts stub's death"


@pytest.mark.slow
def test_supervisor_restarts_a_server_that_died(fragile):
    url = fragile.grpc_url
    killed_at = time.monotonic()
    os.kill(fragile.pid, signal.SIGKILL)
    replies = _until_served(url, "tts", HELLO, timeout_s=300)
    print(f"served again {time.monotonic() - killed_at:.1f} s after tritonserver was killed")
    assert "restarted tritonserver" in fragile.supervisor.events, fragile.supervisor.events
    assert replies[-1].error is None and fragile.grpc_url == url


@pytest.mark.slow
def test_supervisor_leaves_a_deliberately_unloaded_model_alone(tmp_path):
    """Model control still works under the supervisor: an unloaded model stays unloaded;
    loaded again, it is watched again (its killed stub is reloaded)."""
    import tritonclient.grpc as grpcclient

    build_repository(tmp_path / "repository", "embedded", ["vad"])
    options = ServerOptions(tmp_path / "repository", heal=True)
    with (
        EmbeddedServer(options) as server,
        grpcclient.InferenceServerClient(server.grpc_url) as client,
    ):
        client.unload_model("vad")
        time.sleep(3 * server.supervisor.every_s + 1)
        assert not client.is_model_ready("vad") and server.supervisor.events == []
        client.load_model("vad")
        time.sleep(2 * server.supervisor.every_s + 0.5)  # a round notices the new stub
        _kill_stub(server, "vad")
        deadline = time.monotonic() + 30
        while not server.supervisor.events and time.monotonic() < deadline:
            time.sleep(0.2)
        assert any(e.startswith("reloaded vad") for e in server.supervisor.events)
        assert client.is_model_ready("vad")
