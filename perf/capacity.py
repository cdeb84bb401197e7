"""Sessions per machine (`python -m perf capacity`): paced live sessions, ramped.

At each level (default 1, 2, 4, 6, 8) that many sessions speak at once through the live
protocol, as the page does: `POST /access-token` with the page's Origin, then the WebSocket
with the token as a subprotocol; 32-ms microphone frames at real-time pace, silence
included, for the whole session. Each session is a continuous speaker: it speaks its
questions one after another (the recordings of `perf latency`), waiting for each reply to
end and `--pause-s`; session i starts i x `--stagger-s` after the first, so that the
sessions overlap. The last question of each session is spoken over by the next one as soon
as its reply's first audio arrives (a barge-in; `--no-barge-in`: not).

The server and the gateway run with their default flags (`avatar serve`, and a fresh
`python -m gateway` per level, so that its event-loop lag is the level's). Per level:

- first audio: from the end of speech (the frame holding the last speech sent) to the
  reply's first AUDIO message, p50 / p95 (`perf.latency.measure_turn`);
- failed: questions not answered (an `error`, a timeout, a session closed under it);
  `split` (in the JSON): questions the endpointer heard as two utterances, the second
  cutting the first reply: the speaker's pause, not the machine's load;
- refused: the `error` codes the sessions received, by code (`busy` apart);
- told busy: connections answered `busy` (at capacity: retried after `retry_after_s`,
  until `--busy-wait-s` of waiting); `never in`: sessions that never got in;
- loop lag: the gateway's event-loop lag p50 / p99 (its /metrics; "-" for a gateway
  without them); ping: the round trip of the protocol's `ping` (every 0.5 s from each
  session), what a client sees of the same stalls, on every gateway;
- late chunks: AUDIO messages that arrived after their time for a player that starts at
  the reply's first audio (`perf.harness.playback`);
- barge-in: from the barge-in's first speech frame to the `interrupt` message.

Sessions per machine: the largest level such that it and every level below it had a first
audio p95 within `--target-p95-s` (2.0 s), every session admitted at once (none told busy)
and no question failed.

`--before REF`: the same levels on a second stack, REF's server and gateway (a git
worktree under build/perf/capacity/before, the same virtual environment and artifact
cache), alternating per level (only one stack's sessions run at a time): today vs before.
Results: build/perf/capacity/ (turns, sessions, levels as CSV + JSON, capacity.md).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import logging
import os
import secrets
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from evals.report import DEFAULT_OUT, write_rows
from perf.harness import concurrently, percentile, playback
from perf.latency import (
    TurnRow,
    frame_sent_at,
    measure_turn,
    question_of,
    questions,
    speech_bounds_s,
    speech_signal,
)

log = logging.getLogger(__name__)
OUT = DEFAULT_OUT / "capacity"
PROJECT_ROOT = Path(__file__).resolve().parents[1]
LEVELS = (1, 2, 4, 6, 8)
TARGET_P95_S = 2.0
PING_EVERY = 16  # microphone frames between pings (~0.5 s)
TURN_TIMEOUT_S = 90.0  # a question with no reply ended by then failed
LAG = "avatar_gateway_loop_lag_seconds"
REFUSALS = "avatar_gateway_refusals_total"
BUSY = "busy"
NEVER_IN = "never in"  # the error of the questions of a session that never got in


@dataclasses.dataclass
class SessionRow:
    """One session of a level as its client saw it."""

    stack: str
    level: int
    session: int
    admitted: bool = False
    told_busy: int = 0  # connections answered `busy`
    waited_s: float = 0.0  # waiting to get in (retry_after_s)
    refused: dict[str, int] = dataclasses.field(default_factory=dict)  # error codes seen
    questions: int = 0
    barge_in_ms: float | None = None  # barge-in speech -> `interrupt`
    pings_ms: list[float] = dataclasses.field(default_factory=list)
    closed: str = ""  # why the server closed it under its questions, "" when it did not


@dataclasses.dataclass
class LevelRow:
    """A level of one stack, summarised (`summarise_level`)."""

    stack: str
    level: int
    admitted: int
    never_in: int
    told_busy: int
    questions: int
    answered: int
    failed: int
    split: int
    first_audio_p50_ms: float | None
    first_audio_p95_ms: float | None
    refused: str  # "code n, ..." of the errors sessions received (busy apart)
    loop_lag_p50_ms: float | None
    loop_lag_p99_ms: float | None
    loop_lag_max_ms: float | None
    ping_p50_ms: float | None
    ping_p99_ms: float | None
    late_chunks: int
    stall_ms: float
    barge_in_p50_ms: float | None
    barge_in_max_ms: float | None
    barge_in_missed: int
    wall_s: float
    gateway_refusals: str = ""  # the gateway's own counts (/metrics), by code


# --- one session ------------------------------------------------------------------------


def _record(reply, kind: str, data: Any, now: float) -> None:
    """A server message into a `clients.live.LiveReply`, as clients/live.py's receiver
    records it (per-turn keys numbered in the order turns answered)."""
    from avatar.live_protocol import Audio

    if kind == "binary":
        if isinstance(data, Audio):
            reply.audio.append(data)
            reply.audio_arrived.append(now)
            reply.at.setdefault(f"first_audio_turn{reply.ordinal(data.turn)}", now)
        else:
            reply.frames.append(data)
            reply.at.setdefault(f"first_frames_turn{reply.ordinal(data.turn)}", now)
        return
    reply.messages.append(data)
    name = data["type"]
    if name == "turn_start":
        reply.ordinal(data["turn"])
    reply.at.setdefault(name, now)
    if name == "partial_transcript" and data.get("at_pause"):
        reply.at["partial_at_pause"] = now
    if name == "speech_end":
        reply.at.setdefault(f"speech_end{len(reply.of('speech_end'))}", now)
    if name == "interrupt":
        reply.at["interrupt_last"] = now


def played_until(reply) -> float:
    """When a player that started at the reply's first audio has played all of it (its
    waits for late audio included), on the client clock; 0 without audio."""
    if not reply.audio:
        return 0.0
    first = reply.audio[0].turn
    pieces = [
        (at, chunk)
        for at, chunk in zip(reply.audio_arrived, reply.audio, strict=True)
        if chunk.turn == first
    ]
    heard = playback((at, chunk.start_s) for at, chunk in pieces)
    length = max(chunk.start_s + len(chunk.pcm) / chunk.sample_rate for _, chunk in pieces)
    return min(at for at, _ in pieces) + heard.stall_s + length


def answered(reply) -> bool:
    """The question's reply is over: its last turn ended and nobody is speaking."""
    starts, ends = reply.of("turn_start"), reply.of("turn_end")
    speaking = len(reply.of("speech_start")) > len(reply.of("speech_end"))
    return bool(starts and ends) and ends[-1].get("turn") == starts[-1]["turn"] and not speaking


