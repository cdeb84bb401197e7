"""Shared export machinery: the artifact cache, ONNX introspection, and verification.

Every exporter is an `ArtifactRecipe`: it declares what its result depends on (source
checksums, its own code, options) and builds into a folder. `ensure()` keys the folder
by those inputs under the cache root, so a second run reuses it, and a change of source
or code rebuilds it. Each build verifies its artifact against the reference and fails
loudly (typed `ValidationError`s) rather than writing an unverified file.
"""

from __future__ import annotations

import abc
import dataclasses
import hashlib
import inspect
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from export.sidecar import Sidecar, TensorSpec, sha256_file

log = logging.getLogger(__name__)

CACHE_ENV = "AVATAR_CACHE"
ONNX_TO_NUMPY = {
    1: "float32",
    2: "uint8",
    3: "int8",
    5: "int16",
    6: "int32",
    7: "int64",
    9: "bool",
    10: "float16",
    11: "float64",
}


def worker_logging() -> None:
    """Logging in a worker process of a parallel build or gate run, as `python -m export`."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")


def cache_root() -> Path:
    """Where built artifacts live: $AVATAR_CACHE, else ~/.cache/triton-avatar (outside git)."""
    root = os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "triton-avatar"
    return Path(root)


# ---------------------------------------------------------------------------- recipes


class ArtifactRecipe(abc.ABC):
    """How to build one artifact folder (`model.onnx` + `model.json`, maybe variants)."""

    name: str  # the Triton model name the artifact serves
    code_files: tuple[Path, ...] = ()  # extra code the artifact depends on

    @abc.abstractmethod
    def key_inputs(self) -> dict[str, str]:
        """Everything the result depends on, as strings (checksums, options)."""

    @abc.abstractmethod
    def build(self, out_dir: Path) -> Sidecar:
        """Write the artifact into `out_dir`, verify it, and return its sidecar."""

    def key(self) -> str:
        inputs = dict(self.key_inputs())
        for path in (Path(__file__), Path(inspect.getfile(type(self))), *self.code_files):
            inputs[f"code:{Path(path).name}"] = sha256_file(path)
        blob = json.dumps(inputs, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def sidecar(
        self,
        path: Path,
        *,
        source: dict[str, str],
        validation: dict[str, Any],
        notes: list[str],
        opset: int | None = None,
        model: str | None = None,
    ) -> Sidecar:
        """The sidecar of the ONNX file `path`: its inputs and outputs as the file declares
        them, batched on axis 0; `opset` None: the file's own (default domain)."""
        inputs, outputs = describe_onnx(path)
        return Sidecar(
            model=model or self.name,
            inputs=inputs,
            outputs=outputs,
            batch_axis=0,
            opset=onnx_opset(path) if opset is None else opset,
            source=source,
            validation=validation,
            notes=notes,
        )


def ensure(recipe: ArtifactRecipe, root: Path | None = None, force: bool = False) -> Path:
    """Return the artifact folder for `recipe`, building it when it is not in the cache."""
    root = Path(root or cache_root())
    folder = root / recipe.name / recipe.key()
    if (folder / Sidecar.FILENAME).is_file() and not force:
        log.debug("%s: cached at %s", recipe.name, folder)
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{recipe.name}-", dir=folder.parent))
    started = time.monotonic()
    log.info("%s: building into %s", recipe.name, folder)
    try:
        sidecar = recipe.build(staging)
        sidecar.save(staging)
        if folder.exists():
            shutil.rmtree(folder)
        staging.rename(folder)  # atomic: a half-built folder is never seen as cached
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    log.info("%s: built in %.1f s", recipe.name, time.monotonic() - started)
    return folder


# ------------------------------------------------------------------------- ONNX helpers


def describe_onnx(path: Path) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """Inputs and outputs of an ONNX file with their dtypes and (named) dims."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    initializers = {init.name for init in model.graph.initializer}

    def spec(value: onnx.ValueInfoProto) -> TensorSpec:
        tensor = value.type.tensor_type
        dims = tuple(d.dim_param or d.dim_value for d in tensor.shape.dim)
        return TensorSpec(value.name, ONNX_TO_NUMPY[tensor.elem_type], dims)

    inputs = [spec(v) for v in model.graph.input if v.name not in initializers]
    return inputs, [spec(v) for v in model.graph.output]


def onnx_opset(path: Path) -> int:
    """The opset of the default ONNX domain that `path` was written with."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))


