"""INT8 variants that are the same file with the same verdict on any machine (export.quantize,
export.gates): snapped calibration ranges, 7-bit weights, verdicts recorded and re-checked
by a probe, and a real variant built twice."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from export import gates
from export.quantize import (
    RANGE_STEPS_PER_OCTAVE,
    RANGES_FILE,
    VARIANT_FILE,
    quantize_qdq,
    snap_outward,
)
from export.sidecar import Sidecar, sha256_file


def test_snapped_ranges_grow_outward_onto_a_grid_of_float32_numbers() -> None:
    rng = np.random.default_rng(0)
    for value in np.concatenate([rng.normal(0, 10, 500), rng.normal(0, 1e-4, 500)]):
        low, high = snap_outward(value, up=False), snap_outward(value, up=True)
        assert low <= value <= high
        assert high - low <= abs(value) / (RANGE_STEPS_PER_OCTAVE / 2) + 1e-30
        for snapped in (low, high):
            assert float(np.float32(snapped)) == snapped  # exact in float32
            assert snap_outward(snapped, up=True) == snapped == snap_outward(snapped, up=False)
    assert snap_outward(0.0, up=True) == 0.0
    # what differs between two CPUs' FP32 runs (the last bits) lands on the same point
    value = 3.7312
    assert snap_outward(value, up=True) == snap_outward(value * (1 + 1e-6), up=True)


def tiny_model(path: Path) -> Path:
    """Conv -> Relu -> Conv on [1, 4, 64]: a real graph with weights to quantise."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(1)
    w1 = numpy_helper.from_array(rng.normal(0, 0.5, (8, 4, 3)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.normal(0, 0.5, (4, 8, 3)).astype(np.float32), "w2")
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["h"], name="conv1", pads=[1, 1]),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("Conv", ["r", "w2"], ["y"], name="conv2", pads=[1, 1]),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 64])],
        initializer=[w1, w2],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def feeds(scale: float = 1.0) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(2)
    return [{"x": (rng.normal(0, 1, (1, 4, 64)) * scale).astype(np.float32)} for _ in range(6)]


@pytest.mark.parametrize("symmetric", [True, False])
def test_the_same_feeds_give_the_same_file_and_last_bit_noise_changes_nothing(
    tmp_path: Path, symmetric: bool
) -> None:
    source = tiny_model(tmp_path / "model.onnx")
    files = []
    for k, scale in enumerate((1.0, 1.0, 1.0 + 3e-7)):  # the third: another CPU's rounding
        out = tmp_path / str(k) / VARIANT_FILE
        out.parent.mkdir()
        quantize_qdq(source, out, feeds(scale), ops=["Conv"], symmetric=symmetric)
        files.append(out)
    assert len({sha256_file(f) for f in files}) == 1
    ranges = json.loads((files[0].parent / RANGES_FILE).read_text())
    assert ranges  # recorded beside the variant


def test_weights_are_seven_bit_so_no_x86_kernel_saturates(tmp_path: Path) -> None:
    import onnx
    from onnx import numpy_helper

    source = tiny_model(tmp_path / "model.onnx")
    out = tmp_path / VARIANT_FILE
    quantize_qdq(source, out, feeds(), ops=["Conv"], symmetric=False)
    model = onnx.load(str(out))
    weights = [numpy_helper.to_array(i) for i in model.graph.initializer if i.data_type == 3]
    assert weights, "no INT8 weights in the variant"
    for w in weights:
        assert w.min() >= -64 and w.max() <= 64, (w.min(), w.max())


def test_a_verdict_is_taken_from_the_record_only_for_its_file_on_agreeing_numerics(
    tmp_path: Path,
) -> None:
    source = tiny_model(tmp_path / "model.onnx")
    variant = tmp_path / VARIANT_FILE
    quantize_qdq(source, variant, feeds(), ops=["Conv"], symmetric=False)
    probe = feeds()[0]
    runs = []

    def gate() -> dict:
        runs.append(1)
        return {"passes_gate": True, "why": "measured"}

    measured = gates.judged("tiny", variant, probe, gate, records={}, code="c1")
    assert measured["verdict"] == "measured" and len(runs) == 1
    records = {"tiny": gates.as_record("tiny", measured)}
    recorded = gates.judged("tiny", variant, probe, gate, records=records, code="c1")
    assert recorded["verdict"] == "recorded" and len(runs) == 1
    assert recorded["passes_gate"] is True and recorded["why"] == "measured"

    # a CPU whose kernels compute other numbers: many probe values off -> measured again
    other = json.loads(json.dumps(records))
    values = np.asarray(other["tiny"]["probe"]["y"]["values"])
    other["tiny"]["probe"]["y"]["values"] = (values * 1.1 + 0.05).tolist()
    assert (
        gates.judged("tiny", variant, probe, gate, records=other, code="c1")["verdict"]
        == "measured"
    )
    assert len(runs) == 2
    # one value a quantisation step away (float rounding crossing a step) is tolerated
    near = json.loads(json.dumps(records))
    near["tiny"]["probe"]["y"]["values"][3] += 0.5
    assert (
        gates.judged("tiny", variant, probe, gate, records=near, code="c1")["verdict"] == "recorded"
    )
    # another file: measured
    stale = json.loads(json.dumps(records))
    stale["tiny"]["sha256"] = "0" * 64
    assert (
        gates.judged("tiny", variant, probe, gate, records=stale, code="c1")["verdict"]
        == "measured"
    )
    assert len(runs) == 3
    # another gate (its metric or data changed): measured
    assert (
        gates.judged("tiny", variant, probe, gate, records=records, code="c2")["verdict"]
        == "measured"
    )
    assert len(runs) == 4


def test_a_gates_code_is_every_project_module_it_imports() -> None:
    code = gates.gate_code("lipsync")
    assert code == gates.gate_code("lipsync") and code != gates.gate_code("tts_vits")
    assert gates.gate_code("asr_encoder") == gates.gate_code("asr_decoder")  # one module


def test_every_gated_model_has_a_record_of_its_variant() -> None:
    from export.registry import GATES

    records = gates.load_records()
    assert sorted(records) == sorted(GATES)
    for name, record in records.items():
        assert set(record) == {"sha256", "gate_code", "cpu", "probe", "record"}, name
        assert isinstance(record["record"]["passes_gate"], bool), name
        assert record["probe"], name


def test_a_real_variant_built_twice_is_the_same_file_with_the_same_verdict(tmp_path: Path) -> None:
    """lipsync's INT8 variant, quantised again from its artifact's FP32 graph and calibration
    speech: byte for byte the served file, and judged as the build judged it."""
    from export.lipsync.int8 import build_variant
    from export.registry import ensure_all

    folder = ensure_all(["lipsync"])["lipsync"]
    built = Sidecar.load(folder).validation["variants"][VARIANT_FILE]
    again = tmp_path / "lipsync"
    again.mkdir()
    (again / "model.onnx").symlink_to(folder / "model.onnx")
    record = build_variant(again)
    assert sha256_file(again / VARIANT_FILE) == sha256_file(folder / VARIANT_FILE)
    ranges = [json.loads((f / RANGES_FILE).read_text()) for f in (again, folder)]
    assert ranges[0] == ranges[1]  # the same ranges (the quantizer writes them in any order)
    assert record["passes_gate"] == built["passes_gate"]
    assert gates.probe_differs(record["probe"], built["probe"]) is None
