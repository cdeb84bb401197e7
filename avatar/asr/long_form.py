"""Audio longer than one 30-s window: cut at the pauses Silero VAD finds, transcribe the
pieces together (one lockstep batch), and put the segments back on the audio's clock.

A piece is at most `max_s` long whenever the speech allows it; a stretch of speech without
any pause longer than that is still transcribed whole (Whisper's sequential windows inside
`transcribe`), so nothing is ever truncated. Silence between pieces is not decoded.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from avatar.asr.features import SAMPLE_RATE
from avatar.asr.greedy import WhisperRuntime
from avatar.asr.transcribe import AsrOptions, Segment, Transcript, transcribe
from avatar.asr.vocab import WhisperVocab


def plan_pieces(
    speech: Sequence[tuple[float, float]], duration: float, max_s: float = 30.0, pad_s: float = 0.2
) -> list[tuple[float, float]]:
    """Group speech segments (start, end seconds) into pieces of at most `max_s` seconds,
    each cut in a pause and padded by `pad_s` of context on both sides."""
    pieces: list[tuple[float, float]] = []
    for speech_start, speech_end in speech:
        start, end = max(0.0, speech_start - pad_s), min(duration, speech_end + pad_s)
        if pieces and end - pieces[-1][0] <= max_s:
            pieces[-1] = (pieces[-1][0], max(pieces[-1][1], end))
        elif pieces and start < pieces[-1][1]:  # overlapping padding: cut between them
            middle = (start + pieces[-1][1]) / 2
            pieces[-1] = (pieces[-1][0], middle)
            pieces.append((middle, end))
        else:
            pieces.append((start, end))
    return pieces


def transcribe_long(
    runtime: WhisperRuntime,
    vocab: WhisperVocab,
    audio: np.ndarray,
    speech: Sequence[tuple[float, float]],
    options: AsrOptions = AsrOptions(),  # noqa: B008 (frozen)
    *,
    max_batch: int = 8,
) -> Transcript:
    """Transcribe checked 16-kHz `audio` [samples] given its VAD speech segments (seconds),
    at most `max_batch` pieces at a time (the encoder's and decoder's max_batch_size: a
    4-minute recording cut into 30-s pieces is more than one batch)."""
    duration = len(audio) / SAMPLE_RATE
    pieces = plan_pieces(speech, duration)
    if not pieces:
        return Transcript("", options.decode.language or "", 0.0, [], duration)
    clips = [audio[round(a * SAMPLE_RATE) : round(b * SAMPLE_RATE)] for a, b in pieces]
    results = [
        result
        for at in range(0, len(clips), max_batch)
        for result in transcribe(runtime, vocab, clips[at : at + max_batch], options)
    ]
    segments = [
        Segment(round(s.start + a, 3), round(s.end + a, 3), s.text)
        for (a, _), result in zip(pieces, results, strict=True)
        for s in result.segments
    ]
    first = next((r for r in results if r.segments), results[0])  # reports its language
    last = next((r for r in reversed(results) if r.end_probability is not None), None)
    return Transcript(
        text="".join(s.text for s in segments).strip(),
        language=first.language,
        language_probability=first.language_probability,
        segments=segments,
        duration=duration,
        end_probability=None if last is None else last.end_probability,
    )
