"""A health check that tells the truth about a tritonserver: ready AND every python-backend
stub alive.

Triton 2.51's python backend never restarts a stub that died (killed, out of memory, a
crash in native code), and the model stays READY: `/v2/health/ready` answers 200 while
every request to that model fails with "Stub process '<model>_0_0' is not healthy."
(serving/supervisor.py, tests/test_faults.py). This check asks Triton whether it is ready,
then counts each loaded python-backend model's live stub processes (children of
tritonserver, found in /proc by `serving.supervisor.stub_processes`) against the instances
its config declares. It reads nothing but /proc and Triton's own health and model-config
endpoints, so it runs beside tritonserver in its container:

    python3 -m serving.health --check [--live]          # exit 0 healthy, 1 not (a probe)
    python3 -m serving.health --serve 8003 [--restart-after 10]
        # GET /health: 200 or 503 with a JSON reason (HAProxy's httpchk); with
        # --restart-after, SIGTERM tritonserver once a stub has been dead that long, so
        # that the container exits and its restart policy heals it (compose)

Draining: while the file $AVATAR_DRAIN_FILE names exists (docker/triton-entrypoint.sh
makes it on SIGTERM, then waits for the turns in flight before stopping tritonserver,
which itself would fail them at once), the check answers "draining": HAProxy sends no new
turns, Kubernetes readiness turns false.

The tritonserver is found in /proc (the only process named `tritonserver`; `--pid` picks
one where several run), and its HTTP port and model repository are read from its command
line. When an operator restricts Triton's health or model-config APIs too, the key comes
from $AVATAR_API_KEY or the file $AVATAR_API_KEY_FILE names (never an argument).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from avatar.credentials import API_KEY_ENV, KEY_HEADER, read_secret
from serving.supervisor import alive, stub_processes

log = logging.getLogger(__name__)

DRAIN_FILE_ENV = "AVATAR_DRAIN_FILE"
DEFAULT_HTTP_PORT = 8000  # tritonserver's own default
DEFAULT_SERVE_PORT = 8003  # beside Triton's 8000-8002
PATHS = ("/", "/health", "/healthz")


class HealthError(RuntimeError):
    """The tritonserver to check cannot be found or read."""


@dataclasses.dataclass(frozen=True)
class Target:
    """One running tritonserver: its pid, where its HTTP API listens, its repositories."""

    pid: int
    http_url: str  # host:port
    repositories: tuple[str, ...]

    @classmethod
    def from_argv(cls, pid: int, argv: Sequence[str]) -> Target:
        """Read `--http-port`, `--http-address` and `--model-repository` (also given as
        `--model-store`) from tritonserver's arguments; Triton's defaults otherwise."""
        flags: dict[str, list[str]] = {}
        args = list(argv[1:])
        for index, arg in enumerate(args):
            if not arg.startswith("--"):
                continue
            name, equals, value = arg.partition("=")
            if not equals and index + 1 < len(args) and not args[index + 1].startswith("--"):
                value = args[index + 1]
            flags.setdefault(name, []).append(value)
        host = (flags.get("--http-address") or ["0.0.0.0"])[-1]
        if host in ("", "0.0.0.0", "::", "[::]"):
            host = "127.0.0.1"
        port = (flags.get("--http-port") or [str(DEFAULT_HTTP_PORT)])[-1]
        repositories = flags.get("--model-repository", []) + flags.get("--model-store", [])
        return cls(pid, f"{host}:{port}", tuple(repositories))

    @classmethod
    def of_process(cls, pid: int) -> Target:
        try:
            raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            raise HealthError(f"no process {pid}") from None
        return cls.from_argv(pid, [a.decode(errors="replace") for a in raw.split(b"\0") if a])


def find_tritonserver() -> int:
    """The pid of the one live process whose program is `tritonserver`."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            program = cmdline.read_bytes().split(b"\0", 1)[0]
        except OSError:
            continue
        pid = int(cmdline.parent.name)
        if Path(program.decode(errors="replace")).name == "tritonserver" and alive(pid):
            found.append(pid)
    if not found:
        raise HealthError("no tritonserver process is running")
    if len(found) > 1:
        raise HealthError(f"several tritonserver processes ({sorted(found)}): pass --pid")
    return found[0]


def instance_count(config: dict[str, Any]) -> int:
    """The execution instances a model config (Triton's JSON) declares: `count` per group,
    per listed GPU for KIND_GPU groups. Each is one stub process for the python backend."""
    total = 0
    for group in config.get("instance_group") or [{"count": 1}]:
        count, gpus = int(group.get("count", 1)), group.get("gpus") or []
        total += count * len(gpus) if group.get("kind") == "KIND_GPU" and gpus else count
    return total


