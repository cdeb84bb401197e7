"""Whisper's log-mel spectrogram in numpy (as openai/whisper `audio.py`, no torch).

80 mel bins (Slaney scale and norm), 25-ms Hann window (n_fft 400), 10-ms hop (160 samples)
at 16 kHz: a 30-s window is 3000 frames, which the encoder's two convolutions (the second with
stride 2) turn into 1500 positions.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

SAMPLE_RATE = 16_000
N_FFT = 400
HOP_LENGTH = 160
CHUNK_SECONDS = 30
N_SAMPLES = CHUNK_SECONDS * SAMPLE_RATE  # 480000 samples in a 30-s window
N_FRAMES = N_SAMPLES // HOP_LENGTH  # 3000 mel frames in a 30-s window
FRAMES_PER_SECOND = SAMPLE_RATE // HOP_LENGTH  # 100 mel frames per second
SECONDS_PER_POSITION = 2 * HOP_LENGTH / SAMPLE_RATE  # 0.02 s per encoder position


def _hz_to_mel(hz: np.ndarray) -> np.ndarray:
    """Slaney's mel scale: linear below 1 kHz, logarithmic above."""
    hz = np.asarray(hz, dtype=np.float64)
    mel = hz / (200.0 / 3)
    log_region = hz >= 1000.0
    return np.where(
        log_region, 15.0 + np.log(np.maximum(hz, 1e-10) / 1000.0) / (np.log(6.4) / 27), mel
    )


def _mel_to_hz(mel: np.ndarray) -> np.ndarray:
    mel = np.asarray(mel, dtype=np.float64)
    hz = mel * (200.0 / 3)
    return np.where(mel >= 15.0, 1000.0 * np.exp((np.log(6.4) / 27) * (mel - 15.0)), hz)


@lru_cache(maxsize=4)
def mel_filters(n_mels: int = 80, sample_rate: int = SAMPLE_RATE, n_fft: int = N_FFT) -> np.ndarray:
    """Slaney-normalised triangular filters, [n_mels, n_fft // 2 + 1] float32 (librosa's)."""
    fft_freqs = np.linspace(0, sample_rate / 2, n_fft // 2 + 1)
    mel_points = _mel_to_hz(np.linspace(_hz_to_mel(0.0), _hz_to_mel(sample_rate / 2), n_mels + 2))
    widths = np.diff(mel_points)
    ramps = mel_points[:, None] - fft_freqs[None, :]
    lower = -ramps[:-2] / widths[:-1, None]
    upper = ramps[2:] / widths[1:, None]
    weights = np.maximum(0.0, np.minimum(lower, upper))
    weights *= (2.0 / (mel_points[2:] - mel_points[:-2]))[:, None]
    return weights.astype(np.float32)


def log_mel(audio: np.ndarray, n_mels: int = 80, padding: int = HOP_LENGTH) -> np.ndarray:
    """Log-mel features of 16-kHz mono audio, as faster-whisper computes them.

    audio: [samples] float32; `padding` zero samples are appended first.
    Returns [n_mels, (samples + padding) // 160] float32, scaled as Whisper expects
    ((log10 + 4) / 4, floored 8 below the maximum over the whole input).
    """
    audio = np.asarray(audio, dtype=np.float32).reshape(-1)
    audio = np.pad(audio, (0, padding)) if padding else audio
    padded = np.pad(audio, N_FFT // 2, mode="reflect")  # torch.stft(center=True)
    n_frames = 1 + (len(padded) - N_FFT) // HOP_LENGTH
    frames = np.lib.stride_tricks.as_strided(
        padded, (n_frames, N_FFT), (padded.strides[0] * HOP_LENGTH, padded.strides[0])
    )
    window = np.hanning(N_FFT + 1)[:-1].astype(np.float32)  # periodic Hann
    power = np.abs(np.fft.rfft(frames * window, axis=-1)) ** 2  # [n_frames, n_fft/2+1]
    mel = mel_filters(n_mels) @ power[:-1].T.astype(np.float32)  # drop the last frame
    spec = np.log10(np.maximum(mel, 1e-10))
    spec = np.maximum(spec, spec.max() - 8.0)
    return ((spec + 4.0) / 4.0).astype(np.float32)


def pad_or_trim(mel: np.ndarray, frames: int = N_FRAMES) -> np.ndarray:
    """[n_mels, n] -> [n_mels, frames]: trimmed, or zero-padded (zeros in log-mel units, as
    faster-whisper pads a window)."""
    if mel.shape[-1] >= frames:
        return np.ascontiguousarray(mel[..., :frames])
    return np.pad(mel, [(0, 0)] * (mel.ndim - 1) + [(0, frames - mel.shape[-1])])
