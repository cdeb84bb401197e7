"""Embedded Triton server: the `tritonserver` binary shipped in the `nvidia-pytriton` wheel.

The wheel carries Triton 2.51 (core, ensemble scheduler, dynamic batcher, python backend)
but needs two things prepared before it runs: the shared libraries of the wheel on
`LD_LIBRARY_PATH`, and a python-backend folder holding the stub built for the running
interpreter (the wheel ships one stub per Python minor version). Every `EmbeddedServer`
prepares its own backend folder and log file, so several servers can run side by side.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import importlib.util
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from avatar.conversation_tokens import SECRET_ENV
from avatar.credentials import GRPC_HEADER_PREFIX, KEY_HEADER
from serving.gauges import gauge, metrics
from serving.supervisor import Supervisor

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


class ServerError(RuntimeError):
    """The embedded server could not be found, started or made ready."""


@dataclasses.dataclass(frozen=True)
class TritonInstallation:
    """Paths inside the installed `nvidia-pytriton` wheel."""

    root: Path  # .../site-packages/pytriton/tritonserver

    @classmethod
    def find(cls) -> TritonInstallation:
        spec = importlib.util.find_spec("pytriton")
        if spec is None or not spec.submodule_search_locations:
            raise ServerError(
                "the nvidia-pytriton wheel is not installed; run scripts/setup.sh "
                "(or pip install 'triton-avatar[serve]')"
            )
        root = Path(next(iter(spec.submodule_search_locations))) / "tritonserver"
        installation = cls(root)
        if not installation.binary.is_file():
            raise ServerError(f"no tritonserver binary at {installation.binary}")
        return installation

    @property
    def binary(self) -> Path:
        return self.root / "bin" / "tritonserver"

    @property
    def library_dir(self) -> Path:
        return self.root.parent.parent / "nvidia_pytriton.libs"

    @property
    def python_backend_dir(self) -> Path:
        return self.root / "backends" / "python"

    def python_stub(self, version: tuple[int, int] | None = None) -> Path:
        major, minor = version or sys.version_info[:2]
        stub = (
            self.root / "python_backend_stubs" / f"{major}.{minor}" / "triton_python_backend_stub"
        )
        if not stub.is_file():
            shipped = sorted(p.name for p in (self.root / "python_backend_stubs").iterdir())
            raise ServerError(
                f"the wheel has no python-backend stub for Python {major}.{minor}; "
                f"it ships stubs for {', '.join(shipped)}"
            )
        return stub

    def prepare_backends(self, dest: Path) -> Path:
        """Build `dest/python` = the wheel's python backend + the stub for this interpreter."""
        python_dir = dest / "python"
        python_dir.mkdir(parents=True, exist_ok=True)
        for item in self.python_backend_dir.iterdir():
            if item.is_file():
                target = python_dir / item.name
                if not target.exists():
                    target.symlink_to(item)
        stub = python_dir / "triton_python_backend_stub"
        if not stub.exists():
            shutil.copy2(self.python_stub(), stub)
        return dest


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# Triton's restricted-protocol groups (the same names for gRPC protocols and HTTP APIs)
PROTOCOLS = (
    "health", "metadata", "inference", "shared-memory", "model-config", "model-repository",
    "statistics", "trace", "logging",
)  # fmt: skip
DEFAULT_KEY_HEADER = KEY_HEADER


