"""The lipsync model through the real embedded server: same numbers as ONNX Runtime,
batching across concurrent requests, per-request errors, and a WAV -> animation client."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from avatar.audio import reference_speech, write_wav
from clients.lipsync import CONTEXT_S, WINDOW_S, infer_windows, main, viseme_probs, windows
from export.common import onnx_session
from export.lipsync.recipe import OUTPUTS
from serving.served import served_onnx
from serving.server import EmbeddedServer

RATE = 16000
WINDOW, CONTEXT = int(WINDOW_S * RATE), int(CONTEXT_S * RATE)


@pytest.fixture(scope="module")
def session():
    """The graph the embedded server runs (the INT8 variant while its gate passes)."""
    return onnx_session(served_onnx("lipsync"))


@pytest.fixture(scope="module")
def speech() -> np.ndarray:
    quiet = np.zeros(RATE // 4, np.float32)
    spoken = reference_speech("Bob bought a map of the moon, and we walked home in May.")
    return np.concatenate([quiet, spoken, quiet])


def test_served_equals_onnx_runtime(triton_server: EmbeddedServer, session, speech) -> None:
    served_probs, served_open = viseme_probs(triton_server.grpc_url, speech)
    pieces = windows(speech, WINDOW, CONTEXT)
    direct = session.run(list(OUTPUTS), {"audio": pieces})
    keep = slice(CONTEXT // 160, (CONTEXT + WINDOW) // 160)
    frames = len(speech) // 160 + 1
    assert served_probs.shape == (frames, 15) and served_open.shape == (frames,)
    np.testing.assert_allclose(served_probs, direct[0][:, keep].reshape(-1, 15)[:frames], atol=1e-5)
    np.testing.assert_allclose(served_open, direct[1][:, keep].reshape(-1)[:frames], atol=1e-5)
    # Windows with context see what the whole file would (away from its zero-padded ends).
    (whole,) = session.run(["viseme_probs"], {"audio": speech[None]})
    np.testing.assert_allclose(served_probs[40:-40], whole[0][40:-40], atol=1e-4)


def test_concurrent_requests_batch(triton_server: EmbeddedServer, session) -> None:
    clips = [reference_speech(t) for t in ("Good morning.", "What time is it?", "Stop!")]
    requests = [windows(clip, WINDOW, CONTEXT)[:1] for clip in clips] * 6  # [1, S] each
    with grpcclient.InferenceServerClient(triton_server.grpc_url) as client:
        before = client.get_inference_statistics("lipsync").model_stats[0]

        def call(batch: np.ndarray):
            with grpcclient.InferenceServerClient(triton_server.grpc_url) as own:
                return infer_windows(own, batch, "lipsync")

        with ThreadPoolExecutor(len(requests)) as pool:
            results = list(pool.map(call, requests))
        # Triton records a batch's statistics after its responses are sent: a loaded CI read
        # 6 of 18 right after the last response, so wait (bounded) for the count to arrive
        deadline = time.monotonic() + 10.0
        while True:
            after = client.get_inference_statistics("lipsync").model_stats[0]
            done = after.inference_count - before.inference_count >= len(requests)
            if done or time.monotonic() > deadline:
                break
            time.sleep(0.05)
    for batch, (probs, opening) in zip(requests, results, strict=True):
        want = session.run(list(OUTPUTS), {"audio": batch})
        np.testing.assert_allclose(probs, want[0], atol=1e-5)
        np.testing.assert_allclose(opening, want[1], atol=1e-5)
    inferences = after.inference_count - before.inference_count
    executions = after.execution_count - before.execution_count
    assert inferences == len(requests)
    assert executions < inferences, "concurrent requests were never batched together"


def _input(array: np.ndarray) -> list[grpcclient.InferInput]:
    dtype = {"float32": "FP32", "float64": "FP64", "int16": "INT16"}[array.dtype.name]
    tensor = grpcclient.InferInput("audio", list(array.shape), dtype)
    tensor.set_data_from_numpy(array)
    return [tensor]


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (np.zeros((1, RATE), np.float64), "FP64"),
        (np.zeros((1, RATE), np.int16), "INT16"),
        (np.zeros((1, 2, RATE), np.float32), "shape"),
        (np.zeros((1, 0), np.float32), "empty"),
        (np.full((1, RATE), np.nan, np.float32), "NaN or Inf"),
    ],
)
def test_bad_input_gets_a_clear_error_and_the_server_keeps_serving(
    triton_server: EmbeddedServer, bad: np.ndarray, message: str
) -> None:
    with grpcclient.InferenceServerClient(triton_server.grpc_url) as client:
        with pytest.raises(InferenceServerException, match=message):
            client.infer("lipsync", _input(bad))
        probs, opening = infer_windows(client, np.zeros((1, RATE), np.float32), "lipsync")
    assert probs.shape == (1, 101, 15) and opening.shape == (1, 101)


def test_client_writes_animation_from_a_wav(
    triton_server: EmbeddedServer, speech, tmp_path: Path
) -> None:
    wav = write_wav(tmp_path / "speech.wav", speech, RATE)
    out = tmp_path / "speech.json"
    assert main([str(wav), "--url", triton_server.grpc_url, "--out", str(out), "--fps", "25"]) == 0
    anim = json.loads(out.read_text())
    frames = np.asarray(anim["blendshapes"])
    assert frames.shape == (int(len(speech) / RATE * 25) + 1, 52)
    track = [v for v, _, _ in anim["viseme_track"]]
    assert track[0] == "sil" and track[-1] == "sil" and "PP" in track and "aa" in track
    jaw = frames[:, anim["arkit_names"].index("jawOpen")]
    assert jaw[:3].max() < 0.05 and jaw.max() > 0.3, "closed in the lead-in, open in speech"
