"""Audio -> transcript with segment timestamps: request checks, Whisper's sequential 30-s
windows (as faster-whisper runs them, without conditioning on previous text), several requests
decoded in lockstep.

Long audio is never truncated: after each window, decoding resumes at the last complete
timestamp (or the window's end), exactly like faster-whisper's `generate_segments`.

A window whose greedy transcript is degenerate (a loop, `avatar.asr.degenerate`) is decoded
again, as openai/whisper's temperature fallback does (`Fallback`); greedy is always the first
try, so a transcript that is not degenerate is the greedy one.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Sequence

import numpy as np

from avatar.asr.degenerate import Thresholds, degeneracy
from avatar.asr.features import N_FRAMES, SAMPLE_RATE, SECONDS_PER_POSITION, log_mel, pad_or_trim
from avatar.asr.greedy import (
    DecodeOptions,
    WhisperRuntime,
    WindowResult,
    greedy_decode,
    speech_token_limit,
)
from avatar.asr.vocab import WhisperVocab
from avatar.errors import RequestError

log = logging.getLogger(__name__)

FRAME_SECONDS = 1.0 / 100  # one mel frame
SUPPORTED_RATES = (8_000, 11_025, 16_000, 22_050, 24_000, 32_000, 44_100, 48_000)


@dataclasses.dataclass(frozen=True)
class Fallback:
    """Re-decoding the windows whose transcript is degenerate (`avatar.asr.degenerate`).

    One extra decode per temperature at most, in order, stopping at the first transcript
    that is not degenerate; when every one is, the greedy transcript stays (bounded by
    its token limit). The retries pad the window with `extra_margin` more frames of
    silence (windows cut close to the last word make Whisper repeat itself) and keep its
    prefix (the `asr` model's contract: a transcript starts with the prefix it was given).
    A retry that would decode exactly what greedy decoded (temperature 0, no longer
    window) is skipped. Sampling is seeded (`seed`, `seed + 1`, ... per retry), so a
    transcript is reproducible."""

    # openai/whisper's ladder is 0.2, 0.4, ... 1.0; two rungs keep the cost at two decodes
    temperatures: tuple[float, ...] = (0.0, 0.2)
    extra_margin: int = 300  # mel frames (3 s): the asr model's own window_margin again
    seed: int = 0
    thresholds: Thresholds = dataclasses.field(default_factory=Thresholds)


@dataclasses.dataclass(frozen=True)
class AsrOptions:
    decode: DecodeOptions = dataclasses.field(default_factory=DecodeOptions)
    max_seconds: float = 300.0  # longer requests are refused (the caller splits them)
    silence_peak: float = 1e-4  # audio whose peak is below this (-80 dBFS) is silence
    no_speech_threshold: float | None = 0.6  # skip a window whose <|nocaptions|> prob is higher
    log_prob_threshold: float = -1.0  # ...unless its average log-prob is above this
    # Encoder windows in proportion to the audio: None = always 3000 frames (30 s, as
    # Whisper was trained); n = the content plus at least `window_margin` frames of padding,
    # rounded up to a multiple of n. Whisper needs that margin of silence after the speech:
    # windows cut close to the last word make it repeat itself (python -m perf asr-windows).
    window_step: int | None = None
    window_margin: int = 0
    fallback: Fallback | None = dataclasses.field(default_factory=Fallback)  # None: greedy only


@dataclasses.dataclass
class Segment:
    start: float  # seconds from the start of the audio
    end: float
    text: str


@dataclasses.dataclass
class Transcript:
    text: str
    language: str
    language_probability: float
    segments: list[Segment]
    duration: float  # seconds of audio
    tokens: list[int] = dataclasses.field(default_factory=list)  # text and timestamps, all windows
    cancelled: bool = False  # the caller gave up on it; decoding stopped, the text is partial
    end_probability: float | None = None  # of an end mark after its last word (WindowResult)


def check_audio(
    audio: np.ndarray, sample_rate: int = SAMPLE_RATE, max_seconds: float = 300.0
) -> np.ndarray:
    """Validate one request's audio; return it as [samples] float32 at 16 kHz.

    Accepts [samples] or [1, samples] float (any float dtype); resamples the rates in
    SUPPORTED_RATES; raises RequestError for anything else.
    """
    audio = np.asarray(audio)
    if audio.ndim == 2 and audio.shape[0] == 1:
        audio = audio[0]
    if audio.ndim != 1:
        raise RequestError(
            f"audio must be mono samples of shape [samples]; got shape {list(audio.shape)}"
        )
    if not np.issubdtype(audio.dtype, np.floating):
        raise RequestError(f"audio must be float32 samples in [-1, 1]; got dtype {audio.dtype}")
    if audio.size == 0:
        raise RequestError("audio is empty; expected at least one sample of 16 kHz mono float32")
    if not np.all(np.isfinite(audio)):
        raise RequestError(f"audio has {int(np.sum(~np.isfinite(audio)))} NaN or Inf samples")
    if sample_rate not in SUPPORTED_RATES:
        raise RequestError(
            f"sample rate {sample_rate} Hz is not supported; "
            f"send 16000 Hz (or one of {list(SUPPORTED_RATES)})"
        )
    seconds = audio.size / sample_rate
    if seconds > max_seconds:
        raise RequestError(f"audio is {seconds:.1f} s long; at most {max_seconds:g} s per request")
    audio = audio.astype(np.float32)
    if sample_rate != SAMPLE_RATE:
        from scipy.signal import resample_poly

        g = math.gcd(sample_rate, SAMPLE_RATE)
        audio = resample_poly(audio, SAMPLE_RATE // g, sample_rate // g).astype(np.float32)
    return audio


@dataclasses.dataclass
class _State:
    mel: np.ndarray  # [80, frames]
    content_frames: int
    language: str | None
    prefix: list[int]  # forced at the start of the first window
    seek: int = 0
    language_probability: float = 1.0
    segments: list[Segment] = dataclasses.field(default_factory=list)
    tokens: list[int] = dataclasses.field(default_factory=list)
    cancelled: Callable[[], bool] = lambda: False
    dropped: bool = False  # cancelled: no more windows
    end_probability: float | None = None  # the last window's with words


def split_segments(
    tokens: list[int], vocab: WhisperVocab, offset: float, size: int, seek: int
) -> tuple[list[tuple[float, float, list[int]]], int]:
    """faster-whisper's `_split_segments_by_timestamps`: (start, end, tokens) per segment of a
    window at `seek` of `size` frames, and the next seek."""
    ts = vocab.timestamp_begin
    single_ending = len(tokens) >= 2 and tokens[-2] < ts <= tokens[-1]
    pairs = [i for i in range(1, len(tokens)) if tokens[i] >= ts and tokens[i - 1] >= ts]
    if not pairs:
        stamps = [t for t in tokens if t >= ts]
        duration = size * FRAME_SECONDS
        if stamps and stamps[-1] != ts:
            duration = (stamps[-1] - ts) * SECONDS_PER_POSITION
        return [(offset, offset + duration, tokens)], seek + size
    cuts = [*pairs, len(tokens)] if single_ending else pairs
    segments, last = [], 0
    for cut in cuts:
        piece = tokens[last:cut]
        start = offset + (piece[0] - ts) * SECONDS_PER_POSITION
        segments.append((start, offset + (piece[-1] - ts) * SECONDS_PER_POSITION, piece))
        last = cut
    if single_ending:
        return segments, seek + size
    return segments, seek + (tokens[last - 1] - ts) * 2  # 2 mel frames per position


def window_frames(size: int, step: int | None, margin: int = 0) -> int:
    """Mel frames of the encoder window for `size` frames of content."""
    if step is None:
        return N_FRAMES
    return min(N_FRAMES, step * math.ceil((size + margin) / step))


def transcribe(
    runtime: WhisperRuntime,
    vocab: WhisperVocab,
    audios: Sequence[np.ndarray],
    options: AsrOptions = AsrOptions(),
    prefixes: Sequence[Sequence[int]] | None = None,
    *,
    cancelled: Sequence[Callable[[], bool]] | None = None,
) -> list[Transcript]:
    """Transcribe checked 16-kHz audios ([samples] float32 each), decoding them in lockstep.

    prefixes: per audio, tokens its transcript begins with (checked, whole words:
    avatar.asr.agreement), forced at the start of its first window; rows with prefixes of
    different lengths decode in separate lockstep batches.
    cancelled: per audio, asked before each window and decoder step; an audio whose caller
    gave up stops there (its Transcript has `cancelled` set) and frees its row of the batch."""
    states = []
    for i, audio in enumerate(audios):
        mel = log_mel(audio)
        silent = float(np.abs(audio).max()) < options.silence_peak
        prefix = [] if prefixes is None or silent else list(prefixes[i])
        state = _State(mel, 0 if silent else mel.shape[1] - 1, options.decode.language, prefix)
        if cancelled is not None:
            state.cancelled = cancelled[i]
        states.append(state)
    while active := [s for s in states if s.seek < s.content_frames and not _gave_up(s)]:
        windows = [_Window(s, min(N_FRAMES, s.content_frames - s.seek), options) for s in active]
        sizes = [w.size for w in windows]
        frames = max(window_frames(n, options.window_step, options.window_margin) for n in sizes)
        results = _decode_windows(runtime, vocab, windows, frames, options.decode)
        if options.fallback is not None:
            results = _fall_back(runtime, vocab, windows, results, options, frames=frames)
        for state, size, result in zip(active, sizes, results, strict=True):
            if result.cancelled:
                state.dropped = True
                continue
            if state.language is None:
                state.language, state.language_probability = (
                    result.language,
                    result.language_probability,
                )
            skip = (
                options.no_speech_threshold is not None
                and result.no_speech_prob > options.no_speech_threshold
                and result.avg_logprob <= options.log_prob_threshold
            )
            if skip:
                state.seek += size
                continue
            offset = state.seek * FRAME_SECONDS
            state.tokens += result.tokens
            if result.end_probability is not None:
                state.end_probability = result.end_probability
            pieces, state.seek = split_segments(result.tokens, vocab, offset, size, state.seek)
            for start, end, tokens in pieces:
                text = vocab.decode(tokens)
                if text.strip():
                    state.segments.append(Segment(round(start, 3), round(end, 3), text))
    return [
        Transcript(
            text="".join(seg.text for seg in s.segments).strip(),
            language=s.language or (options.decode.language or ""),
            language_probability=s.language_probability,
            segments=s.segments,
            duration=(s.mel.shape[1] - 1) * FRAME_SECONDS,
            tokens=s.tokens,
            cancelled=s.dropped,
            end_probability=s.end_probability,
        )
        for s in states
    ]


class _Window:
    """One audio's next window in a lockstep batch: `size` frames of content at its seek."""

    def __init__(self, state: _State, size: int, options: AsrOptions):
        self.state, self.size = state, size
        self.prefix = state.prefix if state.seek == 0 else []
        self.limit = speech_token_limit(options.decode, size * FRAME_SECONDS)

    def mel(self, frames: int) -> np.ndarray:
        """[n_mels, frames]: the window's content, padded."""
        return pad_or_trim(self.state.mel[:, self.state.seek : self.state.seek + self.size], frames)


def _decode_windows(
    runtime: WhisperRuntime,
    vocab: WhisperVocab,
    windows: Sequence[_Window],
    frames: int,
    decode: DecodeOptions,
) -> list[WindowResult]:
    """Decode the windows, each padded to `frames`."""
    mel = np.stack([w.mel(frames) for w in windows])
    keys = [(w.state.language, w.prefix) for w in windows]
    limits = [w.limit for w in windows]
    checks = [w.state.cancelled for w in windows]
    return _decode_rows(runtime, vocab, mel, keys, decode, limits=limits, cancelled=checks)


def window_degeneracy(
    result: WindowResult, vocab: WhisperVocab, limit: int, thresholds: Thresholds
) -> str | None:
    """Why a decoded window's transcript is degenerate (None: it is not, or it was
    cancelled); `limit`: the most tokens the window could decode."""
    if result.cancelled:
        return None
    return degeneracy(
        vocab.decode(result.tokens),
        [t for t in result.tokens if t < vocab.eot],
        result.avg_logprob,
        hit_limit=len(result.tokens) >= limit,
        thresholds=thresholds,
    )


def _fall_back(
    runtime: WhisperRuntime,
    vocab: WhisperVocab,
    windows: Sequence[_Window],
    results: Sequence[WindowResult],
    options: AsrOptions,
    *,
    frames: int,
) -> list[WindowResult]:
    """`results` with each degenerate window decoded again (`Fallback`); frames: the
    greedy pass's window."""
    fallback = options.fallback
    assert fallback is not None, "a fallback to run"
    kept = list(results)
    pending: dict[int, str] = {}  # row -> why its transcript so far is degenerate
    for i, (window, result) in enumerate(zip(windows, kept, strict=True)):
        if why := window_degeneracy(result, vocab, window.limit, fallback.thresholds):
            pending[i] = why
    margin = options.window_margin + fallback.extra_margin
    for retry, temperature in enumerate(fallback.temperatures):
        if not pending:
            break
        longer = max(
            frames, *(window_frames(windows[i].size, options.window_step, margin) for i in pending)
        )
        if temperature == 0 and longer == frames:
            continue  # it would decode what greedy did
        rows = list(pending)
        decode = dataclasses.replace(
            options.decode, temperature=temperature, seed=fallback.seed + retry
        )
        retried = _decode_windows(runtime, vocab, [windows[i] for i in rows], longer, decode)
        for i, result in zip(rows, retried, strict=True):
            why = window_degeneracy(result, vocab, windows[i].limit, fallback.thresholds)
            log.info(
                "asr fallback: window at %.2f s was degenerate (%s): %r; temperature %g, "
                "%d frames: %r%s",
                windows[i].state.seek * FRAME_SECONDS,
                pending[i],
                vocab.decode(kept[i].tokens),
                temperature,
                longer,
                vocab.decode(result.tokens),
                f" (still degenerate: {why})" if why else "",
            )
            if why is None:  # not degenerate, or its caller gave up
                kept[i] = result
                del pending[i]
    return kept


def _gave_up(state: _State) -> bool:
    state.dropped = state.dropped or state.cancelled()
    return state.dropped


def _decode_rows(
    runtime,
    vocab,
    mel,
    keys: list[tuple[str | None, list[int]]],
    options,
    *,
    limits: list[int],
    cancelled: list[Callable[[], bool]],
):
    """Rows go in one lockstep batch when they agree on the language (a known one, or
    detected) and on their prefix's length. limits: each row's most tokens; cancelled:
    each row's check."""
    groups: dict[tuple[str | None, int], list[int]] = {}
    for i, (language, prefix) in enumerate(keys):
        groups.setdefault((language, len(prefix)), []).append(i)
    results: list = [None] * len(keys)
    for (language, _), rows in groups.items():
        batch = mel if len(rows) == len(keys) else mel[rows]
        decoded = greedy_decode(
            runtime,
            batch,
            vocab,
            dataclasses.replace(options, language=language),
            [keys[i][1] for i in rows],
            max_tokens=[limits[i] for i in rows],
            cancelled=[cancelled[i] for i in rows],
        )
        for i, r in zip(rows, decoded, strict=True):
            results[i] = r
    return results
