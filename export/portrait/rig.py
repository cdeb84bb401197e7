"""The portrait rig: one photo -> a triangulated mesh with per-blendshape vertex offsets.

    photo ─► FaceMesh (478 landmarks) ─► square crop around the face, landmarks again
          ─► vertices: the 478 landmarks, two rings around the face, the image border
          ─► Delaunay triangles over them (the background is meshed too, so the head can
             move and the jaw can drop without tearing the image)
          ─► offsets [52, V, 3]: where each vertex moves at weight 1 of each ARKit shape

Offsets are drawn by hand-made fields in a face frame (origin at the mouth centre, x from
the subject's right eye to the left eye, y down, unit = the distance between the eyes), so
one rig recipe fits any frontal photo. ARKit_APPROXIMATIONS says how each shape is drawn.
The renderer (`networks.portrait`, the page's WebGL) adds the weighted offsets, turns the
head, and warps the photo; it paints the mouth interior between the inner lips itself.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from avatar.animation.tables import ARKIT_INDEX, ARKIT_NAMES
from evals import face_landmarks as lm

SIZE = 512  # rendered frames are SIZE x SIZE
FACE_HEIGHT_IN_CROP = 0.46  # forehead-to-chin / crop side: head, hair and neck in view
RING_SCALES = (1.2, 1.6)  # rings of vertices around the face oval (hair, ears, neck)
RING_RIGIDITY = (0.8, 0.0)  # how much of a head turn each ring follows
BORDER_STEP = 64  # px between fixed vertices on the image border
JAW_DROP = 0.32  # eye distances the lower lip moves at jawOpen = 1
LAYER_BAND = 0.3  # eye distances either side of the lips where the warp layers differ
TEETH_HEIGHT = 0.08  # eye distances of upper-teeth height in a wide-open mouth
BLINK = (0.9, 0.25)  # shares of the eye's opening the upper and the lower lid close
LASH_BAND = 0.06  # eye distances above the upper lid's edge that a blink moves rigidly
EYE_BAND = 0.12  # eye distances below the lower lid where the lid layer rejoins the face
# RGB 0..255: cavity, teeth, tongue and gum of the painted mouth interior
MOUTH_COLORS = {
    "cavity": (52, 16, 22),
    "teeth": (216, 208, 190),
    "tongue": (170, 78, 84),
    "gum": (178, 92, 96),
}

ARKIT_APPROXIMATIONS = {
    "jawOpen": "lower lip, chin and lower cheeks move down, most at the midline",
    "jawForward": "a small drop of the jaw (a 2D photo has no depth to push)",
    "jawLeft/Right": "the jaw field moved sideways",
    "mouthClose": "the lower-lip band moves back up by the jaw's drop (lips meet, jaw open)",
    "mouthFunnel": "the lips squeezed towards the centre by 45 % of their distance to it, "
    "parted round in the middle; the jaw stays",
    "mouthPucker": "the lips squeezed towards the centre by 33 % of their distance to it, "
    "closed and fuller",
    "mouthLeft/Right": "the mouth region shifted sideways",
    "mouthSmile*": "corner up and out, cheek up",
    "mouthFrown*": "corner down",
    "mouthDimple*": "corner pulled out",
    "mouthStretch*": "corner out and a little down",
    "mouthRollLower/Upper": "the outer lip edge turned in (thinner lip)",
    "mouthShrugLower/Upper": "lower lip and chin up / upper lip up",
    "mouthPress*": "upper and lower lip squeezed together on that side",
    "mouthLowerDown*/UpperUp*": "that side of the lower (upper) lip down (up)",
    "eyeBlink*": "upper lid to 80 % of the eye, lower lid 20 % up; the lid skin above "
    "stretches over the eye (the closed lid is the photo's own skin), which the server's "
    "warp draws over the eye as a layer of its own (eye_layers)",
    "eyeSquint*": "lower lid 30 % up, upper 10 % down",
    "eyeWide*": "upper lid 25 % up",
    "eyeLook*": "the iris moved inside the eye",
    "browDown*/browInnerUp/browOuterUp*": "brow regions down / up",
    "cheekPuff": "cheeks out",
    "cheekSquint*": "under-eye cheek up",
    "noseSneer*": "nose wing up",
    "tongueOut": "not drawn (the tongue stays in the mouth)",
}


@dataclasses.dataclass
class Rig:
    """Everything the renderers need; arrays in pixels of the SIZE x SIZE photo."""

    photo: np.ndarray  # [S, S, 3] uint8, the cropped portrait
    vertices: np.ndarray  # [V, 3] float32 rest positions: x, y px; z relative depth px
    triangles: np.ndarray  # [F, 3] int32
    offsets: np.ndarray  # [52, V, 3] float32, ARKit order
    # the same offsets continued smoothly across the lips from above [0] and below [1]:
    # the backward warp needs fields without the lips' jump (see split_at_lips)
    layer_offsets: np.ndarray  # [2, 52, V, 3] float32
    rigidity: np.ndarray  # [V] float32: 1 moves with the head, 0 stays (image border)
    pivot: np.ndarray  # [3] float32: centre of head rotation
    unit: float  # px between the eye centres
    mouth_box: tuple[int, int, int, int]  # x0, y0, x1, y1: where the interior can appear
    eye_box: tuple[int, int, int, int]  # both eyes: where the lid layer covers the eye
    rest_gap: float  # px between the inner lips in the photo, widest column

    @property
    def size(self) -> int:
        return int(self.photo.shape[0])

    def save(self, folder: Path) -> None:
        from PIL import Image

        folder = Path(folder)
        np.savez_compressed(
            folder / "rig.npz",
            **{f.name: np.asarray(getattr(self, f.name)) for f in dataclasses.fields(self)},
        )
        Image.fromarray(self.photo).save(folder / "photo.png")
        (folder / "rig.json").write_text(json.dumps(self.to_json(), separators=(",", ":")))

    @classmethod
    def load(cls, folder: Path) -> Rig:
        with np.load(Path(folder) / "rig.npz") as data:
            values = {f.name: data[f.name] for f in dataclasses.fields(cls)}
        values["unit"] = float(values["unit"])
        values["rest_gap"] = float(values["rest_gap"])
        values["mouth_box"] = tuple(int(v) for v in values["mouth_box"])
        values["eye_box"] = tuple(int(v) for v in values["eye_box"])
        return cls(**values)

    def to_json(self) -> dict:
        """The rig for the browser (gateway/static/portrait.js draws it with WebGL)."""
        return {
            "size": self.size,
            "unit": round(self.unit, 3),
            "names": list(ARKIT_NAMES),
            "vertices": np.round(self.vertices, 2).ravel().tolist(),
            "triangles": self.triangles.ravel().tolist(),
            # sparse: per shape, the moving vertices and their offsets
            "offsets": [_sparse(shape) for shape in self.offsets],
            "rigidity": np.round(self.rigidity, 3).tolist(),
            "pivot": np.round(self.pivot, 2).tolist(),
            "mouth": {
                "upper": list(lm.INNER_UPPER),
                "lower": list(lm.INNER_LOWER),
                "teeth": round(TEETH_HEIGHT * self.unit, 3),
                "colors": MOUTH_COLORS,
            },
        }


def _sparse(shape: np.ndarray, eps: float = 0.01) -> dict[str, list]:
    moving = np.flatnonzero(np.abs(shape).max(axis=1) > eps)
    return {"index": moving.tolist(), "xyz": np.round(shape[moving], 2).ravel().tolist()}


# --------------------------------------------------------------------------- building


def crop_portrait(image: np.ndarray, landmarks: np.ndarray, size: int = SIZE):
    """Square crop around the face (edge-padded where it leaves the photo), resized to
    size x size -> (crop [size, size, 3] uint8, the scale applied)."""
    from PIL import Image

    top, chin = landmarks[10, :2], landmarks[lm.CHIN, :2]
    face_height = float(np.linalg.norm(chin - top))
    side = round(face_height / FACE_HEIGHT_IN_CROP)
    centre = (top + chin) / 2 + np.array([0.0, 0.08 * side])  # a little neck below
    x0, y0 = (np.round(centre - side / 2)).astype(int)
    pad = side
    padded = np.pad(image[..., :3], ((pad, pad), (pad, pad), (0, 0)), mode="edge")
    crop = padded[y0 + pad : y0 + pad + side, x0 + pad : x0 + pad + side]
    resized = Image.fromarray(crop).resize((size, size), Image.Resampling.LANCZOS)
    return np.asarray(resized), size / side


class FaceFrame:
    """Face-local coordinates: origin at the mouth centre, x towards the subject's left
    eye, y down, in eye distances."""

    def __init__(self, landmarks: np.ndarray):
        right = landmarks[list(lm.RIGHT_EYE_UPPER + lm.RIGHT_EYE_LOWER), :2].mean(axis=0)
        left = landmarks[list(lm.LEFT_EYE_UPPER + lm.LEFT_EYE_LOWER), :2].mean(axis=0)
        self.unit = float(np.linalg.norm(left - right))
        self.ex = (left - right) / self.unit
        self.ey = np.array([-self.ex[1], self.ex[0]])
        self.origin = landmarks[list(lm.INNER_UPPER + lm.INNER_LOWER), :2].mean(axis=0)

    def local(self, xy: np.ndarray) -> np.ndarray:
        d = (xy[..., :2] - self.origin) / self.unit
        return np.stack([d @ self.ex, d @ self.ey], axis=-1)

    def to_image(self, d_local: np.ndarray) -> np.ndarray:
        """Local displacements [..., 2] -> image pixels [..., 2]."""
        return (d_local[..., :1] * self.ex + d_local[..., 1:2] * self.ey) * self.unit


def _polyline(points: np.ndarray):
    """y(x) of a polyline given as [K, 2] local points (clamped beyond its ends)."""
    order = np.argsort(points[:, 0])
    xs, ys = points[order, 0], points[order, 1]
    return lambda x: np.interp(x, xs, ys)


def _smooth(t: np.ndarray) -> np.ndarray:
    t = np.clip(t, 0.0, 1.0)
    return t * t * (3 - 2 * t)


class ShapeFields:
    """Per-vertex displacement fields in the face frame, one method per kind of motion."""

    def __init__(self, local: np.ndarray, marks: np.ndarray):
        """`local` [V, 2]: every vertex in the face frame; `marks` [478, 2] landmarks."""
        self.p = local
        self.marks = marks
        self.mid = _polyline((marks[list(lm.INNER_UPPER)] + marks[list(lm.INNER_LOWER)]) / 2)
        self.outer_upper = _polyline(marks[list(lm.OUTER_UPPER)])
        self.outer_lower = _polyline(marks[list(lm.OUTER_LOWER)])
        x, y = local[:, 0], local[:, 1]
        self.lower = y > self.mid(x)  # below the line where the lips meet
        self.lower[list(lm.MOUTH_CORNERS)] = False
        self.lower[list(lm.INNER_LOWER[1:-1] + lm.OUTER_LOWER[1:-1])] = True
        self.lower[list(lm.INNER_UPPER[1:-1] + lm.OUTER_UPPER[1:-1])] = False
        self.half_width = float(np.abs(marks[list(lm.MOUTH_CORNERS), 0]).max())
        self.chin_y = float(marks[lm.CHIN, 1])

    def at(self, index: int | tuple[int, ...]) -> np.ndarray:
        return self.marks[list(np.atleast_1d(index))].mean(axis=0)

    def bump(self, centre, radius, d, side: str = "all") -> np.ndarray:
        """A Gaussian bump of displacement `d` (local units) around `centre`."""
        r = np.asarray(radius, float) * np.ones(2)
        w = np.exp(-0.5 * (((self.p - centre) / r) ** 2).sum(axis=1))
        if side == "lower":
            w = w * self.lower
        elif side == "upper":
            w = w * ~self.lower
        return w[:, None] * np.asarray(d, float)

    def jaw(self) -> np.ndarray:
        """Weight [V] of the jaw's drop: 1 on the lower lip and chin, less at the sides,
        fading below the chin and above the corners of the mouth."""
        x, y = self.p[:, 0], self.p[:, 1]
        lateral = np.exp(-0.5 * (x / 0.75) ** 2)
        neck = np.clip(1.0 - (y - self.chin_y) / 0.6, 0.0, 1.0)
        # between the corners the lower side moves as one (the lips part); towards and
        # beyond the corners the cheek below the lips' line ramps in, so it does not tear
        between = 1.0 - _smooth((np.abs(x) - self.half_width + 0.25) / 0.25)
        vertical = np.maximum(between, _smooth((y - self.mid(x)) / 0.35)) * self.lower
        weight = lateral * neck * vertical
        weight[list(lm.MOUTH_CORNERS)] = 0.3 * lateral[list(lm.MOUTH_CORNERS)]
        return weight

    def lower_lip_band(self) -> np.ndarray:
        """1 on the lower lip, fading over the chin: what mouthClose lifts."""
        x, y = self.p[:, 0], self.p[:, 1]
        below = np.clip((y - self.outer_lower(x) - 0.03) / 0.25, 0.0, 1.0)
        return (1.0 - below) * self.lower

    def eye(self, upper_ids, lower_ids, close_upper: float, close_lower: float) -> np.ndarray:
        """Lids moving towards each other: the upper margin by `close_upper` of the eye's
        opening, the lower by `close_lower`; skin above and below follows, fading."""
        upper = _polyline(self.marks[list(upper_ids)])
        lower = _polyline(self.marks[list(lower_ids)])
        x, y = self.p[:, 0], self.p[:, 1]
        yu, yl = upper(x), lower(x)
        gap = np.clip(yl - yu, 0.0, None)  # 0 beyond the corners: no motion there
        t = np.clip((y - yu) / np.maximum(gap, 1e-6), 0.0, 1.0)
        between = (1 - t) * close_upper * gap - t * close_lower * gap
        # the lashes and the lid's edge move as one (LASH_BAND), the skin above stretches
        above = (
            close_upper * gap * np.clip(1.0 - (yu - y - LASH_BAND) / (0.35 - LASH_BAND), 0.0, 1.0)
        )
        below = -close_lower * gap * np.clip(1.0 - (y - yl) / 0.25, 0.0, 1.0)
        dy = np.where(y < yu, above, np.where(y > yl, below, between))
        return np.stack([np.zeros_like(dy), dy], axis=1)

    def eye_layers(
        self, upper_ids, lower_ids, close_upper: float, close_lower: float
    ) -> tuple[np.ndarray, np.ndarray]:
        """`eye`'s motion as two fields without its fold: (the lid: the upper lid and the
        skin above it, continued down over the eye, back to `eye` by EYE_BAND below the
        lower lid; the eye: unmoved under the upper lid, squeezed up by the lower lid).

        `eye` squeezes the eye between the lids to nothing at a full blink; a backward warp
        on a 4 px grid cannot draw that (the map jumps from the lid's skin to the lower lid
        across the eye, and the interpolated map in between samples the eye), so the server
        draws the lid layer above the posed upper lid and the eye layer below it."""
        upper = _polyline(self.marks[list(upper_ids)])
        lower = _polyline(self.marks[list(lower_ids)])
        x, y = self.p[:, 0], self.p[:, 1]
        yu, yl = upper(x), lower(x)
        gap = np.clip(yl - yu, 0.0, None)
        full = self.eye(upper_ids, lower_ids, close_upper, close_lower)[:, 1]
        t = _smooth((y - yu) / (gap + EYE_BAND))  # 0 at the upper lid .. 1 below the eye
        lid = np.where(y < yu, full, (1 - t) * close_upper * gap + t * full)
        s = np.clip((y - yu) / np.maximum(gap, 1e-6), 0.0, 1.0)
        eye = np.where(y < yu, 0.0, np.where(y > yl, full, -s * close_lower * gap))
        zero = np.zeros_like(lid)
        return np.stack([zero, lid], axis=1), np.stack([zero, eye], axis=1)

    def narrow(self, squeeze: float) -> np.ndarray:
        """The lips squeezed towards the mouth's centre line by `squeeze` of their
        distance from it (the corners by squeeze * half the mouth's width), fading over
        the cheeks beyond the corners and above and below the lips."""
        x, y = self.p[:, 0], self.p[:, 1]
        beyond = _smooth((np.abs(x) - self.half_width) / 0.35)
        above = _smooth((self.outer_upper(x) - y) / 0.3)
        below = _smooth((y - self.outer_lower(x)) / 0.3)
        weight = (1.0 - beyond) * (1.0 - above) * (1.0 - below)
        return np.stack([-squeeze * x * weight, np.zeros_like(x)], axis=1)


def shape_offsets(fields: ShapeFields) -> dict[str, np.ndarray]:
    """Local displacements [V, 2] per ARKit shape (the ones not listed stay zero)."""
    f, at = fields, fields.at
    jaw = f.jaw()[:, None] * np.array([0.0, JAW_DROP])
    side_of = {"Left": 1.0, "Right": -1.0}  # subject's left is +x
    corner = {"Left": at(291), "Right": at(61)}
    lip_side = {"Left": (at(312), at(317)), "Right": (at(82), at(87))}
    eyes = {
        "Left": (lm.LEFT_EYE_UPPER, lm.LEFT_EYE_LOWER, lm.LEFT_IRIS),
        "Right": (lm.RIGHT_EYE_UPPER, lm.RIGHT_EYE_LOWER, lm.RIGHT_IRIS),
    }
    brow = {"Left": lm.LEFT_BROW, "Right": lm.RIGHT_BROW}
    brow_outer = {"Left": lm.LEFT_BROW_OUTER, "Right": lm.RIGHT_BROW_OUTER}
    cheek = {"Left": lm.LEFT_CHEEK, "Right": lm.RIGHT_CHEEK}
    under_eye = {"Left": lm.LEFT_UNDER_EYE, "Right": lm.RIGHT_UNDER_EYE}
    nose_wing = {"Left": lm.LEFT_NOSE_WING, "Right": lm.RIGHT_NOSE_WING}
    mouth = at(lm.INNER_UPPER + lm.INNER_LOWER)
    out = {
        "jawOpen": jaw,
        "jawForward": 0.08 * jaw,
        "jawLeft": f.jaw()[:, None] * np.array([0.2, 0.0]),
        "jawRight": f.jaw()[:, None] * np.array([-0.2, 0.0]),
        "mouthClose": -jaw * f.lower_lip_band()[:, None],
        # narrowed by squeezing, not by the corners alone: a corner moved on its own
        # bunches the lip beside it and leaves the mouth as wide as the lips' middle
        "mouthFunnel": f.narrow(0.45)
        + f.bump(at(13), (0.12, 0.06), (0, -0.03), "upper")
        + f.bump(at(14), (0.12, 0.06), (0, 0.04), "lower"),
        "mouthPucker": f.narrow(0.33)
        + f.bump(at(0), (0.2, 0.05), (0, -0.015), "upper")
        + f.bump(at(17), (0.2, 0.05), (0, 0.02), "lower"),
        "mouthLeft": f.bump(mouth, (0.55, 0.3), (0.12, 0)),
        "mouthRight": f.bump(mouth, (0.55, 0.3), (-0.12, 0)),
        "mouthRollLower": f.bump(at(17), (0.35, 0.08), (0, -0.05), "lower"),
        "mouthRollUpper": f.bump(at(0), (0.35, 0.08), (0, 0.04), "upper"),
        "mouthShrugLower": f.bump(at(17), (0.5, 0.3), (0, -0.06), "lower"),
        "mouthShrugUpper": f.bump(at(0), (0.4, 0.15), (0, -0.04), "upper"),
        "browInnerUp": f.bump(at(lm.LEFT_BROW_INNER), 0.2, (0, -0.10))
        + f.bump(at(lm.RIGHT_BROW_INNER), 0.2, (0, -0.10)),
        "cheekPuff": f.bump(at(lm.LEFT_CHEEK), 0.3, (0.05, 0))
        + f.bump(at(lm.RIGHT_CHEEK), 0.3, (-0.05, 0)),
    }
    for side, sign in side_of.items():
        c = corner[side]
        up_lip, low_lip = lip_side[side]
        out[f"mouthSmile{side}"] = f.bump(c, 0.3, (0.10 * sign, -0.10)) + f.bump(
            at(cheek[side]), 0.35, (0.02 * sign, -0.04)
        )
        out[f"mouthFrown{side}"] = f.bump(c, 0.3, (0.03 * sign, 0.09))
        out[f"mouthDimple{side}"] = f.bump(c, 0.2, (0.06 * sign, 0))
        out[f"mouthStretch{side}"] = f.bump(c, 0.3, (0.10 * sign, 0.04))
        out[f"mouthPress{side}"] = f.bump(up_lip, 0.15, (0, 0.03), "upper") + f.bump(
            low_lip, 0.15, (0, -0.03), "lower"
        )
        out[f"mouthLowerDown{side}"] = f.bump(low_lip, (0.25, 0.2), (0, 0.12), "lower")
        out[f"mouthUpperUp{side}"] = f.bump(up_lip, (0.25, 0.15), (0, -0.10), "upper")
        upper, lower, iris = eyes[side]
        out[f"eyeBlink{side}"] = f.eye(upper, lower, *BLINK)
        out[f"eyeSquint{side}"] = f.eye(upper, lower, 0.1, 0.3)
        out[f"eyeWide{side}"] = f.eye(upper, lower, -0.25, 0.0)
        pupil = at(iris)
        towards_nose = -sign  # the subject's left eye looks in towards -x
        out[f"eyeLookUp{side}"] = f.bump(pupil, 0.07, (0, -0.05))
        out[f"eyeLookDown{side}"] = f.bump(pupil, 0.07, (0, 0.04))
        out[f"eyeLookIn{side}"] = f.bump(pupil, 0.07, (0.08 * towards_nose, 0))
        out[f"eyeLookOut{side}"] = f.bump(pupil, 0.07, (-0.08 * towards_nose, 0))
        out[f"browDown{side}"] = f.bump(at(brow[side]), (0.3, 0.15), (-0.03 * sign, 0.08))
        out[f"browOuterUp{side}"] = f.bump(at(brow_outer[side]), 0.22, (0, -0.09))
        out[f"cheekSquint{side}"] = f.bump(at(under_eye[side]), 0.25, (0, -0.04))
        out[f"noseSneer{side}"] = f.bump(at(nose_wing[side]), 0.15, (0, -0.05))
    unknown = set(out) - set(ARKIT_INDEX)
    assert not unknown, f"not ARKit shapes: {sorted(unknown)}"
    return out


def split_at_eyes(layers: np.ndarray, fields: ShapeFields, frame: FaceFrame) -> np.ndarray:
    """The blink shapes of `layers` [2, 52, V, 3] (split_at_lips') as ShapeFields.eye_layers:
    layer 0 the lid, layer 1 the eye; the renderer takes layer 1 below the posed upper lid
    in the eye box. Other shapes are the same in both layers there (no fold to split)."""
    eyes = {"Left": (lm.LEFT_EYE_UPPER, lm.LEFT_EYE_LOWER),
            "Right": (lm.RIGHT_EYE_UPPER, lm.RIGHT_EYE_LOWER)}  # fmt: skip
    for side, (upper, lower) in eyes.items():
        k = ARKIT_INDEX[f"eyeBlink{side}"]
        for layer, field in enumerate(fields.eye_layers(upper, lower, *BLINK)):
            layers[layer, k] = 0.0
            layers[layer, k, : len(fields.marks), :2] = frame.to_image(field[: len(fields.marks)])
    return layers


def split_at_lips(offsets: np.ndarray, fields: ShapeFields) -> np.ndarray:
    """[52, V, 3] -> [2, 52, V, 3]: the offsets seen from above the lips and from below.

    Where the jaw opens, the lower lip moves away from the upper one it touched, so the
    displacement field jumps across the line where the lips meet and a backward warp cannot
    be solved across it. Each layer replaces the other side's vertices near the mouth by a
    Gaussian-weighted average of its own side's offsets (a smooth continuation) within
    LAYER_BAND of the line; further away both layers equal `offsets`. The renderer warps
    with the upper layer above the lips' meeting line and with the lower layer below it."""
    x, y = fields.p[:, 0], fields.p[:, 1]
    lateral = 1.0 - _smooth((np.abs(x) - fields.half_width) / 0.3)
    beyond = (y - fields.mid(x)) / LAYER_BAND  # eye distances past the meeting line
    layers = np.repeat(offsets[None], 2, axis=0)
    for layer, own, sign in ((0, ~fields.lower, 1.0), (1, fields.lower, -1.0)):
        near = lateral * (1.0 - _smooth(sign * beyond))
        other = np.flatnonzero(~own & (near > 0))
        source = np.flatnonzero(own)
        d2 = ((fields.p[other, None] - fields.p[None, source]) ** 2).sum(-1)
        k = np.exp(-0.5 * d2 / 0.12**2)
        continued = np.einsum("vs,ksc->kvc", k, offsets[:, source]) / (
            k.sum(axis=1)[None, :, None] + 1e-3
        )
        z = near[other][None, :, None]
        layers[layer][:, other] = (1 - z) * offsets[:, other] + z * continued
    return layers


def _ring_and_border(marks: np.ndarray, size: int):
    """Vertices around the face (two scaled copies of its oval) and on the image border,
    with their rigidity; points closer than 6 px to an earlier one are dropped."""
    oval = marks[list(lm.FACE_OVAL), :3]
    centre = oval.mean(axis=0)
    points, rigidity = [], []
    for scale, rigid in zip(RING_SCALES, RING_RIGIDITY, strict=True):
        ring = centre + scale * (oval - centre)
        ring[:, 2] = centre[2]
        ring[:, :2] = np.clip(ring[:, :2], 0, size - 1)
        points.append(ring)
        rigidity.append(np.full(len(ring), rigid))
    edge = np.arange(0, size, BORDER_STEP, dtype=float)
    last = np.full_like(edge, size - 1.0)
    first = np.zeros_like(edge)
    border_xy = np.concatenate([
        np.stack([edge, first], 1), np.stack([last, edge], 1),
        np.stack([edge[::-1] + BORDER_STEP - 1, last], 1)[: len(edge)],
        np.stack([first, edge[::-1] + BORDER_STEP - 1], 1)[: len(edge)],
    ])  # fmt: skip
    border_xy = np.clip(border_xy, 0, size - 1)
    points.append(np.concatenate([border_xy, np.full((len(border_xy), 1), centre[2])], 1))
    rigidity.append(np.zeros(len(border_xy)))
    points, rigidity = np.concatenate(points), np.concatenate(rigidity)
    keep, taken = [], [marks[:, :2]]
    for i, p in enumerate(points):
        if rigidity[i] == 0 or np.min(np.linalg.norm(np.concatenate(taken) - p[:2], axis=1)) > 6:
            keep.append(i)
            taken.append(p[None, :2])
    return points[keep], rigidity[keep]


def build_rig(photo: np.ndarray, mesh: lm.FaceMesh, size: int = SIZE) -> Rig:
    """A frontal photo (RGB uint8, any size) -> its Rig. Raises NoFaceError."""
    from scipy.spatial import Delaunay

    crop, _ = crop_portrait(photo, mesh(photo), size)
    marks = mesh(crop)  # again on the crop, at the scale it is drawn
    extra, extra_rigidity = _ring_and_border(marks, size)
    vertices = np.concatenate([marks, extra]).astype(np.float32)
    rigidity = np.concatenate([np.ones(len(marks)), extra_rigidity]).astype(np.float32)
    triangles = Delaunay(vertices[:, :2]).simplices.astype(np.int32)

    frame = FaceFrame(marks)
    fields = ShapeFields(frame.local(vertices), frame.local(marks))
    offsets = np.zeros((len(ARKIT_NAMES), len(vertices), 3), np.float32)
    for name, local in shape_offsets(fields).items():
        offsets[ARKIT_INDEX[name], :, :2] = frame.to_image(local)
    # Expressions move the face's own landmarks only: the rings around it (hair, neck,
    # collar) follow head turns, not the jaw, so the background stays the photo's
    offsets[:, len(marks) :] = 0.0
    layer_offsets = split_at_eyes(split_at_lips(offsets, fields), fields, frame)

    unit = frame.unit
    pivot = np.array([
        *(marks[[234, 454], :2].mean(axis=0) + frame.ey * 0.5 * unit),
        marks[[234, 454], 2].mean() + 0.5 * unit,
    ], np.float32)  # fmt: skip  # behind the face, below the ears: the top of the neck
    lips = marks[list(lm.OUTER_UPPER + lm.OUTER_LOWER), :2]
    # the box holds every pixel where the two warp layers differ: LAYER_BAND beyond the
    # lips, lowered by the jaw's drop, plus a head turn's shift
    margin = np.array([0.55, LAYER_BAND + 0.15]) * unit
    low = np.floor(lips.min(axis=0) - margin)
    high = np.ceil(lips.max(axis=0) + margin + np.array([0.0, JAW_DROP * unit]))
    x0, y0 = (np.clip(low, 0, size) // 4 * 4).astype(int)
    x1, y1 = (np.clip(high, 0, size) // 4 * 4).astype(int)
    # the widest column: a photo with parted lips keeps its own mouth at rest
    columns = marks[list(lm.INNER_LOWER[1:-1]), :2] - marks[list(lm.INNER_UPPER[1:-1]), :2]
    rest_gap = float(np.linalg.norm(columns, axis=-1).max())
    eyes = marks[list(lm.RIGHT_EYE_UPPER + lm.RIGHT_EYE_LOWER + lm.LEFT_EYE_UPPER
                      + lm.LEFT_EYE_LOWER), :2]  # fmt: skip
    # where the lid layer differs from the face: the lids, EYE_BAND below, a head turn
    eye_low = np.floor(eyes.min(axis=0) - np.array([0.25, 0.15]) * unit)
    eye_high = np.ceil(eyes.max(axis=0) + np.array([0.25, EYE_BAND + 0.12]) * unit)
    ex0, ey0 = np.clip(eye_low, 0, size).astype(int)
    ex1, ey1 = np.clip(eye_high, 0, size).astype(int)
    return Rig(
        photo=crop,
        vertices=vertices,
        triangles=triangles,
        offsets=offsets,
        layer_offsets=layer_offsets,
        rigidity=rigidity,
        pivot=pivot,
        unit=unit,
        mouth_box=(int(x0), int(y0), int(x1), int(y1)),
        eye_box=(int(ex0), int(ey0), int(ex1), int(ey1)),
        rest_gap=rest_gap,
    )
