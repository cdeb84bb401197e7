"""The turn schema (avatar/pipeline/schema.py) against the `avatar` config, and the round
trip its derived parts make: runner events -> tensors -> a real gRPC response -> the
clients' decoder and the gateway's typed events."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from avatar.model_io import ARRAY, NUMPY
from avatar.pipeline import schema
from avatar.pipeline.events import FinalEvent, FramesEvent, SentenceEvent, TranscriptEvent
from avatar.pipeline.runner import event_tensors
from model_configs.pbtxt import parse_config

AVATAR_CONFIG = Path(__file__).parents[1] / "model_repository" / "avatar" / "config.pbtxt"


def _declared(tensors) -> list[tuple[str, str, tuple[int, ...], bool]]:
    from tritonclient.grpc import model_config_pb2

    return [
        (
            t.name,
            model_config_pb2.DataType.Name(t.data_type).removeprefix("TYPE_"),
            tuple(t.dims),
            bool(getattr(t, "optional", False)),
        )
        for t in tensors
    ]


def _specs(specs) -> list[tuple[str, str, tuple[int, ...], bool]]:
    dtype = {"BYTES": "STRING"}  # Triton's config name of the gRPC BYTES type
    return [(s.name, dtype.get(s.dtype, s.dtype), s.dims, s.optional) for s in specs.values()]


def test_the_avatar_config_declares_the_schema() -> None:
    config = parse_config(AVATAR_CONFIG)
    assert _declared(config.input) == _specs(schema.INPUTS)
    assert _declared(config.output) == _specs(schema.OUTPUTS)
    carried = {name for layout in schema.RESPONSES.values() for name in layout}
    assert carried | {"kind"} == set(schema.OUTPUTS), "an output no response carries"
    assert set(schema.REQUEST) == set(schema.INPUTS)


def _sentence() -> SentenceEvent:
    rng = np.random.default_rng(0)
    return SentenceEvent(
        index=2,
        text="Hello there.",
        emotion="happy",
        start=1.25,
        audio=rng.uniform(-1, 1, 2205).astype(np.float32),
        sample_rate=22050,
        fps=30.0,
        blendshapes=rng.random((3, 52), np.float32),
        head_pose=rng.random((3, 3), np.float32),
        animation={"visemes": [["aa", 0.0, 0.1]], "blinks": []},
        error="",
    )


def grpc_result(tensors: dict[str, np.ndarray]):
    """`tensors` as the gRPC client receives them from Triton (a real InferResult)."""
    from tritonclient.grpc import InferResult, service_pb2
    from tritonclient.utils import np_to_triton_dtype, serialize_byte_tensor

    response = service_pb2.ModelInferResponse(model_name="avatar")
    for name, array in tensors.items():
        response.outputs.add(
            name=name, datatype=np_to_triton_dtype(array.dtype), shape=list(array.shape)
        )
        raw = serialize_byte_tensor(array).item() if array.dtype == object else array.tobytes()
        response.raw_output_contents.append(raw)
    return InferResult(response)


@pytest.mark.parametrize(
    "event",
    [
        TranscriptEvent("What time is it?"),
        _sentence(),
        FramesEvent(1, 0.5, 30.0, np.zeros((3, 4, 4, 3), np.uint8)),
        SentenceEvent(0, "Hm.", "neutral", 0.0, np.zeros(0, np.float32), 22050, 30.0,
                      np.zeros((0, 52), np.float32), np.zeros((0, 3), np.float32), {},
                      "tts failed"),
        FinalEvent("", "Hello there.", "client", ["tts: timeout"], {"stage_ms": {"asr": 12.5}}),
    ],
)  # fmt: skip
def test_an_event_survives_the_wire(event) -> None:
    """What the runner sends is what the gateway gets back: the same event, typed."""
    from clients.avatar_stream import decode_response

    tensors = event_tensors(event, video="renderer")
    for name, array in tensors.items():  # the config's dtype, rank and fixed dims
        spec = schema.OUTPUTS[name]
        assert array.dtype == NUMPY[spec.dtype] and array.ndim == len(spec.dims), name
    result = grpc_result(tensors)
    back = schema.outputs_event(
        {t.name: result.as_numpy(t.name) for t in result.get_response().outputs}
    )
    if isinstance(event, FinalEvent):
        timings = {**event.timings, "cancelled": "client", "video": "renderer"}
        assert back == FinalEvent("", event.reply, "client", event.errors, timings)
    else:
        _assert_same(back, event)
    decoded = decode_response(result)  # the gRPC clients' view: by output name
    assert decoded["kind"] == schema.EVENTS[type(event)]
    if isinstance(event, FinalEvent):
        assert (
            decoded["error"] == ["tts: timeout"] and decoded["timings"]["stage_ms"]["asr"] == 12.5
        )
    if isinstance(event, SentenceEvent):
        assert decoded["animation"] == event.animation and decoded["sentence_index"] == event.index
        assert isinstance(decoded["sample_rate"], int) and decoded["start_time"] == event.start


def _assert_same(got, want) -> None:
    assert type(got) is type(want)
    for field, value in vars(want).items():
        if isinstance(value, np.ndarray):
            assert np.array_equal(getattr(got, field), value), field
        else:
            assert getattr(got, field) == value, field


def test_an_empty_response_decodes_to_nothing() -> None:
    assert schema.decode_outputs({}) == {} and schema.outputs_event({}) is None
    with pytest.raises(ValueError, match="kind 'poem'"):
        schema.decode_outputs({"kind": np.array([b"poem"], object)})


def test_a_request_sends_only_what_it_has() -> None:
    tensors = schema.encode_request(text="Hi", controls={"fps": 25})
    assert set(tensors) == {"text", "controls"}
    assert tensors["controls"][0] == b'{"fps": 25}'
    audio = schema.encode_request(audio=np.zeros((1, 800)), session_id="s1")
    assert audio["audio"].shape == (800,) and audio["audio"].dtype == np.float32
    assert audio["session_id"].tolist() == [b"s1"]


def test_a_tensor_of_the_wrong_shape_is_refused() -> None:
    with pytest.raises(ValueError, match=r"blendshapes: shape \(3, 50\)"):
        schema.OUTPUTS["blendshapes"].encode(np.zeros((3, 50)), ARRAY)
    with pytest.raises(ValueError, match="head_pose"):
        schema.OUTPUTS["head_pose"].encode(np.zeros(3), ARRAY)
