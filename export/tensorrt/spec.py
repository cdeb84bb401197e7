"""What a TensorRT engine stage is (Triton-free, TensorRT-free): the shape profile, the
precisions, the per-output tolerances and the verification inputs of one model's engine.
Each stage declares its own in `export/<stage>/stage.py` (export.stage.ExportStage.engine);
`export/tensorrt/build.py` builds and verifies them."""

from __future__ import annotations

import dataclasses
import fnmatch
import importlib
from collections.abc import Callable, Iterable, Mapping

import numpy as np

from export.common import Tolerance
from export.tensorrt.engine import Shape, ShapeProfile

InputRule = Callable[[Shape, Mapping[str, int], np.random.Generator], np.ndarray]


def ints(high: int) -> InputRule:
    return lambda shape, _axes, rng: rng.integers(0, high, size=shape, dtype=np.int64)


def uniform(low: float, high: float) -> InputRule:
    return lambda shape, _axes, rng: rng.uniform(low, high, size=shape).astype(np.float32)


def ones(shape: Shape, _axes: Mapping[str, int], _rng: np.random.Generator) -> np.ndarray:
    return np.ones(shape, np.int64)


def positions(shape: Shape, axes: Mapping[str, int], _rng: np.random.Generator) -> np.ndarray:
    """position_ids of the new tokens after `past_sequence` cached ones."""
    row = np.arange(axes["past_sequence"], axes["past_sequence"] + shape[-1], dtype=np.int64)
    return np.broadcast_to(row, shape).copy()


FP32 = Tolerance(atol=2e-3, rtol=1e-3)  # what the ONNX exports met against PyTorch


@dataclasses.dataclass(frozen=True)
class Stage:
    """How one model's engine is built and verified."""

    profile: str  # "module:ShapeProfile subclass"
    allowed: tuple[str, ...]  # precisions it may be built in
    default: str  # its precision unless an INT8 variant passed its gate
    fp16: Mapping[str, Tolerance]  # per output (fnmatch patterns) at FP16 / INT8
    fp32: Mapping[str, Tolerance] = dataclasses.field(default_factory=dict)  # else FP32
    inputs: Mapping[str, InputRule] = dataclasses.field(default_factory=dict)
    verify_axes: Mapping[str, int] = dataclasses.field(default_factory=dict)  # else opt
    why: str = ""
    # False: a passed INT8 gate is used only when INT8 is asked for (--precision int8)
    int8_by_default: bool = True

    def make_profile(self) -> ShapeProfile:
        module, name = self.profile.split(":")
        return getattr(importlib.import_module(module), name)()

    def tolerances(self, precision: str, outputs: Iterable[str]) -> dict[str, Tolerance]:
        """The tolerance of every output at `precision` (an uncovered output is an error)."""
        table = self.fp32 if precision == "fp32" else self.fp16
        out = {}
        for name in outputs:
            match = [tol for pattern, tol in table.items() if fnmatch.fnmatch(name, pattern)]
            if precision == "fp32" and not match:
                match = [FP32]
            if not match:
                raise KeyError(f"no {precision} tolerance for output {name!r}")
            out[name] = match[0]
        return out
