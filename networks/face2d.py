"""A 2D cartoon face drawn with tensor operations: ARKit-52 blendshapes -> RGB frames.

Every feature is a soft-edged implicit shape (ellipses, capsules, lip curves) evaluated on
a pixel grid and composited back to front, so the whole renderer is a static graph of
elementwise ops that exports to ONNX with a dynamic batch axis and builds as a TensorRT
engine. Inputs follow `avatar.animation.tables.ARKIT_NAMES`; the mouth aperture uses the
same formula as `avatar.animation.emotion.mouth_opening`.

Coordinates: x right, y down, both in [-1, 1] over the image; "Left" shapes belong to the
avatar's left, which is the image's right.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from avatar.animation.tables import ARKIT_INDEX

SKIN = (0.96, 0.80, 0.68)
SKIN_SHADE = (0.86, 0.66, 0.55)
HAIR = (0.25, 0.16, 0.12)
EYE_WHITE = (0.98, 0.98, 0.97)
IRIS = (0.25, 0.45, 0.65)
DARK = (0.12, 0.08, 0.08)
LIPS = (0.80, 0.38, 0.40)
MOUTH_INSIDE = (0.35, 0.08, 0.10)
TEETH = (0.97, 0.96, 0.92)
TONGUE = (0.88, 0.45, 0.48)
BLUSH = (0.95, 0.55, 0.55)
BACKGROUND_TOP, BACKGROUND_BOTTOM = (0.72, 0.82, 0.92), (0.55, 0.66, 0.80)


def _w(bs: Tensor, name: str) -> Tensor:
    """One blendshape as [B, 1, 1] for broadcasting over the pixel grid."""
    return bs[:, ARKIT_INDEX[name]].reshape(-1, 1, 1)


_COLORS: dict[tuple[float, float, float], Tensor] = {}


def _color(rgb: tuple[float, float, float]) -> Tensor:
    """A colour as a [3] constant (made once, so tracing sees no tensor construction)."""
    if rgb not in _COLORS:
        _COLORS[rgb] = torch.tensor(rgb, dtype=torch.float32)
    return _COLORS[rgb]


class Face2D(nn.Module):
    """Blendshapes [B, 52] (0..1) and head pose [B, 3] (yaw, pitch, roll; radians)
    -> frames [B, size, size, 3] uint8 RGB."""

    def __init__(self, size: int = 256):
        super().__init__()
        self.size = size
        axis = (torch.arange(size, dtype=torch.float32) + 0.5) / size * 2.0 - 1.0
        ys, xs = torch.meshgrid(axis, axis, indexing="ij")
        self.register_buffer("xs", xs[None], persistent=False)  # [1, H, W]
        self.register_buffer("ys", ys[None], persistent=False)
        top, bottom = _color(BACKGROUND_TOP), _color(BACKGROUND_BOTTOM)
        mix = ((ys + 1.0) / 2.0)[..., None]
        self.register_buffer("background", (top * (1 - mix) + bottom * mix)[None], persistent=False)
        self.edge = 0.8 / size  # anti-aliasing: the edge ramps over about two pixels

    # ----------------------------------------------------------------- shape helpers
    def _soft(self, distance: Tensor) -> Tensor:
        """Coverage 0..1 from a signed distance (negative inside), anti-aliased."""
        return torch.sigmoid(-distance / self.edge)

    @staticmethod
    def _ellipse(x: Tensor, y: Tensor, cx, cy, a, b) -> Tensor:  # noqa: PLR0917
        """Approximate signed distance to an ellipse (centre cx, cy; half-axes a, b)."""
        r = torch.sqrt(((x - cx) / a) ** 2 + ((y - cy) / b) ** 2 + 1e-8)
        scale = min(a, b) if not isinstance(b, Tensor) else torch.clamp(b, max=a)
        return (r - 1.0) * scale

    @staticmethod
    def _capsule(x: Tensor, y: Tensor, x0, y0, x1, y1, radius) -> Tensor:  # noqa: PLR0917
        """Signed distance to a segment (x0, y0)-(x1, y1) thickened by `radius`."""
        dx, dy = x1 - x0, y1 - y0
        t = (((x - x0) * dx + (y - y0) * dy) / (dx * dx + dy * dy + 1e-8)).clamp(0.0, 1.0)
        return torch.sqrt((x - x0 - t * dx) ** 2 + (y - y0 - t * dy) ** 2 + 1e-8) - radius

    @staticmethod
    def _paint(image: Tensor, mask: Tensor, rgb: tuple[float, float, float]) -> Tensor:
        """image [B, H, W, 3], mask [B, H, W] -> image with `rgb` painted over by mask."""
        m = mask[..., None]
        return image * (1.0 - m) + _color(rgb).to(image.dtype) * m

    # ---------------------------------------------------------------------- forward
    def forward(self, blendshapes: Tensor, head_pose: Tensor) -> Tensor:
        """blendshapes [B, 52] float32, head_pose [B, 3] float32 -> frames [B, H, W, 3] uint8."""
        bs = blendshapes.clamp(0.0, 1.0)
        yaw, pitch, roll = (head_pose[:, i].reshape(-1, 1, 1) for i in range(3))
        # Head motion: translate by yaw/pitch and rotate by roll about the neck.
        px, py = self.xs - yaw * 0.6, self.ys - pitch * 0.6 - 0.9
        cos, sin = torch.cos(roll), torch.sin(roll)
        x, y = cos * px + sin * py, -sin * px + cos * py + 0.9
        fx = x - yaw * 0.25  # features turn further than the outline (parallax)

        image = self.background.expand(bs.shape[0], -1, -1, -1)
        jaw = (_w(bs, "jawOpen") - _w(bs, "mouthClose")).clamp(min=0.0)
        neck = self._capsule(x, y, 0.0, 0.55, 0.0, 1.3, 0.22)
        image = self._paint(image, self._soft(neck), SKIN_SHADE)
        hair = self._ellipse(x, y, 0.0, -0.2, 0.7, 0.72)
        image = self._paint(image, self._soft(hair), HAIR)
        skull = self._ellipse(x, y, 0.0, -0.08, 0.6, 0.68)
        chin = self._ellipse(x, y, 0.0, 0.3 + 0.12 * jaw, 0.42, 0.38)
        ears = torch.minimum(
            self._ellipse(x, y, 0.6, 0.0, 0.08, 0.14), self._ellipse(x, y, -0.6, 0.0, 0.08, 0.14)
        )
        face = torch.minimum(torch.minimum(skull, chin), ears)
        image = self._paint(image, self._soft(face), SKIN)
        fringe = self._ellipse(x, y, 0.0, -0.72, 0.62, 0.3)
        image = self._paint(image, self._soft(fringe), HAIR)

        for side, sign in (("Left", 1.0), ("Right", -1.0)):
            image = self._eye(image, bs, fx, y, side, sign)
            image = self._brow(image, bs, fx, y, side, sign)
            cheek = self._ellipse(fx, y, sign * 0.33, 0.18 - 0.03 * _w(bs, f"cheekSquint{side}"),
                                  0.12, 0.07)  # fmt: skip
            blush = 0.15 + 0.45 * _w(bs, f"cheekSquint{side}")
            image = self._paint(image, self._soft(cheek) * blush, BLUSH)
        sneer = 0.5 * (_w(bs, "noseSneerLeft") + _w(bs, "noseSneerRight"))
        nose = self._ellipse(fx, y, 0.0, 0.12 - 0.03 * sneer, 0.07, 0.045 + 0.01 * sneer)
        image = self._paint(image, self._soft(nose), SKIN_SHADE)
        return self._mouth(image, bs, fx, y, jaw)

    def _eye(self, image: Tensor, bs: Tensor, x: Tensor, y: Tensor, side: str, sign: float):  # noqa: PLR0917
        cx, cy = sign * 0.25, -0.1
        openness = (
            1.0 - _w(bs, f"eyeBlink{side}") + 0.4 * _w(bs, f"eyeWide{side}")
            - 0.35 * _w(bs, f"eyeSquint{side}") - 0.2 * _w(bs, f"cheekSquint{side}")
        ).clamp(0.03, 1.4)  # fmt: skip
        white = self._ellipse(x, y, cx, cy, 0.12, 0.08 * openness)
        white_mask = self._soft(white)
        image = self._paint(image, white_mask, EYE_WHITE)
        gx = sign * (_w(bs, f"eyeLookOut{side}") - _w(bs, f"eyeLookIn{side}")) * 0.16
        gy = (_w(bs, f"eyeLookDown{side}") - _w(bs, f"eyeLookUp{side}")) * 0.12
        iris = self._soft(self._ellipse(x, y, cx + gx, cy + gy, 0.055, 0.055)) * white_mask
        image = self._paint(image, iris, IRIS)
        pupil = self._soft(self._ellipse(x, y, cx + gx, cy + gy, 0.025, 0.025)) * white_mask
        image = self._paint(image, pupil, DARK)
        lash = self._soft(white.abs() - 0.008) * self._soft(y - cy - 0.02)  # upper lid line
        return self._paint(image, lash, DARK)

    def _brow(self, image: Tensor, bs: Tensor, x: Tensor, y: Tensor, side: str, sign: float):  # noqa: PLR0917
        down, inner = _w(bs, f"browDown{side}"), _w(bs, "browInnerUp")
        outer = _w(bs, f"browOuterUp{side}")
        y_inner = -0.3 - 0.1 * inner + 0.08 * down
        y_outer = -0.32 - 0.1 * outer + 0.02 * down
        brow = self._capsule(x, y, sign * 0.12, y_inner, sign * 0.36, y_outer, 0.025)
        return self._paint(image, self._soft(brow), HAIR)

    def _mouth(self, image: Tensor, bs: Tensor, x: Tensor, y: Tensor, jaw: Tensor) -> Tensor:
        def pair(stem: str) -> Tensor:
            return 0.5 * (_w(bs, f"{stem}Left") + _w(bs, f"{stem}Right"))

        smile, frown, stretch = pair("mouthSmile"), pair("mouthFrown"), pair("mouthStretch")
        press, dimple = pair("mouthPress"), pair("mouthDimple")
        lower_down, upper_up = pair("mouthLowerDown"), pair("mouthUpperUp")
        pucker, funnel = _w(bs, "mouthPucker"), _w(bs, "mouthFunnel")
        lips_apart = 0.5 * (lower_down + upper_up)
        aperture = ((jaw + 0.5 * lips_apart) * (1.0 - press)).clamp(min=0.0)  # = mouth_opening

        shift = 0.08 * (_w(bs, "mouthLeft") - _w(bs, "mouthRight") + _w(bs, "jawLeft")
                        - _w(bs, "jawRight"))  # fmt: skip
        half_width = 0.2 * (
            1.0 + 0.3 * smile + 0.3 * stretch + 0.1 * dimple - 0.45 * pucker - 0.3 * funnel
        ).clamp(min=0.35)
        my = 0.36 + 0.05 * jaw - 0.02 * _w(bs, "mouthShrugLower")
        xn = ((x - shift) / half_width).clamp(-1.5, 1.5)
        across = (1.0 - xn * xn).clamp(min=0.0)
        curve = 0.07 * (smile - frown)  # corners up when smiling
        centre = my - curve * xn * xn
        arch = torch.sqrt(across + 1e-6)
        roundness = 1.0 + 0.8 * (funnel + pucker)  # rounder, taller opening for o/u
        up = (0.3 * aperture * 0.35 + 0.03 * upper_up) * roundness * arch
        low = (0.3 * aperture * 0.65 + 0.03 * lower_down) * roundness * arch
        thick_up = 0.035 * (1 + 0.6 * pucker + 0.3 * funnel - 0.6 * _w(bs, "mouthRollUpper"))
        thick_low = 0.045 * (1 + 0.6 * pucker - 0.6 * _w(bs, "mouthRollLower"))
        taper = across**0.3 * (1.0 - 0.5 * press)
        inside_x = self._soft(xn.abs() - 1.0)
        lips = (
            inside_x
            * self._soft(centre - up - thick_up * taper - y)
            * self._soft(y - centre - low - thick_low * taper)
        )
        image = self._paint(image, lips, LIPS)
        cavity = inside_x * self._soft(centre - up - y) * self._soft(y - centre - low)
        image = self._paint(image, cavity, MOUTH_INSIDE)
        teeth = cavity * self._soft(y - (centre - up + 0.035)) * self._soft(xn.abs() - 0.7)
        image = self._paint(image, teeth, TEETH)
        tongue_out = _w(bs, "tongueOut")
        tongue = self._soft(self._ellipse(x, y, shift, centre + low, 0.1, 0.03 + 0.06 * tongue_out))
        image = self._paint(image, tongue * cavity.clamp(min=tongue_out), TONGUE)
        line = inside_x * self._soft((y - centre).abs() - 0.006 * (1.0 - aperture * 8).clamp(0, 1))
        image = self._paint(image, line, DARK)
        return (image.clamp(0.0, 1.0) * 255.0).round().to(torch.uint8)
