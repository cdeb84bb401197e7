"""TensorRT engine recipe for `tts_vits` (production target): a `trtexec` command line.

Profiles come from the export's sidecar (input names, which axes are dynamic) and from
the serving limits: batch up to the config's max_batch_size, phoneme ids up to
2 * MAX_PHONEMES + 2 padded to the BLS's multiple, noise of the lengths the BLS sends.
TensorRT cannot be installed on the project machines (see DESIGN.md); `build_engine`
runs where `trtexec` exists (NGC TensorRT / Triton containers).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from avatar.sidecar import Sidecar
from avatar.tts.phonemes import MAX_PHONEMES
from avatar.tts.synth import NOISE_FRAMES, NOISE_PHONEMES
from export import engine
from export.engine import Range, ShapeProfile

PAD_TO = 64
MAX_IDS = -(-(2 * MAX_PHONEMES + 2) // PAD_TO) * PAD_TO  # 448


@dataclasses.dataclass(frozen=True)
class Profile(ShapeProfile):
    """min/opt/max of each dynamic axis, by the names the sidecar gives them."""

    batch: Range = (1, 4, 8)
    phonemes: Range = (PAD_TO, 2 * PAD_TO, MAX_IDS)
    noise_phonemes_len: Range = (NOISE_PHONEMES,) * 3
    noise_frames_len: Range = (NOISE_FRAMES,) * 3


def trtexec_command(
    onnx_path: Path,
    engine_path: Path,
    sidecar: Sidecar,
    precision: str = "fp16",
    profile: Profile | None = None,
) -> list[str]:
    """The trtexec call that builds `engine_path` (fp32, fp16, or int8 from a Q/DQ graph)."""
    return engine.trtexec_command(onnx_path, engine_path, sidecar, profile or Profile(), precision)


def build_engine(artifact: Path, precision: str = "fp16") -> Path:
    """`artifact/model.onnx` -> `artifact/model.plan` (needs TensorRT)."""
    return engine.build_engine(artifact, Profile(), precision)
