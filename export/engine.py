"""TensorRT engines from verified ONNX artifacts (production target).

Each stage declares a `ShapeProfile`: min/opt/max for every named dynamic axis of its
export (the sidecar names them), chosen from its serving limits. `trtexec_command`
turns sidecar + profile into trtexec's explicit --minShapes/--optShapes/--maxShapes;
`build_engine` runs it where TensorRT exists (NGC TensorRT / Triton containers; it cannot
be installed on the project machines, see DESIGN.md).
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from avatar.sidecar import Sidecar

log = logging.getLogger(__name__)

PRECISIONS = ("fp32", "fp16", "int8")
Range = tuple[int, int, int]  # min, opt, max


@dataclasses.dataclass(frozen=True)
class ShapeProfile:
    """Subclasses declare one `Range` field per dynamic axis name of their sidecar."""

    def axis(self, name: str) -> Range:
        if name not in {f.name for f in dataclasses.fields(self)}:
            raise ValueError(f"{type(self).__name__} has no profile for dynamic axis {name!r}")
        return getattr(self, name)

    def shapes(self, sidecar: Sidecar) -> tuple[str, str, str]:
        """trtexec's --minShapes, --optShapes and --maxShapes values for the sidecar's inputs."""
        levels = []
        for level in range(3):
            parts = []
            for spec in sidecar.inputs:
                try:
                    dims = [d if isinstance(d, int) else self.axis(d)[level] for d in spec.shape]
                except ValueError as error:
                    raise ValueError(f"input {spec.name}: {error}") from None
                parts.append(f"{spec.name}:{'x'.join(map(str, dims))}")
            levels.append(",".join(parts))
        return levels[0], levels[1], levels[2]


def trtexec_command(
    onnx_path: Path,
    engine_path: Path,
    sidecar: Sidecar,
    profile: ShapeProfile,
    precision: str = "fp16",
    *,
    allowed: Sequence[str] = PRECISIONS,
) -> list[str]:
    """The trtexec call that builds `engine_path` from `onnx_path`."""
    if precision not in allowed:
        raise ValueError(f"precision {precision!r}: expected one of {', '.join(allowed)}")
    low, opt, high = profile.shapes(sidecar)
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
    return cmd


def build_engine(
    artifact: Path,
    profile: ShapeProfile,
    precision: str = "fp16",
    *,
    allowed: Sequence[str] = PRECISIONS,
) -> Path:
    """Run trtexec on `artifact/model.onnx` -> `artifact/model.plan`."""
    if shutil.which("trtexec") is None:
        raise FileNotFoundError("trtexec not found: build engines where TensorRT is installed")
    engine = artifact / "model.plan"
    sidecar = Sidecar.load(artifact)
    cmd = trtexec_command(
        artifact / "model.onnx", engine, sidecar, profile, precision, allowed=allowed
    )
    log.info("building %s: %s", engine, " ".join(cmd))
    subprocess.run(cmd, check=True)
    return engine
