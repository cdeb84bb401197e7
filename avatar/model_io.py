"""The calls between the models, defined once per model (Triton-free): each model's inputs
and outputs as its config.pbtxt declares them (name, Triton dtype, dims without the batch
axis, optional) and how each value travels. The BLS models, the clients, perf and the
tests build and read a model's tensors here and nowhere else; tests/test_model_io.py checks
every definition against its config, as tests/test_turn_schema.py checks the `avatar`
turn (avatar/pipeline/schema.py, which shares `TensorSpec`).

Value kinds: TEXT is one UTF-8 string in a BYTES [1] tensor; JSON is a structured value
serialised there as JSON (here and nowhere else); SCALAR is one number (or bool) in a [1]
tensor; ARRAY is a numeric tensor of the declared dims (-1: any length); STRINGS is a list
of UTF-8 strings in a BYTES [-1] tensor. A batched model's request of several rows (frames,
sentences, a VAD session per row) is `rows`/`read_rows`: numeric arrays, the batch axis first.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

TEXT, JSON, SCALAR, ARRAY, STRINGS = "text", "json", "scalar", "array", "strings"
NUMPY = {
    "FP32": np.float32,
    "INT32": np.int32,
    "INT64": np.int64,
    "UINT8": np.uint8,
    "BOOL": np.bool_,
    "BYTES": np.object_,
}


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """One input or output of a model, as config.pbtxt declares it (Triton's dtype names:
    BYTES is TYPE_STRING there; dims without the batch axis)."""

    name: str
    dtype: str
    dims: tuple[int, ...]
    optional: bool = False

    def encode(self, value: Any, kind: str) -> np.ndarray:
        """A value of `kind` as this tensor; ValueError when its shape does not fit."""
        if kind == JSON:
            value = json.dumps(value)
        if kind in (TEXT, JSON):
            return np.array([str(value).encode("utf-8")], dtype=object)
        if kind == STRINGS:
            return np.array([str(v).encode("utf-8") for v in value], dtype=object)
        if kind == SCALAR:
            return np.array([value], NUMPY[self.dtype])
        array = np.ascontiguousarray(value, NUMPY[self.dtype])
        if array.ndim != len(self.dims) or any(
            want not in (-1, have) for have, want in zip(array.shape, self.dims, strict=True)
        ):
            raise ValueError(f"{self.name}: shape {array.shape} does not fit dims {self.dims}")
        return array

    def rows(self, value: Any) -> np.ndarray:
        """Rows of this tensor with the batch axis first (a batched model's request of several
        rows); ValueError when a row's shape does not fit, or for text (request() encodes it)."""
        if self.dtype == "BYTES":
            raise ValueError(f"{self.name}: rows are numeric; text travels in request()")
        array = np.ascontiguousarray(value, NUMPY[self.dtype])
        if array.ndim != len(self.dims) + 1 or any(
            want not in (-1, have) for have, want in zip(array.shape[1:], self.dims, strict=True)
        ):
            raise ValueError(
                f"{self.name}: shape {array.shape} is not rows of dims {self.dims} "
                "(the batch axis first)"
            )
        return array

    def decode(self, array: np.ndarray, kind: str) -> Any:
        """This tensor as a value of `kind` (the inverse of `encode`); ValueError when a
        string is not UTF-8 or a JSON value not JSON."""
        try:
            return self._decode(array, kind)
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise ValueError(f"{self.name}: not {kind} ({error})") from None

    def _decode(self, array: np.ndarray, kind: str) -> Any:
        if kind in (TEXT, JSON):
            value = np.asarray(array).reshape(-1)[0]
            text = value.decode("utf-8") if isinstance(value, bytes) else str(value)
            if kind == JSON:
                return json.loads(text) if text else {}
            return text
        if kind == STRINGS:
            return [
                v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in array.reshape(-1)
            ]
        if kind == SCALAR:
            return np.asarray(array).reshape(-1)[0].item()
        return array


