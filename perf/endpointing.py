"""Quick but not cutting people off: what ends an utterance (`python -m perf endpointing`).

Runs the exported Silero VAD (ONNX Runtime, in-process, 32-ms chunks, the state carried as
the `vad` model carries it) and the gateway's strategies over questions that pause inside:

- `commas`: the packaged voice speaking questions with commas and lists (its own pauses);
- `hesitation P`: a question spoken whole, with P seconds of silence put in where its first
  half ends ("Can you tell me | where the nearest pharmacy is?", evals/turn_taking.py), as a
  speaker who stops to think (0.3 to 1.0 s): the voice's intonation there is that of an
  unfinished sentence;
- `human`: the real recordings (Debian pocketsphinx-testdata), whole sentences, with the
  pauses their readers made.

Strategies: `silence S` (today's rule, `end_silence_s` S) and `model C/W` (the end-of-turn
model `turn_detector`, run in-process on the artifact Triton serves, asked at 0.2 and 0.6 s
of silence, its answer taking `--ask-latency-ms`; p >= C ends the turn, an "incomplete"
lets the speaker pause W seconds). Per strategy and set: questions cut before their end
(the endpointer returned an utterance while more speech followed: a turn would start on
half a question) and the endpoint delay after the end of the last speech chunk, median
and p95.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from avatar.end_of_turn import ASK_AT_S
from evals.report import DEFAULT_OUT, save_results

if TYPE_CHECKING:
    from avatar.endpointing import EndpointEvent, TurnEndStrategy

log = logging.getLogger(__name__)
OUT = DEFAULT_OUT / "endpointing"
SILENCES = (0.3, 0.5, 0.7, 0.9)
HESITATIONS = (0.3, 0.45, 0.6, 0.8, 1.0)
# (complete_at, incomplete_silence_s) of the model strategy
MODEL_SETTINGS = ((0.5, 1.4), (0.7, 1.0), (0.7, 1.4), (0.8, 1.4))
ASK_LATENCY_MS = 100.0  # features + one turn_detector call on a busy 2-core machine
PAUSE_S = ASK_AT_S[0]  # the gateway's pass at the pause starts here (SessionOptions)
COMMA_QUESTIONS = (
    "Well, I was wondering, is the pool open today, or only on weekends?",
    "If I check out late, say around two, will you charge me for another night?",
    "Could you book a table for four, at eight, somewhere quiet?",
    "My flight is at six, so, when should I leave for the airport?",
    "I need towels, soap, and a hair dryer, can you send them up?",
    "Hmm, let me think, where did I leave my room key?",
)
HALVES = (
    ("Can you tell me", "where the nearest pharmacy is?"),
    ("I would like to", "extend my stay by two nights."),
    ("What time does", "breakfast end on Sundays?"),
    ("Is there a bus", "that goes to the old town?"),
)


# (utterance at the ask, utterance at the pause) -> (p(turn complete) of the first, the
# transcript of the second or None, seconds the transcript took, Whisper's end mark after
# its last word or None): the gateway's asks read the transcript its pass at the pause
# (SpeechPaused) made, as gateway/hearing.py does
Ask = Callable[[np.ndarray, np.ndarray], tuple[float, str | None, float, float | None]]
# audio -> (its transcript, Whisper's probability of an end mark after its last word)
Transcribe = Callable[[np.ndarray], tuple[str, float | None]]
Scorer = Callable[[str], float | None]  # transcript -> p(the words are a finished turn)


class Answers:
    """What the gateway would hear back at an ask, computed once per distinct audio (the
    same audio comes back at each pause length and for each strategy): Smart Turn's
    probability of the audio at the ask, the transcript of the audio at the pause, the
    seconds it took and its end mark's probability; and each scorer's words probability
    once per transcript. `transcript_s`: every transcript takes this long (another
    machine's figure, e.g. the GPU path's: perf gpu-stages --sessions) instead of the
    time it took here."""

    def __init__(
        self,
        detector,
        transcribe: Transcribe,
        saved: Path | None = None,
        transcript_s: float | None = None,
    ):
        self.detector, self.transcribe, self.saved = detector, transcribe, saved
        self.transcript_s = transcript_s
        self.probabilities: dict[str, float] = {}
        self.transcripts: dict[str, tuple[str, float, float | None]] = {}
        if saved is not None and saved.is_file():  # a rerun with other strategies
            for key, (p, text, took, *end) in json.loads(saved.read_text()).items():
                if p is not None:
                    self.probabilities[key] = p
                if text is not None and end:  # a file from before the end mark: again
                    self.transcripts[key] = (text, took, end[0])
        self.scored: dict[tuple[int, str], tuple[float | None, float]] = {}
        self.calls = Counter[str]()

    @staticmethod
    def _key(audio: np.ndarray) -> str:
        return hashlib.blake2b(np.ascontiguousarray(audio).tobytes(), digest_size=16).hexdigest()

    def probability(self, audio: np.ndarray) -> float:
        """Smart Turn's probability that `audio` (the utterance at an ask) is finished."""
        from avatar.end_of_turn import turn_features

        key = self._key(audio)
        if key not in self.probabilities:
            self.calls["probabilities"] += 1
            features = turn_features(audio)[None]
            p = self.detector.run(["probability"], {"input_features": features})[0]
            self.probabilities[key] = float(p.reshape(-1)[0])
        return self.probabilities[key]

    def transcript(self, audio: np.ndarray) -> tuple[str, float, float | None]:
        """(the transcript of `audio`, the seconds it took the first time or
        `transcript_s`, Whisper's end mark after its last word)."""
        key = self._key(audio)
        if key not in self.transcripts:
            self.calls["transcripts"] += 1
            started = time.monotonic()
            text, end_mark = self.transcribe(audio)
            self.transcripts[key] = (text, time.monotonic() - started, end_mark)
        text, took, end_mark = self.transcripts[key]
        return text, took if self.transcript_s is None else self.transcript_s, end_mark

    def __call__(
        self, audio: np.ndarray, at_pause: np.ndarray
    ) -> tuple[float, str, float, float | None]:
        self.calls["asks"] += 1
        return self.probability(audio), *self.transcript(at_pause)

    def save(self) -> None:
        if self.saved is None:
            return
        saved = {k: [p, None, None] for k, p in self.probabilities.items()}
        for k, (text, took, end_mark) in self.transcripts.items():
            saved[k] = [self.probabilities.get(k), text, took, end_mark]
        self.saved.parent.mkdir(parents=True, exist_ok=True)
        self.saved.write_text(json.dumps(saved))

    def words(self, scorer: Scorer, text: str) -> tuple[float | None, float]:
        """(`scorer`'s probability for `text` (its features drop the punctuation), seconds
        it took)."""
        key = (id(scorer), text)
        if key not in self.scored:
            started = time.monotonic()
            p = scorer(text)
            # a scorer whose readers are shared (perf/turn_taking.Blend) says its own time
            took = getattr(scorer, "seconds", None)
            self.scored[key] = (p, took(text) if took else time.monotonic() - started)
        return self.scored[key]

    def asker(self, scorer: Scorer | None) -> Ask:
        """The answers as a strategy with `scorer` gets them: the words come after the
        transcript, so their time is added to it."""
        if scorer is None:
            return self

        def ask(audio: np.ndarray, at_pause: np.ndarray) -> tuple[float, str, float, float | None]:
            p, text, took, end_mark = self(audio, at_pause)
            return p, text, took + self.words(scorer, text)[1], end_mark

        return ask


