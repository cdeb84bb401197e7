"""The broadcast's one clock: tick n is video frame n and the audio samples
[n * samples_per_frame, (n + 1) * samples_per_frame). Every timestamp of the stream is
computed from the tick count; the wall clock only paces when a tick is written."""

from __future__ import annotations

import threading
import time


class StreamClock:
    """Media time of ticks, and their real-time pacing against `time.monotonic()`."""

    def __init__(self, fps: int, sample_rate: int) -> None:
        if fps <= 0 or sample_rate <= 0:
            raise ValueError(f"fps and sample_rate must be positive, got {fps} and {sample_rate}")
        if sample_rate % fps:
            # A fractional samples-per-frame would make audio and video drift apart by
            # rounding; refuse it instead of accumulating an error.
            raise ValueError(
                f"sample_rate {sample_rate} is not a whole number of samples per frame at "
                f"{fps} fps; use e.g. 25 or 30 fps with 48000 Hz"
            )
        self.fps = fps
        self.sample_rate = sample_rate
        self.samples_per_frame = sample_rate // fps
        self.frame_interval_s = 1.0 / fps
        self._epoch: float | None = None

    def media_time(self, tick: int) -> float:
        """Seconds of stream time at the start of `tick`."""
        return tick / self.fps

    def tick_at(self, media_time_s: float) -> int:
        """The tick whose interval holds `media_time_s`."""
        return int(media_time_s * self.fps + 1e-9)

    def first_sample(self, tick: int) -> int:
        return tick * self.samples_per_frame

    # Real-time pacing -------------------------------------------------------------------

    def start(self, at: float | None = None) -> None:
        """Tick 0 is due at monotonic time `at` (now if None)."""
        self._epoch = time.monotonic() if at is None else at

    @property
    def started(self) -> bool:
        return self._epoch is not None

    def due(self, tick: int) -> float:
        """The monotonic time at which `tick` should be written."""
        if self._epoch is None:
            raise RuntimeError("StreamClock.start() was not called")
        return self._epoch + tick / self.fps

    def lateness(self, tick: int, now: float | None = None) -> float:
        """Seconds past `tick`'s due time (negative: early)."""
        return (time.monotonic() if now is None else now) - self.due(tick)

    def wait_due(self, tick: int, stop: threading.Event | None = None) -> bool:
        """Sleep until `tick` is due; False if `stop` was set first."""
        delay = self.due(tick) - time.monotonic()
        if delay <= 0:
            return not (stop and stop.is_set())
        if stop is None:
            time.sleep(delay)
            return True
        return not stop.wait(delay)