def api_key_headers(env: dict[str, str] | None = None) -> dict[str, str]:
    """The API-key header from $AVATAR_API_KEY or $AVATAR_API_KEY_FILE ({} when neither)."""
    try:
        key = read_secret(API_KEY_ENV, env)
    except ValueError as error:
        raise HealthError(str(error)) from None
    return {KEY_HEADER: key} if key else {}


@dataclasses.dataclass(frozen=True)
class Verdict:
    """The answer of one check. `dead_stubs` lists models whose stubs died (the case that
    a restart heals); `stubs` maps each loaded python-backend model to (alive, expected)."""

    healthy: bool
    reason: str
    stubs: dict[str, tuple[int, int]] = dataclasses.field(default_factory=dict)
    dead_stubs: tuple[str, ...] = ()

    def to_json(self) -> str:
        return json.dumps(
            {
                "healthy": self.healthy,
                "reason": self.reason,
                "stubs": {m: {"alive": a, "expected": e} for m, (a, e) in self.stubs.items()},
            },
            sort_keys=True,
        )


class HealthCheck:
    """Callable: one round of the check against one tritonserver (found anew each round
    unless `pid` is given, so a restarted server is followed)."""

    def __init__(
        self,
        pid: int | None = None,
        http_url: str | None = None,
        *,
        live: bool = False,
        timeout_s: float = 2.0,
        headers: dict[str, str] | None = None,
        drain_file: str | None = None,
    ):
        self.pid, self.http_url, self.live, self.timeout_s = pid, http_url, live, timeout_s
        self.headers = api_key_headers() if headers is None else headers
        self.drain_file = os.environ.get(DRAIN_FILE_ENV) if drain_file is None else drain_file

    def target(self) -> Target:
        target = Target.of_process(self.pid or find_tritonserver())
        if self.http_url:
            target = dataclasses.replace(target, http_url=self.http_url)
        return target

    def _get(self, target: Target, path: str) -> tuple[int, bytes]:
        request = urllib.request.Request(f"http://{target.http_url}{path}", headers=self.headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as reply:
                return reply.status, reply.read()
        except urllib.error.HTTPError as error:
            return error.code, b""
        except (urllib.error.URLError, ConnectionError, TimeoutError) as error:
            reason = getattr(error, "reason", error)
            raise HealthError(f"tritonserver's HTTP API ({target.http_url}): {reason}") from None

    def _model_names(self, target: Target) -> list[str]:
        names: set[str] = set()
        for repository in target.repositories:
            folder = Path(repository)
            if folder.is_dir():
                names |= {p.parent.name for p in folder.glob("*/config.pbtxt")}
            else:  # a cloud repository (s3://, gs://): ask Triton what it loaded
                request = urllib.request.Request(
                    f"http://{target.http_url}/v2/repository/index",
                    data=b"{}",
                    headers={"Content-Type": "application/json", **self.headers},
                    method="POST",
                )
                try:
                    with urllib.request.urlopen(request, timeout=self.timeout_s) as reply:
                        names |= {m["name"] for m in json.load(reply)}
                except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError):
                    raise HealthError(f"cannot list the models of {repository}") from None
        return sorted(names)

    def python_models(self, target: Target) -> dict[str, int]:
        """Loaded python-backend model -> instances (stubs) its config declares."""
        models = {}
        for name in self._model_names(target):
            status, body = self._get(target, f"/v2/models/{name}/config")
            if status != 200:  # not loaded (explicit model control, or being reloaded)
                continue
            config = json.loads(body)
            if config.get("backend") == "python":
                models[name] = instance_count(config)
        return models

    def __call__(self) -> Verdict:
        if self.drain_file and Path(self.drain_file).exists() and not self.live:
            return Verdict(False, "draining: stopping once the turns in flight are done")
        try:
            target = self.target()
            endpoint = "live" if self.live else "ready"
            status, _ = self._get(target, f"/v2/health/{endpoint}")
            if status != 200:
                return Verdict(False, f"tritonserver is not {endpoint} ({status})")
            expected = self.python_models(target)
        except HealthError as error:
            return Verdict(False, str(error))
        running = stub_processes(target.pid)
        stubs = {m: (len(running.get(m, ())), n) for m, n in expected.items()}
        dead = tuple(m for m, (live, n) in stubs.items() if live < n)
        if dead:
            detail = ", ".join(f"{m} ({stubs[m][0]} of {stubs[m][1]} alive)" for m in dead)
            reason = f"python-backend stub died: {detail}; Triton still reports it ready"
            return Verdict(False, reason, stubs, dead)
        return Verdict(True, f"{endpoint}; {len(stubs)} python-backend models, stubs alive", stubs)


