"""What the anchor will say next, on the stream's clock: speech segments (audio at the
stream's sample rate, ARKit-52 weights at its frame rate, a whole number of frames each) in
the order they air, taken a few ticks at a time by the render loop. Between segments, and
when nothing is queued, the ticks are the anchor's idle life with silence."""

from __future__ import annotations

import collections
import dataclasses
import math

import numpy as np
from scipy.signal import resample_poly

from broadcast.captions import Caption


@dataclasses.dataclass
class Segment:
    """One utterance ready to air: `audio` [frames * samples_per_frame] float32 and
    `blendshapes` [frames, 52]; `caption` goes up when it starts (None: leave it as is)."""

    question_id: int
    kind: str  # "attribution" (whose question) or "answer" (a sentence of the reply)
    audio: np.ndarray
    blendshapes: np.ndarray
    caption: Caption | None = None
    text: str = ""
    mark: str | None = None  # names its first tick in the output (PacedOutput.mark_times)

    @property
    def frames(self) -> int:
        return len(self.blendshapes)


def stream_speech(
    audio: np.ndarray,
    sample_rate: int,
    blendshapes: np.ndarray,
    fps: float,
    *,
    stream_fps: float,
    stream_rate: int,
) -> tuple[np.ndarray, np.ndarray]:
    """A model's speech (audio at `sample_rate`, weights at `fps`) on the stream's clock:
    audio resampled to `stream_rate` and weights sampled at `stream_fps`, cut or padded with
    silence to a whole number of frames (the last weight row held)."""
    audio = np.asarray(audio, np.float32).reshape(-1)
    shapes = np.asarray(blendshapes, np.float32).reshape(-1, 52)
    duration = max(audio.size / sample_rate, len(shapes) / fps)
    frames = max(1, math.ceil(duration * stream_fps - 1e-6))
    gcd = math.gcd(int(stream_rate), int(sample_rate))
    resampled = resample_poly(audio, stream_rate // gcd, sample_rate // gcd).astype(np.float32)
    per_frame = round(stream_rate / stream_fps)
    out_audio = np.zeros(frames * per_frame, np.float32)
    out_audio[: min(resampled.size, out_audio.size)] = resampled[: out_audio.size]
    if len(shapes) == 0:
        return out_audio, np.zeros((frames, 52), np.float32)
    times = np.arange(frames) / stream_fps
    source = np.arange(len(shapes)) / fps
    out_shapes = np.stack(
        [np.interp(times, source, shapes[:, k]) for k in range(52)], axis=1
    ).astype(np.float32)
    return np.clip(out_audio, -1.0, 1.0), out_shapes


@dataclasses.dataclass
class Take:
    """The next ticks: `speaking` [n] bool, `blendshapes` [n, 52] (speech rows where
    speaking), `audio` [n, samples_per_frame], and the segments that started at each offset."""

    speaking: np.ndarray
    blendshapes: np.ndarray
    audio: np.ndarray
    started: list[tuple[int, Segment]]
    ended: list[tuple[int, Segment]]


class Programme:
    """A FIFO of segments; `take(n)` hands out the next `n` ticks of it."""

    def __init__(self, samples_per_frame: int) -> None:
        self.samples_per_frame = samples_per_frame
        self._segments: collections.deque[Segment] = collections.deque()
        self._offset = 0  # frames of the first segment already taken

    def add(self, segment: Segment) -> None:
        if segment.audio.size != segment.frames * self.samples_per_frame:
            raise ValueError(
                f"segment audio has {segment.audio.size} samples; expected "
                f"{segment.frames} frames x {self.samples_per_frame}"
            )
        self._segments.append(segment)

    def queued_frames(self) -> int:
        return sum(s.frames for s in self._segments) - self._offset

    def take(self, n: int) -> Take:
        spf = self.samples_per_frame
        speaking = np.zeros(n, bool)
        shapes = np.zeros((n, 52), np.float32)
        audio = np.zeros((n, spf), np.float32)
        started: list[tuple[int, Segment]] = []
        ended: list[tuple[int, Segment]] = []
        i = 0
        while i < n and self._segments:
            segment = self._segments[0]
            if self._offset == 0:
                started.append((i, segment))
            count = min(n - i, segment.frames - self._offset)
            rows = slice(self._offset, self._offset + count)
            speaking[i : i + count] = True
            shapes[i : i + count] = segment.blendshapes[rows]
            audio[i : i + count] = segment.audio[rows.start * spf : rows.stop * spf].reshape(
                count, spf
            )
            i += count
            self._offset += count
            if self._offset == segment.frames:
                ended.append((i, self._segments.popleft()))
                self._offset = 0
        return Take(speaking, shapes, audio, started, ended)
