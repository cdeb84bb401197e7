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