@dataclasses.dataclass
class ServerOptions:
    """How to run one embedded server. Ports of 0 are replaced by free ones.

    Access control (Triton's restricted protocols): with `api_key` set, every gRPC and HTTP
    request of the `restricted` protocol groups must carry the header `key_header: api_key`
    or is refused; the others (health by default, so that probes work) stay open. TLS: with
    `tls_cert` and `tls_key` (PEM files) gRPC serves over TLS only; HTTP stays plain, so
    put HTTP behind a TLS proxy or restrict it too.
    """

    model_repository: Path
    # the interface every port binds: loopback unless the operator opens it ("0.0.0.0")
    host: str = "127.0.0.1"
    http_port: int = 0
    grpc_port: int = 0
    metrics_port: int = 0
    models: Sequence[str] = ()  # explicit model control: load only these (empty: all)
    log_verbose: int = 0
    startup_timeout_s: float = 180.0
    api_key: str = ""
    key_header: str = DEFAULT_KEY_HEADER
    restricted: Sequence[str] = ("inference", "model-repository")
    tls_cert: Path | None = None
    tls_key: Path | None = None
    # reload a model whose python-backend stub died, restart a server that exited
    # (serving.supervisor); needs explicit model control, so every model is loaded by name
    heal: bool = False
    # the secret of the session tokens (avatar/conversation_tokens.py) its models make and
    # verify; "" leaves $AVATAR_SESSION_SECRET as it is (none: callers' ids are trusted)
    session_secret: str = ""
    # more environment for the server and its models (e.g. the llm model's AVATAR_LLM_URL,
    # AVATAR_PERSONA_FILE: avatar/llm/settings.py); secrets belong in the inherited
    # environment or a *_FILE, not here, so that no file or argv shows them
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    extra_args: Sequence[str] = ()
    # the server's (and its model stubs') nice value: above 0 the models yield the CPU to
    # processes beside them, the gateway of `avatar serve --web` (WEB_NICENESS)
    niceness: int = 0

    def access_args(self) -> list[str]:
        """The tritonserver flags for the API key and TLS settings (none when unset)."""
        args = []
        if self.api_key:
            unknown = sorted(set(self.restricted) - set(PROTOCOLS))
            if unknown or not self.restricted:
                raise ServerError(
                    f"restricted protocols {list(self.restricted)}: expected some of {PROTOCOLS}"
                )
            if not self.key_header or any(c in self.key_header for c in ":=, "):
                raise ServerError(f"key header {self.key_header!r}: expected a plain header name")
            if any(c in self.api_key for c in ", "):
                raise ServerError("the API key must not contain commas or spaces")
            groups = ",".join(self.restricted)
            setting = f"{groups}:{self.key_header}={self.api_key}"
            args += [f"--grpc-restricted-protocol={setting}", f"--http-restricted-api={setting}"]
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ServerError("gRPC TLS needs both tls_cert and tls_key (PEM files)")
        if self.tls_cert is not None and self.tls_key is not None:
            for path in (self.tls_cert, self.tls_key):
                if not Path(path).is_file():
                    raise ServerError(f"TLS file {path} does not exist")
            args += [
                "--grpc-use-ssl=true",
                f"--grpc-server-cert={Path(self.tls_cert).resolve()}",
                f"--grpc-server-key={Path(self.tls_key).resolve()}",
            ]
        return args

    @property
    def headers(self) -> dict[str, str]:
        """The HTTP header that passes the API key ({} when no key is set)."""
        return {self.key_header: self.api_key} if self.api_key else {}

    @property
    def grpc_headers(self) -> dict[str, str]:
        """The gRPC metadata that passes the API key: Triton expects the header name with
        the prefix `triton-grpc-protocol-` on gRPC ({} when no key is set)."""
        return {f"{GRPC_HEADER_PREFIX}{self.key_header}": self.api_key} if self.api_key else {}

    def resolved(self) -> ServerOptions:
        return dataclasses.replace(
            self,
            model_repository=Path(self.model_repository).resolve(),
            http_port=self.http_port or free_port(),
            grpc_port=self.grpc_port or free_port(),
            metrics_port=self.metrics_port or free_port(),
        )


# The work-in-flight gauges (avatar.triton.metrics) that a stop waits to read 0: turns,
# llm generations (each holds a `llm_decoder` sequence open until its END step), tts
# streams and asr transcriptions (their `asr_decoder` sequences, the same way). Not
# "sessions": a conversation's memory is state, not work.
DRAINED = (("avatar", "turns"), ("llm", "generations"), ("tts", "requests"), ("asr", "requests"))