def triton_dtype(dtype: np.dtype) -> str:
    """Triton's name of a numpy dtype (NUMPY's inverse; str and bytes arrays are BYTES)."""
    for name, numpy_type in NUMPY.items():
        if np.dtype(numpy_type) == dtype:
            return name
    if dtype.kind in "OSU":
        return "BYTES"
    raise ValueError(f"no Triton dtype for numpy {dtype}: expected one of {list(NUMPY)}")


def infer_inputs(tensors: Mapping[str, np.ndarray], infer_input: Callable) -> list:
    """The tensors of a request as tritonclient inputs: `infer_input` is
    tritonclient.grpc.InferInput or tritonclient.grpc.aio.InferInput (the core imports no
    client)."""
    inputs = []
    for name, value in tensors.items():
        array = np.ascontiguousarray(value)
        tensor = infer_input(name, list(array.shape), triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


@dataclasses.dataclass(frozen=True)
class Value:
    """A tensor of the model and the kind of value it carries."""

    spec: TensorSpec
    kind: str


def _values(*items: tuple[str, str, tuple[int, ...], str, bool]) -> dict[str, Value]:
    return {n: Value(TensorSpec(n, d, dims, optional), k) for n, d, dims, k, optional in items}


@dataclasses.dataclass(frozen=True)
class ModelIO:
    """One model's call: `request(**values)` -> its input tensors, `read_request(get)` on
    the model's side, `response(**values)` -> its output tensors, `read_response(arrays)`
    on the caller's. `batched`: the config has max_batch_size > 0, so a request's tensors
    carry a batch axis of 1 and a response's rows are read from its first; `rows(**arrays)`
    and `read_rows(arrays)` are a batched model's request and response of several rows."""

    model: str
    inputs: dict[str, Value]
    outputs: dict[str, Value]
    batched: bool = False

    def request(self, **values: Any) -> dict[str, np.ndarray]:
        """The inputs of one request; None leaves an optional input out."""
        return self._encode(self.inputs, values, "input")

    def response(self, **values: Any) -> dict[str, np.ndarray]:
        """The outputs of one response (the model's side); None leaves one out."""
        return self._encode(self.outputs, values, "output")

    def read_request(self, get: Callable[[str], np.ndarray | None]) -> dict[str, Any]:
        """The model's side: each input by name, decoded (None when absent); `get(name)`
        is the request's tensor as numpy, or None."""
        return self._decode(self.inputs, {name: get(name) for name in self.inputs})

    def read_response(self, arrays: Mapping[str, np.ndarray | None]) -> dict[str, Any]:
        """The caller's side: each output present in `arrays`, decoded."""
        return {k: v for k, v in self._decode(self.outputs, arrays).items() if v is not None}

    def rows(self, **arrays: Any) -> dict[str, np.ndarray]:
        """The inputs of one request of several rows (a batched model): each array has the
        batch axis first and the same number of rows; None leaves an optional input out."""
        if not self.batched:
            raise ValueError(f"{self.model}: not a batched model (max_batch_size 0): request()")
        tensors = self._checked(self.inputs, arrays, "input", lambda spec, a: spec.rows(a))
        counts = {name: len(array) for name, array in tensors.items()}
        if len(set(counts.values())) > 1:
            raise ValueError(f"{self.model}: inputs of different row counts {counts}")
        return tensors

    def read_rows(self, arrays: Mapping[str, np.ndarray | None]) -> dict[str, np.ndarray]:
        """The caller's side of `rows`: each output present in `arrays`, its rows checked."""
        return {
            name: value.spec.rows(arrays[name])
            for name, value in self.outputs.items()
            if arrays.get(name) is not None
        }

    def _checked(self, specs: dict[str, Value], values: dict[str, Any], what: str, encode):
        unknown = set(values) - set(specs)
        if unknown:
            raise ValueError(f"{self.model}: no {what} {sorted(unknown)}; it has {list(specs)}")
        tensors = {}
        for name, value in specs.items():
            given = values.get(name)
            if given is None:
                if what == "input" and not value.spec.optional:
                    raise ValueError(f"{self.model}: input {name!r} is required")
                continue
            tensors[name] = encode(value.spec, given)
        return tensors

    def _encode(self, specs: dict[str, Value], values: dict[str, Any], what: str):
        def encode(spec: TensorSpec, given: Any) -> np.ndarray:
            array = spec.encode(given, specs[spec.name].kind)
            return array[None] if self.batched else array

        return self._checked(specs, values, what, encode)

    def _decode(self, specs: dict[str, Value], arrays: Mapping[str, np.ndarray | None]):
        decoded: dict[str, Any] = {}
        for name, value in specs.items():
            array = arrays.get(name)
            if array is None:
                decoded[name] = None
                continue
            array = np.asarray(array)
            if self.batched and array.ndim > len(value.spec.dims):
                array = array[0]
            decoded[name] = value.spec.decode(array, value.kind)
        return decoded


# (name, Triton dtype, dims, kind, optional), in config.pbtxt's order
LLM = ModelIO(
    "llm",
    inputs=_values(
        ("messages", "BYTES", (1,), JSON, True),  # [{"role", "content"}], the last "user"
        ("session_id", "BYTES", (1,), TEXT, True),
        ("parent_session_id", "BYTES", (1,), TEXT, True),
        ("sampling", "BYTES", (1,), JSON, True),  # avatar.llm.sampling.SamplingParams
        ("context", "BYTES", (1,), TEXT, True),
        ("stop", "BOOL", (1,), SCALAR, True),
        ("spoken", "BYTES", (1,), TEXT, True),
    ),
    outputs=_values(
        ("text", "BYTES", (1,), TEXT, False),
        ("sentence", "BYTES", (1,), TEXT, False),
        ("finish_reason", "BYTES", (1,), TEXT, False),
        ("stats", "BYTES", (1,), JSON, False),
    ),
)
TTS = ModelIO(
    "tts",
    inputs=_values(
        ("text", "BYTES", (1,), TEXT, False),
        ("length_scale", "FP32", (1,), SCALAR, True),
        ("noise_scale", "FP32", (1,), SCALAR, True),
        ("noise_w", "FP32", (1,), SCALAR, True),
        ("seed", "INT64", (1,), SCALAR, True),
        ("language", "BYTES", (1,), TEXT, True),
    ),
    outputs=_values(
        ("audio", "FP32", (-1,), ARRAY, False),
        ("sample_rate", "INT32", (1,), SCALAR, False),
        ("sentence", "BYTES", (1,), TEXT, False),
        ("sentence_index", "INT32", (1,), SCALAR, False),
        ("phonemes", "BYTES", (-1,), STRINGS, False),
        ("phoneme_starts", "FP32", (-1,), ARRAY, False),
        ("phoneme_ends", "FP32", (-1,), ARRAY, False),
    ),
)
ASR = ModelIO(
    "asr",
    inputs=_values(
        ("audio", "FP32", (-1,), ARRAY, False),  # 16 kHz mono
        ("sample_rate", "INT32", (1,), SCALAR, True),
        ("language", "BYTES", (1,), TEXT, True),
        ("segmentation", "BYTES", (1,), TEXT, True),
        ("prefix", "INT32", (-1,), ARRAY, True),  # Whisper tokens the pass starts from
    ),
    outputs=_values(
        ("text", "BYTES", (1,), TEXT, False),
        ("detected_language", "BYTES", (1,), TEXT, False),
        ("segment_times", "FP32", (-1, 2), ARRAY, False),
        ("segment_texts", "BYTES", (-1,), STRINGS, False),
        ("tokens", "INT32", (-1,), ARRAY, False),
        # Whisper's probability of an end mark after the last word (NaN: no word), which
        # the gateway's end of turn can read with the words (avatar.end_of_turn.Fusion.words)
        ("end_probability", "FP32", (1,), SCALAR, False),
    ),
    batched=True,
)
AVATAR_SPEECH = ModelIO(
    "avatar_speech",
    inputs=_values(("text", "BYTES", (1,), TEXT, False)),
    outputs=_values(
        ("audio", "FP32", (-1,), ARRAY, False),
        ("sample_rate", "INT32", (1,), SCALAR, False),
        ("duration", "FP32", (1,), SCALAR, False),
        ("phonemes", "BYTES", (-1,), STRINGS, False),
        ("phoneme_starts", "FP32", (-1,), ARRAY, False),
        ("phoneme_ends", "FP32", (-1,), ARRAY, False),
    ),
)
TURN_DETECTOR = ModelIO(
    "turn_detector",
    inputs=_values(("input_features", "FP32", (80, 800), ARRAY, False)),  # end_of_turn.py
    outputs=_values(("probability", "FP32", (1,), SCALAR, False)),
    batched=True,
)
TURN_WORDS = ModelIO(
    "turn_words",
    inputs=_values(("features", "INT64", (10,), ARRAY, False)),  # avatar/turn_words.py
    outputs=_values(("probability", "FP32", (1,), SCALAR, False)),
    batched=True,
)
AVATAR_SAY = ModelIO(
    "avatar_say",
    inputs=_values(("text", "BYTES", (1,), TEXT, False)),
    outputs=_values(
        ("audio", "FP32", (-1,), ARRAY, False),
        ("sample_rate", "INT32", (1,), SCALAR, False),
        ("blendshapes", "FP32", (-1, 52), ARRAY, False),
        ("head_pose", "FP32", (-1, 3), ARRAY, False),
        ("fps", "FP32", (1,), SCALAR, False),
        ("animation", "BYTES", (1,), TEXT, False),  # JSON text, as the client keeps it
    ),
)
VAD = ModelIO(  # the session's recurrent state travels with each chunk (avatar/vad.py)
    "vad",
    inputs=_values(
        ("chunk", "FP32", (512,), ARRAY, False),
        ("context", "FP32", (64,), ARRAY, False),
        ("state", "FP32", (2, 128), ARRAY, False),
    ),
    outputs=_values(
        ("speech_prob", "FP32", (1,), SCALAR, False),
        ("next_context", "FP32", (64,), ARRAY, False),
        ("next_state", "FP32", (2, 128), ARRAY, False),
    ),
    batched=True,
)
LIPSYNC = ModelIO(
    "lipsync",
    inputs=_values(("audio", "FP32", (-1,), ARRAY, False)),  # windows of 16-kHz audio
    outputs=_values(
        ("viseme_probs", "FP32", (-1, 15), ARRAY, False),
        ("mouth_open", "FP32", (-1,), ARRAY, False),
    ),
    batched=True,
)
AVATAR_ANIMATE = ModelIO(  # the second step of avatar_say, after avatar_speech
    "avatar_animate",
    inputs=_values(
        ("phonemes", "BYTES", (-1,), STRINGS, False),
        ("phoneme_starts", "FP32", (-1,), ARRAY, False),
        ("phoneme_ends", "FP32", (-1,), ARRAY, False),
        ("duration", "FP32", (1,), SCALAR, True),
        ("controls", "BYTES", (1,), TEXT, True),  # avatar.pipeline.request.Controls as JSON
    ),
    outputs=_values(
        ("blendshapes", "FP32", (-1, 52), ARRAY, False),
        ("head_pose", "FP32", (-1, 3), ARRAY, False),
        ("fps", "FP32", (1,), SCALAR, False),
        ("animation", "BYTES", (1,), JSON, False),
    ),
)
EMOTION_ENCODER = ModelIO(  # rows of avatar.animation.emotion_classifier.SentenceTokenizer
    "emotion_encoder",
    inputs=_values(
        ("input_ids", "INT64", (-1,), ARRAY, False),
        ("attention_mask", "INT64", (-1,), ARRAY, False),
    ),
    outputs=_values(("embedding", "FP32", (384,), ARRAY, False)),
    batched=True,
)


def _renderer(model: str, size: int) -> ModelIO:
    """A face's renderer: a row per frame, ARKit-52 weights and a head pose -> RGB."""
    return ModelIO(
        model,
        inputs=_values(
            ("blendshapes", "FP32", (52,), ARRAY, False),
            ("head_pose", "FP32", (3,), ARRAY, False),
        ),
        outputs=_values(("frames", "UINT8", (size, size, 3), ARRAY, False)),
        batched=True,
    )


RENDERER = _renderer("renderer", 256)  # the cartoon face
PORTRAIT_RENDERER = _renderer("portrait_renderer", 512)
# The networks the BLS models call (avatar/triton's runners serve them in the embedded
# target): a row per window, sequence step or sentence.
ASR_ENCODER = ModelIO(
    "asr_encoder",
    inputs=_values(("mel", "FP32", (80, -1), ARRAY, False)),  # avatar.asr.features
    outputs=_values(
        ("encoder_hidden_states", "FP32", (-1, 512), ARRAY, False),
        ("cross_kv", "FP32", (12, 8, -1, 64), ARRAY, False),  # [2 x layers, heads, T, Dh]
    ),
    batched=True,
)
ASR_DECODER = ModelIO(  # a sequence: its caches are implicit state (config.pbtxt)
    "asr_decoder",
    inputs=_values(
        ("tokens", "INT64", (-1,), ARRAY, False),
        ("encoder_kv", "FP32", (12, 8, -1, 64), ARRAY, False),  # on START only, else T = 0
    ),
    outputs=_values(("logits", "FP32", (51865,), ARRAY, False)),
    batched=True,
)
LLM_DECODER = ModelIO(  # a sequence: its KV cache is implicit state (config.pbtxt)
    "llm_decoder",
    inputs=_values(
        ("input_ids", "INT64", (-1,), ARRAY, False),
        ("attention_mask", "INT64", (-1,), ARRAY, False),
        ("position_ids", "INT64", (-1,), ARRAY, False),
    ),
    outputs=_values(("logits", "FP32", (-1, 49152), ARRAY, False)),
    batched=True,
)
TTS_VITS = ModelIO(  # a row per sentence (avatar.tts.synth.batch_inputs)
    "tts_vits",
    inputs=_values(
        ("phoneme_ids", "INT64", (-1,), ARRAY, False),
        ("phoneme_lengths", "INT64", (1,), ARRAY, False),
        ("scales", "FP32", (3,), ARRAY, False),  # noise_scale, length_scale, noise_w
        ("noise_phonemes", "FP32", (2, -1), ARRAY, False),
        ("noise_frames", "FP32", (192, -1), ARRAY, False),
    ),
    outputs=_values(
        ("audio", "FP32", (-1,), ARRAY, False),
        ("audio_lengths", "INT64", (1,), ARRAY, False),
        ("durations", "INT64", (-1,), ARRAY, False),
    ),
    batched=True,
)
RENDERERS = {"portrait": PORTRAIT_RENDERER, "cartoon": RENDERER}  # by face
MODELS = {
    io.model: io
    for io in (
        LLM,
        TTS,
        ASR,
        AVATAR_SPEECH,
        AVATAR_SAY,
        AVATAR_ANIMATE,
        TURN_DETECTOR,
        TURN_WORDS,
        VAD,
        LIPSYNC,
        EMOTION_ENCODER,
        RENDERER,
        PORTRAIT_RENDERER,
        ASR_ENCODER,
        ASR_DECODER,
        LLM_DECODER,
        TTS_VITS,
    )
}
