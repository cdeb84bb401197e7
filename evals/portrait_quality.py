"""Quality of the portrait renderer, measured on its rendered frames (issue #18, item 5).

The command is the export's (it loads the artifact, its rig and the TTS):

    python -m export.portrait.quality               # 3 replies, Piper's timings and audio
    python -m export.portrait.quality --synthetic   # espeak phonemes, synthetic timings
    python -m export.portrait.quality --text "Bob bought my peppermint bubble gum."

Spoken replies are animated (avatar.animation) and rendered through the exported ONNX
model (`evaluate`: a session and its rig in, every figure and check out); the figures,
each with its threshold (the constants below):

1. re-detection: MediaPipe's face mesh finds the face in every rendered frame;
2. lip sync: the re-detected inner-lip gap (px) follows the intended opening
   (`mouth_opening(blendshapes)`): Pearson r over each reply;
3. closures: on the frames the animation holds closed (`Animation.closed`: every frame inside
   a p/b/m segment, and pauses from 0.1 s after they start) the re-detected gap is at most
   the photo's rest gap (re-detected on the neutral frame) + CLOSED_MARGIN_PX. No ramp frames
   are left out: the pipeline forces those frames shut, so their intended opening is 0;
4. background: with head_pose 0 and any blendshapes (the replies' and random sets), the
   pixels further than BACKGROUND_MARGIN eye distances from the face (the convex hull of the
   face-oval landmarks at rest and as posed, so a dropped chin counts as face) stay within
   MAX_BACKGROUND_LEVELS of the photo;
5. no holes, tears or flicker: (a) the same call gives the same frames, bit for bit, and a
   frame rendered alone differs from it in a batch by at most MAX_BATCH_LEVELS; (b) NUDGE
   more on every active shape changes a frame by at most MAX_NUDGE_MAD mean levels;
   (c) frame to frame (head still), the mean change is at most FLICKER_PER_UNIT levels per
   unit of summed blendshape change + FLICKER_FLOOR (so a frame whose blendshapes do not
   change does not change either); (d) outside the painted mouth interior, every pixel's
   colour lies within the photo's colour range (per channel, +-HOLE_LEVELS) over the square
   window its warp can reach (the frame's largest vertex displacement + HOLE_REACH_PX): a
   black hole, the mouth's paint smeared over lips or chin, or a sample from a wrong place
   fails it (the check is weaker on frames with a wide-open jaw, whose window is larger);
6. single expressions (evals.portrait_expressions): a full blink closes the eyes, funnel
   and pucker narrow the mouth without opening the jaw, the teeth show gaps between them.

Results: build/perf/portrait/quality.json and quality.md, a contact sheet of one reply
(sheet.png, and mouth.png: the mouth at full size), the reply as reply.mp4, the single
expressions (expressions.png: neutral, blink, funnel, pucker, jaw open; eyes.png and
expressions_mouth.png at full size), and background.png: the photo in grey, red where a
background pixel left the photo by more than the limit in some frame of a reply, yellow
where only random blendshapes did.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from avatar.animation import AnimationConfig, animate
from avatar.animation.emotion import mouth_opening
from avatar.animation.pipeline import Animation
from avatar.animation.timing import phonemize, synthetic_timings
from evals import face_landmarks as lm
from evals.portrait_expressions import (
    LEFT_EYE_EAR,
    RIGHT_EYE_EAR,
    TEETH_JAW,
    expression_checks,
    measure_expressions,
)
from evals.report import DEFAULT_OUT, machine

log = logging.getLogger(__name__)


class PortraitRig(Protocol):
    """What the checks read of the export's rig (export.portrait.rig.Rig): the photo, its
    size and eye distance, the mesh at rest and its blendshape offsets."""

    photo: np.ndarray  # [S, S, 3] uint8
    size: int
    unit: float  # px between the eyes
    vertices: np.ndarray  # [V, 3] at rest
    offsets: np.ndarray  # [52, V, 2]
    layer_offsets: Sequence[np.ndarray]
    rest_gap: float
    mouth_box: tuple[int, int, int, int]


OUT = DEFAULT_OUT / "portrait"
FPS = 25.0
TEXTS = (
    "Maybe a big problem, please.",
    "Bob bought my peppermint bubble gum.",
    "Hello there, how are you doing today?",  # no p, b or m
)
BATCH = 16  # frames per ONNX call
ALONE = 8  # frames also rendered one at a time, for (5a)

MIN_DETECTED = 1.0  # fraction of frames where the face mesh finds the face
MIN_CORRELATION = 0.9  # Pearson r, re-detected lip gap vs intended opening, per reply
# MediaPipe's inner-lip gap on a closed mouth varies by ~0.3 px between re-detections of
# warped frames; 2 px is 2 % of the eye distance at 512 px and well below the gap of the
# least open viseme (~5 px here), so a closure that does not close fails
CLOSED_MARGIN_PX = 2.0
# a 2D warp must fade the face's motion out over some band around it (there is no
# occlusion): a quarter of the eye distance (~25 px at 512, six cells of the 128 field)
BACKGROUND_MARGIN = 0.25  # eye distances beyond the face oval
MAX_BACKGROUND_LEVELS = 3  # grey levels from the photo, outside the face region (speech)
MAX_RANDOM_SHARE = 1e-3  # of the region over that, with random extreme blendshapes
WIDER_MARGINS = (0.5, 1.0)  # eye distances: reported, to show how far the motion spreads
RANDOM_SETS = 16  # random blendshape sets (the export's example_inputs) besides the replies
NUDGE = 0.01  # added to every shape above NUDGE, for (5b)
# first order: a change of 0.01 on ~10 shapes moves a vertex <= ~0.5 px; if the whole frame
# moved by that, the photo (mean |gradient| ~9 levels/px) would change by ~4 levels; a warp
# of the face alone stays well under 1 level, a tear or a popping interior does not
MAX_NUDGE_MAD = 1.0
# (5c): the measured ratio is ~1.5-2 levels per unit of summed change (median), ~6 at worst
FLICKER_PER_UNIT = 10.0  # mean levels per unit of sum |change of blendshapes|
FLICKER_FLOOR = 0.05  # mean levels allowed between frames whose blendshapes are equal
MAX_BATCH_LEVELS = 1  # a frame rendered alone vs in a batch of BATCH
HOLE_LEVELS = 2  # rounding beyond the photo's colour range
HOLE_REACH_PX = 2.0  # field interpolation (4 px cells) beyond the vertices' displacement
INTERIOR_MARGIN_PX = 2.0  # the painted interior's soft edge


@dataclasses.dataclass
class Reply:
    """One spoken reply: its animation, and its audio when it comes from the TTS."""

    text: str
    animation: Animation
    audio: np.ndarray | None = None
    sample_rate: int = 22050


def synthetic_reply(text: str, fps: float = FPS) -> Reply:
    """espeak's phonemes of `text` with synthetic durations -> its animation."""
    timings = synthetic_timings(phonemize(text))
    return Reply(text, animate(timings, AnimationConfig(fps=fps), text=text))


