"""The asr BLS model on the embedded tritonserver: transcripts equal faster-whisper's,
concurrent requests are answered, bad requests get clear per-request errors."""

from __future__ import annotations

import concurrent.futures
import time

import numpy as np
import pytest

from evals.clips import Clip, clips
from evals.reference_asr import reference_transcripts as _reference_transcripts
from export.asr.weights import packaged_ct2_dir
from export.common import cache_root

pytestmark = pytest.mark.server


def reference_transcripts(items: list[Clip]) -> list[str]:
    """faster-whisper's transcripts of `items` by the packaged Whisper base (the ASR export's
    reference, cached under the artifact cache)."""
    return _reference_transcripts(items, packaged_ct2_dir(), cache_root())


@pytest.fixture(scope="module")
def grpc_url(triton_server) -> str:
    return triton_server.grpc_url


END = "end_probability"


def _infer(
    url: str,
    audio: np.ndarray,
    rate: int | None = None,
    language: str | None = None,
    segmentation: str | None = None,
    *,
    prefix: list[int] | None = None,
    names: tuple[str, ...] = ("text", "detected_language", "segment_times", "segment_texts"),
):
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url)
    inputs = [grpcclient.InferInput("audio", [1, audio.size], "FP32")]
    inputs[0].set_data_from_numpy(audio.reshape(1, -1))
    if rate is not None:
        inputs.append(grpcclient.InferInput("sample_rate", [1, 1], "INT32"))
        inputs[-1].set_data_from_numpy(np.array([[rate]], np.int32))
    if language is not None:
        inputs.append(grpcclient.InferInput("language", [1, 1], "BYTES"))
        inputs[-1].set_data_from_numpy(np.array([[language.encode()]], np.object_))
    if segmentation is not None:
        inputs.append(grpcclient.InferInput("segmentation", [1, 1], "BYTES"))
        inputs[-1].set_data_from_numpy(np.array([[segmentation.encode()]], np.object_))
    if prefix is not None:
        inputs.append(grpcclient.InferInput("prefix", [1, len(prefix)], "INT32"))
        inputs[-1].set_data_from_numpy(np.array([prefix], np.int32))
    result = client.infer(
        "asr", inputs, outputs=[grpcclient.InferRequestedOutput(n) for n in names]
    )
    return {n: result.as_numpy(n) for n in names}


def test_concurrent_transcripts_equal_faster_whisper(grpc_url):
    items = clips(6)
    references = reference_transcripts(items)
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        results = list(pool.map(lambda c: _infer(grpc_url, c.audio), items))
    for clip, reference, result in zip(items, references, results, strict=True):
        assert result["text"][0, 0].decode() == reference
        assert result["detected_language"][0, 0] == b"en"
        times = result["segment_times"][0]
        assert times.shape[1] == 2 and 0 <= times[0, 0] < times[-1, 1] <= clip.seconds + 0.5
        assert b" ".join(result["segment_texts"][0]).decode() in reference


def test_forced_language_and_resampled_input(grpc_url):
    from scipy.signal import resample_poly

    clip = clips(1)[0]
    audio_48k = resample_poly(clip.audio, 3, 1).astype(np.float32)
    result = _infer(grpc_url, audio_48k, rate=48000, language="en")
    assert "how are you" in result["text"][0, 0].decode().lower()


def test_silence_is_an_empty_transcript(grpc_url):
    result = _infer(grpc_url, np.zeros(16000, np.float32), names=("text", "segment_times", END))
    assert result["text"][0, 0] == b"" and result["segment_times"].shape == (1, 0, 2)
    assert np.isnan(result[END]).all()  # no word: no end mark to weigh


