"""A photo portrait that talks: ARKit-52 blendshapes + head pose -> RGB frames of the photo.

The rig (`export.portrait.rig`) gives rest vertices over the photo, their offsets per
blendshape and how much each follows a head turn. Per frame:

    vertices = rest + blendshapes @ offsets, turned about the neck      [B, V, 2]
    displacement fields on a grid of rest positions every 4 px (barycentric), one per layer:
      the face seen from above the lips and from below them (`split_at_lips`)  [2B, 2, G, G]
    backward maps by fixed-point iteration: source = pixel - field(source)
    the photo sampled bilinearly at the upsampled map, only in the region the mesh can move
    in the mouth box: the lower layer below the lips' meeting line, and the mouth interior
      (cavity, shaded teeth with gaps and a gum line, tongue) painted between the inner lips
    in the eye box: the same lower layer (there: the eye, unmoved) below the posed upper
      lids, so a closing lid covers the eye instead of squeezing it (`split_at_eyes`)

Every op is a Gather, MatMul, GridSample, Resize or elementwise op with fixed shapes but the
batch, so the graph exports to ONNX with a dynamic batch axis and builds in TensorRT.
Coordinates are pixels of the S x S photo, pixel centres at integers (align_corners=True).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812
from torch import Tensor, nn

GRID_STEP = 4  # px between displacement-field samples: features move smoothly over 4 px
ITERATIONS = 4  # fixed-point steps of the backward map (each shrinks the error where the warp
# stretches less than 2x; the quality checks in export/portrait/quality.py hold at 4)
# Teeth counted from the middle of the mouth at x = |a - width/2| / (width/2):
# tooth(x) = x * (TOOTH_SLOPE + TOOTH_CURVE * x) puts the edges of the central incisors at
# x = 0.3, the laterals at 0.5, the canines at 0.65 (narrower to the sides, as seen)
TOOTH_SLOPE, TOOTH_CURVE = 2.33, 3.33
LOWER_TEETH = 1.35  # lower incisors are narrower: their count per upper tooth


def barycentric(points: np.ndarray, vertices: np.ndarray, triangles: np.ndarray):
    """For each point [P, 2], the triangle that holds it: its vertex ids [P, 3] and
    barycentric weights [P, 3] (nearest triangle, clamped, for points outside all)."""
    a, b, c = (vertices[triangles[:, k], :2].astype(np.float64) for k in range(3))
    v0, v1 = b - a, c - a
    det = v0[:, 0] * v1[:, 1] - v0[:, 1] * v1[:, 0]
    det = np.where(np.abs(det) < 1e-9, 1e-9, det)
    ids = np.zeros((len(points), 3), np.int64)
    weights = np.zeros((len(points), 3), np.float32)
    for start in range(0, len(points), 2048):
        p = points[start : start + 2048, None, :].astype(np.float64) - a[None]
        w1 = (p[..., 0] * v1[:, 1] - p[..., 1] * v1[:, 0]) / det
        w2 = (v0[:, 0] * p[..., 1] - v0[:, 1] * p[..., 0]) / det
        w = np.stack([1 - w1 - w2, w1, w2], axis=-1)  # [chunk, F, 3]
        best = np.argmax(w.min(axis=-1), axis=1)  # inside: min weight >= 0
        chosen = np.clip(w[np.arange(len(best)), best], 0, None)
        ids[start : start + len(best)] = triangles[best]
        weights[start : start + len(best)] = chosen / chosen.sum(axis=1, keepdims=True)
    return ids, weights


def active_region(vertices, triangles, offsets, rigidity, size: int):
    """The box (x0, y0, x1, y1) of every triangle with a vertex that a blendshape or a
    head turn can move; outside it the frame is the photo. Multiples of 4."""
    moving = (rigidity > 0) | (np.abs(offsets).max(axis=(0, 2)) > 0)
    touched = triangles[moving[triangles].any(axis=1)]
    xy = vertices[np.unique(touched), :2]
    low = np.clip(np.floor(xy.min(axis=0) / 4) * 4, 0, size)
    high = np.clip(np.ceil((xy.max(axis=0) + 1) / 4) * 4, 0, size)
    return (int(low[0]), int(low[1]), int(high[0]), int(high[1]))


def _interp(a: Tensor, xs: Tensor, ys: Tensor) -> Tensor:
    """Piecewise-linear y(a) through the points (xs [B, K], ys [B, K, C]), clamped at both
    ends: a [B, P] -> [B, P, C]. A sum of ramps (elementwise in ONNX), summed by a MatMul:
    ONNX Runtime's Mul + ReduceSum over the K-1 ramps took twice as long."""
    seg = torch.clamp(xs[:, 1:] - xs[:, :-1], min=1e-3)  # [B, K-1]
    slope = (ys[:, 1:] - ys[:, :-1]) / seg[..., None]  # [B, K-1, C]
    run = torch.minimum(torch.clamp(a[..., None] - xs[:, None, :-1], min=0.0), seg[:, None])
    return ys[:, None, 0] + run @ slope


