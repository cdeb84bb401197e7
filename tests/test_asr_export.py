"""The ASR export: CT2 -> transformers conversion, ONNX artifacts and their sidecars, and
transcripts through ONNX Runtime identical to faster-whisper on real (Piper) speech."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from avatar.asr.onnx_runtime import DECODER_STEP_FILE, OnnxWhisperRuntime
from avatar.asr.transcribe import transcribe
from avatar.asr.vocab import WhisperVocab
from evals.clips import Clip, clips, long_clip
from evals.reference_asr import reference_transcripts as _reference_transcripts
from evals.wer import wer
from export.asr.weights import packaged_ct2_dir
from export.common import cache_root

ROOT = Path(__file__).resolve().parent.parent


def reference_transcripts(items: list[Clip]) -> list[str]:
    """faster-whisper's transcripts of `items` by the packaged Whisper base (the ASR export's
    reference, cached under the artifact cache)."""
    return _reference_transcripts(items, packaged_ct2_dir(), cache_root())


@pytest.fixture(scope="module")
def artifacts() -> tuple[Path, Path]:
    from export.asr.recipe import build_all

    return build_all()


@pytest.fixture(scope="module")
def vocab() -> WhisperVocab:
    from export.asr.weights import packaged_ct2_dir

    folder = packaged_ct2_dir()
    return WhisperVocab.load(folder / "tokenizer.json", folder / "config.json")


@pytest.fixture(scope="module")
def runtime(artifacts) -> OnnxWhisperRuntime:
    encoder, decoder = artifacts
    return OnnxWhisperRuntime(encoder / "model.onnx", decoder / DECODER_STEP_FILE, threads=2)


@pytest.fixture(scope="module")
def speech():
    return clips(6)


def test_ct2_variables_map_onto_transformers():
    import torch

    from export.asr.weights import load_whisper, packaged_ct2_dir, read_ct2_variables

    variables = read_ct2_variables(packaged_ct2_dir() / "model.bin")
    model = load_whisper()
    state = model.state_dict()
    q = variables["decoder/layer_3/self_attention/linear_0/weight"][:512].astype(np.float32)
    assert torch.equal(state["model.decoder.layers.3.self_attn.q_proj.weight"], torch.from_numpy(q))
    v = variables["decoder/layer_2/attention/linear_1/weight"][512:].astype(np.float32)
    assert torch.equal(
        state["model.decoder.layers.2.encoder_attn.v_proj.weight"], torch.from_numpy(v)
    )
    assert model.proj_out.weight.data_ptr() == model.model.decoder.embed_tokens.weight.data_ptr()
    assert model.generation_config.lang_to_id["<|en|>"] == 50259
    assert model.config.encoder_layers == model.config.decoder_layers == 6


# `extended`: the conversion's middle step; CI checks where it leads, the ONNX transcripts
# equal to faster-whisper's (test_onnx_transcripts_equal_faster_whisper)
@pytest.mark.extended
def test_transformers_model_transcribes_like_faster_whisper(speech):
    import torch
    from transformers import WhisperFeatureExtractor

    from export.asr.weights import load_whisper

    model = load_whisper()
    clip = speech[1]
    features = WhisperFeatureExtractor()(clip.audio, sampling_rate=16000, return_tensors="pt")
    with torch.no_grad():
        tokens = model.generate(features.input_features, return_timestamps=True, task="transcribe")
    from tokenizers import Tokenizer

    from export.asr.weights import packaged_ct2_dir

    text = Tokenizer.from_file(str(packaged_ct2_dir() / "tokenizer.json")).decode(
        tokens[0].tolist()
    )
    assert text.strip() == reference_transcripts([clip])[0]


def test_sidecars_and_configs_agree(artifacts):
    from export.config_check import check_against_sidecar
    from export.sidecar import Sidecar
    from model_configs.pbtxt import parse_config

    for folder in artifacts:
        sidecar = Sidecar.load(folder)
        assert sidecar.batch_axis == 0 and sidecar.opset == 17
        for spec in sidecar.inputs + sidecar.outputs:
            assert spec.shape[0] == "batch", spec
        checked = sidecar.validation["vs_torch"] | sidecar.validation.get("sequence_vs_step", {})
        assert set(checked) == {t.name for t in sidecar.outputs}
        config = parse_config(ROOT / "model_repository" / sidecar.model / "config.pbtxt")
        check_against_sidecar(config, sidecar)
        # the INT8 Q/DQ variant is built with each network, its gate recorded; FP16 on request
        expected = ["model.int8.onnx"] + (
            ["model.step.onnx"] if sidecar.model == "asr_decoder" else []
        )
        assert sorted(p.name for p in folder.glob("model.*.onnx")) == expected
        record = sidecar.validation["variants"]["model.int8.onnx"]
        deltas = (record["wer_delta"], record["long_form"]["wer_delta"])  # short, VAD-cut long
        assert record["passes_gate"] == (max(deltas) <= 0.01), record
        assert set(record["speed_1_thread"]) == {"batch_1", "batch_8"}
        assert (folder / "calibration.json").is_file()


def test_decoder_onnx_has_one_copy_of_the_vocabulary(artifacts):
    import onnx

    model = onnx.load(str(artifacts[1] / "model.onnx"), load_external_data=False)
    big = [i.name for i in model.graph.initializer if 51865 in i.dims]
    assert len(big) == 1, big


# `extended` (26 s, a >30-s clip in the batch): CI has the same graphs' transcripts of these
# clips equal to faster-whisper's through the served `asr`
# (tests/test_asr_triton.py::test_concurrent_transcripts_equal_faster_whisper) and the >30-s
# clip's windows there (test_long_audio_windows_and_vad)
@pytest.mark.extended
def test_onnx_transcripts_equal_faster_whisper(runtime, vocab, speech):
    items = [*speech, long_clip(clips()[:12])]
    assert items[-1].seconds > 30  # Whisper's sequential windows, never truncated
    references = reference_transcripts(items)
    batched = transcribe(runtime, vocab, [c.audio for c in items])  # lockstep, 7 utterances
    assert [t.text for t in batched] == references
    errors = [wer(clip.text, result.text) for clip, result in zip(items, batched, strict=True)]
    assert np.mean(errors) < 0.1, errors  # "7.30" for "seven thirty" counts as errors
    for clip, result in zip(items, batched, strict=True):
        assert result.language == "en"
        assert 0 <= result.segments[0].start < result.segments[-1].end <= clip.seconds + 0.5
    assert batched[-1].segments[-1].end > 30


def test_silence_gives_an_empty_transcript(runtime, vocab):
    silent, quiet_noise = np.zeros(32000, np.float32), np.zeros(16000, np.float32)
    quiet_noise[::7] = 1e-5
    for result in transcribe(runtime, vocab, [silent, quiet_noise]):
        assert result.text == "" and result.segments == []


# `extended` (17 s): the same >30-s clip cut by the vad is transcribed by the served `asr`
# in CI (tests/test_asr_triton.py::test_long_audio_windows_and_vad, segmentation=vad)
@pytest.mark.extended
def test_long_audio_cut_by_silero_vad(runtime, vocab):
    from avatar.asr.long_form import transcribe_long
    from avatar.vad import onnx_vad, speech_probabilities, speech_segments
    from export.common import onnx_session
    from export.registry import ensure_all

    clip = long_clip(clips()[:12])
    vad = onnx_session(ensure_all(["vad"])["vad"] / "model.onnx")
    probs = speech_probabilities(onnx_vad(vad), clip.audio)
    speech = [(s.start_s, s.end_s) for s in speech_segments(probs)]
    result = transcribe_long(runtime, vocab, clip.audio, speech)
    assert wer(reference_transcripts([clip])[0], result.text) < 0.1
    assert result.segments[-1].end > 30 and result.language == "en"
    starts = [s.start for s in result.segments]
    assert starts == sorted(starts)


def test_a_short_window_never_stamps_past_its_end(runtime, vocab):
    """A window in proportion to the audio holds padding after its end. Whisper once walked
    its timestamps on through it to 23.8 s on this question ("How" + 224 stamps, one decoder
    step each, ~3.5 s of ASR); timestamps past the window are now masked."""
    from avatar.asr.features import log_mel
    from avatar.asr.greedy import WhisperRuntime
    from avatar.asr.transcribe import AsrOptions, window_frames
    from avatar.audio import reference_speech

    audio = reference_speech("How much is parking in the garage?")
    options = AsrOptions(window_step=100, window_margin=300)  # model_repository/asr's
    window_s = window_frames(log_mel(audio).shape[1] - 1, 100, 300) / 100
    steps = []

    class Counting(WhisperRuntime):  # the artifacts' runtime, its decoder steps counted
        def encode(self, mel):
            return runtime.encode(mel)

        def decode(self, tokens, self_kv, cross_kv):
            steps.append(tokens.shape)
            return runtime.decode(tokens, self_kv, cross_kv)

    (result,) = transcribe(Counting(), vocab, [audio], options)
    assert len(steps) <= 40, f"{len(steps)} decoder steps for a 1.8-s question"
    assert result.segments and max(s.end for s in result.segments) <= window_s
    assert wer("How much is parking in the garage?", result.text) <= 0.5, result.text


class _SequenceRuntime(OnnxWhisperRuntime):
    """The in-process runtime with the decoder's caches held by `WhisperSequences`, as the
    served `asr_decoder` holds them (avatar/triton/whisper_runner.py)."""

    def __init__(self, runtime: OnnxWhisperRuntime, eot: int):
        from avatar.asr.sequences import WhisperSequences

        self.encoder, self.decoder, self.eot = runtime.encoder, runtime.decoder, eot
        self.sequences = WhisperSequences(self.decode, (12, 8, 64), 51865)
        self.blocks_fed: list[int] = []  # id of the cross-attention block of each call
        step = self.sequences._step

        def counted(tokens, self_kv, cross_kv):
            self.blocks_fed.append(id(cross_kv))
            return step(tokens, self_kv, cross_kv)

        self.sequences._step = counted

    def decoding(self, cross_kv):
        from avatar.asr.sequences import InProcessWindows

        return InProcessWindows(self.sequences, cross_kv, self.eot)


# `extended` (10 s): CI has the served `asr_decoder` holding each window's caches
# (tests/test_asr_triton.py::test_asr_decoder_keeps_each_windows_caches) and the served
# transcripts equal to faster-whisper's (test_concurrent_transcripts_equal_faster_whisper)
@pytest.mark.extended
def test_decoder_sequences_transcribe_as_held_caches(runtime, vocab, speech):
    """Windows decoded as sequences (the encoder's K/V sent once, rows ended on the step
    after they finished, the rest of the batch stepping on) give the same transcripts as
    the caches passed to every step; nothing stays open afterwards."""
    sequences = _SequenceRuntime(runtime, vocab.eot)
    audios = [c.audio for c in speech[:4]]
    held = [t.text for t in transcribe(runtime, vocab, audios)]
    assert [t.text for t in transcribe(sequences, vocab, audios)] == held
    assert len(sequences.sequences) == 0
    # the rows step as one block: a new one only when a row ends (at most once per row)
    assert len(set(sequences.blocks_fed)) <= 1 + len(audios)
    assert len(sequences.blocks_fed) > 3 * len(audios)


def test_decoder_sequences_refuse_bad_steps(runtime):
    from avatar.asr.sequences import WhisperSequences, WindowStep
    from avatar.errors import RequestError

    sequences = WhisperSequences(runtime.decode, (12, 8, 64), 51865)
    kv = np.zeros((12, 8, 30, 64), np.float32)
    sot = np.array([50258])
    bad = {
        "was never started": WindowStep(7, sot),
        "carries the window's encoder_kv": WindowStep(7, sot, None, start=True),
        "[12, 8, positions >= 1, 64]": WindowStep(7, sot, kv[:, :, :, :32], start=True),
        "token ids must be in [0, 51865)": WindowStep(7, np.array([51865]), kv, start=True),
        "tokens must be [n]": WindowStep(7, np.array([], np.int64), kv, start=True),
    }
    for message, step in bad.items():
        with pytest.raises(RequestError, match=re.escape(message)):
            sequences.check(step)
    (logits,) = sequences.run([WindowStep(7, sot, kv, start=True)])
    assert logits.shape == (51865,) and np.isfinite(logits).all()
    with pytest.raises(RequestError, match="sent once, on the START step"):
        sequences.check(WindowStep(7, sot, kv))
    with pytest.raises(RequestError, match="exceed Whisper's 448-token text context"):
        sequences.check(WindowStep(7, np.full(448, 440)))
    sequences.run([WindowStep(7, np.array([440]), end=True)])
    assert len(sequences) == 0


def _capped_and_uncapped():
    """The asr model's windows, without the loop fallback (tests/test_asr_degenerate.py):
    about the cap alone. (served, the same without the cap)"""
    from avatar.asr.greedy import DecodeOptions
    from avatar.asr.transcribe import AsrOptions

    served = AsrOptions(window_step=100, window_margin=300, fallback=None)
    uncapped = AsrOptions(
        decode=DecodeOptions(max_tokens_per_second=None),
        window_step=100,
        window_margin=300,
        fallback=None,
    )
    return served, uncapped


def test_a_looping_short_window_ends_at_its_speech_token_limit(runtime, vocab):
    """The first second of a human recording, as a live pass hears it while the user speaks:
    Whisper repeats "Had he married?" to the 224-token limit (3.2 s on one core). The cap of
    10 + 10 tokens per second of speech ends it at 20 (whole recordings are unchanged:
    test_the_speech_token_cap_leaves_whole_recordings_unchanged)."""
    from evals.recordings import human_clips

    served, uncapped = _capped_and_uncapped()
    recordings = human_clips()
    clip = next(c for c in recordings if c.text.lower().startswith("had he married"))
    first_second = clip.audio[:16_000]
    (looping,) = transcribe(runtime, vocab, [first_second], uncapped)
    assert len(looping.tokens) >= 100, looping.text  # the failure the cap is for
    (capped,) = transcribe(runtime, vocab, [first_second], served)
    assert len(capped.tokens) <= 20 and capped.text.lower().startswith("had he married")


# `extended` (7 s, every human recording twice): CI decodes them all with the served options
# and finds no window at its limit (tests/test_asr_degenerate.py::
# test_whole_human_recordings_decode_as_greedy_did)
@pytest.mark.extended
def test_the_speech_token_cap_leaves_whole_recordings_unchanged(runtime, vocab):
    """The cap of test_a_looping_short_window_ends_at_its_speech_token_limit changes no
    transcript of a whole human recording."""
    from evals.recordings import human_clips

    served, uncapped = _capped_and_uncapped()
    audios = [c.audio for c in human_clips()]
    assert [t.text for t in transcribe(runtime, vocab, audios, served)] == [
        t.text for t in transcribe(runtime, vocab, audios, uncapped)
    ]