def test_the_end_mark_after_a_head_is_unlikely_and_after_a_question_likely(grpc_url):
    """The served `end_probability` (Whisper's end mark right after the last word, read by
    the gateway's end of turn): low after "Can you tell me" although Whisper writes a
    question mark there, high after the whole question."""
    from evals import turn_taking

    question = turn_taking.questions()[0]  # "Can you tell me" | "where the nearest ..."
    audio, at = turn_taking.hesitating(turn_taking.VOICES[0], question.head, question.rest, 0.5)
    silence = np.zeros(8000, np.float32)
    head, whole = (
        _infer(grpc_url, np.concatenate([part, silence]), language="en", names=("text", END))
        for part in (audio[:at], audio)
    )
    assert head["text"][0, 0].decode().rstrip("?.") == question.head, head
    assert head[END].shape == (1, 1) and head[END][0, 0] < 0.5 < whole[END][0, 0], (head, whole)


@pytest.mark.parametrize(
    ("audio", "rate", "language", "message"),
    [
        (np.zeros(0, np.float32), None, None, "audio is empty"),
        (np.array([0.0, np.nan], np.float32), None, None, "NaN or Inf"),
        (np.zeros(16000 * 600, np.float32), None, None, "at most 300 s"),
        (np.zeros(16000, np.float32), 7000, None, "7000 Hz is not supported"),
        (np.zeros(16000, np.float32), None, "xx", "unknown language 'xx'"),
    ],
)
def test_bad_requests_get_clear_errors(grpc_url, audio, rate, language, message):
    from tritonclient.utils import InferenceServerException

    with pytest.raises(InferenceServerException, match=message):
        _infer(grpc_url, audio, rate, language)
    with pytest.raises(InferenceServerException, match="segmentation 'beam'"):
        _infer(grpc_url, np.zeros(1600, np.float32), segmentation="beam")
    assert _infer(grpc_url, clips(1)[0].audio)["text"][0, 0]  # the model keeps serving