class _Microphone:
    """The session's one sender: a 32-ms MIC frame every 32 ms on an absolute clock (a
    late loop resynchronises rather than sending a burst), the queued audio or silence,
    and a `ping` every PING_EVERY frames."""

    def __init__(self, ws) -> None:
        self.ws = ws
        self.queue: collections.deque = collections.deque()  # (audio, tag, reply, future)
        self.pings: dict[int, float] = {}

    def say(self, audio: np.ndarray, tag: str, reply) -> asyncio.Future:
        """Queue `audio`; the future is done when its last frame is sent."""
        done = asyncio.get_running_loop().create_future()
        self.queue.append((audio, tag, reply, done))
        return done

    async def run(self) -> None:
        from avatar.live_protocol import INPUT_RATE, mic_message
        from clients.live import CHUNK_S

        step = round(CHUNK_S * INPUT_RATE)
        silence = mic_message(np.zeros(step, np.float32))
        due, cursor, sent = time.perf_counter(), 0, 0
        while True:
            due += CHUNK_S
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            elif delay < -0.1:  # starved: go on from now, never faster than real time
                due = time.perf_counter()
            if self.queue:
                audio, tag, reply, done = self.queue[0]
                await self.ws.send_bytes(mic_message(audio[cursor : cursor + step]))
                if cursor == 0:
                    reply.at[f"{tag}_first_sent"] = time.perf_counter()
                cursor += step
                if cursor >= len(audio):
                    self.queue.popleft()
                    cursor = 0
                    reply.at[f"{tag}_sent_end"] = time.perf_counter()
                    if not done.done():
                        done.set_result(None)
            else:
                await self.ws.send_bytes(silence)
            sent += 1
            if sent % PING_EVERY == 0:
                self.pings[sent] = time.perf_counter()
                await self.ws.send_json({"type": "ping", "t": sent})


