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


def add_state_input(
    source: Path, dest: Path, *, state: str, new: str, output: str, axis: int, axes: Sequence[str]
) -> None:
    """The sequence form of a step graph, for Triton's implicit state: wherever the graph
    read input `state`, it now reads Concat(`state`, `new`) on `axis`, and that
    concatenation is also the graph output `output`. A sequence's first step carries the
    tensor in `new` (the state starts empty); later steps send `new` empty and the server
    feeds `output` back as `state`. `axes`: the names of `axis` in `state`, `new` and
    `output`. Checked and saved to `dest`."""
    import copy

    import onnx

    model = onnx.load(str(source))
    graph = model.graph
    (declared,) = [i for i in graph.input if i.name == state] or [None]
    if declared is None:
        raise ValueError(f"{source}: no graph input named {state!r}")
    for node in graph.node:
        node.input[:] = [output if name == state else name for name in node.input]
    added, result = copy.deepcopy(declared), copy.deepcopy(declared)
    added.name, result.name = new, output
    for value, name in zip((declared, added, result), axes, strict=True):
        dim = value.type.tensor_type.shape.dim[axis]
        dim.ClearField("dim_value")
        dim.dim_param = name
    graph.input.append(added)  # protobuf appends a copy: named above
    graph.output.append(result)
    graph.node.insert(0, onnx.helper.make_node("Concat", [state, new], [output], axis=axis))
    onnx.checker.check_model(model)
    onnx.save(model, str(dest))