def test_a_prefix_from_an_earlier_pass_gives_the_same_transcript(grpc_url):
    """A live caller's passes: the tokens of one transcript, sent back as the next one's
    prefix (its last word is dropped by the model), give the same transcript; a prefix that
    is not Whisper's tokens, or with audio of more than one window, is refused saying why."""
    from tritonclient.utils import InferenceServerException

    clip = clips()[1]
    names = ("text", "tokens")
    first = _infer(grpc_url, clip.audio, names=names)
    tokens = [int(t) for t in first["tokens"].reshape(-1)]
    assert len(tokens) > 6 and tokens[0] >= 50364  # it begins with a timestamp
    again = _infer(grpc_url, clip.audio, prefix=tokens[: len(tokens) // 2], names=names)
    assert again["text"][0, 0] == first["text"][0, 0]
    assert [int(t) for t in again["tokens"].reshape(-1)] == tokens
    for prefix, audio, message in [
        ([50258, 50359], clip.audio, "not text or timestamp tokens"),
        ([1012, 50364], clip.audio, "begin with a timestamp"),
        ([50364] * 113, clip.audio, "at most 112"),
        (tokens[:4], np.zeros(16000 * 31, np.float32), "one window"),
    ]:
        with pytest.raises(InferenceServerException, match=message):
            _infer(grpc_url, audio, prefix=prefix, names=names)
    assert _infer(grpc_url, clip.audio, names=names)["text"][0, 0] == first["text"][0, 0]


# CI: windows cut in test_asr_core.py, served in test_asr_decoder_keeps_each_windows_caches
@pytest.mark.extended
def test_long_audio_windows_and_vad(grpc_url):
    from evals.clips import long_clip
    from evals.wer import wer

    clip = long_clip(clips()[:12])
    reference = reference_transcripts([clip])[0]
    windows = _infer(grpc_url, clip.audio)
    text = windows["text"][0, 0].decode()
    # judged by WER against what was said (the last window is no longer 30 s, so words may
    # differ from faster-whisper's), and never truncated
    assert wer(clip.text, text) <= wer(clip.text, reference) + 0.02
    assert len(text.split()) >= 0.95 * len(reference.split())
    vad = _infer(grpc_url, clip.audio, segmentation="vad")
    assert wer(reference, vad["text"][0, 0].decode()) < 0.1
    for result in (windows, vad):
        times = result["segment_times"][0]
        assert times[-1, 1] > 30 and np.all(np.diff(times[:, 0]) >= 0)


# ------------------------------------------- asr_decoder: each window's caches stay inside


def _decoder_step(url: str, sequence_id: int, tokens: list[int], encoder_kv=None, **flags):
    """One step of a window's sequence on `asr_decoder`: (logits [51865], error)."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    kv = np.zeros((1, 12, 8, 0, 64), np.float32) if encoder_kv is None else encoder_kv[None]
    arrays = {"tokens": np.asarray([tokens], np.int64), "encoder_kv": kv}
    tensors = []
    for name, value in arrays.items():
        tensor = grpcclient.InferInput(
            name, list(value.shape), "INT64" if name == "tokens" else "FP32"
        )
        tensor.set_data_from_numpy(value)
        tensors.append(tensor)
    client = grpcclient.InferenceServerClient(url)
    try:
        result = client.infer(
            "asr_decoder",
            tensors,
            sequence_id=sequence_id,
            sequence_start=flags.get("start", False),
            sequence_end=flags.get("end", False),
        )
        return result.as_numpy("logits")[0], None
    except InferenceServerException as error:
        return None, str(error)
    finally:
        client.close()


def test_asr_decoder_keeps_each_windows_caches(grpc_url):
    """Two interleaved windows stepped with token ids only (the encoder's K/V sent once)
    give the greedy tokens of the in-process step with both caches passed every time."""
    from avatar.asr.features import log_mel, pad_or_trim
    from avatar.asr.onnx_runtime import DECODER_STEP_FILE, OnnxWhisperRuntime
    from export.registry import ensure_all

    art = ensure_all(["asr_encoder", "asr_decoder"])
    runtime = OnnxWhisperRuntime(
        art["asr_encoder"] / "model.onnx", art["asr_decoder"] / DECODER_STEP_FILE
    )
    windows = {
        8001: clips(2)[0].audio,
        8002: clips(2)[1].audio,
    }
    prompt = [50258, 50259, 50359]  # <|sot|><|en|><|transcribe|>
    expected, kvs = {}, {}
    for k, audio in windows.items():
        kvs[k] = runtime.encode(pad_or_trim(log_mel(audio), 600)[None])
        self_kv = np.zeros((1, 12, 8, 0, 64), np.float32)
        logits, self_kv = runtime.decode(np.array([prompt]), self_kv, kvs[k])
        tokens = [int(logits.argmax())]
        for _ in range(4):
            logits, self_kv = runtime.decode(np.array([tokens[-1:]]), self_kv, kvs[k])
            tokens.append(int(logits.argmax()))
        expected[k] = tokens
    got = {k: [] for k in windows}
    for k in windows:
        logits, error = _decoder_step(grpc_url, k, prompt[:1], kvs[k][0], start=True)
        assert error is None, error
        logits, error = _decoder_step(grpc_url, k, prompt[1:])
        assert error is None, error
        got[k].append(int(logits.argmax()))
    for n in range(4):
        for k in windows:  # interleaved: the states must stay apart
            logits, error = _decoder_step(grpc_url, k, got[k][-1:], end=n == 3)
            assert error is None, error
            got[k].append(int(logits.argmax()))
    assert got == expected


def test_asr_decoder_bad_steps_are_clear_errors(grpc_url):
    kv = np.zeros((12, 8, 30, 64), np.float32)
    _, error = _decoder_step(grpc_url, 8101, [50258])
    assert error and "must specify the START flag" in error
    _, error = _decoder_step(grpc_url, 8102, [50258], start=True)
    assert error and "the START step carries the window's encoder_kv" in error
    _, error = _decoder_step(grpc_url, 8103, [50258], kv, start=True)
    assert error is None
    _, error = _decoder_step(grpc_url, 8103, [50259], kv)
    assert error and "sent once, on the START step" in error
    _, error = _decoder_step(grpc_url, 8103, [99999])
    assert error and "token ids must be in [0, 51865)" in error
    logits, error = _decoder_step(grpc_url, 8103, [50259], end=True)  # it survived
    assert error is None and np.isfinite(logits).all()


# CI: a served turn cancelled in test_cancel.py, a given-up row in test_asr_prefix.py
@pytest.mark.extended
def test_a_cancelled_transcription_stops_decoding(grpc_url):
    """A client that cancels an `asr` request (the gateway's passes while the user speaks,
    once a pause's pass starts) gets CANCELLED, the model stops stepping `asr_decoder` for
    it within a step or two, and goes on serving."""
    import tritonclient.grpc as grpcclient
    from grpc_calls import execution_counts
    from test_cancel import settle

    from evals.clips import long_clip

    audio = long_clip(clips()[:6]).audio[None]  # ~16 s: ~100 decoder steps
    client = grpcclient.InferenceServerClient(grpc_url)
    inputs = [grpcclient.InferInput("audio", list(audio.shape), "FP32")]
    inputs[0].set_data_from_numpy(audio)
    outputs = [grpcclient.InferRequestedOutput("text")]

    def steps_of(cancel: bool) -> tuple[int, object]:
        before, _ = settle(grpc_url, ["asr_decoder"], quiet_s=1.0)
        done: list = []
        call = client.async_infer(
            "asr", inputs, lambda result, error: done.append((result, error)), outputs=outputs
        )
        if cancel:  # once the decoder has taken a few steps
            deadline = time.monotonic() + 60
            while execution_counts(grpc_url, ["asr_decoder"])["asr_decoder"] < (
                before["asr_decoder"] + 5
            ):
                assert time.monotonic() < deadline and not done
                time.sleep(0.01)
            call.cancel()
        deadline = time.monotonic() + 120
        while not done and time.monotonic() < deadline:
            time.sleep(0.05)
        assert done, "no answer in 120 s"
        after, _ = settle(grpc_url, ["asr_decoder"], quiet_s=1.0)
        return after["asr_decoder"] - before["asr_decoder"], done[0]

    full, (result, error) = steps_of(cancel=False)
    assert error is None and len(result.as_numpy("text")[0, 0].decode().split()) > 30
    stopped, (result, error) = steps_of(cancel=True)
    assert result is None and "CANCELLED" in str(error).upper()
    assert stopped < full / 3, (stopped, full)
    assert _infer(grpc_url, clips(1)[0].audio)["text"][0, 0].decode().strip()  # still serving


def test_captions_wait_behind_level_one_and_each_pass_kind_is_counted(triton_server):
    """The gateway's passes carry a priority level (captions 2, the others 1: the asr
    config's priority_levels) and their kind as the request parameter "pass"; the model
    counts its execution time per kind on /metrics (python -m perf turn-cost reads it). A
    level the model does not have is served at its default level. Its transcriptions in
    flight are a gauge too, back at 0 once they are answered (a server's stop waits for it)."""
    import urllib.request

    import tritonclient.grpc as grpcclient

    from avatar.pipeline.priority import CAPTIONS, FIRST_AUDIO
    from gateway.metrics import parse

    in_flight = 'avatar_active{model="asr",what="requests"}'  # what a stop drains

    def counted() -> dict[str, float]:
        with urllib.request.urlopen(triton_server.metrics_url, timeout=10) as response:
            values = parse(response.read().decode())
        return {
            kind: values.get(f'avatar_asr_passes_total{{model="asr",pass="{kind}"}}', 0.0)
            for kind in ("caption", "pause", "final")
        } | {"in flight": values.get(in_flight, -1.0)}

    audio = clips(1)[0].audio.reshape(1, -1)
    client = grpcclient.InferenceServerClient(triton_server.grpc_url)
    inputs = [grpcclient.InferInput("audio", list(audio.shape), "FP32")]
    inputs[0].set_data_from_numpy(audio)
    before = counted()
    texts = []
    for kind, priority in (("caption", CAPTIONS), ("pause", FIRST_AUDIO), ("final", 7)):
        result = client.infer("asr", inputs, priority=priority, parameters={"pass": kind})
        texts.append(result.as_numpy("text")[0, 0].decode().strip())
    after = counted()
    assert len(set(texts)) == 1 and texts[0]
    assert after.pop("in flight") == 0.0, f"{in_flight} is not reported, or not back to 0"
    before.pop("in flight")
    assert {k: after[k] - before[k] for k in after} == {"caption": 1, "pause": 1, "final": 1}
