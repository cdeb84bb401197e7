"""Piper VITS voice -> the `tts_vits` graph (see export/tts/graph.py), verified.

`VitsRecipe.build` rewrites the packaged voice and checks the result against the ORIGINAL
graph on sentences it was not developed with (VERIFY_SENTENCES):

1. same noise: the original graph with its RandomNormalLike ops seeded and their outputs
   exposed (nothing else changed) gives the noise; fed to the rewritten graph, the audio
   must match and audio_lengths must equal the original's length;
2. deterministic settings (noise_scale = noise_w = 0): the unmodified original and the
   rewritten graph with arbitrary noise must match;
3. batching: the sentences padded into one batch give each sentence's audio alone
   (up to the decoder's receptive field at the padded end), durations exactly;
4. short noise: noise shorter than needed is repeated in-graph exactly as documented.

`python -m export.tts --report` prints size, real-time factor and word error rate of the
FP32 / FP16 / INT8 variants (evals/tts.py).
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from avatar.tts.phonemes import Phonemizer, prepare
from avatar.tts.synth import Controls, batch_inputs
from avatar.tts.voice import Voice, packaged_voice
from export.common import (
    ArtifactRecipe,
    Tolerance,
    ToleranceError,
    ValidationError,
    compare_outputs,
    onnx_session,
    worst,
)
from export.sidecar import Sidecar, sha256_file
from export.tts.int8 import VARIANT_FILE, build_variant

log = logging.getLogger(__name__)

OPSET = 15
# Held out: none of these was used while developing the graph surgery.
VERIFY_SENTENCES = (
    "A gentle breeze carried the smell of bread across the market square.",
    "Please remember to water the plants on Thursday.",
    "How many kilometres is it to the nearest lighthouse?",
    "The committee postponed its decision, citing incomplete data.",
)
SAME_NOISE = {"audio": Tolerance(atol=1e-5), "audio_lengths": Tolerance(atol=0)}
# A padded item sees the decoder's (unmasked) activations of the padding within its
# receptive field at the end of its audio: ~1e-4 measured, audio peaks ~0.5.
BATCHED = {
    "audio": Tolerance(atol=1e-3),
    "audio_lengths": Tolerance(atol=0),
    "durations": Tolerance(atol=0),
}


def seeded_reference(source: Path, out: Path) -> Path:
    """The original graph with both RandomNormalLike ops seeded and their outputs exposed."""
    import onnx
    from onnx import TensorProto, helper

    model = onnx.load(str(source))
    for seed, node in enumerate(n for n in model.graph.node if n.op_type == "RandomNormalLike"):
        node.attribute.append(helper.make_attribute("seed", float(seed + 1)))
        model.graph.output.append(
            helper.make_tensor_value_info(node.output[0], TensorProto.FLOAT, None)
        )
    onnx.save(model, str(out))
    return out


def _original_feeds(ids: np.ndarray, controls: Controls) -> dict[str, np.ndarray]:
    return {
        "input": ids[None],
        "input_lengths": np.array([ids.size], np.int64),
        "scales": controls.scales,
    }


def _served(session, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds), strict=True))


def verify(source: Path, served_path: Path, work: Path, voice: Voice) -> dict:
    """Run checks 1-4 of the module docstring; raise ValidationError on any disagreement."""
    phonemizer = Phonemizer(voice.config)
    chunks = [prepare(s, phonemizer).chunks[0] for s in VERIFY_SENTENCES]
    served = onnx_session(served_path, threads=2)
    seeded = onnx_session(seeded_reference(source, work / "reference_seeded.onnx"), threads=2)
    original = onnx_session(source, threads=2)
    default = Controls.defaults(voice.config, seed=5)
    quiet = Controls.defaults(voice.config, noise_scale=0.0, noise_w=0.0, seed=6)
    comparisons = []
    for k, chunk in enumerate(chunks):
        ids = np.array(chunk.ids, np.int64)
        # 1. same noise
        audio, noise_dp, noise_prior = seeded.run(None, _original_feeds(ids, default))
        feeds = batch_inputs([chunk.ids], [default])
        feeds["noise_phonemes"], feeds["noise_frames"] = noise_dp, noise_prior
        got = _served(served, feeds)
        if int(got["durations"].sum()) * 256 != audio.shape[-1]:
            raise ValidationError(f"sentence {k}: 256 * sum(durations) != original length")
        comparisons += compare_outputs(
            {"audio": audio[:, 0, 0, :], "audio_lengths": np.array([[audio.shape[-1]]])},
            got,
            SAME_NOISE,
            context=f"same noise, sentence {k}",
        )
        # 2. deterministic settings, arbitrary noise
        (audio,) = original.run(None, _original_feeds(ids, quiet))
        got = _served(served, batch_inputs([chunk.ids], [quiet]))
        comparisons += compare_outputs(
            {"audio": audio[:, 0, 0, :], "audio_lengths": np.array([[audio.shape[-1]]])},
            got,
            SAME_NOISE,
            context=f"noise scales 0, sentence {k}",
        )
    batch = _check_batching(served, [c.ids for c in chunks], default)
    _check_short_noise(served, chunks[0].ids, default)
    return {
        "reference": source.name,
        "sentences": list(VERIFY_SENTENCES),
        "outputs": worst(comparisons),
        "batched_vs_alone": worst(batch),
        "short_noise": "repeated noise == explicit repetition (exact)",
    }


def _check_batching(served, id_lists: list, controls: Controls) -> list:
    controls_list = [
        Controls(controls.length_scale, controls.noise_scale, controls.noise_w, seed=10 + k)
        for k in range(len(id_lists))
    ]
    together = _served(served, batch_inputs(id_lists, controls_list, pad_to=64))
    comparisons = []
    for k, (ids, c) in enumerate(zip(id_lists, controls_list, strict=True)):
        alone = _served(served, batch_inputs([ids], [c]))
        width = alone["audio"].shape[1]
        if np.any(together["audio"][k, width:]):
            raise ValidationError(f"batched item {k}: audio after audio_lengths is not zero")
        comparisons += compare_outputs(
            alone,
            {
                "audio": together["audio"][k : k + 1, :width],
                "audio_lengths": together["audio_lengths"][k : k + 1],
                "durations": together["durations"][k : k + 1, : len(ids)],
            },
            BATCHED,
            context=f"item {k} of a batch of {len(id_lists)}",
        )
    return comparisons


def _check_short_noise(served, ids, controls: Controls) -> None:
    feeds = batch_inputs([ids], [controls])
    full = _served(served, feeds)
    frames = int(full["durations"].sum())
    short = dict(feeds, noise_frames=feeds["noise_frames"][:, :, :7])
    short["noise_phonemes"] = feeds["noise_phonemes"][:, :, :5]
    tiled = dict(feeds)
    tiled["noise_frames"] = np.tile(short["noise_frames"], (1, 1, -(-frames // 7)))
    tiled["noise_phonemes"] = np.tile(short["noise_phonemes"], (1, 1, -(-len(ids) // 5)))
    a, b = _served(served, short), _served(served, tiled)
    if not np.array_equal(a["audio"], b["audio"]):
        raise ToleranceError("short noise: in-graph repetition differs from np.tile")


class VitsRecipe(ArtifactRecipe):
    """The packaged Piper voice (or another Piper espeak voice by path) as `tts_vits`."""

    name = "tts_vits"
    code_files = (
        Path(__file__).with_name("graph.py"),
        Path(__file__).with_name("int8.py"),
        Path(__file__).parents[1] / "quantize.py",
        Path(__file__).parents[1] / "gates.py",
    )

    def __init__(self, source: Path | None = None):
        self.voice = Voice.from_onnx(source) if source else packaged_voice()

    def key_inputs(self) -> dict[str, str]:
        config = self.voice.onnx_path.with_name(self.voice.onnx_path.name + ".json")
        return {
            "source": sha256_file(self.voice.onnx_path),
            "config": sha256_file(config),
            "opset": str(OPSET),
        }

    def build(self, out_dir: Path) -> Sidecar:
        import onnx

        from export.tts.graph import op_report, rewrite

        source = self.voice.onnx_path
        path = out_dir / "model.onnx"
        model = rewrite(onnx.load(str(source)))
        onnx.save(model, str(path))
        work = out_dir / "_verify"
        work.mkdir()
        try:
            validation = verify(source, path, work, self.voice)
        finally:
            for file in work.iterdir():
                file.unlink()
            work.rmdir()
        (out_dir / "voice.onnx.json").write_bytes(
            source.with_name(source.name + ".json").read_bytes()
        )
        if self.voice.onnx_path == packaged_voice().onnx_path:  # the gate's sentences: English
            validation["variants"] = {VARIANT_FILE: build_variant(out_dir)}
        remaining = op_report(model)
        return self.sidecar(
            path,
            opset=OPSET,
            source={source.name: sha256_file(source)},
            validation=validation,
            notes=[
                "RandomNormalLike x2 -> inputs noise_phonemes [B,2,n], noise_frames [B,192,m],"
                " repeated cyclically in-graph to the length needed (any n, m >= 1)",
                "scales per item [B,3] (noise_scale, length_scale, noise_w)",
                "durations = Ceil of the duration predictor, frames of 256 samples per id",
                "audio [B, samples] is zero after audio_lengths = 256 * sum(durations)",
                f"ops TensorRT may reject or treat specially: {remaining} (NonZero: TRT >= 8.5)",
            ],
        )
