"""The photo portrait served by the real tritonserver: `portrait_renderer` directly and
through the avatar model's `face` control."""

from __future__ import annotations

import numpy as np
import pytest
from grpc_calls import call

from avatar.animation.tables import ARKIT_INDEX
from clients.avatar_stream import stream_turn
from export.common import onnx_session
from export.registry import ensure_all


@pytest.fixture(scope="module")
def grpc_url(triton_server) -> str:
    return triton_server.grpc_url


def _frames(jaw: list[float]) -> dict[str, np.ndarray]:
    shapes = np.zeros((len(jaw), 52), np.float32)
    shapes[:, ARKIT_INDEX["jawOpen"]] = jaw
    return {"blendshapes": shapes, "head_pose": np.zeros((len(jaw), 3), np.float32)}


def test_served_frames_are_the_verified_export(grpc_url):
    """What Triton serves is the artifact's model.onnx, batch of 16 (max_batch_size)."""
    inputs = _frames(list(np.linspace(0.0, 1.0, 16)))
    reply = call(grpc_url, "portrait_renderer", inputs)
    assert reply.error is None, reply.error
    served = reply.responses[0]["frames"]
    assert served.shape == (16, 512, 512, 3) and served.dtype == np.uint8
    folder = ensure_all(["portrait_renderer"])["portrait_renderer"]
    (local,) = onnx_session(folder / "model.onnx").run(["frames"], inputs)
    np.testing.assert_array_equal(served, local)
    mouth = slice(240, 330), slice(200, 320)
    assert np.abs(served[-1][mouth].astype(int) - served[0][mouth]).mean() > 5  # jaw opened


def test_nan_weights_are_refused_here_and_drawn_as_rest_by_the_graph(grpc_url):
    """The embedded runner refuses NaN with a clear error; natively (ONNX Runtime, TensorRT)
    nothing checks values, so the graph itself maps NaN to 0: never an undefined index."""
    inputs = _frames([0.0, 0.0])
    inputs["blendshapes"][1] = np.nan
    inputs["head_pose"][1] = np.nan
    reply = call(grpc_url, "portrait_renderer", inputs)
    assert reply.error is not None and "'blendshapes' contains nan" in reply.error.lower()
    folder = ensure_all(["portrait_renderer"])["portrait_renderer"]
    (frames,) = onnx_session(folder / "model.onnx").run(["frames"], inputs)
    np.testing.assert_array_equal(frames[1], frames[0])


@pytest.mark.parametrize(("face", "size"), [("portrait", 512), ("cartoon", 256), ("", 512)])
def test_the_face_control_picks_the_renderer(grpc_url, face, size):
    controls = {"max_tokens": 6, "seed": 2, "render": True, "face": face}
    turn = stream_turn(grpc_url, text="Hi!", controls=controls)
    assert turn.error == "", turn.error
    spoken = [s for s in turn.sentences if s["blendshapes"].size]
    assert spoken and turn.errors == []
    videos = {v["sentence_index"]: v["video"] for v in turn.videos}
    for s in spoken:
        assert videos[s["sentence_index"]].shape == (len(s["blendshapes"]), size, size, 3)
    assert turn.timings["video"] == ("renderer" if face == "cartoon" else "portrait_renderer")


def test_an_unknown_face_is_refused_with_the_choices(grpc_url):
    turn = stream_turn(grpc_url, text="Hi!", controls={"render": True, "face": "photo"})
    assert "face='photo'" in turn.error and "portrait" in turn.error, turn.error