def endpoints(
    probs: np.ndarray,
    end_silence_s: float = 0.7,
    *,
    audio: np.ndarray | None = None,
    model: tuple[float, float] | None = None,
    ask: Ask | None = None,
    ask_latency_s: float = 0.0,
    pause_pass_s: Callable[[np.ndarray], float] | None = None,
) -> tuple[int, float | None, float | None]:
    """(utterances cut before the last speech, delay in s of the final endpoint after the
    last speech chunk, delay until the turn can start: the endpoint and the transcript of
    the pass at the last pause) for one question followed by silence. `model` (complete_at,
    incomplete_silence_s) with `ask`: the end-of-turn strategy over `audio`, each answer
    arriving after the longer of `ask_latency_s` and the time its transcript took;
    `pause_pass_s(audio)`: how long the transcript of the pass at the first pause takes."""
    from avatar.end_of_turn import ModelEndpointer
    from avatar.endpointing import Endpointer, SpeechPaused, SpeechResumed, Utterance
    from avatar.vad import CHUNK, CHUNK_S, chunks

    if model is None:
        endpointer: Endpointer = Endpointer(end_silence_s=end_silence_s, pause_s=PAUSE_S)
    else:
        endpointer = ModelEndpointer(
            end_silence_s=end_silence_s,
            pause_s=PAUSE_S,
            complete_at=model[0],
            incomplete_silence_s=model[1],
        )
    frames = chunks(audio) if audio is not None else np.zeros((len(probs), CHUNK), np.float32)
    speech = np.flatnonzero(probs >= endpointer.detector.threshold)
    if not len(speech):
        return 0, None, None
    last = int(speech[-1])
    early, delay, start, transcribed = 0, None, None, None
    for index, events in endpoint_events(endpointer, probs, frames, ask, ask_latency_s):
        for event in events:
            if isinstance(event, SpeechPaused) and pause_pass_s is not None:  # its transcript
                transcribed = index + int(np.ceil(pause_pass_s(event.audio) / CHUNK_S))
            elif isinstance(event, SpeechResumed):
                transcribed = None
        if any(isinstance(e, Utterance) for e in events):
            if index < last:
                early += 1
            elif delay is None:
                delay = (index - last) * CHUNK_S
                start = (max(index, transcribed or index) - last) * CHUNK_S
    return early, delay, start


