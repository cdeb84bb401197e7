"""Quick but not cutting people off: the silence that ends an utterance (`python -m perf
endpointing`).

Runs the exported Silero VAD (ONNX Runtime, in-process, 32-ms chunks, the state carried as
the `vad` model carries it) and the project's `Endpointer` over questions that pause inside:

- `commas`: the packaged voice speaking questions with commas and lists (its own pauses);
- `hesitation P`: two halves of a question joined by P seconds of silence, as a speaker
  who stops to think (0.3, 0.45, 0.6 s);
- `human`: the real recordings (Debian pocketsphinx-testdata), whole sentences.

For each `end_silence_s`, per set: how many questions were cut before their end (the
endpointer returned an utterance while more speech followed: a turn would start on half a
question) and the endpoint delay after the end of the last speech chunk, median and p95.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import numpy as np

from evals.report import DEFAULT_OUT, save_results

log = logging.getLogger(__name__)
OUT = DEFAULT_OUT / "endpointing"
SILENCES = (0.3, 0.4, 0.5, 0.6, 0.7, 0.9)
HESITATIONS = (0.3, 0.45, 0.6)
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


def endpoints(probs: np.ndarray, end_silence_s: float) -> tuple[int, float | None]:
    """(utterances cut before the last speech, delay in s of the final endpoint after the
    last speech chunk) for one question followed by silence."""
    from avatar.vad import CHUNK, CHUNK_S, Endpointer

    endpointer = Endpointer(end_silence_s=end_silence_s)
    speech = np.flatnonzero(probs >= endpointer.detector.threshold)
    if not len(speech):
        return 0, None
    last = int(speech[-1])
    early, delay = 0, None
    for index, prob in enumerate(probs):
        if endpointer.push(np.zeros(CHUNK, np.float32), float(prob)) is not None:
            if index < last:
                early += 1
            elif delay is None:
                delay = (index - last) * CHUNK_S
    return early, delay


def material() -> dict[str, list[np.ndarray]]:
    from evals.clips import synthesize
    from evals.recordings import human_clips

    tail = np.zeros(2 * 16_000, np.float32)
    lead = np.zeros(int(0.3 * 16_000), np.float32)
    sets = {"commas": [np.concatenate([lead, synthesize(q), tail]) for q in COMMA_QUESTIONS]}
    halves = [(synthesize(a), synthesize(b)) for a, b in HALVES]
    for pause in HESITATIONS:
        gap = np.zeros(int(pause * 16_000), np.float32)
        sets[f"hesitation {pause:g} s"] = [
            np.concatenate([lead, a, gap, b, tail]) for a, b in halves
        ]
    sets["human"] = [np.concatenate([lead, c.audio, tail]) for c in human_clips()]
    return sets


def run(silences=SILENCES) -> list[dict]:
    from avatar.vad import onnx_vad, speech_probabilities
    from export.common import onnx_session
    from export.registry import ensure_all

    run = onnx_vad(onnx_session(ensure_all(["vad"])["vad"] / "model.onnx"))
    probabilities = {
        name: [speech_probabilities(run, a) for a in audios] for name, audios in material().items()
    }
    rows = []
    for silence in silences:
        for name, probs in probabilities.items():
            results = [endpoints(p, silence) for p in probs]
            delays = [d for _, d in results if d is not None]
            rows.append(
                {
                    "end_silence_s": silence,
                    "set": name,
                    "questions": len(results),
                    "cut_early": sum(e > 0 for e, _ in results),
                    "delay_p50_ms": round(float(np.percentile(delays, 50)) * 1000),
                    "delay_p95_ms": round(float(np.percentile(delays, 95)) * 1000),
                }
            )
    return rows


def markdown(rows: list[dict]) -> str:
    sets = list(dict.fromkeys(r["set"] for r in rows))
    lines = [
        "| end_silence_s | "
        + " | ".join(f"{s}: cut early" for s in sets)
        + " | delay p50 / p95 ms (worst set) |",
        "|---:|" + "---:|" * (len(sets) + 1),
    ]
    for silence in dict.fromkeys(r["end_silence_s"] for r in rows):
        group = [r for r in rows if r["end_silence_s"] == silence]
        cells = [f"{r['cut_early']}/{r['questions']}" for r in group]
        p50 = max(r["delay_p50_ms"] for r in group)
        p95 = max(r["delay_p95_ms"] for r in group)
        lines.append(f"| {silence:g} | " + " | ".join(cells) + f" | {p50} / {p95} |")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--silences", type=float, nargs="*", default=list(SILENCES))
    parser.add_argument("--out", type=Path, default=OUT)
    parser.set_defaults(func=command)


def command(args: argparse.Namespace) -> int:
    rows = run(tuple(args.silences))
    save_results(args.out, "endpointing", rows, markdown(rows))
    return 0
