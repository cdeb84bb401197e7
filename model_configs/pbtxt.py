"""A model's `config.pbtxt`, read as Triton's `ModelConfig` protobuf (tritonclient's
`model_config_pb2`): the parser, the platform, the source repository's model names and the
BLS call graph. `model_repository/` holds the production config of every model; the
materialisation (`serving`), the engine build (`export.tensorrt.build`) and perf read them
here. The check against an export's sidecar is `export.sidecar.check_against_sidecar`.
"""

from __future__ import annotations

from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

ModelConfig = mc.ModelConfig
SOURCE_REPOSITORY = Path(__file__).resolve().parents[1] / "model_repository"
ONNX_PLATFORMS = {"onnxruntime_onnx"}
TENSORRT_PLATFORMS = {"tensorrt_plan"}
NATIVE_PLATFORMS = ONNX_PLATFORMS | TENSORRT_PLATFORMS


class RepositoryError(ValueError):
    """A model repository or one of its configs is not usable."""


def parse_config(path: Path) -> ModelConfig:
    """Parse a config.pbtxt as Triton's `ModelConfig` protobuf (errors name the file)."""
    try:
        return text_format.Parse(Path(path).read_text(), mc.ModelConfig())
    except text_format.ParseError as error:
        raise RepositoryError(f"{path}: not a valid Triton ModelConfig: {error}") from None


def platform_of(config: ModelConfig) -> str:
    if config.platform:
        return config.platform
    return {"onnxruntime": "onnxruntime_onnx", "tensorrt": "tensorrt_plan"}.get(
        config.backend, config.backend
    )


def is_native(config: ModelConfig) -> bool:
    return platform_of(config) in NATIVE_PLATFORMS


def data_type_name(value: int) -> str:
    """The config's `data_type` enum value as its name, e.g. 1 -> "TYPE_BOOL"."""
    return mc.DataType.Name(value)


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