def render(session, blendshapes: np.ndarray, head_pose: np.ndarray | None = None) -> np.ndarray:
    """Frames [T, S, S, 3] uint8 of the ONNX renderer, BATCH frames a call."""
    blendshapes = np.asarray(blendshapes, np.float32)
    if head_pose is None:
        head_pose = np.zeros((len(blendshapes), 3), np.float32)
    parts = [  # the renderer's one output: frames
        session.run(None, {"blendshapes": blendshapes[i : i + BATCH],
                           "head_pose": np.asarray(head_pose[i : i + BATCH], np.float32)})[0]
        for i in range(0, len(blendshapes), BATCH)
    ]  # fmt: skip
    return np.concatenate(parts)


def displaced(
    rig: PortraitRig, blendshapes: np.ndarray, offsets: np.ndarray | None = None
) -> np.ndarray:
    """Vertex positions [T, V, 2] with head_pose 0: rest + blendshapes @ offsets."""
    offsets = rig.offsets if offsets is None else offsets
    moved = np.einsum("tk,kvc->tvc", np.asarray(blendshapes, np.float32), offsets[..., :2])
    return rig.vertices[None, :, :2] + moved


def reach(rig: PortraitRig, blendshapes: np.ndarray) -> np.ndarray:
    """The largest vertex displacement (px) per frame [T], over the rig's offsets and both
    warp layers: how far from its place a pixel of the photo can be drawn."""
    rest = rig.vertices[None, :, :2]
    fields = (rig.offsets, *rig.layer_offsets)
    return np.max(
        [np.linalg.norm(displaced(rig, blendshapes, f) - rest, axis=-1).max(-1) for f in fields],
        axis=0,
    )


def _polygon_mask(points: np.ndarray, size: int) -> np.ndarray:
    from PIL import Image, ImageDraw

    image = Image.new("L", (size, size), 0)
    ImageDraw.Draw(image).polygon([tuple(p) for p in np.asarray(points, float)], fill=1)
    return np.asarray(image, bool)


