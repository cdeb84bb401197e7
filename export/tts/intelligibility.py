"""Intelligibility and speed of synthesised speech: a transcriber on the packaged Whisper
base (faster-whisper, CTranslate2, CPU) for the word error rate (`evals.wer`) on the
held-out sentences (`evals.sentences.WER_SENTENCES`), and the real-time factor. Shared by
the INT8 gate (export/tts/int8.py) and the variants report (report.py).
"""

from __future__ import annotations

import time

import numpy as np

from avatar.tts.phonemes import Chunk
from avatar.tts.synth import Controls, Synthesizer

THREADS = 1


def transcriber():
    """audio float32 [samples], sample_rate -> transcript (Whisper base, CTranslate2, CPU), on
    one thread: the gate's transcripts of audio near its bound changed with the thread count
    (WER 0.018 on one, 0.041 on two, for the same INT8 audio)."""
    import os

    # MKL (CTranslate2's CPU backend) reads these when it starts: one thread, whoever calls
    for name in ("MKL_NUM_THREADS", "OMP_NUM_THREADS"):
        os.environ[name] = "1"
    from faster_whisper import WhisperModel
    from scipy.signal import resample_poly

    from export.asr.weights import packaged_ct2_dir

    model = WhisperModel(str(packaged_ct2_dir()), device="cpu", compute_type="int8", cpu_threads=1)

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
