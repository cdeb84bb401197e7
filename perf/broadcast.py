"""`python -m perf broadcast`: the anchor on air, measured as a viewer gets it.

A rehearsal runs the real command (`python -m broadcast`) against Triton and a real
nginx-rtmp server, posts chat questions to its HTTP input at set times, plays the stream
back from the server while it is live (broadcast.readback) and reports:

- chat message posted -> the anchor's first audio in the received stream (its naming of the
  question: "Ada asks: ...") and -> the answer's first word, p50/p95 over the questions,
  split into the show (queue, speech, rendering ahead), the encoder's buffering (tick written
  -> its AAC packet out) and the server's (packet out -> received by the player);
- frame rate held: the output's underflows and late ticks, the received frame gaps, frozen
  frames, the A/V offset;
- CPU per broadcast stream: the broadcast process (render calls, captions, encoding) and
  tritonserver with its python-backend models (the renderer, and the answers' models) per
  wall second.

tests/test_broadcast.py runs the same rehearsal and asserts on it.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from broadcast.captions import BAND_SHARE
from broadcast.readback import Readback
from evals.report import DEFAULT_OUT
from perf.turn_cost import STUB, _cmdline, _cpu_s
from serving.server import free_port

log = logging.getLogger(__name__)
ROOT = Path(__file__).resolve().parents[1]
RESULTS = DEFAULT_OUT / "broadcast"
QUESTIONS = (
    ("Ada", "What is your favourite colour?"),
    ("Bo", "Tell me about the moon."),
    ("Cy", "What do you like to read?"),
    ("Dee", "How do computers learn?"),
    ("Eli", "Why is the sky blue?"),
    ("Fay", "What is a good breakfast?"),
    ("Gus", "Can you sing a song?"),
    ("Hal", "What makes a good teacher?"),
    ("Ivy", "Where would you travel next?"),
    ("Jo", "How do bees make honey?"),
    ("Kai", "What is your favourite film?"),
    ("Lu", "How tall is the tallest tree?"),
)  # distinct: the queue refuses a question answered in the last 10 minutes
BRIGHT_LUMA = 180  # caption text is white; the uniform under the band is dark


def caption_probe(luma: np.ndarray) -> float:
    """The share of bright pixels in the left quarter of the caption band: the question's
    white text is there while a caption is up, the portrait's dark uniform when not."""
    height, width = luma.shape
    band = luma[height - round(height * BAND_SHARE) :, : width // 4]
    return float((band > BRIGHT_LUMA).mean())


@dataclasses.dataclass(frozen=True)
class Question:
    at_s: float  # after the stream starts
    viewer: str
    text: str
    via: str = "http"  # or "irc": said in the IRC channel the broadcast reads (`irc_url`)


def schedule(count: int, first_s: float, every_s: float) -> list[Question]:
    return [Question(first_s + i * every_s, *QUESTIONS[i % len(QUESTIONS)]) for i in range(count)]


def _post(base: str, question: Question, key: str | None) -> dict[str, Any]:
    body = json.dumps({"viewer": question.viewer, "text": question.text}).encode()
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(f"{base}/chat/messages", body, headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return json.loads(reply.read())
    except urllib.error.HTTPError as refused:  # a verdict of the queue's moderation
        return json.loads(refused.read() or b"{}")


def _health(base: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"{base}/health", timeout=5) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


def _say_on_irc(irc_url: str, question: Question, timeout_s: float = 10.0) -> None:
    """`question` said in the channel of `irc_url` by a viewer of that name (a plain IRC
    client: register, join, wait until joined, say it, quit)."""
    parts = urllib.parse.urlsplit(irc_url)
    channel = "#" + (parts.path.strip("/") or parts.fragment).lstrip("#")
    nick = question.viewer
    with socket.create_connection((parts.hostname, parts.port or 6667), timeout_s) as sock:
        sock.sendall(f"NICK {nick}\r\nUSER {nick} 0 * :{nick}\r\nJOIN {channel}\r\n".encode())
        seen, deadline = b"", time.monotonic() + timeout_s
        while b" 366 " not in seen:  # the end of the channel's names: joined
            if time.monotonic() > deadline:
                raise RuntimeError(f"{nick} could not join {channel}: {seen[-300:]!r}")
            seen += sock.recv(4096)
        sock.sendall(f"PRIVMSG {channel} :{question.text}\r\nQUIT\r\n".encode())
        with contextlib.suppress(OSError):
            while sock.recv(4096):  # until the server closes: the line was taken
                pass


def _preview(base: str) -> dict[str, Any]:
    """The local HLS preview: its playlist and the size of its latest segment."""
    with urllib.request.urlopen(f"{base}/preview/index.m3u8", timeout=5) as reply:
        playlist = reply.read().decode()
    segments = [line for line in playlist.splitlines() if line.endswith(".ts")]
    size = 0
    if segments:
        with urllib.request.urlopen(f"{base}/preview/{segments[-1]}", timeout=5) as reply:
            size = len(reply.read())
    return {"playlist": playlist, "segments": len(segments), "last_segment_bytes": size}


@contextlib.contextmanager
def broadcast_process(
    triton_url: str,
    rtmp_url: str,
    *,
    face: str,
    max_tokens: int,
    ahead_s: float,
    port: int,
    log_path: Path,
    irc_url: str = "",
) -> Iterator[subprocess.Popen]:
    """`python -m broadcast` as a child, stopped (SIGINT, as Ctrl-C) on exit."""
    command = [sys.executable, "-m", "broadcast", "--triton-url", triton_url, "--url", rtmp_url]
    command += ["--face", face, "--preview-port", str(port), "--max-tokens", str(max_tokens)]
    command += ["--ahead-s", str(ahead_s)] + (["--irc", irc_url] if irc_url else [])
    with log_path.open("wb") as out:
        process = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(2)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _wait_on_air(base: str, process: subprocess.Popen, log_path: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"python -m broadcast exited:\n{log_path.read_text()[-3000:]}")
        with contextlib.suppress(OSError):
            status, _ = _health(base)
            if status == 200:
                return
        time.sleep(0.2)
    raise RuntimeError(f"the broadcast was not on air in {timeout_s} s:\n{log_path.read_text()}")


def rehearse(
    triton_url: str,
    rtmp_url: str,
    questions: Sequence[Question],
    seconds: float,
    *,
    player_ready: Callable[[], bool],
    triton_pid: int | None = None,
    face: str = "portrait",
    max_tokens: int = 32,
    ahead_s: float = 1.0,
    work_dir: Path,
    on_air: Callable[[], None] | None = None,
    irc_url: str = "",
) -> dict[str, Any]:
    """One broadcast of `seconds` with `questions` posted at their times; the figures (see
    the module's docstring) and the raw material the test checks. `on_air()` is called once
    the stream is up (to start other load beside it)."""
    fps = 25
    readback = Readback(rtmp_url, probe=caption_probe, fps_hint=fps)
    reader = threading.Thread(target=readback.run, kwargs={"seconds": seconds + 60})
    reader.start()
    deadline = time.monotonic() + 10
    while not player_ready():
        if time.monotonic() > deadline:
            raise RuntimeError("the read-back never subscribed to the stream")
        time.sleep(0.05)
    port, log_path = free_port(), work_dir / "broadcast.log"
    base = f"http://127.0.0.1:{port}"
    key = os.environ.get("AVATAR_GATEWAY_KEY")
    with broadcast_process(
        triton_url,
        rtmp_url,
        face=face,
        max_tokens=max_tokens,
        ahead_s=ahead_s,
        port=port,
        log_path=log_path,
        irc_url=irc_url,
    ) as process:
        _wait_on_air(base, process, log_path, timeout_s=60)
        if on_air is not None:
            on_air()
        started = time.monotonic()
        cpu_show, cpu_triton = _cpu_s(process.pid), _triton_cpu(triton_pid)
        posted: dict[str, float] = {}  # text -> when it was sent
        for question in questions:
            time.sleep(max(0.0, started + question.at_s - time.monotonic()))
            sent_at = time.monotonic()
            if question.via == "irc":
                _say_on_irc(irc_url, question)
                posted[question.text] = sent_at
                log.info("said %r on IRC", question.text)
                continue
            verdict = _post(base, question, key)
            if verdict.get("accepted"):
                posted[question.text] = sent_at
            log.info("posted %r: %s", question.text, verdict.get("reason"))
        time.sleep(max(0.0, started + seconds - time.monotonic()))
        wall = time.monotonic() - started
        cpu = {
            "broadcast_process": (_cpu_s(process.pid) - cpu_show) / wall,
            **{
                name: (value - cpu_triton.get(name, 0.0)) / wall
                for name, value in _triton_cpu(triton_pid).items()
            },
        }
        _, status = _health(base)
        preview = _preview(base)
    reader.join(timeout=30)
    if process.returncode not in (0, None):
        raise RuntimeError(f"python -m broadcast failed:\n{log_path.read_text()[-3000:]}")
    return {
        "seconds": round(wall, 1),
        "status": status,
        "cpu_per_s": {k: round(v, 3) for k, v in cpu.items()},
        "questions": _question_figures(status, posted, readback, fps),
        "readback": readback,
        "preview": preview,
        "log": log_path.read_text(),
    }


def _triton_cpu(pid: int | None) -> dict[str, float]:
    """CPU-seconds so far of tritonserver `pid` and of each of its python-backend models (its
    child stubs, named by their model folder; other servers' stubs on the machine are not
    counted)."""
    if pid is None:
        return {}
    cpu = {"tritonserver": _cpu_s(pid)}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rpartition(")")[2].split()[1])
            command = _cmdline(int(entry.name))
            if parent == pid and command[0].endswith(STUB) and len(command) > 1:
                model = Path(command[1]).parts[-3]  # <repo>/<model>/1/model.py
                cpu[model] = cpu.get(model, 0.0) + _cpu_s(int(entry.name))
        except (OSError, IndexError, ValueError):  # ended meanwhile
            continue
    return {**cpu, "triton_total": sum(cpu.values())}


def _question_figures(
    status: dict[str, Any], posted: dict[str, float], readback: Readback, fps: int
) -> list[dict[str, Any]]:
    """Per question: when it was posted, and when its attribution's and answer's first audio
    reached the player, with the encoder's and the server's parts."""
    out = []
    for record in status.get("records", []):
        figures: dict[str, Any] = {"id": record["id"], "text": record["text"]}
        figures["source"] = record.get("source", "")
        sent = posted.get(record["text"])
        for kind in ("attribution", "answer"):
            times = record.get(f"{kind}_output")  # the output's tick (after any underflow)
            if times is None or sent is None:
                figures[kind] = None
                continue
            tick = times["tick"]
            heard = readback.audio_onset(tick / fps)
            received = readback.audio_received_at(heard) if heard is not None else None
            figures[kind] = {
                "tick": tick,
                "heard_media_s": heard,
                "posted_to_heard_s": None if received is None else round(received - sent, 3),
                "posted_to_written_s": round(times["written"] - sent, 3),
                "encoder_ms": _ms(times.get("audio_out"), times["written"]),
                "server_ms": _ms(received, times.get("audio_out")),
            }
        out.append(figures)
    return out


def _ms(later: float | None, earlier: float | None) -> float | None:
    return None if later is None or earlier is None else round((later - earlier) * 1000, 1)


def summary(rehearsal: dict[str, Any]) -> dict[str, Any]:
    """The figures users read: p50/p95 of the latencies, the frame rate held, CPU."""
    report = rehearsal["readback"].report()
    output = rehearsal["status"].get("output", {})
    out: dict[str, Any] = {
        "questions": len(rehearsal["questions"]),
        "received": dataclasses.asdict(report),
        "underflows": output.get("underflows"),
        "thinned_batches": rehearsal["status"].get("thinned_batches"),
        "sparse_batches": rehearsal["status"].get("sparse_batches"),
        "late_ticks": output.get("late_ticks"),
        "ticks": output.get("ticks"),
        "cpu_per_s": rehearsal["cpu_per_s"],
    }
    for kind in ("attribution", "answer"):
        for field in ("posted_to_heard_s", "posted_to_written_s", "encoder_ms", "server_ms"):
            values = [
                q[kind][field]
                for q in rehearsal["questions"]
                if q.get(kind) and q[kind][field] is not None
            ]
            if values:
                out[f"{kind}_{field}"] = {
                    "p50": round(float(np.percentile(values, 50)), 3),
                    "p95": round(float(np.percentile(values, 95)), 3),
                    "n": len(values),
                }
    return out


def _rtmp_server() -> contextlib.AbstractContextManager:
    """A real nginx-rtmp on this machine (the one the tests use), for a rehearsal."""
    from serving.local_services import running_rtmp_server

    return running_rtmp_server()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", help="a running Triton's gRPC address (default: embedded)")
    parser.add_argument("--triton-pid", type=int, help="its pid, for its CPU figures")
    parser.add_argument("--questions", type=int, default=6)
    parser.add_argument("--every", type=float, default=20.0, help="seconds between questions")
    parser.add_argument("--seconds", type=float, help="default: the questions' span + 25 s")
    parser.add_argument("--face", choices=("portrait", "cartoon"), default="portrait")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--ahead-s", type=float, default=1.0, help="the show's render-ahead")
    parser.add_argument(
        "--live-sessions",
        type=int,
        default=0,
        help="live page sessions talking through a gateway during the broadcast (perf capacity's "
        "paced speakers)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.set_defaults(func=command)


def command(args: argparse.Namespace) -> int:
    from perf.harness import serve

    questions = schedule(args.questions, 5.0, args.every)
    seconds = args.seconds or questions[-1].at_s + 25.0
    args.out.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as running:
        target = running.enter_context(serve(args.url))
        rtmp = running.enter_context(_rtmp_server())
        server = target.server
        pid = args.triton_pid or (server.pid if server is not None else None)
        talkers = LiveSessions(target.grpc_url, args.live_sessions, seconds, running)
        rehearsal = rehearse(
            target.grpc_url,
            rtmp.url("anchor"),
            questions,
            seconds,
            player_ready=lambda: "play: name=" in rtmp.error_log(),
            triton_pid=pid,
            face=args.face,
            max_tokens=args.max_tokens,
            ahead_s=args.ahead_s,
            work_dir=args.out,
            on_air=talkers.start,
        )
        live = talkers.figures()
    figures = summary(rehearsal)
    figures["ahead_s"] = args.ahead_s
    figures["live_sessions"] = live
    figures["per_question"] = rehearsal["questions"]
    figures["load_average"] = os.getloadavg()
    (args.out / "broadcast.json").write_text(json.dumps(figures, indent=2, default=str))
    _print(figures)
    return 0


class LiveSessions:
    """`count` live page sessions (perf capacity's paced speakers: spoken questions through a
    gateway of their own) talking beside the broadcast for about `seconds`."""

    def __init__(
        self, triton_url: str, count: int, seconds: float, running: contextlib.ExitStack
    ) -> None:
        self.count, self.seconds, self.thread = count, seconds, None
        self.result: tuple | None = None
        if count:
            from gateway.process import running_gateway

            self.base, _ = running.enter_context(running_gateway(triton_url, [], quiet=True))

    def start(self) -> None:
        if not self.count:
            return
        from perf.capacity import questions, run_sessions

        settings = argparse.Namespace(
            questions=max(1, int(self.seconds // 12)),  # a spoken turn takes ~8-12 s here
            min_turns=0,
            barge_in=False,
            stagger_s=2.0,
            pause_s=1.0,
            busy_wait_s=30.0,
        )
        items = questions()

        def talk() -> None:
            self.result = run_sessions(self.base, "broadcast", self.count, settings, items)

        self.thread = threading.Thread(target=talk, daemon=True)
        self.thread.start()

    def figures(self) -> dict[str, Any] | None:
        if self.thread is None:
            return None
        self.thread.join(timeout=120)
        if self.result is None:
            return {"sessions": self.count, "error": "the sessions did not finish"}
        turns = self.result[0]
        first = [t.first_audio for t in turns if t.first_audio is not None]  # ms after speech
        return {
            "sessions": self.count,
            "turns": len(turns),
            "failed": sum(1 for t in turns if t.error),
            "first_audio_ms_p50": round(float(np.percentile(first, 50)), 1) if first else None,
            "first_audio_ms_p95": round(float(np.percentile(first, 95)), 1) if first else None,
        }


def _print(figures: dict[str, Any]) -> None:
    print(f"questions: {figures['questions']}")
    for kind, name in (("attribution", "first audio (names the question)"), ("answer", "answer")):
        for field, label in (
            ("posted_to_heard_s", "posted -> heard by the player (s)"),
            ("posted_to_written_s", "posted -> written to the encoder (s)"),
            ("encoder_ms", "encoder buffering (ms)"),
            ("server_ms", "server + network buffering (ms)"),
        ):
            value = figures.get(f"{kind}_{field}")
            if value:
                print(f"{name:34s} {label:40s} p50 {value['p50']:8.3f}  p95 {value['p95']:8.3f}")
    received = figures["received"]
    print(
        f"frames {received['frames']} at {received['fps']} fps; largest gap "
        f"{received['max_frame_gap_intervals']} intervals; longest frozen run "
        f"{received['longest_frozen_run']}; A/V offset max {received['av_offset_max_ms']} ms; "
        f"underflows {figures['underflows']} of {figures['ticks']} ticks"
    )
    print(
        f"batches thinned (a batch short of the full queue: every other frame drawn): "
        f"{figures['thinned_batches']}, of which sparse (under half: the last frame only): "
        f"{figures['sparse_batches']}"
    )
    print("CPU per wall second: " + json.dumps(figures["cpu_per_s"]))
    if figures.get("live_sessions"):
        print("live page sessions beside it: " + json.dumps(figures["live_sessions"]))