def face_distances(rig: PortraitRig, blendshapes: np.ndarray) -> Iterator[np.ndarray]:
    """Per frame, [S, S] px from the convex hull of the face oval at rest and as posed by
    the frame's blendshapes (head still); 0 inside it."""
    from scipy.ndimage import distance_transform_edt
    from scipy.spatial import ConvexHull

    rest = rig.vertices[list(lm.FACE_OVAL), :2]
    for oval in displaced(rig, blendshapes)[:, list(lm.FACE_OVAL)]:
        points = np.concatenate([rest, oval])
        face = _polygon_mask(points[ConvexHull(points).vertices], rig.size)
        yield distance_transform_edt(~face)


def interior_masks(rig: PortraitRig, blendshapes: np.ndarray) -> np.ndarray:
    """[T, S, S] bool: between the posed inner lips, grown by INTERIOR_MARGIN_PX (where the
    renderer may paint the mouth's cavity, teeth and tongue)."""
    from scipy.ndimage import distance_transform_edt

    ring = list(lm.INNER_UPPER) + list(lm.INNER_LOWER[::-1])
    masks = []
    for lips in displaced(rig, blendshapes)[:, ring]:
        inside = _polygon_mask(lips, rig.size)
        masks.append(distance_transform_edt(~inside) <= INTERIOR_MARGIN_PX)
    return np.stack(masks)


class ColourRange:
    """The photo's per-channel min and max over square windows, cached by radius."""

    def __init__(self, photo: np.ndarray):
        self.photo = photo.astype(np.int16)
        self._cache: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def __call__(self, radius: int) -> tuple[np.ndarray, np.ndarray]:
        from scipy.ndimage import maximum_filter, minimum_filter

        if radius not in self._cache:
            size = (2 * radius + 1, 2 * radius + 1, 1)
            self._cache[radius] = (
                minimum_filter(self.photo, size=size, mode="nearest"),
                maximum_filter(self.photo, size=size, mode="nearest"),
            )
        return self._cache[radius]


def still_head_checks(
    frames: np.ndarray, blendshapes: np.ndarray, rig: PortraitRig, colours: ColourRange
) -> dict[str, Any]:
    """(4) background and (5d) holes of frames rendered with head_pose 0; "over_map" [S, S]:
    the background pixels over the limit in some frame."""
    margin = BACKGROUND_MARGIN * rig.unit
    outside: list[np.ndarray] = []
    over = np.zeros((rig.size, rig.size), bool)
    region_any = np.zeros_like(over)
    wider = dict.fromkeys(WIDER_MARGINS, 0)
    holes, hole_frames = 0, 0
    interior = interior_masks(rig, blendshapes)
    radii = reach(rig, blendshapes)
    for frame, distance, paint, radius in zip(
        frames, face_distances(rig, blendshapes), interior, radii, strict=True
    ):
        value = frame.astype(np.int16)
        diff = np.abs(value - rig.photo).max(axis=-1)
        region = distance > margin
        outside.append(diff[region])
        over |= region & (diff > MAX_BACKGROUND_LEVELS)
        region_any |= region
        for units in WIDER_MARGINS:
            wider[units] = max(wider[units], int(diff[distance > units * rig.unit].max(initial=0)))
        low, high = colours(int(np.ceil(radius + HOLE_REACH_PX)))
        wrong = ((value < low - HOLE_LEVELS) | (value > high + HOLE_LEVELS)).any(-1) & ~paint
        holes += int(wrong.sum())
        hole_frames += bool(wrong.any())
    values = np.concatenate(outside)
    return {
        "background_max": int(values.max(initial=0)),
        "background_p99": float(np.percentile(values, 99)) if values.size else 0.0,
        "background_over_share": float(over.sum() / max(1, region_any.sum())),
        **{f"background_max_beyond_{u:g}_eye": v for u, v in wider.items()},
        "holes": holes,
        "hole_frames": hole_frames,
        "over_map": over,
    }


def _pearson(a: np.ndarray, b: np.ndarray) -> float:
    if len(a) < 3 or np.std(a) == 0 or np.std(b) == 0:
        return float("nan")
    return float(np.corrcoef(a, b)[0, 1])


