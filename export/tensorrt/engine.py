"""TensorRT engines from verified ONNX artifacts (production target).

Each stage declares a `ShapeProfile`: min/opt/max for every named dynamic axis of its
export (the sidecar names them), chosen from its serving limits. `trtexec_command`
turns sidecar + profile into trtexec's explicit --minShapes/--optShapes/--maxShapes;
`build_engine` runs it where TensorRT exists (NGC TensorRT / Triton containers; it cannot
be installed on the project machines: README, deploying on a GPU host).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from avatar.sidecar import Sidecar

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
    """TensorRT's trtexec is not on this machine."""


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


# ------------------------------------------------------------------ running an engine


def run_command(
    engine_path: Path,
    input_files: Mapping[str, Path],
    shapes: Mapping[str, Shape],
    output_json: Path,
    trtexec: str = "trtexec",
) -> list[str]:
    """trtexec running `engine_path` once on raw input files, outputs written as JSON."""
    loads = ",".join(f"'{name}':{path}" for name, path in input_files.items())
    return [
        trtexec,
        f"--loadEngine={engine_path}",
        f"--shapes={shape_arg(shapes)}",
        f"--loadInputs={loads}",
        f"--exportOutput={output_json}",
        "--warmUp=0",
        "--duration=0",
        "--iterations=1",
        "--avgRuns=1",
    ]


def write_inputs(inputs: Mapping[str, np.ndarray], folder: Path) -> dict[str, Path]:
    """Each input as the raw little-endian file trtexec's --loadInputs reads."""
    folder.mkdir(parents=True, exist_ok=True)
    files = {}
    for index, (name, array) in enumerate(inputs.items()):
        path = folder / f"input{index}.bin"
        np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<")).tofile(path)
        files[name] = path
    return files


_NON_FINITE = re.compile(r"(?<![\w.])(-?)(nan|inf)(?![\w])", re.IGNORECASE)


def parse_exported_outputs(
    text: str, dtypes: Mapping[str, str] | None = None
) -> dict[str, np.ndarray]:
    """trtexec --exportOutput JSON ([{name, dimensions "AxB", values [...]}]) as arrays.

    trtexec prints values with C++ stream defaults (6 significant digits; `nan`/`inf`
    unquoted), so a comparison against it cannot be tighter than a relative 1e-5.
    dtypes: output name -> numpy dtype name (default float32).
    """

    def literal(match: re.Match[str]) -> str:
        word = "NaN" if match.group(2).lower() == "nan" else "Infinity"
        return ("-" if match.group(1) and word != "NaN" else "") + word

    records = json.loads(_NON_FINITE.sub(literal, text))
    out = {}
    for record in records:
        name = record["name"]
        dims = str(record["dimensions"]).strip()
        shape = tuple(int(d) for d in dims.split("x")) if dims else ()
        dtype = (dtypes or {}).get(name, "float32")
        values = np.asarray(record["values"], dtype=np.float64)
        if values.size != int(np.prod(shape)):
            raise ValueError(f"output {name!r}: {values.size} values for dimensions {dims!r}")
        out[name] = values.reshape(shape).astype(dtype)
    return out


# trtexec prints 8-bit integers with `os << v` (characters, not numbers): such outputs
# (the renderer's uint8 frames) are read through the TensorRT Python API instead.
TRTEXEC_UNREADABLE = {"uint8", "int8"}


def run_engine(
    engine_path: Path,
    inputs: Mapping[str, np.ndarray],
    work: Path,
    dtypes: Mapping[str, str] | None = None,
) -> dict[str, np.ndarray]:
    """Run the engine once on `inputs`; its outputs (needs TensorRT and a GPU).

    The TensorRT Python API with torch CUDA buffers where both import (the engines image),
    else trtexec (--loadInputs / --exportOutput), which cannot return 8-bit outputs.
    """
    try:
        import tensorrt  # noqa: F401
        import torch

        if torch.cuda.is_available():
            return run_engine_python(engine_path, inputs)
    except ImportError:
        pass
    unreadable = sorted(n for n, d in (dtypes or {}).items() if d in TRTEXEC_UNREADABLE)
    if unreadable:
        raise TensorRTMissingError(
            f"outputs {unreadable} are 8-bit, which trtexec prints as characters: verifying "
            f"{engine_path.name} needs the TensorRT Python API and torch with CUDA"
        )
    trtexec = find_trtexec()
    files = write_inputs(inputs, work)
    shapes = {name: tuple(a.shape) for name, a in inputs.items()}
    output_json = work / "outputs.json"
    cmd = run_command(engine_path, files, shapes, output_json, trtexec)
    log.info("running %s", engine_path)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return parse_exported_outputs(output_json.read_text(), dtypes)


def run_engine_python(engine_path: Path, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One execution through the TensorRT 10 Python API, buffers in torch CUDA tensors."""
    import tensorrt as trt
    import torch

    runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
    engine = runtime.deserialize_cuda_engine(Path(engine_path).read_bytes())
    if engine is None:
        raise RuntimeError(f"{engine_path}: TensorRT could not deserialise the engine")
    context = engine.create_execution_context()
    buffers: dict[str, torch.Tensor] = {}
    for name, array in inputs.items():
        buffers[name] = torch.from_numpy(np.ascontiguousarray(array)).cuda()
        context.set_input_shape(name, tuple(array.shape))
        context.set_tensor_address(name, buffers[name].data_ptr())
    outputs = []
    for index in range(engine.num_io_tensors):
        name = engine.get_tensor_name(index)
        if engine.get_tensor_mode(name) != trt.TensorIOMode.OUTPUT:
            continue
        dtype = torch.from_numpy(np.empty(0, trt.nptype(engine.get_tensor_dtype(name)))).dtype
        shape = tuple(context.get_tensor_shape(name))
        buffers[name] = torch.empty(shape, dtype=dtype, device="cuda")
        context.set_tensor_address(name, buffers[name].data_ptr())
        outputs.append(name)
    stream = torch.cuda.Stream()
    if not context.execute_async_v3(stream.cuda_stream):
        raise RuntimeError(f"{engine_path}: execution failed")
    stream.synchronize()
    return {name: buffers[name].cpu().numpy() for name in outputs}
