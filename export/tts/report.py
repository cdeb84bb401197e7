"""Quality and speed of the `tts_vits` variants: `python -m export.tts --report`.

For FP32 (the served default), FP16 and INT8 (Q/DQ): file size, real-time factor under
ONNX Runtime on this CPU (compute seconds / audio seconds, 1 thread, batch 1 and 8),
distance to the FP32 audio for the same seed, and intelligibility: word error rate of
faster-whisper (packaged Whisper base, CTranslate2) over WER_SENTENCES, held out from
development, verification and calibration.
"""

from __future__ import annotations

import logging
import re
import sys
import time
from pathlib import Path

import numpy as np

from avatar.tts.normalize import normalize
from avatar.tts.phonemes import Chunk, Phonemizer, prepare
from avatar.tts.synth import Controls, Synthesizer, onnx_infer
from avatar.tts.voice import packaged_voice
from export.common import ensure, onnx_session

log = logging.getLogger(__name__)

THREADS = 1
WER_SENTENCES = (
    "The library closes early on public holidays.",
    "My neighbor grows tomatoes and peppers in her garden.",
    "Turn left after the bridge and follow the river.",
    "The pilot announced a short delay because of fog.",
    "Children were playing football in the park after school.",
    "He forgot his umbrella and got soaked in the rain.",
    "Fresh coffee is the best way to start a busy morning.",
    "The museum opened a new exhibition about ancient Egypt.",
    "Please send me the report before the end of the week.",
    "A small cat was sleeping on the warm windowsill.",
    "The mountain road is closed during the winter months.",
    "She plays the violin in the city orchestra.",
    "We watched the sunset from the top of the hill.",
    "The doctor asked him to drink more water every day.",
    "Our team won the match in the final minute.",
    "The bakery on the corner sells delicious cinnamon rolls.",
    "Strong winds knocked down several trees last night.",
    "I would like a table for two near the window.",
    "The students listened carefully to the history lecture.",
    "Remember to switch off the lights when you leave.",
    "The farmer drove his tractor across the muddy field.",
    "Many birds fly south when the weather turns cold.",
    "The train to the airport leaves every twenty minutes.",
    "He painted the fence white over the long weekend.",
)


def _words(text: str) -> list[str]:
    """Lower-case words; digits spelled out ('2' and 'two' are the same word)."""
    spelled = normalize(text.replace("%", " percent"))
    return re.sub(r"[^a-z' ]", " ", spelled.lower().replace("-", " ")).split()


def word_errors(reference: str, hypothesis: str) -> tuple[int, int]:
    """(edit distance in words, reference word count)."""
    ref, hyp = _words(reference), _words(hypothesis)
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        prev, row[0] = row[0], i
        for j, h in enumerate(hyp, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (r != h))
    return row[len(hyp)], len(ref)


def transcriber():
    """audio float32 [samples], sample_rate -> transcript (Whisper base, CTranslate2, CPU)."""
    from faster_whisper import WhisperModel
    from scipy.signal import resample_poly

    from export.asr.weights import packaged_ct2_dir

    model = WhisperModel(str(packaged_ct2_dir()), device="cpu", compute_type="int8", cpu_threads=2)

    def transcribe(audio: np.ndarray, sample_rate: int) -> str:
        audio16k = resample_poly(audio, 16000, sample_rate).astype(np.float32)
        segments, _ = model.transcribe(
            audio16k, language="en", beam_size=1, without_timestamps=True, vad_filter=False
        )
        return " ".join(s.text.strip() for s in segments)

    return transcribe


def _rtf(synth: Synthesizer, chunks: list[Chunk], controls: Controls, batch: int) -> float:
    compute, audio_s = 0.0, 0.0
    synth.synthesize_chunks(chunks[:1], controls)  # warm-up
    for start in range(0, len(chunks), batch):
        group = chunks[start : start + batch]
        began = time.perf_counter()
        results = synth.synthesize_chunks(group, controls)
        compute += time.perf_counter() - began
        audio_s += sum(r.audio.size / r.sample_rate for r in results)
    return compute / audio_s


def report(fp32_folder: Path, sentences: int = len(WER_SENTENCES)) -> dict[str, dict]:
    """Measure every variant that builds; print a table; return the figures."""
    from export.tts.variants import PRECISIONS, VitsVariantRecipe

    folders = {"fp32": fp32_folder}
    for precision in PRECISIONS:
        try:
            folders[precision] = ensure(VitsVariantRecipe(precision))
        except Exception as error:  # reported, not fatal: the default is FP32
            log.error("%s variant failed to build: %s", precision, error)
    voice = packaged_voice()
    phonemizer = Phonemizer(voice.config)
    texts = WER_SENTENCES[:sentences]
    chunks = [c for t in texts for c in prepare(t, phonemizer).chunks]
    controls = Controls.defaults(voice.config, seed=1234)
    transcribe = transcriber()
    figures: dict[str, dict] = {}
    reference_audio: list[np.ndarray] = []
    for name, folder in folders.items():
        path = folder / "model.onnx"
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
            "rtf_b1": _rtf(synth, chunks, controls, 1),
            "rtf_b8": _rtf(synth, chunks, controls, 8),
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
