"""Small edits of exported ONNX files, shared by the recipes that need them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path


def set_output_dims(path: Path, dims: Mapping[str, Sequence[int | str]]) -> None:
    """Write the full shapes of graph outputs where the tracer lost static sizes (after a
    stack, a pooling, a reshape), so that configs and engine profiles see them. A str is a
    symbolic axis, an int a fixed size. Checked and saved in place."""
    import onnx

    model = onnx.load(str(path))
    missing = set(dims) - {output.name for output in model.graph.output}
    if missing:
        raise ValueError(f"{path}: no graph output named {sorted(missing)}")
    for output in model.graph.output:
        if output.name not in dims:
            continue
        shape = output.type.tensor_type.shape
        shape.ClearField("dim")
        for size in dims[output.name]:
            dim = shape.dim.add()
            if isinstance(size, str):
                dim.dim_param = size
            else:
                dim.dim_value = size
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
