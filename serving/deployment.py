"""Artifacts + materialisation + embedded server: what `avatar serve`, the demo and the
tests' server fixture share."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

from model_configs.pbtxt import SOURCE_REPOSITORY, is_native, model_names, parse_config
from serving.repository import MaterializedModel, materialize

log = logging.getLogger(__name__)

PROJECT_ROOT = Path(__file__).resolve().parents[1]


def build_repository(
    output: Path,
    target: str = "embedded",
    models: Iterable[str] | None = None,
    source: Path = SOURCE_REPOSITORY,
) -> list[MaterializedModel]:
    """Build the artifacts the chosen models need (cached) and materialise them."""
    from export.registry import ensure_all

    names = sorted(models) if models else model_names(source)
    native = [n for n in names if is_native(parse_config(Path(source) / n / "config.pbtxt"))]
    artifacts = ensure_all(native) if native else {}
    return materialize(source, output, target, artifacts, names)
