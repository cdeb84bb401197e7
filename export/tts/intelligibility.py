"""Intelligibility and speed of synthesised speech: the held-out sentences, word error rate
through the packaged Whisper base (faster-whisper, CTranslate2, CPU) and the real-time
factor. Shared by the INT8 gate (export/tts/int8.py) and the variants report (report.py).
"""

from __future__ import annotations

import re
import time

import numpy as np

from avatar.tts.normalize import normalize
from avatar.tts.phonemes import Chunk
from avatar.tts.synth import Controls, Synthesizer

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
