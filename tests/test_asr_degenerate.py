"""Whisper's loops on short windows (issue 33): the degenerate-transcript detector, and the
fallback that decodes such a window again, with the exported networks in-process (the path
the served `asr` model takes too: both call avatar.asr.transcribe)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from avatar.asr.degenerate import (
    compression_ratio,
    degeneracy,
    longest_repeat,
    punctuation_run,
)
from avatar.asr.onnx_runtime import DECODER_STEP_FILE, OnnxWhisperRuntime
from avatar.asr.transcribe import AsrOptions, transcribe
from avatar.asr.vocab import WhisperVocab
from evals.wer import wer

SERVED = AsrOptions(window_step=100, window_margin=300)  # model_repository/asr/config.pbtxt
# windows cut close to the last word (the config's note: a small margin makes Whisper
# repeat itself)
TIGHT = AsrOptions(window_step=50, window_margin=0)
QUESTION = "Can you recommend a good book?"


@pytest.fixture(scope="module")
def vocab() -> WhisperVocab:
    from export.asr.weights import packaged_ct2_dir

    folder = packaged_ct2_dir()
    return WhisperVocab.load(folder / "tokenizer.json", folder / "config.json")


class CountingRuntime(OnnxWhisperRuntime):
    """The exported networks, counting the windows' decodes (one encoder call each)."""

    encodes = 0

    def encode(self, mel: np.ndarray) -> np.ndarray:
        self.encodes += 1
        return super().encode(mel)


@pytest.fixture(scope="module")
def runtime() -> CountingRuntime:
    from export.registry import ensure_all

    folders = ensure_all(["asr_encoder", "asr_decoder"])
    return CountingRuntime(
        folders["asr_encoder"] / "model.onnx", folders["asr_decoder"] / DECODER_STEP_FILE
    )


def _why(text: str, vocab: WhisperVocab) -> str | None:
    from avatar.asr.vocab import _tokenizer

    ids = _tokenizer(str(vocab.tokenizer_path)).encode(" " + text, add_special_tokens=False).ids
    return degeneracy(text, ids, avg_logprob=-0.3)


# ---------------------------------------------------------------- the detector, no model


def test_loops_are_degenerate(vocab):
    dots = "Can you recommend a " + ". " * 17  # the transcript of the issue
    assert punctuation_run(dots) == 17
    assert _why(dots, vocab) is not None
    assert _why("Can you recommend a good book book book book book book", vocab) is not None
    assert _why("Had he married? Had he married? Had he married?", vocab) is not None
    assert _why("Place em, replace em, replace em, replace em, replace em", vocab) is not None
    long_loop = "I don't know. " * 20
    assert compression_ratio(long_loop) > 2.4
    assert _why(long_loop, vocab).startswith("compression ratio")
    assert degeneracy("Can you", [1664, 291], -0.3, hit_limit=True) == "token limit"


def test_speech_that_repeats_a_little_is_not_degenerate(vocab):
    assert longest_repeat([1, 2, 1, 2, 1, 2, 3]) == (2, 3)
    for text in (
        "No, no, no, that is not what I said.",
        "It was very very very cold... Really?!",
        "Eight of spades, four of clubs, seven of hearts.",
        "Hello?",
    ):
        assert _why(text, vocab) is None, text


def test_no_reference_transcript_is_degenerate(vocab):
    """Zero false positives on what people say: the human recordings' and the packaged
    voice's reference texts."""
    from evals.clips import CLIP_TEXTS
    from evals.recordings import human_clips

    texts = [c.text for c in human_clips()] + [t for t, _ in CLIP_TEXTS]
    assert [t for t in texts if _why(t, vocab) is not None] == []


# ---------------------------------------------------------------- real audio, real model


def test_whole_human_recordings_decode_as_greedy_did(runtime, vocab):
    """Zero false positives on real transcripts: no window of the human recordings falls
    back, so the transcripts (and their WER) are greedy's."""
    from avatar.asr.greedy import speech_token_limit
    from evals.recordings import human_clips

    audios = [c.audio for c in human_clips()]
    greedy = transcribe(runtime, vocab, audios, dataclasses.replace(SERVED, fallback=None))
    for t in greedy:
        limit = speech_token_limit(SERVED.decode, t.duration)
        text_tokens = [x for x in t.tokens if x < vocab.eot]
        assert degeneracy(t.text, text_tokens, -0.3, hit_limit=len(t.tokens) >= limit) is None
    after = transcribe(runtime, vocab, audios, SERVED)
    assert [t.text for t in after] == [t.text for t in greedy]


def test_a_human_question_cut_after_one_second_does_not_loop(runtime, vocab):
    """A live pass over the first second of a real recording ("had he married a more
    amiable woman ..."), windowed as the `asr` model windows it: greedy repeats "Had he
    married?" to the token limit; the fallback (a longer window) does not."""
    from evals.recordings import human_clips

    clip = next(c for c in human_clips() if c.text.startswith("had he married"))
    audio = clip.audio[:16_000]
    (result,) = transcribe(runtime, vocab, [audio], SERVED)
    assert wer("had he married", result.text) == 0.0, result.text
    assert _why(result.text, vocab) is None
    (greedy,) = transcribe(runtime, vocab, [audio], dataclasses.replace(SERVED, fallback=None))
    assert wer("had he married", greedy.text) >= 1.0, greedy.text  # still a real loop


def test_the_issue_question_in_a_tight_window_does_not_loop(runtime, vocab):
    """The question of the issue, spoken by the packaged voice, in a window cut close to
    its last word: greedy says it again and loops on "book" (WER 2.8); the fallback
    transcribes it, with at most two extra decodes."""
    from evals.clips import synthesize

    audio = synthesize(QUESTION, 0.9)
    before = runtime.encodes
    (result,) = transcribe(runtime, vocab, [audio], TIGHT)
    assert result.text == QUESTION
    assert runtime.encodes - before <= 1 + len(TIGHT.fallback.temperatures)
    (greedy,) = transcribe(runtime, vocab, [audio], dataclasses.replace(TIGHT, fallback=None))
    assert wer(QUESTION, greedy.text) > 1.0, greedy.text  # still a real loop


def test_sampling_is_seeded_and_a_row_does_not_depend_on_its_batch(runtime, vocab):
    from avatar.asr.features import log_mel, pad_or_trim
    from avatar.asr.greedy import DecodeOptions, greedy_decode
    from evals.clips import clips

    mels = np.stack([pad_or_trim(log_mel(c.audio), 400) for c in clips(2)])
    hot = DecodeOptions(language="en", temperature=1.0, seed=7)
    alone = greedy_decode(runtime, mels[:1], vocab, hot)[0].tokens
    assert greedy_decode(runtime, mels[:1], vocab, hot)[0].tokens == alone
    assert greedy_decode(runtime, mels, vocab, hot)[0].tokens == alone
    others = [
        greedy_decode(runtime, mels[:1], vocab, dataclasses.replace(hot, seed=s))[0].tokens
        for s in range(3)
    ]
    assert any(tokens != alone for tokens in others)  # it does sample
