"""Read a broadcast back as a viewer gets it (an rtmp:// URL played, or a recorded file) and
measure it: frame rate and gaps, A/V offset, frozen frames, and when audio starts.

Every received frame and audio frame keeps its media time (pts) and the monotonic wall time
its packet arrived, so a sender that logged when it wrote tick n (`AVOutput.times`) can split
"posted -> heard" into the encoder's part and the server's and network's part.

    python -m broadcast.readback rtmp://127.0.0.1:1935/live/test --seconds 30
    python -m broadcast.readback rtmp://127.0.0.1:1935/live/test --send --seconds 60
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import av
import numpy as np

from broadcast.output import AVOutput, OutputError, PacedOutput, StreamFormat, redact

log = logging.getLogger(__name__)

ENVELOPE_S = 0.001  # the audio is kept as its peak per millisecond, not as samples
Probe = Callable[[np.ndarray], float]


@dataclass(frozen=True)
class ReceivedFrame:
    pts_s: float
    received: float  # monotonic time its packet was read
    digest: bytes  # of the decoded luma: equal digests are a frozen picture
    probe: float | None = None  # the caller's probe of the luma plane, if given


@dataclass(frozen=True)
class ReceivedAudio:
    pts_s: float
    samples: int
    received: float


@dataclass(frozen=True)
class ReadbackReport:
    frames: int
    media_s: float
    fps: float  # frames per second of media time
    receive_fps: float  # frames per second of wall time (after the player's probe)
    max_frame_gap_intervals: float  # largest pts step / frame interval (1.0 is no gap)
    max_receive_gap_s: float  # largest wall time between two frames arriving
    longest_frozen_run: int  # most consecutive identical decoded frames (1: none repeated)
    audio_s: float
    av_offset_ms: float  # audio content (by sample count) minus its timestamps, at the end
    av_offset_max_ms: float  # the same, largest magnitude over the run
    audio_gap_max_ms: float  # largest hole between audio frames (silence must be samples)
    video_start_s: float | None
    audio_start_s: float | None


@dataclass
class Readback:
    """Collects what a viewer receives. `run` blocks (give it a thread for a live stream)."""

    url: str
    probe: Probe | None = None
    fps_hint: float = 25.0
    open_timeout_s: float = 15.0
    idle_timeout_s: float = 3.0  # no packet for this long: the stream has ended
    # What arrived (filled by `run`)
    frames: list[ReceivedFrame] = field(default_factory=list, init=False, repr=False)
    audio: list[ReceivedAudio] = field(default_factory=list, init=False, repr=False)
    sample_rate: int = field(default=0, init=False)
    opened: threading.Event = field(default_factory=threading.Event, init=False, repr=False)
    opened_at: float | None = field(default=None, init=False)
    error: BaseException | None = field(default=None, init=False)
    _envelope: list[np.ndarray] = field(default_factory=list, init=False, repr=False)
    _envelope_start_s: float | None = field(default=None, init=False, repr=False)
    _carry: np.ndarray = field(
        default_factory=lambda: np.zeros(0, np.float32), init=False, repr=False
    )
    _stop: threading.Event = field(default_factory=threading.Event, init=False, repr=False)

    def stop(self) -> None:
        self._stop.set()

    def run(self, seconds: float | None = None) -> None:
        """Read until `seconds` of wall time pass, the stream ends, or `stop()`."""
        try:
            container = self._open()
        except (av.FFmpegError, OSError) as error:
            self.error = error
            raise
        finally:
            self.opened.set()
        self.opened_at = time.monotonic()  # what arrived during the probe is stamped now
        deadline = None if seconds is None else time.monotonic() + seconds
        try:
            for packet in container.demux():
                received = time.monotonic()
                if packet.dts is not None:
                    self._decode(packet, received)
                if self._stop.is_set() or (deadline is not None and received > deadline):
                    break
        except (av.FFmpegError, OSError) as error:
            # A live stream that stops publishing ends in a read timeout: not a failure
            # unless the figures show missing media.
            self.error = error
            why = (
                f"no packet for {self.idle_timeout_s} s"
                if isinstance(error, av.ExitError)
                else error
            )
            log.info("read-back of %s ended: %s", redact(self.url), why)
        finally:
            container.close()

    def _open(self) -> av.container.InputContainer:
        """Open with both a video and an audio stream. A player that joins a live stream
        between keyframes may finish probing before any video arrives (FFmpeg then drops the
        stream found later): it joins again."""
        options = {"analyzeduration": "1000000", "probesize": "4000000", "fpsprobesize": "0"}
        if self.url.startswith("rtmp"):
            options["rtmp_live"] = "live"
            # Long enough to span a keyframe interval: nginx sends a late joiner no video
            # before one. It stops early once both streams are there.
            options["analyzeduration"] = "3000000"
        deadline = time.monotonic() + self.open_timeout_s
        while True:
            timeout = (max(0.5, deadline - time.monotonic()), self.idle_timeout_s)
            container = av.open(self.url, "r", options=options, timeout=timeout)
            found = {stream.type for stream in container.streams}
            if {"video", "audio"} <= found or time.monotonic() > deadline:
                return container
            log.info("%s has only %s so far: joining again", redact(self.url), sorted(found))
            container.close()

    def _decode(self, packet: av.Packet, received: float) -> None:
        for frame in packet.decode():
            if frame.pts is None:
                continue
            pts_s = float(frame.pts * frame.time_base)
            if isinstance(frame, av.VideoFrame):
                plane = frame.planes[0]
                luma = np.frombuffer(plane, np.uint8).reshape(-1, plane.line_size)
                luma = luma[: frame.height, : frame.width]
                digest = hashlib.blake2b(luma.tobytes(), digest_size=12).digest()
                probe = None if self.probe is None else float(self.probe(luma))
                self.frames.append(ReceivedFrame(pts_s, received, digest, probe))
            elif isinstance(frame, av.AudioFrame):
                self._take_audio(frame, pts_s, received)

    def _take_audio(self, frame: av.AudioFrame, pts_s: float, received: float) -> None:
        self.sample_rate = frame.sample_rate
        samples = frame.to_ndarray()
        mono = np.abs(samples.astype(np.float32)).max(axis=0)  # planar or packed: peak
        if frame.format.name in ("s16", "s16p"):
            mono /= 32768.0
        self.audio.append(ReceivedAudio(pts_s, frame.samples, received))
        if self._envelope_start_s is None:
            self._envelope_start_s = pts_s
        # The envelope is laid out by sample count from the first frame (the audio's own
        # timeline, which `av_offset` compares with the timestamps), a peak per millisecond.
        step = max(1, round(frame.sample_rate * ENVELOPE_S))
        pending = np.concatenate([self._carry, mono])
        usable = len(pending) // step * step
        self._envelope.append(pending[:usable].reshape(-1, step).max(axis=1))
        self._carry = pending[usable:]

    # Figures ------------------------------------------------------------------------------

    def audio_timeline(self) -> tuple[float, np.ndarray]:
        """(media time of the first sample, the peak per millisecond after it)."""
        if not self._envelope:
            return 0.0, np.zeros(0, np.float32)
        return self._envelope_start_s or 0.0, np.concatenate(self._envelope)

    def audio_onset(self, after_s: float, threshold: float = 0.02) -> float | None:
        """Media time of the first audio louder than `threshold` (peak, full scale 1.0) at or
        after media time `after_s`, to the millisecond; None if none arrived."""
        start, envelope = self.audio_timeline()
        first = max(0, int(np.ceil((after_s - start) / ENVELOPE_S - 1e-6)))
        loud = np.flatnonzero(envelope[first:] > threshold)
        return None if not len(loud) else start + (first + int(loud[0])) * ENVELOPE_S

    def received_at(self, media_s: float) -> float | None:
        """Monotonic wall time at which the first video frame at or after `media_s` arrived."""
        for frame in self.frames:
            if frame.pts_s >= media_s - 1e-6:
                return frame.received
        return None

    def audio_received_at(self, media_s: float) -> float | None:
        """Monotonic wall time at which the audio holding media time `media_s` arrived: with
        `audio_onset`, when a viewer could first hear an answer."""
        for chunk in self.audio:
            if chunk.pts_s + chunk.samples / self.sample_rate > media_s:
                return chunk.received
        return None

    def video_onsets(self, above: float) -> list[float]:
        """Media times where the probe rises above `above` (a marker the show draws)."""
        onsets, was = [], False
        for frame in self.frames:
            now = frame.probe is not None and frame.probe > above
            if now and not was:
                onsets.append(frame.pts_s)
            was = now
        return onsets

    def report(self) -> ReadbackReport:
        pts = np.array([f.pts_s for f in self.frames])
        # Arrival times of what came after the probe (what it held all arrive at its end).
        wall = np.array([f.received for f in self.frames if f.received > (self.opened_at or 0)])
        interval = 1.0 / self.fps_hint
        steps = np.diff(pts) if len(pts) > 1 else np.zeros(0)
        media_s = float(pts[-1] - pts[0]) if len(pts) > 1 else 0.0
        offsets = self._audio_offsets()
        return ReadbackReport(
            frames=len(self.frames),
            media_s=round(media_s, 3),
            fps=round((len(pts) - 1) / media_s, 3) if media_s else 0.0,
            receive_fps=round((len(wall) - 1) / float(wall[-1] - wall[0]), 3)
            if len(wall) > 1 and wall[-1] > wall[0]
            else 0.0,
            max_frame_gap_intervals=round(float(steps.max()) / interval, 3) if len(steps) else 0.0,
            max_receive_gap_s=round(float(np.diff(wall).max()), 3) if len(wall) > 1 else 0.0,
            longest_frozen_run=self._longest_frozen_run(),
            audio_s=round(sum(a.samples for a in self.audio) / self.sample_rate, 3)
            if self.sample_rate
            else 0.0,
            av_offset_ms=round(float(offsets[-1]) * 1000, 2) if len(offsets) else 0.0,
            av_offset_max_ms=round(float(np.abs(offsets).max()) * 1000, 2) if len(offsets) else 0.0,
            audio_gap_max_ms=round(self._audio_gap_max() * 1000, 2),
            video_start_s=float(pts[0]) if len(pts) else None,
            audio_start_s=self.audio[0].pts_s if self.audio else None,
        )

    def _audio_offsets(self) -> np.ndarray:
        """Per audio frame: (first pts + samples before it / rate) - its pts. Video and
        audio pts come from one clock, so this is how far the sound has slipped from the
        picture; 0 when no sample was lost or added."""
        if not self.audio or not self.sample_rate:
            return np.zeros(0)
        counts = np.cumsum([0] + [a.samples for a in self.audio[:-1]])
        by_samples = self.audio[0].pts_s + counts / self.sample_rate
        return by_samples - np.array([a.pts_s for a in self.audio])

    def _audio_gap_max(self) -> float:
        gaps = [
            later.pts_s - (earlier.pts_s + earlier.samples / self.sample_rate)
            for earlier, later in zip(self.audio, self.audio[1:], strict=False)
        ]
        return max(gaps, default=0.0)

    def _longest_frozen_run(self) -> int:
        longest = run = 1 if self.frames else 0
        for earlier, later in zip(self.frames, self.frames[1:], strict=False):
            run = run + 1 if later.digest == earlier.digest else 1
            longest = max(longest, run)
        return longest


# The signal card (a test card): a picture that moves every frame, its tick number drawn as
# 16 bits, and tone bursts whose ticks are drawn as a white block, so a read-back can check
# stamps, gaps, freezes and A/V sync from the content itself.
CARD_BITS = 16
CARD_TONE = 1 << CARD_BITS  # added to the probe's value while the tone block is lit
_BIT_PITCH, _BIT_SIZE, _BIT_TOP = 32, 24, 8


@dataclass(frozen=True)
class SignalCard:
    width: int = 512
    height: int = 512
    fps: int = 25
    sample_rate: int = 48000
    tone_period_ticks: int = 250  # a 440 Hz burst every 10 s at 25 fps...
    tone_start_tick: int = 125  # ...starting 5 s into each period...
    tone_ticks: int = 25  # ...lasting 1 s
    tone_amplitude: float = 0.3

    def __post_init__(self) -> None:
        if self.width < CARD_BITS * _BIT_PITCH or self.height < 128:
            raise ValueError(f"the test card needs at least {CARD_BITS * _BIT_PITCH}x128")

    def tone_on(self, tick: int) -> bool:
        phase = tick % self.tone_period_ticks
        return self.tone_start_tick <= phase < self.tone_start_tick + self.tone_ticks

    def tone_starts(self, ticks: int) -> list[int]:
        """The ticks below `ticks` at which a burst begins."""
        return [t for t in range(ticks) if self.tone_on(t) and not (t and self.tone_on(t - 1))]

    def frame(self, tick: int) -> np.ndarray:
        """HxWx3 uint8 RGB: a scrolling textured background, the bits, the tone block."""
        texture = _card_texture(self.height, self.width)
        shift = (tick * 3) % self.width
        return self.stamp(np.roll(texture, -shift, axis=1), tick)

    def stamp(self, picture: np.ndarray, tick: int) -> np.ndarray:
        """Draw `tick`'s bits and tone block into `picture` (in place); return it."""
        for bit in range(CARD_BITS):
            left = bit * _BIT_PITCH + (_BIT_PITCH - _BIT_SIZE) // 2
            value = 255 if tick >> bit & 1 else 0
            picture[_BIT_TOP : _BIT_TOP + _BIT_SIZE, left : left + _BIT_SIZE] = value
        picture[-72:-8, 8:72] = 255 if self.tone_on(tick) else 0
        return picture

    def audio(self, tick: int) -> np.ndarray:
        """The tick's float32 samples: the tone, or true silence."""
        count = self.sample_rate // self.fps
        if not self.tone_on(tick):
            return np.zeros(count, np.float32)
        t = (np.arange(count) + tick * count) / self.sample_rate
        return (self.tone_amplitude * np.sin(2 * np.pi * 440.0 * t)).astype(np.float32)


