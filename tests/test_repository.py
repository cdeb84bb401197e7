"""Materialisation and config checks (no server)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from export.config_check import ConfigMismatchError, check_against_sidecar
from export.sidecar import Sidecar
from model_configs.pbtxt import (
    SOURCE_REPOSITORY,
    RepositoryError,
    is_native,
    model_names,
    parse_config,
)
from serving.repository import MissingArtifactError, materialize

MODELS = model_names()


@pytest.mark.parametrize("name", MODELS)
def test_every_config_parses_as_model_config(name: str) -> None:
    config = parse_config(SOURCE_REPOSITORY / name / "config.pbtxt")
    assert config.name == name, "config name must equal its folder name"
    assert "$" not in (SOURCE_REPOSITORY / name / "config.pbtxt").read_text(), "placeholder left"
    if not is_native(config) and config.backend == "python":
        assert (SOURCE_REPOSITORY / name / "1" / "model.py").is_file()


def test_every_native_config_matches_its_export() -> None:
    from export.registry import ensure_all

    native = [n for n in MODELS if is_native(parse_config(SOURCE_REPOSITORY / n / "config.pbtxt"))]
    assert "vad" in native
    for name, folder in ensure_all(native).items():
        check_against_sidecar(
            parse_config(SOURCE_REPOSITORY / name / "config.pbtxt"), Sidecar.load(folder)
        )


def _copy_model(tmp_path: Path, name: str = "vad") -> Path:
    source = tmp_path / "source"
    shutil.copytree(SOURCE_REPOSITORY / name, source / name)
    return source


def _edit(source: Path, name: str, old: str, new: str) -> None:
    path = source / name / "config.pbtxt"
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


def test_embedded_swap_keeps_io_batching_and_instances(tmp_path: Path, vad_artifact: Path) -> None:
    source = _copy_model(tmp_path)
    _edit(source, "vad", "kind: KIND_CPU", "kind: KIND_GPU")
    _edit(
        source,
        "vad",
        "dynamic_batching {",
        "optimization { cuda { graphs: true } }\ndynamic_batching {",
    )
    written = materialize(source, tmp_path / "out", "embedded", {"vad": vad_artifact})
    assert [(m.name, m.platform, m.declared_platform) for m in written] == [
        ("vad", "python", "onnxruntime_onnx")
    ]
    original = parse_config(source / "vad" / "config.pbtxt")
    served = parse_config(tmp_path / "out" / "vad" / "config.pbtxt")
    assert served.backend == "python" and not served.platform
    assert list(served.input) == list(original.input)
    assert list(served.output) == list(original.output)
    assert served.max_batch_size == original.max_batch_size
    assert served.dynamic_batching == original.dynamic_batching
    assert [g.count for g in served.instance_group] == [g.count for g in original.instance_group]
    assert all(g.kind == mc.ModelInstanceGroup.KIND_CPU for g in served.instance_group)
    assert not served.HasField("optimization")
    assert served.parameters["declared_platform"].string_value == "onnxruntime_onnx"
    version = tmp_path / "out" / "vad" / "1"
    assert (version / "model.onnx").resolve() == (vad_artifact / "model.onnx").resolve()
    assert "avatar.triton.onnx_runner" in (version / "model.py").read_text()


def test_production_keeps_native_platform(tmp_path: Path, vad_artifact: Path) -> None:
    source = _copy_model(tmp_path)
    materialize(source, tmp_path / "out", "production", {"vad": vad_artifact})
    served = parse_config(tmp_path / "out" / "vad" / "config.pbtxt")
    assert served.platform == "onnxruntime_onnx"
    assert (tmp_path / "out" / "vad" / "1" / "model.onnx").is_file()


def test_production_tensorrt_needs_an_engine(tmp_path: Path, vad_artifact: Path) -> None:
    source = _copy_model(tmp_path)
    _edit(source, "vad", 'platform: "onnxruntime_onnx"', 'platform: "tensorrt_plan"')
    with pytest.raises(MissingArtifactError, match=r"model\.plan"):
        materialize(source, tmp_path / "out", "production", {"vad": vad_artifact})
    # The embedded target serves the same model from its ONNX file.
    written = materialize(source, tmp_path / "out", "embedded", {"vad": vad_artifact})
    assert written[0].declared_platform == "tensorrt_plan"


def test_renamed_tensor_is_rejected(tmp_path: Path, vad_artifact: Path) -> None:
    source = _copy_model(tmp_path)
    _edit(source, "vad", 'name: "chunk"', 'name: "input"')
    with pytest.raises(ConfigMismatchError) as error:
        materialize(source, tmp_path / "out", "embedded", {"vad": vad_artifact})
    message = str(error.value)
    assert "'input' is not in the export" in message
    assert "export inputs missing from the config: ['chunk']" in message
    assert not (tmp_path / "out").exists(), "nothing is written when a config is wrong"


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ("dims: [ 512 ]", "dims: [ 480 ]", "dims [480], export has [512]"),
        ('"context", data_type: TYPE_FP32', '"context", data_type: TYPE_FP16', "TYPE_FP16"),
        ("max_batch_size: 64", "max_batch_size: 0", "dims [512], export has [-1, 512]"),
    ],
)
def test_config_drift_is_rejected(
    tmp_path: Path, vad_artifact: Path, old: str, new: str, expected: str
) -> None:
    source = _copy_model(tmp_path)
    _edit(source, "vad", old, new)
    with pytest.raises(ConfigMismatchError, match=expected.replace("[", r"\[").replace("]", r"\]")):
        materialize(source, tmp_path / "out", "embedded", {"vad": vad_artifact})


def test_batching_on_the_wrong_axis_is_rejected(vad_artifact: Path) -> None:
    sidecar = Sidecar.load(vad_artifact)
    sidecar.batch_axis = 1
    config = parse_config(SOURCE_REPOSITORY / "vad" / "config.pbtxt")
    with pytest.raises(ConfigMismatchError, match="batches on axis 1"):
        check_against_sidecar(config, sidecar)


def test_placeholder_and_missing_artifact_errors(tmp_path: Path, vad_artifact: Path) -> None:
    source = _copy_model(tmp_path)
    _edit(source, "vad", "max_batch_size: 64", "max_batch_size: ${max_batch}")
    with pytest.raises(RepositoryError, match="not a valid Triton ModelConfig"):
        materialize(source, tmp_path / "out", "embedded", {"vad": vad_artifact})
    source = _copy_model(tmp_path / "again")
    with pytest.raises(MissingArtifactError, match="python -m export build vad"):
        materialize(source, tmp_path / "out", "embedded", {})
    with pytest.raises(RepositoryError, match="unknown target"):
        materialize(source, tmp_path / "out", "staging", {"vad": vad_artifact})


def test_rendered_embedded_configs_parse_back(embedded_repository: Path) -> None:
    for path in sorted(embedded_repository.glob("*/config.pbtxt")):
        config = text_format.Parse(path.read_text(), mc.ModelConfig())
        assert config.name == path.parent.name


def test_companion_files_are_served_beside_the_model(embedded_repository: Path) -> None:
    assert (embedded_repository / "llm_decoder" / "1" / "tokenizer.json").is_file()
    assert (embedded_repository / "tts_vits" / "1" / "voice.onnx.json").is_file()
    assert not (embedded_repository / "vad" / "1" / "model.json").exists(), "sidecar not served"
    assert not list((embedded_repository / "llm_decoder" / "1").glob("model_int4*")), "variants"


def test_implicit_state_is_emulated_on_the_embedded_target(embedded_repository: Path) -> None:
    """llm_decoder's KV cache is implicit state in production; the embedded python runner
    keeps it per sequence instead: no state section (the python backend has none), START/
    END controls, the state pairs as a parameter, the sequence runner as model.py."""
    import json

    production = parse_config(SOURCE_REPOSITORY / "llm_decoder" / "config.pbtxt")
    states = {s.input_name: s.output_name for s in production.sequence_batching.state}
    assert len(states) == 60 and all(
        s.use_growable_memory for s in production.sequence_batching.state
    )
    assert not any(i.name.startswith("past_key_values") for i in production.input)
    embedded = parse_config(embedded_repository / "llm_decoder" / "config.pbtxt")
    assert not embedded.sequence_batching.state
    assert embedded.sequence_batching.max_sequence_idle_microseconds == 60_000_000
    controls = {c.name: c.control[0].kind for c in embedded.sequence_batching.control_input}
    kinds = mc.ModelSequenceBatching.Control
    assert controls == {"START": kinds.CONTROL_SEQUENCE_START, "END": kinds.CONTROL_SEQUENCE_END}
    assert json.loads(embedded.parameters["sequence_state"].string_value) == states
    assert all(i.allow_ragged_batch for i in embedded.input)  # steps of any length batch
    assert not any(i.allow_ragged_batch for i in production.input)  # natively: equal shapes
    model_py = (embedded_repository / "llm_decoder" / "1" / "model.py").read_text()
    assert "avatar.triton.sequence_runner" in model_py
    # stateless native models keep the plain runner; asr_decoder names its own (the
    # meaning of its state is Whisper's), on its stateless step graph
    assert "onnx_runner" in (embedded_repository / "vad" / "1" / "model.py").read_text()
    asr = embedded_repository / "asr_decoder"
    assert "avatar.triton.whisper_runner" in (asr / "1" / "model.py").read_text()
    assert parse_config(asr / "config.pbtxt").parameters["onnx_file"].string_value == (
        "model.step.onnx"
    )
    assert (asr / "1" / "model.step.onnx").is_file()


def test_embedded_runner_serves_a_variant_only_when_its_gate_passed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`embedded_onnx_variant` picks the INT8 Q/DQ graph on the CPU; a variant whose gate
    failed (or that is missing) is not served: model.onnx is, with a warning saying why."""
    import json

    from export.registry import ensure_all

    artifact = ensure_all(["asr_encoder"])["asr_encoder"]
    source = _copy_model(tmp_path, "asr_encoder")
    path = source / "asr_encoder" / "config.pbtxt"
    config = parse_config(path)
    config.parameters["embedded_onnx_variant"].string_value = "model.int8.onnx"
    path.write_text(text_format.MessageToString(config))
    passed = Sidecar.load(artifact).validation["variants"]["model.int8.onnx"]["passes_gate"]
    materialize(source, tmp_path / "out", "embedded", {"asr_encoder": artifact})
    served = parse_config(tmp_path / "out" / "asr_encoder" / "config.pbtxt")
    expected = "model.int8.onnx" if passed else "model.onnx"
    assert served.parameters["onnx_file"].string_value == expected
    assert (tmp_path / "out" / "asr_encoder" / "1" / expected).is_file()

    failed = tmp_path / "failed"
    shutil.copytree(artifact, failed)
    sidecar = json.loads((failed / "model.json").read_text())
    sidecar["validation"]["variants"]["model.int8.onnx"].update(passes_gate=False, why="WER +9")
    (failed / "model.json").write_text(json.dumps(sidecar))
    materialize(source, tmp_path / "out2", "embedded", {"asr_encoder": failed})
    served = parse_config(tmp_path / "out2" / "asr_encoder" / "config.pbtxt")
    assert served.parameters["onnx_file"].string_value == "model.onnx"
    assert "failed its gate (WER +9)" in caplog.text


