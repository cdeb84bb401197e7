"""`python -m export engines` and the production configs: everything up to running TensorRT
is tested here (profiles from the real sidecars, trtexec command lines, the ONNX Runtime
reference side of the verification, the Polygraphy comparison on two ONNX Runtime runners,
the config rewrite, materialisation); building and running engines needs TensorRT and skips
without it."""

from __future__ import annotations

import importlib.util
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from tritonclient.grpc import model_config_pb2 as mc

from export.common import Tolerance, onnx_session
from export.renderer.stage import RendererProfile
from export.sidecar import ENGINE_RECORD, Sidecar, TensorSpec
from export.tensorrt import build, engine, verify
from export.tensorrt.build import STAGES, EngineVerificationError, Stage
from export.tensorrt.spec import FP32
from model_configs.pbtxt import SOURCE_REPOSITORY, is_native, model_names, parse_config, platform_of
from serving.repository import MissingArtifactError, embedded_config, has_state, materialize

HAS_TRTEXEC = shutil.which("trtexec") is not None
HAS_TENSORRT_PYTHON = importlib.util.find_spec("tensorrt") is not None
NO_TENSORRT = "TensorRT (trtexec, tensorrt) is not installed: engines are built on the GPU host"
ENGINE_MODELS = build.engine_models(SOURCE_REPOSITORY)


@pytest.fixture(scope="module")
def artifacts() -> dict[str, Path]:
    from export.registry import ensure_all

    return ensure_all([*ENGINE_MODELS, "vad"])


def _config(name: str) -> mc.ModelConfig:
    return parse_config(SOURCE_REPOSITORY / name / "config.pbtxt")


def _text(name: str) -> str:
    return (SOURCE_REPOSITORY / name / "config.pbtxt").read_text()


CPU_IN_PRODUCTION = {"vad", "emotion_encoder", "turn_words"}


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
    # names, types and dims unchanged; a stateful model's inputs may batch ragged (its
    # runner left-pads the caches itself; test_repository checks the state emulation)
    assert [(i.name, i.data_type, list(i.dims)) for i in served.input] == [
        (i.name, i.data_type, list(i.dims)) for i in config.input
    ]
    assert all(i.allow_ragged_batch for i in served.input) == has_state(config)
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
    profile = RendererProfile(batch=(1, 4, 8))
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
    # its 8-bit MatMulNBits variant passed its gate but is ONNX Runtime's form, not Q/DQ
    llm = Sidecar.load(artifacts["llm_decoder"])
    assert llm.validation["variants"]["model.int8.onnx"]["tensorrt"] is False
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
    # the ASR encoder takes a passed Q/DQ variant by default; the decoder has none for
    # TensorRT (its variant is the stateless step, not the sequence form it is served as);
    # a stage that does not allow INT8 stays at its default even with a passed gate
    encoder, decoder = STAGES["asr_encoder"], STAGES["asr_decoder"]
    assert build.choose_precision("asr_encoder", encoder, gated).precision == "int8"
    assert build.choose_precision("asr_decoder", decoder, gated).precision == "fp16"
    with pytest.raises(ValueError, match="int8 not allowed"):
        build.choose_precision("asr_decoder", decoder, gated, "int8")
    # the built variant: INT8 exactly where its verdict (recorded or measured) passed
    asr = Sidecar.load(artifacts["asr_encoder"])
    passed = asr.validation["variants"]["model.int8.onnx"]["passes_gate"]
    want = "int8" if passed else "fp16"
    assert build.choose_precision("asr_encoder", encoder, asr).precision == want
    assert build.choose_precision("renderer", STAGES["renderer"], gated).precision == "fp32"

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
        RendererProfile(),
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
        tmp_path / "q.onnx", tmp_path / "m.plan", sidecar, RendererProfile(), "int8"
    )
    assert {"--int8", "--fp16"} <= set(int8)


# ----------------------------------------------------------------- the comparison (Polygraphy)


def _case(name: str, artifact: Path) -> tuple[dict[str, np.ndarray], dict[str, Tolerance]]:
    """The engine check's own inputs and tolerances (at the stage's default precision)."""
    stage = STAGES[name]
    sidecar = Sidecar.load(artifact)
    axes = build.axis_values(stage.make_profile(), stage.verify_axes)
    inputs = build.sample_inputs(sidecar, axes, stage.inputs, seed=3)
    return inputs, stage.tolerances(stage.default, [o.name for o in sidecar.outputs])


def _altered(artifact: Path, folder: Path, change: Callable[[str, np.ndarray], np.ndarray]) -> Path:
    """A copy of the export with every float initializer passed through `change`."""
    model = onnx.load(str(artifact / "model.onnx"))
    for init in model.graph.initializer:
        array = numpy_helper.to_array(init)
        if array.dtype == np.float32:
            init.CopyFrom(numpy_helper.from_array(change(init.name, array), init.name))
    path = folder / "model.onnx"
    onnx.save(model, str(path))
    return path


