"""Non-streaming helpers for services (`avatar_speech`, `avatar_animate`, the `avatar_say`
ensemble): join a sentence-by-sentence TTS stream into one utterance, and animate a
whole utterance from its phoneme timings."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from avatar.animation.pipeline import Animation, animate
from avatar.errors import RequestError
from avatar.model_io import TTS
from avatar.pipeline.request import Controls
from avatar.pipeline.turn import Speech, animation_json

__all__ = ["TTS_OUTPUTS", "animate_utterance", "animation_json", "join_speech", "speech_from_tts"]

# the `tts` model's outputs that make a `Speech` (model_repository/tts/config.pbtxt)
TTS_OUTPUTS = ("audio", "sample_rate", "sentence", "phonemes", "phoneme_starts", "phoneme_ends")


def speech_from_tts(out: Mapping[str, np.ndarray]) -> Speech:
    """One `tts` response (TTS_OUTPUTS as numpy) -> `Speech`."""
    values = TTS.read_response(out)
    return Speech(
        audio=values["audio"].reshape(-1),
        sample_rate=int(values["sample_rate"]),
        phonemes=values["phonemes"],
        starts=values["phoneme_starts"].reshape(-1),
        ends=values["phoneme_ends"].reshape(-1),
        text=values["sentence"],
    )


def join_speech(pieces: Sequence[Speech]) -> Speech:
    """Sentences back to back: audio concatenated, phoneme times shifted onto one clock."""
    if not pieces:
        raise RequestError("no speech was produced for this text")
    rate = pieces[0].sample_rate
    if any(p.sample_rate != rate for p in pieces):
        raise ValueError("pieces have different sample rates")
    audio, phonemes, starts, ends, offset = [], [], [], [], 0.0
    for piece in pieces:
        audio.append(np.asarray(piece.audio, np.float32).reshape(-1))
        phonemes.extend(piece.phonemes)
        starts.append(np.asarray(piece.starts, np.float64) + offset)
        ends.append(np.asarray(piece.ends, np.float64) + offset)
        offset += audio[-1].size / rate
    return Speech(
        audio=np.concatenate(audio),
        sample_rate=rate,
        phonemes=phonemes,
        starts=np.concatenate(starts).astype(np.float32),
        ends=np.concatenate(ends).astype(np.float32),
        text=" ".join(p.text for p in pieces if p.text),
    )


def animate_utterance(
    phonemes: Sequence[str],
    starts: np.ndarray,
    ends: np.ndarray,
    duration: float | None,
    controls: Controls,
) -> Animation:
    """ARKit frames for a whole utterance; frame i shows time i / fps of its audio."""
    starts, ends = np.asarray(starts).reshape(-1), np.asarray(ends).reshape(-1)
    if not len(phonemes) == starts.size == ends.size:
        raise RequestError(
            f"phonemes ({len(phonemes)}), phoneme_starts ({starts.size}) and phoneme_ends "
            f"({ends.size}) must have the same length"
        )
    if starts.size and (not np.isfinite(starts).all() or not np.isfinite(ends).all()):
        raise RequestError("phoneme times must be finite seconds")
    timings = list(zip(phonemes, starts.tolist(), ends.tolist(), strict=True))
    return animate(timings, controls.animation(), duration=duration)
