"""Decoding from a prefix (what passes over the speech so far agreed on), with the exported
networks in-process: the transcript is Whisper's own where the prefix is, and starts with
the prefix where it is not."""

from __future__ import annotations

import pytest

from avatar.asr.agreement import whole_words
from avatar.asr.transcribe import AsrOptions, transcribe

SERVED = AsrOptions(window_step=100, window_margin=300)


@pytest.fixture(scope="module")
def whisper():
    from avatar.asr.onnx_runtime import DECODER_STEP_FILE, OnnxWhisperRuntime
    from avatar.asr.vocab import WhisperVocab
    from export.asr.weights import packaged_ct2_dir
    from export.registry import ensure_all

    folders = ensure_all(["asr_encoder", "asr_decoder"])
    runtime = OnnxWhisperRuntime(
        folders["asr_encoder"] / "model.onnx", folders["asr_decoder"] / DECODER_STEP_FILE
    )
    ct2 = packaged_ct2_dir()
    return runtime, WhisperVocab.load(ct2 / "tokenizer.json", ct2 / "config.json")


def test_a_prefix_of_whispers_own_words_changes_nothing_and_saves_steps(whisper):
    from evals.clips import clips

    runtime, vocab = whisper
    audios = [c.audio for c in clips(3)]
    plain = transcribe(runtime, vocab, audios, SERVED)
    prefixes = [whole_words(t.tokens[: len(t.tokens) // 2 + 2], vocab) for t in plain]
    assert all(prefixes) and len({len(p) for p in prefixes}) > 1  # lockstep groups differ
    forced = transcribe(runtime, vocab, audios, SERVED, prefixes)
    for a, b, prefix in zip(plain, forced, prefixes, strict=True):
        assert b.text == a.text and b.tokens == a.tokens
        assert b.tokens[: len(prefix)] == prefix


def test_a_wrong_prefix_is_kept_and_decoding_goes_on_after_it(whisper):
    from avatar.asr.vocab import _tokenizer
    from evals.clips import clips

    runtime, vocab = whisper
    clip = clips(1)[0]  # "Hello, how are you today?"
    words = _tokenizer(str(vocab.tokenizer_path)).encode(" Goodbye", add_special_tokens=False)
    prefix = [vocab.timestamp_begin, *words.ids]
    result = transcribe(runtime, vocab, [clip.audio], SERVED, [prefix])[0]
    assert result.text.startswith("Goodbye") and len(result.text) > len("Goodbye")


def test_a_row_whose_caller_gave_up_stops_and_the_others_are_unchanged(whisper):
    """The `asr` model's cancellation (a live pass the gateway no longer needs): the row
    stops at the next decoder step and frees its place; the other rows decode as alone."""
    from evals.clips import clips

    runtime, vocab = whisper
    audios = [c.audio for c in clips(3)]
    plain = transcribe(runtime, vocab, audios, SERVED)
    asked = [0, 0, 0]

    def check(row: int, after: int):
        def cancelled() -> bool:
            asked[row] += 1
            return asked[row] > after

        return cancelled

    checks = [check(0, 10**6), check(1, 4), check(2, 0)]
    results = transcribe(runtime, vocab, audios, SERVED, cancelled=checks)
    assert not results[0].cancelled and results[0].tokens == plain[0].tokens
    assert results[1].cancelled and len(results[1].tokens) < len(plain[1].tokens)
    assert results[2].cancelled and results[2].tokens == [] and results[2].text == ""
    assert asked[1] == 5  # asked before each step: it stopped at the first True
