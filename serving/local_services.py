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
import time
import urllib.request
from collections.abc import Iterator, Mapping
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
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1) as connection:
                    connection.sendall(b"PING\r\n")
                    if connection.recv(16).startswith(b"+PONG"):
                        break
            except OSError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start on port {port}")
            time.sleep(0.1)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        process.kill()
        process.wait()
