"""`python -m perf failover`: a replica dies mid-conversation; nothing is forgotten.

What runs, all real and on this machine: a Redis (`redis-server`), two Triton replicas (one
embedded tritonserver each, the same session secret, conversations in that Redis), each
with its truthful health endpoint (`serving.health --serve`), the load balancer that
ships in deploy/ (HAProxy with deploy/haproxy/haproxy.cfg, its DNS server-template line
replaced by the two local replicas: serving/local_services.py), and the gateway
(`python -m gateway`) behind it.

Four live WebSocket sessions (the operator key: a service's access) each say a fact
(turn 1: their name), talk on (turn 2), and start turn 3; once turns are in flight (the
replicas' `avatar_active{what="turns"}` gauges), the tritonserver of the replica with the
most of them gets SIGKILL. Each session asks for its fact (turn 4) as soon as its turn 3
ended. Figures: turns lost beyond those in flight on the killed replica; the time from
the kill to the failed sessions' next first sentence; the share of conversations whose
last turn was answered from a conversation that holds the fact (the store's record after
it is that turn's prompt and answer); whether SmolLM2-135M then says the name.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from avatar.conversation_tokens import session_of
from avatar.llm.conversation import RedisStore
from perf import probe
from serving.deployment import build_repository
from serving.local_services import local_config, running_haproxy, running_redis
from serving.server import EmbeddedServer, ServerOptions, free_port

log = logging.getLogger("perf.failover")
# the turn's models, without the renderers and the say/speech/animate ensembles
MODELS = (
    "vad", "asr", "asr_encoder", "asr_decoder", "avatar", "llm", "llm_decoder", "tts",
    "tts_vits", "lipsync", "emotion_encoder",
)  # fmt: skip
NAMES = ("Zebulon", "Marisol", "Bartholomew", "Ingrid")
CONTROLS = {"max_tokens": 32}
GOALS = "goal: 0 lost beyond the turns in flight on the dead replica, 100 % remembered, < 5 s"


@dataclasses.dataclass
class SessionLog:
    name: str
    token: str = ""
    turns: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # turn_end + extras

    def reply(self, index: int) -> str:
        return self.turns[index].get("reply", "") if index < len(self.turns) else ""


# ------------------------------------------------------------------------ the parts


@contextlib.contextmanager
def health_endpoint(
    server: EmbeddedServer, folder: Path, timeout_s: float = 120.0
) -> Iterator[int]:
    """`python -m serving.health --serve` for one replica (log in `folder`); its port, once
    it says healthy (the run starts with both replicas in rotation)."""
    port = free_port()
    command = [
        sys.executable, "-m", "serving.health", "--serve", str(port), "--host", "127.0.0.1",
        "--pid", str(server.pid), "--http-url", server.http_url,
    ]  # fmt: skip
    with (folder / f"health-{port}.log").open("wb") as log_file:
        process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT)
    try:
        deadline, reason = time.monotonic() + timeout_s, ""
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5):
                    break
            except urllib.error.HTTPError as error:  # 503 with the reason
                reason = error.read().decode(errors="replace")
            except OSError as error:
                reason = str(error)
            time.sleep(0.5)
        else:
            raise RuntimeError(
                f"replica {server.grpc_url} not healthy in {timeout_s:g} s: {reason}"
            )
        yield port
    finally:
        process.terminate()
        process.wait(5)


def active_turns(server: EmbeddedServer) -> float:
    """The replica's `avatar_active{model="avatar",what="turns"}` gauge (-1: unreachable)."""
    try:
        return probe.gauge(probe.metrics(server.metrics_url, ("avatar_active",)), "avatar", "turns")
    except OSError:
        return -1.0


# ------------------------------------------------------------------------ the sessions


class Connection:
    """One WebSocket session of the live protocol (docs/protocol.md), typed turns."""

    def __init__(self, ws) -> None:
        self.ws = ws
        self.token = ""

    async def ready(self) -> None:
        message = await self._next_json()
        if message.get("type") != "ready":
            raise RuntimeError(f"expected ready, got {message}")
        self.token = message.get("session_token") or message.get("session_id", "")
        await self.ws.send_json({"type": "controls", "controls": CONTROLS})
        await self._until("controls")

    async def turn(self, text: str, timeout_s: float = 180.0) -> dict[str, Any]:
        """Send a typed turn; its turn_end, with `error` (the error message's code and
        text, if any) and `first_sentence_at` (monotonic) added."""
        await self.ws.send_json({"type": "text", "text": text})
        result: dict[str, Any] = {"sent_at": time.monotonic()}
        deadline = time.monotonic() + timeout_s
        while True:
            message = await self._next_json(deadline - time.monotonic())
            kind = message.get("type")
            if kind == "sentence":
                result.setdefault("first_sentence_at", time.monotonic())
            elif kind == "error":
                result["error"] = {"code": message.get("code", ""), "message": message["message"]}
                result["error_at"] = time.monotonic()
            elif kind == "turn_end":
                result.update(message, ended_at=time.monotonic())
                return result

    async def _until(self, kind: str) -> dict[str, Any]:
        while True:
            message = await self._next_json()
            if message.get("type") == kind:
                return message

    async def _next_json(self, timeout_s: float = 60.0) -> dict[str, Any]:
        import aiohttp

        while True:
            message = await asyncio.wait_for(self.ws.receive(), max(0.1, timeout_s))
            if message.type == aiohttp.WSMsgType.TEXT:
                return json.loads(message.data)
            if message.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED):
                raise RuntimeError(f"the gateway closed the session ({message.data})")


