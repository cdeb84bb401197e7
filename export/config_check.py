"""A model's `config.pbtxt` checked against its export's sidecar (names, dtypes, dims, batch
axis), so configs cannot drift from exports. The materialisation (`serving.repository`) and
the engine build (`export.tensorrt.build`) run it on every native model."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from export.sidecar import Sidecar, TensorSpec
from model_configs.pbtxt import ModelConfig, RepositoryError, data_type_name


class ConfigMismatchError(RepositoryError):
    """A config.pbtxt disagrees with the exported model's sidecar."""


def check_against_sidecar(config: ModelConfig, sidecar: Sidecar) -> None:
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
            if data_type_name(entry.data_type) != spec.triton_dtype:
                problems.append(
                    f"{kind} {entry.name!r}: data_type {data_type_name(entry.data_type)}, "
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
