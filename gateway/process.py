"""The gateway as a child process (`avatar serve --web`, benchmarks, tests)."""

from __future__ import annotations

import contextlib
import os
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_gateway(
    triton_url: str,
    options: Sequence[str] = (),
    *,
    port: int | None = None,
    quiet: bool = False,
    ready_path: str = "/healthz",
    env: Mapping[str, str] | None = None,
    log_path: Path | None = None,
) -> Iterator[tuple[str, subprocess.Popen]]:
    """`python -m gateway` against `triton_url` with extra command-line `options`; yields
    (its http://127.0.0.1:PORT base URL, the process) once `ready_path` answers 200
    (`/healthz`: Triton's models are ready; `/` for the page alone, no Triton), and stops it
    on exit. `env`: added to this process's environment (secrets go there, not in argv);
    `log_path`: where its output goes (default: this process's, or nowhere when `quiet`)."""
    port = port or free_port()
    command = [sys.executable, "-m", "gateway", "--triton-url", triton_url, "--port", str(port)]
    log_file = Path(log_path).open("ab") if log_path is not None else None  # noqa: SIM115
    output = log_file or (subprocess.DEVNULL if quiet else None)
    environment = {**os.environ, **(env or {})}
    process = subprocess.Popen([*command, *options], stdout=output, stderr=output, env=environment)
    if log_file is not None:  # the child holds its own descriptor
        log_file.close()
    options = list(options)
    host = options[options.index("--host") + 1] if "--host" in options else "127.0.0.1"
    host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    tls = "--tls-cert" in options
    base = f"{'https' if tls else 'http'}://{host}:{port}"
    # the child's own certificate may be self-signed: this poll only asks whether it is up
    context = ssl._create_unverified_context() if tls else None
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(base + ready_path, timeout=2, context=context):
                    break
            except OSError:  # not listening yet, or 503 while Triton's models load
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the gateway did not become ready: {command}") from None
                time.sleep(0.3)
        yield base, process
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
