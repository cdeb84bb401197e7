"""Frames + audio -> MP4 (PyAV), and PNG contact sheets of a sentence's frames."""

from __future__ import annotations

import logging
from fractions import Fraction
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)


def write_png(path: Path, image: np.ndarray) -> Path:
    """Write an RGB uint8 image [H, W, 3] as PNG (PyAV's png encoder, as for the MP4s)."""
    import av

    image = np.ascontiguousarray(image, dtype=np.uint8)
    if image.ndim != 3 or image.shape[2] != 3:
        raise ValueError(f"expected an RGB image [H, W, 3], got shape {image.shape}")
    with av.open(str(path), mode="w", format="image2") as container:
        stream = container.add_stream("png")
        stream.height, stream.width = image.shape[:2]
        stream.pix_fmt = "rgb24"
        frame = av.VideoFrame.from_ndarray(image, format="rgb24")
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            container.mux(packet)
    return Path(path)


def contact_sheet(
    frames: np.ndarray, columns: int = 10, labels: list[str] | None = None, step: int = 1
) -> np.ndarray:
    """Tile every `step`-th frame of [T, H, W, 3] uint8 into one image [rows*H, columns*W, 3].

    `labels` (one per frame) are not drawn; callers print them alongside (logging).
    """
    chosen = frames[::step]
    count, height, width, _ = chosen.shape
    rows = -(-count // columns)
    sheet = np.full((rows * height, columns * width, 3), 255, dtype=np.uint8)
    for i, frame in enumerate(chosen):
        r, c = divmod(i, columns)
        sheet[r * height : (r + 1) * height, c * width : (c + 1) * width] = frame
        # a thin separator so single frames are easy to tell apart
        sheet[r * height : (r + 1) * height, c * width] = 255
        sheet[r * height, c * width : (c + 1) * width] = 255
    if labels:
        log.debug("contact sheet labels: %s", labels[::step])
    return sheet


def write_mp4(
    path: Path,
    frames: np.ndarray,
    fps: float,
    audio: np.ndarray | None = None,
    sample_rate: int = 22050,
) -> Path:
    """Write frames [T, H, W, 3] uint8 at `fps` and mono float32 PCM [N] (-1..1) as H.264/AAC.

    Both streams start at time 0, so frame i is shown at i / fps with audio sample
    i * sample_rate / fps: the timestamps the animation stage uses.
    """
    import av

    frames = np.asarray(frames, dtype=np.uint8)
    rate = Fraction(fps).limit_denominator(1001)
    with av.open(str(path), mode="w") as container:
        video = container.add_stream("libx264", rate=rate)
        video.width, video.height = frames.shape[2], frames.shape[1]
        video.pix_fmt = "yuv420p"
        video.options = {"crf": "20", "preset": "veryfast"}
        sound = None
        if audio is not None:
            sound = container.add_stream("aac", rate=sample_rate)
            sound.layout = "mono"
        for i, frame in enumerate(frames):
            out = av.VideoFrame.from_ndarray(frame, format="rgb24")
            out.pts = i
            out.time_base = 1 / rate
            container.mux(video.encode(out))
        container.mux(video.encode())
        if sound is not None:
            pcm = np.clip(np.asarray(audio, dtype=np.float32), -1.0, 1.0)[None, :]
            chunk_size = 1024
            for start in range(0, pcm.shape[1], chunk_size):
                piece = av.AudioFrame.from_ndarray(
                    np.ascontiguousarray(pcm[:, start : start + chunk_size]),
                    format="fltp",
                    layout="mono",
                )
                piece.sample_rate = sample_rate
                piece.pts = start
                piece.time_base = Fraction(1, sample_rate)
                container.mux(sound.encode(piece))
            container.mux(sound.encode())
    log.info("wrote %s: %d frames at %s fps", path, len(frames), fps)
    return Path(path)