def endpoint_events(
    endpointer: TurnEndStrategy,
    probs: np.ndarray,
    frames: np.ndarray,
    ask: Ask | None = None,
    ask_latency_s: float = 0.0,
) -> Iterator[tuple[int, list[EndpointEvent]]]:
    """(chunk index, what the strategy did at that chunk) for each chunk of `frames` [n, 512]
    with its speech probability, as the gateway runs it: each `AskTurnModel` is answered by
    `ask(audio, audio at the pause)`, and the answer reaches `decide` at the first chunk
    after `ask_latency_s` from the ask and after the pause's transcript is done (it started
    at the pause: SpeechPaused; without one, at the ask)."""
    from avatar.endpointing import AskTurnModel, SpeechPaused, SpeechResumed
    from avatar.vad import CHUNK_S

    # (due chunk, p, pause, text, end mark)
    answers: list[tuple[int, float, int, str | None, float | None]] = []
    paused: tuple[int, np.ndarray] | None = None  # the pause's chunk and audio
    for index, prob in enumerate(probs):
        events = endpointer.step(frames[index], float(prob))
        for event in events:
            if isinstance(event, SpeechPaused):
                paused = (index, event.audio)
            elif isinstance(event, SpeechResumed):
                paused = None
            if not isinstance(event, AskTurnModel):
                continue
            assert ask is not None, "the model strategy needs `ask`"
            since, at_pause = paused or (index, event.audio)
            p, text, took, end_mark = ask(event.audio, at_pause)
            due = max(
                index + int(np.ceil(ask_latency_s / CHUNK_S)),
                since + int(np.ceil(took / CHUNK_S)),
            )
            answers.append((due, p, event.pause, text, end_mark))
        for answer in [a for a in answers if a[0] <= index]:
            answers.remove(answer)
            _, p, pause, text, end_mark = answer
            events += endpointer.decide(p, pause, text, end_mark=end_mark)
        yield index, events


def hesitating(question: str, first_half: str, pause_s: float) -> np.ndarray:
    """`question` spoken whole by the voice, with `pause_s` of silence where `first_half`
    ends (evals/turn_taking.hesitating: the voice's own timing of the next word)."""
    from evals import turn_taking

    rest = question.removeprefix(first_half).strip()
    assert f"{first_half} {rest}" == question, "the first half must begin the question"
    return turn_taking.hesitating(turn_taking.VOICES[0], first_half, rest, pause_s)[0]


def material() -> dict[str, list[np.ndarray]]:
    from evals.clips import synthesize
    from evals.recordings import human_clips

    tail = np.zeros(2 * 16_000, np.float32)
    lead = np.zeros(int(0.3 * 16_000), np.float32)
    sets = {"commas": [np.concatenate([lead, synthesize(q), tail]) for q in COMMA_QUESTIONS]}
    for pause in HESITATIONS:
        sets[f"hesitation {pause:g} s"] = [
            np.concatenate([lead, hesitating(f"{a} {b}", a, pause), tail]) for a, b in HALVES
        ]
    sets["human"] = [np.concatenate([lead, c.audio, tail]) for c in human_clips()]
    return sets


