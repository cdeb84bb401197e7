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
is the exported one, run by the caller (`long_form_speech`). `compare_runtimes` puts the
quantisation schemes tried side by side (`python -m export.asr.int8`): WER on both sets and
the networks' speed.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from avatar.asr.features import log_mel, pad_or_trim
from avatar.asr.greedy import WhisperRuntime
from avatar.asr.transcribe import AsrOptions, transcribe, window_frames
from avatar.asr.vocab import WhisperVocab
from evals.clips import Clip, clips, long_clip, synthesize
from evals.gate import timed_ms
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


def compare_runtimes(
    runtimes: Sequence[tuple[str, str, WhisperRuntime]],
    vocab: WhisperVocab,
    longs: list[Clip],
    speech: Speech,
    timed: bool = True,
) -> dict:
    """One row per (encoder name, decoder name, runtime) of `runtimes`, the first FP32/FP32:
    corpus WER on `gate_clips()` and on the `longs` set (cut at `speech`), each against the
    first row's, whether it is within the gate, and (`timed`) the networks' speed."""
    humans = gate_clips()
    rows: list[dict] = []
    for encoder, decoder, runtime in runtimes:
        row = {
            "encoder": encoder,
            "decoder": decoder,
            "wer": word_error_rate(runtime, vocab, humans),
            "long_wer": long_form_wer(runtime, vocab, longs, speech),
        }
        fp32 = rows[0] if rows else row
        row["wer_delta"] = row["wer"] - fp32["wer"]
        row["long_wer_delta"] = row["long_wer"] - fp32["long_wer"]
        row["passes_gate"] = max(row["wer_delta"], row["long_wer_delta"]) <= GATE_WER_POINTS
        if timed:
            row.update(timings(runtime, humans[2]))
        rows.append(row)
    return {
        "clips": len(humans),
        "words": sum(len(c.text.split()) for c in humans),
        "long_form_recordings": len(longs),
        "gate": f"corpus WER within {GATE_WER_POINTS * 100:g} point of FP32",
        "rows": rows,
    }


def _median_ms(fn: Callable[[], object], repeat: int = 7) -> float:
    fn()
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def timings(runtime: WhisperRuntime, clip: Clip) -> dict[str, float]:
    """Encoder ms per served window of `clip` and decoder ms per token (20 past tokens),
    at batch 1 and 8."""
    mel = log_mel(clip.audio)
    frames = window_frames(mel.shape[1] - 1, WINDOW_STEP, WINDOW_MARGIN)
    window = pad_or_trim(mel[:, : mel.shape[1] - 1], frames)[None].astype(np.float32)
    out = {}
    for batch in (1, 8):
        mels = np.repeat(window, batch, axis=0)
        out[f"encoder_ms_b{batch}"] = _median_ms(lambda m=mels: runtime.encode(m), repeat=3)
        cross = runtime.encode(mels)
        kv = np.zeros((batch, cross.shape[1], cross.shape[2], 20, cross.shape[4]), np.float32)
        tokens = np.full((batch, 1), 440, np.int64)
        out[f"decoder_ms_b{batch}"] = _median_ms(
            lambda t=tokens, k=kv, c=cross: runtime.decode(t, k, c)
        )
    out["window_frames"] = float(frames)
    return out


def print_table(result: dict) -> None:
    """`compare_runtimes`' result as a table on stdout."""
    print(f"ASR INT8 Q/DQ vs FP32: corpus WER on {result['clips']} human clips "
          f"({result['words']} words); gate: {result['gate']}")  # fmt: skip
    print(f"long form: {result['long_form_recordings']} VAD-cut recordings of 29-81 s")
    print(f"{'encoder':>17} {'decoder':>17}   WER   delta  long WER  delta  gate   enc ms b1  "
          "enc ms b8  dec ms b1  dec ms b8")  # fmt: skip
    for r in result["rows"]:
        times = (
            f"  {r['encoder_ms_b1']:9.1f}  {r['encoder_ms_b8']:9.1f}  "
            f"{r['decoder_ms_b1']:9.2f}  {r['decoder_ms_b8']:9.2f}"
            if "encoder_ms_b1" in r
            else ""
        )
        print(
            f"{r['encoder']:>17} {r['decoder']:>17}  {r['wer']:.3f}  {r['wer_delta']:+.3f}  "
            f"{r['long_wer']:8.3f}  {r['long_wer_delta']:+.3f}  "
            f"{'pass' if r['passes_gate'] else 'FAIL'}{times}"
        )


def network_timer(sessions: Mapping[str, object], kind: str) -> Callable[[str, int], float]:
    """`evals.gate.side_by_side`'s `time_once` for one Whisper network's ONNX Runtime
    `sessions` {"fp32": ..., "int8": ...} (`kind`: encoder or decoder step): the encoder on a
    600-frame window (a 4-s question as served), the decoder's step at 20 past tokens; ms per
    call."""
    rng = np.random.default_rng(0)

    def feeds(batch: int) -> dict[str, np.ndarray]:
        if kind == "encoder":
            return {"mel": (0.3 * rng.standard_normal((batch, 80, 600))).astype(np.float32)}
        _, kv, heads, _, width = sessions["fp32"].get_inputs()[2].shape  # cross_kv
        cross = 0.1 * rng.standard_normal((batch, kv, heads, 300, width))  # a 600-frame window
        return {
            "tokens": np.full((batch, 1), 440, np.int64),
            "self_kv": np.zeros((batch, kv, heads, 20, width), np.float32),
            "cross_kv": cross.astype(np.float32),
        }

    def time_once(name: str, batch: int) -> float:
        feed = feeds(batch)
        return timed_ms(lambda: sessions[name].run(None, feed))

    return time_once
