"""Greedy Whisper decoding over an abstract encoder/decoder, several windows in lockstep.

A `WhisperRuntime` runs the two exported networks (ONNX Runtime in-process, or BLS calls to
the Triton models `asr_encoder` / `asr_decoder`). Every window of a batch has the same prompt
length, so one decoder call advances all of them by one token; finished rows are fed `eot`.
Where the caches live is the runtime's choice (`WhisperRuntime.decoding`): in-process they
are held here and passed to each step; served, `asr_decoder` keeps them per sequence.
"""

from __future__ import annotations

import abc
import dataclasses
import math
from collections.abc import Callable, Sequence

import numpy as np

from avatar.asr.rules import apply_rules, log_softmax
from avatar.asr.vocab import WhisperVocab

FRAMES_PER_TIMESTAMP = 2  # a timestamp token is 0.02 s: one encoder position, 2 mel frames


class WhisperRuntime(abc.ABC):
    """The exported Whisper networks. Shapes: L decoder layers, H heads, Dh = d_model / H."""

    @abc.abstractmethod
    def encode(self, mel: np.ndarray) -> np.ndarray:
        """mel [batch, n_mels, frames] float32 -> cross_kv [batch, 2L, H, frames/2, Dh]
        (per layer: cross-attention keys at 2i, values at 2i+1)."""

    @abc.abstractmethod
    def decode(
        self, tokens: np.ndarray, self_kv: np.ndarray, cross_kv: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """tokens [batch, n] int64, self_kv [batch, 2L, H, past, Dh], cross_kv as `encode`
        -> (logits of the last position [batch, vocab], self_kv [batch, 2L, H, past + n, Dh])."""

    def decoding(self, cross_kv: np.ndarray) -> WindowDecoding:
        """The decoder steps of one batch of windows (cross_kv as `encode` returns it)."""
        return HeldCaches(self, cross_kv)


class WindowDecoding(abc.ABC):
    """Decoder steps over one batch of windows whose caches the runtime keeps somewhere."""

    @abc.abstractmethod
    def step(self, tokens: np.ndarray, done: np.ndarray) -> np.ndarray:
        """tokens [batch, n] int64 -> logits of the last position [batch, vocab]. `done`
        [batch] bool: rows that finished before this step (fed eot; their logits are
        ignored, and a runtime may stop running them)."""

    def close(self) -> None:  # noqa: B027 - a runtime that holds nothing has nothing to free
        """No more steps: free the caches."""


class HeldCaches(WindowDecoding):
    """The caches held in this process and passed to the stateless `decode` each step."""

    def __init__(self, runtime: WhisperRuntime, cross_kv: np.ndarray):
        self.runtime, self.cross_kv = runtime, cross_kv
        batch, kv, heads, _, width = cross_kv.shape
        self.self_kv = np.zeros((batch, kv, heads, 0, width), np.float32)

    def step(self, tokens: np.ndarray, done: np.ndarray) -> np.ndarray:
        logits, self.self_kv = self.runtime.decode(tokens, self.self_kv, self.cross_kv)
        return logits


@dataclasses.dataclass(frozen=True)
class DecodeOptions:
    language: str | None = None  # None: detect per window
    task: str = "transcribe"  # or "translate"
    timestamps: bool = True
    max_new_tokens: int = 224  # openai/whisper's sample_len (half the text context)
    # A window's tokens at most 10 + this many per second of its speech: Whisper can loop
    # on a short window ("Had he married? Had he married? ..." to the 224-token limit, 3.2 s
    # on one core, on the first second of a human recording: a live pass while the user
    # speaks). Real speech has 4.7 tokens/s at the median, 7.2 at most, timestamps
    # included (the human recordings and the packaged voice's questions). None: no cap.
    max_tokens_per_second: float | None = 10.0
    max_initial_timestamp_index: int | None = 50  # 1.0 s
    # 0: greedy (argmax). Above 0: sample from softmax(logits / temperature), as Whisper's
    # fallback re-decodes a degenerate window (avatar.asr.transcribe.Fallback); each row
    # draws from its own generator seeded with `seed`, so a row's tokens do not depend on
    # the other rows of its batch and a run repeats exactly.
    temperature: float = 0.0
    seed: int = 0


@dataclasses.dataclass
class WindowResult:
    tokens: list[int]  # the prefix and the sampled tokens, without the prompt and eot
    language: str
    language_probability: float
    no_speech_prob: float
    avg_logprob: float
    cancelled: bool = False  # the caller gave up on it: decoding stopped, tokens partial
    # Whisper's probability of an end mark (". ? !") among the text tokens right after the
    # last word it wrote (`_end_share`): it hears the voice as well as the words, so a head
    # ("can you tell me") gets little even where it wrote a full stop
    # (avatar.end_of_turn.Fusion can read it). None: no word.
    end_probability: float | None = None


def _end_share(logits: np.ndarray, vocab: WhisperVocab) -> float:
    """The end marks' share of the text tokens in one step's raw logits: were the next token
    text, how likely it ends the sentence. Raw, not after the timestamp rules, which may
    force a timestamp after the last word (a list such as "10 of clubs" would read 0); and
    among text tokens only, so where the segment ends (a timestamp or eot) does not count."""
    text = logits[: vocab.eot].astype(np.float64)
    top = text.max()
    return float(np.exp(text[list(vocab.end_marks)] - top).sum() / np.exp(text - top).sum())


def _softmax(x: np.ndarray) -> np.ndarray:
    return np.exp(log_softmax(x))


def greedy_decode(
    runtime: WhisperRuntime,
    mel: np.ndarray,
    vocab: WhisperVocab,
    options: DecodeOptions,
    prefixes: Sequence[Sequence[int]] | None = None,
    *,
    max_tokens: Sequence[int] | None = None,
    cancelled: Sequence[Callable[[], bool]] | None = None,
) -> list[WindowResult]:
    """Decode a batch of windows. mel: [batch, n_mels, frames] float32.

    prefixes: per row, tokens the transcript is known to begin with (e.g. what two passes
    over the speech so far agreed on, `avatar.asr.agreement`), all of one length: they go
    in with the prompt, in one decoder step, and decoding goes on after them.
    max_tokens: per row, the most tokens (prefix included) its transcript may have; a row
    that reaches it ends there (`speech_token_limit`). None: options.max_new_tokens.
    cancelled: per row, asked before each decoder step; a row whose caller gave up (True)
    stops there and comes back with `cancelled` set, the other rows go on."""
    decoding = runtime.decoding(runtime.encode(mel))
    try:
        return _decode(
            decoding,
            mel.shape,
            vocab,
            options,
            prefixes,
            max_tokens=max_tokens,
            cancelled=cancelled,
        )
    finally:
        decoding.close()


def _sample(
    masked: np.ndarray, options: DecodeOptions, samplers: Sequence[np.random.Generator]
) -> np.ndarray:
    """One token per row drawn from softmax(masked / temperature) by the Gumbel-max trick
    (argmax of the scaled logits plus Gumbel noise): masked (-inf) tokens are never drawn."""
    scaled = masked.astype(np.float64) / options.temperature
    noise = np.stack([-np.log(-np.log(rng.random(scaled.shape[-1]))) for rng in samplers])
    return (scaled + noise).argmax(-1)


def speech_token_limit(options: DecodeOptions, seconds: float) -> int:
    """The most tokens a window with `seconds` of speech may decode (see DecodeOptions)."""
    if options.max_tokens_per_second is None:
        return options.max_new_tokens
    return min(options.max_new_tokens, 10 + math.ceil(options.max_tokens_per_second * seconds))


def _decode(
    decoding: WindowDecoding,
    mel_shape: tuple[int, ...],
    vocab: WhisperVocab,
    options: DecodeOptions,
    prefixes: Sequence[Sequence[int]] | None = None,
    *,
    max_tokens: Sequence[int] | None = None,
    cancelled: Sequence[Callable[[], bool]] | None = None,
) -> list[WindowResult]:
    batch = mel_shape[0]
    forced = [list(p) for p in prefixes] if prefixes is not None else [[] for _ in range(batch)]
    if len(forced) != batch or len({len(p) for p in forced}) > 1:
        raise ValueError(f"one prefix per row, all of one length; got {[len(p) for p in forced]}")
    limits = [options.max_new_tokens] * batch if max_tokens is None else list(max_tokens)
    if len(limits) != batch:
        raise ValueError(f"one token limit per row: {len(limits)} for {batch} rows")
    if cancelled is not None and len(cancelled) != batch:
        raise ValueError(f"one cancellation check per row: {len(cancelled)} for {batch} rows")
    done = np.zeros(batch, bool)
    dropped = np.zeros(batch, bool)

    def give_up() -> bool:
        """Rows whose caller gave up end here; True when no row is left."""
        if cancelled is not None:
            for k in np.flatnonzero(~done):
                if cancelled[k]():
                    done[k] = dropped[k] = True
        return bool(done.all())

    logits = decoding.step(np.full((batch, 1), vocab.sot, np.int64), done)
    no_speech = _softmax(logits)[:, vocab.no_speech]
    lang_ids = np.array(sorted(vocab.languages.values()))
    if options.language is None:
        lang_probs = _softmax(logits[:, lang_ids])
        chosen = lang_ids[lang_probs.argmax(-1)]
        lang_prob = lang_probs.max(-1)
    else:
        chosen = np.full(batch, vocab.language_id(options.language))
        lang_prob = np.ones(batch)
    task = vocab.transcribe if options.task == "transcribe" else vocab.translate
    prompt = [
        [int(lang), task] + ([] if options.timestamps else [vocab.no_timestamps]) + prefix
        for lang, prefix in zip(chosen, forced, strict=True)
    ]
    if not give_up():
        logits = decoding.step(np.array(prompt, np.int64), done)

    n_forced = len(forced[0])
    sampled: list[list[int]] = forced  # the prefix counts as sampled for the rules
    samplers = None
    if options.temperature > 0:
        samplers = [np.random.default_rng(options.seed) for _ in range(batch)]
    sum_logprob = np.zeros(batch)
    # per row, the raw logits of the step after its last word (read once at the end)
    after_word: list[np.ndarray | None] = [None] * batch
    for step in range(options.max_new_tokens - n_forced):
        if done.all():
            break
        masked = apply_rules(
            logits,
            sampled,
            vocab,
            n_forced == 0 and step == 0,
            timestamps=options.timestamps,
            max_initial_timestamp_index=options.max_initial_timestamp_index,
            max_timestamp_index=mel_shape[2] // FRAMES_PER_TIMESTAMP,
        )
        logprobs = log_softmax(masked)
        for k in np.flatnonzero(~done):
            last = sampled[k][-1] if sampled[k] else None
            if last is not None and last < vocab.eot and last not in vocab.punctuation:
                after_word[k] = logits[k].copy()  # a runtime may reuse its output buffer
        next_tokens = masked.argmax(-1) if samplers is None else _sample(masked, options, samplers)
        for k in range(batch):
            if done[k]:
                continue
            sum_logprob[k] += logprobs[k, next_tokens[k]]
            if next_tokens[k] == vocab.eot:
                done[k] = True
            else:
                sampled[k].append(int(next_tokens[k]))
                done[k] = len(sampled[k]) >= limits[k]  # a loop, cut (DecodeOptions)
        if give_up():
            break
        feed = np.where(done, vocab.eot, next_tokens).astype(np.int64)[:, None]
        logits = decoding.step(feed, done)  # finished rows: ignored
    return [
        WindowResult(
            tokens=sampled[k],
            language=vocab.language_code(int(chosen[k])),
            language_probability=float(lang_prob[k]),
            no_speech_prob=float(no_speech[k]),
            avg_logprob=float(sum_logprob[k] / (len(sampled[k]) - n_forced + 1)),
            cancelled=bool(dropped[k]),
            end_probability=None if after_word[k] is None else _end_share(after_word[k], vocab),
        )
        for k in range(batch)
    ]