def _outputs(path: Path, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = onnx_session(path)
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, inputs), strict=True))


@pytest.mark.parametrize("name", ["vad", "renderer", "portrait_renderer"])  # uint8 frames
def test_reference_against_itself_passes(name: str, artifacts: dict[str, Path]) -> None:
    inputs, tolerances = _case(name, artifacts[name])
    onnx_path = artifacts[name] / "model.onnx"
    candidate = verify.onnx_reference(onnx_path, "candidate")
    for tols in (tolerances, {output: Tolerance(0.0) for output in tolerances}):
        checks = verify.compare_runners(candidate, verify.onnx_reference(onnx_path), inputs, tols)
        assert [c.name for c in checks] == list(tolerances)
        assert all(c.passed and c.max_abs == 0.0 and c.max_rel == 0.0 for c in checks), checks
        verify.require_passed(checks, name)  # does not raise


def test_fp16_rounded_weights_fail_a_tight_tolerance_and_meet_the_stated_one(
    vad_artifact: Path, tmp_path: Path
) -> None:
    """Weights rounded to FP16 (an engine's FP16 error, on ONNX Runtime): Polygraphy's figures
    are the true maximum errors, 1e-6 rejects them and the stated FP16 tolerances accept them."""
    inputs, tolerances = _case("vad", vad_artifact)
    half = _altered(vad_artifact, tmp_path, lambda _n, a: a.astype(np.float16).astype(np.float32))
    reference = _outputs(vad_artifact / "model.onnx", inputs)
    got = _outputs(half, inputs)

    def run(tols: dict[str, Tolerance]) -> list[verify.OutputCheck]:
        return verify.compare_runners(
            verify.onnx_reference(half, "fp16-weights"),
            verify.onnx_reference(vad_artifact / "model.onnx"),
            inputs,
            tols,
        )

    tight = run({name: Tolerance(1e-6, 1e-6) for name in tolerances})
    by_name = {c.name: c for c in tight}
    for name, check in by_name.items():
        diff = np.abs(got[name].astype(np.float64) - reference[name])
        assert check.max_abs == pytest.approx(diff.max(), rel=1e-5, abs=1e-12), name
    speech = by_name["speech_prob"]  # no zeros in the reference: relative error is plain
    rel = np.abs(got["speech_prob"] - reference["speech_prob"]) / np.abs(reference["speech_prob"])
    assert speech.max_rel == pytest.approx(rel.max(), rel=1e-5)
    # next_context is a slice of the input chunk: weights do not touch it
    assert {n: c.passed for n, c in by_name.items()} == {
        "speech_prob": False,
        "next_context": True,
        "next_state": False,
    }
    assert 1e-6 < speech.max_abs < 1e-2 and by_name["next_state"].max_abs > 1e-6
    with pytest.raises(EngineVerificationError) as error:
        verify.require_passed(tight, "vad")
    message = str(error.value)
    assert f"'speech_prob': max abs error {speech.max_abs:.3g}" in message
    assert "exceed atol=1e-06 rtol=1e-06" in message
    assert "'next_state'" in message and "next_context" not in message

    stated = run(tolerances)
    assert all(c.passed for c in stated), stated
    assert [(c.atol, c.rtol) for c in stated] == [(0.01, 0.0), (0.01, 0.01), (0.01, 0.01)]
    assert [c.max_abs for c in stated] == [c.max_abs for c in tight]


def test_drifted_and_broken_outputs_are_named(vad_artifact: Path, tmp_path: Path) -> None:
    """A scaled output layer drifts speech_prob beyond its stated 0.01; a NaN bias breaks
    next_state; a tolerance for an output the runners lack fails as missing."""
    inputs, tolerances = _case("vad", vad_artifact)

    def drift(name: str, array: np.ndarray) -> np.ndarray:
        if name == "model.decoder.decoder.2.weight":  # the conv before the sigmoid
            return array * 1.5
        return array

    drifted = _altered(vad_artifact, tmp_path, drift)
    checks = verify.compare_runners(
        verify.onnx_reference(drifted, "drifted"),
        verify.onnx_reference(vad_artifact / "model.onnx"),
        inputs,
        {**tolerances, "logits": Tolerance(0.1, 0.05)},
    )
    by_name = {c.name: c for c in checks}
    assert not by_name["speech_prob"].passed and by_name["speech_prob"].max_abs > 0.01
    assert by_name["next_state"].passed and by_name["next_state"].max_abs == 0.0
    assert by_name["next_context"].passed
    missing = by_name["logits"]
    assert not missing.passed and missing.max_abs is None
    assert missing.problem == "missing from the drifted outputs"
    record = [c.to_json() for c in checks]
    assert json.loads(json.dumps(record, allow_nan=False)) == record
    assert record[0] == {
        "name": "speech_prob",
        "max_abs": by_name["speech_prob"].max_abs,
        "max_rel": by_name["speech_prob"].max_rel,
        "atol": 0.01,
        "rtol": 0.0,
        "passed": False,
        "problem": "",
    }
    with pytest.raises(EngineVerificationError) as error:
        verify.require_passed(checks, "vad")
    assert "'speech_prob': max abs error" in str(error.value)
    assert "'logits': missing from the drifted outputs" in str(error.value)

    nan = tmp_path / "nan"
    nan.mkdir()
    broken = _altered(
        vad_artifact,
        nan,
        lambda n, a: np.full_like(a, np.nan) if n == "model.decoder.rnn.bias_ih" else a,
    )
    checks = verify.compare_runners(
        verify.onnx_reference(broken, "nan-bias"),
        verify.onnx_reference(vad_artifact / "model.onnx"),
        inputs,
        tolerances,
    )
    by_name = {c.name: c for c in checks}
    assert not by_name["next_state"].passed and np.isnan(by_name["next_state"].max_abs)
    assert by_name["next_state"].to_json()["max_abs"] == "nan"
    assert by_name["next_context"].passed


