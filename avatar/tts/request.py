"""A `tts` request's tensors -> text and Controls (Triton-free, so tests reach every check)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from avatar.errors import RequestError
from avatar.tts.synth import Controls
from avatar.tts.voice import VoiceConfig

CONTROL_INPUTS = ("length_scale", "noise_scale", "noise_w", "seed")
LANGUAGE_INPUT = "language"


def _scalar(name: str, array: np.ndarray | None) -> float | int | None:
    if array is None:
        return None
    array = np.asarray(array)
    if array.size != 1:
        raise RequestError(f"input {name!r} has {array.size} values: expected one")
    if array.dtype.kind not in "iuf":
        raise RequestError(f"input {name!r} has dtype {array.dtype}: expected a number")
    value = array.reshape(()).item()
    if name == "seed":
        if array.dtype.kind == "f" or value < 0:
            raise RequestError(f"seed={value}: expected an integer in [0, 2**63)")
        return int(value)
    return float(value)


def parse_request(
    arrays: Mapping[str, np.ndarray | None], config: VoiceConfig
) -> tuple[bytes | str, Controls]:
    """`text` (BYTES [1]) and optional scalar controls -> (raw text, Controls).

    The text is returned undecoded: `avatar.tts.normalize.clean` decodes and checks it.
    """
    text = arrays.get("text")
    if text is None:
        raise RequestError("missing input 'text': expected one UTF-8 string")
    text = np.asarray(text, dtype=object).reshape(-1)
    if text.size != 1:
        raise RequestError(f"input 'text' has {text.size} strings: expected one per request")
    controls = Controls.defaults(
        config, **{name: _scalar(name, arrays.get(name)) for name in CONTROL_INPUTS}
    )
    return text[0], controls


def language_of(arrays: Mapping[str, np.ndarray | None]) -> bytes | str | None:
    """The optional `language` input (BYTES [1], an ISO 639-1 code such as "zh"), raw;
    `avatar.tts.voices.parse_language` checks it against the voices served."""
    value = arrays.get(LANGUAGE_INPUT)
    if value is None:
        return None
    value = np.asarray(value, dtype=object).reshape(-1)
    if value.size != 1:
        raise RequestError(f"input 'language' has {value.size} strings: expected one")
    return value[0]
