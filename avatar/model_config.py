"""A model's `config.pbtxt`, read as Triton's `ModelConfig` protobuf, and checked against
its export's sidecar (names, dtypes, dims, batch axis), so configs cannot drift from
exports. Shared by the materialisation (`serving.repository`) and the engine build
(`export.tensorrt.build`); `model_repository/` holds the production config of every model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from avatar.sidecar import Sidecar, TensorSpec

SOURCE_REPOSITORY = Path(__file__).resolve().parents[1] / "model_repository"
ONNX_PLATFORMS = {"onnxruntime_onnx"}
TENSORRT_PLATFORMS = {"tensorrt_plan"}
NATIVE_PLATFORMS = ONNX_PLATFORMS | TENSORRT_PLATFORMS
ENGINE_RECORD = "engine.json"  # written by `python -m export engines` beside model.plan


class RepositoryError(ValueError):
    """A model repository or one of its configs is not usable."""


class ConfigMismatchError(RepositoryError):
    """A config.pbtxt disagrees with the exported model's sidecar."""


def parse_config(path: Path) -> mc.ModelConfig:
    """Parse a config.pbtxt as Triton's `ModelConfig` protobuf (errors name the file)."""
    try:
        return text_format.Parse(Path(path).read_text(), mc.ModelConfig())
    except text_format.ParseError as error:
        raise RepositoryError(f"{path}: not a valid Triton ModelConfig: {error}") from None


def platform_of(config: mc.ModelConfig) -> str:
    if config.platform:
        return config.platform
    return {"onnxruntime": "onnxruntime_onnx", "tensorrt": "tensorrt_plan"}.get(
        config.backend, config.backend
    )


def is_native(config: mc.ModelConfig) -> bool:
    return platform_of(config) in NATIVE_PLATFORMS


def _dtype_name(value: int) -> str:
    return mc.DataType.Name(value)


def check_against_sidecar(config: mc.ModelConfig, sidecar: Sidecar) -> None:
    """Raise ConfigMismatchError listing every way the config disagrees with the export."""
    problems: list[str] = []
    batching = config.max_batch_size > 0
    if batching and sidecar.batch_axis != 0:
        problems.append(
            f"max_batch_size={config.max_batch_size} but the export batches on axis "
            f"{sidecar.batch_axis} (Triton batches on axis 0)"
        )
    batch_axis = 0 if batching else None

    def compare(kind: str, declared: Iterable, exported: list[TensorSpec]) -> None:
        by_name = {t.name: t for t in exported}
        seen = set()
        for entry in declared:
            seen.add(entry.name)
            spec = by_name.get(entry.name)
            if spec is None:
                problems.append(
                    f"{kind} {entry.name!r} is not in the export (it has {sorted(by_name)})"
                )
                continue
            if _dtype_name(entry.data_type) != spec.triton_dtype:
                problems.append(
                    f"{kind} {entry.name!r}: data_type {_dtype_name(entry.data_type)}, "
                    f"export has {spec.triton_dtype}"
                )
            want = spec.triton_dims(batch_axis if spec.shape else None)
            if list(entry.dims) != want:
                problems.append(
                    f"{kind} {entry.name!r}: dims {list(entry.dims)}, export has {want}"
                )
        missing = sorted(set(by_name) - seen)
        if missing and kind == "input":
            problems.append(f"export inputs missing from the config: {missing}")

    states = list(config.sequence_batching.state)
    inputs = [*config.input, *(_StateTensor(st.input_name, st.data_type, st.dims) for st in states)]
    outputs = [
        *config.output,
        *(_StateTensor(st.output_name, st.data_type, st.dims) for st in states),
    ]
    compare("input", inputs, sidecar.inputs)
    compare("output", outputs, sidecar.outputs)
    if problems:
        raise ConfigMismatchError(
            f"model {config.name!r}: config.pbtxt disagrees with the export "
            f"({sidecar.model}):\n  - " + "\n  - ".join(problems)
        )


@dataclasses.dataclass(frozen=True)
class _StateTensor:
    """An implicit-state tensor, compared with the export like a declared input/output."""

    name: str
    data_type: int
    dims: Iterable[int]


def model_names(source: Path = SOURCE_REPOSITORY) -> list[str]:
    return sorted(p.parent.name for p in Path(source).glob("*/config.pbtxt"))


def call_graph(
    source: Path = SOURCE_REPOSITORY, root: str | None = None
) -> dict[str, dict[str, str]]:
    """{caller: {parameter: callee}} of the BLS models, read from their configs: every
    `*_model` parameter that names another model of the repository. Callers come after
    their callees. `root`: only `root` and the callers it reaches (e.g. "avatar": the turn's
    chain, not `avatar_speech`)."""
    names = set(model_names(source))
    graph: dict[str, dict[str, str]] = {}
    for name in sorted(names):
        params = parse_config(Path(source) / name / "config.pbtxt").parameters
        calls = {
            key: value.string_value
            for key, value in params.items()
            if key.endswith("_model") and value.string_value in names
        }
        if calls:
            graph[name] = calls
    order: list[str] = []

    def visit(name: str) -> None:
        if name in order or name not in graph:
            return
        for callee in graph[name].values():
            visit(callee)
        order.append(name)

    for name in [root] if root else sorted(graph):
        visit(name)
    return {name: graph[name] for name in order}
