"""Lipsync export: the committed weights (networks/lipsync.py) -> ONNX, verified.

    python -m export build lipsync
    python -m export.lipsync           # audio seconds per second at batch 1 and 16 (1 thread)
    python -m export.lipsync.int8      # the INT8 variant's gate (export/lipsync/int8.py)

Input `audio` [batch, samples] float32 (16 kHz mono); outputs `viseme_probs`
[batch, frames, 15] and `mouth_open` [batch, frames], frames = samples // 160 + 1. Batch
and time are dynamic; the graph is checked against torch at batch sizes and lengths it
was not traced with (a short one, an odd one, a long one).
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from export.common import (
    ArtifactRecipe,
    ShapeMismatchError,
    Tolerance,
    compare_outputs,
    onnx_session,
    torch_to_onnx,
    worst,
)
from export.lipsync.int8 import VARIANT_FILE, build_variant
from export.onnx_edit import set_output_dims
from export.sidecar import Sidecar, TensorSpec, sha256_file
from networks.lipsync import CLASSES, HOP, SAMPLE_RATE, WEIGHTS

log = logging.getLogger(__name__)

OPSET = 17
INPUT = "audio"
OUTPUTS = ("viseme_probs", "mouth_open")
TOLERANCES = {"viseme_probs": Tolerance(atol=2e-4), "mouth_open": Tolerance(atol=2e-4)}
CHECKS = ((1, 7919), (3, 48013), (2, 400), (4, 160_000))  # (batch, samples), not traced


def example_audio(batch: int, samples: int, seed: int) -> np.ndarray:
    """Speech-like test audio [batch, samples]: gated harmonic tones plus a little noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(samples) / SAMPLE_RATE
    f0 = rng.uniform(90, 220, size=(batch, 1))
    tone = sum(np.sin(2 * np.pi * f0 * k * t) / k for k in range(1, 8))
    gate = (np.sin(2 * np.pi * rng.uniform(2, 5, size=(batch, 1)) * t) > 0).astype(float)
    audio = 0.1 * tone * gate + 0.003 * rng.standard_normal((batch, samples))
    return audio.astype(np.float32)


def reference(audio: np.ndarray, weights: Path = WEIGHTS) -> dict[str, np.ndarray]:
    """The torch model on `audio` [batch, samples]: what the ONNX file must reproduce."""
    import torch

    from networks.lipsync import load_model

    model = load_model(weights)
    with torch.no_grad():
        probs, opening = model(torch.from_numpy(audio))
    return {"viseme_probs": probs.numpy(), "mouth_open": opening.numpy()}


class LipsyncRecipe(ArtifactRecipe):
    """Committed lipsync weights -> model.onnx (+ sidecar)."""

    name = "lipsync"
    code_files = (
        Path(__file__).parents[2] / "networks" / "lipsync.py",
        Path(__file__).parents[1] / "onnx_edit.py",
        Path(__file__).parents[1] / "quantize.py",
        Path(__file__).parents[1] / "gates.py",
        Path(__file__).with_name("int8.py"),
    )

    def __init__(self, weights: Path = WEIGHTS):
        self.weights = Path(weights)

    def key_inputs(self) -> dict[str, str]:
        import torch

        return {
            "weights": sha256_file(self.weights),
            "opset": str(OPSET),
            "torch": torch.__version__,
        }

    def build(self, out_dir: Path) -> Sidecar:
        import torch

        from networks.lipsync import load_model

        path = torch_to_onnx(
            load_model(self.weights),
            [torch.from_numpy(example_audio(2, SAMPLE_RATE, seed=0))],
            Path(out_dir) / "model.onnx",
            inputs=[INPUT],
            outputs=OUTPUTS,
            opset=OPSET,
            dynamic_axes={
                INPUT: {0: "batch", 1: "samples"},
                **{name: {0: "batch", 1: "frames"} for name in OUTPUTS},
            },
        )
        set_output_dims(path, {"viseme_probs": ["batch", "frames", CLASSES]})
        comparisons = verify(path, self.weights)
        sidecar = self.sidecar(
            path,
            opset=OPSET,
            source={"weights": self.weights.name, "weights_sha256": sha256_file(self.weights)},
            validation={"outputs": worst(comparisons), "checks": [list(c) for c in CHECKS]},
            notes=[
                f"16 kHz mono float32 audio; frames every {HOP} samples (100 Hz), "
                "frames = samples // 160 + 1; viseme order avatar.animation.tables.VISEMES",
            ],
        )
        if (sidecar.inputs, sidecar.outputs) != expected_specs():
            raise ShapeMismatchError(
                f"exported I/O {sidecar.inputs} {sidecar.outputs}, expected {expected_specs()}"
            )
        sidecar.validation["variants"] = {VARIANT_FILE: build_variant(Path(out_dir))}
        return sidecar


def verify(path: Path, weights: Path = WEIGHTS) -> list:
    """Compare ONNX Runtime with torch on CHECKS; raise a ValidationError on mismatch."""
    session = onnx_session(path)
    comparisons = []
    for seed, (batch, samples) in enumerate(CHECKS, start=1):
        audio = example_audio(batch, samples, seed)
        got = dict(zip(OUTPUTS, session.run(list(OUTPUTS), {INPUT: audio}), strict=True))
        comparisons += compare_outputs(
            reference(audio, weights), got, TOLERANCES, f"batch {batch}, {samples} samples"
        )
    return comparisons


def expected_specs() -> tuple[list[TensorSpec], list[TensorSpec]]:
    """The I/O the export must have - what model_repository/lipsync/config.pbtxt declares."""
    return (
        [TensorSpec(INPUT, "float32", ("batch", "samples"))],
        [TensorSpec("viseme_probs", "float32", ("batch", "frames", CLASSES)),
         TensorSpec("mouth_open", "float32", ("batch", "frames"))],
    )  # fmt: skip


def measure(path: Path, batches: tuple[int, ...] = (1, 16), seconds: float = 3.0) -> dict:
    """Audio seconds processed per second (1 thread) on 3-s windows, per batch size."""
    import time

    session = onnx_session(path, threads=1)
    results = {}
    for batch in batches:
        audio = example_audio(batch, 3 * SAMPLE_RATE, seed=batch)
        session.run(list(OUTPUTS), {INPUT: audio})  # warm-up
        runs, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds:
            session.run(list(OUTPUTS), {INPUT: audio})
            runs += 1
        results[batch] = runs * batch * 3.0 / (time.perf_counter() - started)
    return results


def main() -> None:
    """python -m export.lipsync: build (cached) and print the real-time factor per batch."""
    from export.common import ensure

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    folder = ensure(LipsyncRecipe())
    for batch, speed in measure(folder / "model.onnx").items():
        print(f"lipsync, batch {batch:2d} x 3-s windows, 1 thread: {speed:.0f} s of audio per s")
