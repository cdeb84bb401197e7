"""Quality and speed of the `tts_vits` variants: `python -m export.tts --report`.

For FP32, FP16 and INT8 (Q/DQ, export/tts/int8.py, served on the CPU while its gate
passes): file size, real-time factor under ONNX Runtime on this CPU (compute seconds /
audio seconds, 1 thread, batch 1 and 8), distance to the FP32 audio for the same seed, and
intelligibility: word error rate of faster-whisper (packaged Whisper base, CTranslate2)
over WER_SENTENCES, held out from development, verification and calibration.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import numpy as np

from avatar.tts.phonemes import Phonemizer, prepare
from avatar.tts.synth import Controls, Synthesizer, onnx_infer
from avatar.tts.voice import packaged_voice
from evals.sentences import WER_SENTENCES
from evals.wer import word_errors
from export.common import ensure, onnx_session
from export.tts.int8 import VARIANT_FILE
from export.tts.intelligibility import THREADS, rtf, transcriber
from export.tts.variants import VitsVariantRecipe

log = logging.getLogger(__name__)


def report(fp32_folder: Path, sentences: int = len(WER_SENTENCES)) -> dict[str, dict]:
    """Measure every variant that builds; print a table; return the figures."""
    paths = {"fp32": fp32_folder / "model.onnx"}
    try:
        paths["fp16"] = ensure(VitsVariantRecipe("fp16")) / "model.onnx"
    except Exception as error:  # reported, not fatal: the default is FP32
        log.error("fp16 variant failed to build: %s", error)
    paths["int8"] = fp32_folder / VARIANT_FILE  # built and gated with the export
    voice = packaged_voice()
    phonemizer = Phonemizer(voice.config)
    texts = WER_SENTENCES[:sentences]
    chunks = [c for t in texts for c in prepare(t, phonemizer).chunks]
    controls = Controls.defaults(voice.config, seed=1234)
    transcribe = transcriber()
    figures: dict[str, dict] = {}
    reference_audio: list[np.ndarray] = []
    for name, path in paths.items():
        synth = Synthesizer(phonemizer, onnx_infer(onnx_session(path, threads=THREADS)))
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
