"""TensorRT recipe for tts_vits: profiles from the sidecar; the build needs TensorRT."""

from __future__ import annotations

import shutil

import pytest

from avatar.sidecar import Sidecar, TensorSpec
from export.tts_engine import Profile, build_engine, trtexec_command

SIDECAR = Sidecar(
    model="tts_vits",
    inputs=[
        TensorSpec("phoneme_ids", "int64", ("batch", "phonemes")),
        TensorSpec("phoneme_lengths", "int64", ("batch", 1)),
        TensorSpec("scales", "float32", ("batch", 3)),
        TensorSpec("noise_phonemes", "float32", ("batch", 2, "noise_phonemes_len")),
        TensorSpec("noise_frames", "float32", ("batch", 192, "noise_frames_len")),
    ],
    outputs=[TensorSpec("audio", "float32", ("batch", "samples"))],
)


def test_trtexec_profiles_follow_the_sidecar(tmp_path):
    cmd = trtexec_command(tmp_path / "m.onnx", tmp_path / "m.plan", SIDECAR, "fp16")
    flags = dict(c.split("=", 1) for c in cmd[1:] if "=" in c)
    assert flags["--maxShapes"] == (
        "phoneme_ids:8x448,phoneme_lengths:8x1,scales:8x3,"
        "noise_phonemes:8x2x512,noise_frames:8x192x1024"
    )
    assert flags["--minShapes"].startswith("phoneme_ids:1x64,")
    assert "--fp16" in cmd


def test_unknown_dynamic_axis_is_an_error():
    sidecar = Sidecar("x", [TensorSpec("a", "float32", ("batch", "mystery"))], [])
    with pytest.raises(ValueError, match="mystery"):
        Profile().shapes(sidecar)


@pytest.mark.tensorrt
@pytest.mark.skipif(shutil.which("trtexec") is None, reason="TensorRT (trtexec) is not installed")
def test_build_engine():
    from export.common import ensure
    from export.tts import VitsRecipe

    assert build_engine(ensure(VitsRecipe())).stat().st_size > 1_000_000
