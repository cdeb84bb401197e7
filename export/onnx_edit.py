"""Small edits of exported ONNX files, shared by the recipes that need them."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path


def declare_output_dims(path: Path, output: int, dims: Mapping[int, int]) -> None:
    """Declare fixed sizes for axes of an output the tracer left symbolic (e.g. frames
    [batch, H, W, 3]), so that configs and engine profiles see them; checked and saved."""
    import onnx

    model = onnx.load(str(path))
    shape = model.graph.output[output].type.tensor_type.shape.dim
    for axis, value in dims.items():
        shape[axis].ClearField("dim_param")
        shape[axis].dim_value = value
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