async def _connect(http, base: str, row: SessionRow, busy_wait_s: float):
    """The page's way in: an access token for its Origin, then the WebSocket offering it;
    `busy` (or an HTTP refusal) waits retry_after_s and tries again, up to `busy_wait_s`
    of waiting. The admitted WebSocket, or None."""
    import aiohttp

    ws_url = base.replace("http", "ws", 1) + "/ws"
    while True:
        retry_after = None
        async with http.post(base + "/access-token", headers={"Origin": base}) as answer:
            answer.raise_for_status()
            protocols = (await answer.json())["protocols"]
        try:
            ws = await http.ws_connect(
                ws_url, protocols=protocols, origin=base, max_msg_size=1 << 24
            )
        except aiohttp.WSServerHandshakeError as error:  # refused before the upgrade
            code = f"http_{error.status}"
            row.refused[code] = row.refused.get(code, 0) + 1
            retry_after = float((error.headers or {}).get("Retry-After", 1))
        else:
            data = await _admission(ws)
            if data.get("type") == "controls":
                return ws
            await ws.close()
            if data.get("code") != BUSY:
                code = data.get("code") or f"closed_{ws.close_code}"
                row.refused[code] = row.refused.get(code, 0) + 1
                return None
            row.told_busy += 1
            retry_after = float(data.get("retry_after_s") or 1.0)
        if row.waited_s + retry_after > busy_wait_s:
            return None
        await asyncio.sleep(retry_after)
        row.waited_s += retry_after


async def _admission(ws) -> dict:
    """`ready`, then the first message (controls) makes the connection a session of the
    gateway's capacity: answered `controls` when admitted, an `error` (`busy`) and a close
    when not. The answer, or {} when the connection closed without one."""
    import aiohttp

    await ws.send_json({"type": "controls", "controls": {"seed": 0}})
    while True:
        message = await ws.receive(timeout=30)
        if message.type != aiohttp.WSMsgType.TEXT:
            return {}
        data = message.json()
        if data.get("type") in ("controls", "error"):
            return data


