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
import fnmatch
import importlib
import json
import logging
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from export.common import Tolerance
from export.config_check import check_against_sidecar
from export.sidecar import ENGINE_RECORD, Sidecar
from export.tensorrt.engine import Shape, ShapeProfile, require_tensorrt
from export.tensorrt.verify import (
    EngineVerificationError,
    compare_runners,
    engine_runner,
    onnx_reference,
    require_passed,
)
from model_configs.pbtxt import model_names, parse_config, platform_of

log = logging.getLogger(__name__)

InputRule = Callable[[Shape, Mapping[str, int], np.random.Generator], np.ndarray]


@dataclasses.dataclass(frozen=True)
class VadProfile(ShapeProfile):
    batch: tuple[int, int, int] = (1, 16, 64)  # config max_batch_size 64


@dataclasses.dataclass(frozen=True)
class TurnDetectorProfile(ShapeProfile):
    batch: tuple[int, int, int] = (1, 8, 32)  # config max_batch_size 32


@dataclasses.dataclass(frozen=True)
class RendererProfile(ShapeProfile):
    batch: tuple[int, int, int] = (1, 8, 16)  # config max_batch_size 16, preferred 8 / 16


def _ints(high: int) -> InputRule:
    return lambda shape, _axes, rng: rng.integers(0, high, size=shape, dtype=np.int64)


def _uniform(low: float, high: float) -> InputRule:
    return lambda shape, _axes, rng: rng.uniform(low, high, size=shape).astype(np.float32)


def _ones(shape: Shape, _axes: Mapping[str, int], _rng: np.random.Generator) -> np.ndarray:
    return np.ones(shape, np.int64)


def _positions(shape: Shape, axes: Mapping[str, int], _rng: np.random.Generator) -> np.ndarray:
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


# Tolerances are stated, not measured: no engine has been built on the project machines
# (no TensorRT); tighten them from the first verification record on a GPU host.
STAGES: dict[str, Stage] = {
    "asr_encoder": Stage(
        "export.asr.engine:Profile",
        ("fp32", "fp16", "int8"),
        "fp16",
        {"encoder_hidden_states": Tolerance(0.05, 0.05), "cross_kv": Tolerance(0.05, 0.05)},
        verify_axes={"batch": 1},  # a full 30-s window (9M cross_kv values per row)
        why="INT8 from the Q/DQ variant when its WER gate passed, short clips and VAD-cut "
        "long recordings (export/asr/int8.py); today's variant fails the long ones (it loops "
        "on one 30-s piece, docs/performance.md 10), so FP16",
    ),
    "asr_decoder": Stage(
        "export.asr.engine:Profile",
        ("fp32", "fp16"),
        "fp16",
        {
            "logits": Tolerance(0.1, 0.05),
            "self_kv_out": Tolerance(0.05, 0.05),
            "cross_kv_out": Tolerance(0.01, 0.01),  # the state fed back: FP16 rounding only
        },
        inputs={"tokens": _ints(51865)},
        # a later step of 2 windows: the cross-attention state full, encoder_kv empty
        verify_axes={"batch": 2, "tokens": 3},
        why="no INT8: its Q/DQ variant is the stateless step the CPU gate judges (it fails the "
        "WER gate, export/asr/int8.py), not the sequence form served with implicit state; "
        "one token's activations are too small for INT8 GEMMs to pay",
        int8_by_default=False,
    ),
    "llm_decoder": Stage(
        "export.llm.engine:DecoderProfile",
        ("fp32", "fp16", "int8"),
        "fp16",
        {"logits": Tolerance(0.1, 0.05), "present.*": Tolerance(0.05, 0.05)},
        inputs={"input_ids": _ints(49152), "attention_mask": _ones, "position_ids": _positions},
        # prefill of 4 tokens after 16 cached ones, 2 rows (keeps the CPU reference quick)
        verify_axes={"batch": 2, "sequence": 4, "past_sequence": 16, "total_sequence": 20},
        why=(
            "FP16-safe additive mask (-1e4, export/llm/decoder_onnx.py);"
            " int4 variant failed its gate"
        ),
    ),
    "renderer": Stage(
        "export.tensorrt.build:RendererProfile",
        ("fp32",),
        "fp32",
        {},
        fp32={"frames": Tolerance(atol=2.0)},  # the export's own tolerance (uint8 levels)
        inputs={"blendshapes": _uniform(0.0, 1.0), "head_pose": _uniform(-0.3, 0.3)},
        why="FP32 only: FP16 coordinates (~0.1 px at 256 px) move anti-aliased edge pixels by "
        "tens of levels; the renderer is cheap at FP32",
    ),
    "portrait_renderer": Stage(
        "export.tensorrt.build:RendererProfile",
        ("fp32",),
        "fp32",
        {},
        fp32={"frames": Tolerance(atol=3.0)},  # uint8 levels: bilinear taps may round apart
        inputs={"blendshapes": _uniform(0.0, 1.0), "head_pose": _uniform(-0.1, 0.1)},
        why="FP32 only: FP16 cannot hold pixel coordinates to a quarter pixel at 512 px, nor "
        "the flat photo index (y * 512 + x) the bilinear Gathers use",
    ),
    "vad": Stage(
        "export.tensorrt.build:VadProfile",
        ("fp32", "fp16"),
        "fp16",
        {"speech_prob": Tolerance(0.01), "next_*": Tolerance(0.01, 0.01)},
        why="served by ONNX Runtime on CPU in production (see its config); engine on request",
    ),
    "turn_detector": Stage(
        "export.tensorrt.build:TurnDetectorProfile",
        ("fp16",),
        "fp16",
        {"probability": Tolerance(0.05)},
        inputs={"input_features": _uniform(-1.0, 1.5)},  # the log-mel's range
        why="the graph is its authors' INT8 Q/DQ: those layers run INT8 (explicit "
        "quantisation), the rest FP16; no other precision to choose",
    ),
}


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
            f"{name}: no engine stage in export/tensorrt/build.py STAGES ({sorted(STAGES)})"
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
