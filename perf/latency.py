"""Where the time of a spoken turn goes, from the end of speech (`python -m perf latency`).

Each session speaks questions through the live protocol (a WebSocket to the gateway, as
the page does): 32-ms microphone frames at real-time pace, silence after the question
until the turn ends, a pause of `--pause-s`, the next question. The gateway cuts the
utterance with the served `vad` and the endpointer (`end_silence_s`) and runs the turn on
the `avatar` model. Questions are real human recordings (Debian pocketsphinx-testdata)
and the packaged voice's questions. Per setting and number of sessions, from the end of
speech (when the last frame holding speech was sent; speech = 10-ms windows within 26 dB
of the clip's loudest), client side:

- `caption`: the whole utterance's text on the page: the `partial_transcript` of the first
  pause (while the endpointer still waits), or the turn's `transcript` if that came first;
- `endpoint`: the gateway's `speech_end` (end_silence_s + the vad's round trips);
- `transcript`, `first_audio`, `first_frame` (the first ARKit-52 frames): arrival of the
  messages;
- `first_token`, `first_sentence` (the LLM's first piece for TTS): the transcript's arrival
  + the server's own delays after the transcript (LLM stats, turn milestones).

The settings run against one server in one run, alternating per question, each through its
own gateway: `today` (the defaults: the end-of-turn model `turn_detector` asked at short
pauses, speculative ASR in the gateway, ASR windows in proportion to the audio, the first
clause to TTS, the INT8 variants that passed their gates on the CPU), `silence` (today's,
but the turn ends by `end_silence_s` of silence alone, as before the end-of-turn model:
`--endpointing silence`), `release` (the first release: `avatar_release` over `asr_release`
with 30-s windows and `llm_release` with whole sentences, no speculation) and `fp32`
(today's settings with the FP32 graphs of `llm_decoder`, `tts_vits` and `emotion_encoder`:
`avatar_fp32` over `*_fp32` copies) and `threads2` (today's, with 2 ONNX Runtime threads
per call in the ASR, LLM and TTS networks instead of 1), the copies materialised beside the
other models; and `spec_turn` (today's models, the gateway also starting the reply at the
first pause, held until the end of speech is confirmed: `--speculate-turn`); `no_partials`
(today's, without the ASR passes while the user speaks: `--no-partials`); `early_passes`
(today's, but a new session's first pass after 1 s of speech rather than 2, before its
language is known: `--detect-language-s 0`); `clause2` (today's, the first piece for TTS at
a clause break after 2 words instead of 4); `passes_alongside` (today's, but the passes
while the user speaks run alongside a pass at a pause instead of being cancelled by it:
`--passes-alongside`); `captions_wait` (today's, but no pass while the user speaks while
more than one reply is being generated: `--partials-max-answering 1`). `stall` is not a
time from the end of speech: the milliseconds a player that starts with the first audio
waits, in all, for later audio that is late.
Results:
build/perf/latency/ (CSV, JSON, markdown, PNG); the table's ratios are of each setting to
`today`.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import shutil
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from avatar.endpointing import END_SILENCE_S
from evals.report import DEFAULT_OUT, plot_bars, write_rows
from gateway.process import running_gateway
from model_configs.pbtxt import call_graph
from perf.harness import concurrently, playback, serve

if TYPE_CHECKING:
    from evals.clips import Clip

log = logging.getLogger(__name__)
OUT = DEFAULT_OUT / "latency"
SETTINGS = (
    "today",
    "silence",
    "release",
    "fp32",
    "threads2",
    "spec_turn",
    "no_partials",
    "early_passes",
    "clause2",
    "passes_alongside",
    "captions_wait",
)
# Which parameter of a BLS model names which model it calls: read from their config.pbtxt
# files, the turn's chain only, callers after their callees.
CALLEES: dict[str, dict[str, str]] = call_graph(root="avatar")


def chain(setting: str, changed: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
    """Copies `<model>_<setting>`: the `changed` models with their parameters, and every
    caller up to `avatar` of a copied model, re-pointed at the copies."""
    copies = {name: dict(values) for name, values in changed.items()}
    for caller, params in CALLEES.items():  # callers after their callees
        repointed = {k: f"{m}_{setting}" for k, m in params.items() if m in copies}
        if repointed:
            copies[caller] = {**copies.get(caller, {}), **repointed}
    return copies


# the settings besides today's, as config parameters of copies `<model>_<setting>` of the
# materialised models; the gateway of a setting talks to its `avatar_<setting>`
COPIES: dict[str, dict[str, dict[str, str]]] = {
    "release": chain(
        "release",
        {"asr": {"window_step": "0", "window_margin": "0"}, "llm": {"first_clause_words": "0"}},
    ),
    # the embedded runner's `onnx_file`: the graph it serves
    "fp32": chain(
        "fp32",
        {m: {"onnx_file": "model.onnx"} for m in ("llm_decoder", "tts_vits", "emotion_encoder")},
    ),
    # the first piece for TTS at a clause break after 2 words instead of 4
    "clause2": chain("clause2", {"llm": {"first_clause_words": "2"}}),
    # ONNX Runtime intra-op threads 2 (the defaults use 1) where a turn waits
    "threads2": chain(
        "threads2",
        {
            m: {"intra_op_threads": "2"}
            for m in ("asr_encoder", "asr_decoder", "llm_decoder", "tts_vits")
        },
    ),
}
MILESTONES = (
    "caption",
    "endpoint",
    "transcript",
    "first_token",
    "first_sentence",
    "first_audio",
    "first_frame",
    "stall",
)
LEAD_S = 0.3  # silence before each question


@dataclasses.dataclass
class TurnRow:
    sessions: int
    setting: str
    source: str  # "human" or "voice"
    speech_s: float
    transcript: str
    # ms after the end of speech (client side), None when not reached
    caption: float | None = None
    endpoint: float | None = None
    transcript_ms: float | None = None
    first_token: float | None = None
    first_sentence: float | None = None
    first_audio: float | None = None
    first_frame: float | None = None
    stall: float | None = None  # ms the reply's playback waited for audio not yet there
    late: int | None = None  # pieces of its audio that came after their time to play
    ended_by: str = ""  # what ended the turn (speech_end: audio, words, silence)
    speculative: bool | None = None  # its reply was started at a pause, before that end
    error: str = ""


def add_setting_models(repository: Path, setting: str) -> None:
    """The copies of `setting` (COPIES) beside the materialised models of `repository`."""
    from google.protobuf import text_format

    from model_configs.pbtxt import parse_config

    for name, values in COPIES[setting].items():
        source, target = repository / name, repository / f"{name}_{setting}"
        # artifacts stay links
        shutil.copytree(source, target, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
        config = parse_config(target / "config.pbtxt")
        config.name = target.name
        for key, value in values.items():
            config.parameters[key].string_value = value
        if "onnx_file" in values:  # the materialiser linked only the graph it serves
            link_beside_artifact(target / "1", values["onnx_file"])
        (target / "config.pbtxt").write_text(text_format.MessageToString(config))


def link_beside_artifact(version: Path, name: str) -> None:
    """Link `name` of the artifact folder the links in `version` point into, when absent."""
    if (version / name).exists():
        return
    links = [p for p in version.iterdir() if p.is_symlink() and p.suffix == ".onnx"]
    if not links:
        raise FileNotFoundError(f"{version}: no linked ONNX file to find {name} beside")
    source = links[0].resolve().parent / name
    if not source.is_file():
        raise FileNotFoundError(f"{source}: not built")
    (version / name).symlink_to(source)


def question_clips() -> list[tuple[str, Clip]]:
    """(source, clip) of the real recordings and the voice's questions, in the live check's
    order."""
    from evals.clips import clips
    from evals.recordings import human_clips

    voice = [c for c in clips()[:-1] if c.text.endswith("?")]
    return [("human", c) for c in human_clips()] + [("voice", c) for c in voice]


def questions() -> list[tuple[str, np.ndarray]]:
    """(source, 16-kHz audio) of the real recordings and the voice's questions."""
    return [(source, clip.audio) for source, clip in question_clips()]