async def conversations(
    gateway: str, key: str, replicas: list[EmbeddedServer], sessions: int
) -> tuple[list[SessionLog], float, float]:
    """Run the sessions; returns their logs, the kill time (monotonic) and how many turns
    were in flight on the killed replica."""
    import aiohttp

    logs = [SessionLog(NAMES[i % len(NAMES)]) for i in range(sessions)]
    headers = {"Authorization": f"Bearer {key}"}  # a service's access to the gateway
    ws_url = gateway.replace("http://", "ws://") + "/ws"
    async with aiohttp.ClientSession() as http:
        sockets = [await http.ws_connect(ws_url, headers=headers) for _ in logs]
        live = [Connection(ws) for ws in sockets]
        await asyncio.gather(*(s.ready() for s in live))
        for log_, session in zip(logs, live, strict=True):
            log_.token = session.token

        async def say(index: int, text: str) -> None:
            logs[index].turns.append(await live[index].turn(text))

        await asyncio.gather(
            *(
                say(i, f"Hello! My name is {logs[i].name}. Please remember my name.")
                for i in range(sessions)
            )
        )
        await asyncio.gather(*(say(i, "What is two plus two?") for i in range(sessions)))

        async def story_then_recall(index: int) -> None:
            await say(index, "Tell me a long story about a lighthouse keeper.")
            await say(index, "What is my name?")  # at once: the recovery is the session's

        talks = [asyncio.create_task(story_then_recall(i)) for i in range(sessions)]
        # kill the replica with the most turns running, once one runs there (the hash may
        # have put every session on one replica: then the other takes them all)
        deadline, in_flight, victim = time.monotonic() + 20, 0.0, replicas[0]
        while time.monotonic() < deadline:
            counts = [active_turns(r) for r in replicas]
            if max(counts) >= 1:
                await asyncio.sleep(1.0)  # mid-reply, not at its start
                counts = [max(c, active_turns(r)) for c, r in zip(counts, replicas, strict=True)]
                in_flight = max(counts)
                victim = replicas[counts.index(in_flight)]
                break
            await asyncio.sleep(0.1)
        killed_at = time.monotonic()
        os.kill(victim.pid, signal.SIGKILL)
        log.info("replica pid %d killed with %g turns in flight", victim.pid, in_flight)
        await asyncio.gather(*talks)
        for ws in sockets:
            await ws.close()
    return logs, killed_at, in_flight


def figures(
    logs: list[SessionLog], killed_at: float, in_flight: float, records: dict[str, list[Any]]
) -> dict[str, Any]:
    """The run's figures. `records`: each session's conversation as the store holds it at
    the end: the prompt its last turn was answered from, plus that answer."""
    failed = [s for s in logs if s.turns[2].get("error")]
    lost = [
        {"session": s.name, "turn": t, "error": turn["error"]}
        for s in logs
        for t, turn in enumerate(s.turns, 1)
        if turn.get("error") and t != 3  # the turns in flight are counted apart
    ]
    recovery = [  # the kill -> the failed session's next turn's first sentence
        s.turns[3]["first_sentence_at"] - killed_at
        for s in failed
        if not s.turns[3].get("error") and "first_sentence_at" in s.turns[3]
    ]
    error_after = [s.turns[2]["error_at"] - killed_at for s in failed if "error_at" in s.turns[2]]
    # where that time goes: the next turn is sent when the failed one ended, then takes the
    # survivor's time to a first sentence (with every session now on it)
    next_sent = [s.turns[3]["sent_at"] - killed_at for s in failed]
    next_first = [
        s.turns[3]["first_sentence_at"] - s.turns[3]["sent_at"]
        for s in failed
        if "first_sentence_at" in s.turns[3]
    ]
    # remembered: the last turn (on the survivor) was answered from a conversation that
    # starts with the fact of turn 1 (the store's record is that turn's prompt + answer)
    remembered = {}
    for s in logs:
        record = records.get(s.name, [])
        users = [m.content for m in record if m.role == "user"]
        remembered[s.name] = bool(users) and s.name in users[0] and users[-1] == "What is my name?"
    said = [s.name.lower() in s.reply(3).lower() for s in logs]
    return {
        "sessions": len(logs),
        "turns_in_flight_on_killed_replica": in_flight,
        "turns_failed_in_flight": len(failed),
        "in_flight_errors": [s.turns[2]["error"] for s in failed],
        "error_after_kill_s": [round(e, 2) for e in error_after],
        "turns_lost_beyond_in_flight": len(lost),
        "lost": lost,
        "recovery_s": [round(r, 2) for r in recovery],
        "next_turn_sent_after_kill_s": [round(r, 2) for r in next_sent],
        "next_turn_to_first_sentence_s": [round(r, 2) for r in next_first],
        "remembered": f"{sum(remembered.values())}/{len(logs)}",
        "remembered_share": sum(remembered.values()) / len(logs),
        "said_the_name": f"{sum(said)}/{len(logs)}",
        "answers": {s.name: s.reply(3) for s in logs},
        "goal": GOALS,
    }


