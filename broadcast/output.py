"""The broadcast's encoder and transport: RGB frames and mono audio, one pair per tick of
the stream clock, encoded once with FFmpeg's libraries (PyAV: H.264 + AAC) and muxed to an
RTMP URL (FLV), an SRT/UDP URL or a file (.flv, .ts), and remuxed into an HLS preview.

`AVOutput` is synchronous (one thread). `PacedOutput` is the thread that writes ticks at
real time from a small queue, so the show renders ahead and its asyncio loop never blocks.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from urllib.parse import urlsplit

import av
import numpy as np

from broadcast.clock import StreamClock

log = logging.getLogger(__name__)

X264_PRESETS = ("ultrafast", "superfast", "veryfast", "faster")
X264_TUNES = ("zerolatency", "animation", "film")
AAC_FRAME = 1024  # samples per AAC frame: the FIFO regroups each tick's samples into these


class OutputError(RuntimeError):
    """The output URL could not be opened or stopped taking packets."""

    def __init__(self, url: str, reason: str) -> None:
        self.url = redact(url)
        self.reason = reason
        super().__init__(f"broadcast output {self.url} failed: {reason}")


def redact(url: str) -> str:
    """The URL without its secret: an RTMP stream key (the last path part) or SRT query
    (streamid, passphrase) never reaches a log or an error message."""
    parts = urlsplit(url)
    if parts.scheme in ("rtmp", "rtmps"):
        app, _, key = parts.path.rpartition("/")
        return f"{parts.scheme}://{parts.netloc}{app}/{'<key>' if key else ''}"
    if parts.scheme in ("srt", "udp", "tcp"):
        return f"{parts.scheme}://{parts.netloc}{parts.path}"
    return url


def container_format(url: str) -> str:
    """The muxer an output URL needs: FLV for RTMP, MPEG-TS for SRT/UDP; files by suffix."""
    scheme = urlsplit(url).scheme.lower() if "://" in url else ""
    if scheme in ("rtmp", "rtmps"):
        return "flv"
    if scheme in ("srt", "udp", "tcp"):
        return "mpegts"
    if scheme in ("", "file"):
        suffix = Path(urlsplit(url).path if scheme else url).suffix.lower()
        if suffix in (".flv", ".ts"):
            return "flv" if suffix == ".flv" else "mpegts"
    raise ValueError(
        f"unsupported broadcast output {redact(url)!r}: expected rtmp://, rtmps://, srt://, "
        "udp:// or a file path ending in .flv or .ts"
    )


@dataclass(frozen=True)
class StreamFormat:
    """What goes on air: picture size, rates, bitrates and the x264 settings."""

    fps: int = 25
    width: int = 512
    height: int = 512
    sample_rate: int = 48000
    video_bitrate: int = 1_500_000
    audio_bitrate: int = 128_000
    keyframe_interval_s: float = 2.0  # platforms ask for 2 s; HLS segments cut on keyframes
    preset: str = "veryfast"
    tune: str = "zerolatency"  # no lookahead, no B-frames: a frame's packet leaves at once

    def __post_init__(self) -> None:
        StreamClock(self.fps, self.sample_rate)  # raises on a non-integral samples per frame
        if self.width % 2 or self.height % 2 or self.width <= 0 or self.height <= 0:
            raise ValueError(
                f"width and height must be even and positive (yuv420p), got "
                f"{self.width}x{self.height}"
            )
        if self.preset not in X264_PRESETS:
            raise ValueError(f"preset {self.preset!r}: expected one of {X264_PRESETS}")
        if self.tune not in X264_TUNES:
            raise ValueError(f"tune {self.tune!r}: expected one of {X264_TUNES}")
        if self.keyframe_interval < 1:
            raise ValueError(f"keyframe_interval_s {self.keyframe_interval_s} is under a frame")

    @property
    def keyframe_interval(self) -> int:
        """Frames between keyframes."""
        return round(self.keyframe_interval_s * self.fps)

    @property
    def samples_per_frame(self) -> int:
        return self.sample_rate // self.fps

    def clock(self) -> StreamClock:
        return StreamClock(self.fps, self.sample_rate)


@dataclass(frozen=True)
class TickTimes:
    """Monotonic wall times of one tick on the sender: written, and when the encoders put
    out the packet holding its frame and the one holding its first audio sample."""

    tick: int
    written: float
    video_out: float | None = None
    audio_out: float | None = None


@dataclass(frozen=True)
class OutputStats:
    frames: int
    bytes: int
    reconnects: int
    encode_ms_p50: float
    encode_ms_p95: float
    video_buffering_ms_p50: float  # write() of a frame -> its packet out of the encoder
    video_buffering_ms_p95: float
    audio_buffering_ms_p50: float  # write() of a tick -> the AAC packet of its first sample
    audio_buffering_ms_p95: float


def percentile(values: list[float] | deque[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else float("nan")


class AVOutput:
    """One encoded stream. `write` takes tick after tick; timestamps are the tick count."""

    def __init__(
        self,
        url: str,
        fmt: StreamFormat,
        preview_dir: Path | None = None,
        open_timeout_s: float = 10.0,
        history_s: float = 300.0,
    ) -> None:
        self.url = url
        self.format = fmt
        self.clock = fmt.clock()
        self._muxer = container_format(url)
        self._open_timeout_s = open_timeout_s
        self._tick = 0
        self._history = round(history_s * fmt.fps)
        self._times: dict[int, TickTimes] = {}
        self._lock = threading.Lock()
        self._frames = self._bytes = self._reconnects = 0
        window = 30 * 60 * fmt.fps  # figures over the last 30 minutes
        self._encode_ms: deque[float] = deque(maxlen=window)
        self._video_ms: deque[float] = deque(maxlen=window)
        self._audio_ms: deque[float] = deque(maxlen=window)
        self._open()
        self._preview = self._open_preview(preview_dir) if preview_dir else None

    # Opening ------------------------------------------------------------------------------

    def _open(self) -> None:
        """Encoders and the main container, starting at the current tick."""
        self._container = None
        try:
            container = av.open(self.url, "w", format=self._muxer, timeout=self._open_timeout_s)
        except av.ProtocolNotFoundError as error:
            raise OutputError(
                self.url,
                f"this FFmpeg build cannot open it ({error}); PyAV's wheel has no SRT: push "
                "rtmp://, or MPEG-TS to udp:// and relay it (srt-live-transmit)",
            ) from error
        except (av.FFmpegError, OSError) as error:
            raise OutputError(self.url, f"could not open ({error})") from error
        try:
            video, audio = self._add_encoders(container)
            # Writes the header now: a refused connection or publish fails here, not later.
            container.start_encoding()
        except (av.FFmpegError, OSError) as error:
            container.close()
            raise OutputError(self.url, f"could not start the stream ({error})") from error
        self._container, self._video, self._audio = container, video, audio
        self._first_sample = self.clock.first_sample(self._tick)
        self._fifo = av.AudioFifo()

    def _add_encoders(
        self, container: av.container.OutputContainer
    ) -> tuple[av.VideoStream, av.AudioStream]:
        fmt = self.format
        video = container.add_stream(
            "libx264",
            rate=fmt.fps,
            options={
                "preset": fmt.preset,
                "tune": fmt.tune,
                "g": str(fmt.keyframe_interval),
                "keyint_min": str(fmt.keyframe_interval),
                "sc_threshold": "0",  # keyframes only on the interval: even segments
                "maxrate": str(fmt.video_bitrate),
                "bufsize": str(fmt.video_bitrate),  # one second of VBV: steady bitrate
            },
        )
        video.width, video.height, video.pix_fmt = fmt.width, fmt.height, "yuv420p"
        video.bit_rate = fmt.video_bitrate
        video.time_base = Fraction(1, fmt.fps)
        audio = container.add_stream("aac", rate=fmt.sample_rate, layout="mono")
        audio.bit_rate = fmt.audio_bitrate
        audio.time_base = Fraction(1, fmt.sample_rate)
        return video, audio

    def _open_preview(self, folder: Path) -> av.container.OutputContainer:
        """HLS of the same packets: remuxed from the main encoders, not encoded twice."""
        folder.mkdir(parents=True, exist_ok=True)
        preview = av.open(
            str(folder / "index.m3u8"),
            "w",
            format="hls",
            options={
                "hls_time": str(self.format.keyframe_interval_s),
                "hls_list_size": "6",
                "hls_flags": "delete_segments+independent_segments",
                "hls_segment_filename": str(folder / "segment_%05d.ts"),
            },
        )
        self._preview_video = preview.add_stream_from_template(self._video)
        self._preview_audio = preview.add_stream_from_template(self._audio)
        return preview

    def reconnect(self, at_tick: int | None = None) -> None:
        """Close the main container (it failed) and open it again, stamping from `at_tick`
        (the clock's tick now: the ticks that passed while it was down are a gap)."""
        self._close_main(flush=False)
        if at_tick is not None:
            self._tick = max(at_tick, self._tick)
        self._open()
        self._reconnects += 1
        log.info("broadcast output %s reopened at tick %d", redact(self.url), self._tick)

    # Writing ------------------------------------------------------------------------------

    @property
    def tick(self) -> int:
        """The tick the next `write` is stamped with."""
        return self._tick

    def write(self, frame: np.ndarray, audio: np.ndarray) -> None:
        """Encode and send one tick: `frame` HxWx3 uint8 RGB, `audio` float32 mono of
        exactly `samples_per_frame` samples (zeros for silence)."""
        self.check(frame, audio)
        tick, fmt = self._tick, self.format
        started = time.monotonic()
        picture = av.VideoFrame.from_ndarray(frame, format="rgb24")
        picture.pts, picture.time_base = tick, Fraction(1, fmt.fps)
        sound = av.AudioFrame.from_ndarray(audio.reshape(1, -1), format="fltp", layout="mono")
        sound.sample_rate = fmt.sample_rate
        # AudioFifo counts pts from 0: feed it pts since this connection began, add it back.
        sound.pts = self.clock.first_sample(tick) - self._first_sample
        sound.time_base = Fraction(1, fmt.sample_rate)
        try:
            packets = self._video.encode(picture)
            video_out = time.monotonic()
            self._fifo.write(sound)
            while self._fifo.samples >= AAC_FRAME:
                packets += self._audio.encode(self._from_fifo(AAC_FRAME))
        except (av.FFmpegError, OSError) as error:
            raise OutputError(self.url, f"encoding tick {tick} failed ({error})") from error
        audio_out = time.monotonic()
        self._remember(TickTimes(tick, started))
        self._mux(packets, video_out, audio_out)
        with self._lock:
            self._encode_ms.append((audio_out - started) * 1000)
            self._frames += 1
        self._tick += 1

    def _from_fifo(self, samples: int | None) -> av.AudioFrame:
        chunk = self._fifo.read(samples or 0)
        chunk.pts += self._first_sample
        return chunk

    def check(self, frame: np.ndarray, audio: np.ndarray) -> None:
        """Raise ValueError unless (frame, audio) is one tick of this format."""
        fmt = self.format
        if frame.shape != (fmt.height, fmt.width, 3) or frame.dtype != np.uint8:
            raise ValueError(
                f"frame must be {fmt.height}x{fmt.width}x3 uint8 RGB, got "
                f"{frame.shape} {frame.dtype}"
            )
        if audio.shape != (fmt.samples_per_frame,) or audio.dtype != np.float32:
            raise ValueError(
                f"audio must be {fmt.samples_per_frame} float32 mono samples, got "
                f"{audio.shape} {audio.dtype}"
            )

    def _mux(self, packets: list[av.Packet], video_out: float, audio_out: float) -> None:
        for packet in packets:
            is_video = packet.stream_index == self._video.index
            if not is_video and packet.pts is not None and packet.pts < self._first_sample:
                # The AAC encoder's priming packet (pts -1024 at the start): dropping it keeps
                # the stream's first timestamp at the clock's tick, not 21 ms before it.
                continue
            self._note_out(packet, is_video, video_out if is_video else audio_out)
            if self._preview is not None:
                self._mux_preview(packet, is_video)
            try:
                self._container.mux(packet)
            except (av.FFmpegError, OSError) as error:
                raise OutputError(
                    self.url, f"the server stopped taking packets ({error})"
                ) from error
            with self._lock:
                self._bytes += packet.size

    def _mux_preview(self, packet: av.Packet, is_video: bool) -> None:
        """The same packet into the HLS preview; its timestamps restored for the main mux
        (muxing rebases them in place)."""
        pts, dts, time_base, stream = packet.pts, packet.dts, packet.time_base, packet.stream
        packet.stream = self._preview_video if is_video else self._preview_audio
        try:
            self._preview.mux(packet)
        except (av.FFmpegError, OSError) as error:
            log.warning("HLS preview dropped a packet: %s", error)
        packet.stream = stream
        packet.pts, packet.dts, packet.time_base = pts, dts, time_base

    def _remember(self, times: TickTimes) -> None:
        self._times[times.tick] = times
        self._times.pop(times.tick - self._history, None)

    def _note_out(self, packet: av.Packet, is_video: bool, when: float) -> None:
        if packet.pts is None:
            return
        if is_video:
            ticks = [int(packet.pts)]
        else:
            spf = self.clock.samples_per_frame
            first, last = int(packet.pts), int(packet.pts) + (packet.duration or AAC_FRAME)
            ticks = list(range(-(-first // spf), -(-last // spf)))  # first samples inside
        for tick in ticks:
            times = self._times.get(tick)
            if times is None:
                continue
            if is_video:
                self._times[tick] = TickTimes(tick, times.written, when, times.audio_out)
                ms, into = (when - times.written) * 1000, self._video_ms
            else:
                self._times[tick] = TickTimes(tick, times.written, times.video_out, when)
                ms, into = (when - times.written) * 1000, self._audio_ms
            with self._lock:
                into.append(ms)

    def times(self, tick: int) -> TickTimes | None:
        """When `tick` was written and its packets left the encoders (None if forgotten)."""
        return self._times.get(tick)

    @property
    def stats(self) -> OutputStats:
        with self._lock:
            encode, video, audio = list(self._encode_ms), list(self._video_ms), list(self._audio_ms)
            frames, sent, reconnects = self._frames, self._bytes, self._reconnects
        return OutputStats(
            frames=frames,
            bytes=sent,
            reconnects=reconnects,
            encode_ms_p50=percentile(encode, 50),
            encode_ms_p95=percentile(encode, 95),
            video_buffering_ms_p50=percentile(video, 50),
            video_buffering_ms_p95=percentile(video, 95),
            audio_buffering_ms_p50=percentile(audio, 50),
            audio_buffering_ms_p95=percentile(audio, 95),
        )

    # Closing ------------------------------------------------------------------------------

    def _close_main(self, flush: bool) -> None:
        if self._container is None:  # a reconnect that failed left none open
            return
        try:
            if flush:
                packets = self._video.encode(None)
                if self._fifo.samples:
                    packets += self._audio.encode(self._from_fifo(None))  # a short last one
                packets += self._audio.encode(None)
                now = time.monotonic()
                self._mux(packets, now, now)
        finally:
            try:
                self._container.close()
            except (av.FFmpegError, OSError) as error:
                log.warning("closing %s: %s", redact(self.url), error)
            self._container = None

    def close(self) -> None:
        """Flush the encoders, finish the stream and the preview."""
        try:
            self._close_main(flush=True)
        finally:
            if self._preview is not None:
                self._preview.close()


@dataclass(frozen=True)
class PacedStats:
    ticks: int
    underflows: int  # ticks due with nothing queued: the last frame again, with silence
    late_ticks: int  # written more than one frame interval after they were due
    lateness_ms_p50: float
    lateness_ms_p95: float
    lateness_ms_max: float
    reconnects: int
    dropped_ticks: int  # ticks that passed while the server was unreachable (a gap)
    queued: int


class PacedOutput:
    """A thread that writes one tick per frame interval from a small queue. The show puts
    (frame, audio) pairs ahead of time; a tick due with nothing queued repeats the last
    frame with silence (counted as an underflow) so the stream never has a gap. A broken
    connection is reopened until `reconnect_timeout_s` passes, then `error` is set and
    `put` raises it."""

    def __init__(
        self,
        output: AVOutput,
        queue_ticks: int = 8,
        reconnect_timeout_s: float = 30.0,
        retry_interval_s: float = 1.0,
    ) -> None:
        self.output = output
        self.clock = output.clock
        self._queue: deque[tuple[np.ndarray, np.ndarray, str | None]] = deque()
        self._capacity = queue_ticks
        self._space = threading.Condition()
        self._stop = threading.Event()
        self._closing = threading.Event()  # write what is queued, then stop
        self._reconnect_timeout_s = reconnect_timeout_s
        self._retry_interval_s = retry_interval_s
        self._thread = threading.Thread(target=self._run, name="broadcast-output", daemon=True)
        self._lateness_ms: deque[float] = deque(maxlen=30 * 60 * output.format.fps)
        self._ticks = self._underflows = self._late = self._dropped = 0
        # Marked ticks' times, kept past the output's history; completed once the AAC
        # packet holding the tick's first sample is out (a few ticks later).
        self._marks: dict[str, TickTimes] = {}
        self._unfinished_marks: dict[str, int] = {}
        self._last_frame = np.zeros((output.format.height, output.format.width, 3), np.uint8)
        self._silence = np.zeros(output.format.samples_per_frame, np.float32)
        self.error: OutputError | None = None

    def start(self) -> None:
        """Tick 0 is due now: put the first ticks before (up to `queue_ticks`), or the
        first ticks due are underflows."""
        self.clock.start()
        self._thread.start()

    def put(
        self,
        frame: np.ndarray,
        audio: np.ndarray,
        mark: str | None = None,
        timeout: float | None = None,
    ) -> None:
        """Queue the next tick, waiting for room (from a thread). `mark` names the tick so
        `mark_times(mark)` says which tick it became and when it was written."""
        self.output.check(frame, audio)
        with self._space:
            if not self._space.wait_for(self._has_room, timeout):
                raise TimeoutError(f"the output queue stayed full for {timeout} s")
            if self.error is not None:
                raise self.error
            if self._stop.is_set():
                raise RuntimeError("the paced output is closed")
            self._queue.append((frame, audio, mark))

    async def put_async(
        self, frame: np.ndarray, audio: np.ndarray, mark: str | None = None
    ) -> None:
        """`put` for an asyncio show: waits for room without blocking the loop."""
        while not self._has_room():
            await asyncio.sleep(self.clock.frame_interval_s / 4)
        self.put(frame, audio, mark, timeout=0)

    def _has_room(self) -> bool:
        return len(self._queue) < self._capacity or self.error is not None or self._stop.is_set()

    def mark_times(self, mark: str) -> TickTimes | None:
        """The tick a marked `put` became and its sender-side times, once written."""
        return self._marks.get(mark)

    def _next(self) -> tuple[np.ndarray, np.ndarray, str | None]:
        with self._space:
            item = self._queue.popleft() if self._queue else None
            self._space.notify_all()
        if item is None:
            self._underflows += 1
            return self._last_frame, self._silence, None
        self._last_frame = item[0]
        return item

    def _run(self) -> None:
        tick = 0
        interval = self.clock.frame_interval_s
        while self.clock.wait_due(tick, self._stop):
            if self._closing.is_set() and not self._queue:
                return
            frame, audio, mark = self._next()
            lateness = self.clock.lateness(tick)
            self._lateness_ms.append(lateness * 1000)
            self._late += lateness > interval
            self._ticks += 1
            try:
                self.output.write(frame, audio)
                self._note_marks(mark, tick)
            except OutputError as error:
                resumed = self._recover(error)
                if resumed is None:
                    return
                self._dropped += resumed - tick
                tick = resumed
                continue
            except Exception as error:  # a bug: stop the stream and say why, never hang
                log.exception("the broadcast output failed at tick %d", tick)
                self._fail(OutputError(self.output.url, f"{type(error).__name__}: {error}"))
                return
            tick += 1

    def _note_marks(self, mark: str | None, tick: int) -> None:
        if mark is not None:
            self._unfinished_marks[mark] = tick
        for name, marked in list(self._unfinished_marks.items()):
            times = self.output.times(marked)
            if times is None:  # forgotten or never written (a reconnect dropped it)
                del self._unfinished_marks[name]
                continue
            self._marks[name] = times
            if times.audio_out is not None and times.video_out is not None:
                del self._unfinished_marks[name]

    def _recover(self, error: OutputError) -> int | None:
        """Reopen the output until it works or the timeout passes: the tick it resumes at,
        None when giving up."""
        log.warning("%s; reconnecting", error)
        deadline = time.monotonic() + self._reconnect_timeout_s
        while not (self._stop.wait(self._retry_interval_s) or self._closing.is_set()):
            resume = self.clock.tick_at(time.monotonic() - self.clock.due(0)) + 1
            try:
                self.output.reconnect(at_tick=resume)
            except OutputError as again:
                if time.monotonic() > deadline:
                    log.error("giving up on the broadcast output: %s", again)
                    self._fail(again)
                    return None
                continue
            # The show's queued ticks were meant for the moments that passed.
            with self._space:
                self._queue.clear()
                self._space.notify_all()
            return resume
        return None

    def _fail(self, error: OutputError) -> None:
        self.error = error
        with self._space:
            self._space.notify_all()

    @property
    def queued(self) -> int:
        """Ticks waiting to be written (how far the show is ahead of the air)."""
        return len(self._queue)

    @property
    def underflows(self) -> int:
        """Ticks that were due with nothing queued."""
        return self._underflows

    @property
    def stats(self) -> PacedStats:
        """All of the figures (percentiles over the last 30 minutes: for `/health`, not for
        every batch)."""
        lateness = list(self._lateness_ms)
        return PacedStats(
            ticks=self._ticks,
            underflows=self._underflows,
            late_ticks=self._late,
            lateness_ms_p50=percentile(lateness, 50),
            lateness_ms_p95=percentile(lateness, 95),
            lateness_ms_max=max(lateness, default=float("nan")),
            reconnects=self.output.stats.reconnects,
            dropped_ticks=self._dropped,
            queued=len(self._queue),
        )

    def close(self, drain: bool = True, timeout_s: float = 10.0) -> None:
        """Write what is queued (if `drain`), stop the thread, finish the stream."""
        self._closing.set()
        if not drain:
            self._stop.set()
        with self._space:
            self._space.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        self._stop.set()
        self._thread.join(timeout_s)
        try:
            self.output.close()
        except OutputError as error:  # the stream was already broken: `error` says so
            log.warning("closing the broadcast output: %s", error)
