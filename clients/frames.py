"""Frames for the MP4 of a reply: the server's video when a renderer model is served,
else the project's 2D face (networks.face2d, torch) drawn here from the blendshapes, else a
plain mouth drawn with numpy so that a client without torch still shows the lips move."""

from __future__ import annotations

import logging

import numpy as np

from avatar.animation.emotion import mouth_opening

log = logging.getLogger(__name__)


def server_video(
    sentences: list[dict], videos: list[dict], fps: float, total: int
) -> np.ndarray | None:
    """The streamed video frames (`videos`: the frames responses) placed on the clock, or
    None if a spoken sentence has none."""
    spoken = {s["sentence_index"] for s in sentences if s["blendshapes"].size}
    drawn = {v["sentence_index"]: v for v in videos if "video" in v}
    if not spoken or not spoken <= drawn.keys():
        return None
    height, width = next(iter(drawn.values()))["video"].shape[1:3]
    out = np.zeros((total, height, width, 3), np.uint8)
    for v in drawn.values():
        at = round(v["start_time"] * fps)
        out[at : at + len(v["video"])] = v["video"][: max(0, total - at)]
    return out


def draw_face(blendshapes: np.ndarray, head_pose: np.ndarray, size: int = 256) -> np.ndarray:
    """[T, 52], [T, 3] -> [T, size, size, 3] uint8 with the 2D face renderer, or a mouth."""
    try:
        import torch

        from networks.face2d import Face2D
    except ImportError as error:
        log.warning("2D face renderer unavailable (%s); drawing a plain mouth", error)
        return _mouth(blendshapes, size)
    model = Face2D(size).eval()
    frames = []
    with torch.inference_mode():
        for start in range(0, len(blendshapes), 32):
            frames.append(
                model(
                    torch.from_numpy(blendshapes[start : start + 32]),
                    torch.from_numpy(head_pose[start : start + 32]),
                ).numpy()
            )
    return np.concatenate(frames) if frames else np.zeros((0, size, size, 3), np.uint8)


def _mouth(blendshapes: np.ndarray, size: int) -> np.ndarray:
    opening = mouth_opening(blendshapes)
    ys, xs = np.mgrid[0:size, 0:size] / size * 2.0 - 1.0
    frames = np.full((len(blendshapes), size, size, 3), (240, 205, 175), np.uint8)
    for i, value in enumerate(opening):
        inside = (xs / 0.35) ** 2 + ((ys - 0.4) / (0.02 + 0.2 * value)) ** 2 <= 1.0
        frames[i][inside] = (90, 20, 25)
    return frames
