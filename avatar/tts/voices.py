"""Voices chosen by language: the packaged English Piper voice, a Piper voice per language
that the operator gives by path, and espeak-ng's voice as the packaged fallback.

Every voice speaks a request as a list of units (sentences, or parts of long ones), each
synthesised into a `SentenceAudio` with the same phoneme timing contract ('^' first, '$'
last, times covering the audio), so the animation's phonemes -> visemes path is the same
for every language.

The `tts` model's `voices` parameter (JSON) gives the Piper voices:

    {"zh": {"voice": "/voices/zh_CN-huayan-medium.onnx", "model": "tts_vits_zh"}}

`voice`: the Piper `.onnx` (its `.onnx.json` beside it gives the phoneme map, rate and
espeak voice); `model`: the served model that runs that voice's graph as exported by
`python -m export.tts --source <voice>` (the same inputs and outputs as `tts_vits`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from avatar.errors import RequestError
from avatar.tts import mandarin
from avatar.tts.espeak import EspeakVoice
from avatar.tts.normalize import MAX_CHARS
from avatar.tts.phonemes import Chunk, Phonemizer, prepare
from avatar.tts.synth import Controls, InferFn, SentenceAudio, Synthesizer
from avatar.tts.voice import Voice, VoiceConfig

log = logging.getLogger(__name__)

DEFAULT_LANGUAGE = "en"
# ISO 639-1 codes (and the tags that mean them) -> the language's code here
ALIASES: dict[str, str] = {
    "en": "en", "eng": "en", "en-us": "en", "en-gb": "en",
    "zh": "zh", "zho": "zh", "chi": "zh", "cmn": "zh", "zh-cn": "zh", "zh-hans": "zh",
    "zh-sg": "zh", "zh-tw": "zh", "zh-hant": "zh", "zh-hk": "zh",
}  # fmt: skip
# espeak-ng's voice for each language's packaged fallback
FALLBACK_ESPEAK: dict[str, str] = {"zh": "cmn"}


def parse_language(value: bytes | str | None, supported: Sequence[str]) -> str:
    """A request's language tag ("zh", "zh-CN", b"en") -> a supported code; None or ""
    -> the default (English). RequestError names the codes expected."""
    if value is None:
        return DEFAULT_LANGUAGE
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    tag = str(value).strip().lower().replace("_", "-")
    if not tag:
        return DEFAULT_LANGUAGE
    code = ALIASES.get(tag, ALIASES.get(tag.split("-")[0]))
    if code not in supported:
        raise RequestError(
            f"language {str(value)[:20]!r} is not spoken here: expected one of "
            f"{', '.join(supported)} (ISO 639-1)"
        )
    return code


class Speaker(Protocol):
    """One language's voice: a request's text -> units -> audio with phoneme timings."""

    language: str
    description: str
    config: VoiceConfig  # its default controls (length, noise scales)

    def units(self, text: bytes | str, max_chars: int) -> Sequence[object]: ...

    def speak(self, unit: object, controls: Controls) -> SentenceAudio: ...


@dataclasses.dataclass
class PiperSpeaker:
    """A Piper voice through an `infer` callable of its exported graph (a BLS call to a
    served model, or ONNX Runtime). English text is normalised for English; Chinese text
    is checked and cut into sentences for Chinese, and its espeak symbols reported as IPA."""

    language: str
    synth: Synthesizer
    description: str

    @property
    def config(self) -> VoiceConfig:
        return self.synth.config

    def units(self, text: bytes | str, max_chars: int = MAX_CHARS) -> Sequence[Chunk]:
        if self.language != "zh":
            return prepare(text, self.synth.phonemizer, max_chars).chunks
        cleaned = mandarin.clean_zh(text, max_chars)
        chunks = [
            c
            for sentence in mandarin.split_zh(cleaned.text)
            for c in self.synth.phonemizer.chunk_sentence(sentence)
        ]
        if not chunks:
            raise RequestError(f"text {cleaned.text[:40]!r} gives no phonemes to speak")
        return chunks

    def speak(self, unit: object, controls: Controls) -> SentenceAudio:
        assert isinstance(unit, Chunk), type(unit)
        (result,) = self.synth.synthesize_chunks([unit], controls)
        if self.language == "zh":
            result = dataclasses.replace(result, phonemes=mandarin.to_ipa(result.phonemes))
        return result


@dataclasses.dataclass
class EspeakSpeaker:
    """espeak-ng's own voice (the packaged fallback): formant audio, phoneme times from
    its events. length_scale sets the speaking rate; noise and seed do not apply (the
    synthesiser is deterministic)."""

    language: str
    espeak_voice: str

    def __post_init__(self) -> None:
        rewrite = self._event_ipa if self.language == "zh" else None
        self.voice = EspeakVoice(self.espeak_voice, rewrite)
        self.description = f"espeak-ng {self.espeak_voice} (packaged fallback)"
        self.config = VoiceConfig(
            sample_rate=0,  # espeak-ng's, known once the library is loaded
            espeak_voice=self.espeak_voice,
            phoneme_id_map={},
            noise_scale=0.667,
            length_scale=1.0,
            noise_w=0.8,
            num_symbols=0,
        )

    @staticmethod
    def _event_ipa(letters: list[str]) -> Sequence[str]:
        return mandarin.to_ipa(letters, ends_word=False)

    def units(self, text: bytes | str, max_chars: int = MAX_CHARS) -> Sequence[str]:
        # the fallback's languages (FALLBACK_ESPEAK) are Chinese ones: its text rules
        sentences = mandarin.split_zh(mandarin.clean_zh(text, max_chars).text)
        if not sentences:
            raise RequestError("text gives nothing to speak: expected words")
        return sentences

    def speak(self, unit: object, controls: Controls) -> SentenceAudio:
        text = str(unit)
        audio, symbols, starts, ends = self.voice.synthesize(text, controls.length_scale)
        return SentenceAudio(text, audio, self.voice.sample_rate, symbols, starts, ends)


@dataclasses.dataclass(frozen=True)
class PiperVoiceSetting:
    """One entry of the `voices` parameter: a Piper voice file and its served model."""

    language: str
    voice: Path
    model: str


def parse_voices(value: str) -> dict[str, PiperVoiceSetting]:
    """The `voices` parameter (JSON, "" for none) -> settings by language; ValueError
    (at model load) for an unknown language, a missing file or a missing model name."""
    if not value.strip():
        return {}
    try:
        data = json.loads(value)
    except json.JSONDecodeError as error:
        raise ValueError(
            f'voices is not JSON ({error}): expected {{"zh": {{"voice": ...}}}}'
        ) from None
    if not isinstance(data, Mapping):
        raise ValueError('voices: expected {"zh": {"voice": PATH, "model": NAME}}')
    out = {}
    for tag, entry in data.items():
        code = ALIASES.get(str(tag).lower())
        if code is None:
            raise ValueError(f"voices: language {tag!r}: expected one of {sorted(set(ALIASES))}")
        if not isinstance(entry, Mapping) or not entry.get("voice") or not entry.get("model"):
            raise ValueError(f'voices[{tag!r}]: expected {{"voice": PATH, "model": NAME}}')
        path = Path(str(entry["voice"])).expanduser()
        if not path.with_name(path.name + ".json").is_file():
            raise ValueError(f"voices[{tag!r}]: {path}.json does not exist (the voice's config)")
        out[code] = PiperVoiceSetting(code, path, str(entry["model"]))
    return out


def fallback_speakers() -> dict[str, Speaker]:
    """espeak-ng's voice for each language of FALLBACK_ESPEAK (its library loads at the
    first synthesis, so building them costs nothing)."""
    return {code: EspeakSpeaker(code, voice) for code, voice in FALLBACK_ESPEAK.items()}


class Voices:
    """The speakers of a `tts` model by language, built once at load."""

    def __init__(self, speakers: Mapping[str, Speaker]):
        if DEFAULT_LANGUAGE not in speakers:
            raise ValueError("the default language (en) needs a voice")
        self.speakers = dict(speakers)

    @property
    def languages(self) -> tuple[str, ...]:
        return tuple(self.speakers)

    def speaker(self, language: bytes | str | None) -> Speaker:
        return self.speakers[parse_language(language, self.languages)]

    @classmethod
    def build(
        cls,
        english: Speaker,
        settings: Mapping[str, PiperVoiceSetting],
        infer_for: Callable[[str], InferFn],
        *,
        max_phonemes: int,
        pad_to: int,
        fallback: bool = True,
    ) -> Voices:
        """English, each configured Piper voice (`infer_for(model)` calls its graph), and
        espeak-ng's voice for every other language it speaks when `fallback`."""
        speakers: dict[str, Speaker] = {DEFAULT_LANGUAGE: english}
        for code, setting in settings.items():
            voice = Voice.from_onnx(setting.voice)
            phonemizer = Phonemizer(voice.config, max_phonemes)
            synth = Synthesizer(phonemizer, infer_for(setting.model), pad_to=pad_to)
            speakers[code] = PiperSpeaker(
                code, synth, f"Piper {setting.voice.name} via {setting.model}"
            )
        if fallback:
            for code, speaker in fallback_speakers().items():
                speakers.setdefault(code, speaker)
        for code, speaker in speakers.items():
            log.info("tts: %s -> %s", code, speaker.description)
        return cls(speakers)
