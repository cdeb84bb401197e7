"""Where the time of a spoken turn goes, from the end of speech (`python -m perf latency`).

Each session plays spoken questions at real-time pace in 32-ms chunks (512 samples, 16 kHz)
to the served `vad` model over gRPC, as a live gateway does; the `Endpointer` (the same
hysteresis as the rest of the project, `end_silence_s` of silence) cuts the utterance,
which goes to the `avatar` stream at once. The end of speech is when the last chunk the
vad heard as speech had been played. Questions are real human recordings (Debian
pocketsphinx-testdata) and the packaged voice, each with 0.3 s of silence before it and a
pause of `--pause-s` after its turn. Figures, per setting and number of sessions, from the
end of speech (the moment the last speech sample was played):

- `endpoint`: the utterance is cut (end_silence_s + one chunk + the vad round trips);
- `transcript`, `first_sentence` (the first piece for TTS), `first_audio`, `first_frame`
  (the first ARKit-52 frame): the server's milestones (`timings.since_request_ms`) + the
  endpoint, so transport is in (the client's own first-audio time agrees within a few ms);
- `first_token`: transcript + the LLM's own time to first token (its stats);
- `client_first_audio`: client-side arrival of the first audio.

Both settings run in one server and one run, alternating per question so that the load is
the same: `today` (the repository's defaults) and `release` (the first release's settings:
30-s ASR windows, whole sentences to TTS) as the models `avatar_release`, `asr_release`,
`llm_release` materialised beside the others. Results: build/perf/latency/ (CSV, JSON,
markdown, PNG).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import shutil
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from perf.report import DEFAULT_OUT, plot_bars, write_rows

log = logging.getLogger(__name__)
OUT = DEFAULT_OUT / "latency"
SETTINGS = ("today", "release")
# the first release's settings, as config parameters of the copies
RELEASE = {
    "asr": {"window_step": "0", "window_margin": "0"},
    "llm": {"first_clause_words": "0"},
    "avatar": {"asr_model": "asr_release", "llm_model": "llm_release"},
}
MILESTONES = (
    "endpoint",
    "transcript",
    "first_token",
    "first_sentence",
    "first_audio",
    "first_frame",
)
LEAD_S = 0.3  # silence before each question


@dataclasses.dataclass
class TurnRow:
    sessions: int
    setting: str
    source: str  # "human" or "voice"
    speech_s: float
    transcript: str
    endpoint: float | None = None  # ms after the end of speech
    transcript_ms: float | None = None
    first_token: float | None = None
    first_sentence: float | None = None
    first_audio: float | None = None
    first_frame: float | None = None
    client_first_audio: float | None = None
    error: str = ""


def add_release_models(repository: Path) -> None:
    """Copies of asr/llm/avatar with the first release's settings (see RELEASE)."""
    from google.protobuf import text_format

    from avatar.serving.repository import parse_config

    for name, values in RELEASE.items():
        source, target = repository / name, repository / f"{name}_release"
        shutil.copytree(source, target)
        config = parse_config(target / "config.pbtxt")
        config.name = target.name
        for key, value in values.items():
            config.parameters[key].string_value = value
        (target / "config.pbtxt").write_text(text_format.MessageToString(config))


def questions() -> list[tuple[str, np.ndarray]]:
    """(source, 16-kHz audio) of the real recordings and the voice's questions."""
    from export.asr.clips import clips
    from export.asr.human import human_clips

    voice = [c for c in clips()[:-1] if c.text.endswith("?")]
    return [("human", c.audio) for c in human_clips()] + [("voice", c.audio) for c in voice]


