"""The language a turn is held in, and the language each reply sentence is spoken in.

A turn's language is the user's: the one Whisper heard (the gateway's passes, or the
avatar model's own ASR), checked against how the words are written, since Whisper's guess
on a few words is unreliable and a typed turn carries a language control that may be stale.
Han characters mean Chinese; other writing keeps the heard language unless that is one
written in CJK characters. The reply is asked for in that language (an instruction the LLM
reads beside the question) and each sentence is spoken by the voice of the language it is
written in, so an LLM that answers in English anyway is not read by the Mandarin voice.
"""

from __future__ import annotations

import re
from collections.abc import Collection

DEFAULT = "en"
# languages named in the instruction to the LLM (others are named by their code)
NAMES: dict[str, str] = {
    "en": "English", "zh": "Chinese (简体中文)", "ja": "Japanese", "ko": "Korean",
    "fr": "French", "de": "German", "es": "Spanish", "it": "Italian", "pt": "Portuguese",
    "ru": "Russian", "nl": "Dutch", "ar": "Arabic", "hi": "Hindi", "tr": "Turkish",
}  # fmt: skip
CJK = frozenset({"zh", "ja", "ko"})
_CODE = re.compile(r"^[a-z]{2,3}(-[a-z0-9]{2,8})?$")
_HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
HAN_SHARE = 0.3  # of a text's letters, for it to count as written in Chinese


def normalise(code: str) -> str:
    """A language control or Whisper code ("zh", "ZH-cn", "en_US") -> its base code; ""
    when empty. ValueError for something that is not a language tag."""
    tag = code.strip().lower().replace("_", "-")
    if not tag:
        return ""
    if not _CODE.match(tag):
        raise ValueError(f"language {code[:20]!r} is not a language code; expected e.g. en, zh")
    return tag.split("-")[0]


def written_in_han(text: str) -> bool:
    """Whether Han characters are at least HAN_SHARE of the text's letters."""
    letters = sum(ch.isalpha() for ch in text)
    return bool(letters) and len(_HAN.findall(text)) >= HAN_SHARE * letters


def turn_language(text: str, heard: str = "") -> str:
    """The language of the user's words `text`, Whisper (or the client) having said `heard`."""
    if written_in_han(text):
        return "zh"
    heard = normalise(heard)
    return heard if heard and heard not in CJK else DEFAULT


def answer_instruction(language: str) -> str:
    """What the LLM is told beside the user's words: nothing for English (the personas'
    language), else to answer in the user's language."""
    if not language or language == DEFAULT:
        return ""
    return f"(Answer in {NAMES.get(language, language)}.)"


def speech_language(sentence: str, language: str, voices: Collection[str]) -> str:
    """The voice language of one reply sentence: Chinese when written in Han characters,
    else the turn's language when a voice of it is served (`voices`), else English."""
    if written_in_han(sentence) and "zh" in voices:
        return "zh"
    if language and language not in CJK and language in voices:
        return language
    return DEFAULT
