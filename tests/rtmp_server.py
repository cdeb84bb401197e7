"""A real RTMP server for the broadcast's tests: nginx with Debian's `libnginx-mod-rtmp`,
started in the foreground on a free loopback port, its config, logs and pid in a temporary
prefix; always stopped. `rtmp_server` is the pytest fixture (import it into a test file).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

RTMP_MODULE = Path("/usr/lib/nginx/modules/ngx_rtmp_module.so")

_CONFIG = """\
load_module {module};
worker_processes 1;
error_log {prefix}/error.log info;
pid {prefix}/nginx.pid;
events {{ worker_connections 64; }}
rtmp {{
    server {{
        listen 127.0.0.1:{port};
        chunk_size 4096;
        application live {{
            live on;
            record off;
        }}
    }}
}}
"""


@dataclass
class RtmpServer:
    port: int
    prefix: Path
    process: subprocess.Popen[bytes]

    def url(self, stream: str = "test") -> str:
        """The URL a publisher pushes to and a player reads from."""
        return f"rtmp://127.0.0.1:{self.port}/live/{stream}"

    def error_log(self) -> str:
        return (self.prefix / "error.log").read_text(errors="replace")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _wait_accepting(process: subprocess.Popen[bytes], port: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"nginx-rtmp did not accept on port {port}")
        time.sleep(0.05)


@contextmanager
def running_rtmp_server(port: int | None = None, timeout_s: float = 10.0) -> Iterator[RtmpServer]:
    """nginx with an `rtmp { application live }` on 127.0.0.1:`port` (a free one if None)."""
    binary = shutil.which("nginx") or "/usr/sbin/nginx"
    if not Path(binary).exists() or not RTMP_MODULE.exists():
        raise FileNotFoundError(
            "nginx with libnginx-mod-rtmp is not installed (scripts/setup.sh --tests installs it)"
        )
    port = port or free_port()
    with tempfile.TemporaryDirectory(prefix="nginx-rtmp-") as folder:
        prefix = Path(folder)
        (prefix / "logs").mkdir()  # nginx opens logs/error.log before reading the config
        conf = prefix / "nginx.conf"
        conf.write_text(_CONFIG.format(module=RTMP_MODULE, prefix=prefix, port=port))
        command = [binary, "-c", str(conf), "-p", str(prefix), "-g", "daemon off;"]
        with (prefix / "stderr.log").open("wb") as stderr:
            process = subprocess.Popen(command, stderr=stderr)
        try:
            _wait_accepting(process, port, timeout_s)
            yield RtmpServer(port, prefix, process)
        finally:
            process.terminate()
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@pytest.fixture()
def rtmp_server() -> Iterator[RtmpServer]:
    """A real nginx-rtmp server of its own for one test."""
    if not RTMP_MODULE.exists() or shutil.which("nginx") is None:
        pytest.skip("nginx with libnginx-mod-rtmp is not installed (scripts/setup.sh --tests)")
    with running_rtmp_server() as server:
        yield server
