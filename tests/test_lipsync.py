"""Lipsync without a server: labels, decoding to the TTS path's animation, the verified
export, and accuracy on held-out TTS sentences against their phoneme timings."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from avatar.animation import AnimationConfig, animate
from avatar.animation.lipsync import animate_probs, decode_segments
from avatar.animation.tables import VISEMES
from avatar.errors import RequestError
from evals.lipsync import (
    Augment,
    Scores,
    Utterance,
    augment,
    frame_targets,
    label_segments,
    score_clip,
)
from export.common import ensure, onnx_session
from export.config_check import check_against_sidecar
from export.lipsync.recipe import OUTPUTS, LipsyncRecipe, example_audio, expected_specs, reference
from export.sidecar import Sidecar
from model_configs.pbtxt import parse_config

CONFIG = Path(__file__).resolve().parent.parent / "model_repository/lipsync/config.pbtxt"
# Held-out: none of these is in emotion_sentences.json's 'train' split.
HELDOUT = (
    "Maybe a big problem, please.",
    "Bob bought a map of the moon in May.",
    "Could you open the window a little?",
    "We walked home slowly after the football match.",
)


def _utterance(phonemes: list[tuple[str, float, float]], seconds: float) -> Utterance:
    symbols, starts, ends = zip(*phonemes, strict=True)
    audio = np.zeros(round(seconds * 22050), np.float32)
    return Utterance("x", audio, 22050, symbols, np.array(starts), np.array(ends))


def test_labels_follow_the_phoneme_timings() -> None:
    utt = _utterance([("^", 0, 0.1), ("m", 0.1, 0.2), ("ɑ", 0.2, 0.4), ("$", 0.4, 0.5)], 0.5)
    labels, opening = frame_targets(utt, 51)
    names = [VISEMES[i] for i in labels]
    assert names[:10] == ["sil"] * 10 and names[10:20] == ["PP"] * 10
    assert names[20:40] == ["aa"] * 20 and names[40:] == ["sil"] * 11
    assert opening[12] < 0.02 and opening[30] > 0.3, "closed on m, open on ɑ"
    stretched, _ = frame_targets(utt, 101, scale=2.0)  # audio played at half speed
    assert [VISEMES[i] for i in stretched[40:80]] == ["aa"] * 40


def test_decoding_drops_blips_and_keeps_closures() -> None:
    labels = np.array([0] * 20 + [1] * 6 + [10] * 2 + [1] * 1 + [10] * 20 + [0] * 10)
    probs = np.full((len(labels), 15), 0.01)
    probs[np.arange(len(labels)), labels] = 0.9
    segments = decode_segments(probs, smooth_frames=1, min_duration=0.03)
    assert [s.viseme for s in segments] == ["sil", "PP", "aa", "sil"]
    assert segments[1].start == pytest.approx(0.195) and segments[-1].end == pytest.approx(0.58)
    with pytest.raises(RequestError, match="expected \\[frames, 15\\]"):
        decode_segments(np.zeros((10, 14)))


def test_true_visemes_give_the_tts_paths_animation() -> None:
    """One-hot probabilities of the true labels animate like the phoneme timings do."""
    timings = [("^", 0, 0.2), ("m", 0.2, 0.3), ("ɑ", 0.3, 0.55), ("p", 0.55, 0.62),
               ("i", 0.62, 0.8), ("$", 0.8, 1.0)]  # fmt: skip
    utt = _utterance(timings, 1.0)
    labels, _ = frame_targets(utt, 101)
    config = AnimationConfig(fps=30, blinks=False)
    from_audio = animate_probs(np.eye(15)[labels], config)
    from_text = animate([(".", 0, 0.2), *timings[1:5], (".", 0.8, 1.0)], config)
    assert from_audio.blendshapes.shape == from_text.blendshapes.shape == (31, 52)
    assert np.mean(from_audio.closed == from_text.closed) >= 0.9
    assert np.abs(from_audio.blendshapes - from_text.blendshapes).mean() < 0.01


@pytest.fixture(scope="module")
def artifact() -> Path:
    return ensure(LipsyncRecipe())


def test_export_matches_torch_at_new_shapes(artifact: Path) -> None:
    sidecar = Sidecar.load(artifact)
    assert (sidecar.inputs, sidecar.outputs) == expected_specs()
    for name in OUTPUTS:
        assert sidecar.validation["outputs"][name]["max_abs"] <= 2e-4
    check_against_sidecar(parse_config(CONFIG), sidecar)  # the served names and dims
    session = onnx_session(artifact / "model.onnx")
    audio = example_audio(2, 12_345, seed=99)
    got = session.run(list(OUTPUTS), {"audio": audio})
    want = reference(audio)
    assert got[0].shape == (2, 12_345 // 160 + 1, 15)
    np.testing.assert_allclose(got[0], want["viseme_probs"], atol=2e-4)
    np.testing.assert_allclose(got[1], want["mouth_open"], atol=2e-4)
    np.testing.assert_allclose(got[0].sum(-1), 1.0, atol=1e-5)


@pytest.fixture(scope="module")
def heldout_speech() -> list[Utterance]:
    from export.tts.utterances import speak

    return speak(list(HELDOUT), variants=1, varied=False)


def test_accuracy_on_heldout_tts_sentences(artifact: Path, heldout_speech) -> None:
    session = onnx_session(artifact / "model.onnx")
    scores, majority = Scores(), []
    for utt in heldout_speech:
        audio, scale = augment(utt, Augment(), np.random.default_rng(0))
        (probs,) = session.run(["viseme_probs"], {"audio": audio[None]})
        score_clip(scores, probs[0], utt, scale, fps=30.0)
        truth, _ = frame_targets(utt, probs.shape[1], scale)
        majority.append(np.bincount(truth, minlength=15).max() / len(truth))
    # Floors well above chance (the most frequent viseme of a clip covers ~25-40 %).
    assert scores.accuracy > max(0.6, float(np.mean(majority)) + 0.25), scores.accuracy
    assert scores.collapsed_accuracy > 0.75
    assert scores.closed_f1 > 0.8, "mouth closures (pauses, p/b/m) not found"
    onsets = np.abs(scores.onsets_100hz)
    assert len(onsets) >= 0.8 * (len(onsets) + scores.onset_misses)
    assert np.median(onsets) <= 3, "mouth opens > 30 ms away from the phoneme timing"
    assert np.mean(np.abs(scores.onsets_fps) <= 1.0) >= 0.8


def test_int8_variant_keeps_the_visemes(artifact: Path, heldout_speech) -> None:
    """The served INT8 graph's gate, recomputed on other held-out sentences: frame accuracy
    within 1 point of FP32's, p/b/m closures kept, and it is the graph the CPU serves."""
    from export.lipsync.int8 import VARIANT_FILE
    from serving.served import served_onnx

    record = Sidecar.load(artifact).validation["variants"][VARIANT_FILE]
    assert record["passes_gate"] and record["faster"], record
    assert served_onnx("lipsync") == artifact / VARIANT_FILE
    scores = {}
    for name in ("model.onnx", VARIANT_FILE):
        session, score = onnx_session(artifact / name), Scores()
        for utt in heldout_speech:
            audio, scale = augment(utt, Augment(snr_db=15.0), np.random.default_rng(0))
            (probs,) = session.run(["viseme_probs"], {"audio": audio[None]})
            score_clip(score, probs[0], utt, scale, fps=30.0)
        scores[name] = score
    fp32, int8 = scores["model.onnx"], scores[VARIANT_FILE]
    assert int8.accuracy >= fp32.accuracy - 0.01, (int8.accuracy, fp32.accuracy)
    assert int8.bilabials_closed >= fp32.bilabials_closed - 1


