"""Generated token ids -> streamed text: incremental detokenising, stop strings, and
sentence boundaries (so that TTS can start on the first sentence)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from avatar.sentences import clause_end, sentence_end, spoken_text


@dataclasses.dataclass(frozen=True)
class Chunk:
    """A piece of streamed text; `sentence` is set when the piece ends a sentence."""

    text: str
    sentence: str | None = None


class SentenceSplitter:
    """Accumulates streamed text and cuts it where `avatar.sentences` says a sentence
    ends (after punctuation and whitespace, at line breaks; not after abbreviations,
    initials or inside numbers).

    first_clause_words > 0: the first piece of a reply may also end at a clause break
    after that many words, so that TTS starts before a long first sentence is finished
    (later pieces are whole sentences)."""

    def __init__(self, first_clause_words: int = 0) -> None:
        self._pending = ""  # text of the current, unfinished sentence
        self._clause_words = first_clause_words  # 0 once the first piece is out

    def _cut(self) -> int | None:
        cut = sentence_end(self._pending)
        if self._clause_words:
            clause = clause_end(self._pending, self._clause_words)
            if clause is not None and (cut is None or clause < cut):
                cut = clause
        return cut

    def push(self, text: str) -> list[Chunk]:
        """Split `text` into chunks; each ends either a sentence or the given text."""
        chunks = []
        shown = len(self._pending)  # characters of the pending sentence already streamed
        self._pending += text
        while (cut := self._cut()) is not None:
            self._clause_words = 0
            chunks.append(Chunk(self._pending[shown:cut], self._pending[:cut].strip()))
            self._pending = self._pending[cut:]
            shown = max(0, shown - cut)
        if len(self._pending) > shown:
            chunks.append(Chunk(self._pending[shown:]))
        return chunks

    def flush(self) -> str | None:
        """The unfinished last sentence (at the end of generation), if any."""
        sentence, self._pending = self._pending.strip(), ""
        return sentence or None


class TextStream:
    """Turns generated ids into safe-to-show text deltas and watches for stop strings.

    `step(id)` is an incremental detokeniser (`Tokenizer.stream_decoder`, on tokenizers'
    DecodeStream): the new text of one id, or None while its bytes are an incomplete
    UTF-8 sequence, so each step costs O(1) instead of re-decoding the whole reply. Text is
    held back while it ends in a prefix of a stop string (or U+FFFD); a stop string ends the
    stream and is not shown.

    max_sentences > 0 is the reply's sentence budget, enforced here rather than asked of
    the model (a persona's "one to three sentences" is often ignored): once that many
    sentences with something to say are complete, the stream stops as at a stop string
    (the scheduler ends the generation) and nothing after them is shown, so the session
    remembers only those. Sentences are cut by `avatar.sentences.sentence_end`, as the
    SentenceSplitter cuts them; a piece with nothing to speak ("(laughs)", an emoji) does
    not count.
    """

    def __init__(
        self,
        step: Callable[[int], str | None],
        stop: Sequence[str] = (),
        max_sentences: int = 0,
    ):
        self._step, self._stop = step, tuple(stop)
        self._text = ""
        self._shown = 0
        self._longest_stop = max((len(s) for s in self._stop), default=0)
        self.max_sentences = max_sentences
        self._sentence_start = 0  # where the sentence being written starts in _text
        self.sentences = 0  # complete sentences with something to say
        self.stopped = False

    def push(self, token: int) -> str:
        """Add one generated id; return the new text that can be shown (maybe "")."""
        self._text += self._step(token) or ""
        text = self._text
        # a stop string not yet seen ends in the new text: search only the tail
        tail = max(0, self._shown - self._longest_stop)
        for stop in self._stop:
            at = text.find(stop, tail)
            if at >= 0:
                self.stopped = True
                return self._emit(text[:at])
        budget_end = self._budget_end()
        if budget_end is not None:
            self.stopped = True
            return self._emit(text[:budget_end])
        safe = len(text)
        if text.endswith("\ufffd"):
            safe = len(text.rstrip("\ufffd"))
        for stop in self._stop:
            for k in range(min(len(stop) - 1, len(text)), 0, -1):
                if text.endswith(stop[:k]):
                    safe = min(safe, len(text) - k)
                    break
        return self._emit(text[:safe])

    def finish(self) -> str:
        """Whatever was held back, at the end of generation (unless a stop string hit)."""
        if self.stopped:
            return ""
        return self._emit(self._text.rstrip("\ufffd"))

    def _budget_end(self) -> int | None:
        """Where the last sentence of the budget ends in the text, once it is complete."""
        if self.max_sentences <= 0:
            return None
        while (cut := sentence_end(self._text[self._sentence_start :])) is not None:
            sentence = self._text[self._sentence_start : self._sentence_start + cut]
            self._sentence_start += cut
            if spoken_text(sentence):
                self.sentences += 1
                if self.sentences >= self.max_sentences:
                    return len(self._text[: self._sentence_start].rstrip())
        return None

    def _emit(self, text: str) -> str:
        delta = text[self._shown :] if len(text) > self._shown else ""
        self._shown = max(self._shown, len(text))
        return delta
