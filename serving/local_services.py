"""The deployment's other services, run on this machine from Debian's packages (the
multi-replica run `python -m perf failover`, the tests):

- the load balancer that ships in deploy/ (HAProxy, deploy/haproxy/haproxy.cfg) in front
  of local replicas: the shipped file with its DNS `server-template` (the lines from
  `# servers` to the next blank line) replaced by static servers; every other setting
  (hash on `session-id`, health checks, retries, timeouts) is the shipped one;
- a Redis of its own (the conversation store), on a free loopback port, no persistence.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from serving.deployment import PROJECT_ROOT
from serving.server import free_port

HAPROXY_CFG = PROJECT_ROOT / "deploy" / "haproxy" / "haproxy.cfg"


def local_config(servers: Mapping[str, tuple[int, int]], shipped: Path = HAPROXY_CFG) -> str:
    """The shipped config with static servers: name -> (gRPC port, health port) on
    127.0.0.1. (HAProxy 2.6 ignores check-proto on `default-server`: it is on each line.)"""
    lines = "".join(
        f"    server {name} 127.0.0.1:{grpc} proto h2 check port {health} check-proto h1\n"
        for name, (grpc, health) in servers.items()
    )
    pattern = r"^(\s+# servers\n)(?:.+\n)+?(?=\n)"
    config, count = re.subn(pattern, lambda m: m.group(1) + lines, shipped.read_text(), flags=re.M)
    if count != 1:
        raise ValueError(f"{shipped}: expected one `# servers` block, found {count}")
    return config


def environment(grpc_port: int | None = None, monitor_port: int | None = None) -> dict[str, str]:
    """HAProxy's listening addresses (the config reads them) on loopback ports."""
    return {
        **os.environ,
        "AVATAR_LB_BIND": f"127.0.0.1:{grpc_port or free_port()}",
        "AVATAR_LB_MONITOR_BIND": f"127.0.0.1:{monitor_port or free_port()}",
        "AVATAR_LB_STATS_BIND": f"127.0.0.1:{free_port()}",
    }


def haproxy_binary() -> str:
    binary = shutil.which("haproxy")
    if binary is None:
        raise FileNotFoundError("haproxy is not installed (apt-get install haproxy)")
    return binary


@contextlib.contextmanager
def running_haproxy(config: str, workdir: Path, timeout_s: float = 20.0) -> Iterator[int]:
    """HAProxy in the foreground on `config`; yields its gRPC port once its monitor answers
    (log: workdir/haproxy.log); always stopped."""
    port, monitor = free_port(), free_port()
    path = workdir / "haproxy.cfg"
    path.write_text(config)
    with (workdir / "haproxy.log").open("wb") as log:
        process = subprocess.Popen(
            [haproxy_binary(), "-db", "-f", str(path)],
            env=environment(port, monitor),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + timeout_s
            while True:
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{monitor}/healthz", timeout=1)
                    break
                except OSError:
                    if process.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(
                            f"haproxy did not start: {workdir / 'haproxy.log'}"
                        ) from None
                    time.sleep(0.2)
            yield port
        finally:
            process.terminate()
            process.wait(timeout=10)


@contextlib.contextmanager
def running_redis(timeout_s: float = 10.0) -> Iterator[str]:
    """A redis-server of its own; yields its redis:// URL once it answers; always stopped."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise FileNotFoundError("redis-server is not installed (apt-get install redis-server)")
    port = free_port()
    command = [
        binary,
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
    ]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    try:
        _wait_answering(process, port, timeout_s, "redis-server", ping=b"PING\r\n", pong=b"+PONG")
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        process.kill()
        process.wait()


class LlamaServer:
    """llama.cpp's OpenAI-compatible server (`python -m llama_cpp.server`, from
    `llama-cpp-python[server]`: scripts/setup.sh --tests installs it) on a GGUF file, on a
    free loopback port: a real endpoint for the `llm` model's openai backend. The key goes
    through the environment (its settings read API_KEY), never argv."""

    def __init__(self, model: Path, api_key: str = "", threads: int = 1, context: int = 2048):
        self.model, self.api_key = Path(model), api_key
        self.threads, self.context = threads, context
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path: Path | None = None

    @staticmethod
    def installed() -> bool:
        import importlib.util

        return importlib.util.find_spec("llama_cpp") is not None and all(
            importlib.util.find_spec(m) is not None for m in ("uvicorn", "sse_starlette")
        )

    @property
    def url(self) -> str:
        """The OpenAI base URL."""
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self, workdir: Path, timeout_s: float = 120.0) -> LlamaServer:
        import sys

        command = [
            sys.executable, "-m", "llama_cpp.server", "--model", str(self.model),
            "--host", "127.0.0.1", "--port", str(self.port), "--n_ctx", str(self.context),
            "--n_threads", str(self.threads), "--n_threads_batch", str(self.threads),
        ]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if k != "API_KEY"}
        if self.api_key:
            env["API_KEY"] = self.api_key
        self.log_path = workdir / f"llama-server-{self.port}.log"
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        while True:
            try:
                request = urllib.request.Request(f"{self.url}/models", headers=headers)
                urllib.request.urlopen(request, timeout=2).close()
                return self
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"llama.cpp server did not start: {self.log_path}") from None
                time.sleep(0.3)

    def stop(self, kill: bool = False) -> None:
        """Stop it (SIGKILL with `kill`: a server that dies mid-stream)."""
        process, self.process = self.process, None
        if process is None:
            return
        if process.poll() is None:
            process.kill() if kill else process.terminate()
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


# nginx with Debian's RTMP module: the broadcast's local server (`avatar broadcast
# --local-rtmp`), its tests and `python -m perf broadcast`
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
    """A running nginx-rtmp (`running_rtmp_server`)."""

    port: int
    prefix: Path
    process: subprocess.Popen[bytes]

    def url(self, stream: str = "test") -> str:
        """The URL a publisher pushes to and a player reads from."""
        return f"rtmp://127.0.0.1:{self.port}/live/{stream}"

    def error_log(self) -> str:
        return (self.prefix / "error.log").read_text(errors="replace")


def _wait_answering(
    process: subprocess.Popen[bytes],
    port: int,
    timeout_s: float,
    what: str,
    *,
    ping: bytes = b"",
    pong: bytes = b"",
) -> None:
    """Return once 127.0.0.1:`port` accepts (and answers `ping` with `pong`); RuntimeError
    when `process` ends or `timeout_s` passes first."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as connection:
                if not ping:
                    return
                connection.sendall(ping)
                if connection.recv(16).startswith(pong):
                    return
        except OSError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not start on port {port}")
        time.sleep(0.05)


@contextlib.contextmanager
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
            # its own session: a Ctrl-C meant for the broadcast must not stop it first
            process = subprocess.Popen(command, stderr=stderr, start_new_session=True)
        try:
            _wait_answering(process, port, timeout_s, "nginx-rtmp")
            yield RtmpServer(port, prefix, process)
        finally:
            process.terminate()
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