def test_an_output_of_another_shape_fails_without_figures(
    vad_artifact: Path, tmp_path: Path
) -> None:
    """next_context cut to 32 samples: Polygraphy refuses to compare it, the check says why."""
    model = onnx.load(str(vad_artifact / "model.onnx"))
    for node in model.graph.node:
        node.output[:] = ["full_context" if o == "next_context" else o for o in node.output]
    model.graph.initializer.extend(
        numpy_helper.from_array(np.array([v], np.int64), n)
        for n, v in (("cut_start", 0), ("cut_end", 32), ("cut_axis", 1))
    )
    model.graph.node.append(
        onnx.helper.make_node(
            "Slice", ["full_context", "cut_start", "cut_end", "cut_axis"], ["next_context"]
        )
    )
    (declared,) = [o for o in model.graph.output if o.name == "next_context"]
    declared.type.tensor_type.shape.dim[1].dim_value = 32
    onnx.save(model, str(tmp_path / "model.onnx"))
    inputs, tolerances = _case("vad", vad_artifact)
    checks = verify.compare_runners(
        verify.onnx_reference(tmp_path / "model.onnx", "cut"),
        verify.onnx_reference(vad_artifact / "model.onnx"),
        inputs,
        tolerances,
    )
    by_name = {c.name: c for c in checks}
    assert by_name["speech_prob"].passed and by_name["next_state"].passed
    cut = by_name["next_context"]
    assert (cut.passed, cut.max_abs) == (False, None)
    assert cut.problem == "shape (16, 32), reference (16, 64)"


def test_every_output_needs_a_tolerance() -> None:
    stage = Stage("export.vad.stage:VadProfile", ("fp16",), "fp16", {"a": Tolerance(0.1)})
    with pytest.raises(KeyError, match="no fp16 tolerance for output 'b'"):
        stage.tolerances("fp16", ["a", "b"])
    assert stage.tolerances("fp32", ["b"])["b"] == FP32


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
    from serving.cli import main

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


@pytest.mark.skipif(HAS_TENSORRT_PYTHON, reason="TensorRT's Python bindings are installed here")
def test_verification_needs_the_tensorrt_bindings(monkeypatch, caplog, tmp_path: Path) -> None:
    """With trtexec present but no `tensorrt` module, `export engines` still stops before any
    work, naming the bindings; the engine runner says the same."""
    from export.__main__ import main

    fake = tmp_path / "trtexec"
    fake.write_text("#!/bin/sh\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("TRTEXEC", str(fake))
    assert engine.find_trtexec() == str(fake)
    with pytest.raises(engine.TensorRTMissingError, match="Python bindings"):
        engine.require_tensorrt()
    with pytest.raises(engine.TensorRTMissingError, match="Polygraphy's TrtRunner"):
        verify.engine_runner(tmp_path / "m.plan")
    assert main(["engines"]) == 2
    assert "Python bindings (`import tensorrt`" in caplog.text


@pytest.mark.tensorrt
@pytest.mark.skipif(not (HAS_TRTEXEC and HAS_TENSORRT_PYTHON), reason=NO_TENSORRT)
@pytest.mark.parametrize("name", ENGINE_MODELS)
def test_build_and_verify_engine(name: str, artifacts: dict[str, Path]) -> None:
    record = build.build_and_verify(
        name, SOURCE_REPOSITORY / name / "config.pbtxt", artifacts[name], force=True
    )
    assert record["passed"] and (artifacts[name] / "model.plan").stat().st_size > 100_000
    assert {o["name"] for o in record["outputs"]} == {
        o.name for o in Sidecar.load(artifacts[name]).outputs
    }
    assert all(o["passed"] and not o["problem"] for o in record["outputs"])
