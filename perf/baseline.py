"""`python -m perf baseline`: the naive way vs the Triton `avatar` stream, side by side.

Naive baseline (how most avatar projects run): the same turn (`avatar.pipeline.run_turn`:
ASR -> LLM sentence by sentence -> TTS -> animation, -> frames with --render) over the
stages in-process (`avatar.pipeline.local`): the graphs the embedded server runs, called
with ONNX Runtime, one session's request per call: no batching across sessions (the LLM
too: each reply's decode steps are its own calls, batch 1) and no LLM prefix cache.
Concurrent sessions are threads sharing those ONNX Runtime sessions (one intra-op thread
per call, as in the Triton runners): the way a web app with a worker thread per
connection calls its models. Threads, not processes, because 8 processes would each load
every model (~1.5 GB each) and the ORT calls release the GIL anyway; the Python glue does
contend on the GIL, as it does in such apps.

Triton: the same turn (same spoken question, fixed seed, same max_tokens, temperature,
persona and face) through the `avatar` model over one gRPC stream per turn, one client
thread per session, on one served-benchmark harness (perf/harness.py).

Per turn: time to first audio (client side: when the first sentence's audio arrives, or
for the baseline is emitted), time to the full reply, real-time factor RTF = (full reply -
transcript) / seconds of reply audio, the playback stall (audio played from its first
sample: how long playback would wait for a late sentence) and, when rendering, frames per
second of rendering. A session is served in real time when every turn has RTF <= 1,
stalls < 0.1 s and, when rendering, renders >= 25 frames/s.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from avatar.pipeline import (
    FramesEvent,
    SentenceEvent,
    Stages,
    TranscriptEvent,
    TurnEvent,
    parse_turn,
    run_turn,
)
from perf.harness import Latency, at_concurrency, playback_stall, warm_up
from perf.inputs import QUESTIONS

log = logging.getLogger(__name__)

REAL_TIME_FPS = 25.0
MAX_STALL_S = 0.1


@dataclasses.dataclass(frozen=True)
class Scenario:
    sessions: tuple[int, ...] = (1, 2, 4, 8)
    turns: int = 2  # per session, each a different spoken question
    max_tokens: int = 48
    render: bool = False
    seed: int = 0
    warmup: bool = True  # one untimed turn on each side first (ORT first runs, caches)


@dataclasses.dataclass
class TurnFigures:
    side: str  # "baseline" | "triton"
    sessions: int  # concurrent sessions of this run
    session: int
    turn: int
    question: str
    transcript: str = ""
    reply: str = ""
    first_audio_s: float = 0.0
    full_reply_s: float = 0.0
    transcript_s: float = 0.0
    audio_s: float = 0.0
    stall_s: float = 0.0
    frames: int = 0
    render_fps: float = 0.0
    error: str = ""

    @property
    def rtf(self) -> float:
        return (self.full_reply_s - self.transcript_s) / self.audio_s if self.audio_s else 99.0

    def real_time(self, render: bool) -> bool:
        ok = not self.error and self.rtf <= 1.0 and self.stall_s < MAX_STALL_S
        return ok and (not render or self.render_fps >= REAL_TIME_FPS)


@dataclasses.dataclass(frozen=True)
class LevelSummary:
    side: str
    sessions: int
    turns: int
    first_audio_median_s: float
    first_audio_p95_s: float
    full_reply_median_s: float
    full_reply_p95_s: float
    rtf_median: float
    stall_median_s: float
    render_fps_median: float
    sessions_real_time: int
    turns_per_min: float
    errors: int
    load_1m: float


# --------------------------------------------------------------------------- the turns

# one sentence's audio as the client got it: (arrival s, start on the turn clock s, seconds)
Arrival = tuple[float, float, float]
# fills the figures of one turn: (spoken question, controls, figures)
TurnFn = Callable[[np.ndarray, dict[str, Any], TurnFigures], None]


def local_turn(
    stages: Stages, audio: np.ndarray, controls: dict[str, Any], figures: TurnFigures
) -> None:
    """One `run_turn` over in-process stages; the events' emission times are the arrivals."""
    request = parse_turn(audio, None, controls=json.dumps(controls))
    started = time.perf_counter()
    arrivals: list[Arrival] = []
    frames = 0

    def emit(event: TurnEvent) -> None:
        nonlocal frames
        now = time.perf_counter() - started
        if isinstance(event, TranscriptEvent):
            figures.transcript_s = now
        elif isinstance(event, SentenceEvent) and event.audio.size:
            arrivals.append((now, event.start, event.audio.size / event.sample_rate))
        elif isinstance(event, FramesEvent) and event.frames is not None:
            frames += len(event.frames)

    final = run_turn(request, stages, emit, lambda: "")
    figures.full_reply_s = time.perf_counter() - started
    figures.transcript, figures.reply = final.transcript, final.reply
    figures.error = "; ".join(final.errors)
    figures.first_audio_s = arrivals[0][0] if arrivals else figures.full_reply_s
    _stream_figures(figures, arrivals, frames, final.timings)