def torch_to_onnx(
    module: Any,
    args: Sequence[Any],
    path: Path,
    *,
    inputs: Sequence[str],
    outputs: Sequence[str],
    opset: int,
    dynamic_axes: Mapping[str, Mapping[int, str]] | None = None,
) -> Path:
    """Trace `module` on `args` into the ONNX file `path` with named tensors (TorchScript
    exporter); `dynamic_axes` default: axis 0 of every tensor is `batch`."""
    import torch

    if dynamic_axes is None:
        dynamic_axes = {name: {0: "batch"} for name in (*inputs, *outputs)}
    with torch.no_grad():
        torch.onnx.export(
            module,
            tuple(args),
            str(path),
            input_names=list(inputs),
            output_names=list(outputs),
            dynamic_axes={name: dict(axes) for name, axes in dynamic_axes.items()},
            opset_version=opset,
            dynamo=False,
        )
    return path


def build_command(
    make: Callable[[], ArtifactRecipe], description: str, argv: list[str] | None = None
) -> Path:
    """`python -m export.<stage>`: build the artifact of `make()` (cached unless --force) and
    log its folder and sidecar."""
    import argparse

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--force", action="store_true", help="rebuild even if cached")
    args = parser.parse_args(argv)
    worker_logging()
    recipe = make()
    folder = ensure(recipe, force=args.force)
    log.info("%s artifact: %s\n%s", recipe.name, folder, (folder / Sidecar.FILENAME).read_text())
    return folder


def onnx_session(path: Path, threads: int = 1):  # -> onnxruntime.InferenceSession
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3  # unused-initializer warnings are noise here
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


# ------------------------------------------------------------------------- verification


class ValidationError(AssertionError):
    """An exported artifact disagrees with its reference."""


class MissingOutputError(ValidationError):
    pass


class ShapeMismatchError(ValidationError):
    pass


class ToleranceError(ValidationError):
    pass


@dataclasses.dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float = 0.0


@dataclasses.dataclass(frozen=True)
class OutputComparison:
    name: str
    max_abs: float
    max_rel: float
    atol: float
    rtol: float

    def to_json(self) -> dict[str, float | str]:
        return dataclasses.asdict(self)


def compare_outputs(
    reference: Mapping[str, np.ndarray],
    candidate: Mapping[str, np.ndarray],
    tolerances: Mapping[str, Tolerance],
    context: str = "",
) -> list[OutputComparison]:
    """Compare each named output (Polygraphy-style: |a-b| <= atol + rtol*|b| elementwise)."""
    where = f" ({context})" if context else ""
    results = []
    for name, tol in tolerances.items():
        if name not in candidate:
            raise MissingOutputError(f"output {name!r} missing from candidate{where}")
        ref, got = np.asarray(reference[name]), np.asarray(candidate[name])
        if ref.shape != got.shape:
            raise ShapeMismatchError(
                f"output {name!r}: shape {got.shape}, reference {ref.shape}{where}"
            )
        diff = np.abs(got.astype(np.float64) - ref.astype(np.float64))
        scale = np.abs(ref.astype(np.float64))
        max_abs = float(diff.max(initial=0.0))
        max_rel = float((diff / np.maximum(scale, 1e-12)).max(initial=0.0))
        if not np.all(diff <= tol.atol + tol.rtol * scale):
            raise ToleranceError(
                f"output {name!r}: max abs error {max_abs:.3g}, max rel {max_rel:.3g} "
                f"exceed atol={tol.atol:g} rtol={tol.rtol:g}{where}"
            )
        results.append(OutputComparison(name, max_abs, max_rel, tol.atol, tol.rtol))
    return results


def worst(comparisons: list[OutputComparison]) -> dict[str, dict[str, float | str]]:
    """Worst error per output over many comparisons, for the sidecar's validation record."""
    summary: dict[str, dict[str, float | str]] = {}
    for c in comparisons:
        prev = summary.get(c.name)
        if prev is None or c.max_abs > float(prev["max_abs"]):
            summary[c.name] = c.to_json()
    return summary
