"""TensorRT engines from verified ONNX artifacts (production target).

Each stage declares a `ShapeProfile`: min/opt/max for every named dynamic axis of its
export (the sidecar names them), chosen from its serving limits. `trtexec_command`
turns sidecar + profile into trtexec's explicit --minShapes/--optShapes/--maxShapes;
`build_engine` runs it where TensorRT exists (NGC TensorRT / Triton containers; it cannot
be installed on the project machines: README, deploying on a GPU host).

The build stays with trtexec (rather than Polygraphy's `EngineFromNetwork`): these command
lines are the recipes that `export/asr/engine.py` and `export/llm/engine.py` share and that
their tests check flag by flag, and `build_engine` logs the command so that a failed build
reruns by hand. Running the engine
for verification goes through Polygraphy (`export/tensorrt/verify.py`), which needs
TensorRT's Python bindings as well: `require_tensorrt` checks both before any work.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from export.sidecar import Sidecar

log = logging.getLogger(__name__)

PRECISIONS = ("fp32", "fp16", "int8")
Range = tuple[int, int, int]  # min, opt, max
Shape = tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class ShapeProfile:
    """Subclasses declare one `Range` field per dynamic axis name of their sidecar."""

    def axis(self, name: str) -> Range:
        if name not in {f.name for f in dataclasses.fields(self)}:
            raise ValueError(f"{type(self).__name__} has no profile for dynamic axis {name!r}")
        return getattr(self, name)

    def ranges(self, sidecar: Sidecar) -> dict[str, tuple[Shape, Shape, Shape]]:
        """Explicit (min, opt, max) shape of every input of the sidecar, in input order."""
        out: dict[str, tuple[Shape, Shape, Shape]] = {}
        for spec in sidecar.inputs:
            try:
                levels = [
                    tuple(d if isinstance(d, int) else self.axis(d)[level] for d in spec.shape)
                    for level in range(3)
                ]
            except ValueError as error:
                raise ValueError(f"input {spec.name}: {error}") from None
            out[spec.name] = (levels[0], levels[1], levels[2])
        return out

    def shapes(self, sidecar: Sidecar) -> tuple[str, str, str]:
        """trtexec's --minShapes, --optShapes and --maxShapes values for the sidecar's inputs."""
        ranges = self.ranges(sidecar)
        low, opt, high = (
            shape_arg({name: r[level] for name, r in ranges.items()}) for level in range(3)
        )
        return low, opt, high


def shape_arg(shapes: Mapping[str, Shape]) -> str:
    """`name:AxBxC,...` as trtexec's --*Shapes options (and ORT's trt_profile_*) take it."""
    return ",".join(f"{name}:{'x'.join(map(str, dims))}" for name, dims in shapes.items())


class TensorRTMissingError(FileNotFoundError):
    """TensorRT's trtexec or its Python bindings are not on this machine."""


# Where the NGC TensorRT / Triton images keep trtexec when it is not on PATH.
TRTEXEC_LOCATIONS = ("/usr/src/tensorrt/bin/trtexec", "/opt/tensorrt/bin/trtexec")
MISSING_TENSORRT = (
    "TensorRT's trtexec was not found (not on PATH, nor in {locations}). Engines are built "
    "where TensorRT exists, on the GPU host: `docker compose run --rm engines` (the "
    "nvcr.io/nvidia/tensorrt:24.10-py3 image, matched to Triton 24.10), or set TRTEXEC."
)


def find_trtexec() -> str:
    """Path of trtexec ($TRTEXEC, PATH, the NGC locations) or TensorRTMissingError."""
    candidates = [os.environ.get("TRTEXEC", ""), shutil.which("trtexec") or ""]
    for path in [*candidates, *TRTEXEC_LOCATIONS]:
        if path and os.access(path, os.X_OK):
            return path
    raise TensorRTMissingError(MISSING_TENSORRT.format(locations=", ".join(TRTEXEC_LOCATIONS)))


MISSING_TENSORRT_PYTHON = (
    "TensorRT's Python bindings (`import tensorrt`: {error}) are missing: engines are verified "
    "through them (Polygraphy's TrtRunner). They come with the nvcr.io/nvidia/tensorrt image: "
    "`docker compose run --rm engines`."
)


def require_tensorrt_python() -> None:
    """TensorRTMissingError unless `import tensorrt` works (the verification runs engines)."""
    try:
        importlib.import_module("tensorrt")
    except (ImportError, OSError) as error:  # OSError: the module without libnvinfer
        raise TensorRTMissingError(MISSING_TENSORRT_PYTHON.format(error=error)) from None


def require_tensorrt() -> str:
    """trtexec (the build) and the tensorrt module (the verification), else TensorRTMissingError."""
    trtexec = find_trtexec()
    require_tensorrt_python()
    return trtexec


def trtexec_command(
    onnx_path: Path,
    engine_path: Path,
    sidecar: Sidecar,
    profile: ShapeProfile,
    precision: str = "fp16",
    *,
    allowed: Sequence[str] = PRECISIONS,
    trtexec: str = "trtexec",
) -> list[str]:
    """The trtexec call that builds `engine_path` from `onnx_path` (no timing run)."""
    if precision not in allowed:
        raise ValueError(f"precision {precision!r}: expected one of {', '.join(allowed)}")
    low, opt, high = profile.shapes(sidecar)
    cmd = [
        trtexec,
        f"--onnx={onnx_path}",
        f"--saveEngine={engine_path}",
        f"--minShapes={low}",
        f"--optShapes={opt}",
        f"--maxShapes={high}",
        "--skipInference",
    ]
    if precision == "fp32":
        cmd.append("--noTF32")  # FP32 means FP32: TensorRT would use TF32 tensor cores
    elif precision == "fp16":
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
    onnx_file: str = "model.onnx",
) -> Path:
    """Run trtexec on `artifact/onnx_file` -> `artifact/model.plan`."""
    trtexec = find_trtexec()
    engine = artifact / "model.plan"
    sidecar = Sidecar.load(artifact)
    cmd = trtexec_command(
        artifact / onnx_file, engine, sidecar, profile, precision, allowed=allowed, trtexec=trtexec
    )
    log.info("building %s: %s", engine, " ".join(cmd))
    subprocess.run(cmd, check=True)
    return engine