def question_of(items: list[tuple[str, np.ndarray]], session: int, index: int):
    """The `index`-th question of speaker `session`: speakers start at different ones."""
    return items[(session * 7 + index) % len(items)]


SPEECH_DB = 26.0  # speech: 10-ms windows within this many dB of the clip's loudest


def speech_bounds_s(audio: np.ndarray, rate: int = 16_000) -> tuple[float, float]:
    """Seconds from the start of `audio` to the start of its first speech window and to
    the end of its last one."""
    hop = rate // 100
    windows = audio[: len(audio) // hop * hop].reshape(-1, hop)
    rms = np.sqrt((windows.astype(np.float64) ** 2).mean(axis=1)) + 1e-12
    loud = np.flatnonzero(20 * np.log10(rms / rms.max()) > -SPEECH_DB)
    if not len(loud):
        return 0.0, len(audio) / rate
    return float(loud[0] * hop / rate), float((loud[-1] + 1) * hop / rate)


def speech_end_s(audio: np.ndarray, rate: int = 16_000) -> float:
    """Seconds from the start of `audio` to the end of its last speech window."""
    return speech_bounds_s(audio, rate)[1]


def speech_signal(audio: np.ndarray) -> np.ndarray:
    """A question as the microphone sends it: LEAD_S of silence, then the speech."""
    return np.concatenate([np.zeros(round(LEAD_S * 16_000), np.float32), audio])


def frame_sent_at(reply, tag: str, seconds: float) -> float:
    """When the 32-ms frame holding second `seconds` of the audio `tag` ("speech",
    "barge_in") was sent, on the client clock: its first frame's send time + frames."""
    from clients.live import CHUNK_S

    step = round(CHUNK_S * 16_000)
    return reply.at[f"{tag}_first_sent"] + int(seconds * 16_000) // step * CHUNK_S


def spoken_turn(ws_url: str, row: TurnRow, audio: np.ndarray, seed: int) -> None:
    """One question through the live protocol; fills `row` (ms after the end of speech)."""
    import asyncio

    from clients.live import converse

    signal = speech_signal(audio)
    reply = asyncio.run(converse(ws_url, signal, controls={"seed": seed}, timeout_s=120.0))
    measure_turn(row, reply, signal)


def measure_turn(row: TurnRow, reply, signal: np.ndarray, *, barged: bool = False) -> None:
    """Fills `row` from a `clients.live.LiveReply` of `signal` (sent from the key
    `speech_first_sent` on): ms after the end of speech, the playback's late pieces; an
    error when the turn failed or ended cancelled (but for a barge-in with `barged`)."""
    errors = [m["message"] for m in reply.of("error")]
    ends = reply.of("turn_end")
    cancelled = ends[0].get("cancelled") if ends else None
    if errors or not ends or (cancelled and not (barged and cancelled == "barge-in")):
        row.error = "; ".join(errors) or f"turn ended {ends[:1]}"
        return
    speech_end = frame_sent_at(reply, "speech", speech_end_s(signal))

    def after(key: str) -> float | None:
        at = reply.at.get(key)
        return None if at is None else round((at - speech_end) * 1000, 1)

    row.transcript = reply.of("transcript")[0]["text"] if reply.of("transcript") else ""
    ends_of_speech = [m for m in reply.of("speech_end") if m.get("ended_by")]
    row.ended_by = ends_of_speech[-1]["ended_by"] if ends_of_speech else ""
    starts = reply.of("turn_start")
    row.speculative = bool(starts[0].get("speculative_turn")) if starts else None
    row.endpoint = after("speech_end1")
    row.transcript_ms = after("transcript")
    # (an at-pause caption before the end of speech was of a pause inside the question)
    captions = [t for t in (after("partial_at_pause"), row.transcript_ms) if t and t > 0]
    row.caption = min(captions) if captions else None
    timings = ends[0].get("timings", {})
    since = timings.get("since_request_ms", {})
    ttft = timings.get("llm_stats", {}).get("ttft_ms")
    if row.transcript_ms is not None and ttft is not None:
        row.first_token = round(row.transcript_ms + ttft, 1)
    if row.transcript_ms is not None and "llm_first_sentence" in since:
        # the LLM's first piece, on the server: its delay after the transcript, added
        piece = since["llm_first_sentence"] - since.get("transcript", 0.0)
        row.first_sentence = round(row.transcript_ms + piece, 1)
    row.first_audio = after("first_audio_turn1")
    row.first_frame = after("first_frames_turn1")
    first = reply.audio[0].turn if reply.audio else None  # the turn that answered first
    arrivals = [
        (at, chunk.start_s)
        for at, chunk in zip(reply.audio_arrived, reply.audio, strict=True)
        if chunk.turn == first
    ]
    heard = playback(arrivals)
    row.stall, row.late = round(heard.stall_s * 1000, 1), heard.late


def run_level(
    gateways: dict[str, str], sessions: int, per_session: int, *, pause_s: float
) -> list[TurnRow]:
    """`sessions` speakers at once, each `per_session` questions per setting; `gateways`:
    setting -> the WebSocket URL of its gateway."""
    items = questions()
    settings = tuple(gateways)
    rows: list[TurnRow] = []
    lock = threading.Lock()

    def speaker(index: int) -> None:
        n = len(settings)
        for q in range(per_session * n):
            source, audio = question_of(items, index, q // n)
            # every setting gets every question; the order alternates per question
            setting = settings[(q + q // n + index) % n]
            row = TurnRow(sessions, setting, source, round(len(audio) / 16_000, 2), "")
            try:
                spoken_turn(gateways[setting], row, audio, seed=q // n)
            except Exception as error:  # a broken turn is a figure, not the end
                row.error = f"{type(error).__name__}: {error}"
            with lock:
                rows.append(row)
            time.sleep(pause_s)

    concurrently(speaker, sessions)
    return rows


def _gateway_options(setting: str, end_silence_s: float) -> list[str]:
    # the gateway's defaults otherwise: its audio limit judges what a client sent since the
    # connection opened, so a gateway that reads late refuses no paced session (issue 41)
    options = ["--end-silence-s", str(end_silence_s)]
    if setting == "release":  # no speculation, and the silence rule of its time
        options += ["--no-speculate", "--endpointing", "silence"]
    elif setting == "silence":  # the turn ends by end_silence_s alone (before turn_detector)
        options += ["--endpointing", "silence"]
    elif setting == "spec_turn":  # today's models; the gateway also starts the reply at a pause
        options += ["--speculate-turn"]
    elif setting == "no_partials":  # today's, without the ASR passes while the user speaks
        options += ["--no-partials"]
    elif setting == "early_passes":  # the first pass after 1 s even before the language is known
        options += ["--detect-language-s", "0"]
    elif setting == "passes_alongside":  # a pause's pass does not cancel the others
        options += ["--passes-alongside"]
    elif setting == "captions_wait":  # no pass while speaking while 2+ replies are generated
        options += ["--partials-max-answering", "1"]
    elif setting not in ("today", "silence", "captions_wait"):
        options += ["--model", f"avatar_{setting}"]
    if "asr" in COPIES.get(setting, {}):
        options += ["--asr-model", f"asr_{setting}"]
    return options


def _field(milestone: str) -> str:
    return "transcript_ms" if milestone == "transcript" else milestone


def summarise(rows: list[TurnRow]) -> list[dict]:
    """p50/p95 per (sessions, setting, milestone)."""
    out = []
    order = {name: i for i, name in enumerate(SETTINGS)}
    keys = sorted({(r.sessions, r.setting) for r in rows}, key=lambda k: (k[0], order[k[1]]))
    for sessions, setting in keys:
        group = [r for r in rows if (r.sessions, r.setting) == (sessions, setting)]
        for milestone in MILESTONES:
            values = [getattr(r, _field(milestone)) for r in group if not r.error]
            values = [v for v in values if v is not None]
            if not values:
                continue
            out.append(
                {
                    "sessions": sessions,
                    "setting": setting,
                    "milestone": milestone,
                    "turns": len(values),
                    "failed": sum(bool(r.error) for r in group),
                    "p50_ms": round(float(np.percentile(values, 50)), 1),
                    "p95_ms": round(float(np.percentile(values, 95)), 1),
                }
            )
    return out


def markdown(summary: list[dict]) -> str:
    """One row per (sessions, milestone): p50 / p95 of each setting, and each other
    setting's p50 over today's."""
    by = {(s["sessions"], s["setting"], s["milestone"]): s for s in summary}
    settings = [name for name in SETTINGS if any(s["setting"] == name for s in summary)]
    others = [name for name in settings if name != "today"]
    lines = [
        "| sessions | from the end of speech | "
        + " | ".join(f"{name} p50 / p95 ms" for name in settings)
        + "".join(f" | {name} / today (p50)" for name in others)
        + " |",
        "|---:|---|" + "---:|" * (len(settings) + len(others)),
    ]
    for sessions in sorted({s["sessions"] for s in summary}):
        for milestone in MILESTONES:
            cells = {name: by.get((sessions, name, milestone)) for name in settings}
            if not any(cells.values()):
                continue
            today = cells.get("today")

            def ratio(other: dict | None, today: dict | None = today) -> str:
                if not (other and today and today["p50_ms"] > 0):
                    return "-"
                return f"{other['p50_ms'] / today['p50_ms']:.2f}x"

            values = [
                "-" if c is None else f"{c['p50_ms']:.0f} / {c['p95_ms']:.0f}"
                for c in cells.values()
            ]
            ratios = [ratio(cells[name]) for name in others]
            lines.append(f"| {sessions} | {milestone} | " + " | ".join(values + ratios) + " |")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url",
        help="Triton gRPC address (other settings need their copies); default: start one",
    )
    parser.add_argument("--sessions", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument(
        "--settings",
        nargs="+",
        choices=SETTINGS,
        default=["today", "release"],
        help="release and fp32 need their copies (made when the command starts the server)",
    )
    parser.add_argument("--questions", type=int, default=6, help="per session and setting")
    parser.add_argument(
        "--end-silence-s", type=float, default=END_SILENCE_S, help="endpointer silence"
    )
    parser.add_argument("--pause-s", type=float, default=1.0, help="pause after each turn")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.set_defaults(func=command)


def command(args: argparse.Namespace) -> int:
    def configure(repository: Path) -> None:
        for setting in set(args.settings) & set(COPIES):
            add_setting_models(repository, setting)

    with contextlib.ExitStack() as stack:
        url = stack.enter_context(serve(args.url, configure=configure)).grpc_url
        gateways = {
            setting: stack.enter_context(
                running_gateway(url, _gateway_options(setting, args.end_silence_s), quiet=True)
            )[0].replace("http://", "ws://")
            + "/ws"
            for setting in args.settings
        }
        rows: list[TurnRow] = []
        for sessions in args.sessions:
            log.info("%d session(s), %d questions per setting each", sessions, args.questions)
            rows += run_level(gateways, sessions, args.questions, pause_s=args.pause_s)
    summary = summarise(rows)
    meta = {"end_silence_s": args.end_silence_s, "pause_s": args.pause_s, "copies": COPIES}
    write_rows(rows, args.out / "turns", meta)
    write_rows(summary, args.out / "summary", meta)
    table = markdown(summary)
    (args.out / "latency.md").write_text(table + "\n")
    groups = {
        f"{s['sessions']}s {s['milestone']}": {}
        for s in summary
        if s["milestone"] in ("transcript", "first_audio")
    }
    for s in summary:
        key = f"{s['sessions']}s {s['milestone']}"
        if key in groups:
            groups[key][s["setting"]] = s["p50_ms"]
    plot_bars(groups, args.out / "latency.png", "From the end of speech (p50)", "ms")
    failed = [r for r in rows if r.error]
    print(table)
    print(f"turns: {len(rows)}, failed: {len(failed)}; saved under {args.out}")
    for r in failed[:5]:
        print(f"  failed ({r.sessions} sessions, {r.setting}): {r.error}")
    return 1 if failed else 0
