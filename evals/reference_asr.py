"""The reference transcriber: faster-whisper (CTranslate2) on a packaged Whisper folder.

Two uses, each with the settings its figures were measured with:
- `reference_transcripts`: what the exported ASR must agree with (float32, greedy,
  temperature 0, no previous-text prompt, 1 thread), cached per (model file, audio) under
  the artifact cache, since the reference never changes. The ASR export's report and its
  tests (Whisper base) and tiny.en's build check read it.
- `speech_transcriber`: the listener of synthesised speech for the TTS intelligibility WER
  (int8 weights, English, no timestamps, no VAD filter, 1 thread), as the TTS gate and the
  variants report measure it.
The caller names the CTranslate2 folder (export.asr.weights.packaged_ct2_dir,
export.asr.tiny.packaged_tiny_dir): evals imports no export code.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path

import numpy as np

from evals.clips import Clip

CACHE_FOLDER = "asr_reference"  # under the artifact cache
MODEL_FILE = "model.bin"  # the CTranslate2 weights: the cache key's model part


@lru_cache(maxsize=4)
def _model_key(ct2_dir: Path) -> str:
    digest = hashlib.sha256()
    with (ct2_dir / MODEL_FILE).open("rb") as fh:
        while block := fh.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()[:16]


def _one_thread() -> None:
    # MKL (CTranslate2's CPU backend) reads these when it starts: one thread, whoever calls
    for name in ("MKL_NUM_THREADS", "OMP_NUM_THREADS"):
        os.environ[name] = "1"


def reference_transcripts(items: list[Clip], ct2_dir: Path, cache_root: Path) -> list[str]:
    """faster-whisper's transcripts of `items` by the CTranslate2 Whisper in `ct2_dir`
    (float32, greedy, temperature 0, no previous-text prompt, 1 thread), cached per (model,
    audio) in `cache_root`/CACHE_FOLDER."""
    ct2_dir = Path(ct2_dir)
    key = _model_key(ct2_dir)
    cache = Path(cache_root) / CACHE_FOLDER
    cache.mkdir(parents=True, exist_ok=True)
    model = None
    out = []
    for clip in items:
        digest = hashlib.sha256(key.encode() + clip.audio.tobytes()).hexdigest()[:20]
        path = cache / f"{digest}.json"
        if path.is_file():
            out.append(json.loads(path.read_text(encoding="utf-8"))["text"])
            continue
        if model is None:
            from faster_whisper import WhisperModel

            model = WhisperModel(str(ct2_dir), device="cpu", compute_type="float32", cpu_threads=1)
        segments, _ = model.transcribe(
            clip.audio, beam_size=1, temperature=0.0, condition_on_previous_text=False
        )
        out.append("".join(s.text for s in segments).strip())
        path.write_text(json.dumps({"text": out[-1], "clip": clip.text}), encoding="utf-8")
    return out


def speech_transcriber(ct2_dir: Path) -> Callable[[np.ndarray, int], str]:
    """audio float32 [samples], sample_rate -> transcript, by the Whisper in `ct2_dir` (int8,
    English, CPU), on one thread: the TTS gate's transcripts of audio near its bound changed
    with the thread count (WER 0.018 on one, 0.041 on two, for the same INT8 audio)."""
    _one_thread()
    from faster_whisper import WhisperModel
    from scipy.signal import resample_poly

    model = WhisperModel(str(ct2_dir), device="cpu", compute_type="int8", cpu_threads=1)

    def transcribe(audio: np.ndarray, sample_rate: int) -> str:
        audio16k = resample_poly(audio, 16000, sample_rate).astype(np.float32)
        segments, _ = model.transcribe(
            audio16k, language="en", beam_size=1, without_timestamps=True, vad_filter=False
        )
        return " ".join(s.text.strip() for s in segments)

    return transcribe