def run(sessions: int = 4, out: Path | None = None) -> dict[str, Any]:
    """The whole failover run; returns (and writes to `out`/failover.json) its figures."""
    from gateway.process import running_gateway

    key = secrets.token_urlsafe(24)
    secret = secrets.token_urlsafe(32)
    with tempfile.TemporaryDirectory(prefix="avatar-failover-") as tmp, running_redis() as redis:
        folder = Path(tmp)
        repository = folder / "repository"
        build_repository(repository, "embedded", MODELS)
        os.environ.update(
            {"AVATAR_REDIS_URL": redis, "AVATAR_SESSION_SECRET": secret, "AVATAR_GATEWAY_KEY": key}
        )
        options = ServerOptions(repository, session_secret=secret)
        with contextlib.ExitStack() as stack:
            replicas = [stack.enter_context(EmbeddedServer(options)) for _ in range(2)]
            health = [stack.enter_context(health_endpoint(r, folder)) for r in replicas]
            servers = {
                f"replica{i}": (r.options.grpc_port, h)
                for i, (r, h) in enumerate(zip(replicas, health, strict=True))
            }
            port = stack.enter_context(running_haproxy(local_config(servers), folder))
            balancer = f"127.0.0.1:{port}"
            gateway, _ = stack.enter_context(running_gateway(balancer))
            log.info("2 replicas behind haproxy %s, gateway %s, redis %s", balancer, gateway, redis)
            logs, killed_at, in_flight = asyncio.run(
                conversations(gateway, key, replicas, sessions)
            )
        store = RedisStore(redis)
        records = {s.name: store.history(session_of(s.token)) for s in logs}
        if out is not None:  # what the balancer saw, for the record
            out.mkdir(parents=True, exist_ok=True)
            shutil.copy(folder / "haproxy.log", out / "haproxy.log")
    result = figures(logs, killed_at, in_flight, records)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "failover.json").write_text(json.dumps(result, indent=2))
    return result


def report(result: dict[str, Any]) -> str:
    return "\n".join(
        [
            f"sessions: {result['sessions']}; turns in flight on the killed replica: "
            f"{result['turns_in_flight_on_killed_replica']:g}; ended with an error: "
            f"{result['turns_failed_in_flight']} {result['in_flight_errors']}, "
            f"{result['error_after_kill_s']} s after the kill",
            f"turns lost beyond those in flight: {result['turns_lost_beyond_in_flight']}",
            f"kill -> the next turn's first sentence (sessions whose turn failed): "
            f"{result['recovery_s']} s = sent {result['next_turn_sent_after_kill_s']} s after "
            f"the kill + {result['next_turn_to_first_sentence_s']} s to its first sentence",
            f"answered the last turn from a conversation holding turn 1's fact: "
            f"{result['remembered']}; replies that say the name (SmolLM2-135M): "
            f"{result['said_the_name']}",
            *(f"  {name}: {answer!r}" for name, answer in result["answers"].items()),
            result["goal"],
        ]
    )


def add_arguments(parser) -> None:
    parser.add_argument("--sessions", type=int, default=4, help="live sessions (default 4)")
    parser.add_argument(
        "--out", type=Path, default=Path("build/perf/failover"), help="where failover.json goes"
    )
    parser.set_defaults(func=main)


def main(args) -> int:
    result = run(args.sessions, args.out)
    sys.stdout.write(report(result) + "\n")
    # pass/fail on what failover decides (nothing lost or forgotten, failures said at
    # once); the time to the next reply is reported: it is the survivor's turn latency,
    # with every session on it, on whatever cores the run has
    told = all(e < 1.0 for e in result["error_after_kill_s"])
    kept = result["turns_lost_beyond_in_flight"] == 0 and result["remembered_share"] == 1.0
    return 0 if kept and told else 1