def triton_turn(
    url: str, audio: np.ndarray, controls: dict[str, Any], figures: TurnFigures
) -> None:
    """One turn over the `avatar` gRPC stream; arrival times give the playback stall."""
    from clients.avatar_stream import stream_turn

    started = time.perf_counter()
    arrivals: list[Arrival] = []

    def on_response(response: dict[str, Any]) -> None:
        now = time.perf_counter() - started
        if response.get("kind") == "transcript":
            figures.transcript_s = now
        elif response.get("kind") == "sentence" and response["audio"].size:
            seconds = response["audio"].size / response["sample_rate"]
            arrivals.append((now, response["start_time"], seconds))

    turn = stream_turn(url, audio=audio, controls=controls, on_response=on_response)
    figures.error = turn.error or "; ".join(json.loads(turn.final.get("error") or "[]"))
    figures.transcript = turn.transcript
    figures.reply = turn.final.get("text", "")
    figures.first_audio_s = turn.first_audio_s or turn.total_s
    figures.full_reply_s = turn.total_s
    frames = sum(len(v["video"]) for v in turn.videos if "video" in v)
    _stream_figures(figures, arrivals, frames, turn.timings)


def _stream_figures(
    figures: TurnFigures, arrivals: Sequence[Arrival], frames: int, timings: dict[str, Any]
) -> None:
    figures.audio_s = sum(a[2] for a in arrivals)
    figures.stall_s = playback_stall((at, start) for at, start, _ in arrivals)
    figures.frames = frames
    render_ms = timings.get("stage_ms", {}).get("render", 0.0)
    figures.render_fps = frames / (render_ms / 1000) if render_ms else 0.0


# --------------------------------------------------------------------------- the run


def _level(
    side: str, sessions: int, scenario: Scenario, turn: TurnFn
) -> tuple[list[TurnFigures], float]:
    """`sessions` clients, each running `scenario.turns` turns back to back."""
    rows = [  # in turn order, so that client s gets session s's turns
        TurnFigures(side, sessions, s, t, QUESTIONS[(s + t) % len(QUESTIONS)])
        for t in range(scenario.turns)
        for s in range(sessions)
    ]
    load = at_concurrency(sessions, rows, _sender(turn, scenario))
    for sample in load.errors:  # a failed turn is counted, the run goes on
        sample.request.error = sample.error
    return [sample.request for sample in load.samples], load.wall_s


def _sender(turn: TurnFn, scenario: Scenario) -> Callable[[TurnFigures], None]:
    controls = {"seed": scenario.seed, "max_tokens": scenario.max_tokens}
    controls["render"] = scenario.render
    return lambda row: turn(_spoken(row.question), controls, row)


@functools.cache
def _spoken(question: str) -> np.ndarray:
    from avatar.audio import reference_speech

    return reference_speech(question)


def summarise(
    side: str, sessions: int, rows: Sequence[TurnFigures], wall_s: float, render: bool
) -> LevelSummary:
    ok = [r for r in rows if not r.error] or list(rows)

    def median(values: list[float]) -> float:
        return round(statistics.median(values), 3) if values else 0.0

    first_audio = Latency.of([r.first_audio_s for r in ok])
    full_reply = Latency.of([r.full_reply_s for r in ok])

    real = {
        s
        for s in {r.session for r in rows}
        if all(r.real_time(render) for r in rows if r.session == s)
    }
    return LevelSummary(
        side=side,
        sessions=sessions,
        turns=len(rows),
        first_audio_median_s=round(first_audio.median_s, 3),
        first_audio_p95_s=round(first_audio.p95_s, 3),
        full_reply_median_s=round(full_reply.median_s, 3),
        full_reply_p95_s=round(full_reply.p95_s, 3),
        rtf_median=median([r.rtf for r in ok]),
        stall_median_s=median([r.stall_s for r in ok]),
        render_fps_median=median([r.render_fps for r in ok]),
        sessions_real_time=len(real),
        turns_per_min=round(len(rows) / wall_s * 60, 2),
        errors=sum(bool(r.error) for r in rows),
        load_1m=round(os.getloadavg()[0], 2),
    )


@dataclasses.dataclass
class BaselineResults:
    turns: list[TurnFigures]
    levels: list[LevelSummary]
    scenario: Scenario