def measure_reply(
    session,
    rig: PortraitRig,
    reply: Reply,
    mesh: lm.FaceMesh,
    *,
    tolerance: float,
    colours: ColourRange,
) -> tuple[dict[str, Any], np.ndarray]:
    """All figures of one reply -> (figures, its frames as served, head pose included)."""
    anim = reply.animation
    shapes, pose = anim.blendshapes, anim.head_pose
    frames = render(session, shapes, pose)

    # (1), (2), (3) on the frames as served
    found = [mesh.find(frame) for frame in frames]
    detected = np.array([f is not None for f in found])
    gap = np.array([lm.inner_lip_gap(f) if f is not None else np.nan for f in found])
    intended = mouth_opening(shapes)
    ok = detected
    slope = np.polyfit(intended[ok], gap[ok], 1)[0] if ok.sum() > 2 else float("nan")
    in_pp = np.zeros(len(frames), bool)
    for seg in anim.segments:
        if seg.viseme == "PP":
            in_pp |= (anim.times >= seg.start) & (anim.times < seg.end)
    pp = anim.closed & in_pp & detected
    silence = anim.closed & ~in_pp & detected

    # (4), (5) with the head still
    still = render(session, shapes)
    figures = still_head_checks(still, shapes, rig, colours)
    part = slice(0, min(BATCH, len(shapes)))  # the first call of render(shapes) again
    again = render(session, shapes[part])
    alone = np.concatenate([render(session, shapes[i : i + 1]) for i in range(ALONE)])
    active = shapes > NUDGE
    nudged = render(session, np.clip(shapes + NUDGE * active, 0.0, 1.0))
    nudge_mad = np.abs(nudged.astype(np.int16) - still).mean(axis=(1, 2, 3))
    step = np.abs(np.diff(still.astype(np.int16), axis=0)).mean(axis=(1, 2, 3))
    change = np.abs(np.diff(shapes, axis=0)).sum(axis=1)
    moving = change > 1e-3
    figures.update(
        text=reply.text,
        frames=len(frames),
        seconds=round(len(frames) / anim.fps, 2),
        detected=float(detected.mean()),
        correlation=_pearson(gap[ok], intended[ok]),
        gap_per_opening_px=float(slope),
        gap_max_px=float(np.nanmax(gap)),
        pp_frames=int(pp.sum()),
        pp_max_gap_px=float(gap[pp].max(initial=0.0)),
        silence_frames=int(silence.sum()),
        silence_max_gap_px=float(gap[silence].max(initial=0.0)),
        closed_intended_max=float(intended[anim.closed].max(initial=0.0)),
        closed_tolerance_px=tolerance,
        repeat_max_diff=int(np.abs(again.astype(np.int16) - still[part]).max()),
        batch_max_diff=int(np.abs(alone.astype(np.int16) - still[:ALONE]).max()),
        nudge_max_mad=float(nudge_mad.max()),
        flicker_max_mad=float(step.max(initial=0.0)),
        flicker_max_ratio=float((step[moving] / change[moving]).max(initial=0.0)),
        flicker_still_max_mad=float(step[~moving].max(initial=0.0)),
        flicker_excess=float((step - FLICKER_PER_UNIT * change - FLICKER_FLOOR).max(initial=0)),
    )
    return figures, frames


@dataclasses.dataclass
class Evaluation:
    results: dict[str, Any]
    frames: np.ndarray  # the first reply as served
    speech_over: np.ndarray  # [S, S] bool: background pixels over the limit in a reply
    random_over: np.ndarray  # the same with random blendshapes
    expressions: np.ndarray  # frames of expressions.POSES


def evaluate(
    session, rig: PortraitRig, replies: Sequence[Reply], random_shapes: np.ndarray
) -> Evaluation:
    """Every figure of the renderer `session` (ONNX Runtime) with its `rig` over `replies`
    (+ the blendshape sets `random_shapes` [N, 52], head still)."""
    colours = ColourRange(rig.photo)
    with lm.FaceMesh() as mesh:
        neutral = render(session, np.zeros((1, 52), np.float32))[0]
        found = mesh.find(neutral)
        rest_gap = float(lm.inner_lip_gap(found)) if found is not None else float("nan")
        tolerance = rest_gap + CLOSED_MARGIN_PX
        rows, first = [], None
        speech_over = np.zeros((rig.size, rig.size), bool)
        for reply in replies:
            figures, frames = measure_reply(
                session, rig, reply, mesh, tolerance=tolerance, colours=colours
            )
            speech_over = figures.pop("over_map") | speech_over
            rows.append(figures)
            first = frames if first is None else first
            log.info("%s: %d frames measured", reply.text, len(frames))
        expressions, expression_frames = measure_expressions(
            lambda shapes: render(session, shapes), mesh, rig.unit
        )
    randoms = still_head_checks(render(session, random_shapes), random_shapes, rig, colours)
    random_over = randoms.pop("over_map")
    neutral_diff = int(np.abs(neutral.astype(np.int16) - rig.photo).max())
    results = {
        "machine": machine(),
        "size": rig.size,
        "eye_distance_px": round(rig.unit, 2),
        "neutral_vs_photo_max": neutral_diff,
        "rest_gap_px": rest_gap,
        "rig_rest_gap_px": rig.rest_gap,
        "closed_tolerance_px": tolerance,
        "background_margin_px": round(BACKGROUND_MARGIN * rig.unit, 1),
        "replies": rows,
        "random": {"sets": len(random_shapes), **randoms},
        "expressions": expressions,
    }
    results["checks"] = checks(results)
    return Evaluation(results, first, speech_over, random_over, expression_frames)