class _CachedCheck:
    """One verdict shared by the callers of `max_age_s` (several balancers poll at 1 s)."""

    def __init__(self, check: Callable[[], Verdict], max_age_s: float = 0.5):
        self.check, self.max_age_s = check, max_age_s
        self._lock = threading.Lock()
        self._verdict: Verdict | None = None
        self._at = 0.0

    def __call__(self) -> Verdict:
        with self._lock:
            if self._verdict is None or time.monotonic() - self._at > self.max_age_s:
                self._verdict, self._at = self.check(), time.monotonic()
            return self._verdict


def health_server(
    check: Callable[[], Verdict], port: int, host: str = "0.0.0.0"
) -> ThreadingHTTPServer:
    """An HTTP server (not started): GET / , /health or /healthz answers 200 or 503 with
    the verdict as JSON. Logs state changes only, not each poll."""
    cached = _CachedCheck(check)
    last: list[bool | None] = [None]

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?", 1)[0] not in PATHS:
                self.send_error(404)
                return
            verdict = cached()
            if verdict.healthy != last[0]:
                last[0] = verdict.healthy
                log.log(logging.INFO if verdict.healthy else logging.ERROR, verdict.reason)
            body = verdict.to_json().encode() + b"\n"
            try:
                self.send_response(200 if verdict.healthy else 503)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Cache-Control", "no-store")
                self.end_headers()
                self.wfile.write(body)
            except ConnectionError:  # HAProxy closes once it has read the status line
                pass

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    return server


class Watchdog:
    """Sends SIGTERM to tritonserver once its stubs have been dead for `after_s` seconds
    (a whole container exits and its restart policy starts a fresh one). Only dead stubs
    count: a server that is merely not ready yet (loading engines) is left alone."""

    def __init__(
        self, check: HealthCheck, after_s: float, every_s: float = 1.0, sig: int = signal.SIGTERM
    ):
        self.check, self.after_s, self.every_s, self.sig = check, after_s, every_s, sig
        self.signalled: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="health-watchdog", daemon=True)

    def start(self) -> Watchdog:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        dead_since: float | None = None
        while not self._stop.wait(self.every_s):
            verdict = self.check()
            if not verdict.dead_stubs:
                dead_since = None
                continue
            dead_since = dead_since or time.monotonic()
            if time.monotonic() - dead_since >= self.after_s:
                try:
                    pid = self.check.target().pid
                except HealthError:
                    continue
                log.error("%s: sending signal %d to tritonserver %d", verdict.reason, self.sig, pid)
                try:
                    os.kill(pid, self.sig)
                except ProcessLookupError:
                    continue
                self.signalled.append(pid)
                dead_since = None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m serving.health", description=__doc__)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="check once: exit 0 or 1")
    mode.add_argument("--serve", type=int, metavar="PORT", help="answer GET /health on PORT")
    parser.add_argument("--host", default="0.0.0.0", help="the interface --serve binds")
    parser.add_argument("--pid", type=int, help="the tritonserver (default: found in /proc)")
    parser.add_argument("--http-url", help="its HTTP API, host:port (default: its --http-port)")
    parser.add_argument(
        "--live", action="store_true", help="Triton live (not ready) + stubs: a liveness probe"
    )
    parser.add_argument("--timeout", type=float, default=2.0, help="per HTTP call, seconds")
    parser.add_argument(
        "--restart-after",
        type=float,
        metavar="S",
        help="with --serve: SIGTERM tritonserver when a stub has been dead S seconds",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="serving.health: %(levelname)s %(message)s")
    try:
        check = HealthCheck(args.pid, args.http_url, live=args.live, timeout_s=args.timeout)
    except HealthError as error:
        print(json.dumps({"healthy": False, "reason": str(error)}))
        return 1
    if args.check:
        verdict = check()
        print(verdict.to_json())
        return 0 if verdict.healthy else 1
    watchdog = Watchdog(check, args.restart_after).start() if args.restart_after else None
    server = health_server(check, args.serve, args.host)
    log.info("answering GET /health on %s:%d", args.host, args.serve)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        if watchdog is not None:
            watchdog.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
