"""TensorRT recipes for asr_encoder / asr_decoder: profiles from the real sidecars; the
engine build itself needs TensorRT and skips without it."""

from __future__ import annotations

import shutil

import pytest

from avatar.asr.transcribe import window_frames
from export.asr.engine import Profile, build_engine, trtexec_command
from export.sidecar import Sidecar, TensorSpec
from model_configs.pbtxt import SOURCE_REPOSITORY, parse_config


@pytest.fixture(scope="module")
def sidecars() -> dict[str, Sidecar]:
    from export.asr.recipe import build_all

    return {Sidecar.load(folder).model: Sidecar.load(folder) for folder in build_all()}


def _flags(cmd: list[str]) -> dict[str, str]:
    return dict(c.split("=", 1) for c in cmd[1:] if "=" in c)


def _smallest_window() -> int:
    """The shortest encoder window the served `asr` model sends (its config parameters)."""
    params = parse_config(SOURCE_REPOSITORY / "asr" / "config.pbtxt").parameters
    step, margin = (int(params[k].string_value) for k in ("window_step", "window_margin"))
    return window_frames(1, step or None, margin)


def test_encoder_profile(sidecars, tmp_path):
    flags = _flags(
        trtexec_command(tmp_path / "m.onnx", tmp_path / "m.plan", sidecars["asr_encoder"])
    )
    assert _smallest_window() == 400  # 1 s step + 3 s margin
    assert flags["--minShapes"] == "mel:1x80x400"
    assert flags["--optShapes"] == "mel:4x80x600"  # a 3-s question
    assert flags["--maxShapes"] == "mel:8x80x3000"


def test_decoder_profile(sidecars, tmp_path):
    cmd = trtexec_command(tmp_path / "m.onnx", tmp_path / "m.plan", sidecars["asr_decoder"], "fp32")
    flags = _flags(cmd)
    # the cross-attention state is empty on a START step (encoder_kv carries the window),
    # and encoder_kv is empty on every later step (the state holds it)
    assert flags["--minShapes"] == (
        "tokens:1x1,self_kv:1x12x8x0x64,cross_kv:1x12x8x0x64,encoder_kv:1x12x8x0x64"
    )
    assert flags["--optShapes"] == (
        "tokens:4x1,self_kv:4x12x8x32x64,cross_kv:4x12x8x300x64,encoder_kv:4x12x8x0x64"
    )
    assert flags["--maxShapes"] == (
        "tokens:8x115,self_kv:8x12x8x447x64,cross_kv:8x12x8x1500x64,encoder_kv:8x12x8x1500x64"
    )
    assert "--fp16" not in cmd


def test_unknown_axis_and_precision_are_errors(tmp_path):
    sidecar = Sidecar("x", [TensorSpec("a", "float32", ("batch", "mystery"))], [])
    with pytest.raises(ValueError, match="mystery"):
        Profile().shapes(sidecar)
    with pytest.raises(ValueError, match="int4"):
        trtexec_command(tmp_path / "m.onnx", tmp_path / "m.plan", Sidecar("x", [], []), "int4")


@pytest.mark.tensorrt
@pytest.mark.skipif(shutil.which("trtexec") is None, reason="TensorRT (trtexec) is not installed")
def test_build_engines():
    from export.asr.recipe import build_all

    for folder in build_all():
        assert build_engine(folder).stat().st_size > 1_000_000