class Session:
    """One speaker: plays questions to `vad` at real-time pace, sends turns to `avatar`."""

    def __init__(self, url: str, end_silence_s: float):
        import tritonclient.grpc as grpcclient

        self.url = url
        self.client = grpcclient.InferenceServerClient(url)
        self.end_silence_s = end_silence_s

    def _vad(self, stream, chunk: np.ndarray) -> float:
        import tritonclient.grpc as grpcclient

        inputs = []
        for name, value in stream.inputs(chunk[None]).items():
            tensor = grpcclient.InferInput(name, list(value.shape), "FP32")
            tensor.set_data_from_numpy(np.ascontiguousarray(value, np.float32))
            inputs.append(tensor)
        outputs = ["speech_prob", "next_context", "next_state"]
        result = self.client.infer(
            "vad", inputs, outputs=[grpcclient.InferRequestedOutput(n) for n in outputs]
        )
        return float(stream.update({n: result.as_numpy(n) for n in outputs}).reshape(-1)[0])

    def listen(self, audio: np.ndarray) -> tuple[np.ndarray | None, float, float]:
        """Play `audio` (+ trailing silence) in real time -> (utterance, end of speech,
        endpoint) as perf_counter times; None if the endpointer found no utterance."""
        from avatar.vad import CHUNK, CHUNK_S, Endpointer, VadStream

        lead = np.zeros(round(LEAD_S * 16_000), np.float32)
        tail = np.zeros(round((self.end_silence_s + 2.0) * 16_000), np.float32)
        signal = np.concatenate([lead, audio, tail])
        signal = np.pad(signal, (0, -len(signal) % CHUNK))
        stream, endpointer = VadStream(), Endpointer(end_silence_s=self.end_silence_s)
        speech = -1  # the last chunk the vad called speech
        started = time.perf_counter()
        for index in range(len(signal) // CHUNK):
            due = started + (index + 1) * CHUNK_S  # the chunk is complete when played
            if (wait := due - time.perf_counter()) > 0:
                time.sleep(wait)
            chunk = signal[index * CHUNK : (index + 1) * CHUNK]
            prob = self._vad(stream, chunk)
            speech = index if prob >= endpointer.detector.off else speech  # its own rule
            utterance = endpointer.push(chunk, prob)
            if utterance is not None:
                # the end of speech: when the last chunk the vad heard as speech was played
                return utterance, started + (speech + 1) * CHUNK_S, time.perf_counter()
        return None, started + (speech + 1) * CHUNK_S, time.perf_counter()

    def turn(self, row: TurnRow, audio: np.ndarray, seed: int) -> None:
        from clients.avatar_stream import stream_turn

        utterance, speech_end, endpoint = self.listen(audio)
        row.endpoint = (endpoint - speech_end) * 1000
        if utterance is None:
            row.error = "no utterance detected"
            return
        model = "avatar" if row.setting == "today" else "avatar_release"
        sent = time.perf_counter()
        result = stream_turn(
            self.url, audio=utterance, model=model, controls={"seed": seed}, timeout_s=120.0
        )
        row.error = result.error
        row.transcript = result.transcript
        since = result.timings.get("since_request_ms", {})
        offset = (sent - speech_end) * 1000  # the request left the client this long after

        def at(ms: float | None) -> float | None:
            return None if ms is None else round(offset + ms, 1)

        row.transcript_ms = at(since.get("transcript"))
        ttft = result.timings.get("llm_stats", {}).get("ttft_ms")
        if row.transcript_ms is not None and ttft is not None:
            row.first_token = round(row.transcript_ms + ttft, 1)
        row.first_sentence = at(since.get("llm_first_sentence"))
        row.first_audio = at(since.get("first_audio"))
        row.first_frame = at(since.get("first_frame"))
        if result.first_audio_s is not None:
            row.client_first_audio = at(result.first_audio_s * 1000)

    def close(self) -> None:
        self.client.close()


def run_level(
    url: str,
    sessions: int,
    per_session: int,
    *,
    end_silence_s: float,
    pause_s: float,
    settings: tuple[str, ...] = SETTINGS,
) -> list[TurnRow]:
    """`sessions` speakers at once, each `per_session` questions per setting."""
    items = questions()
    rows: list[TurnRow] = []
    lock = threading.Lock()

    def speaker(index: int) -> None:
        session = Session(url, end_silence_s)
        try:
            n = len(settings)
            for q in range(per_session * n):
                source, audio = items[(index * 7 + q // n) % len(items)]
                # every setting gets every question; the order alternates per question
                setting = settings[(q + q // n + index) % n]
                row = TurnRow(sessions, setting, source, round(len(audio) / 16_000, 2), "")
                try:
                    session.turn(row, audio, seed=q // n)
                except Exception as error:  # a broken turn is a figure, not the end
                    row.error = f"{type(error).__name__}: {error}"
                with lock:
                    rows.append(row)
                time.sleep(pause_s)
        finally:
            session.close()

    threads = [threading.Thread(target=speaker, args=(i,)) for i in range(sessions)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return rows


def _field(milestone: str) -> str:
    return "transcript_ms" if milestone == "transcript" else milestone


def summarise(rows: list[TurnRow]) -> list[dict]:
    """p50/p95 per (sessions, setting, milestone), with the release/today ratio of p50."""
    out = []
    keys = sorted({(r.sessions, r.setting) for r in rows}, key=lambda k: (k[0], k[1] != "today"))
    for sessions, setting in keys:
        group = [r for r in rows if (r.sessions, r.setting) == (sessions, setting)]
        for milestone in (*MILESTONES, "client_first_audio"):
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
    by = {(s["sessions"], s["setting"], s["milestone"]): s for s in summary}
    lines = [
        "| sessions | from the end of speech | today p50 / p95 ms | release p50 / p95 ms | "
        "release / today (p50) |",
        "|---:|---|---:|---:|---:|",
    ]
    for sessions in sorted({s["sessions"] for s in summary}):
        for milestone in (*MILESTONES, "client_first_audio"):
            today, release = (
                by.get((sessions, "today", milestone)),
                by.get((sessions, "release", milestone)),
            )
            if today is None and release is None:
                continue

            def cell(s: dict | None) -> str:
                return "-" if s is None else f"{s['p50_ms']:.0f} / {s['p95_ms']:.0f}"

            ratio = (
                f"{release['p50_ms'] / today['p50_ms']:.2f}x"
                if today and release and today["p50_ms"] > 0
                else "-"
            )
            lines.append(
                f"| {sessions} | {milestone} | {cell(today)} | {cell(release)} | {ratio} |"
            )
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", help="gRPC address of a running server with the *_release copies")
    parser.add_argument("--sessions", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument(
        "--settings",
        nargs="+",
        choices=SETTINGS,
        default=list(SETTINGS),
        help="release needs the *_release copies (made when the command starts the server)",
    )
    parser.add_argument("--questions", type=int, default=6, help="per session and setting")
    parser.add_argument("--end-silence-s", type=float, default=0.7, help="endpointer silence")
    parser.add_argument("--pause-s", type=float, default=1.0, help="pause after each turn")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.set_defaults(func=command)


def command(args: argparse.Namespace) -> int:
    from avatar.serving.deployment import build_repository
    from avatar.serving.server import EmbeddedServer, ServerOptions

    with contextlib.ExitStack() as stack:
        url = args.url
        if url is None:
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="perf-latency-")))
            build_repository(tmp / "repository", "embedded")
            add_release_models(tmp / "repository")
            server = EmbeddedServer(ServerOptions(tmp / "repository", startup_timeout_s=600))
            url = stack.enter_context(server).grpc_url
        rows: list[TurnRow] = []
        for sessions in args.sessions:
            log.info("%d session(s), %d questions per setting each", sessions, args.questions)
            rows += run_level(
                url,
                sessions,
                args.questions,
                end_silence_s=args.end_silence_s,
                pause_s=args.pause_s,
                settings=tuple(args.settings),
            )
    summary = summarise(rows)
    meta = {"end_silence_s": args.end_silence_s, "pause_s": args.pause_s, "release": RELEASE}
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
