"""The calls between the models (avatar/model_io.py) against each model's config.pbtxt, and
the round trip of a request and a response through their tensors."""

from __future__ import annotations

import numpy as np
import pytest
from test_turn_schema import _declared, _specs

from avatar.model_io import ASR, LLM, MODELS, TTS
from model_configs.pbtxt import SOURCE_REPOSITORY, parse_config


@pytest.mark.parametrize("model", sorted(MODELS))
def test_each_call_is_its_models_config(model: str) -> None:
    io = MODELS[model]
    config = parse_config(SOURCE_REPOSITORY / model / "config.pbtxt")
    specs = {k: v.spec for k, v in io.inputs.items()}
    assert _declared(config.input) == _specs(specs)
    assert _declared(config.output) == _specs({k: v.spec for k, v in io.outputs.items()})
    assert io.batched == (config.max_batch_size > 0)


def test_a_request_and_a_response_round_trip_through_their_tensors() -> None:
    messages = [{"role": "user", "content": "Hi, I'm Ada."}]
    tensors = LLM.request(messages=messages, session_id="s1", sampling={"seed": 3}, stop=None)
    assert set(tensors) == {"messages", "session_id", "sampling"}
    assert tensors["messages"].dtype == object and tensors["messages"].shape == (1,)
    heard = LLM.read_request(tensors.get)
    assert heard["messages"] == messages and heard["sampling"] == {"seed": 3}
    assert heard["stop"] is None and heard["session_id"] == "s1"
    out = LLM.response(text="Hi", sentence="", finish_reason="stop", stats={"ttft_ms": 5.0})
    assert LLM.read_response(out)["stats"] == {"ttft_ms": 5.0}
    assert LLM.read_response({"stats": np.array([b""], object)}) == {"stats": {}}
    # a batched model: a batch axis of one on the way in, the first row on the way out
    audio = np.zeros(1600, np.float32)
    assert ASR.request(audio=audio, language="en")["audio"].shape == (1, 1600)
    reply = ASR.read_response({"text": np.array([[b" Hello."]], object),
                               "tokens": np.array([[1, 2, 3]], np.int32)})  # fmt: skip
    assert reply["text"] == " Hello." and reply["tokens"].tolist() == [1, 2, 3]
    speech = TTS.read_response({"phonemes": np.array([b"h", b"a"], object)})
    assert speech == {"phonemes": ["h", "a"]}


def test_a_call_that_breaks_its_definition_is_refused() -> None:
    with pytest.raises(ValueError, match="input 'text' is required"):
        TTS.request(seed=1)
    with pytest.raises(ValueError, match=r"no input \['voice'\]"):
        TTS.request(text="hi", voice="x")
    with pytest.raises(ValueError, match="does not fit dims"):
        ASR.request(audio=np.zeros((2, 3), np.float32))


def test_a_request_becomes_tritonclients_inputs_with_their_triton_dtypes() -> None:
    import tritonclient.grpc as grpcclient

    from avatar.model_io import infer_inputs

    tensors = ASR.request(audio=np.zeros(160, np.float32), language="en", prefix=[1, 2])
    inputs = {i.name(): i for i in infer_inputs(tensors, grpcclient.InferInput)}
    assert {n: (i.datatype(), i.shape()) for n, i in inputs.items()} == {
        "audio": ("FP32", [1, 160]), "language": ("BYTES", [1, 1]), "prefix": ("INT32", [1, 2]),
    }  # fmt: skip
    stop = infer_inputs(LLM.request(stop=True), grpcclient.InferInput)
    assert [(i.name(), i.datatype()) for i in stop] == [("stop", "BOOL")]


def test_a_batched_request_of_several_rows_is_checked_row_by_row() -> None:
    from avatar.model_io import EMOTION_ENCODER, PORTRAIT_RENDERER, VAD

    frames = PORTRAIT_RENDERER.rows(blendshapes=np.zeros((5, 52)), head_pose=np.zeros((5, 3)))
    assert {k: (v.dtype, v.shape) for k, v in frames.items()} == {
        "blendshapes": (np.float32, (5, 52)), "head_pose": (np.float32, (5, 3)),
    }  # fmt: skip
    with pytest.raises(ValueError, match="different row counts"):
        PORTRAIT_RENDERER.rows(blendshapes=np.zeros((5, 52)), head_pose=np.zeros((4, 3)))
    with pytest.raises(ValueError, match=r"head_pose: shape \(5,\) is not rows of dims \(3,\)"):
        PORTRAIT_RENDERER.rows(blendshapes=np.zeros((5, 52)), head_pose=np.zeros(5))
    with pytest.raises(ValueError, match="not a batched model"):
        LLM.rows(messages=[[]])
    with pytest.raises(ValueError, match="language: rows are numeric"):
        ASR.rows(audio=np.zeros((1, 160)), language=["en"])
    tokens = EMOTION_ENCODER.rows(input_ids=[[101, 7, 102]], attention_mask=[[1, 1, 1]])
    assert tokens["input_ids"].dtype == np.int64
    embedding = EMOTION_ENCODER.read_rows({"embedding": np.ones((2, 384), np.float32)})
    assert embedding["embedding"].shape == (2, 384)
    with pytest.raises(ValueError, match="not rows of dims"):
        EMOTION_ENCODER.read_rows({"embedding": np.ones((2, 383), np.float32)})
    state = VAD.rows(
        chunk=np.zeros((2, 512)), context=np.zeros((2, 64)), state=np.zeros((2, 2, 128))
    )
    assert all(v.dtype == np.float32 and len(v) == 2 for v in state.values())


def test_the_model_side_reads_its_request_and_refuses_text_that_is_not_utf8() -> None:
    from avatar.model_io import AVATAR_ANIMATE

    tensors = {
        "phonemes": np.array([b"h", b"\xc9\x99"], object),
        "phoneme_starts": np.array([0.0, 0.1], np.float32),
        "phoneme_ends": np.array([0.1, 0.2], np.float32),
        "duration": np.array([0.25], np.float32),
    }
    heard = AVATAR_ANIMATE.read_request(tensors.get)
    assert heard["phonemes"] == ["h", "ə"] and heard["duration"] == 0.25
    assert heard["controls"] is None
    out = AVATAR_ANIMATE.response(
        blendshapes=np.zeros((2, 52)), head_pose=np.zeros((2, 3)), fps=30.0, animation={"fps": 30}
    )
    assert AVATAR_ANIMATE.read_response(out)["animation"] == {"fps": 30}
    with pytest.raises(ValueError, match="controls: not text"):
        AVATAR_ANIMATE.read_request({**tensors, "controls": np.array([b"\xff"], object)}.get)