# `avatar serve --web`: the models' nice value beside the gateway (CFS weights 335 vs 1024:
# when both want the 2 cores, the gateway's loop gets its share at once)
WEB_NICENESS = 5


def _die_with_parent() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _child_setup(niceness: int) -> Callable[[], None]:
    def setup() -> None:  # between fork and exec: prctl and nice only, no locks taken
        _die_with_parent()
        if niceness:
            with contextlib.suppress(OSError):
                os.nice(niceness)

    return setup


class EmbeddedServer:
    """One `tritonserver` process; a context manager that always stops it.

    >>> with EmbeddedServer(ServerOptions(Path("build/repo"))) as server:
    ...     print(server.grpc_url)
    """

    def __init__(self, options: ServerOptions, installation: TritonInstallation | None = None):
        self.options = options.resolved()
        self.installation = installation or TritonInstallation.find()
        self._workdir = Path(tempfile.mkdtemp(prefix="avatar-triton-"))
        self.log_path = self._workdir / "tritonserver.log"
        self._process: subprocess.Popen[bytes] | None = None
        self.supervisor: Supervisor | None = None

    @property
    def _address(self) -> str:
        """Where clients on this machine reach it (loopback when it binds every interface)."""
        host = self.options.host
        return "127.0.0.1" if host in ("", "0.0.0.0", "::") else host

    @property
    def http_url(self) -> str:
        return f"{self._address}:{self.options.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{self._address}:{self.options.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self._address}:{self.options.metrics_port}/metrics"

    def command(self) -> list[str]:
        opts = self.options
        backends = self.installation.prepare_backends(self._workdir / "backends")
        cmd = [
            str(self.installation.binary),
            f"--model-repository={opts.model_repository}",
            f"--backend-directory={backends}",
            f"--http-address={opts.host}",
            f"--http-port={opts.http_port}",
            f"--grpc-address={opts.host}",
            f"--grpc-port={opts.grpc_port}",
            f"--metrics-port={opts.metrics_port}",
            f"--metrics-address={opts.host}",
            "--allow-metrics=true",
            "--allow-gpu-metrics=false",
            "--strict-readiness=true",
            "--exit-on-error=true",
            f"--log-verbose={opts.log_verbose}",
        ]
        if opts.models or opts.heal:
            cmd.append("--model-control-mode=explicit")
            cmd += [f"--load-model={name}" for name in opts.models or ["*"]]
        return cmd + opts.access_args() + list(opts.extra_args)

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        libs = [str(self.installation.library_dir)]
        if env.get("LD_LIBRARY_PATH"):
            libs.append(env["LD_LIBRARY_PATH"])
        env["LD_LIBRARY_PATH"] = os.pathsep.join(libs)
        # The stub's embedded Python ignores PYTHONPATH and finds its prefix through the
        # first `python3` on PATH: put this interpreter's bin first so that the stubs see
        # the same virtual environment (and this editable-installed project) as we do.
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
        if self.options.session_secret:
            env[SECRET_ENV] = self.options.session_secret
        env.update(self.options.env)
        return env

    def start(self) -> EmbeddedServer:
        if self._process is not None:
            raise ServerError("server already started")
        try:
            self._launch()
        except BaseException:
            self.stop()
            raise
        if self.options.heal and self.supervisor is None:
            self.supervisor = Supervisor(self).start()
        return self

    def _launch(self) -> None:
        """Start the process and wait until it is ready; on failure it is stopped again."""
        cmd = self.command()
        log.info("starting tritonserver: %s", " ".join(cmd))
        with self.log_path.open("ab") as log_file:  # a restart appends
            self._process = subprocess.Popen(
                cmd,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=self.environment(),
                preexec_fn=_child_setup(self.options.niceness),  # noqa: PLW1509 - no locks taken
            )
        try:
            self.wait_until_ready()
        except BaseException:
            self._stop_process()
            raise

    def restart(self) -> None:
        """Stop (if still running) and start again on the same ports. The new process gets
        SIGTERM when the thread that called this ends (PR_SET_PDEATHSIG is per thread): the
        supervisor's thread lives as long as the server it watches."""
        self._stop_process()
        self._launch()  # a failure raises and leaves it stopped: the supervisor tries again

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def _http_ok(self, path: str) -> bool:
        headers = self.options.headers if "health" in self.options.restricted else {}
        request = urllib.request.Request(f"http://{self.http_url}{path}", headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=2) as reply:
                return bool(reply.status == 200)
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False

    def wait_until_ready(self) -> None:
        """Block until the server and every model it loads are ready, or raise ServerError."""
        assert self._process is not None, "start() first"
        deadline = time.monotonic() + self.options.startup_timeout_s
        while time.monotonic() < deadline:
            code = self._process.poll()
            if code is not None:
                raise ServerError(
                    f"tritonserver exited with code {code} while starting "
                    f"(log {self.log_path}):\n{self.log_tail()}"
                )
            if self._http_ok("/v2/health/ready"):
                log.info("tritonserver ready: grpc %s http %s", self.grpc_url, self.http_url)
                return
            time.sleep(0.2)
        raise ServerError(
            f"tritonserver not ready after {self.options.startup_timeout_s:.0f} s "
            f"(log {self.log_path}):\n{self.log_tail()}"
        )

    @property
    def pid(self) -> int | None:
        """The tritonserver process id (its python-backend stubs are its children)."""
        return self._process.pid if self._process is not None else None

    def is_running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def stop(self, grace_s: float = 15.0, drain_s: float = 10.0) -> None:
        """Stop the supervisor, let the work in flight end (at most `drain_s`), then stop
        the server: SIGTERM, wait `grace_s`, then SIGKILL. Safe to call twice."""
        supervisor, self.supervisor = self.supervisor, None
        if supervisor is not None:
            supervisor.stop()
        if drain_s > 0 and self.is_running():
            self.drain(drain_s)
        self._stop_process(grace_s)

    def drain(self, timeout_s: float, quiet_s: float = 0.2) -> bool:
        """Wait until no turn, generation or speech is in flight (the models' DRAINED
        gauges read 0 for `quiet_s`) -> whether it got there within `timeout_s`.

        Why before SIGTERM: an exiting Triton refuses every new request, so work still
        running then cannot end: a cancelled turn's llm generation cannot send the END
        step of its `llm_decoder` sequence, and Triton waits for that open sequence (up
        to max_sequence_idle, 60 s) while a decoupled request without its final
        response keeps its model loaded; either kept the server past its 15-s grace."""
        deadline = time.monotonic() + timeout_s
        quiet_since, busy = None, {}
        while time.monotonic() < deadline:
            busy = self.work_in_flight()
            if busy is None:  # no metrics (not served, or the server is going): nothing to wait for
                return True
            if busy:
                quiet_since = None
            elif quiet_since is None:
                quiet_since = time.monotonic()
            elif time.monotonic() - quiet_since >= quiet_s:
                return True
            time.sleep(0.05)
        log.warning("tritonserver: work still in flight after %.0f s: %s", timeout_s, busy)
        return False

    def work_in_flight(self) -> dict[str, float] | None:
        """The DRAINED gauges above 0 ({} when none), None when /metrics does not answer."""
        try:
            values = metrics(self.metrics_url, ("avatar_active",), timeout=2)
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return None
        busy = {f"{model}/{what}": gauge(values, model, what) for model, what in DRAINED}
        return {key: value for key, value in busy.items() if value > 0}

    def _stop_process(self, grace_s: float = 15.0) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                log.warning("tritonserver ignored SIGTERM for %.0f s; killing it", grace_s)
                process.kill()
                process.wait()
        shutil.rmtree(self._workdir / "backends", ignore_errors=True)

    def __enter__(self) -> EmbeddedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
