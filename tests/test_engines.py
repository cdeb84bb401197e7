"""`python -m export engines` and the production configs: everything up to running TensorRT
is tested here (profiles from the real sidecars, trtexec command lines, the ONNX Runtime
reference side of the verification, the comparison, the config rewrite, materialisation);
building and running engines needs TensorRT and skips without it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from tritonclient.grpc import model_config_pb2 as mc

from avatar.serving.deployment import SOURCE_REPOSITORY, model_names
from avatar.serving.repository import (
    ENGINE_RECORD,
    MissingArtifactError,
    embedded_config,
    is_native,
    materialize,
    parse_config,
    platform_of,
)
from avatar.sidecar import Sidecar, TensorSpec
from export.common import Tolerance, onnx_session
from export.tensorrt import build, engine
from export.tensorrt.build import STAGES, EngineVerificationError, Stage

HAS_TRTEXEC = shutil.which("trtexec") is not None
NO_TENSORRT = "TensorRT (trtexec) is not installed: engines are built on the GPU host"
ENGINE_MODELS = build.engine_models(SOURCE_REPOSITORY)


@pytest.fixture(scope="module")
def artifacts() -> dict[str, Path]:
    from export.registry import ensure_all

    return ensure_all([*ENGINE_MODELS, "vad"])


def _config(name: str) -> mc.ModelConfig:
    return parse_config(SOURCE_REPOSITORY / name / "config.pbtxt")


def _text(name: str) -> str:
    return (SOURCE_REPOSITORY / name / "config.pbtxt").read_text()


CPU_IN_PRODUCTION = {"vad", "emotion_encoder"}


# ----------------------------------------------------------------- production configs


def test_heavy_stages_are_tensorrt_engines() -> None:
    assert {"asr_encoder", "asr_decoder", "llm_decoder", "renderer"} <= set(ENGINE_MODELS)
    assert set(ENGINE_MODELS) <= set(STAGES), "every tensorrt_plan model needs an engine stage"


@pytest.mark.parametrize("name", [n for n in model_names() if is_native(_config(n))])
def test_production_instance_groups(name: str) -> None:
    config = _config(name)
    kinds = {g.kind for g in config.instance_group}
    if name in CPU_IN_PRODUCTION:  # small per-chunk/per-sentence work, see their configs
        assert kinds == {mc.ModelInstanceGroup.KIND_CPU}
        assert "# Production too: ONNX Runtime on the CPU" in _text(name)
        return
    assert kinds == {mc.ModelInstanceGroup.KIND_GPU}
    if platform_of(config) == "onnxruntime_onnx":  # a graph TensorRT cannot take whole
        (accelerator,) = config.optimization.execution_accelerators.gpu_execution_accelerator
        assert accelerator.name == "tensorrt"
        assert accelerator.parameters["precision_mode"] in ("FP16", "FP32")
        assert accelerator.parameters["trt_engine_cache_path"].startswith("/cache/")
    assert "# Production:" in _text(name), "the production choice is explained in the config"


def test_cuda_graphs_only_for_fixed_shapes() -> None:
    for name in ENGINE_MODELS:
        config = _config(name)
        if not config.optimization.cuda.graphs:
            continue
        non_batch = [list(t.dims) for t in config.input]
        assert all(-1 not in dims for dims in non_batch), f"{name}: dynamic dims + graphs"
        sizes = [s.batch_size for s in config.optimization.cuda.graph_spec]
        assert sizes and max(sizes) <= config.max_batch_size
    assert _config("renderer").optimization.cuda.graphs


@pytest.mark.parametrize("name", [n for n in model_names() if is_native(_config(n))])
def test_embedded_rewrite_of_production_config(name: str) -> None:
    config = _config(name)
    served = embedded_config(config)
    assert served.backend == "python" and not served.platform
    assert not served.HasField("optimization"), "no TensorRT / CUDA-graph settings on CPU"
    assert {g.kind for g in served.instance_group} == {mc.ModelInstanceGroup.KIND_CPU}
    assert [g.count for g in served.instance_group] == [g.count for g in config.instance_group]
    assert list(served.input) == list(config.input)
    assert list(served.output) == list(config.output)
    assert served.max_batch_size == config.max_batch_size
    assert served.dynamic_batching == config.dynamic_batching
    assert served.parameters["declared_platform"].string_value == platform_of(config)


# ----------------------------------------------------------------- profiles and inputs


@pytest.mark.parametrize("name", ENGINE_MODELS)
def test_profile_from_sidecar_covers_config(name: str, artifacts: dict[str, Path]) -> None:
    stage = STAGES[name]
    sidecar = Sidecar.load(artifacts[name])
    profile = stage.make_profile()
    ranges = profile.ranges(sidecar)
    assert list(ranges) == [t.name for t in sidecar.inputs]
    for spec in sidecar.inputs:
        low, opt, high = ranges[spec.name]
        assert len(low) == len(spec.shape)
        assert all(a <= b <= c for a, b, c in zip(low, opt, high, strict=True)), spec.name
        for dim, lo, hi in zip(spec.shape, low, high, strict=True):
            if isinstance(dim, int):
                assert lo == hi == dim, f"{spec.name}: fixed dim changed by the profile"
    config = _config(name)
    build.check_profile_covers(profile, config.max_batch_size, name)
    choice = build.choose_precision(name, stage, sidecar)
    assert set(stage.tolerances(choice.precision, [o.name for o in sidecar.outputs])) == {
        o.name for o in sidecar.outputs
    }


def test_profile_that_misses_max_batch_is_rejected() -> None:
    profile = build.RendererProfile(batch=(1, 4, 8))
    with pytest.raises(ValueError, match="does not cover the config's max_batch_size 16"):
        build.check_profile_covers(profile, 16, "renderer")
    with pytest.raises(ValueError, match=r"axis batch=32 outside the profile \[1, 8\]"):
        build.axis_values(profile, {"batch": 32})


@pytest.mark.parametrize("name", ENGINE_MODELS)
def test_verification_inputs_run_on_onnx_runtime(name: str, artifacts: dict[str, Path]) -> None:
    """The reference half of the engine check, on the real export."""
    stage = STAGES[name]
    sidecar = Sidecar.load(artifacts[name])
    axes = build.axis_values(stage.make_profile(), stage.verify_axes)
    inputs = build.sample_inputs(sidecar, axes, stage.inputs)
    ranges = stage.make_profile().ranges(sidecar)
    for spec in sidecar.inputs:
        low, _, high = ranges[spec.name]
        shape = inputs[spec.name].shape
        assert all(a <= s <= c for a, s, c in zip(low, shape, high, strict=True)), spec.name
        assert inputs[spec.name].dtype == np.dtype(spec.dtype)
    names = [o.name for o in sidecar.outputs]
    outputs = onnx_session(artifacts[name] / "model.onnx").run(names, inputs)
    assert all(np.all(np.isfinite(o.astype(np.float64))) for o in outputs)
    again = build.sample_inputs(sidecar, axes, stage.inputs)
    assert all(np.array_equal(inputs[k], again[k]) for k in inputs), "seeded: reproducible"


def test_integer_inputs_need_a_rule() -> None:
    sidecar = Sidecar("x", [TensorSpec("ids", "int64", ("batch", 4))], [])
    with pytest.raises(ValueError, match="'ids' \\(int64\\) needs a rule"):
        build.sample_inputs(sidecar, {"batch": 2}, {})


# ----------------------------------------------------------------- precision choice


def test_precision_follows_the_variant_gates(artifacts: dict[str, Path]) -> None:
    llm = Sidecar.load(artifacts["llm_decoder"])  # variants are built on request only
    choice = build.choose_precision("llm_decoder", STAGES["llm_decoder"], llm)
    assert (choice.precision, choice.onnx_file) == ("fp16", "model.onnx")
    failed = Sidecar(
        "m", [], [], validation={"variants": {"model_int4.onnx": {"passes_gate": False}}}
    )
    choice = build.choose_precision("llm_decoder", STAGES["llm_decoder"], failed)
    assert (choice.precision, choice.onnx_file) == ("fp16", "model.onnx")
    assert build.choose_precision("renderer", STAGES["renderer"], llm).precision == "fp32"

    gated = Sidecar(
        "m", [], [], validation={"variants": {"model.int8.onnx": {"passes_gate": True}}}
    )
    choice = build.choose_precision("llm_decoder", STAGES["llm_decoder"], gated)
    assert (choice.precision, choice.onnx_file) == ("int8", "model.int8.onnx")
    # a stage that does not allow INT8 stays at its default even with a passed gate
    assert build.choose_precision("asr_encoder", STAGES["asr_encoder"], gated).precision == "fp16"

    failed = Sidecar("m", [], [], validation={"variants": {"model.int8.onnx": {"passes_gate": 0}}})
    assert "failed their gate" in build.choose_precision("vad", STAGES["vad"], failed).reason
    with pytest.raises(ValueError, match="no INT8 Q/DQ variant passed"):
        build.choose_precision("llm_decoder", STAGES["llm_decoder"], failed, "int8")
    with pytest.raises(ValueError, match="precision fp16 not allowed"):
        build.choose_precision("renderer", STAGES["renderer"], failed, "fp16")


# ----------------------------------------------------------------- trtexec command lines


def _flags(cmd: list[str]) -> dict[str, str]:
    return dict(c.split("=", 1) for c in cmd[1:] if "=" in c)


def test_build_command(tmp_path: Path, artifacts: dict[str, Path]) -> None:
    sidecar = Sidecar.load(artifacts["renderer"])
    cmd = engine.trtexec_command(
        tmp_path / "m.onnx",
        tmp_path / "m.plan",
        sidecar,
        build.RendererProfile(),
        "fp32",
        trtexec="/opt/tensorrt/bin/trtexec",
    )
    flags = _flags(cmd)
    assert cmd[0] == "/opt/tensorrt/bin/trtexec"
    assert flags["--minShapes"] == "blendshapes:1x52,head_pose:1x3"
    assert flags["--optShapes"] == "blendshapes:8x52,head_pose:8x3"
    assert flags["--maxShapes"] == "blendshapes:16x52,head_pose:16x3"
    assert "--skipInference" in cmd and "--noTF32" in cmd
    assert "--fp16" not in cmd and "--int8" not in cmd
    int8 = engine.trtexec_command(
        tmp_path / "q.onnx", tmp_path / "m.plan", sidecar, build.RendererProfile(), "int8"
    )
    assert {"--int8", "--fp16"} <= set(int8)


def test_run_command_and_input_files(tmp_path: Path) -> None:
    inputs = {
        "past_key_values.0.key": np.arange(6, dtype=np.float32).reshape(1, 2, 3),
        "input_ids": np.array([[7, 8]], dtype=np.int64),
    }
    files = engine.write_inputs(inputs, tmp_path)
    for name, array in inputs.items():
        back = np.fromfile(files[name], dtype=array.dtype).reshape(array.shape)
        assert np.array_equal(back, array)
    cmd = engine.run_command(
        tmp_path / "m.plan", files, {k: v.shape for k, v in inputs.items()}, tmp_path / "o.json"
    )
    flags = _flags(cmd)
    assert flags["--loadEngine"] == str(tmp_path / "m.plan")
    assert flags["--shapes"] == "past_key_values.0.key:1x2x3,input_ids:1x2"
    assert flags["--loadInputs"] == (
        f"'past_key_values.0.key':{files['past_key_values.0.key']},'input_ids':{files['input_ids']}"
    )
    assert flags["--exportOutput"] == str(tmp_path / "o.json")
    assert flags["--iterations"] == "1"


# trtexec's --exportOutput, as samples/common/sampleReporting.cpp writes it
EXPORTED = """[
  { "name" : "logits"
  , "dimensions" : "2x3"
  , "values" : [ 0.5, -1.25e-05, 3, nan, -inf, 7 ]
  }
, { "name" : "durations"
  , "dimensions" : "3"
  , "values" : [ 4, 0, 12 ]
  }
]
"""


def test_parse_exported_outputs() -> None:
    out = engine.parse_exported_outputs(EXPORTED, {"durations": "int64"})
    assert out["logits"].shape == (2, 3) and out["logits"].dtype == np.float32
    assert out["logits"][0, 1] == np.float32(-1.25e-05)
    assert np.isnan(out["logits"][1, 0]) and out["logits"][1, 1] == -np.inf
    assert out["durations"].tolist() == [4, 0, 12] and out["durations"].dtype == np.int64
    with pytest.raises(ValueError, match="6 values for dimensions '4x3'"):
        engine.parse_exported_outputs(EXPORTED.replace('"2x3"', '"4x3"'))


@pytest.mark.skipif(HAS_TRTEXEC, reason="TensorRT is installed here")
def test_eight_bit_outputs_need_the_python_api(tmp_path: Path) -> None:
    """trtexec prints uint8 values as characters, so the renderer's frames cannot be read
    from its JSON: without the TensorRT Python API that is said, not misparsed."""
    inputs = {"blendshapes": np.zeros((1, 52), np.float32)}
    with pytest.raises(engine.TensorRTMissingError, match=r"\['frames'\] are 8-bit"):
        engine.run_engine(tmp_path / "m.plan", inputs, tmp_path, {"frames": "uint8"})
    with pytest.raises(engine.TensorRTMissingError, match="trtexec was not found"):
        engine.run_engine(tmp_path / "m.plan", inputs, tmp_path, {"audio": "float32"})


# ----------------------------------------------------------------- the comparison


def test_comparison_on_onnx_runtime_outputs(artifacts: dict[str, Path]) -> None:
    """An FP16-rounded copy of ORT's outputs passes the FP16 tolerances; a drift, a wrong
    shape and a NaN do not, and every failing output is named."""
    stage = STAGES["vad"]
    sidecar = Sidecar.load(artifacts["vad"])
    axes = build.axis_values(stage.make_profile(), stage.verify_axes)
    inputs = build.sample_inputs(sidecar, axes, stage.inputs, seed=3)
    names = [o.name for o in sidecar.outputs]
    reference = dict(
        zip(names, onnx_session(artifacts["vad"] / "model.onnx").run(names, inputs), strict=True)
    )
    tolerances = stage.tolerances("fp16", names)
    halved = {k: v.astype(np.float16).astype(np.float32) for k, v in reference.items()}
    results = build.compare_engine(reference, halved, tolerances, "vad")
    assert [r.name for r in results] == names and all(r.max_abs > 0 for r in results)

    drifted = dict(halved, speech_prob=halved["speech_prob"] + 0.05)
    drifted["next_state"] = halved["next_state"].copy()
    drifted["next_state"][0, 0, 0] = np.nan
    with pytest.raises(EngineVerificationError) as error:
        build.compare_engine(reference, drifted, tolerances, "vad")
    message = str(error.value)
    assert "'speech_prob': max abs error 0.05" in message
    assert "'next_state': the engine produced NaN or Inf" in message
    assert "next_context" not in message
    with pytest.raises(EngineVerificationError, match="shape"):
        build.compare_engine(
            reference, dict(halved, next_context=halved["next_context"][:1]), tolerances, "vad"
        )


def test_every_output_needs_a_tolerance() -> None:
    stage = Stage("export.tensorrt.build:VadProfile", ("fp16",), "fp16", {"a": Tolerance(0.1)})
    with pytest.raises(KeyError, match="no fp16 tolerance for output 'b'"):
        stage.tolerances("fp16", ["a", "b"])
    assert stage.tolerances("fp32", ["b"])["b"] == build.FP32


# ----------------------------------------------------------------- materialisation


def _engine_source(tmp_path: Path, artifact: Path) -> tuple[Path, Path]:
    """vad declared as tensorrt_plan, with an artifact folder that can hold an engine."""
    source = tmp_path / "source"
    shutil.copytree(SOURCE_REPOSITORY / "vad", source / "vad")
    path = source / "vad" / "config.pbtxt"
    path.write_text(path.read_text().replace('"onnxruntime_onnx"', '"tensorrt_plan"'))
    folder = tmp_path / "artifact"
    folder.mkdir()
    for item in artifact.iterdir():
        (folder / item.name).symlink_to(item)
    return source, folder


def test_production_serves_only_verified_engines(tmp_path: Path, vad_artifact: Path) -> None:
    source, folder = _engine_source(tmp_path, vad_artifact)
    out = tmp_path / "out"
    with pytest.raises(MissingArtifactError, match="python -m export engines"):
        materialize(source, out, "production", {"vad": folder})
    (folder / "model.plan").write_bytes(b"not really an engine")
    (folder / ENGINE_RECORD).write_text(json.dumps({"passed": False}))
    with pytest.raises(MissingArtifactError, match="no passed verification record"):
        materialize(source, out, "production", {"vad": folder})
    assert not out.exists(), "nothing is written when production is incomplete"
    (folder / ENGINE_RECORD).write_text(json.dumps({"passed": True}))
    written = materialize(source, out, "production", {"vad": folder})
    assert [(m.platform, m.declared_platform) for m in written] == [
        ("tensorrt_plan", "tensorrt_plan")
    ]
    assert (out / "vad" / "1" / "model.plan").resolve() == (folder / "model.plan").resolve()
    assert not (out / "vad" / "1" / ENGINE_RECORD).exists(), "the record is not served"
    assert parse_config(out / "vad" / "config.pbtxt") == parse_config(
        source / "vad" / "config.pbtxt"
    )


def test_production_repository_without_engines_says_what_to_run(
    tmp_path: Path, artifacts: dict[str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    unbuilt = [n for n in ENGINE_MODELS if not (artifacts[n] / "model.plan").is_file()]
    if not unbuilt:
        pytest.skip("every engine is built here")
    native = [n for n in model_names() if is_native(_config(n))]
    from export.registry import ensure_all

    with pytest.raises(MissingArtifactError) as error:
        materialize(SOURCE_REPOSITORY, tmp_path / "prod", "production", ensure_all(native))
    message = str(error.value)
    assert all(f"model {n!r}: no " in message for n in unbuilt)
    assert "run `python -m export engines`" in message
    assert "docker compose run --rm engines" in message
    assert not (tmp_path / "prod").exists()
    # the command line says the same, without a traceback
    from avatar.serving.cli import main

    assert main(["materialize", "--target", "production", "--out", str(tmp_path / "cli")]) == 1
    assert "run `python -m export engines`" in caplog.text
    assert not (tmp_path / "cli").exists()


# ----------------------------------------------------------------- with / without TensorRT


@pytest.mark.skipif(HAS_TRTEXEC, reason="TensorRT is installed here")
def test_engine_command_stops_without_tensorrt(monkeypatch, caplog) -> None:
    from export.__main__ import main

    monkeypatch.delenv("TRTEXEC", raising=False)
    with pytest.raises(engine.TensorRTMissingError, match="trtexec was not found"):
        engine.find_trtexec()
    assert main(["engines"]) == 2
    assert "docker compose run --rm engines" in caplog.text


@pytest.mark.tensorrt
@pytest.mark.skipif(not HAS_TRTEXEC, reason=NO_TENSORRT)
@pytest.mark.parametrize("name", ENGINE_MODELS)
def test_build_and_verify_engine(name: str, artifacts: dict[str, Path]) -> None:
    record = build.build_and_verify(
        name, SOURCE_REPOSITORY / name / "config.pbtxt", artifacts[name], force=True
    )
    assert record["passed"] and (artifacts[name] / "model.plan").stat().st_size > 100_000
    assert {o["name"] for o in record["outputs"]} == {
        o.name for o in Sidecar.load(artifacts[name]).outputs
    }
