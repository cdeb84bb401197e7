"""The `avatar_say` ensemble (avatar_speech -> avatar_animate) on the real server:
one non-streaming call, text -> audio + blendshapes that cover the same time."""

from __future__ import annotations

import numpy as np
import pytest

from clients.say_service import say

pytestmark = pytest.mark.server


def test_ensemble_returns_audio_and_matching_frames(triton_server):
    out = say(triton_server.grpc_url, "Hello there. Welcome to the front desk!")
    rate, fps = int(out["sample_rate"][0]), float(out["fps"][0])
    seconds = out["audio"].size / rate
    assert rate == 22050 and fps == 30.0 and seconds > 1.5
    assert out["blendshapes"].shape == (int(np.floor(seconds * fps + 1e-9)) + 1, 52)
    assert out["head_pose"].shape == (out["blendshapes"].shape[0], 3)
    assert out["blendshapes"].max() > 0.2  # the mouth moves
    assert "visemes" in out["animation"]


def test_ensemble_bad_text_is_a_clear_error(triton_server):
    from tritonclient.utils import InferenceServerException

    with pytest.raises(InferenceServerException, match="text is empty"):
        say(triton_server.grpc_url, "")
