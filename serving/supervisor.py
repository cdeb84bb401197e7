"""Keeps an embedded tritonserver serving when its processes die.

Triton 2.51's python backend does not restart a python-backend stub that died (killed,
out of memory, a crash in native code): the model stays READY, yet every later request
fails with "Stub process '<model>_0_0' is not healthy." until the model is reloaded. The
`Supervisor` watches the stub processes (children of tritonserver, found in /proc) and
reloads a model whose stub is gone through the model-repository API (the server must run
with explicit model control: `ServerOptions(heal=True)`); if tritonserver itself exits it
starts it again on the same ports.

A model that calls other models through BLS is different: when its stub dies, the models
it was calling stay blocked for ever in `response_sender.send` towards the dead stub
(measured: `avatar` killed during three turns left `tts`'s execute and the `llm`
scheduler thread stuck there, so every later turn hung), and Triton never ends the
dead stub's open streams. Reloading it is not enough, so the supervisor restarts the
whole server: every open stream fails at once with a connection error, and the next
turn is served by fresh processes. Only the generic ONNX runner models are leaves.
"""

from __future__ import annotations

import logging
import re
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger(__name__)


def _parents() -> dict[int, int]:
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            parents[int(stat.parent.name)] = int(fields[1])
        except (OSError, IndexError, ValueError):
            continue
    return parents


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (tritonserver's stubs), from /proc."""
    parents, found, frontier = _parents(), [], [pid]
    while frontier:
        parent = frontier.pop()
        kids = [p for p, pp in parents.items() if pp == parent]
        found += kids
        frontier += kids
    return found


def alive(pid: int) -> bool:
    """True while `pid` runs (a zombie, dead but not yet reaped, is not alive)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def stub_model(pid: int) -> str | None:
    """The model a python-backend stub serves (its model.py's folder), else None."""
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    for arg in args:
        if arg.endswith(b"/model.py"):
            return Path(arg.decode(errors="replace")).parent.parent.name
    return None


def stub_processes(server_pid: int) -> dict[str, set[int]]:
    """model -> pids of its live python-backend stubs (one per instance)."""
    stubs: dict[str, set[int]] = {}
    for pid in descendants(server_pid):
        model = stub_model(pid)
        if model is not None and alive(pid):
            stubs.setdefault(model, set()).add(pid)
    return stubs


class SupervisedServer(Protocol):
    """What the supervisor needs of a server (serving.server.EmbeddedServer is one)."""

    options: Any  # model_repository, startup_timeout_s, headers, restricted
    http_url: str

    @property
    def pid(self) -> int | None: ...

    def is_running(self) -> bool: ...

    def restart(self) -> None: ...


_BLS_CALL = re.compile(r"\bbls\.(?:infer|stream)\(|\binfer\(|\.exec\(")


def calls_other_models(repository: Path, model: str) -> bool:
    """True when `model`'s model.py makes BLS calls (the ONNX runner and e.g.
    `avatar_animate` do not: their dead stub is reloaded, not the server restarted)."""
    try:
        source = (Path(repository) / model / "1" / "model.py").read_text()
    except OSError:
        return True  # unknown: treat it as a caller (a restart heals every case)
    return bool(_BLS_CALL.search(source))


class Supervisor:
    """A thread that heals `server` every `every_s` seconds; `events` records what it did."""

    def __init__(self, server: SupervisedServer, every_s: float = 1.0):
        self.server, self.every_s = server, every_s
        self.events: list[str] = []
        self._known: dict[str, set[int]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Supervisor:
        self._known = stub_processes(self.server.pid or 0)
        self._thread = threading.Thread(target=self._loop, name="triton-supervisor", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=30)

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.check()
            except Exception as error:  # keep watching; the next round may succeed
                log.warning("supervisor: %s: %s", type(error).__name__, error)

    def check(self) -> list[str]:
        """One round: restart a dead server, reload models with a dead stub."""
        done: list[str] = []
        if not self.server.is_running():
            log.error("supervisor: tritonserver exited; starting it again")
            self.server.restart()
            self._known = stub_processes(self.server.pid or 0)
            done.append("restarted tritonserver")
        else:
            current = stub_processes(self.server.pid or 0)
            for model, pids in sorted(self._known.items()):
                live = current.get(model, set())
                if len(live) >= len(pids):  # all alive (or reloaded by model control)
                    self._known[model] = live
                    continue
                if not self._ready(model):  # unloaded on purpose: stop watching it
                    del self._known[model]
                    continue
                dead = sorted(pids - live)
                if calls_other_models(self.server.options.model_repository, model):
                    log.error("supervisor: stub %s of BLS model %s died; restarting", dead, model)
                    started = time.monotonic()
                    self.server.restart()
                    self._known = stub_processes(self.server.pid or 0)
                    done.append(
                        f"restarted tritonserver in {time.monotonic() - started:.1f} s: the "
                        f"stub of {model} died (the models it called may be blocked on it)"
                    )
                    current = self._known  # the new server's stubs, all of them
                    break
                log.error("supervisor: stub %s of model %s died; reloading it", dead, model)
                started = time.monotonic()
                self._reload(model)
                self._known[model] = stub_processes(self.server.pid or 0).get(model, set())
                done.append(f"reloaded {model} in {time.monotonic() - started:.1f} s")
            for model, pids in current.items():  # models loaded since the last round
                self._known.setdefault(model, pids)
        for event in done:
            log.warning("supervisor: %s", event)
        self.events += done
        return done

    def _reload(self, model: str) -> None:
        """Unload, then load `model`: a plain load of a loaded model does not restart its
        dead stub in Triton 2.51 (measured), an unload + load does (about 2 s for tts)."""
        self._repository(model, "unload")
        deadline = time.monotonic() + self.server.options.startup_timeout_s
        while self._ready(model) and time.monotonic() < deadline:
            time.sleep(0.1)
        self._repository(model, "load")

    def _headers(self, group: str) -> dict[str, str]:
        opts = self.server.options
        return opts.headers if group in opts.restricted else {}

    def _repository(self, model: str, action: str) -> None:
        request = urllib.request.Request(
            f"http://{self.server.http_url}/v2/repository/models/{model}/{action}",
            data=b"{}",
            headers={"Content-Type": "application/json", **self._headers("model-repository")},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=self.server.options.startup_timeout_s):
                pass
        except urllib.error.HTTPError as error:
            body = error.read().decode(errors="replace")
            raise RuntimeError(f"{action} of {model} failed ({error.code}): {body}") from None

    def _ready(self, model: str) -> bool:
        request = urllib.request.Request(
            f"http://{self.server.http_url}/v2/models/{model}/ready",
            headers=self._headers("health"),
        )
        try:
            with urllib.request.urlopen(request, timeout=5) as reply:
                return bool(reply.status == 200)
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False
