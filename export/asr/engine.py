"""TensorRT engine recipes for `asr_encoder` and `asr_decoder` (production target): trtexec
command lines whose shape profiles come from the export's sidecar (input names and the named
dynamic axes) and from the serving limits below.

TensorRT cannot be installed on the project machines (README: deploying on a GPU host);
`build_engine` runs where `trtexec` exists (NGC TensorRT / Triton containers).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from avatar.asr.agreement import MAX_PREFIX_TOKENS
from avatar.asr.features import N_FRAMES
from export.sidecar import Sidecar
from export.tensorrt import engine
from export.tensorrt.engine import Range, ShapeProfile

MAX_BATCH = 8  # max_batch_size of both configs
MAX_TEXT = 448  # Whisper's text context


@dataclasses.dataclass(frozen=True)
class Profile(ShapeProfile):
    """min/opt/max of each dynamic axis, by the names the sidecar gives them.

    frames/positions go down to the asr model's smallest window (window_step 100 +
    window_margin 300: 400 frames), optimised for a 3-s question (600 frames); the
    self-attention cache starts empty (past = 0). The decoder's cross-attention state
    (cached_positions) is empty on a sequence's START step, where encoder_kv carries the
    window's K/V (new_positions), and holds it on every later step, where encoder_kv is empty.
    """

    batch: Range = (1, 4, MAX_BATCH)
    frames: Range = (400, 600, N_FRAMES)
    positions: Range = (200, 300, N_FRAMES // 2)
    # <|sot|>, then <|lang|><|task|>[<|notimestamps|>] and a caller's prefix (the `asr`
    # model's `prefix` input, avatar.asr.agreement), then one token per step
    tokens: Range = (1, 1, 3 + MAX_PREFIX_TOKENS)
    past: Range = (0, 32, MAX_TEXT - 1)
    cached_positions: Range = (0, 300, N_FRAMES // 2)
    new_positions: Range = (0, 0, N_FRAMES // 2)


# int8: from the Q/DQ variant model.int8.onnx (explicit quantisation, its WER gate in the
# sidecar; export/asr/int8.py), never from the FP32 graph with a calibration cache.
PRECISIONS = ("fp32", "fp16", "int8")


def trtexec_command(
    onnx_path: Path,
    engine_path: Path,
    sidecar: Sidecar,
    precision: str = "fp16",
    profile: Profile | None = None,
) -> list[str]:
    """The trtexec call that builds `engine_path` (fp32, fp16, or int8 from a Q/DQ graph)."""
    return engine.trtexec_command(
        onnx_path, engine_path, sidecar, profile or Profile(), precision, allowed=PRECISIONS
    )


def build_engine(artifact: Path, precision: str = "fp16") -> Path:
    """`artifact/model.onnx` -> `artifact/model.plan` (needs TensorRT)."""
    return engine.build_engine(artifact, Profile(), precision, allowed=PRECISIONS)
