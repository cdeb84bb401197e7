"""The `tts` (decoupled BLS) and `tts_vits` models on a real embedded tritonserver, over gRPC."""

from __future__ import annotations

import queue

import numpy as np
import pytest

pytestmark = pytest.mark.server

PARAGRAPH = (
    "Good evening, and welcome aboard. Tonight's flight will take about 2 hours. "
    "Please keep your seat belt fastened while seated!"
)


@pytest.fixture(scope="module")
def client(triton_server):
    import tritonclient.grpc as grpcclient

    with grpcclient.InferenceServerClient(triton_server.grpc_url) as c:
        yield c


def speak(client, text, **controls) -> list:
    """One decoupled call: the list of responses, or [error] if the stream failed."""
    import tritonclient.grpc as grpcclient

    results: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        value = np.array([text], dtype=object)
        tensor = grpcclient.InferInput("text", [1], "BYTES")
        tensor.set_data_from_numpy(value)
        inputs = [tensor]
        for name, v in controls.items():
            dtype = np.int64 if name == "seed" else np.float32
            extra = grpcclient.InferInput(name, [1], "INT64" if name == "seed" else "FP32")
            extra.set_data_from_numpy(np.array([v], dtype))
            inputs.append(extra)
        client.async_stream_infer("tts", inputs, enable_empty_final_response=True)
        responses = []
        while True:
            result, error = results.get(timeout=120)
            if error is not None:
                return [error]
            if result.get_response().outputs:
                responses.append(result)
            if result.get_response().parameters["triton_final_response"].bool_param:
                return responses
    finally:
        client.stop_stream()


def test_paragraph_streams_one_response_per_sentence(client):
    responses = speak(client, PARAGRAPH, seed=4)
    assert not any(isinstance(r, Exception) for r in responses), responses
    assert [int(r.as_numpy("sentence_index")[0]) for r in responses] == [0, 1, 2]
    assert b"two hours" in responses[1].as_numpy("sentence")[0]
    for r in responses:
        audio, rate = r.as_numpy("audio"), int(r.as_numpy("sample_rate")[0])
        ends, starts = r.as_numpy("phoneme_ends"), r.as_numpy("phoneme_starts")
        phonemes = [p.decode() for p in r.as_numpy("phonemes")]
        assert rate == 22050 and audio.dtype == np.float32 and audio.size > rate // 2
        assert np.isfinite(audio).all() and np.abs(audio).max() <= 1.0
        assert len(phonemes) == len(starts) == len(ends) and phonemes[0] == "^"
        assert abs(ends[-1] * rate - audio.size) < 256, "timings must cover the audio"


def test_same_seed_same_audio(client):
    a = speak(client, "Reproducible, please.", seed=11)[0].as_numpy("audio")
    b = speak(client, "Reproducible, please.", seed=11)[0].as_numpy("audio")
    assert np.array_equal(a, b)


@pytest.mark.parametrize(
    ("text", "controls", "message"),
    [
        ("", {}, "text is empty"),
        ("?!...", {}, "only punctuation"),
        ("😀😀", {}, "no speakable characters"),
        (b"\xff\xfe", {}, "not valid UTF-8"),
        ("x" * 50_000, {}, "at most 20000"),
        ("Hello.", {"length_scale": 9.0}, "length_scale"),
        ("Hello.", {"noise_scale": -1.0}, "noise_scale"),
    ],
)
def test_bad_requests_get_clear_errors(client, text, controls, message):
    (error,) = speak(client, text, **controls)
    assert isinstance(error, Exception) and message in str(error), error
    assert speak(client, "Still serving.")[0].as_numpy("audio").size > 0


def test_vits_batch_of_four_equals_one_at_a_time(client, embedded_repository):
    """Padding and batching change nothing but rounding: lengths and durations exactly, the
    audio within 1e-3 on FP32; the INT8 Q/DQ graph (served on the CPU while its gate passes)
    rounds the decoder's output a step apart in a batch (measured max 0.0155)."""
    import tritonclient.grpc as grpcclient

    from avatar.tts import Controls, Phonemizer, packaged_voice, prepare
    from avatar.tts.synth import batch_inputs
    from model_configs.pbtxt import parse_config

    config = packaged_voice().config
    phonemizer = Phonemizer(config)
    texts = ["One.", "Two words here.", "A somewhat longer third sentence.", "Four, five?"]
    ids = [prepare(t, phonemizer).chunks[0].ids for t in texts]
    controls = [Controls.defaults(config, seed=30 + k) for k in range(4)]

    def run(feeds):
        inputs = []
        for name, value in feeds.items():
            kind = "INT64" if value.dtype == np.int64 else "FP32"
            tensor = grpcclient.InferInput(name, list(value.shape), kind)
            tensor.set_data_from_numpy(value)
            inputs.append(tensor)
        result = client.infer("tts_vits", inputs)
        return {n: result.as_numpy(n) for n in ("audio", "audio_lengths", "durations")}

    served = parse_config(embedded_repository / "tts_vits" / "config.pbtxt")
    atol = 0.02 if "int8" in served.parameters["onnx_file"].string_value else 1e-3
    together = run(batch_inputs(ids, controls, pad_to=64))
    for k in range(4):
        alone = run(batch_inputs([ids[k]], [controls[k]]))
        n = int(alone["audio_lengths"][0, 0])
        assert int(together["audio_lengths"][k, 0]) == n
        durations = alone["durations"][0]
        np.testing.assert_array_equal(together["durations"][k, : durations.size], durations)
        np.testing.assert_allclose(together["audio"][k, :n], alone["audio"][0, :n], atol=atol)
