"""The 2D face renderer: ONNX export vs torch, config vs sidecar, and that the drawn face
follows the blendshapes (mouth opens with jawOpen, closes with mouthClose, eyes blink)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from avatar.animation.tables import ARKIT_INDEX
from export.common import ToleranceError, compare_outputs, ensure, onnx_session
from export.config_check import check_against_sidecar
from export.renderer import recipe
from export.sidecar import Sidecar
from model_configs.pbtxt import parse_config
from networks.face2d import LIPS, MOUTH_INSIDE, Face2D

CONFIG = Path(__file__).parent.parent / "model_repository" / "renderer" / "config.pbtxt"


@pytest.fixture(scope="module")
def artifact() -> Path:
    return ensure(recipe.RendererRecipe())


@pytest.fixture(scope="module")
def face() -> Face2D:
    torch.set_num_threads(1)
    return Face2D(128).eval()


def draw(face: Face2D, **weights: float) -> np.ndarray:
    """One frame [H, W, 3] uint8 with the given blendshapes, head still."""
    shapes = torch.zeros(1, 52)
    for name, value in weights.items():
        shapes[0, ARKIT_INDEX[name]] = value
    with torch.no_grad():
        return face(shapes, torch.zeros(1, 3))[0].numpy()


def mouth_box(frame: np.ndarray) -> np.ndarray:
    """The lower-middle part of the face where the mouth is drawn."""
    h, w, _ = frame.shape
    return frame[int(0.6 * h) : int(0.85 * h), int(0.25 * w) : int(0.75 * w)].astype(float)


def cavity_pixels(frame: np.ndarray) -> int:
    """Pixels of the dark inside of the mouth."""
    target = np.array(MOUTH_INSIDE) * 255
    return int((np.abs(mouth_box(frame) - target).max(axis=2) < 30).sum())


def test_export_matches_sidecar_and_config(artifact):
    sidecar = Sidecar.load(artifact)
    inputs, outputs = recipe.expected_specs()
    assert sidecar.inputs == inputs and sidecar.outputs == outputs
    assert sidecar.batch_axis == 0
    assert sidecar.validation["outputs"]["frames"]["max_abs"] <= 2.0
    config = parse_config(CONFIG)
    assert config.platform in ("onnxruntime_onnx", "tensorrt_plan") and config.max_batch_size >= 8
    assert config.HasField("dynamic_batching")
    check_against_sidecar(config, sidecar)


def test_onnx_equals_torch_on_unseen_batch(artifact):
    inputs = recipe.example_inputs(3, seed=99)
    (frames,) = onnx_session(artifact / "model.onnx").run(["frames"], inputs)
    expected = recipe.reference(inputs)
    assert frames.shape == (3, 256, 256, 3) and frames.dtype == np.uint8
    compare_outputs(expected, {"frames": frames}, recipe.TOLERANCES)
    # a wrong frame is caught by the same check
    other = recipe.reference(recipe.example_inputs(3, seed=100))
    with pytest.raises(ToleranceError):
        compare_outputs(expected, other, recipe.TOLERANCES)


def test_mouth_follows_jaw_and_closes(face):
    rest = cavity_pixels(draw(face))
    small = cavity_pixels(draw(face, jawOpen=0.2))
    wide = cavity_pixels(draw(face, jawOpen=0.7))
    closed = cavity_pixels(draw(face, jawOpen=0.7, mouthClose=0.7))
    pressed = cavity_pixels(draw(face, jawOpen=0.3, mouthPressLeft=1.0, mouthPressRight=1.0))
    assert rest == 0 and closed == 0 and pressed == 0
    assert wide > small > 10


def test_lip_rounding_and_smile_change_the_mouth(face):
    def mouth_width(frame: np.ndarray) -> int:
        lips = np.abs(mouth_box(frame) - np.array(LIPS) * 255).max(axis=2) < 40
        columns = np.flatnonzero(lips.any(axis=0))
        return int(columns.max() - columns.min())

    neutral = mouth_width(draw(face, jawOpen=0.3))
    assert mouth_width(draw(face, jawOpen=0.3, mouthPucker=0.9)) < neutral - 5
    assert mouth_width(draw(face, jawOpen=0.3, mouthSmileLeft=1, mouthSmileRight=1)) > neutral


def test_blink_hides_the_eyes_and_head_moves(face):
    def eye_white(frame: np.ndarray) -> int:
        return int((frame.min(axis=2) > 220).sum())

    assert eye_white(draw(face)) > 30
    assert eye_white(draw(face, eyeBlinkLeft=1.0, eyeBlinkRight=1.0)) == 0
    with torch.no_grad():
        still = face(torch.zeros(1, 52), torch.zeros(1, 3))
        turned = face(torch.zeros(1, 52), torch.tensor([[0.1, 0.0, 0.05]]))
    assert (still != turned).float().mean() > 0.02
