"""The exported `tts_vits` graph through avatar/tts, under ONNX Runtime (real voice, real audio).

The first run builds the artifact (verified against the original graph, ~15-40 s); later
runs find it in the cache.
"""

from __future__ import annotations

import numpy as np
import pytest

from avatar.tts import Controls, Phonemizer, Synthesizer, onnx_infer, packaged_voice, prepare
from avatar.tts.synth import batch_inputs
from export.common import ensure, onnx_session
from export.sidecar import Sidecar
from export.tts.recipe import VitsRecipe

# Not used while developing (see export/tts/recipe.py and export/tts/report.py for the others).
SENTENCES = (
    "Quiet streets filled with music once the festival started.",
    "Is the blue notebook yours?",
    "Every Tuesday, the old ferry crosses the bay twice, weather permitting.",
    "Stop!",
)


@pytest.fixture(scope="module")
def artifact():
    return ensure(VitsRecipe())


@pytest.fixture(scope="module")
def synth(artifact):
    voice = packaged_voice()
    session = onnx_session(artifact / "model.onnx", threads=2)
    return Synthesizer(Phonemizer(voice.config), onnx_infer(session))


def test_sidecar_records_the_verification(artifact):
    sidecar = Sidecar.load(artifact)
    assert [t.name for t in sidecar.inputs] == [
        "phoneme_ids", "phoneme_lengths", "scales", "noise_phonemes", "noise_frames"
    ]  # fmt: skip
    assert [t.name for t in sidecar.outputs] == ["audio", "audio_lengths", "durations"]
    assert sidecar.opset == 15 and sidecar.batch_axis == 0
    assert sidecar.validation["outputs"]["audio"]["max_abs"] <= 1e-5
    assert sidecar.validation["batched_vs_alone"]["durations"]["max_abs"] == 0


def test_paragraph_gives_audio_and_timings_per_sentence(synth):
    controls = Controls.defaults(synth.config, seed=1)
    results = list(synth.stream(" ".join(SENTENCES[:3]), controls))
    assert [r.text for r in results] == list(SENTENCES[:3])
    for r in results:
        assert r.sample_rate == 22050 and r.audio.dtype == np.float32
        assert np.isfinite(r.audio).all() and np.abs(r.audio).max() <= 1.0
        assert np.sqrt(np.mean(r.audio**2)) > 0.01, "audio is (nearly) silent"
        # phoneme timing covers the audio exactly (one frame = 256 samples)
        assert abs(r.ends[-1] * r.sample_rate - r.audio.size) < 1.0
        assert r.phonemes[0] == "^" and r.phonemes[-1] == "$"
        assert np.all(r.ends >= r.starts) and np.allclose(r.starts[1:], r.ends[:-1])
    assert results[1].audio.size < results[2].audio.size  # short question, long sentence


def test_seed_reproducible(synth):
    chunk = prepare(SENTENCES[1], synth.phonemizer).chunks
    a = synth.synthesize_chunks(chunk, Controls.defaults(synth.config, seed=5))[0].audio
    b = synth.synthesize_chunks(chunk, Controls.defaults(synth.config, seed=5))[0].audio
    c = synth.synthesize_chunks(chunk, Controls.defaults(synth.config, seed=6))[0].audio
    assert np.array_equal(a, b)
    assert a.size != c.size or not np.allclose(a, c, atol=1e-3)


def test_length_scale_slows_speech(synth):
    chunk = prepare(SENTENCES[0], synth.phonemizer).chunks
    quiet = {"noise_scale": 0.0, "noise_w": 0.0}
    normal = synth.synthesize_chunks(chunk, Controls.defaults(synth.config, **quiet))[0]
    slow = synth.synthesize_chunks(
        chunk, Controls.defaults(synth.config, length_scale=1.5, **quiet)
    )[0]
    assert 1.35 < slow.audio.size / normal.audio.size < 1.65


def test_four_sentences_batched_equal_one_at_a_time(synth):
    """Different lengths, padded into one batch, each with its own seed."""
    chunks = [prepare(s, synth.phonemizer).chunks[0] for s in SENTENCES]
    controls = [Controls.defaults(synth.config, seed=20 + k) for k in range(4)]
    infer = synth.infer
    together = infer(batch_inputs([c.ids for c in chunks], controls, pad_to=64))
    assert together["audio"].shape[0] == 4
    for k, (chunk, c) in enumerate(zip(chunks, controls, strict=True)):
        alone = infer(batch_inputs([chunk.ids], [c]))
        n = int(alone["audio_lengths"][0, 0])
        assert int(together["audio_lengths"][k, 0]) == n
        assert np.array_equal(together["durations"][k, : len(chunk.ids)], alone["durations"][0])
        np.testing.assert_allclose(together["audio"][k, :n], alone["audio"][0, :n], atol=1e-3)
        assert not together["audio"][k, n:].any()


def test_transcript_contains_the_words(synth):
    """Intelligibility on real audio: faster-whisper on the packaged Whisper base."""
    from evals.reference_asr import speech_transcriber
    from evals.wer import word_errors
    from export.asr.weights import packaged_ct2_dir

    text = "Please bring three green apples to the kitchen."
    result = synth.synthesize_chunks(
        prepare(text, synth.phonemizer).chunks, Controls.defaults(synth.config, seed=2)
    )[0]
    heard = speech_transcriber(packaged_ct2_dir())(result.audio, result.sample_rate)
    errors, _ = word_errors(text, heard)
    assert errors <= 1, f"heard {heard!r}"
