"""TensorRT engine recipe for `tts_vits` (production target): a `trtexec` command line.

Profiles come from the export's sidecar (input names, which axes are dynamic) and from
the serving limits: batch up to the config's max_batch_size, phoneme ids up to
2 * MAX_PHONEMES + 2 padded to the BLS's multiple, noise of the lengths the BLS sends.
TensorRT cannot be installed on the project machines (see DESIGN.md); `build_engine`
runs where `trtexec` exists (NGC TensorRT / Triton containers).
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import subprocess
from pathlib import Path

from avatar.sidecar import Sidecar
from avatar.tts.phonemes import MAX_PHONEMES
from avatar.tts.synth import NOISE_FRAMES, NOISE_PHONEMES

log = logging.getLogger(__name__)

PAD_TO = 64
MAX_IDS = -(-(2 * MAX_PHONEMES + 2) // PAD_TO) * PAD_TO  # 448


@dataclasses.dataclass(frozen=True)
class Profile:
    """min/opt/max of each dynamic axis, by the names the sidecar gives them."""

    batch: tuple[int, int, int] = (1, 4, 8)
    phonemes: tuple[int, int, int] = (PAD_TO, 2 * PAD_TO, MAX_IDS)
    noise_phonemes_len: tuple[int, int, int] = (NOISE_PHONEMES,) * 3
    noise_frames_len: tuple[int, int, int] = (NOISE_FRAMES,) * 3

    def shapes(self, sidecar: Sidecar) -> tuple[str, str, str]:
        """trtexec's --minShapes, --optShapes, --maxShapes values."""
        out = []
        for level in range(3):
            parts = []
            for spec in sidecar.inputs:
                dims = []
                for d in spec.shape:
                    if isinstance(d, int):
                        dims.append(d)
                    elif hasattr(self, d):
                        dims.append(getattr(self, d)[level])
                    else:
                        raise ValueError(f"input {spec.name}: no profile for dynamic axis {d!r}")
                parts.append(f"{spec.name}:{'x'.join(map(str, dims))}")
            out.append(",".join(parts))
        return out[0], out[1], out[2]


def trtexec_command(
    onnx_path: Path, engine_path: Path, sidecar: Sidecar, precision: str = "fp16",
    profile: Profile | None = None,
) -> list[str]:  # fmt: skip
    """The trtexec call that builds `engine_path` (fp32, fp16, or int8 from a Q/DQ graph)."""
    low, opt, high = (profile or Profile()).shapes(sidecar)
    cmd = [
        "trtexec",
        f"--onnx={onnx_path}",
        f"--saveEngine={engine_path}",
        f"--minShapes={low}",
        f"--optShapes={opt}",
        f"--maxShapes={high}",
    ]
    if precision == "fp16":
        cmd.append("--fp16")
    elif precision == "int8":
        cmd += ["--int8", "--fp16"]  # explicit Q/DQ precision; the rest may run in FP16
    elif precision != "fp32":
        raise ValueError(f"precision {precision!r}: expected fp32, fp16 or int8")
    return cmd


def build_engine(artifact: Path, precision: str = "fp16") -> Path:
    """Run trtexec on `artifact/model.onnx` -> `artifact/model.plan` (needs TensorRT)."""
    if shutil.which("trtexec") is None:
        raise FileNotFoundError("trtexec not found: build engines where TensorRT is installed")
    engine = artifact / "model.plan"
    cmd = trtexec_command(artifact / "model.onnx", engine, Sidecar.load(artifact), precision)
    log.info("building %s: %s", engine, " ".join(cmd))
    subprocess.run(cmd, check=True)
    return engine
