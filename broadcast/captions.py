"""The viewer's question drawn on the stream: a band across the bottom of the frame with the
attribution ("Ada asks: ...") wrapped to fit, drawn once per question (Pillow) and laid over
each frame with numpy (only the band's rows are touched)."""

from __future__ import annotations

import dataclasses
import textwrap

import numpy as np

BAND_SHARE = 0.2  # of the frame's height, at the bottom
MAX_LINES = 3
BAND_COLOUR = (16, 16, 24)
BAND_OPACITY = 0.72
TEXT_COLOUR = (255, 255, 255)


@dataclasses.dataclass(frozen=True)
class Caption:
    """A drawn caption: rows `top`.. of a frame get `rgb` [h, W, 3] by `alpha` [h, W, 1]."""

    text: str
    top: int
    rgb: np.ndarray
    alpha: np.ndarray

    def __post_init__(self) -> None:
        # the blend in integers, out of 256 (uint16 holds 255 * 256): 0.8 ms a 512 x 512
        # frame, copy included, where float32 took 4 ms (25 a second; docs/broadcast.md)
        weight = np.rint(self.alpha * 256).astype(np.uint16)
        object.__setattr__(self, "_keep", np.uint16(256) - weight)
        object.__setattr__(self, "_ink", np.rint(self.rgb * weight).astype(np.uint16))

    def over(self, frame: np.ndarray) -> np.ndarray:
        """`frame` [H, W, 3] uint8 with the caption laid over it (a new array)."""
        out = frame.copy()
        band = out[self.top :].astype(np.uint16)
        band *= self._keep
        band += self._ink
        out[self.top :] = band >> 8
        return out


def draw_caption(text: str, width: int, height: int) -> Caption:
    """`text` as a caption band for frames of `width` x `height`, wrapped to at most
    MAX_LINES lines (the rest elided)."""
    from PIL import Image, ImageDraw, ImageFont

    band_h = max(24, round(height * BAND_SHARE))
    font_px = max(10, band_h // (MAX_LINES + 1))
    font = ImageFont.load_default(size=font_px)  # Pillow's bundled font: no system fonts
    margin = font_px // 2
    chars = max(8, int((width - 2 * margin) / (font_px * 0.55)))
    lines = textwrap.wrap(" ".join(text.split()), chars, max_lines=MAX_LINES, placeholder=" ...")
    image = Image.new("L", (width, band_h), 0)
    draw = ImageDraw.Draw(image)
    for i, line in enumerate(lines):
        draw.text((margin, margin // 2 + i * int(font_px * 1.2)), line, fill=255, font=font)
    ink = np.asarray(image, np.float32)[..., None] / 255.0
    rgb = ink * np.array(TEXT_COLOUR, np.float32) + (1 - ink) * np.array(BAND_COLOUR, np.float32)
    alpha = np.maximum(ink, BAND_OPACITY)
    return Caption(text, height - band_h, rgb.astype(np.float32), alpha.astype(np.float32))
