"""A turn request: audio (16 kHz mono float32) or text, a session id and JSON controls,
validated with messages that say what was wrong and what is expected."""

from __future__ import annotations

import dataclasses
import math
import uuid
from typing import Any

import numpy as np

from avatar.animation.pipeline import AnimationConfig
from avatar.conversation_tokens import ConversationTokens, resolve
from avatar.errors import RequestError, parse_json
from avatar.languages import normalise

AUDIO_RATE = 16000
MAX_TEXT_CHARS = 2000
MAX_TOKENS_RANGE = (1, 512)
MAX_PERSONA_CHARS = 4000


AUTO_EMOTION = "auto"
FACES = ("", "portrait", "cartoon")  # the `face` control; "" is the server's default


@dataclasses.dataclass(frozen=True)
class Controls:
    """Per-turn controls a client may send as the `controls` JSON object."""

    fps: float = 30.0
    alpha: float = 0.7  # blendshape smoothing (EMA release), 0.5 responsive ... 0.9 calm
    # "auto": each reply sentence's emotion from its text (the avatar model's classifier);
    # or a fixed label of avatar.animation.tables.EMOTIONS
    emotion: str = AUTO_EMOTION
    intensity: float = 0.6  # the fixed label's strength, or the most "auto" may use
    persona: str = ""  # a system prompt for this turn; "" keeps the llm's configured one
    max_tokens: int = 0  # 0: the avatar model's default
    seed: int = 0
    # video frames, when a renderer model is served; off by default: clients that draw the
    # face themselves (the live page) need only the blendshapes
    render: bool = False
    # which face `render` draws: "portrait" (the photo), "cartoon", or "" for the avatar
    # model's configured default (its `face` parameter)
    face: str = ""
    # the user's language when the caller knows it (the gateway: the one Whisper heard);
    # "" lets the turn tell it from the audio or from how the words are written
    language: str = ""

    def animation(self, t0: float = 0.0) -> AnimationConfig:
        """The animation settings; "auto" not resolved by a classifier is neutral."""
        auto = self.emotion == AUTO_EMOTION
        return AnimationConfig(
            fps=self.fps,
            alpha=self.alpha,
            emotion="neutral" if auto else self.emotion,
            intensity=0.0 if auto else self.intensity,
            seed=self.seed,
            t0=t0,
        )

    @classmethod
    def from_json(cls, text: str) -> Controls:
        """The `controls` input as sent (avatar.pipeline.schema serialises it)."""
        return cls.from_dict(parse_json(text, "controls")) if text.strip() else cls()

    @classmethod
    def from_dict(cls, raw: Any) -> Controls:
        """Validated controls from a decoded JSON object; RequestError says what is wrong."""
        if not isinstance(raw, dict):
            raise RequestError('controls must be a JSON object, e.g. {"fps": 30}')
        known = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(raw) - set(known))
        if unknown:
            raise RequestError(f"unknown controls {unknown}; expected some of {sorted(known)}")
        defaults = cls()
        values = {name: _typed(name, value, getattr(defaults, name)) for name, value in raw.items()}
        controls = cls(**values)
        controls.validate()
        return controls

    def validate(self) -> None:
        if self.face not in FACES:
            raise RequestError(f"control face={self.face!r}: expected one of {sorted(FACES)}")
        concrete = (
            self if self.emotion != AUTO_EMOTION else dataclasses.replace(self, emotion="neutral")
        )
        concrete.animation().validate()  # fps, alpha, emotion label and intensity
        low, high = MAX_TOKENS_RANGE
        if self.max_tokens and not low <= self.max_tokens <= high:
            raise RequestError(
                f"max_tokens={self.max_tokens} is out of range; expected {low}..{high}"
            )
        if not 0 <= self.seed < 2**63:
            raise RequestError(f"seed={self.seed} is out of range; expected 0..2**63-1")
        try:
            normalise(self.language)
        except ValueError as error:
            raise RequestError(f"control {error}") from None
        if len(self.persona) > MAX_PERSONA_CHARS:
            raise RequestError(
                f"persona has {len(self.persona)} characters; at most {MAX_PERSONA_CHARS}"
            )


_KINDS = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


def _typed(name: str, value: Any, default: Any) -> Any:
    """A control's JSON value as the type of its default, strictly: no bool for a number,
    no string for a number, no number for a string, finite numbers only (1e999 is
    infinity in JSON parsers), integers as integers."""
    kind = type(default)
    ok = isinstance(value, kind) and not (kind is not bool and isinstance(value, bool))
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        try:
            value, ok = float(value), True
        except OverflowError:  # an integer of hundreds of digits
            ok = False
    if kind is int and isinstance(value, float) and value.is_integer():
        value, ok = int(value), True
    if ok and isinstance(value, float) and not math.isfinite(value):
        ok = False
    if not ok:
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:40] + "..."
        raise RequestError(f"control {name}={shown} is not {_KINDS[kind]}")
    return value


@dataclasses.dataclass(frozen=True)
class TurnRequest:
    """Exactly one of `audio` (16 kHz mono float32) and `text`. `turn_id` names the turn's
    work in other models (the LLM generation it stops on barge-in)."""

    audio: np.ndarray | None
    text: str
    session_id: str
    controls: Controls
    turn_id: str = dataclasses.field(default_factory=lambda: uuid.uuid4().hex)
    parent_session_id: str = ""  # a new session starts from this one's memory (a fork)
    # the operator's passages for this turn (avatar.knowledge), set by the server after ASR;
    # never from a client: `parse_turn` has no such input
    context: str = ""
    # the language the turn is held in (avatar.languages.turn_language), set after ASR
    language: str = ""


def parse_turn(
    audio: np.ndarray | None,
    text: str | None,
    session_id: str = "",
    controls: str = "",
    max_audio_s: float = 60.0,
    *,
    parent_session_id: str = "",
    tokens: ConversationTokens | None = None,
) -> TurnRequest:
    """Validate the raw inputs of one turn; raises RequestError on bad input. With `tokens`
    a session is named by its token ("new" makes one); without, callers' ids are trusted."""
    if (audio is None) == (text is None):
        raise RequestError("send exactly one of `audio` (16 kHz mono FP32) and `text` (STRING)")
    if audio is not None:
        audio = np.asarray(audio, dtype=np.float32).reshape(-1)
        if audio.size == 0:
            raise RequestError("audio is empty; expected 16 kHz mono float32 samples")
        if not np.isfinite(audio).all():
            raise RequestError("audio contains NaN or infinite samples; expected finite floats")
        if audio.size > max_audio_s * AUDIO_RATE:
            raise RequestError(
                f"audio is {audio.size / AUDIO_RATE:.1f} s; at most {max_audio_s:g} s per turn"
            )
    else:
        text = text.strip()
        if not text:
            raise RequestError("text is empty; expected the user's words")
        if len(text) > MAX_TEXT_CHARS:
            raise RequestError(f"text has {len(text)} characters; at most {MAX_TEXT_CHARS}")
    session_token, _ = resolve(tokens, session_id)
    parent_token, _ = resolve(tokens, parent_session_id, "parent_session_id", allow_new=False)
    return TurnRequest(
        audio,
        text or "",
        session_token,
        Controls.from_json(controls),
        parent_session_id=parent_token,
    )