def run(url: str, scenario: Scenario) -> BaselineResults:
    """Warm both sides up, then per session count: the baseline, then Triton."""
    from avatar.pipeline.local import local_stages
    from serving.served import local_config, local_models

    config = local_config(prefix_cache_entries=0)
    with local_stages(local_models(scenario.render), config) as stages:
        sides: dict[str, TurnFn] = {
            "baseline": functools.partial(local_turn, stages),
            "triton": functools.partial(triton_turn, url),
        }
        if scenario.warmup:  # one untimed turn per side
            for side, turn in sides.items():
                warm_up(_sender(turn, scenario), [TurnFigures(side, 1, 0, 0, QUESTIONS[0])])
        turns, levels = [], []
        for sessions in scenario.sessions:
            for side, turn in sides.items():
                log.info("%s: %d sessions x %d turns", side, sessions, scenario.turns)
                rows, wall = _level(side, sessions, scenario, turn)
                turns += rows
                levels.append(summarise(side, sessions, rows, wall, scenario.render))
                log.info("%s", levels[-1])
    return BaselineResults(turns, levels, scenario)


def ratios(levels: Sequence[LevelSummary]) -> list[dict[str, float]]:
    """Triton / baseline per session count (< 1 is better for times, > 1 for turns/min)."""
    by = {(s.side, s.sessions): s for s in levels}
    out = []
    for sessions in sorted({s.sessions for s in levels}):
        base, tri = by.get(("baseline", sessions)), by.get(("triton", sessions))
        if base is None or tri is None:
            continue

        def ratio(a: float, b: float) -> float:
            return round(a / b, 3) if b else float("nan")

        out.append(
            {
                "sessions": sessions,
                "first_audio": ratio(tri.first_audio_median_s, base.first_audio_median_s),
                "full_reply": ratio(tri.full_reply_median_s, base.full_reply_median_s),
                "rtf": ratio(tri.rtf_median, base.rtf_median),
                "turns_per_min": ratio(tri.turns_per_min, base.turns_per_min),
                "real_time_sessions": f"{tri.sessions_real_time} vs {base.sessions_real_time}",
            }
        )
    return out


def format_table(results: BaselineResults) -> str:
    lines = [
        "| side | sessions | turns | first audio s (median / p95) | full reply s (median / p95) | "
        "RTF | stall s | render fps | real-time sessions | turns/min | errors | load |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in results.levels:
        lines.append(
            f"| {s.side} | {s.sessions} | {s.turns} | {s.first_audio_median_s:.2f} / "
            f"{s.first_audio_p95_s:.2f} | {s.full_reply_median_s:.2f} / {s.full_reply_p95_s:.2f} | "
            f"{s.rtf_median:.2f} | {s.stall_median_s:.2f} | "
            f"{s.render_fps_median:.1f} | {s.sessions_real_time}/{s.sessions} | "
            f"{s.turns_per_min:.1f} | {s.errors} | {s.load_1m:.2f} |"
        )
    lines += [
        "",
        "Triton / baseline (medians; < 1 is better for times and RTF, > 1 for turns/min):",
        "",
        "| sessions | first audio | full reply | RTF | turns/min | real-time sessions "
        "(Triton vs baseline) |",
        "|---:|---:|---:|---:|---:|---|",
    ]
    for r in ratios(results.levels):
        lines.append(
            f"| {r['sessions']} | {r['first_audio']:.2f} | {r['full_reply']:.2f} | "
            f"{r['rtf']:.2f} | {r['turns_per_min']:.2f} | {r['real_time_sessions']} |"
        )
    same = sum(
        1
        for b in results.turns
        for t in results.turns
        if b.side == "baseline"
        and t.side == "triton"
        and b.sessions == t.sessions
        and (b.session, b.turn) == (t.session, t.turn)
        and b.reply == t.reply
    )
    total = sum(1 for b in results.turns if b.side == "baseline")
    lines += ["", f"identical replies on both sides: {same}/{total} turns"]
    return "\n".join(lines)


def save(results: BaselineResults, scenario: Scenario, out: Path) -> list[Path]:
    from evals.report import plot_bars, write_rows

    out = Path(out)
    meta = {"scenario": dataclasses.asdict(scenario), "ratios": ratios(results.levels)}
    turns = [
        {**dataclasses.asdict(t), "rtf": round(t.rtf, 3), "real_time": t.real_time(scenario.render)}
        for t in results.turns
    ]
    paths = [
        write_rows(results.levels, out / "baseline", meta),
        write_rows(turns, out / "baseline-turns"),
        out / "baseline.md",
    ]
    (out / "baseline.md").write_text(format_table(results) + "\n")
    for field, label in (
        ("first_audio_median_s", "time to first audio (s, median)"),
        ("full_reply_median_s", "time to full reply (s, median)"),
        ("turns_per_min", "turns per minute"),
    ):
        groups: dict[str, dict[str, float]] = {}
        for s in results.levels:
            groups.setdefault(f"{s.sessions} sessions", {})[s.side] = getattr(s, field)
        paths.append(
            plot_bars(groups, out / f"baseline-{field}.png", f"baseline vs Triton: {label}", label)
        )
    return paths
