"""TensorRT recipe for llm_decoder: profiles from the sidecar; the build needs TensorRT."""

from __future__ import annotations

import shutil

import pytest

from avatar.llm.decoder import KvLayout
from export.llm.engine import DecoderProfile, build_engine
from export.sidecar import Sidecar, TensorSpec
from export.tensorrt.engine import trtexec_command

LAYOUT = KvLayout(layers=2, kv_heads=3, head_dim=64)
SIDECAR = Sidecar(
    model="llm_decoder",
    inputs=[
        TensorSpec("input_ids", "int64", ("batch", "sequence")),
        TensorSpec("attention_mask", "int64", ("batch", "total_sequence")),
        TensorSpec("position_ids", "int64", ("batch", "sequence")),
        *[TensorSpec(n, "float32", ("batch", 3, "past_sequence", 64)) for n in LAYOUT.past_names()],
    ],
    outputs=[TensorSpec("logits", "float32", ("batch", "sequence", 49152))],
)


def test_trtexec_profiles_cover_first_step_and_context(tmp_path):
    cmd = trtexec_command(
        tmp_path / "m.onnx", tmp_path / "m.plan", SIDECAR, DecoderProfile(), "fp16"
    )
    flags = dict(c.split("=", 1) for c in cmd[1:] if "=" in c)
    assert flags["--minShapes"].startswith("input_ids:1x1,attention_mask:1x1,position_ids:1x1,")
    assert "past_key_values.0.key:1x3x0x64" in flags["--minShapes"]  # empty past
    assert "past_key_values.1.value:8x3x1024x64" in flags["--maxShapes"]
    assert "--fp16" in cmd


@pytest.mark.tensorrt
@pytest.mark.skipif(shutil.which("trtexec") is None, reason="TensorRT (trtexec) is not installed")
def test_build_engine():
    from export.common import ensure
    from export.llm.recipe import LlmDecoderRecipe

    assert build_engine(ensure(LlmDecoderRecipe())).stat().st_size > 1_000_000
