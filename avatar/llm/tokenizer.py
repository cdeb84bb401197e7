"""The checkpoint's tokenizer (`tokenizer.json`) and chat template, without transformers."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

from avatar.llm.template import ChatTemplate, Segment

STOP_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "</s>")


class Tokenizer:
    """Encode/decode and the chat template of an exported checkpoint folder."""

    def __init__(self, folder: Path):
        from tokenizers import Tokenizer as HfTokenizer

        folder = Path(folder)
        self._tok = HfTokenizer.from_file(str(folder / "tokenizer.json"))
        # message content: special-token strings are ordinary text (no injected turns)
        self._plain = HfTokenizer.from_file(str(folder / "tokenizer.json"))
        self._plain.encode_special_tokens = True
        config = json.loads((folder / "tokenizer_config.json").read_text())
        source = config.get("chat_template")
        jinja = folder / "chat_template.jinja"
        if source is None and jinja.is_file():
            source = jinja.read_text()
        if not source:
            raise ValueError(f"{folder}: the tokenizer has no chat template")
        special = {k: config.get(k) for k in ("bos_token", "eos_token") if config.get(k)}
        self.template = ChatTemplate(source, {k: _content(v) for k, v in special.items()})
        vocab = self._tok.get_vocab()
        self.stop_ids = frozenset(vocab[t] for t in STOP_TOKENS if t in vocab)
        pad = _content(config.get("pad_token")) or "<|endoftext|>"
        self.pad_id = vocab.get(pad, 0)
        # the id that ends a reply (an engine that stops by itself, e.g. TensorRT-LLM's
        # end_id): the first stop token the vocabulary has, in STOP_TOKENS order
        self.end_id = next((vocab[t] for t in STOP_TOKENS if t in vocab), self.pad_id)

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        """Text with special tokens written out (as the chat template emits them) -> ids."""
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_segments(self, segments: Sequence[Segment]) -> list[int]:
        """A rendered prompt -> ids: the template's special tokens parsed, message content
        as plain text."""
        ids: list[int] = []
        for segment in segments:
            tokenizer = self._plain if segment.plain else self._tok
            ids += tokenizer.encode(segment.text, add_special_tokens=False).ids
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=True)

    def stream_decoder(self) -> Callable[[int], str | None]:
        """A fresh incremental decoder: id -> its new text, None while incomplete UTF-8
        (tokenizers' DecodeStream; the pieces join to `decode(ids)`)."""
        from tokenizers.decoders import DecodeStream

        stream = DecodeStream(skip_special_tokens=True)
        return lambda token: stream.step(self._tok, token)


def _content(token: object) -> str | None:
    """tokenizer_config writes a special token as a string or as {"content": ...}."""
    if isinstance(token, dict):
        return token.get("content")
    return token if isinstance(token, str) else None