def test_mouth_closes_on_bilabials_of_heldout_speech(artifact: Path, heldout_speech) -> None:
    """Most p/b/m are found closed, and most closures found are real p/b/m or pauses."""
    session = onnx_session(artifact / "model.onnx")
    found, real, bilabials, closures = 0, 0, 0, 0
    for utt in heldout_speech:
        audio, scale = augment(utt, Augment(), np.random.default_rng(0))
        (probs,) = session.run(["viseme_probs"], {"audio": audio[None]})
        predicted = [s for s in decode_segments(probs[0]) if s.viseme == "PP"]
        truth = label_segments(utt, scale)
        closed = [s for s in truth if s.viseme in ("PP", "sil")]
        for seg in (s for s in truth if s.viseme == "PP"):
            bilabials += 1
            found += any(p.start < seg.end and seg.start < p.end for p in predicted)
        for seg in predicted:
            closures += 1
            real += any(c.start < seg.end and seg.start < c.end for c in closed)
    assert bilabials >= 15 and closures >= 10
    # held-out set (105 sentences, python -m training.lipsync.train --evaluate): 85 % and 86 %
    assert found / bilabials >= 0.65, f"{found} of {bilabials} p/b/m found"
    assert real / closures >= 0.75, f"{closures - real} of {closures} closures are not p/b/m"


def test_espeak_voice_gives_audio_and_phoneme_timings() -> None:
    """The second synthesizer (evaluation's unseen voices) yields timed IPA phonemes."""
    from training.lipsync.espeak import _name, speak

    assert _name("ɑː".encode() + b"\x17\xfe\x01D") == "ɑː"  # stale bytes after the name
    (utt,) = speak(["Bob bought a map."], ("en-us+m7",))
    assert utt.rate == 22050 and 0.5 < utt.duration < 2.0
    assert np.sqrt(np.mean(utt.audio**2)) > 0.01
    assert utt.phonemes[0] == "." and utt.ends[-1] == pytest.approx(utt.duration)
    assert np.all(np.diff(utt.starts) >= 0) and np.allclose(utt.starts[1:], utt.ends[:-1])
    visemes = [s.viseme for s in label_segments(utt)]
    assert visemes.count("PP") >= 3 and visemes[0] == "sil" and visemes[-1] == "sil"