class PortraitRenderer(nn.Module):
    """Blendshapes [B, 52] (0..1) and head pose [B, 3] (yaw, pitch, roll; radians, used
    within +-0.5) -> frames [B, S, S, 3] uint8 RGB of the rigged photo."""

    def __init__(
        self,
        *,
        photo: np.ndarray,  # [S, S, 3] uint8
        vertices: np.ndarray,  # [V, 3]
        triangles: np.ndarray,  # [F, 3]
        offsets: np.ndarray,  # [52, V, 3]
        layer_offsets: np.ndarray,  # [2, 52, V, 3]: continued across the lips from above/below
        rigidity: np.ndarray,  # [V]
        pivot: np.ndarray,  # [3]
        mouth_upper: tuple[int, ...],  # inner-lip vertex ids, corner to corner
        mouth_lower: tuple[int, ...],
        mouth_box: tuple[int, int, int, int],  # x0, y0, x1, y1
        eye_box: tuple[int, int, int, int],  # both eyes: where the lids cover the eye layer
        eye_upper: tuple[int, ...],  # both upper lids' ids, x ascending
        teeth: float,  # px of upper teeth in a wide-open mouth
        colors: dict[str, tuple[int, int, int]],  # cavity, teeth, tongue, gum
        iterations: int = ITERATIONS,
    ):
        super().__init__()
        size = photo.shape[0]
        assert photo.shape == (size, size, 3), f"photo must be square RGB, got {photo.shape}"
        assert offsets.shape == (52, len(vertices), 3), f"offsets {offsets.shape}"
        self.size, self.iterations = size, iterations
        self.count = len(vertices)
        self.teeth = float(teeth)
        self.box = tuple(int(v) for v in mouth_box)
        self.eye_box = tuple(int(v) for v in eye_box)
        f32 = lambda a: torch.as_tensor(np.asarray(a, np.float32))  # noqa: E731
        self.register_buffer("rest", f32(vertices))
        self.register_buffer("offsets", f32(offsets).reshape(52, -1))
        self.register_buffer("layer_offsets", f32(layer_offsets).reshape(2, 52, -1))
        self.register_buffer("rigidity", f32(rigidity)[:, None])
        self.register_buffer("pivot", f32(pivot))
        self.register_buffer("upper", torch.as_tensor(mouth_upper, dtype=torch.int64))
        # per column of the inner lips, the photo's own opening: a photo with parted lips
        # keeps its teeth (upper half with the upper lip, lower half with the lower one)
        gaps = np.linalg.norm(
            vertices[list(mouth_lower), :2] - vertices[list(mouth_upper), :2], axis=1
        )
        self.register_buffer("rest_gaps", f32(gaps)[None])  # [1, K]
        self.register_buffer("lower", torch.as_tensor(mouth_lower, dtype=torch.int64))
        self.register_buffer("eye_upper", torch.as_tensor(eye_upper, dtype=torch.int64))
        for name in ("cavity", "teeth", "tongue", "gum"):
            self.register_buffer(f"{name}_rgb", f32(colors[name]).reshape(3, 1, 1))

        # Only the region the mesh can move is warped; the rest of the frame is the photo.
        self.region = active_region(vertices, triangles, offsets, rigidity, size)
        rx0, ry0, rx1, ry1 = self.region
        self.grid_shape = (max(2, (ry1 - ry0 - 1) // GRID_STEP + 1),
                           max(2, (rx1 - rx0 - 1) // GRID_STEP + 1))  # fmt: skip
        rows = np.linspace(ry0, ry1 - 1.0, self.grid_shape[0])
        gy, gx = np.meshgrid(rows, np.linspace(rx0, rx1 - 1.0, self.grid_shape[1]), indexing="ij")
        points = np.stack([gx.ravel(), gy.ravel()], axis=1)
        ids, weights = barycentric(points, vertices, triangles)
        # the barycentric interpolation as one dense MatMul [G, V]: ONNX Runtime ran the
        # gather-multiply-sum version 4x slower (a ReduceSum over 3 corners of 2 values)
        interpolate = np.zeros((len(points), len(vertices)), np.float32)
        np.add.at(interpolate, (np.arange(len(points))[:, None], ids), weights)
        self.register_buffer("grid_interpolation", f32(interpolate))
        self.register_buffer("grid_points", f32(points.reshape(1, *self.grid_shape, 2)))
        self.register_buffer("grid_origin", f32([rx0, ry0]))
        self.register_buffer("grid_scale", f32([2.0 / (rx1 - 1 - rx0), 2.0 / (ry1 - 1 - ry0)]))
        ys, xs = np.mgrid[ry0:ry1, rx0:rx1].astype(np.float32)
        self.register_buffer("pixels", f32(np.stack([xs, ys], axis=-1))[None])  # [1, h, w, 2]
        # each texel row holds a pixel and its right neighbour: 2 Gathers per bilinear sample
        pairs = np.concatenate([photo, np.concatenate([photo[:, 1:], photo[:, -1:]], 1)], -1)
        self.register_buffer("texels", f32(pairs).reshape(size * size, 6))
        self.register_buffer("photo_u8", torch.as_tensor(np.array(photo, np.uint8))[None])
        # the lower layer is sampled in the mouth box, then the eye box: [1, P_mouth + P_eye, 2]
        boxed = []
        for bx0, by0, bx1, by1 in (self.box, self.eye_box):
            assert rx0 <= bx0 and ry0 <= by0 and bx1 <= rx1 and by1 <= ry1, "box outside region"
            bys, bxs = np.mgrid[by0:by1, bx0:bx1].astype(np.float32)
            boxed.append(np.stack([bxs.ravel(), bys.ravel()], 1))
        assert self.eye_box[3] <= self.box[1], "the eye box reaches into the mouth box"
        self.mouth_count = len(boxed[0])
        ex0, ey0, ex1, ey1 = self.eye_box
        self.register_buffer("eye_columns", torch.arange(ex0, ex1, dtype=torch.float32)[None])
        self.register_buffer("eye_rows", torch.arange(ey0, ey1, dtype=torch.float32)[:, None])
        self.register_buffer("box_pixels", f32(np.concatenate(boxed))[None])

    def posed_vertices(
        self, blendshapes: Tensor, head_pose: Tensor, offsets: Tensor | None = None
    ) -> Tensor:
        """Rest + weighted offsets [52, V*3] (default: the rig's), turned about the pivot
        by each vertex's rigidity -> [B, V, 2] pixel positions."""
        batch = blendshapes.shape[0]
        offsets = self.offsets if offsets is None else offsets
        moved = self.rest + (blendshapes @ offsets).reshape(batch, self.count, 3)
        rel = moved - self.pivot
        x, y, z = rel[..., 0], rel[..., 1], rel[..., 2]
        cos, sin = torch.cos(head_pose)[:, :, None], torch.sin(head_pose)[:, :, None]
        # yaw about the vertical axis, pitch about the horizontal, roll in the image plane
        x1 = x * cos[:, 0] - z * sin[:, 0]
        z1 = x * sin[:, 0] + z * cos[:, 0]
        y2 = y * cos[:, 1] + z1 * sin[:, 1]
        x3 = x1 * cos[:, 2] - y2 * sin[:, 2]
        y3 = x1 * sin[:, 2] + y2 * cos[:, 2]
        turned = torch.stack([x3, y3], dim=-1) + self.pivot[:2]
        return moved[..., :2] + self.rigidity * (turned - moved[..., :2])

    def forward(self, blendshapes: Tensor, head_pose: Tensor) -> Tensor:
        batch, (gh, gw) = blendshapes.shape[0], self.grid_shape
        # NaN -> 0 and weights/angles into their ranges: a NaN coordinate would become an
        # undefined Gather index, and an engine does not check values
        blendshapes = torch.where(torch.isnan(blendshapes), 0.0, blendshapes).clamp(0.0, 1.0)
        head_pose = torch.where(torch.isnan(head_pose), 0.0, head_pose).clamp(-0.5, 0.5)
        posed = self.posed_vertices(blendshapes, head_pose)
        layers = torch.cat([
            self.posed_vertices(blendshapes, head_pose, self.layer_offsets[0]),
            self.posed_vertices(blendshapes, head_pose, self.layer_offsets[1]),
        ]) - self.rest[:, :2]  # fmt: skip  # [2B, V, 2]: above the lips, then below
        columns = layers.permute(1, 0, 2).reshape(self.count, 4 * batch)  # [V, 2B * 2]
        field = (self.grid_interpolation @ columns).reshape(gh, gw, 2 * batch, 2)
        field = field.permute(2, 3, 0, 1)  # [2B, 2, gh, gw]
        # backward maps: the rest position each output pixel comes from, per layer
        source = self.grid_points.expand(2 * batch, gh, gw, 2)
        for _ in range(self.iterations):
            back = F.grid_sample(field, self._grid_unit(source), align_corners=True,
                                 padding_mode="border")  # fmt: skip
            source = self.grid_points - back.permute(0, 2, 3, 1)
        above, below = back[:batch], back[batch:]
        height, width = self.pixels.shape[1:3]
        full = F.interpolate(above, size=(height, width), mode="bilinear", align_corners=True)
        image = self._sample_photo(self.pixels - full.permute(0, 2, 3, 1))  # [3, B, h, w]
        # the lower layer only where it can differ: the mouth box
        points = self.box_pixels[:, None].expand(batch, -1, -1, -1)  # [B, 1, P, 2]
        moved = F.grid_sample(below, self._grid_unit(points), align_corners=True,
                              padding_mode="border")  # fmt: skip
        lower = self._sample_photo(points - moved.permute(0, 2, 3, 1))[:, :, 0]  # [3, B, P]
        mouth = self._paint_mouth(image, lower[..., : self.mouth_count], posed)
        eyes = self._cover_eyes(image, lower[..., self.mouth_count :], posed)
        image = _put(image, (eyes, self.eye_box), (mouth, self.box), origin=self.region[:2])
        image = image.clamp(0.0, 255.0).round().to(torch.uint8).permute(1, 2, 3, 0)
        return self._paste(image, batch)

    def _grid_unit(self, xy: Tensor) -> Tensor:
        """Pixel coordinates -> grid_sample's [-1, 1] over the displacement grid."""
        return (xy - self.grid_origin) * self.grid_scale - 1.0

    def _sample_photo(self, xy: Tensor) -> Tensor:
        """Bilinear photo colours at pixel positions [B, h, w, 2] -> planar [3, B, h, w].
        Two Gathers of pixel pairs instead of a GridSample (ONNX Runtime's CPU GridSample
        took 60 % of a frame), then planar, so each blend broadcasts over whole rows.
        Clamped to the photo (the border repeats, as padding_mode="border")."""
        s = self.size
        x = xy[..., 0].clamp(0.0, s - 1.0)
        y = xy[..., 1].clamp(0.0, s - 1.0)
        x0 = torch.floor(x).clamp(max=s - 2.0)
        y0 = torch.floor(y).clamp(max=s - 2.0)
        fx, fy = x - x0, y - y0
        index = (y0 * s + x0).to(torch.int64)
        flat = index.reshape(-1)
        shape = (6, *index.shape)
        top = self.texels[flat].T.reshape(shape)  # planar: 6 rows of [B, h, w]
        bottom = self.texels[flat + s].T.reshape(shape)
        upper = top[:3] + (top[3:] - top[:3]) * fx
        lower = bottom[:3] + (bottom[3:] - bottom[:3]) * fx
        return upper + (lower - upper) * fy

    def _paste(self, region: Tensor, batch: int) -> Tensor:
        """The warped region [B, h, w, 3] uint8 back into the photo -> [B, S, S, 3]."""
        rx0, ry0, rx1, ry1 = self.region
        photo = self.photo_u8.expand(batch, -1, -1, -1)
        row = torch.cat([photo[:, ry0:ry1, :rx0], region, photo[:, ry0:ry1, rx1:]], dim=2)
        return torch.cat([photo[:, :ry0], row, photo[:, ry1:]], dim=1)

    def _paint_mouth(self, image: Tensor, lower: Tensor, posed: Tensor) -> Tensor:
        """The mouth box of the region [3, B, h, w] -> [3, B, mh, mw]: the lower layer
        `lower` [3, B, P] below the line where the lips meet, then cavity, tongue, teeth and
        gum between the inner lips.

        In the mouth's frame (a along the corner-to-corner axis, b across it, down), the
        upper and lower inner lips are curves b_u(a), b_l(a); the interior is b_u < b < b_l
        where the lips are further apart than at rest. The photo's own interior at rest (its
        half-opening per column, `keep`) stays next to each lip; the paint fills what the
        jaw opened beyond it. The page's shader draws the same."""
        x0, y0, x1, y1 = self.box
        up, lo = posed[:, self.upper], posed[:, self.lower]  # [B, K, 2]
        start, end = (up[:, 0] + lo[:, 0]) / 2, (up[:, -1] + lo[:, -1]) / 2
        width = torch.linalg.vector_norm(end - start, dim=-1, keepdim=True).clamp(min=1.0)
        along = (end - start) / width  # [B, 2]
        across = torch.stack([-along[:, 1], along[:, 0]], dim=-1)

        def frame(p: Tensor) -> tuple[Tensor, Tensor]:
            rel = p - start[:, None]
            return (rel * along[:, None]).sum(-1), (rel * across[:, None]).sum(-1)

        a, b = frame(self.box_pixels[:, : self.mouth_count])  # [B, P]
        au, bu_pts = frame(up)
        al, bl_pts = frame(lo)
        # the upper lip and the photo's opening per column share the upper lip's columns
        rest_gaps = self.rest_gaps.expand_as(bu_pts)  # [B, K]
        upper = _interp(a, au, torch.stack([bu_pts, rest_gaps], dim=-1))
        b_up, rest = upper[..., 0], upper[..., 1]  # rest: the photo's opening here
        b_low = _interp(a, al, bl_pts[..., None])[..., 0]
        gap = b_low - b_up
        keep = rest / 2  # the photo's own interior kept next to each lip
        opened = torch.clamp((gap - rest - 0.5) / 1.5, 0.0, 1.0)
        inside = (
            torch.clamp(b - b_up - keep + 0.5, 0.0, 1.0)
            * torch.clamp(b_low - keep - b + 0.5, 0.0, 1.0)
            * opened
        )
        depth = torch.clamp((b - b_up) / gap.clamp(min=1.0), 0.0, 1.0)
        centre = a - width / 2
        lateral = torch.clamp((0.36 * width - centre.abs()) / 2.0 + 0.5, 0.0, 1.0)
        tongue_y = (b - (b_low - 0.2 * gap)) / (0.35 * gap).clamp(min=1.0)
        tongue = torch.clamp(4.0 * (1.0 - (centre / (0.32 * width)) ** 2 - tongue_y**2), 0.0, 1.0)
        shade = 0.55 + 0.9 * (depth - 0.5).abs()
        color = self.cavity_rgb * shade  # [3, B, P]
        color = color + (self.tongue_rgb - color) * tongue
        # teeth: a template drawn here. Per tooth a seam (1 between two teeth, 0 in a
        # tooth's middle) darkens the gaps and rounds the tips; the lips shade the teeth
        # next to them, the lower teeth lie in the upper ones' shadow, all darker to the sides
        x = centre.abs() / (width / 2)
        tooth = x * (TOOTH_SLOPE + TOOTH_CURVE * x)
        side = (1.0 - 0.35 * (centre / (0.4 * width)) ** 2).clamp(min=0.5)
        seam = _seam(tooth)
        # a wide-open mouth shows a band of gum above the upper teeth, dipping between them
        gum = torch.clamp(0.5 * (0.45 * gap - self.teeth), 0.0, 0.3 * self.teeth)
        gum = gum * torch.clamp(1.0 - keep, 0.0, 1.0)  # not under a photo's own teeth
        down = b - b_up - keep  # from the upper lip (or the photo's own upper teeth)
        for teeth_seam, length, from_lip, light in (
            (seam, torch.clamp(torch.clamp(0.45 * gap, max=self.teeth) - keep, min=0.0),
             down - gum, side),
            (_seam(LOWER_TEETH * tooth),
             torch.clamp(torch.clamp(0.25 * gap, max=0.6 * self.teeth) - keep, min=0.0),
             b_low - keep - b, 0.78 * side),
        ):  # fmt: skip
            body, tint = _teeth(teeth_seam, length, from_lip, light)
            color = color + (self.teeth_rgb * tint - color) * body * lateral
        gums = torch.clamp(gum * (1.0 + 0.6 * seam * seam) - down + 0.5, 0.0, 1.0)
        color = color + (self.gum_rgb * side - color) * gums * lateral
        rx0, ry0 = self.region[:2]
        batch, h, w = image.shape[1], y1 - y0, x1 - x0
        x0, x1, y0, y1 = x0 - rx0, x1 - rx0, y0 - ry0, y1 - ry0  # in the region
        box = image[:, :, y0:y1, x0:x1].reshape(3, batch, h * w)
        below = torch.clamp(b - (b_up + b_low) / 2 + 0.5, 0.0, 1.0)
        box = box + (lower - box) * below
        return (box + (color - box) * inside).reshape(3, batch, h, w)

    def _cover_eyes(self, image: Tensor, lower: Tensor, posed: Tensor) -> Tensor:
        """The eye box of the region [3, B, h, w] -> [3, B, eh, ew]: the eye layer `lower`
        [3, B, P] below each eye's posed upper lid, the lid layer (`image`) above it."""
        x0, y0, x1, y1 = self.eye_box
        rx0, ry0 = self.region[:2]
        batch, h, w = image.shape[1], y1 - y0, x1 - x0
        # both upper lids as one line, x ascending (across the nose, where the layers
        # agree), once per column of the box
        lids = posed[:, self.eye_upper]  # [B, 2K, 2]
        line = _interp(self.eye_columns, lids[..., 0], lids[..., 1:])[..., 0]  # [B, w]
        under = torch.clamp(self.eye_rows - line[:, None] + 0.5, 0.0, 1.0)  # [B, h, w]
        box = image[:, :, y0 - ry0 : y1 - ry0, x0 - rx0 : x1 - rx0]
        return box + (lower.reshape(3, batch, h, w) - box) * under


def _teeth(seam: Tensor, length: Tensor, from_lip: Tensor, light: Tensor) -> tuple[Tensor, Tensor]:
    """One row of teeth `length` px from its lip (`from_lip`: px of a pixel from that
    lip, into the mouth) -> (coverage, shade): tips rounded and gaps dark by the `seam`,
    darker next to the lip (its shadow) and by `light`."""
    seam2 = seam * seam
    seam8 = seam2 * seam2 * seam2 * seam2
    body = torch.clamp(length * (1.0 - 0.2 * seam2) - from_lip + 0.5, 0.0, 1.0)
    shadow = 0.72 + 0.28 * torch.clamp(from_lip / (0.5 * length + 1.0), 0.0, 1.0)
    return body, light * shadow * (1.0 - 0.1 * seam - 0.35 * seam8)


def _seam(tooth: Tensor) -> Tensor:
    """1 where `tooth` (teeth counted from the middle) is a whole number, 0 halfway."""
    return 0.5 + 0.5 * torch.cos(2.0 * np.pi * tooth)


def _put(image: Tensor, *boxes: tuple[Tensor, tuple[int, ...]], origin: tuple[int, int]) -> Tensor:
    """`image` [C, B, H, W] (its pixel 0, 0 at `origin` of the photo) with each box
    [C, B, h, w] in place at its (x0, y0, x1, y1), boxes given top to bottom in rows that do
    not overlap: one concatenation of rows (no in-place writes in the graph)."""
    rows, top = [], 0
    for box, corners in boxes:
        x0, y0, x1, y1 = np.subtract(corners, origin * 2).tolist()
        assert y0 >= top, "boxes overlap in rows"
        band = image[:, :, y0:y1]
        rows += [image[:, :, top:y0], torch.cat([band[..., :x0], box, band[..., x1:]], dim=3)]
        top = y1
    return torch.cat([*rows, image[:, :, top:]], dim=2)
