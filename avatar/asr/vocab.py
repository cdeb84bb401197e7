"""Whisper's special tokens, languages, prompts and text decoding from `tokenizer.json`.

Timestamp tokens follow the last special token (`<|notimestamps|>`): token
`timestamp_begin + i` marks i * 0.02 s from the start of the window.
"""

from __future__ import annotations

import dataclasses
import json
import string
from pathlib import Path

from avatar.errors import RequestError

LANGUAGE_IDS_FIRST = "<|en|>"  # languages run from <|en|> to the token before <|translate|>
_PUNCTUATION = frozenset(string.punctuation)


@dataclasses.dataclass(frozen=True)
class WhisperVocab:
    """Token ids a decoding loop needs, read from a Whisper `tokenizer.json`."""

    eot: int
    sot: int
    transcribe: int
    translate: int
    sot_prev: int
    sot_lm: int
    no_speech: int  # <|nocaptions|>
    no_timestamps: int
    languages: dict[str, int]  # "en" -> <|en|> id
    suppress: tuple[int, ...]  # suppressed at every step (non-speech symbols, task tokens)
    suppress_begin: tuple[int, ...]  # suppressed at the first sampled token (blank, eot)
    tokenizer_path: Path
    end_marks: tuple[int, ...] = ()  # ".", "?", "!" with and without a leading space
    punctuation: frozenset[int] = frozenset()  # text tokens of punctuation only ("," "...")

    @property
    def timestamp_begin(self) -> int:
        return self.no_timestamps + 1

    @classmethod
    def load(cls, tokenizer_json: Path, config_json: Path | None = None) -> WhisperVocab:
        """Read ids from tokenizer.json; suppression lists from a CTranslate2 config.json."""
        tokenizer = json.loads(Path(tokenizer_json).read_text(encoding="utf-8"))
        added = {t["content"]: t["id"] for t in tokenizer["added_tokens"]}
        first, last = added[LANGUAGE_IDS_FIRST], added["<|translate|>"]
        languages = {t[2:-2]: i for t, i in added.items() if first <= i < last}
        config = json.loads(Path(config_json).read_text(encoding="utf-8")) if config_json else {}
        task_tokens = (
            "<|transcribe|>",
            "<|translate|>",
            "<|startoftranscript|>",
            "<|startofprev|>",
            "<|startoflm|>",
        )
        suppress = set(config.get("suppress_ids", [])) | {added[t] for t in task_tokens}
        text = tokenizer["model"]["vocab"]
        marks = [text[t] for t in (".", "?", "!", "\u0120.", "\u0120?", "\u0120!") if t in text]
        punctuation = {
            i
            for token, i in text.items()
            if (bare := token.removeprefix("\u0120")) and _PUNCTUATION.issuperset(bare)
        }
        return cls(
            eot=added["<|endoftext|>"],
            sot=added["<|startoftranscript|>"],
            transcribe=added["<|transcribe|>"],
            translate=added["<|translate|>"],
            sot_prev=added["<|startofprev|>"],
            sot_lm=added["<|startoflm|>"],
            no_speech=added["<|nocaptions|>"],
            no_timestamps=added["<|notimestamps|>"],
            languages=languages,
            suppress=tuple(sorted(suppress)),
            suppress_begin=tuple(config.get("suppress_ids_begin", [220, added["<|endoftext|>"]])),
            tokenizer_path=Path(tokenizer_json),
            end_marks=tuple(sorted(marks)),
            punctuation=frozenset(punctuation),
        )

    def language_id(self, language: str) -> int:
        """Token id of a language code ("en", "zh", ...); RequestError for an unknown one."""
        if language not in self.languages:
            raise RequestError(
                f"unknown language {language!r}; expected one of {sorted(self.languages)} or empty"
            )
        return self.languages[language]

    def language_code(self, token: int) -> str:
        return next(code for code, i in self.languages.items() if i == token)

    def word_start(self, token: int) -> bool:
        """Whether a text token begins a word (byte-level BPE: it carries the space, "Ġ")."""
        return (_tokenizer(str(self.tokenizer_path)).id_to_token(token) or "").startswith("Ġ")

    def decode(self, tokens: list[int]) -> str:
        """Text of the text tokens among `tokens` (special and timestamp tokens dropped)."""
        return _tokenizer(str(self.tokenizer_path)).decode([t for t in tokens if t < self.eot])


_TOKENIZERS: dict[str, object] = {}


def _tokenizer(path: str):  # -> tokenizers.Tokenizer
    if path not in _TOKENIZERS:
        from tokenizers import Tokenizer

        _TOKENIZERS[path] = Tokenizer.from_file(path)
    return _TOKENIZERS[path]
