"""The embedded server launcher: ports, readiness, failures with the log, clean stops."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from serving.deployment import build_repository
from serving.server import EmbeddedServer, ServerError, ServerOptions, TritonInstallation


@pytest.fixture(scope="module")
def vad_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("vad-only") / "repository"
    build_repository(repo, "embedded", ["vad"])
    return repo


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie is dead too
        return stat.read().split()[2] != "Z"


def test_installation_has_a_stub_for_this_python() -> None:
    installation = TritonInstallation.find()
    assert installation.binary.is_file()
    assert installation.python_stub().is_file()
    with pytest.raises(ServerError, match="ships stubs for"):
        installation.python_stub((2, 7))


@pytest.mark.extended  # CI: every module's own server runs beside the shared one
def test_two_servers_side_by_side_then_stopped(vad_repository: Path) -> None:
    with (
        EmbeddedServer(ServerOptions(vad_repository)) as a,
        EmbeddedServer(ServerOptions(vad_repository)) as b,
    ):
        assert a.grpc_url != b.grpc_url
        for server in (a, b):
            with grpcclient.InferenceServerClient(server.grpc_url) as client:
                assert client.is_server_ready()
                assert client.is_model_ready("vad")
        pid = a._process.pid
    assert not _alive(pid)
    a.stop()  # a second stop is harmless


def test_load_failure_raises_with_the_log_tail(tmp_path: Path, vad_repository: Path) -> None:
    repo = tmp_path / "repository"
    (repo / "broken" / "1").mkdir(parents=True)
    (repo / "broken" / "config.pbtxt").write_text(
        'name: "broken"\nbackend: "python"\nmax_batch_size: 0\n'
        'input [ { name: "x", data_type: TYPE_FP32, dims: [ 1 ] } ]\n'
        'output [ { name: "y", data_type: TYPE_FP32, dims: [ 1 ] } ]\n'
    )
    (repo / "broken" / "1" / "model.py").write_text("raise ImportError('model cannot start')\n")
    started = time.monotonic()
    with pytest.raises(ServerError, match="model cannot start"):
        EmbeddedServer(ServerOptions(repo, startup_timeout_s=60)).start()
    assert time.monotonic() - started < 30, "a load failure must not wait for the timeout"


def test_server_dies_with_its_parent(vad_repository: Path, tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import sys, time
        from pathlib import Path
        from serving.server import EmbeddedServer, ServerOptions
        server = EmbeddedServer(ServerOptions(Path({str(vad_repository)!r}))).start()
        print(server._process.pid, flush=True)
        time.sleep(600)
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        server_pid = int(parent.stdout.readline())
        assert _alive(server_pid)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 30
        while _alive(server_pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(server_pid), "tritonserver outlived the process that started it"
    finally:
        parent.kill()


def test_vad_in_shared_server_answers(triton_server: EmbeddedServer) -> None:
    with grpcclient.InferenceServerClient(triton_server.grpc_url) as client:
        assert client.is_model_ready("vad")
        chunk = grpcclient.InferInput("chunk", [1, 512], "FP32")
        chunk.set_data_from_numpy(np.zeros((1, 512), np.float32))
        context = grpcclient.InferInput("context", [1, 64], "FP32")
        context.set_data_from_numpy(np.zeros((1, 64), np.float32))
        state = grpcclient.InferInput("state", [1, 2, 128], "FP32")
        state.set_data_from_numpy(np.zeros((1, 2, 128), np.float32))
        result = client.infer("vad", [chunk, context, state])
        assert result.as_numpy("speech_prob").shape == (1, 1)