def checks(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each figure's worst value over the replies, its limit and whether it is met."""
    rows, randoms = results["replies"], results["random"]
    worst = lambda key, f=max: f(r[key] for r in rows)  # noqa: E731
    tolerance = results["closed_tolerance_px"]
    closed = max(worst("pp_max_gap_px"), worst("silence_max_gap_px"))
    # Speech: a few levels. Random sets (jawOpen up to 1 with jawLeft/Right) may push the
    # chin past the fixed ring under it, where the 4-px displacement grid smears the fold
    # a few pixels into the neck: bounded apart, on a share of the region.
    background = worst("background_max")
    table = {
        "redetected": (worst("detected", min), ">=", MIN_DETECTED),
        "lip_correlation": (worst("correlation", min), ">=", MIN_CORRELATION),
        "closed_gap_px": (closed, "<=", round(tolerance, 2)),
        "background_max_levels": (background, "<=", MAX_BACKGROUND_LEVELS),
        "background_random_share": (randoms["background_over_share"], "<=", MAX_RANDOM_SHARE),
        "repeat_max_diff": (worst("repeat_max_diff"), "<=", 0),
        "batch_max_diff": (worst("batch_max_diff"), "<=", MAX_BATCH_LEVELS),
        "nudge_max_mad": (worst("nudge_max_mad"), "<=", MAX_NUDGE_MAD),
        "flicker_excess": (worst("flicker_excess"), "<=", 0.0),
        "holes": (worst("holes") + randoms["holes"], "<=", 0),
        **expression_checks(results["expressions"]),
    }
    out = {}
    for name, (value, op, limit) in table.items():
        good = value >= limit if op == ">=" else value <= limit
        out[name] = {"value": value, "limit": f"{op} {limit}", "ok": bool(good)}
    return out


def markdown(results: dict[str, Any]) -> str:
    lines = [
        f"# Portrait renderer quality ({results['timings']} timings, {results['fps']:g} fps)",
        "",
        f"Eye distance {results['eye_distance_px']} px; neutral frame vs photo: max "
        f"{results['neutral_vs_photo_max']} levels; rest lip gap re-detected "
        f"{results['rest_gap_px']:.2f} px -> closed tolerance "
        f"{results['closed_tolerance_px']:.2f} px; background: > "
        f"{results['background_margin_px']} px from the face oval (rest and posed).",
        "",
        "| check | measured | limit | ok |",
        "|---|---|---|---|",
    ]
    for name, c in results["checks"].items():
        value = c["value"]
        shown = f"{value:.3f}" if isinstance(value, float) else str(value)
        lines.append(f"| {name} | {shown} | {c['limit']} | {'yes' if c['ok'] else '**NO**'} |")
    columns = (
        ("frames", "frames"), ("detected", "found"), ("correlation", "r"),
        ("gap_per_opening_px", "px/opening"), ("pp_frames", "p/b/m fr"),
        ("pp_max_gap_px", "p/b/m gap"), ("silence_frames", "sil fr"),
        ("silence_max_gap_px", "sil gap"), ("background_max", "bg max"),
        ("background_p99", "bg p99"), ("background_over_share", "bg >lim share"),
        ("nudge_max_mad", "nudge MAD"), ("flicker_max_ratio", "MAD/dW"),
        ("flicker_still_max_mad", "still MAD"), ("holes", "holes"),
    )  # fmt: skip
    lines += ["", "| reply | " + " | ".join(h for _, h in columns) + " |",
              "|---|" + "---|" * len(columns)]  # fmt: skip
    for row in results["replies"]:
        cells = [f"{row[k]:.3g}" if isinstance(row[k], float) else str(row[k]) for k, _ in columns]
        lines.append(f"| {row['text']} | " + " | ".join(cells) + " |")
    r = results["random"]
    lines += [
        "",
        f"Random blendshapes ({r['sets']} sets, head still): background max "
        f"{r['background_max']}, p99 {r['background_p99']:.1f} levels, "
        f"{r['background_over_share']:.1%} of the region over the limit; holes {r['holes']}.",
    ]
    for units in WIDER_MARGINS:
        key = f"background_max_beyond_{units:g}_eye"
        speech = max(row[key] for row in results["replies"])
        lines.append(
            f"Background max further than {units:g} eye distance(s) from the face: "
            f"replies {speech}, random {r[key]} levels."
        )
    e = results["expressions"]
    if e["redetected"]:
        lines += [
            "",
            f"Expressions (re-detected): eye aspect ratio rest {e['rest_eye_aspect_ratio']}, "
            f"eyeBlink 1 {e['blink_eye_aspect_ratio']}; mouth width / rest: mouthFunnel 1 "
            f"{e['funnel_width_ratio']:.3f} (inner lip gap {e['funnel_lip_gap_px']:.1f} px, "
            f"chin drop {e['funnel_chin_drop']:.3f} eye), mouthPucker 1 "
            f"{e['pucker_width_ratio']:.3f} (gap {e['pucker_lip_gap_px']:.1f} px, chin drop "
            f"{e['pucker_chin_drop']:.3f}); rest gap {e['rest_lip_gap_px']:.1f} px; teeth at "
            f"jawOpen {TEETH_JAW:g}: {e['teeth_gaps']} gaps, row luminance std "
            f"{e['teeth_row_std']:.1f}.",
        ]
    return "\n".join(lines)


def _half(frames: np.ndarray) -> np.ndarray:
    """2x2 mean downscale of [T, H, W, 3] uint8."""
    t, h, w, c = frames.shape
    small = frames.reshape(t, h // 2, 2, w // 2, 2, c).mean(axis=(2, 4))
    return small.round().astype(np.uint8)


def write_pictures(out: Path, evaluation: Evaluation, rig: PortraitRig, reply: Reply) -> None:
    """Contact sheets (whole frames at half size; the mouth at full size), the reply as MP4
    (with its audio when it has any) and the background-over-limit map."""
    from avatar.animation.video import contact_sheet, write_mp4, write_png

    frames = evaluation.frames
    write_png(out / "sheet.png", contact_sheet(_half(frames), columns=10))
    x0, y0, x1, y1 = rig.mouth_box
    write_png(out / "mouth.png", contact_sheet(frames[:, y0:y1, x0:x1], columns=10))
    write_mp4(out / "reply.mp4", frames, reply.animation.fps, reply.audio, reply.sample_rate)
    grey = (rig.photo.mean(axis=-1, keepdims=True) * 0.5).repeat(3, axis=-1)
    grey[evaluation.random_over] = (255, 220, 0)
    grey[evaluation.speech_over] = (255, 0, 0)
    write_png(out / "background.png", grey.astype(np.uint8))
    shown = evaluation.expressions
    write_png(out / "expressions.png", contact_sheet(_half(shown), columns=len(shown)))
    write_png(out / "expressions_mouth.png", contact_sheet(shown[:, y0:y1, x0:x1],
                                                           columns=len(shown)))  # fmt: skip
    eyes = rig.vertices[list(RIGHT_EYE_EAR + LEFT_EYE_EAR), :2]
    (ex0, ey0), (ex1, ey1) = eyes.min(axis=0) - 0.2 * rig.unit, eyes.max(axis=0) + 0.2 * rig.unit
    eye_box = np.s_[:, max(0, int(ey0)) : int(ey1), max(0, int(ex0)) : int(ex1)]
    write_png(out / "eyes.png", contact_sheet(shown[:2][eye_box], columns=1))
    log.info("pictures: %s/{sheet,mouth,background}.png, %s/reply.mp4 (%s)", out, out,
             "with audio" if reply.audio is not None else "silent")  # fmt: skip
    for seg in reply.animation.segments:
        first = int(np.ceil(seg.start * reply.animation.fps))
        last = int(np.ceil(seg.end * reply.animation.fps)) - 1
        log.debug("frames %3d-%3d  %-3s %s", first, last, seg.viseme, seg.symbols)
