"""The VAD model through the real embedded server: same numbers as ONNX Runtime, batching
across sessions, per-request errors, and speech found in real speech."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from avatar.audio import reference_speech
from avatar.vad import CHUNK, SAMPLE_RATE, chunks, onnx_vad, speech_probabilities, speech_segments
from clients.vad_stream import infer, served_probabilities
from export.common import onnx_session
from serving.server import EmbeddedServer


@pytest.fixture(scope="module")
def speech() -> np.ndarray:
    silence = np.zeros(SAMPLE_RATE // 2, np.float32)
    spoken = reference_speech("Please book a table for two people at seven tonight.")
    return np.concatenate([silence, spoken, silence])


def direct_probabilities(vad_artifact: Path, audio: np.ndarray) -> np.ndarray:
    return speech_probabilities(onnx_vad(onnx_session(vad_artifact / "model.onnx")), audio)


def test_grpc_equals_onnx_runtime(
    triton_server: EmbeddedServer, vad_artifact: Path, speech
) -> None:
    served = served_probabilities(triton_server.grpc_url, speech)
    direct = direct_probabilities(vad_artifact, speech)
    np.testing.assert_allclose(served, direct, atol=1e-6)


def test_speech_is_found_where_it_was_spoken(triton_server: EmbeddedServer, speech) -> None:
    segments = speech_segments(served_probabilities(triton_server.grpc_url, speech))
    assert segments, "no speech found in spoken audio"
    spoken_end = (len(speech) - SAMPLE_RATE // 2) / SAMPLE_RATE
    assert abs(segments[0].start_s - 0.5) < 0.25
    assert abs(segments[-1].end_s - spoken_end) < 0.4
    silence = served_probabilities(triton_server.grpc_url, np.zeros(SAMPLE_RATE, np.float32))
    assert speech_segments(silence) == []


def test_concurrent_sessions_batch_and_stay_independent(
    triton_server: EmbeddedServer, vad_artifact: Path
) -> None:
    texts = ["Good morning.", "What time is it?", "Tell me a joke.", "Turn the lights off."] * 2
    clips = [reference_speech(t, length_scale=0.9 + 0.05 * i) for i, t in enumerate(texts)]
    with grpcclient.InferenceServerClient(triton_server.grpc_url) as client:
        before = client.get_inference_statistics("vad").model_stats[0]
    with ThreadPoolExecutor(len(clips)) as pool:
        served = list(pool.map(lambda c: served_probabilities(triton_server.grpc_url, c), clips))
    for clip, probs in zip(clips, served, strict=True):
        np.testing.assert_allclose(probs, direct_probabilities(vad_artifact, clip), atol=1e-6)
    with grpcclient.InferenceServerClient(triton_server.grpc_url) as client:
        after = client.get_inference_statistics("vad").model_stats[0]
    inferences = after.inference_count - before.inference_count
    executions = after.execution_count - before.execution_count
    assert inferences == sum(len(chunks(c)) for c in clips)
    assert executions < inferences, "concurrent sessions' chunks were never batched together"


def _inputs(**arrays: np.ndarray) -> list[grpcclient.InferInput]:
    inputs = []
    for name, array in arrays.items():
        dtype = {"float32": "FP32", "float64": "FP64"}[array.dtype.name]
        tensor = grpcclient.InferInput(name, list(array.shape), dtype)
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


GOOD = {
    "chunk": np.zeros((1, CHUNK), np.float32),
    "context": np.zeros((1, 64), np.float32),
    "state": np.zeros((1, 2, 128), np.float32),
}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"chunk": np.zeros((1, CHUNK), np.float64)}, "FP64"),
        ({"chunk": np.zeros((1, 100), np.float32)}, "100"),
        ({"state": np.zeros((1, 128), np.float32)}, "state"),
        ({"chunk": np.full((1, CHUNK), np.nan, np.float32)}, "NaN or Inf"),
        ({"context": np.full((1, 64), np.inf, np.float32)}, "NaN or Inf"),
    ],
)
def test_bad_input_gets_a_clear_error_and_the_server_keeps_serving(
    triton_server: EmbeddedServer, change: dict, message: str
) -> None:
    with grpcclient.InferenceServerClient(triton_server.grpc_url) as client:
        with pytest.raises(InferenceServerException, match=message):
            client.infer("vad", _inputs(**{**GOOD, **change}))
        result = infer(client, "vad", GOOD)
        assert result["speech_prob"].shape == (1, 1)
