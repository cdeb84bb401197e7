"""`python -m export engines`: TensorRT engines for every `tensorrt_plan` model of
`model_repository/`, each verified against ONNX Runtime, then the production repository.

Per model (a `Stage` below): the shape profile (explicit min/opt/max per named dynamic
axis of the export's sidecar, from the stage's serving limits), the precisions it may be
built in, and the per-output tolerances its engine must meet against ONNX Runtime (CPU)
running the graph it was built from, on the same inputs. The engine is built by trtexec and
verified with Polygraphy (`export/tensorrt/verify.py`: TrtRunner vs OnnxrtRunner,
`SimpleCompareFunc`'s elementwise check with each output's atol/rtol). INT8 is built only
from an INT8 Q/DQ variant that recorded `passes_gate: true` in the sidecar's
`validation.variants`, and by default only for stages with `int8_by_default` (see
`choose_precision`).

The engine lands beside its ONNX artifact (`model.plan`) with `engine.json` (precision,
profile, per-output figures and verdicts); `avatar materialize --target production` serves
only engines whose record says they passed. Needs trtexec, TensorRT's Python bindings and a
GPU: elsewhere it stops at once with `TensorRTMissingError`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from export.config_check import check_against_sidecar
from export.registry import engine_stages
from export.sidecar import ENGINE_RECORD, Sidecar
from export.tensorrt.engine import ShapeProfile, require_tensorrt
from export.tensorrt.spec import InputRule, Stage
from export.tensorrt.verify import (
    EngineVerificationError,
    compare_runners,
    engine_runner,
    onnx_reference,
    require_passed,
)
from model_configs.pbtxt import model_names, parse_config, platform_of

log = logging.getLogger(__name__)

# every stage that declares an engine (export/<stage>/stage.py), by model name
STAGES: dict[str, Stage] = engine_stages()


@dataclasses.dataclass(frozen=True)
class Choice:
    precision: str
    onnx_file: str
    reason: str


def int8_variants(sidecar: Sidecar) -> dict[str, bool]:
    """INT8 Q/DQ variant files the sidecar records -> whether each passed its quality gate."""
    variants = sidecar.validation.get("variants", {})
    return {
        name: bool(record.get("passes_gate"))
        for name, record in variants.items()
        # not an ONNX Runtime-only form (the LLM's MatMulNBits weights)
        if "int8" in name and isinstance(record, dict) and record.get("tensorrt", True)
    }


def choose_precision(name: str, stage: Stage, sidecar: Sidecar, requested: str = "auto") -> Choice:
    """FP16 (or the stage's default) unless an INT8 Q/DQ variant passed its gate."""
    passed = sorted(f for f, ok in int8_variants(sidecar).items() if ok)
    automatic = requested == "auto" and passed and stage.int8_by_default
    if requested == "int8" or (automatic and "int8" in stage.allowed):
        if "int8" not in stage.allowed:
            raise ValueError(f"{name}: int8 not allowed ({stage.why})")
        if not passed:
            raise ValueError(f"{name}: no INT8 Q/DQ variant passed its quality gate")
        return Choice("int8", passed[0], f"INT8 Q/DQ variant {passed[0]} passed its gate")
    if requested not in ("auto", "fp32", "fp16", "int8"):
        raise ValueError(f"precision {requested!r}: expected auto, fp32, fp16 or int8")
    precision = stage.default if requested == "auto" else requested
    if precision not in stage.allowed:
        raise ValueError(f"{name}: precision {precision} not allowed ({stage.why})")
    failed = sorted(f for f, ok in int8_variants(sidecar).items() if not ok)
    int8 = f"INT8 variants that failed their gate: {failed}" if failed else "no INT8 Q/DQ variant"
    return Choice(precision, "model.onnx", f"{precision}: {int8}; {stage.why}")


def axis_values(profile: ShapeProfile, overrides: Mapping[str, int]) -> dict[str, int]:
    """One value per dynamic axis: the profile's opt unless overridden (must be in range)."""
    values = {}
    for field in dataclasses.fields(profile):
        low, opt, high = profile.axis(field.name)
        value = overrides.get(field.name, opt)
        if not low <= value <= high:
            raise ValueError(f"axis {field.name}={value} outside the profile [{low}, {high}]")
        values[field.name] = value
    return values


def sample_inputs(
    sidecar: Sidecar, axes: Mapping[str, int], rules: Mapping[str, InputRule], seed: int = 0
) -> dict[str, np.ndarray]:
    """Inputs at `axes` sizes: floats ~ N(0, 0.5) unless a rule says otherwise."""
    rng = np.random.default_rng(seed)
    out = {}
    for spec in sidecar.inputs:
        shape = tuple(d if isinstance(d, int) else axes[d] for d in spec.shape)
        if spec.name in rules:
            array = rules[spec.name](shape, axes, rng)
        elif spec.dtype.startswith("float"):
            array = (0.5 * rng.standard_normal(shape)).astype(spec.dtype)
        else:
            raise ValueError(f"input {spec.name!r} ({spec.dtype}) needs a rule for its values")
        out[spec.name] = np.asarray(array, dtype=spec.dtype)
    return out


def record_is_current(folder: Path, choice: Choice, profile: dict[str, Any]) -> bool:
    """An engine.json that passed, for this precision, ONNX file and profile."""
    path = folder / ENGINE_RECORD
    if not (folder / "model.plan").is_file() or not path.is_file():
        return False
    record = json.loads(path.read_text())
    return bool(
        record.get("passed")
        and record.get("precision") == choice.precision
        and record.get("onnx") == choice.onnx_file
        and record.get("profile") == profile
    )


def build_and_verify(
    name: str, config_path: Path, artifact: Path, requested: str = "auto", force: bool = False
) -> dict[str, Any]:
    """Build `artifact/model.plan` for one model, verify it, write `engine.json`."""
    from export.tensorrt import engine as trt

    stage = STAGES.get(name)
    if stage is None:
        raise KeyError(
            f"{name}: no stage declares an engine for it (export/<stage>/stage.py; declared: "
            f"{sorted(STAGES)})"
        )
    sidecar = Sidecar.load(artifact)
    config = parse_config(config_path)
    check_against_sidecar(config, sidecar)
    profile = stage.make_profile()
    ranges = profile.ranges(sidecar)
    check_profile_covers(profile, config.max_batch_size, name)
    choice = choose_precision(name, stage, sidecar, requested)
    profile_json = {k: [list(s) for s in v] for k, v in ranges.items()}
    if not force and record_is_current(artifact, choice, profile_json):
        log.info("%s: engine up to date (%s)", name, choice.precision)
        return json.loads((artifact / ENGINE_RECORD).read_text())
    log.info("%s: %s (%s)", name, choice.precision, choice.reason)
    require_tensorrt()  # the verification's bindings too, before a build that needs them
    plan = trt.build_engine(
        artifact, profile, choice.precision, allowed=stage.allowed, onnx_file=choice.onnx_file
    )
    axes = axis_values(profile, stage.verify_axes)
    inputs = sample_inputs(sidecar, axes, stage.inputs)
    tolerances = stage.tolerances(choice.precision, [o.name for o in sidecar.outputs])
    record: dict[str, Any] = {
        "model": name,
        "precision": choice.precision,
        "onnx": choice.onnx_file,
        "reason": choice.reason,
        "profile": profile_json,
        "verified_at": axes,
        "passed": False,
    }
    try:
        # the reference is the graph the engine was built from, on ONNX Runtime: for an
        # INT8 engine its Q/DQ variant (whose task gate, e.g. WER, already held against
        # FP32), so the check measures the engine, not the quantisation again
        checks = compare_runners(
            engine_runner(plan), onnx_reference(artifact / choice.onnx_file), inputs, tolerances
        )
        record["outputs"] = [c.to_json() for c in checks]
        record["passed"] = all(c.passed for c in checks)
    finally:
        (artifact / ENGINE_RECORD).write_text(json.dumps(record, indent=2) + "\n")
    require_passed(checks, name)
    return record


def check_profile_covers(profile: ShapeProfile, max_batch_size: int, name: str) -> None:
    """The profile's batch axis must span 1..max_batch_size of the config (Triton's batches)."""
    if max_batch_size <= 0:
        return
    low, _, high = profile.axis("batch")
    if low != 1 or high < max_batch_size:
        raise ValueError(
            f"{name}: profile batch range [{low}, {high}] does not cover the config's "
            f"max_batch_size {max_batch_size} (must span 1..{max_batch_size})"
        )


def engine_models(source: Path, names: Iterable[str] | None = None) -> list[str]:
    """Models whose production config is `tensorrt_plan` (default: all of them)."""
    all_models = model_names(source)
    chosen = sorted(names) if names else all_models
    unknown = sorted(set(chosen) - set(all_models))
    if unknown:
        raise KeyError(f"unknown models {unknown}; known: {all_models}")
    return [
        n
        for n in chosen
        if platform_of(parse_config(source / n / "config.pbtxt")) == "tensorrt_plan"
    ]


def build_all(
    source: Path, names: Iterable[str] | None = None, **options: Any
) -> dict[str, dict[str, Any]]:
    """Engines of every tensorrt_plan model (`avatar materialize --target production` then
    places them in the production repository)."""
    from export.registry import ensure_all

    require_tensorrt()  # before any export work: say at once what is missing
    models = engine_models(source, names)
    artifacts = ensure_all(models) if models else {}
    records, failures = {}, []
    for model in models:
        try:
            records[model] = build_and_verify(
                model, source / model / "config.pbtxt", artifacts[model], **options
            )
        except EngineVerificationError as error:
            failures.append(str(error))
    if failures:
        raise EngineVerificationError("\n".join(failures))
    return records
