"""avatar.asr without any model run: features, vocabulary, logit rules, segments, input checks."""

from __future__ import annotations

import numpy as np
import pytest

from avatar.asr.features import N_FRAMES, log_mel, pad_or_trim
from avatar.asr.long_form import plan_pieces
from avatar.asr.rules import apply_rules
from avatar.asr.transcribe import check_audio, split_segments, window_frames
from avatar.asr.vocab import WhisperVocab
from avatar.errors import RequestError


@pytest.fixture(scope="module")
def vocab() -> WhisperVocab:
    from export.asr.weights import packaged_ct2_dir

    folder = packaged_ct2_dir()
    return WhisperVocab.load(folder / "tokenizer.json", folder / "config.json")


@pytest.fixture(scope="module")
def speech() -> np.ndarray:
    from evals.clips import synthesize

    return synthesize("What time does the museum open on Sunday?")


def test_log_mel_matches_faster_whisper_and_transformers(speech):
    from faster_whisper.feature_extractor import FeatureExtractor
    from transformers import WhisperFeatureExtractor

    mel = log_mel(speech)
    reference = FeatureExtractor()(speech)
    assert mel.shape == reference.shape == (80, (len(speech) + 160) // 160)
    assert np.abs(mel - reference).max() < 1e-5
    full = log_mel(np.pad(speech, (0, 16000 * 30 - len(speech))), padding=0)
    hf = WhisperFeatureExtractor()(speech, sampling_rate=16000, return_tensors="np")
    assert np.abs(full - hf.input_features[0]).max() < 5e-5
    assert pad_or_trim(mel).shape == (80, N_FRAMES)
    assert np.all(pad_or_trim(mel)[:, mel.shape[1] :] == 0)


def test_vocab_matches_faster_whisper(vocab):
    import tokenizers
    from faster_whisper.tokenizer import Tokenizer
    from faster_whisper.transcribe import get_suppressed_tokens

    hf = tokenizers.Tokenizer.from_file(str(vocab.tokenizer_path))
    reference = Tokenizer(hf, True, "transcribe", "en")
    assert vocab.suppress == tuple(get_suppressed_tokens(reference, [-1]))
    assert vocab.timestamp_begin == reference.timestamp_begin == 50364
    assert len(vocab.languages) == 99 and vocab.language_id("zh") == 50260
    assert (
        vocab.decode([50364, 2425, 11, 577, 366, 291, 965, 30, 50438])
        == " Hello, how are you today?"
    )
    with pytest.raises(RequestError, match="unknown language 'xx'"):
        vocab.language_id("xx")


def _flat(vocab: WhisperVocab, rows: int = 1) -> np.ndarray:
    return np.zeros((rows, 51865), np.float32)


def test_first_step_forces_an_early_timestamp(vocab):
    ts = vocab.timestamp_begin
    logits = _flat(vocab)
    logits[0, 440] = 50.0  # a text token would win without the rules
    masked = apply_rules(logits, [[]], vocab, True)
    assert masked[0].argmax() >= ts
    assert np.all(np.isinf(masked[0, :ts])) and np.all(np.isinf(masked[0, ts + 51 :]))
    assert np.isfinite(masked[0, ts + 50])


def test_timestamps_pair_and_never_decrease(vocab):
    ts = vocab.timestamp_begin
    logits = _flat(vocab, 3)
    logits[1, vocab.eot] = 20.0  # more likely than all timestamps together
    sampled = [[ts + 10, 440], [ts + 10, 440, ts + 30], [ts + 10, 440, ts + 30, ts + 30]]
    masked = apply_rules(logits, sampled, vocab, False)
    assert np.all(np.isinf(masked[0, ts : ts + 11])) and np.isfinite(masked[0, ts + 11])
    assert np.all(np.isinf(masked[1, : vocab.eot])) and np.isfinite(masked[1, vocab.eot])
    assert np.isfinite(masked[1, ts + 30])  # closing a segment at the same time is allowed
    assert np.all(np.isinf(masked[2, ts:]))  # after a pair: text or end
    assert np.all(np.isinf(masked[:, vocab.no_timestamps]))
    assert np.all(np.isinf(masked[:, list(vocab.suppress)]))


def test_split_segments_like_faster_whisper(vocab):
    ts = vocab.timestamp_begin
    tokens = [ts, 1000, 1001, ts + 50, ts + 50, 1002, ts + 100]
    segments, seek = split_segments(tokens, vocab, offset=2.0, size=1500, seek=200)
    assert [(s, e) for s, e, _ in segments] == [(2.0, 3.0), (3.0, 4.0)]
    assert seek == 200 + 1500  # single timestamp ending: the whole window is consumed
    segments, seek = split_segments([*tokens[:5], 1002], vocab, 0.0, 3000, 0)
    assert len(segments) == 1 and seek == 100  # unfinished segment: resume at 1.0 s
    segments, seek = split_segments([1000, 1001], vocab, 0.0, 250, 0)
    assert segments == [(0.0, 2.5, [1000, 1001])] and seek == 250


@pytest.mark.parametrize(
    ("audio", "rate", "message"),
    [
        (np.zeros(0, np.float32), 16000, "empty"),
        (np.array([0.1, np.nan, 0.2], np.float32), 16000, "NaN or Inf"),
        (np.array([0.1, np.inf], np.float32), 16000, "NaN or Inf"),
        (np.zeros((2, 100), np.float32), 16000, r"shape \[2, 100\]"),
        (np.zeros(100, np.int16), 16000, "dtype int16"),
        (np.zeros(16000 * 600, np.float32), 16000, "600.0 s long; at most 300 s"),
        (np.zeros(7000, np.float32), 7000, "7000 Hz is not supported"),
    ],
)
def test_bad_audio_is_refused_with_a_reason(audio, rate, message):
    with pytest.raises(RequestError, match=message):
        check_audio(audio, rate)


def test_other_rates_are_resampled():
    tone = np.sin(2 * np.pi * 440 * np.arange(44100) / 44100).astype(np.float32)
    out = check_audio(tone[None, :], 44100)
    assert out.dtype == np.float32 and out.shape == (16000,)
    spectrum = np.abs(np.fft.rfft(out))
    assert abs(int(spectrum.argmax()) - 440) <= 1  # 1-Hz bins over one second


def test_long_audio_is_cut_in_pauses_into_windows():
    speech = [(0.5, 10.0), (10.5, 25.0), (26.0, 40.0), (41.0, 75.0), (76.0, 77.0)]
    pieces = plan_pieces(speech, duration=80.0, max_s=30.0, pad_s=0.2)
    # the first two join (24.9 s); 34.2 s without a pause stays one piece (never truncated)
    expected = [(0.3, 25.2), (25.8, 40.2), (40.8, 75.2), (75.8, 77.2)]
    assert np.allclose(pieces, expected)
    assert plan_pieces([(0.0, 10.0), (10.1, 20.0)], 20.0, max_s=15.0) == [
        (0.0, 10.05),
        (10.05, 20.0),
    ]
    assert plan_pieces([], 10.0) == []


def test_long_audio_is_transcribed_at_most_max_batch_pieces_at_a_time(monkeypatch):
    """Was: every piece in one batch, past max_batch_size 8 beyond ~240 s (review)."""
    from avatar.asr import long_form
    from avatar.asr.transcribe import Segment, Transcript

    calls: list[int] = []

    def fake_transcribe(runtime, vocab, clips, options):
        calls.append(len(clips))
        return [
            Transcript(f" piece{len(calls)}.{i}", "en", 1.0, [Segment(0.0, 1.0, f" p{i}")], 1.0)
            for i in range(len(clips))
        ]

    monkeypatch.setattr(long_form, "transcribe", fake_transcribe)
    speech = [(40.0 * k, 40.0 * k + 25.0) for k in range(10)]  # 400 s, a pause every 40 s
    audio = np.zeros(400 * 16000, np.float32)
    result = long_form.transcribe_long(None, None, audio, speech, max_batch=8)
    assert calls == [8, 2]
    assert [round(s.start) for s in result.segments] == [round(40 * k - 0.2) for k in range(10)]


def test_windows_in_proportion_to_the_audio_keep_a_margin_of_silence():
    assert window_frames(250, None) == N_FRAMES  # the first release: always 30 s
    assert window_frames(250, 100, 300) == 600  # 2.5 s + 3 s margin, whole seconds
    assert window_frames(300, 100, 300) == 600
    assert window_frames(301, 100, 300) == 700
    assert window_frames(2900, 100, 300) == N_FRAMES  # never beyond one window


def test_wer_ignores_case_punctuation_and_digits_vs_words():
    from evals.wer import corpus_wer, wer

    assert wer("ten of clubs", "10 of Clubs.") == 0.0
    assert wer("he was not an ill disposed young man", "He was not an ill-disposed man.") == 1 / 8
    assert corpus_wer(["a b c d", "e"], ["a b c d", "x"]) == 1 / 5


def test_a_pass_over_the_first_seconds_is_scored_against_the_closest_start():
    from evals.wer import prefix_errors

    said = "what time does the museum open on sunday"
    assert prefix_errors(said, "What time does") == (0, 3)  # the words said so far: no error
    assert prefix_errors(said, "what time is the") == (1, 4)  # one substitution
    assert prefix_errors(said, "") == (0, 0)
    assert prefix_errors("a a", "a") == (0, 1)  # the first word said, not "a a" one short


def test_passes_agree_on_whole_words_only(vocab):
    from avatar.asr.agreement import check_prefix, common_prefix, whole_words
    from avatar.asr.vocab import _tokenizer

    def ids(text: str) -> list[int]:
        return _tokenizer(str(vocab.tokenizer_path)).encode(text, add_special_tokens=False).ids

    ts = vocab.timestamp_begin
    earlier = [ts, *ids(" And Mr. John Dash")]
    later = [ts, *ids(" And Mr. John Dashwood had"), ts + 90]
    agreed = common_prefix(earlier, later)
    assert agreed == earlier  # " Dash" is a token of both, but not a word both heard
    assert vocab.decode(whole_words(agreed, vocab)) == " And Mr. John"
    assert vocab.decode(whole_words(later, vocab)) == " And Mr. John Dashwood"
    assert whole_words([ts], vocab) == [] and common_prefix([1, 2], [2, 1]) == []
    assert check_prefix(np.array(agreed), vocab) == agreed
    for bad, message in [
        ([vocab.sot, *ids(" Hi")], "not text or timestamp tokens"),
        (ids(" Hi there"), "begin with a timestamp"),
        ([ts] * 113, "at most 112"),
    ]:
        with pytest.raises(RequestError, match=message):
            check_prefix(bad, vocab)
