"""Bad requests to every public model on the real embedded tritonserver, over gRPC streams.

Each case must be refused with an error whose message names the problem (wrong dtype, rank
or shape, empty, oversize, NaN/Inf audio, invalid UTF-8, invalid JSON, bad session ids,
out-of-range controls); the server must stay up and a valid request to the same model
right after must succeed. Triton checks dtypes and shapes against the config before a
model runs; everything else is the models' own validation (avatar.pipeline.request,
avatar.tts.request, avatar.asr.transcribe, avatar.llm, avatar.triton.bls.input_text).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from grpc_calls import call, strings

pytestmark = pytest.mark.server

BAD_UTF8 = b"caf\xc3 \xff\xfe"
HI = [{"role": "user", "content": "Hi"}]


def _audio(seconds: float, fill: float = 0.0, batch: bool = False) -> np.ndarray:
    audio = np.full(round(seconds * 16000), fill, np.float32)
    return audio[None] if batch else audio


def _vad(rows: int = 1, chunk: int = 512, fill: float = 0.0, dtype=np.float32) -> dict:
    return {
        "chunk": np.full((rows, chunk), fill, dtype),
        "context": np.zeros((rows, 64), dtype),
        "state": np.zeros((rows, 2, 128), dtype),
    }


def _turn(text: str | bytes = "Hi", **inputs) -> dict:
    return {"text": strings(text), **inputs}


def _controls(**values) -> dict:
    return _turn(controls=strings(json.dumps(values)))


def _llm(messages=HI, **inputs) -> dict:
    raw = messages if isinstance(messages, str | bytes) else json.dumps(messages)
    return {"messages": strings(raw), **inputs}


def _sampling(raw: str) -> dict:
    return _llm(sampling=strings(raw))


# (model, inputs, words that the lower-cased error message must contain)
CASES = {
    # ---- avatar (decoupled BLS): dtype/shape by Triton, the rest by avatar.pipeline.request
    "avatar-text-fp32": ("avatar", {"text": np.array([1.0], np.float32)}, ["'text'", "bytes"]),
    "avatar-audio-rank2": ("avatar", {"audio": _audio(0.1, batch=True)}, ["'audio'", "shape"]),
    "avatar-two-texts": ("avatar", {"text": strings("a", "b")}, ["'text'", "shape"]),
    "avatar-no-input": ("avatar", {}, ["exactly one of", "audio", "text"]),
    "avatar-audio-and-text": ("avatar", _turn(audio=_audio(0.1)), ["exactly one of"]),
    "avatar-audio-empty": ("avatar", {"audio": _audio(0)}, ["audio is empty"]),
    "avatar-audio-nan": ("avatar", {"audio": _audio(0.1, np.nan)}, ["nan"]),
    "avatar-audio-inf": ("avatar", {"audio": _audio(0.1, np.inf)}, ["infinite"]),
    "avatar-audio-too-long": ("avatar", {"audio": _audio(61)}, ["61.0 s", "at most 60 s"]),
    "avatar-text-empty": ("avatar", _turn("   "), ["text is empty"]),
    "avatar-text-too-long": ("avatar", _turn("a" * 2001), ["2001 characters", "at most 2000"]),
    "avatar-text-utf8": ("avatar", _turn(BAD_UTF8), ["'text'", "not valid utf-8"]),
    "avatar-controls-utf8": ("avatar", _turn(controls=strings(BAD_UTF8)), ["controls", "utf-8"]),
    "avatar-controls-json": ("avatar", _turn(controls=strings("{fps: 30")), ["not valid json"]),
    "avatar-controls-list": ("avatar", _turn(controls=strings("[30]")), ["json object"]),
    "avatar-controls-unknown": ("avatar", _controls(speed=2), ["unknown controls", "speed"]),
    "avatar-intensity": ("avatar", _controls(emotion="happy", intensity=5), ["intensity", "0..1"]),
    "avatar-fps": ("avatar", _controls(fps=1000), ["fps=1000", "out of range"]),
    "avatar-alpha": ("avatar", _controls(alpha=2), ["alpha"]),
    "avatar-fps-type": ("avatar", _controls(fps="fast"), ["fps", "not a number"]),
    "avatar-emotion": ("avatar", _controls(emotion="furious"), ["unknown emotion", "furious"]),
    "avatar-max-tokens": ("avatar", _controls(max_tokens=10_000), ["max_tokens", "out of range"]),
    "avatar-seed": ("avatar", _controls(seed=-1), ["seed=-1", "out of range"]),
    "avatar-render": ("avatar", _controls(render="yes"), ["render", "not true or false"]),
    "avatar-persona": ("avatar", _controls(persona="x" * 5000), ["persona", "5000 characters"]),
    "avatar-session-long": (
        "avatar",
        _turn(session_id=strings("s" * 1000)),
        ["session_id", "at most 128"],
    ),
    "avatar-session-utf8": ("avatar", _turn(session_id=strings(BAD_UTF8)), ["session_id", "utf-8"]),
    "avatar-session-control": (
        "avatar",
        _turn(session_id=strings("a\x00b")),
        ["session_id", "printable"],
    ),
    # ---- tts (decoupled BLS): avatar.tts.request / normalize / synth.Controls
    "tts-text-utf8": ("tts", {"text": strings(BAD_UTF8)}, ["not valid utf-8", "0xc3"]),
    "tts-text-empty": ("tts", {"text": strings("")}, ["text is empty"]),
    "tts-text-oversize": ("tts", {"text": strings("a " * 10_001)}, ["20002 characters", "20000"]),
    "tts-punctuation": ("tts", {"text": strings("?! ...")}, ["punctuation"]),
    "tts-two-texts": ("tts", {"text": strings("a", "b")}, ["'text'", "shape"]),
    "tts-speed-int32": (
        "tts",
        {"text": strings("Hi."), "length_scale": np.array([1], np.int32)},
        ["length_scale", "int32", "fp32"],
    ),
    "tts-speed-range": (
        "tts",
        {"text": strings("Hi."), "length_scale": np.array([10], np.float32)},
        ["length_scale=10", "[0.25, 4.0]"],
    ),
    "tts-noise-nan": (
        "tts",
        {"text": strings("Hi."), "noise_scale": np.array([np.nan], np.float32)},
        ["noise_scale=nan"],
    ),
    "tts-seed": ("tts", {"text": strings("Hi."), "seed": np.array([-5], np.int64)}, ["seed=-5"]),
    # ---- asr (batched BLS, inputs [batch, samples]): avatar.asr.transcribe.check_audio
    "asr-audio-nan": ("asr", {"audio": _audio(0.5, np.nan, batch=True)}, ["nan or inf"]),
    "asr-audio-empty": ("asr", {"audio": _audio(0, batch=True)}, ["audio is empty"]),
    "asr-audio-too-long": ("asr", {"audio": _audio(301, batch=True)}, ["301.0 s", "at most 300"]),
    "asr-audio-fp64": (
        "asr",
        {"audio": _audio(0.5, batch=True).astype(np.float64)},
        ["'audio'", "fp64", "fp32"],
    ),
    "asr-audio-rank3": ("asr", {"audio": _audio(0.5, batch=True)[None]}, ["'audio'", "shape"]),
    "asr-batch-9": ("asr", {"audio": np.zeros((9, 800), np.float32)}, ["batch-size", "8"]),
    "asr-rate": (
        "asr",
        {"audio": _audio(0.5, batch=True), "sample_rate": np.array([[12345]], np.int32)},
        ["12345 hz", "not supported"],
    ),
    "asr-language": (
        "asr",
        {"audio": _audio(0.5, batch=True), "language": np.array([[b"xx"]], object)},
        ["unknown language 'xx'"],
    ),
    "asr-language-utf8": (
        "asr",
        {"audio": _audio(0.5, batch=True), "language": np.array([[BAD_UTF8]], object)},
        ["'language'", "utf-8"],
    ),
    "asr-segmentation": (
        "asr",
        {"audio": _audio(0.5, batch=True), "segmentation": np.array([[b"magic"]], object)},
        ["segmentation 'magic'", "windows"],
    ),
    # ---- llm (decoupled BLS): avatar.llm.engine / template / sampling
    "llm-messages-utf8": ("llm", _llm(BAD_UTF8), ["'messages'", "utf-8"]),
    "llm-messages-json": ("llm", _llm("not json"), ["messages is not valid json"]),
    "llm-messages-empty": ("llm", _llm([]), ["non-empty"]),
    "llm-role": ("llm", _llm([{"role": "robot", "content": "hi"}]), ["robot", "unknown"]),
    "llm-last-not-user": (
        "llm",
        _llm([{"role": "assistant", "content": "hi"}]),
        ["last message", "user"],
    ),
    "llm-messages-oversize": (
        "llm",
        _llm([{"role": "user", "content": "x" * 20_000}]),
        ["20000 characters", "at most"],
    ),
    "llm-messages-fp32": ("llm", {"messages": np.array([1.0], np.float32)}, ["messages", "bytes"]),
    "llm-temperature": ("llm", _sampling('{"temperature": 100}'), ["temperature", "[0, 5]"]),
    "llm-top-p-nan": ("llm", _sampling('{"top_p": NaN}'), ["top_p", "nan"]),
    "llm-max-tokens": ("llm", _sampling('{"max_tokens": 0}'), ["max_tokens", "[1,"]),
    "llm-sampling-json": ("llm", _sampling("{temperature"), ["sampling is not valid json"]),
    "llm-sampling-list": ("llm", _sampling("[0.7]"), ["sampling must be a json object"]),
    "llm-sampling-unknown": ("llm", _sampling('{"beam": 4}'), ["unknown sampling keys", "beam"]),
    "llm-session-long": ("llm", _llm(session_id=strings("s" * 1000)), ["session_id", "128"]),
    # ---- avatar_say ensemble (avatar_speech -> avatar_animate)
    "say-text-utf8": ("avatar_say", {"text": strings(BAD_UTF8)}, ["'text'", "utf-8"]),
    "say-text-empty": ("avatar_say", {"text": strings(" ")}, ["text is empty"]),
    "say-text-oversize": ("avatar_say", {"text": strings("a " * 15_000)}, ["30000 characters"]),
    "say-text-fp32": ("avatar_say", {"text": np.array([1.0], np.float32)}, ["'text'", "bytes"]),
    # ---- vad (ONNX, batched): dtype, shape and batch are Triton's checks in both runtimes;
    # the NaN check is the embedded runner's only (natively ONNX Runtime and TensorRT do
    # not look at values: a NaN chunk gives a NaN probability, see vad/config.pbtxt)
    "vad-chunk-shape": ("vad", _vad(chunk=256), ["'chunk'", "shape", "[1,256]"]),
    "vad-batch-65": ("vad", _vad(rows=65), ["batch-size", "64"]),
    "vad-chunk-nan": ("vad", _vad(fill=np.nan), ["'chunk'", "nan"]),
    "vad-fp64": ("vad", _vad(dtype=np.float64), ["fp64", "fp32"]),
    "vad-missing-state": ("vad", {"chunk": np.zeros((1, 512), np.float32)}, ["missing", "state"]),
}

# A cheap valid request per model, sent right after each bad one.
VALID = {
    "avatar": _turn("Hi", controls=strings('{"max_tokens": 2}')),
    "tts": {"text": strings("Hi.")},
    "asr": {"audio": _audio(0.5, 0.001, batch=True)},
    "llm": _llm(sampling=strings('{"max_tokens": 2}')),
    "avatar_say": {"text": strings("Hi.")},
    "vad": _vad(),
}


BLS_MODELS = {"avatar", "tts", "asr", "llm", "avatar_say"}  # python models and ensembles
NATIVE_MODELS = (
    "asr_encoder", "asr_decoder", "llm_decoder", "tts_vits", "renderer", "portrait_renderer",
    "vad", "lipsync", "emotion_encoder",
)  # fmt: skip


@pytest.fixture(scope="module")
def url(triton_server) -> str:
    return triton_server.grpc_url


def test_at_least_thirty_cases_across_every_public_model():
    models = {model for model, _, _ in CASES.values()}
    assert len(CASES) >= 30 and models == set(VALID), models


@pytest.mark.parametrize("case", list(CASES))
def test_bad_request_is_refused_with_a_clear_message(triton_server, url, case):
    model, inputs, words = CASES[case]
    reply = call(url, model, inputs, timeout_s=60)
    assert reply.error is not None, f"{case}: accepted ({len(reply.responses)} responses)"
    message = reply.error.lower()
    missing = [w for w in words if w not in message]
    assert not missing, f"{case}: {missing} not in {reply.error!r}"
    assert "internal error" not in message and "traceback" not in message, reply.error
    if model in BLS_MODELS:
        # refused by a python model (the one called, or an ensemble's python step), never
        # by a native callee: so it holds in production too, where the native models are
        # TensorRT / ONNX Runtime and check dtypes and shapes only
        native = [m for m in NATIVE_MODELS if f"stage failed: {m}:" in message]
        assert not native, f"{case}: native {native} refused it: {reply.error!r}"
    assert reply.seconds < 10, f"{case}: refused only after {reply.seconds:.1f} s"

    assert triton_server.is_running()
    valid = call(url, model, VALID[model], timeout_s=120)
    assert valid.error is None and valid.responses, f"{model} after {case}: {valid.error}"
    if model == "avatar":
        final = valid.responses[-1]
        assert final["kind"].reshape(-1)[0] == b"final", final
        assert json.loads(final["error"].reshape(-1)[0]) == [], final["error"]


def test_unknown_session_starts_a_new_conversation(url):
    """Not an error: an id the server has never seen (or has evicted) starts afresh."""
    reply = call(url, "llm", _llm(session_id=strings("never-seen-before-7f3a")), timeout_s=120)
    assert reply.error is None
    finish = reply.responses[-1]["finish_reason"].reshape(-1)[0]
    assert finish in (b"stop", b"length"), finish
