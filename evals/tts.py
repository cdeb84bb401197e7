"""Quality and speed of the `tts_vits` variants: `python -m export.tts --report`.

For FP32, FP16 and INT8 (Q/DQ, export/tts/int8.py, served on the CPU while its gate
passes): file size, real-time factor under ONNX Runtime on this CPU (compute seconds /
audio seconds, 1 thread, batch 1 and 8), distance to the FP32 audio for the same seed, and
intelligibility: word error rate of faster-whisper (`evals.reference_asr.speech_transcriber`
on the packaged Whisper base) over WER_SENTENCES, held out from development, verification
and calibration. The export passes the variants' graphs and the Whisper folder.

The speed measure, `rtf`, is the INT8 gate's too (export/tts/int8.py).
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
from avatar.tts.synth import Controls, Synthesizer, onnx_infer
from avatar.tts.voice import packaged_voice
from evals.reference_asr import speech_transcriber
from evals.sentences import WER_SENTENCES
from evals.wer import word_errors

log = logging.getLogger(__name__)

THREADS = 1


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