def run(
    silences=SILENCES, models=MODEL_SETTINGS, ask_latency_ms: float = ASK_LATENCY_MS
) -> list[dict]:
    from avatar.vad import onnx_vad, speech_probabilities
    from export.common import onnx_session
    from export.registry import ensure_all

    built = ensure_all(["vad", "turn_detector"])
    run = onnx_vad(onnx_session(built["vad"] / "model.onnx"))
    detector = onnx_session(built["turn_detector"] / "model.onnx")
    answers = Answers(detector, _transcriber())

    def without_text(audio: np.ndarray, at_pause: np.ndarray) -> tuple[float, None, float, None]:
        return answers.probability(audio), None, 0.0, None  # the model's answer alone

    audios = material()
    probabilities = {
        name: [speech_probabilities(run, a) for a in items] for name, items in audios.items()
    }
    strategies = [(f"silence {s:g}", s, None, answers) for s in silences]
    for c, w in models:
        strategies += [(f"model {c:g}/{w:g}", 0.7, (c, w), without_text)]
        strategies += [(f"model+text {c:g}/{w:g}", 0.7, (c, w), answers)]
    rows = []
    for label, silence, model, asking in strategies:
        for name, probs in probabilities.items():
            results = [
                endpoints(
                    p,
                    silence,
                    audio=a,
                    model=model,
                    ask=asking,
                    ask_latency_s=ask_latency_ms / 1000,
                    pause_pass_s=lambda audio: answers.transcript(audio)[1],
                )
                for p, a in zip(probs, audios[name], strict=True)
            ]
            delays = [d for _, d, _ in results if d is not None]
            starts = [t for _, _, t in results if t is not None]
            rows.append(
                {
                    "strategy": label,
                    "set": name,
                    "questions": len(results),
                    "cut_early": sum(e > 0 for e, _, _ in results),
                    "delay_p50_ms": round(float(np.percentile(delays, 50)) * 1000),
                    "delay_p95_ms": round(float(np.percentile(delays, 95)) * 1000),
                    "start_p50_ms": round(float(np.percentile(starts, 50)) * 1000),
                    "start_p95_ms": round(float(np.percentile(starts, 95)) * 1000),
                }
            )
    return rows


def _transcriber(language: str | None = None) -> Transcribe:
    """The served ASR's transcript, in-process (the speculative pass at the pause);
    `language`: the session's, once an utterance told it (None: detected per pass)."""
    import dataclasses

    from avatar.asr.onnx_runtime import DECODER_STEP_FILE, OnnxWhisperRuntime
    from avatar.asr.transcribe import transcribe
    from avatar.asr.vocab import WhisperVocab
    from export.asr.weights import packaged_ct2_dir
    from export.registry import ensure_all
    from serving.served import local_config

    built = ensure_all(["asr_encoder", "asr_decoder"])
    runtime = OnnxWhisperRuntime(
        built["asr_encoder"] / "model.onnx", built["asr_decoder"] / DECODER_STEP_FILE
    )
    ct2 = packaged_ct2_dir()
    vocab = WhisperVocab.load(ct2 / "tokenizer.json", ct2 / "config.json")
    options = local_config().asr
    if language is not None:
        decode = dataclasses.replace(options.decode, language=language)
        options = dataclasses.replace(options, decode=decode)

    def heard(audio: np.ndarray) -> tuple[str, float | None]:
        transcript = transcribe(runtime, vocab, [audio], options)[0]
        return transcript.text, transcript.end_probability

    return heard


def markdown(rows: list[dict]) -> str:
    sets = list(dict.fromkeys(r["set"] for r in rows))
    lines = [
        "| strategy | "
        + " | ".join(f"{s}: cut early" for s in sets)
        + " | hesitations cut | endpoint p50 / p95 ms: commas | human "
        + "| turn can start p50 / p95 ms: commas | human |",
        "|---|" + "---:|" * (len(sets) + 5),
    ]
    for strategy in dict.fromkeys(r["strategy"] for r in rows):
        group = {r["set"]: r for r in rows if r["strategy"] == strategy}
        cells = [f"{group[s]['cut_early']}/{group[s]['questions']}" for s in sets]
        hesitations = [r for name, r in group.items() if name.startswith("hesitation")]
        cut = sum(r["cut_early"] for r in hesitations) / max(
            1, sum(r["questions"] for r in hesitations)
        )
        delays = [
            f"{group[s][f'{kind}_p50_ms']} / {group[s][f'{kind}_p95_ms']}"
            for kind in ("delay", "start")
            for s in ("commas", "human")
        ]
        lines.append(
            f"| {strategy} | " + " | ".join(cells) + f" | {cut:.0%} | " + " | ".join(delays) + " |"
        )
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--silences", type=float, nargs="*", default=list(SILENCES))
    parser.add_argument(
        "--models",
        nargs="*",
        default=[f"{c:g}/{w:g}" for c, w in MODEL_SETTINGS],
        help="model strategies complete_at/incomplete_silence_s",
    )
    parser.add_argument("--ask-latency-ms", type=float, default=ASK_LATENCY_MS)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.set_defaults(func=command)


def command(args: argparse.Namespace) -> int:
    models = tuple(tuple(float(x) for x in m.split("/")) for m in args.models)
    rows = run(tuple(args.silences), models, args.ask_latency_ms)
    save_results(args.out, "endpointing", rows, markdown(rows))
    return 0
