"""Quality and speed of the `tts_vits` variants: `python -m export.tts --report`.

For FP32, FP16 and INT8 (Q/DQ, export/tts/int8.py, served on the CPU while its gate
passes): file size, real-time factor under ONNX Runtime on this CPU (compute seconds /
audio seconds, 1 thread, batch 1 and 8), distance to the FP32 audio for the same seed, and
intelligibility: word error rate of faster-whisper (`evals.reference_asr.speech_transcriber`
on the packaged Whisper base) over WER_SENTENCES, held out from development, verification
and calibration. The export passes the variants' graphs and the Whisper folder.

`int8_gate`: the INT8 variant's gate (export/tts/int8.py builds the variant and asks it), on
the 24 held-out WER_SENTENCES, FP32 and INT8 from the same noise (seed 1234):
- intelligibility: word error rate of the packaged Whisper base (faster-whisper) at most
  MAX_WER_RISE above FP32's;
- timing: per-phoneme duration within MAX_PHONEME_MS of FP32's on average (the model's own
  duration unit is one 256-sample frame, 11.6 ms), and every sentence's length within
  MAX_LENGTH_CHANGE of FP32's;
- batching: the same durations for every sentence synthesised in batches of BATCH (each with
  its own noise, as sessions' requests are batched by the served model) as alone. The
  reproducible variant fails here (6 of 24 sentences), whatever its WER, which sits on its
  bound (Whisper's transcripts of its audio changed with the thread count).
The real-time factor of both (1 thread, batch 1 and 8, alternated, median of ROUNDS) is
recorded with it.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from avatar.tts.phonemes import Chunk, Phonemizer, prepare
from avatar.tts.synth import Controls, Synthesizer, batch_inputs, onnx_infer
from avatar.tts.voice import packaged_voice
from evals.gate import faster, side_by_side, verdict
from evals.reference_asr import speech_transcriber
from evals.sentences import WER_SENTENCES
from evals.wer import word_errors

log = logging.getLogger(__name__)

THREADS = 1
MAX_WER_RISE = 0.01  # 1 point absolute
MAX_PHONEME_MS = 12.0  # mean |duration difference| per phoneme: about one model frame
MAX_LENGTH_CHANGE = 0.05  # of a sentence's audio length
BATCH = 4  # sentences synthesised together and alone: the same durations (dynamic batching)
ROUNDS = 3


def rtf(synth: Synthesizer, chunks: list[Chunk], controls: Controls, batch: int) -> float:
    """Compute seconds per audio second of `synth` over `chunks` in batches of `batch`."""
    compute, audio_s = 0.0, 0.0
    synth.synthesize_chunks(chunks[:1], controls)  # warm-up
    for start in range(0, len(chunks), batch):
        group = chunks[start : start + batch]
        began = time.perf_counter()
        results = synth.synthesize_chunks(group, controls)
        compute += time.perf_counter() - began
        audio_s += sum(r.audio.size / r.sample_rate for r in results)
    return compute / audio_s


def report(
    paths: Mapping[str, Path],
    whisper_dir: Path,
    session: Callable[[Path, int], Any],
    sentences: int = len(WER_SENTENCES),
) -> dict[str, dict]:
    """Measure the variants' graphs `paths` ({"fp32": ..., ...}; fp32 first, the others'
    audio is compared with its), each run by `session(path, threads)` (the export's ONNX
    Runtime session), with the Whisper in `whisper_dir` listening; print a table; return
    the figures."""
    voice = packaged_voice()
    phonemizer = Phonemizer(voice.config)
    texts = WER_SENTENCES[:sentences]
    chunks = [c for t in texts for c in prepare(t, phonemizer).chunks]
    controls = Controls.defaults(voice.config, seed=1234)
    transcribe = speech_transcriber(whisper_dir)
    figures: dict[str, dict] = {}
    reference_audio: list[np.ndarray] = []
    for name, path in paths.items():
        synth = Synthesizer(phonemizer, onnx_infer(session(path, THREADS)))
        log.info("%s: synthesising and transcribing %d sentences", name, len(texts))
        results = [synth.synthesize_chunks([c], controls)[0] for c in chunks]
        errors = total = 0
        for text, result in zip(texts, results, strict=True):
            heard = transcribe(result.audio, result.sample_rate)
            e, n = word_errors(text, heard)
            errors, total = errors + e, total + n
            if e:
                log.info("%s: %r -> %r", name, text, heard)
        if name == "fp32":
            reference_audio = [r.audio for r in results]
        diffs = [
            float(np.abs(a[: min(a.size, b.size)] - b[: min(a.size, b.size)]).max())
            for a, b in zip(reference_audio, (r.audio for r in results), strict=True)
        ]
        same_length = sum(
            a.size == r.audio.size for a, r in zip(reference_audio, results, strict=True)
        )
        figures[name] = {
            "size_mb": path.stat().st_size / 2**20,
            "rtf_b1": rtf(synth, chunks, controls, 1),
            "rtf_b8": rtf(synth, chunks, controls, 8),
            "wer": errors / total,
            "max_abs_vs_fp32": max(diffs),
            "same_length_as_fp32": f"{same_length}/{len(results)}",
        }
    out = sys.stdout
    out.write(f"tts_vits variants, ONNX Runtime CPU, {THREADS} thread, {len(texts)} sentences\n")
    out.write(
        f"{'variant':8} {'MB':>6} {'RTF b1':>7} {'RTF b8':>7} {'WER':>6} "
        f"{'max|d| vs fp32':>15} {'len = fp32':>10}\n"
    )
    for name, f in figures.items():
        out.write(
            f"{name:8} {f['size_mb']:6.1f} {f['rtf_b1']:7.3f} {f['rtf_b8']:7.3f} "
            f"{f['wer']:6.1%} {f['max_abs_vs_fp32']:15.4f} {f['same_length_as_fp32']:>10}\n"
        )
    return figures


def rows_changed_by_batching(session: Any, chunks: list[Chunk], controls: list[Controls]) -> int:
    """How many of `chunks` (each with its own `controls`: requests of other sessions) come
    out of the graph's ONNX Runtime `session` with other durations (so another length)
    synthesised together, padded as the `tts` model pads them, than one at a time."""
    run = onnx_infer(session)
    ids = [c.ids for c in chunks]
    together = run(batch_inputs(ids, controls, pad_to=64))
    changed = 0
    for k, row in enumerate(ids):
        alone = run(batch_inputs([row], [controls[k]]))
        n = alone["durations"][0].size
        same = np.array_equal(together["durations"][k, :n], alone["durations"][0])
        changed += not same or together["audio_lengths"][k, 0] != alone["audio_lengths"][0, 0]
    return changed


def int8_gate(sessions: Mapping[str, Any], whisper_dir: Path) -> dict:
    """The gate's verdict and figures, and both graphs' real-time factors, for the ONNX
    Runtime `sessions` {"fp32": ..., "int8": ...} of the graph, with the Whisper in
    `whisper_dir` listening."""
    voice = packaged_voice()
    phonemizer = Phonemizer(voice.config)
    chunks = [c for t in WER_SENTENCES for c in prepare(t, phonemizer).chunks]
    if len(chunks) != len(WER_SENTENCES):
        raise ValueError("every WER sentence must be one chunk (compared sentence by sentence)")
    controls = Controls.defaults(voice.config, seed=1234)
    transcribe = speech_transcriber(whisper_dir)
    synths, results, wer = {}, {}, {}
    for name, session in sessions.items():
        synths[name] = Synthesizer(phonemizer, onnx_infer(session))
        results[name] = [synths[name].synthesize_chunks([c], controls)[0] for c in chunks]
        errors = [
            word_errors(text, transcribe(r.audio, r.sample_rate))
            for text, r in zip(WER_SENTENCES, results[name], strict=True)
        ]
        wer[name] = sum(e for e, _ in errors) / sum(n for _, n in errors)
    pairs = list(zip(results["fp32"], results["int8"], strict=True))
    phoneme_ms = 1000 * float(
        np.mean(
            np.concatenate([np.abs((a.ends - a.starts) - (b.ends - b.starts)) for a, b in pairs])
        )
    )
    length = max(abs(b.audio.size / a.audio.size - 1.0) for a, b in pairs)
    # the served model batches requests of several sessions (dynamic batching): a sentence
    # must come out the same in a batch as alone (measured: INT8 6 of 24 not, FP32 0)
    seeded = [Controls.defaults(voice.config, seed=30 + k) for k in range(len(chunks))]
    batch_changes = sum(
        rows_changed_by_batching(sessions["int8"], chunks[k : k + BATCH], seeded[k : k + BATCH])
        for k in range(0, len(chunks), BATCH)
    )
    failures = []
    if batch_changes:
        failures.append(
            f"{batch_changes} of {len(chunks)} sentences get other durations in a batch of "
            f"{BATCH} than alone"
        )
    if wer["int8"] > wer["fp32"] + MAX_WER_RISE:
        failures.append(f"WER {wer['int8']:.3f} > FP32 {wer['fp32']:.3f} + {MAX_WER_RISE}")
    if phoneme_ms > MAX_PHONEME_MS:
        failures.append(f"phoneme duration |diff| {phoneme_ms:.1f} ms > {MAX_PHONEME_MS}")
    if length > MAX_LENGTH_CHANGE:
        failures.append(f"a sentence's length changed by {length:.1%} > {MAX_LENGTH_CHANGE:.0%}")
    speed = side_by_side(
        lambda name, batch: rtf(synths[name], chunks, controls, batch),
        rounds=ROUNDS,
        unit="rtf",
        digits=4,
    )
    return {
        **verdict(
            failures,
            f"WER {wer['int8']:.3f} vs FP32 {wer['fp32']:.3f} (at most +{MAX_WER_RISE}), "
            f"phoneme duration |diff| {phoneme_ms:.1f} ms (<= {MAX_PHONEME_MS}), sentence "
            f"length within {length:.1%} (<= {MAX_LENGTH_CHANGE:.0%}), the same durations in "
            f"batches of {BATCH} as alone",
        ),
        "sentences": len(WER_SENTENCES),
        "wer": {k: round(v, 4) for k, v in wer.items()},
        "phoneme_duration_mad_ms": round(phoneme_ms, 2),
        "max_length_change": round(length, 4),
        "rows_changed_in_a_batch": f"{batch_changes}/{len(chunks)}",
        "rtf_1_thread": speed,
        "faster": faster(speed),
    }
