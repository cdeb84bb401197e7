"""Unit tests of avatar.animation: tables, segments, coarticulation, closures, onsets."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from avatar.animation import AnimationConfig, animate, phonemes_to_segments, tables
from avatar.animation.emotion import mouth_opening
from avatar.animation.metrics import closure_violations, onset_errors
from avatar.animation.timing import phonemize, synthetic_timings
from avatar.errors import RequestError

SENTENCES = [
    "Hello world. Maybe a big problem, please?",
    "My mom bought a bright blue umbrella at the market on Monday.",
    "Please stop by, mister Bob, and bring me a map.",
    "People expect a happy, bubbly summer by the beach!",
]


def test_tables_cover_arkit_and_visemes():
    assert len(tables.ARKIT_NAMES) == 52 == len(set(tables.ARKIT_NAMES))
    assert tables.ARKIT_NAMES[:2] == ("eyeBlinkLeft", "eyeLookDownLeft")
    assert tables.ARKIT_NAMES[-1] == "tongueOut"
    assert len(tables.VISEMES) == 15
    assert set(tables.VISEME_TO_ARKIT) == set(tables.VISEMES)
    assert set(tables.PHONEME_TO_VISEME.values()) <= set(tables.VISEMES)
    for weights in [*tables.VISEME_TO_ARKIT.values(), *tables.AU_TO_ARKIT.values()]:
        assert set(weights) <= set(tables.ARKIT_NAMES)
        assert all(0.0 <= w <= 1.0 for w in weights.values())
    for aus in tables.EMOTION_TO_AU.values():
        assert set(aus) <= set(tables.AU_TO_ARKIT)


def test_every_espeak_symbol_of_real_text_is_handled():
    symbols = set(phonemize(" ".join(SENTENCES) + " Thanks, George; the judge's vision was huge."))
    known = set(tables.PHONEME_TO_VISEME) | set(tables.MODIFIERS) | tables.PUNCTUATION
    assert symbols - known == set()


def test_segments_merge_modifiers_and_pauses():
    symbols = ["h", "ə", "l", "ˈ", "o", "ʊ", " ", "w", "ˈ", "ɜ", "ː", "l", "d", "."]
    timings = synthetic_timings(symbols, seed=1)
    segments = phonemes_to_segments(timings)
    assert [s.viseme for s in segments] == ["sil", "E", "nn", "oh", "ou", "E", "nn", "DD", "sil"]
    stress = next(t for t in timings if t.symbol == "ˈ")
    assert segments[3].start == stress.start  # the stress mark opens its vowel's segment
    assert all(a.end == b.start for a, b in itertools.pairwise(segments))
    assert segments[-1].end == timings[-1].end


def test_long_word_gap_is_a_pause_short_one_is_not():
    base = [("m", 0.0, 0.1), ("a", 0.1, 0.2), (" ", 0.2, 0.22), ("a", 0.22, 0.3)]
    assert "sil" not in [s.viseme for s in phonemes_to_segments(base)[1:]]
    long_gap = [("m", 0.0, 0.1), ("a", 0.1, 0.2), (" ", 0.2, 0.5), ("a", 0.5, 0.6)]
    assert [s.viseme for s in phonemes_to_segments(long_gap)] == ["PP", "aa", "sil", "aa"]


@pytest.mark.parametrize("fps", [25, 30, 60])
@pytest.mark.parametrize("alpha", [0.5, 0.9])
def test_mouth_onset_error_within_one_frame(fps, alpha):
    errors = []
    for i, text in enumerate(SENTENCES):
        config = AnimationConfig(fps=fps, alpha=alpha, seed=i)
        errors.extend(onset_errors(animate(synthetic_timings(phonemize(text), seed=i), config)))
    errors = np.asarray(errors)
    assert len(errors) >= 20
    assert np.abs(errors).max() <= 1.0, f"onset errors (frames): max {errors.max():.2f}"


def test_plain_ema_would_delay_onsets():
    """The measurement detects the lag the attack/release asymmetry removes."""
    text = SENTENCES[2]
    config = AnimationConfig(fps=30, alpha=0.9, attack=0.9)
    errors = onset_errors(animate(synthetic_timings(phonemize(text)), config))
    assert errors.max() > 1.0


@pytest.mark.parametrize("emotion", ["neutral", "surprised", "happy", "afraid"])
def test_lips_close_on_bilabials_and_pauses_with_any_emotion(emotion):
    text = "Maybe a big problem, please."
    timings = synthetic_timings(phonemize(text), seed=3)
    anim = animate(timings, AnimationConfig(fps=30, alpha=0.9, emotion=emotion, intensity=1.0))
    assert len(closure_violations(anim)) == 0
    opening = mouth_opening(anim.blendshapes)
    for seg in anim.segments:
        frames = (anim.times >= seg.start) & (anim.times < seg.end)
        if seg.viseme == "PP":  # every p/b/m shows at least one closed frame
            near = np.argmin(np.abs(anim.times - seg.center))
            assert opening[near] <= 0.02
        elif seg.viseme in ("aa", "oh") and frames.sum() >= 3:
            assert opening[frames].max() > 0.3, seg


def test_emotion_shows_where_lips_allow():
    timings = synthetic_timings(phonemize(SENTENCES[0]))
    plain = animate(timings, AnimationConfig(emotion="neutral"))
    happy = animate(timings, AnimationConfig(emotion="happy", intensity=0.8))
    smile = tables.ARKIT_INDEX["mouthSmileLeft"]
    assert happy.blendshapes[:, smile].mean() > plain.blendshapes[:, smile].mean() + 0.3
    assert happy.blendshapes.min() >= 0.0 and happy.blendshapes.max() <= 1.0


def test_output_shapes_and_blinks_and_head_motion_are_seeded():
    timings = synthetic_timings(phonemize(" ".join(SENTENCES[:2])), seed=0)
    a = animate(timings, AnimationConfig(fps=25, seed=7))
    b = animate(timings, AnimationConfig(fps=25, seed=7))
    c = animate(timings, AnimationConfig(fps=25, seed=8))
    t = len(a.times)
    assert a.blendshapes.shape == (t, 52) and a.visemes.shape == (t, 15)
    assert a.head_pose.shape == (t, 3) and a.blendshapes.dtype == np.float32
    np.testing.assert_allclose(a.visemes.sum(axis=1), 1.0, atol=1e-5)
    np.testing.assert_array_equal(a.blendshapes, b.blendshapes)
    assert not np.array_equal(a.head_pose, c.head_pose)
    assert len(a.blinks) >= 1
    blink = a.blendshapes[:, tables.ARKIT_INDEX["eyeBlinkLeft"]]
    assert blink.max() > 0.9 and np.median(blink) < 0.05
    assert np.abs(a.head_pose).max() < np.radians(5)
    assert np.ptp(a.head_pose[:, 0]) > np.radians(0.2)


def test_gestures_from_words_and_emotion():
    text = "Hello there, maybe we can meet tomorrow!"
    timings = synthetic_timings(phonemize(text))
    anim = animate(timings, AnimationConfig(emotion="happy", intensity=0.9), text=text)
    names = {g.name: g for g in anim.gestures}
    assert set(names) == {"wave", "shrug", "emphasis"}
    assert names["wave"].start == pytest.approx(timings[0].start)
    assert names["shrug"].start > names["wave"].start
    calm = animate(timings, AnimationConfig(emotion="happy", intensity=0.3), text="Fine.")
    assert calm.gestures == []


@pytest.mark.parametrize(
    ("config", "phonemes"),
    [
        (AnimationConfig(fps=0), [("a", 0.0, 0.1)]),
        (AnimationConfig(alpha=1.5), [("a", 0.0, 0.1)]),
        (AnimationConfig(emotion="bored"), [("a", 0.0, 0.1)]),
        (AnimationConfig(intensity=2.0, emotion="sad"), [("a", 0.0, 0.1)]),
        (AnimationConfig(), [("a", 0.2, 0.1)]),
        (AnimationConfig(), [("a", 0.5, 0.6), ("b", 0.1, 0.2)]),
    ],
)
def test_bad_requests_raise_request_error(config, phonemes):
    with pytest.raises(RequestError):
        animate(phonemes, config)


def test_write_png_is_lossless(tmp_path):
    import av

    from avatar.animation.video import write_png

    image = (np.random.default_rng(0).random((37, 53, 3)) * 255).astype(np.uint8)
    path = write_png(tmp_path / "frame.png", image)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with av.open(str(path)) as container:
        decoded = next(container.decode(video=0)).to_ndarray(format="rgb24")
    assert np.array_equal(decoded, image)
