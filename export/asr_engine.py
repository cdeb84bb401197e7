"""TensorRT engine recipes for `asr_encoder` and `asr_decoder` (production target): trtexec
command lines whose shape profiles come from the export's sidecar (input names and the named
dynamic axes) and from the serving limits below.

TensorRT cannot be installed on the project machines (DESIGN.md); `build_engine` runs where
`trtexec` exists (NGC TensorRT / Triton containers).
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import subprocess
from pathlib import Path

from avatar.asr.features import N_FRAMES
from avatar.sidecar import Sidecar

log = logging.getLogger(__name__)

MAX_BATCH = 8  # max_batch_size of both configs
MAX_TEXT = 448  # Whisper's text context


@dataclasses.dataclass(frozen=True)
class Profile:
    """min/opt/max of each dynamic axis, by the names the sidecar gives them.

    frames/positions go down to a 3-s window so that the asr model's `window_step` option
    can use the same engine; the self-attention cache starts empty (past = 0).
    """

    batch: tuple[int, int, int] = (1, 4, MAX_BATCH)
    frames: tuple[int, int, int] = (300, N_FRAMES, N_FRAMES)
    positions: tuple[int, int, int] = (150, N_FRAMES // 2, N_FRAMES // 2)
    tokens: tuple[int, int, int] = (1, 1, 3)  # <|sot|>, then <|lang|><|task|>[<|notimestamps|>]
    past: tuple[int, int, int] = (0, 32, MAX_TEXT - 1)

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
                    elif d in {f.name for f in dataclasses.fields(self)}:
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
    """The trtexec call that builds `engine_path` (fp32 or fp16; INT8 changed transcripts on
    ONNX Runtime, see `python -m export.asr --report`, so it is not offered here)."""
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
    elif precision != "fp32":
        raise ValueError(f"precision {precision!r}: expected fp32 or fp16")
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