_TEXTURES: dict[tuple[int, int], np.ndarray] = {}


def _card_texture(height: int, width: int) -> np.ndarray:
    """A fixed smooth random texture (so the encoder has real work, unlike flat colour)."""
    if (height, width) not in _TEXTURES:
        rng = np.random.default_rng(45)
        coarse = rng.integers(40, 216, (height // 8 + 1, width // 8 + 1, 3), dtype=np.uint8)
        fine = np.kron(coarse, np.ones((8, 8, 1), np.uint8))[:height, :width]
        noise = rng.integers(0, 24, (height, width, 3), dtype=np.uint8)
        _TEXTURES[height, width] = fine + noise
    return _TEXTURES[height, width]


def card_probe(luma: np.ndarray) -> float:
    """Read the test card back: its tick number, plus CARD_TONE while the tone block is lit."""
    centre = _BIT_TOP + _BIT_SIZE // 2
    value = 0
    for bit in range(CARD_BITS):
        x = bit * _BIT_PITCH + _BIT_PITCH // 2
        if luma[centre - 4 : centre + 4, x - 4 : x + 4].mean() > 128:
            value |= 1 << bit
    if luma[-60:-20, 20:60].mean() > 128:
        value += CARD_TONE
    return float(value)


def card_tick(probe: float) -> int:
    return int(probe) % CARD_TONE


def send_card(
    url: str, seconds: float, fmt: StreamFormat, preview_dir: Path | None = None
) -> dict[str, object]:
    """Push the signal card to `url` in real time; the sender's figures, CPU included."""
    card = SignalCard(width=fmt.width, height=fmt.height, fps=fmt.fps, sample_rate=fmt.sample_rate)
    paced = PacedOutput(AVOutput(url, fmt, preview_dir=preview_dir))
    ticks = round(seconds * fmt.fps)
    # A second of backgrounds drawn once, stamped per tick: the CPU measured is the encoder's.
    backgrounds = [card.frame(tick) for tick in range(fmt.fps)]
    cpu, wall = time.process_time(), time.monotonic()
    for tick in range(ticks):
        picture = card.stamp(backgrounds[tick % fmt.fps].copy(), tick)
        paced.put(picture, card.audio(tick), timeout=10)
        if tick == paced.clock.fps // 5:  # a fifth of a second rendered ahead
            paced.start()
    paced.close()
    if paced.error is not None:
        raise paced.error
    elapsed = time.monotonic() - wall
    output = paced.output.stats
    return {
        "cpu_s_per_s": round((time.process_time() - cpu) / elapsed, 3),
        "kbit_per_s": round(output.bytes * 8 / 1000 / elapsed, 1),
        **{k: round(v, 2) if isinstance(v, float) else v for k, v in asdict(output).items()},
        **{
            f"paced_{k}": round(v, 2) if isinstance(v, float) else v
            for k, v in asdict(paced.stats).items()
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m broadcast.readback",
        description="Measure a received broadcast, or (--send) push the signal card to a URL "
        "and print the sender's figures (CPU, encode time, encoder buffering).",
    )
    parser.add_argument("url", help="rtmp://HOST/APP/STREAM to play (or push), or a file")
    parser.add_argument("--seconds", type=float, default=30.0, help="how long to read or send")
    parser.add_argument("--fps", type=int, default=25, help="the stream's frame rate")
    parser.add_argument(
        "--card",
        action="store_true",
        help="the stream is the signal card: "
        "count frames whose drawn tick differs from their timestamp",
    )
    parser.add_argument("--send", action="store_true", help="push the signal card instead")
    parser.add_argument("--size", type=int, default=512, help="--send: picture width = height")
    parser.add_argument("--preset", default="veryfast", help="--send: x264 preset")
    parser.add_argument("--preview", type=Path, help="--send: also write HLS to this folder")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if args.send:
        fmt = StreamFormat(fps=args.fps, width=args.size, height=args.size, preset=args.preset)
        try:
            figures = send_card(args.url, args.seconds, fmt, args.preview)
        except OutputError as error:
            parser.exit(1, f"{error}\n")
    else:
        readback = Readback(args.url, probe=card_probe if args.card else None, fps_hint=args.fps)
        try:
            readback.run(args.seconds)
        except (av.FFmpegError, OSError) as error:
            parser.exit(1, f"could not read {redact(args.url)}: {error}\n")
        figures = asdict(readback.report())
        if args.card:
            figures["card_mismatches"] = sum(
                card_tick(f.probe or 0) != round(f.pts_s * args.fps) for f in readback.frames
            )
    lines = [f"{name}: {value}" for name, value in figures.items()]
    print(json.dumps(figures) if args.json else "\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