def test_an_onnx_runtime_model_serves_its_gated_variant_in_both_targets(tmp_path: Path) -> None:
    """emotion_encoder names model.int8.onnx by Triton's `default_model_filename`: served in
    production (ONNX Runtime on the CPU) and by the embedded runner while its gate passed;
    with a failed gate both serve model.onnx and production's config says so."""
    import json

    from export.registry import ensure_all

    artifact = ensure_all(["emotion_encoder"])["emotion_encoder"]
    source = _copy_model(tmp_path, "emotion_encoder")
    declared = parse_config(source / "emotion_encoder" / "config.pbtxt")
    assert declared.default_model_filename == "model.int8.onnx"
    assert Sidecar.load(artifact).validation["variants"]["model.int8.onnx"]["passes_gate"]

    def served(folder: Path) -> tuple[str, str]:
        artifacts = {"emotion_encoder": folder}
        materialize(source, tmp_path / "prod", "production", artifacts)
        materialize(source, tmp_path / "emb", "embedded", artifacts)
        prod = parse_config(tmp_path / "prod" / "emotion_encoder" / "config.pbtxt")
        emb = parse_config(tmp_path / "emb" / "emotion_encoder" / "config.pbtxt")
        assert (tmp_path / "prod" / "emotion_encoder" / "1" / prod.default_model_filename).is_file()
        return prod.default_model_filename, emb.parameters["onnx_file"].string_value

    assert served(artifact) == ("model.int8.onnx", "model.int8.onnx")
    failed = tmp_path / "failed"
    shutil.copytree(artifact, failed)
    sidecar = json.loads((failed / "model.json").read_text())
    sidecar["validation"]["variants"]["model.int8.onnx"].update(passes_gate=False, why="labels")
    (failed / "model.json").write_text(json.dumps(sidecar))
    assert served(failed) == ("model.onnx", "model.onnx")


