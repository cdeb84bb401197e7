"""serving.health: Triton ready AND every python-backend stub alive.

The server test is the case it exists for: on a real embedded tritonserver, `kill -9` of
one python-backend stub leaves Triton saying ready (server and model), while the health
endpoint answers 503 within 10 s, the probe (`--check`) exits 1, and the watchdog ends the
server (compose's healing: the container exits and its restart policy starts a new one).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from serving.deployment import PROJECT_ROOT
from serving.health import (
    HealthCheck,
    Target,
    Verdict,
    Watchdog,
    api_key_headers,
    health_server,
    instance_count,
)
from serving.server import EmbeddedServer, ServerOptions, free_port
from serving.supervisor import stub_processes

MODELS = ["tts_vits", "vad"]  # python-backend runners: two tts_vits instances, one vad


def _get(url: str) -> tuple[int, dict]:
    """Status and JSON body ({} when the body is not JSON)."""
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            status, body = reply.status, reply.read()
    except urllib.error.HTTPError as error:
        status, body = error.code, error.read()
    try:
        return status, json.loads(body)
    except ValueError:
        return status, {}


# ------------------------------------------------------------------ no server


def test_instances_per_config() -> None:
    assert instance_count({"instance_group": [{"kind": "KIND_CPU", "count": 2}]}) == 2
    gpu = {"kind": "KIND_GPU", "count": 2, "gpus": [0, 1]}
    assert instance_count({"instance_group": [gpu, {"kind": "KIND_CPU", "count": 1}]}) == 5
    assert instance_count({}) == 1


def test_target_read_from_the_command_line() -> None:
    target = Target.from_argv(
        7,
        ["/opt/tritonserver/bin/tritonserver", "--model-repository=/cache/repo",
         "--http-port", "9000", "--strict-readiness=true"],
    )  # fmt: skip
    assert target == Target(7, "127.0.0.1:9000", ("/cache/repo",))
    defaults = Target.from_argv(1, ["tritonserver", "--model-store=/models"])
    assert defaults.http_url == "127.0.0.1:8000" and defaults.repositories == ("/models",)
    bound = Target.from_argv(1, ["tritonserver", "--http-address=10.0.0.5"])
    assert bound.http_url == "10.0.0.5:8000"


def test_api_key_from_a_file(tmp_path: Path) -> None:
    path = tmp_path / "api-key"
    path.write_text("s3cret\n")
    assert api_key_headers({"AVATAR_API_KEY_FILE": str(path)}) == {"avatar-api-key": "s3cret"}
    assert api_key_headers({"AVATAR_API_KEY": "k"}) == {"avatar-api-key": "k"}
    assert api_key_headers({}) == {}


def test_a_missing_server_is_unhealthy() -> None:
    verdict = HealthCheck(pid=2**22 + 1)()
    assert not verdict.healthy and "no process" in verdict.reason


def test_endpoint_answers_200_or_503_with_the_reason() -> None:
    verdicts = [Verdict(True, "ready"), Verdict(False, "stub died", {"tts": (0, 1)}, ("tts",))]
    server = health_server(lambda: verdicts[0], 0, "127.0.0.1")
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        assert _get(f"{url}/health") == (200, {"healthy": True, "reason": "ready", "stubs": {}})
        verdicts.reverse()
        time.sleep(0.6)  # the verdict is shared for 0.5 s
        status, body = _get(f"{url}/healthz")
        assert status == 503 and body["stubs"] == {"tts": {"alive": 0, "expected": 1}}
        assert _get(f"{url}/other")[0] == 404
    finally:
        server.shutdown()
        server.server_close()


class _DeadStubs:
    """A check whose stubs are dead, aimed at a process of our own."""

    def __init__(self, pid: int):
        self.pid = pid

    def target(self) -> Target:
        return Target(self.pid, "127.0.0.1:1", ())

    def __call__(self) -> Verdict:
        return Verdict(False, "stub died", {"tts": (0, 1)}, ("tts",))


def test_watchdog_signals_once_stubs_stay_dead() -> None:
    victim = subprocess.Popen(["sleep", "60"])
    try:
        watchdog = Watchdog(_DeadStubs(victim.pid), after_s=1.0, every_s=0.2).start()  # type: ignore[arg-type]
        assert victim.wait(timeout=10) == -signal.SIGTERM
        watchdog.stop()
        assert watchdog.signalled[:1] == [victim.pid]
    finally:
        victim.kill()
        victim.wait()


# ------------------------------------------------------------------ a real tritonserver


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    """A server of its own: these tests kill its stubs, then the server."""
    from serving.deployment import build_repository

    repo = tmp_path_factory.mktemp("health") / "repository"
    build_repository(repo, "embedded", MODELS)
    with EmbeddedServer(ServerOptions(repo, startup_timeout_s=600)) as embedded:
        yield embedded


def _health(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "serving.health", *args],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=PROJECT_ROOT,
        check=False,
    )


@pytest.mark.server
def test_a_dead_stub_fails_health_while_triton_says_ready(server: EmbeddedServer) -> None:
    pid = str(server.pid)
    check = _health("--check", "--pid", pid)
    assert check.returncode == 0, check.stdout + check.stderr
    assert json.loads(check.stdout)["stubs"] == {
        "tts_vits": {"alive": 2, "expected": 2},
        "vad": {"alive": 1, "expected": 1},
    }
    port = free_port()
    serving = subprocess.Popen(
        [sys.executable, "-m", "serving.health", "--serve", str(port), "--host", "127.0.0.1",
         "--pid", pid],
        cwd=PROJECT_ROOT,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}/health"
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                status, body = _get(url)
                break
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.2)
        assert status == 200 and body["healthy"], body

        victim = min(stub_processes(server.pid)["tts_vits"])
        os.kill(victim, signal.SIGKILL)
        killed = time.monotonic()
        while (status := _get(url)[0]) == 200 and time.monotonic() - killed < 10:
            time.sleep(0.2)
        took = time.monotonic() - killed
        status, body = _get(url)
        print(f"health 503 {took:.2f} s after kill -9 of stub {victim}: {body['reason']}")
        assert status == 503 and took < 10, body
        assert "tts_vits (1 of 2 alive)" in body["reason"]
        assert body["stubs"]["vad"] == {"alive": 1, "expected": 1}

        # what Triton itself says: ready, and so is the model whose stub is dead
        base = f"http://{server.http_url}/v2"
        assert _get(f"{base}/health/ready")[0] == 200
        assert _get(f"{base}/models/tts_vits/ready")[0] == 200

        for args in (("--check",), ("--check", "--live")):
            probe = _health(*args, "--pid", pid)
            assert probe.returncode == 1 and "tts_vits" in json.loads(probe.stdout)["reason"]
    finally:
        serving.terminate()
        serving.wait(timeout=10)
    assert "python-backend stub died" in serving.stderr.read()

    # compose's healing: the watchdog ends tritonserver (its container then restarts)
    watchdog = Watchdog(HealthCheck(pid=server.pid), after_s=1.0, every_s=0.5).start()
    try:
        deadline = time.monotonic() + 30
        while server.is_running() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not server.is_running() and watchdog.signalled == [server.pid]
    finally:
        watchdog.stop()


def test_entrypoint_adds_the_key_and_drains_before_stopping(tmp_path: Path) -> None:
    """docker/triton-entrypoint.sh with a stand-in server: the API-key flags come from the
    key file; SIGTERM makes the health endpoint say "draining" at once and reaches the
    server only after $AVATAR_DRAIN_SECONDS."""
    (tmp_path / "api-key").write_text("k3y\n")
    args, drain = tmp_path / "args", tmp_path / "draining"
    port = free_port()
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(PROJECT_ROOT),
        "AVATAR_API_KEY_FILE": str(tmp_path / "api-key"),
        "AVATAR_HEALTH_PORT": str(port),
        "AVATAR_DRAIN_FILE": str(drain),
        "AVATAR_DRAIN_SECONDS": "2",
    }
    server = 'printf "%s\\n" "$@" > "$0"; trap "exit 0" TERM; sleep 60 & wait'
    entrypoint = subprocess.Popen(
        [str(PROJECT_ROOT / "docker" / "triton-entrypoint.sh"), "bash", "-c", server, str(args)],
        env=env,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (args.exists() and _up(port)):
            time.sleep(0.2)
        assert args.read_text().split() == [
            "--grpc-restricted-protocol=inference,model-repository:avatar-api-key=k3y",
            "--http-restricted-api=inference,model-repository:avatar-api-key=k3y",
        ]
        started = time.monotonic()
        entrypoint.send_signal(signal.SIGTERM)
        time.sleep(0.6)  # past the endpoint's 0.5 s verdict cache
        assert drain.exists() and entrypoint.poll() is None, "draining, not stopped"
        status, body = _get(f"http://127.0.0.1:{port}/health")
        assert status == 503 and body["reason"].startswith("draining"), body
        assert entrypoint.wait(timeout=15) == 0
        assert time.monotonic() - started >= 2, "the server got the signal after the drain"
    finally:
        with contextlib.suppress(ProcessLookupError):  # the health server it started too
            os.killpg(entrypoint.pid, signal.SIGKILL)
        entrypoint.wait()


def _up(port: int) -> bool:
    try:
        _get(f"http://127.0.0.1:{port}/health")
    except (urllib.error.URLError, ConnectionError):
        return False
    return True
