"""The JSON sidecar every export writes next to its artifact.

It records what a Triton config must agree with (tensor names, dtypes, dims, which axis
is the batch) and where the artifact came from (source checksum, opset, validation
figures). `export.config_check` checks every native model's `config.pbtxt` against it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from avatar.config_dtypes import TRITON_DTYPES

ENGINE_RECORD = "engine.json"  # written by `python -m export engines` beside model.plan

Dim = int | str  # an int is fixed; a str names a dynamic axis ("batch", "samples", ...)


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """One input or output of an exported model, as the model itself sees it."""

    name: str
    dtype: str  # numpy dtype name, e.g. "float32"
    shape: tuple[Dim, ...]

    def __post_init__(self) -> None:
        if self.dtype not in TRITON_DTYPES:
            raise ValueError(f"{self.name}: dtype {self.dtype!r} has no Triton equivalent")

    @property
    def triton_dtype(self) -> str:
        return TRITON_DTYPES[self.dtype]

    def triton_dims(self, batch_axis: int | None) -> list[int]:
        """Dims as a Triton config writes them: -1 for dynamic, the batch axis left out."""
        dims = [d if isinstance(d, int) else -1 for d in self.shape]
        if batch_axis is not None:
            del dims[batch_axis]
        return dims

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TensorSpec:
        return cls(data["name"], data["dtype"], tuple(data["shape"]))

    @classmethod
    def of(cls, name: str, array: np.ndarray, dynamic: dict[int, str] | None = None) -> TensorSpec:
        shape: list[Dim] = list(array.shape)
        for axis, label in (dynamic or {}).items():
            shape[axis] = label
        return cls(name, array.dtype.name, tuple(shape))


@dataclasses.dataclass
class Sidecar:
    """What an exported artifact is, where it came from, and how it was verified."""

    model: str
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    batch_axis: int | None = 0  # None: the model does not batch
    format: str = "onnx"
    opset: int | None = None
    source: dict[str, str] = dataclasses.field(default_factory=dict)  # {name: sha256}
    validation: dict[str, Any] = dataclasses.field(default_factory=dict)
    notes: list[str] = dataclasses.field(default_factory=list)

    FILENAME = "model.json"

    def save(self, folder: Path) -> Path:
        path = Path(folder) / self.FILENAME
        data = dataclasses.asdict(self)
        data["inputs"] = [t.to_json() for t in self.inputs]
        data["outputs"] = [t.to_json() for t in self.outputs]
        path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
        return path

    @classmethod
    def load(cls, folder: Path) -> Sidecar:
        path = Path(folder) / cls.FILENAME
        data = json.loads(path.read_text())
        data["inputs"] = [TensorSpec.from_json(t) for t in data["inputs"]]
        data["outputs"] = [TensorSpec.from_json(t) for t in data["outputs"]]
        return cls(**data)


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with Path(path).open("rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()