async def speak_session(
    base: str,
    row: SessionRow,
    plan: Sequence[tuple[str, np.ndarray]],
    *,
    barge_in: np.ndarray | None,
    pause_s: float,
    busy_wait_s: float,
) -> list[TurnRow]:
    """One continuous speaker on the gateway at `base` (http://host:port): each question of
    `plan` (source, 16-kHz audio) in turn, then `barge_in` over the last reply. Fills `row`
    (SessionRow); one TurnRow per question of the plan, failed ones included."""
    import aiohttp

    from clients.live import LiveReply

    def turn_row(source: str, audio: np.ndarray) -> TurnRow:
        return TurnRow(row.level, row.stack, source, round(len(audio) / 16_000, 2), "")

    rows: list[TurnRow] = []
    async with aiohttp.ClientSession() as http:
        ws = await _connect(http, base, row, busy_wait_s)
        if ws is None:
            rows = [turn_row(s, a) for s, a in plan]  # never in: no question asked
            for turn in rows:
                turn.error = NEVER_IN
            return rows
        row.admitted = True
        mic, current = _Microphone(ws), LiveReply()

        async def receive() -> None:
            from avatar.live_protocol import parse_server_binary

            async for message in ws:
                now = time.perf_counter()
                if message.type == aiohttp.WSMsgType.BINARY:
                    _record(current, "binary", parse_server_binary(message.data), now)
                    continue
                if message.type != aiohttp.WSMsgType.TEXT:
                    break
                data = message.json()
                if data.get("type") == "pong":
                    sent = mic.pings.pop(data.get("t"), None)
                    if sent is not None:
                        row.pings_ms.append(round((now - sent) * 1000, 1))
                    continue
                if data.get("type") == "error":
                    code = data.get("code", "")
                    row.refused[code] = row.refused.get(code, 0) + 1
                _record(current, "text", data, now)

        listener = asyncio.create_task(receive())
        sender = asyncio.create_task(mic.run())
        try:
            for index, (source, audio) in enumerate(plan):
                turn = turn_row(source, audio)
                rows.append(turn)
                if listener.done():
                    turn.error = f"session closed: {ws.close_code}"
                    continue
                current = LiveReply()
                row.questions += 1
                signal = speech_signal(audio)
                await ws.send_json({"type": "controls", "controls": {"seed": index}})
                barged = barge_in is not None and index == len(plan) - 1
                try:
                    await _ask(
                        mic,
                        current,
                        signal,
                        barge_in if barged else None,
                        row=row,
                        listener=listener,
                    )
                except TimeoutError as error:
                    turn.error = f"TimeoutError: {error}"
                    continue
                if listener.done() and not current.of("turn_end"):
                    turn.error = f"session closed: {ws.close_code}"
                    continue
                measure_turn(turn, current, signal, barged=barged)
                if not barged:  # the speaker listens to the reply, pauses, asks again
                    await asyncio.sleep(max(0.0, played_until(current) - time.perf_counter()))
                    await asyncio.sleep(pause_s)
        finally:
            sender.cancel()
            if not listener.done():
                await ws.close()
            else:
                row.closed = f"{ws.close_code}"
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.gather(sender, listener)
    return rows


async def _ask(mic, reply, signal, barge_in, *, row: SessionRow, listener) -> None:
    """Speak `signal` and wait for its reply to end; with `barge_in`, speak that over the
    reply once its first audio arrives and wait for the `interrupt` instead."""
    mic.say(signal, "speech", reply)
    deadline = time.perf_counter() + len(signal) / 16_000 + TURN_TIMEOUT_S
    while not listener.done():
        if time.perf_counter() > deadline:
            raise TimeoutError(f"no reply within {TURN_TIMEOUT_S:g} s of the question")
        if barge_in is not None and "first_audio_turn1" in reply.at:
            await _barge_in(mic, reply, barge_in, row, listener)
            return
        if "speech_sent_end" in reply.at and answered(reply):
            return
        await asyncio.sleep(0.02)


async def _barge_in(mic, reply, audio: np.ndarray, row: SessionRow, listener) -> None:
    """`audio` over the reply; the time from its first speech frame to the `interrupt`
    (barge-in) that follows; then until the interrupted turn's end (or a few seconds)."""
    earlier = len(reply.of("interrupt"))

    def stopped() -> bool:
        return any(m.get("reason") == "barge-in" for m in reply.of("interrupt")[earlier:])

    mic.say(audio, "barge_in", reply)
    deadline = time.perf_counter() + len(audio) / 16_000 + 10.0
    while not listener.done() and time.perf_counter() < deadline:
        if stopped() and reply.of("turn_end"):
            break
        if reply.of("turn_end") and not stopped() and "barge_in_sent_end" in reply.at:
            break  # the reply ended before the speech was heard: no barge-in to time
        await asyncio.sleep(0.02)
    if stopped() and "barge_in_first_sent" in reply.at:
        onset = frame_sent_at(reply, "barge_in", speech_bounds_s(audio)[0])
        row.barge_in_ms = round((reply.at["interrupt_last"] - onset) * 1000, 1)