def test_tts_vits_serves_its_gated_int8_variant_on_the_cpu(embedded_repository: Path) -> None:
    """tts_vits's INT8 Q/DQ graph, built and gated with the export (WER through Whisper,
    per-phoneme durations, sentence lengths against FP32): the embedded runner serves it
    while the sidecar says it passed; the gate's verdict follows its own figures."""
    from evals import tts
    from export.registry import ensure_all
    from export.tts import int8

    artifact = ensure_all(["tts_vits"])["tts_vits"]
    record = Sidecar.load(artifact).validation["variants"][int8.VARIANT_FILE]
    assert (artifact / int8.CALIBRATION_FILE).is_file()
    assert record["passes_gate"] == (
        record["wer"]["int8"] <= record["wer"]["fp32"] + tts.MAX_WER_RISE
        and record["phoneme_duration_mad_ms"] <= tts.MAX_PHONEME_MS
        and record["max_length_change"] <= tts.MAX_LENGTH_CHANGE
        and record["rows_changed_in_a_batch"].startswith("0/")
    )
    served = parse_config(embedded_repository / "tts_vits" / "config.pbtxt")
    expected = int8.VARIANT_FILE if record["passes_gate"] else "model.onnx"
    assert served.parameters["onnx_file"].string_value == expected


def test_the_call_graph_is_read_from_the_bls_configs() -> None:
    """perf's copies of the turn's chain re-point callers found here (perf/latency.py)."""
    from model_configs.pbtxt import call_graph, model_names

    turn = call_graph(root="avatar")
    assert list(turn)[-1] == "avatar" and "avatar_speech" not in turn
    assert turn["avatar"]["llm_model"] == "llm" and turn["llm"] == {"decoder_model": "llm_decoder"}
    assert turn["asr"] == {"encoder_model": "asr_encoder", "decoder_model": "asr_decoder"}
    order = list(call_graph())
    for caller, calls in call_graph().items():  # callers after their callees
        assert all(order.index(c) < order.index(caller) for c in calls.values() if c in order)
        assert set(calls.values()) <= set(model_names())
