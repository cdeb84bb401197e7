"""Word error rate of a Whisper runtime as the `asr` model serves it, on human speech and on
long recordings, and the INT8 gate's verdict: the variant's corpus WER within
GATE_WER_POINTS of FP32 on each set.

The sets:
- `gate_clips`: Debian's pocketsphinx-testdata human recordings (evals.recordings) as a live
  question is served: alone, with 1 s of silence around them, and joined into one > 30-s
  clip (full windows);
- `long_form_clips`: long recordings as the `asr` model serves them, cut by the VAD into
  pieces of up to 30 s and decoded 8 at a time. This set was added after the encoder's
  variant passed the first one and then looped ("in in in ...") on one VAD piece in the
  server's tests.
export.asr.int8 builds the variants and asks `int8_verdict`; the VAD that cuts the long set
is the exported one, run by the caller (`long_form_speech`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from avatar.asr.greedy import WhisperRuntime
from avatar.asr.transcribe import AsrOptions, transcribe
from avatar.asr.vocab import WhisperVocab
from evals.clips import Clip, clips, long_clip, synthesize
from evals.recordings import human_clips
from evals.wer import corpus_wer

GATE_WER_POINTS = 0.01  # the bound: within 1 point absolute of FP32
WINDOW_STEP, WINDOW_MARGIN = 100, 300  # model_repository/asr/config.pbtxt
SERVED = AsrOptions(window_step=WINDOW_STEP, window_margin=WINDOW_MARGIN)

Speech = list[list[tuple[float, float]]]  # per recording, its speech segments in seconds


def gate_clips(pad_s: float = 1.0) -> list[Clip]:
    """The human recordings as served: alone, with `pad_s` of silence on both sides (a live
    question, as the gateway hears it), and joined into one > 30-s clip (full windows)."""
    humans = human_clips()
    silence = np.zeros(int(pad_s * 16_000), np.float32)
    padded = [Clip(c.text, np.concatenate([silence, c.audio, silence])) for c in humans]
    return [*humans, *padded, long_clip(humans + humans)]


def long_form_clips() -> list[Clip]:
    """Recordings of 29-81 s as the `asr` model serves long audio (VAD pieces of up to 30 s):
    the human recordings joined in two orders; held-out reply sentences
    (emotion_sentences.json, never used to calibrate) in the packaged voice, 12 per recording;
    and the packaged voice's questions joined. Those also calibrate, but as served windows of
    one question each, not as these pieces, and they are where the built encoder looped."""
    from evals.sentences import sentences

    humans = human_clips()
    replies = [Clip(text, synthesize(text)) for text in sentences("heldout")[:36]]
    questions = clips()
    return [
        long_clip(humans + humans),
        long_clip(humans[::-1] + humans[5:]),
        *(long_clip(replies[at : at + 12]) for at in (0, 12, 24)),
        long_clip(questions[:12]),
        long_clip(questions[12:]),
    ]


def long_form_speech(
    items: list[Clip], vad: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]
) -> Speech:
    """The speech segments (seconds) of each of `items` as the `asr` model finds them:
    `vad` is the voice detector's frame runner (avatar.vad.onnx_vad of the exported VAD)."""
    from avatar.vad import speech_probabilities, speech_segments

    found = [speech_segments(speech_probabilities(vad, c.audio)) for c in items]
    return [[(s.start_s, s.end_s) for s in segments] for segments in found]


def word_error_rate(runtime: WhisperRuntime, vocab: WhisperVocab, items: list[Clip]) -> float:
    """Corpus WER of `items`, each transcribed as the `asr` model serves a question."""
    hypotheses = [transcribe(runtime, vocab, [c.audio], SERVED)[0].text for c in items]
    return corpus_wer([c.text for c in items], hypotheses)


def long_form_wer(
    runtime: WhisperRuntime, vocab: WhisperVocab, items: list[Clip], speech: Speech
) -> float:
    """Corpus WER of `items` transcribed as the `asr` model does long audio: cut at the VAD's
    `speech` segments into pieces of up to 30 s, decoded 8 at a time."""
    from avatar.asr.long_form import transcribe_long

    hypotheses = [
        transcribe_long(runtime, vocab, c.audio, s, SERVED).text
        for c, s in zip(items, speech, strict=True)
    ]
    return corpus_wer([c.text for c in items], hypotheses)


def int8_verdict(
    runtimes: Mapping[str, WhisperRuntime],
    vocab: WhisperVocab,
    short: list[Clip],
    longs: list[Clip],
    speech: Speech,
) -> dict:
    """The INT8 gate on `runtimes` {"fp32": ..., "int8": ...}: corpus WER of each on the
    `short` set and on the `longs` set (cut at `speech`); it passes when INT8 is within
    GATE_WER_POINTS of FP32 on each. The record: passes_gate, gate, the figures, why."""
    sets = {
        "short": {n: word_error_rate(r, vocab, short) for n, r in runtimes.items()},
        "long_form": {n: long_form_wer(r, vocab, longs, speech) for n, r in runtimes.items()},
    }
    failures = [
        f"{name} WER {(wer['int8'] - wer['fp32']) * 100:+.1f} points"
        for name, wer in sets.items()
        if wer["int8"] - wer["fp32"] > GATE_WER_POINTS
    ]
    passes = not failures
    return {
        "passes_gate": passes,
        "gate": f"corpus WER within {GATE_WER_POINTS * 100:g} point of FP32 (the other "
        f"network in FP32) on each set: short, {len(short)} clips (the human recordings "
        "alone, with 1 s of silence around them, and joined into one > 30-s clip); "
        f"long_form, {len(longs)} recordings of {min(c.seconds for c in longs):.0f}-"
        f"{max(c.seconds for c in longs):.0f} s cut by the VAD as the asr model serves them",
        "wer_fp32": round(sets["short"]["fp32"], 4),
        "wer_int8": round(sets["short"]["int8"], 4),
        "wer_delta": round(sets["short"]["int8"] - sets["short"]["fp32"], 4),
        "long_form": {
            "wer_fp32": round(sets["long_form"]["fp32"], 4),
            "wer_int8": round(sets["long_form"]["int8"], 4),
            "wer_delta": round(sets["long_form"]["int8"] - sets["long_form"]["fp32"], 4),
        },
        "why": "within the gate on both sets" if passes else "; ".join(failures),
    }