# --- a level -----------------------------------------------------------------------------


def plan_of(
    items: list[tuple[str, np.ndarray]], session: int, count: int
) -> list[tuple[str, np.ndarray]]:
    return [question_of(items, session, q) for q in range(count)]


def questions_per_session(level: int, questions: int, min_turns: int) -> int:
    """`questions` each, more at low levels so that every level has `min_turns`."""
    return max(questions, -(-min_turns // level))


def run_sessions(
    base: str,
    stack: str,
    level: int,
    args: argparse.Namespace,
    items: list[tuple[str, np.ndarray]],
) -> tuple[list[TurnRow], list[SessionRow], float]:
    """`level` sessions on the gateway at `base`, at once (staggered starts)."""
    per_session = questions_per_session(level, args.questions, args.min_turns)
    sessions = [SessionRow(stack, level, i) for i in range(level)]
    turns: list[list[TurnRow]] = [[] for _ in range(level)]
    barge = items[-1][1] if args.barge_in else None

    def speaker(index: int) -> None:
        time.sleep(index * args.stagger_s)
        plan = plan_of(items, index, per_session)
        try:
            turns[index] = asyncio.run(
                speak_session(
                    base,
                    sessions[index],
                    plan,
                    barge_in=barge,
                    pause_s=args.pause_s,
                    busy_wait_s=args.busy_wait_s,
                )
            )
        except Exception as error:  # a broken session is a figure, not the end
            log.warning("%s, %d sessions: session %d: %s", stack, level, index, error)
            sessions[index].closed = f"{type(error).__name__}: {error}"
            done = turns[index]
            turns[index] = done + [
                TurnRow(level, stack, s, round(len(a) / 16_000, 2), "", error=str(error))
                for s, a in plan[len(done) :]
            ]

    wall_s = concurrently(speaker, level)
    return [t for group in turns for t in group], sessions, wall_s


def read_metrics(base: str) -> dict[str, float]:
    """The gateway's GET /metrics, parsed; {} when it cannot be read."""
    from gateway.metrics import parse

    try:
        with urllib.request.urlopen(base + "/metrics", timeout=10) as answer:
            return parse(answer.read().decode())
    except OSError as error:
        log.warning("%s/metrics: %s", base, error)
        return {}


# --- summaries ---------------------------------------------------------------------------


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000, 1)


def _p(values: Sequence[float], q: float) -> float | None:
    return round(percentile(values, q), 1) if len(values) else None


def is_split(turn: TurnRow) -> bool:
    """A question the endpointer heard as two utterances (its second part cut the first
    reply), with no error from the server."""
    return turn.error.startswith("turn ended") and (
        "barge-in" in turn.error or "superseded" in turn.error
    )


def _codes(counts: dict[str, float]) -> str:
    return ", ".join(f"{code} {n:g}" for code, n in sorted(counts.items()) if n) or "0"


def summarise_level(
    stack: str,
    level: int,
    turns: Sequence[TurnRow],
    sessions: Sequence[SessionRow],
    metrics: dict[str, float],
    *,
    wall_s: float = 0.0,
) -> LevelRow:
    """One level of one stack: its turns, its sessions and its gateway's /metrics."""
    asked = [t for t in turns if t.error != NEVER_IN]
    good = [t for t in asked if not t.error]
    first = [t.first_audio for t in good if t.first_audio is not None]
    refused: collections.Counter[str] = collections.Counter()
    for s in sessions:
        refused.update({c: n for c, n in s.refused.items() if c != BUSY})
    pings = [p for s in sessions for p in s.pings_ms]
    barges = [s.barge_in_ms for s in sessions if s.barge_in_ms is not None]
    lag = {q: metrics.get(f'{LAG}{{quantile="{q}"}}') for q in ("0.5", "0.99")}
    gateway = {
        name[len(REFUSALS) + len('{code="') : -2]: n
        for name, n in metrics.items()
        if name.startswith(REFUSALS + "{")
    }
    return LevelRow(
        stack=stack,
        level=level,
        admitted=sum(s.admitted for s in sessions),
        never_in=sum(not s.admitted for s in sessions),
        told_busy=sum(s.told_busy for s in sessions),
        questions=len(asked),
        answered=len(good),
        failed=sum(bool(t.error) and not is_split(t) for t in asked),
        split=sum(is_split(t) for t in asked),
        first_audio_p50_ms=_p(first, 50),
        first_audio_p95_ms=_p(first, 95),
        refused=_codes(refused),
        loop_lag_p50_ms=_ms(lag["0.5"]),
        loop_lag_p99_ms=_ms(lag["0.99"]),
        loop_lag_max_ms=_ms(metrics.get(f"{LAG}_max")),
        ping_p50_ms=_p(pings, 50),
        ping_p99_ms=_p(pings, 99),
        late_chunks=sum(t.late or 0 for t in good),
        stall_ms=round(sum(t.stall or 0.0 for t in good), 1),
        barge_in_p50_ms=_p(barges, 50),
        barge_in_max_ms=max(barges) if barges else None,
        barge_in_missed=sum(s.admitted and s.barge_in_ms is None for s in sessions),
        wall_s=round(wall_s, 1),
        gateway_refusals=_codes(gateway),
    )


def passes(row: LevelRow, target_p95_s: float = TARGET_P95_S) -> bool:
    """Every session in at once (none told busy), no question failed, first audio p95
    within the target."""
    p95 = row.first_audio_p95_ms
    at_once = row.never_in == 0 and row.told_busy == 0
    return at_once and row.failed == 0 and p95 is not None and p95 <= target_p95_s * 1000


def sessions_per_machine(
    rows: Sequence[LevelRow], stack: str, target_p95_s: float = TARGET_P95_S
) -> int:
    """The largest level such that it and every level below it of `stack` passes; 0 when
    the first does not."""
    figure = 0
    for row in sorted((r for r in rows if r.stack == stack), key=lambda r: r.level):
        if not passes(row, target_p95_s):
            break
        figure = row.level
    return figure


def _pair(a: float | None, b: float | None) -> str:
    return "-" if a is None else f"{a:.0f} / {'-' if b is None else f'{b:.0f}'}"


def markdown(rows: Sequence[LevelRow], stacks: Sequence[str]) -> str:
    """One line per level and stack."""
    lines = [
        "| sessions | stack | first audio p50 / p95 ms | failed | refused | told busy "
        "(never in) | loop lag p50 / p99 ms | ping p50 / p99 ms | late chunks | "
        "barge-in p50 / max ms |",
        "|---:|---|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    order = {name: i for i, name in enumerate(stacks)}
    for r in sorted(rows, key=lambda r: (r.level, order.get(r.stack, 99))):
        lines.append(
            f"| {r.level} | {r.stack} | {_pair(r.first_audio_p50_ms, r.first_audio_p95_ms)} "
            f"| {r.failed} of {r.questions} | {r.refused} | {r.told_busy} ({r.never_in}) "
            f"| {_pair(r.loop_lag_p50_ms, r.loop_lag_p99_ms)} "
            f"| {_pair(r.ping_p50_ms, r.ping_p99_ms)} | {r.late_chunks} "
            f"| {_pair(r.barge_in_p50_ms, r.barge_in_max_ms)} |"
        )
    return "\n".join(lines)


def figure_line(rows: Sequence[LevelRow], stacks: Sequence[str], target_p95_s: float) -> str:
    figures = ", ".join(f"{s} {sessions_per_machine(rows, s, target_p95_s)}" for s in stacks)
    return (
        f"sessions per machine (first audio p95 <= {target_p95_s:g} s, every session "
        f"admitted at once, no question failed, at that level and below): {figures}"
    )


# --- the stacks --------------------------------------------------------------------------


@dataclasses.dataclass
class Stack:
    """A checkout's server and, per level, its gateway: `env` makes `python -m` import
    that checkout's code (PYTHONPATH first, the current directory not on sys.path)."""

    name: str
    root: Path
    env: dict[str, str]
    grpc_url: str = ""


def worktree(ref: str, path: Path) -> Path:
    """A detached git worktree of `ref` at `path` (reused, moved to `ref` if elsewhere)."""

    def git(*args: str, cwd: Path = PROJECT_ROOT) -> str:
        return subprocess.run(
            ["git", *args], cwd=cwd, check=True, capture_output=True, text=True
        ).stdout.strip()

    commit = git("rev-parse", f"{ref}^{{commit}}")
    if (path / ".git").exists():
        if git("rev-parse", "HEAD", cwd=path) != commit:
            git("checkout", "--detach", commit, cwd=path)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        git("worktree", "add", "--detach", str(path), commit)
    log.info("before: %s (%s) at %s", ref, commit[:10], path)
    return path


def stack_env(root: Path, secret: str) -> dict[str, str]:
    env = {"AVATAR_SESSION_SECRET": secret}
    root = root.resolve()
    if root != PROJECT_ROOT:
        # the editable install maps the packages to this checkout through a meta-path
        # finder, which PYTHONPATH's entries come before; -m would put the cwd first
        env.update(PYTHONPATH=str(root), PYTHONSAFEPATH="1")
    return env


@contextlib.contextmanager
def running_server(stack: Stack, out: Path, startup_s: float = 900.0) -> Iterator[str]:
    """`avatar serve` (default flags) of the stack's checkout; yields its gRPC address."""
    from gateway.process import free_port

    http, grpc, metrics = free_port(), free_port(), free_port()
    log_path = out / f"{stack.name}-server.log"
    out.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable, "-m", "serving", "serve",
        "--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics),
        "--out", str(out / f"{stack.name}-repository"),
    ]  # fmt: skip
    with log_path.open("ab") as log_file:
        process = subprocess.Popen(
            command,
            cwd=stack.root,
            env={**os.environ, **stack.env},
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + startup_s
        while True:
            try:
                url = f"http://127.0.0.1:{http}/v2/health/ready"
                with urllib.request.urlopen(url, timeout=2):
                    break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    message = f"{stack.name}: the server did not start ({log_path})"
                    raise RuntimeError(message) from None
                time.sleep(1.0)
        log.info("%s: server ready at 127.0.0.1:%d (log %s)", stack.name, grpc, log_path)
        yield f"127.0.0.1:{grpc}"
    finally:
        process.terminate()
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def run_level(
    stack: Stack, level: int, args: argparse.Namespace, items
) -> tuple[LevelRow, list[TurnRow], list[SessionRow]]:
    """A fresh gateway (default flags) of the stack, `level` sessions through it, its
    /metrics at the end."""
    from gateway.process import running_gateway

    with running_gateway(stack.grpc_url, [], quiet=True, env=stack.env) as (base, _process):
        turns, sessions, wall_s = run_sessions(base, stack.name, level, args, items)
        metrics = read_metrics(base)
    row = summarise_level(stack.name, level, turns, sessions, metrics, wall_s=wall_s)
    log.info(
        "%s, %d sessions: first audio %s ms, failed %d of %d, refused %s, busy %d (%d never "
        "in), loop lag %s ms, ping %s ms, late %d, %.0f s",
        stack.name, level, _pair(row.first_audio_p50_ms, row.first_audio_p95_ms), row.failed,
        row.questions, row.refused, row.told_busy, row.never_in,
        _pair(row.loop_lag_p50_ms, row.loop_lag_p99_ms),
        _pair(row.ping_p50_ms, row.ping_p99_ms), row.late_chunks, wall_s,
    )  # fmt: skip
    return row, turns, sessions


def warm_up(stack: Stack, items) -> None:
    """One untimed question (first runs of the networks), through its own gateway."""
    from clients.live import LiveReply  # noqa: F401 (the import the sessions need, early)
    from gateway.process import running_gateway

    with running_gateway(stack.grpc_url, [], quiet=True, env=stack.env) as (base, _process):
        row = SessionRow(stack.name, 0, 0)
        turns = asyncio.run(
            speak_session(base, row, items[:1], barge_in=None, pause_s=0.0, busy_wait_s=30.0)
        )
    if not turns or turns[0].error:
        log.warning("%s: warm-up turn: %s", stack.name, turns[0].error if turns else "none")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--levels", type=int, nargs="+", default=list(LEVELS))
    parser.add_argument("--questions", type=int, default=3, help="per session")
    parser.add_argument(
        "--min-turns",
        type=int,
        default=8,
        help="at least this many questions per level (more per session at low levels)",
    )
    parser.add_argument("--pause-s", type=float, default=1.0, help="after each reply")
    parser.add_argument("--stagger-s", type=float, default=0.5, help="between session starts")
    parser.add_argument(
        "--busy-wait-s", type=float, default=90.0, help="a session told busy retries this long"
    )
    parser.add_argument(
        "--barge-in",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="speak over each session's last reply and time the interrupt",
    )
    parser.add_argument(
        "--warmup", action=argparse.BooleanOptionalAction, default=True, help="one turn first"
    )
    parser.add_argument("--target-p95-s", type=float, default=TARGET_P95_S)
    parser.add_argument(
        "--before",
        metavar="REF",
        help="also REF's server and gateway (a worktree under OUT/before), alternating",
    )
    parser.add_argument("--url", help="today's Triton gRPC address (default: start one)")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.set_defaults(func=command)


def command(args: argparse.Namespace) -> int:
    args.out = args.out.resolve()  # the stacks' processes run in their checkouts
    secret = os.environ.get("AVATAR_SESSION_SECRET") or secrets.token_hex(32)
    stacks = [Stack("today", PROJECT_ROOT, stack_env(PROJECT_ROOT, secret))]
    if args.before:
        root = worktree(args.before, args.out / "before")
        stacks.append(Stack("before", root, stack_env(root, secret)))
    items = questions()
    levels: list[LevelRow] = []
    turns: list[TurnRow] = []
    sessions: list[SessionRow] = []
    started = time.monotonic()
    with contextlib.ExitStack() as running:
        for stack in stacks:
            if stack.name == "today" and args.url:
                stack.grpc_url = args.url
            else:
                stack.grpc_url = running.enter_context(running_server(stack, args.out))
        if args.warmup:
            for stack in stacks:
                warm_up(stack, items)
        for k, level in enumerate(args.levels):
            order = stacks if k % 2 == 0 else stacks[::-1]  # who goes first alternates
            for stack in order:
                row, level_turns, level_sessions = run_level(stack, level, args, items)
                levels.append(row)
                turns += level_turns
                sessions += level_sessions
    names = [s.name for s in stacks]
    meta = {
        "levels": args.levels,
        "questions": args.questions,
        "min_turns": args.min_turns,
        "pause_s": args.pause_s,
        "stagger_s": args.stagger_s,
        "before": args.before,
        "target_p95_s": args.target_p95_s,
        "minutes": round((time.monotonic() - started) / 60, 1),
    }
    write_rows(turns, args.out / "turns", meta)
    write_rows(sessions, args.out / "sessions", meta)
    write_rows(levels, args.out / "levels", meta)
    table = markdown(levels, names)
    line = figure_line(levels, names, args.target_p95_s)
    (args.out / "capacity.md").write_text(table + "\n\n" + line + "\n")
    print(table)
    print()
    print(line)
    print(f"saved under {args.out} ({meta['minutes']} min)")
    for t in [t for t in turns if t.error and not is_split(t)][:5]:
        print(f"  failed ({t.setting}, {t.sessions} sessions): {t.error}")
    return 0
